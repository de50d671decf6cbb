#include "tandem/tensor.h"

#include <atomic>
#include <climits>
#include <cstring>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "tandem/random.h"

namespace tandem {

using backend::backend_for;

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : s) overflow |= __builtin_mul_overflow(n, d, &n);
  // An extent of 0 makes the product 0 whatever the others are.
  for (int64_t d : s)
    if (d == 0) return 0;
  TANDEM_CHECK(!overflow, "shape ", shape_str(s), " has more elements than a 64-bit count holds");
  return n;
}

namespace {
std::atomic<uint64_t> g_tensor_serial{0};
}  // namespace

uint64_t next_tensor_serial() { return g_tensor_serial.fetch_add(1, std::memory_order_relaxed); }
uint64_t tensor_serial_now() { return g_tensor_serial.load(std::memory_order_relaxed); }

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    // Strides past an overflow belong to an empty tensor (shape_numel refuses the others): never read.
    if (__builtin_mul_overflow(acc, shape[i], &acc)) acc = 0;
  }
  return st;
}

Storage::~Storage() {
  if (allocator) allocator->deallocate(ptr, nbytes);
}

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device, bool pinned) {
  Allocator* alloc = nullptr;
  if (pinned) {
    backend::Backend* cuda = backend::cuda_backend();
    if (cuda && cuda->device_count() > 0) alloc = cuda->pinned_allocator();
  }
  if (!alloc) alloc = &backend_for(device).allocator(device.index);
  void* p = alloc->allocate(nbytes);
  return std::make_shared<Storage>(p, nbytes, device, alloc);
}

namespace {
Tensor make_tensor(const Shape& shape, DType dtype, Device device, bool pinned = false) {
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "negative extent in shape ", shape_str(shape));
  const int64_t numel = shape_numel(shape);
  TANDEM_CHECK(numel <= INT64_MAX / static_cast<int64_t>(dtype_size(dtype)), "shape ", shape_str(shape), " of ",
               dtype_name(dtype), " needs more bytes than a 64-bit size holds");
  check_device(device);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = allocate_storage(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device, pinned);
  return Tensor(std::move(impl));
}

const TensorImpl& checked(const std::shared_ptr<TensorImpl>& p) {
  TANDEM_CHECK(p != nullptr, "operation on an undefined tensor");
  return *p;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) { return make_tensor(shape, dtype, device); }

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) { return make_tensor(shape, dtype, Device::cpu(), true); }

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_data(const void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.nbytes() == 0) return t;
  if (device.is_cpu())
    std::memcpy(t.data_ptr(), data, t.nbytes());
  else
    backend_for(device).copy_from_host(data, t.data_ptr(), t.nbytes(), device.index);
  return t;
}

namespace {
template <typename Fill>
Tensor random_tensor(const Shape& shape, DType dtype, Device device, Generator& gen, Fill fill) {
  TANDEM_CHECK(is_floating(dtype), "random fills need a floating dtype, got ", dtype_name(dtype));
  DType gen_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  Tensor t = Tensor::empty(shape, gen_dtype, device);
  uint64_t offset = gen.advance(static_cast<uint64_t>(t.numel()));
  fill(backend_for(device), t, offset);
  return t.to(dtype);
}
}  // namespace

Tensor Tensor::uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype, Device device) {
  return random_tensor(shape, dtype, device, gen, [&](backend::Backend& b, Tensor& t, uint64_t off) {
    b.random_uniform(t, gen.seed(), off, lo, hi);
  });
}

Tensor Tensor::normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype, Device device) {
  return random_tensor(shape, dtype, device, gen, [&](backend::Backend& b, Tensor& t, uint64_t off) {
    b.random_normal(t, gen.seed(), off, mean, std);
  });
}

const Shape& Tensor::shape() const { return checked(impl_).shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  TANDEM_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return shape()[static_cast<size_t>(d)];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::storage_offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).device(); }

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked(impl_);
  int64_t expect = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!impl_) return "undefined tensor";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device().str();
}

void* Tensor::data_ptr() const { return checked(impl_).data(); }

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor t = to(dtype_of<T>()).contiguous();
  std::vector<T> out(static_cast<size_t>(t.numel()));
  if (out.empty()) return out;
  if (t.device().is_cpu())
    std::memcpy(out.data(), t.data_ptr(), t.nbytes());
  else
    backend_for(t.device()).copy_to_host(t.data_ptr(), out.data(), t.nbytes(), t.device().index);
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = contiguous();
  Tensor dst = empty(shape(), dtype(), device);
  if (dst.nbytes() == 0) return dst;
  if (src.device().is_cpu()) {
    backend_for(device).copy_from_host(src.data_ptr(), dst.data_ptr(), dst.nbytes(), device.index);
  } else if (device.is_cpu()) {
    backend_for(src.device()).copy_to_host(src.data_ptr(), dst.data_ptr(), dst.nbytes(), src.device().index);
  } else {  // GPU to another GPU: through the host (rare; not on a hot path)
    Tensor host = src.to(Device::cpu());
    backend_for(device).copy_from_host(host.data_ptr(), dst.data_ptr(), dst.nbytes(), device.index);
  }
  return dst;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor dst = empty(shape(), dtype, device());
  if (dst.numel()) backend_for(device()).copy_strided(*this, dst);
  return dst;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor dst = empty(shape(), dtype(), device());
  if (dst.numel()) backend_for(device()).copy_strided(*this, dst);
  return dst;
}

