#pragma once
// Tensor: a value-type handle to shared storage with a shape, strides, element type and device.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/device.h"
#include "tandem/dtype.h"
#include "tandem/error.h"

namespace tandem {

using Shape = std::vector<int64_t>;

/// "[64, 1, 28, 28]"
std::string shape_str(const Shape& s);
/// Product of the extents (1 for a scalar).
int64_t shape_numel(const Shape& s);

class Generator;
struct Node;
struct TensorImpl;

/// A handle to an n-dimensional array. Copying a Tensor copies the handle, not the data.
class Tensor {
 public:
  Tensor() = default;

  // ---- factories
  /// Uninitialised tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  /// Uninitialised CPU tensor in page-locked memory when a GPU is present (fast, asynchronous uploads).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  /// Copies host data of the given type into a new tensor.
  static Tensor from_data(const void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape, Device device = Device::cpu()) {
    TANDEM_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_vector: ", v.size(),
                 " values do not fill shape ", shape_str(shape));
    return from_data(v.data(), shape, dtype_of<T>(), device);
  }
  /// Uniform values in [lo, hi) from the generator (reproducible across devices).
  static Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype = DType::f32,
                        Device device = Device::cpu());
  /// Gaussian values from the generator (reproducible across devices).
  static Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype = DType::f32,
                       Device device = Device::cpu());

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const;
  /// Extent of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  size_t nbytes() const;
  const Shape& strides() const;
  int64_t storage_offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  /// "f32[64, 10] on cuda:0"
  std::string str() const;

  // ---- data
  /// Address of the first element (a device address for CUDA tensors).
  void* data_ptr() const;
  /// Typed address of the first element; throws when T does not match dtype().
  template <typename T>
  T* data() const {
    TANDEM_CHECK(dtype() == dtype_of<T>(), "tensor of ", dtype_name(dtype()), " accessed as ",
                 dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }
  /// All elements, converted to T, copied to the host.
  template <typename T>
  std::vector<T> to_vector() const;
  /// The single element, converted to T (synchronises with the device).
  template <typename T>
  T item() const {
    TANDEM_CHECK(numel() == 1, "item() needs a tensor of one element, got ", str());
    return to_vector<T>()[0];
  }

  // ---- conversion and copies (never recorded by autograd)
  /// Same tensor when already there, else a copy on the device.
  Tensor to(Device device) const;
  /// Same tensor when already of that type, else a converted copy.
  Tensor to(DType dtype) const;
  Tensor cpu() const { return to(Device::cpu()); }
  /// Same tensor when contiguous, else a contiguous copy.
  Tensor contiguous() const;
  /// A contiguous copy that shares nothing with this tensor.
  Tensor clone() const;
  /// Copies src into this tensor (same number of elements; any device and type).
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // ---- views (share storage; never recorded by autograd: see ops.h reshape for that)
  /// Same storage viewed with another shape; one extent may be -1. Needs a contiguous tensor.
  Tensor view(const Shape& shape) const;
  /// Elements [start, start+length) of dimension dim.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// Swaps two dimensions (a strided view).
  Tensor transpose(int64_t d0, int64_t d1) const;
  /// Same data, cut off from autograd.
  Tensor detach() const;
  /// True when both handles refer to the same storage.
  bool shares_storage(const Tensor& o) const;

  // ---- autograd
  bool requires_grad() const;
  /// Marks a leaf tensor (a parameter) as needing a gradient.
  Tensor& requires_grad_(bool on = true);
  /// The accumulated gradient of a leaf; undefined before the first backward.
  Tensor grad() const;
  /// Sets the gradient buffer; `zeroed` promises that it holds zeros, so that the next backward pass
  /// may write its gradient straight into it instead of adding.
  void set_grad(const Tensor& g, bool zeroed = false);
  /// The op that produced this tensor, or null for leaves.
  const std::shared_ptr<Node>& grad_fn() const;
  bool is_leaf() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace tandem
