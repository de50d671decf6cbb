// NumPy and DLPack: tensors become arrays and arrays tensors, without a copy where the layout allows
// (DLPack both ways); to_numpy / from_numpy copy, as SINGA's do.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <vector>

#include "binding.h"
#include "core/allocator.h"
#include "core/tensor_impl.h"
#include "tandem/autograd.h"
#include "tandem/error.h"

namespace tandem::py {

namespace {

constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

nb::dlpack::dtype dl_dtype(DType t) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C c, int bits) { return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1}; };
  switch (t) {
    case DType::f32: return make(C::Float, 32);
    case DType::f64: return make(C::Float, 64);
    case DType::f16: return make(C::Float, 16);
    case DType::bf16: return make(C::Bfloat, 16);
    case DType::i32: return make(C::Int, 32);
    case DType::i64: return make(C::Int, 64);
    case DType::u8: return make(C::UInt, 8);
  }
  TANDEM_ASSERT(false, "unknown dtype");
}

DType from_dl_dtype(nb::dlpack::dtype d) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8})
    if (dl_dtype(t) == d) return t;
  TANDEM_CHECK(false, "an array of DLPack type code ", int(d.code), ", ", int(d.bits), " bits, ", d.lanes,
               " lanes cannot become a tandem tensor (supported: float32, float64, float16, bfloat16, int32, int64, "
               "uint8)");
}

// Memory that belongs to a Python array, lent to a tandem tensor: the storage's "allocator" keeps the
// array alive and lets go of it when the last tensor using the memory is gone.
class LentMemory : public Allocator {
 public:
  explicit LentMemory(nb::ndarray<> array) : array_(new nb::ndarray<>(std::move(array))) {}
  void* allocate(size_t) override { TANDEM_ASSERT(false, "lent memory cannot allocate"); }
  void deallocate(void*, size_t) override {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      delete array_;
    }  // else the interpreter is gone, and the array with it
    delete this;
  }

 private:
  nb::ndarray<>* array_;
};

// An ndarray viewing t's memory; the owner capsule keeps t alive.
template <typename... Framework>
nb::ndarray<Framework...> view_of(const Tensor& t, int device_type) {
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::ndarray<Framework...>(t.data_ptr(), shape.size(), shape.data(), owner, strides.data(), dl_dtype(t.dtype()),
                                device_type, t.device().index);
}

// A NumPy array holding a copy of t's values (bfloat16, which NumPy lacks, as float32).
nb::object to_numpy(const Tensor& t) {
  Tensor host;
  {
    nb::gil_scoped_release unlocked;
    host = t.device().is_cpu() ? t.clone() : t.cpu().contiguous();
    if (host.dtype() == DType::bf16) host = host.to(DType::f32);
  }
  return nb::cast(view_of<nb::numpy>(host, kDLCPU));
}

// The nanobind array whose __dlpack__ hands t's memory to another framework.
nb::object dlpack_view(const Tensor& t) {
  if (t.device().is_cuda()) {
    nb::gil_scoped_release unlocked;
    synchronize(t.device());  // the consumer may read on any stream: our queued work must be done
  }
  return nb::cast(view_of<nb::array_api>(t, t.device().is_cpu() ? kDLCPU : kDLCUDA));
}

// Copies the array's values into t (same element count; converted to t's type, moved to t's device).
void copy_from_array(Tensor& t, nb::ndarray<nb::ro> a) {
  Tensor src = tensor_from_array(nb::ndarray<>(a));
  nb::gil_scoped_release unlocked;
  NoGradGuard no_grad;
  t.copy_(src);
}

}  // namespace

Tensor tensor_from_array(nb::ndarray<> a) {
  Device device;
  const int dt = a.device_type();
  if (dt == kDLCPU || dt == kDLCUDAHost) {
    device = Device::cpu();
  } else {
    TANDEM_CHECK(dt == kDLCUDA, "an array on DLPack device type ", dt, " cannot become a tandem tensor (CPU and CUDA only)");
    device = Device::cuda(a.device_id());
    check_device(device);
  }
  DType dtype = from_dl_dtype(a.dtype());
  Shape shape(a.ndim()), strides(a.ndim());
  int64_t extent = 1;  // elements spanned, for the storage's size
  bool empty = false;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
    TANDEM_CHECK(strides[i] >= 0, "arrays with negative strides cannot become tandem tensors: copy the array first");
    if (shape[i] == 0) empty = true;
    extent += (shape[i] - 1) * strides[i];
  }
  size_t nbytes = empty ? 0 : static_cast<size_t>(extent) * dtype_size(dtype);
  void* data = const_cast<void*>(a.data());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, nbytes, device, new LentMemory(std::move(a)));
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void bind_array(nb::module_& m, nb::class_<Tensor>& t) {
  t.def("to_numpy", &to_numpy, "A NumPy copy of the values (bfloat16 as float32).")
      .def("numpy", &to_numpy, "A NumPy copy of the values (bfloat16 as float32).")
      .def("__array__", [](const Tensor& x, nb::handle dtype, nb::handle copy) {
        nb::object a = to_numpy(x);
        return dtype.is_none() ? a : a.attr("astype")(dtype);
      }, nb::arg("dtype").none() = nb::none(), nb::arg("copy").none() = nb::none())
      .def("copy_from_numpy", [](nb::handle_t<Tensor> self, nb::ndarray<nb::ro> a) {
        copy_from_array(nb::cast<Tensor&>(self), std::move(a));
        return nb::borrow(self);
      }, nb::arg("array"), "Copies an array of as many elements into this tensor, converting the type.")
      .def("__dlpack__", [](const Tensor& x, nb::kwargs kw) { return dlpack_view(x).attr("__dlpack__")(**kw); },
           "DLPack export: consumers view this tensor's memory without a copy.")
      .def("__dlpack_device__", [](const Tensor& x) {
        return nb::make_tuple(x.device().is_cpu() ? kDLCPU : kDLCUDA, x.device().is_cpu() ? 0 : x.device().index);
      });

  m.def("to_numpy", &to_numpy, nb::arg("tensor"), "A NumPy copy of the tensor's values (bfloat16 as float32).");
  m.def("_from_dlpack", &tensor_from_array, nb::arg("array"),
        "A tensor viewing the memory of a DLPack array or capsule (no copy).");
  m.def(
      "from_array", [](nb::ndarray<nb::ro> a, nb::handle device, std::optional<DType> dtype) {
        Device d = to_device(device);
        Tensor src = tensor_from_array(nb::ndarray<>(a));
        nb::gil_scoped_release unlocked;
        Tensor out = Tensor::empty(src.shape(), dtype.value_or(src.dtype()), d);
        out.copy_(src);
        return out;
      },
      nb::arg("array"), nb::arg("device").none() = nb::none(), nb::arg("dtype").none() = nb::none(),
      "A new tensor holding a copy of the array's values.");
  m.def("_compute_stream", &compute_stream_handle, nb::arg("device_index"),
        "The CUDA stream tandem works on for a GPU, for DLPack's stream argument (0 without CUDA).");
}

}  // namespace tandem::py