Tensor& Tensor::copy_(const Tensor& src) {
  TANDEM_CHECK(src.numel() == numel(), "copy_: source ", src.str(), " and destination ", str(),
               " differ in element count");
  TANDEM_CHECK(is_contiguous(), "copy_: destination ", str(), " must be contiguous");
  if (numel() == 0 || src.impl() == impl()) return *this;
  if (src.device() == device()) {
    if (src.dtype() == dtype() && src.is_contiguous())
      backend_for(device()).copy_bytes(src.data_ptr(), data_ptr(), nbytes(), device().index);
    else
      backend_for(device()).copy_strided(src, *this);
    return *this;
  }
  Tensor s = src.to(dtype()).contiguous();
  if (s.device().is_cpu())
    backend_for(device()).copy_from_host(s.data_ptr(), data_ptr(), nbytes(), device().index);
  else if (device().is_cpu())
    backend_for(s.device()).copy_to_host(s.data_ptr(), data_ptr(), nbytes(), s.device().index);
  else
    copy_(s.to(Device::cpu()));
  return *this;
}

Tensor& Tensor::fill_(double value) {
  TANDEM_CHECK(is_contiguous(), "fill_: tensor ", str(), " must be contiguous");
  if (numel()) backend_for(device()).fill(*this, value);
  return *this;
}

Tensor Tensor::view(const Shape& shape) const {
  TANDEM_CHECK(is_contiguous(), "view of the non-contiguous tensor ", str(), "; use reshape");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  bool overflow = false, empty = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TANDEM_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      TANDEM_CHECK(s[i] >= 0, "view: invalid extent in ", shape_str(shape));
      overflow |= __builtin_mul_overflow(known, s[i], &known);
      empty |= s[i] == 0;
    }
  }
  if (empty) known = 0;
  TANDEM_CHECK(!overflow || empty, "view: shape ", shape_str(shape), " has more elements than a 64-bit count holds");
  if (infer >= 0) {
    TANDEM_CHECK(known > 0 && numel() % known == 0, "view: cannot infer -1 in ", shape_str(shape), " for ", str());
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  TANDEM_CHECK(shape_numel(s) == numel(), "view: shape ", shape_str(shape), " does not match ", str());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = s;
  impl->strides = contiguous_strides(s);
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int64_t n = dim();
  if (d < 0) d += n;
  TANDEM_CHECK(d >= 0 && d < n, "narrow: dimension out of range for ", str());
  TANDEM_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: range [", start, ", ",
               start + length, ") outside dimension ", d, " of ", str());
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->requires_grad = false;
  impl->name.clear();
  impl->grad_fn.reset();
  impl->grad.reset();
  impl->grad_accumulator.reset();
  impl->shape[d] = length;
  impl->offset += start * impl->strides[d];
  return Tensor(std::move(impl));
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  TANDEM_CHECK(d0 >= 0 && d0 < n && d1 >= 0 && d1 < n, "transpose: dimension out of range for ", str());
  Tensor t = detach();
  std::swap(t.impl_->shape[d0], t.impl_->shape[d1]);
  std::swap(t.impl_->strides[d0], t.impl_->strides[d1]);
  return t;
}

Tensor Tensor::detach() const {
  const TensorImpl& src = checked(impl_);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = src.storage;
  impl->shape = src.shape;
  impl->strides = src.strides;
  impl->offset = src.offset;
  impl->dtype = src.dtype;
  return Tensor(std::move(impl));
}

bool Tensor::shares_storage(const Tensor& o) const {
  return impl_ && o.impl_ && impl_->storage == o.impl_->storage;
}

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::requires_grad_(bool on) {
  TANDEM_CHECK(impl_ != nullptr, "requires_grad_ on an undefined tensor");
  TANDEM_CHECK(!impl_->grad_fn, "requires_grad_ applies to leaf tensors only, not to ", str());
  TANDEM_CHECK(!on || is_floating(dtype()), "only floating tensors can require gradients, not ", str());
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return impl_ && impl_->grad ? Tensor(impl_->grad) : Tensor(); }

void Tensor::set_grad(const Tensor& g, bool zeroed) {
  TANDEM_CHECK(impl_ != nullptr, "set_grad on an undefined tensor");
  if (g.defined())
    TANDEM_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(), "set_grad: gradient ",
                 g.str(), " does not match ", str());
  impl_->grad = g.impl_ptr();
  impl_->grad_zeroed = zeroed && g.defined();
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  return impl_ ? impl_->grad_fn : none;
}

bool Tensor::is_leaf() const { return !grad_fn(); }

}  // namespace tandem
