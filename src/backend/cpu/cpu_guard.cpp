// CPU backend: the kernels that keep a step's verdict on the device (skips of non-finite steps, loss
// scaling, partialUpdate's chunk index). On the CPU "the device" is host memory, read directly.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

namespace {

bool finite_verdict(const Tensor& verdict) {
  TANDEM_ASSERT(verdict.numel() == 1 && verdict.dtype() == DType::f32, "a verdict is one f32 value, got ",
                verdict.str());
  return std::isfinite(*static_cast<const float*>(verdict.data_ptr()));
}

int64_t& counter_at(Tensor& t, int64_t i, const char* op) {
  TANDEM_ASSERT(t.dtype() == DType::i64 && t.numel() > i, op, ": counter ", t.str());
  return static_cast<int64_t*>(t.data_ptr())[i];
}

}  // namespace

void CpuBackend::scale_by(const Tensor& x, const Tensor& factor, Tensor& out) {
  TANDEM_ASSERT(x.dtype() == DType::f32 && out.dtype() == DType::f32 && factor.dtype() == DType::f32 &&
                    factor.numel() == 1 && x.numel() == out.numel(),
                "scale_by: ", x.str(), " * ", factor.str(), " -> ", out.str());
  const float f = *static_cast<const float*>(factor.data_ptr());
  const float* a = static_cast<const float*>(x.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  cpu::parallel_for(x.numel(), cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) o[i] = a[i] * f;
  });
}

void CpuBackend::restore_if_nonfinite(const Tensor& verdict, const Tensor& saved, Tensor& dst) {
  TANDEM_ASSERT(saved.nbytes() == dst.nbytes(), "restore_if_nonfinite: ", saved.str(), " into ", dst.str());
  if (!finite_verdict(verdict) && dst.nbytes() > 0) std::memcpy(dst.data_ptr(), saved.data_ptr(), dst.nbytes());
}

void CpuBackend::count_nonfinite(const Tensor& verdict, Tensor& counter) {
  if (!finite_verdict(verdict)) counter_at(counter, 0, "count_nonfinite")++;
}

void CpuBackend::loss_scale_update(const Tensor& verdict, Tensor& scale, Tensor& counts, double growth,
                                   double backoff, int64_t interval) {
  TANDEM_ASSERT(scale.dtype() == DType::f32 && scale.numel() == 2, "loss_scale_update: scale ", scale.str());
  float* s = static_cast<float*>(scale.data_ptr());
  int64_t& clean = counter_at(counts, 0, "loss_scale_update");
  int64_t& skipped = counter_at(counts, 1, "loss_scale_update");
  float next = s[0];
  if (!finite_verdict(verdict)) {
    next = static_cast<float>(s[0] * backoff);
    clean = 0;
    ++skipped;
  } else if (++clean >= interval) {
    clean = 0;
    const float grown = static_cast<float>(s[0] * growth);
    if (std::isfinite(grown)) next = grown;
  }
  if (next > 0.0f && next != s[0]) {  // a scale that underflowed to 0 stays where it was
    s[0] = next;
    s[1] = 1.0f / next;
  }
}

void CpuBackend::copy_chunk(const Tensor& src, Tensor& dst, const Tensor& index, bool into_chunk,
                            const Tensor& verdict) {
  if (verdict.defined() && !finite_verdict(verdict)) return;
  TANDEM_ASSERT(src.dtype() == DType::f32 && dst.dtype() == DType::f32 && index.dtype() == DType::i64 &&
                    index.numel() == 1,
                "copy_chunk: ", src.str(), " -> ", dst.str(), " at ", index.str());
  const int64_t chunk = into_chunk ? src.numel() : dst.numel();
  const int64_t whole = into_chunk ? dst.numel() : src.numel();
  const int64_t k = *static_cast<const int64_t*>(index.data_ptr());
  TANDEM_ASSERT(chunk > 0 && whole % chunk == 0 && k >= 0 && k < whole / chunk, "copy_chunk: chunk ", k, " of ",
                whole / std::max<int64_t>(chunk, 1));
  const float* from = static_cast<const float*>(src.data_ptr()) + (into_chunk ? 0 : k * chunk);
  float* to = static_cast<float*>(dst.data_ptr()) + (into_chunk ? k * chunk : 0);
  std::memcpy(to, from, static_cast<size_t>(chunk) * sizeof(float));
}

void CpuBackend::advance_counter(Tensor& counter, int64_t modulo, const Tensor& verdict) {
  TANDEM_ASSERT(modulo > 0, "advance_counter: modulo ", modulo);
  if (verdict.defined() && !finite_verdict(verdict)) return;
  int64_t& c = counter_at(counter, 0, "advance_counter");
  c = (c + 1) % modulo;
}

}  // namespace tandem::backend
