#include "ops/layout.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "ops/param_copies.h"

namespace tandem::ops {

bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) return false;
  const Shape& sh = t.shape();
  const Shape& st = t.strides();
  const int64_t c = sh[1], h = sh[2], w = sh[3];
  const int64_t expect[4] = {h * w * c, 1, w * c, c};
  for (int i = 0; i < 4; ++i)
    if (sh[static_cast<size_t>(i)] != 1 && st[static_cast<size_t>(i)] != expect[i]) return false;
  return true;
}

Tensor empty_channels_last(const Shape& shape, DType dtype, Device device) {
  TANDEM_ASSERT(shape.size() == 4, "channels-last tensors are 4-D, got ", shape_str(shape));
  const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3];
  Tensor flat = Tensor::empty({n, h, w, c}, dtype, device);
  return as_strided(flat, shape, {h * w * c, 1, w * c, c}, 0);
}

Tensor empty_dense_like(const Tensor& t, DType dtype) {
  if (strictly_channels_last(t)) return empty_channels_last(t.shape(), dtype, t.device());
  return Tensor::empty(t.shape(), dtype, t.device());
}

Tensor to_dense(const Tensor& t, DType dtype, bool channels_last) {
  if (t.dtype() == dtype && (channels_last ? is_channels_last(t) : t.is_contiguous())) return t;
  // A parameter whose 16-bit copy the optimizer keeps (ParamCopiesScope): read, not converted (a filter wanted
  // channels-last is rearranged from the copy: half the bytes the parameter's conversion reads).
  const Tensor copy = active_param_copy(t, dtype);
  if (copy.defined() && (!channels_last || t.dim() != 4)) return copy;
  if (!channels_last) return t.dtype() == dtype ? t.contiguous() : t.to(dtype);  // one copy either way
  const Tensor& from = copy.defined() ? copy : t;
  Tensor out = empty_channels_last(from.shape(), dtype, from.device());
  if (out.numel() == 0) return out;
  // Copy through [n, h, w, c] views of both: the destination's is contiguous, the source's is strided.
  const Shape& sh = from.shape();
  const Shape& st = from.strides();
  Tensor src = as_strided(from, {sh[0], sh[2], sh[3], sh[1]}, {st[0], st[2], st[3], st[1]}, from.storage_offset());
  Tensor dst = as_strided(out, {sh[0], sh[2], sh[3], sh[1]}, contiguous_strides({sh[0], sh[2], sh[3], sh[1]}), 0);
  backend::backend_for(from.device()).copy_strided(src, dst);
  return out;
}

DType compute_dtype(Device d, Precision p, DType fallback) {
  const DType a = activation_dtype(p);
  return d.is_cuda() && a != DType::f32 ? a : fallback;
}

namespace {
int initial_channels_last() {
  const char* e = std::getenv("TANDEM_CHANNELS_LAST");
  if (!e || !*e) return -1;
  return std::strcmp(e, "0") == 0 ? 0 : 1;
}
std::atomic<int> g_force{initial_channels_last()};
}  // namespace

void force_channels_last(int mode) { g_force.store(mode < 0 ? -1 : mode > 0 ? 1 : 0); }

bool conv_channels_last(Device d, Precision p, int64_t k) {
  if (!d.is_cuda()) return false;
  if (int f = g_force.load(); f >= 0) return f == 1;
  return p != Precision::f32 && k % 8 == 0;
}

}  // namespace tandem::ops
