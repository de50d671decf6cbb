#pragma once
// Internal: what a Tensor handle points to.
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "tandem/autograd.h"
#include "tandem/tensor.h"

namespace tandem {

class Allocator;

/// The column sums of a gradient held in a storage, taken by the kernel that wrote it (layer norm's
/// backward), for the bias gradient of a layer that reads the same gradient (see ops::column_sums_of).
/// Valid while the region is not written again: the backward engine drops it where an op is offered the
/// gradient to add into or a leaf takes it, and it holds only within the backward pass that made it.
struct ColumnSums {
  Tensor sums;          // f32 [cols]
  int64_t offset = 0;   // the region, in elements of dtype: [offset, offset + numel) viewed as [numel / cols, cols]
  int64_t numel = 0;
  int64_t cols = 0;
  DType dtype = DType::f32;
  uint64_t pass = 0;    // the backward pass (autograd::current_pass)
};

/// A block of memory on one device, returned to its allocator when the last user lets go.
struct Storage {
  void* ptr = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;  // null: memory not owned
  std::unique_ptr<ColumnSums> column_sums;  // see ColumnSums
  // Rows padded with a column of ones (ops/padded_rows.h): when padded_ld > 0, the storage from element 0 is
  // rows of padded_ld elements whose element padded_cols is 1 and whose later elements are 0.
  int64_t padded_ld = 0, padded_cols = 0;
  Storage(void* p, size_t n, Device d, Allocator* a) : ptr(p), nbytes(n), device(d), allocator(a) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

/// Allocates storage for nbytes on the device (from its caching allocator).
std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device, bool pinned = false);

/// The next number of the creation order of TensorImpls (a relaxed counter; see CreationSerial).
uint64_t next_tensor_serial();
/// The number the next TensorImpl will take.
uint64_t tensor_serial_now();

/// A TensorImpl's place in the order tensors are made: every impl takes the next number, copies included
/// (a copy is a new tensor), and keeps it when assigned to. An ONNX export trace (tandem.sonnx) tells the
/// tensors made before it from those made while it ran by it.
struct CreationSerial {
  uint64_t value = next_tensor_serial();
  CreationSerial() = default;
  CreationSerial(const CreationSerial&) : value(next_tensor_serial()) {}
  CreationSerial& operator=(const CreationSerial&) { return *this; }
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  std::shared_ptr<TensorImpl> grad;
  bool grad_zeroed = false;  // grad holds zeros: the first gradient of a backward pass may overwrite it
  std::weak_ptr<Node> grad_accumulator;  // for leaves: the node that accumulates into grad
  std::string name;  // set by the Python API (SINGA's Tensor.name); empty until then
  CreationSerial serial;

  Device device() const { return storage->device; }
  int64_t numel() const { return shape_numel(shape); }
  void* data() const { return static_cast<char*>(storage->ptr) + offset * static_cast<int64_t>(dtype_size(dtype)); }
};

/// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);

/// A view of t's storage with the given shape, strides and element offset (no autograd history).
inline Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

/// Points t at the memory of `target` (same shape and dtype) without changing t's identity: every
/// handle to t, and t's autograd state, now see target's storage. Used to move parameters between
/// devices and into the flat buffers of the distributed optimizer.
inline void rebind_storage(const Tensor& t, const Tensor& target) {
  TensorImpl* impl = t.impl();
  impl->storage = target.impl()->storage;
  impl->strides = target.impl()->strides;
  impl->offset = target.impl()->offset;
}

}  // namespace tandem
