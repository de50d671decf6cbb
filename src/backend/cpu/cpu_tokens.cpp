// CPU backend: a language model's batch of token windows (Backend::token_windows).

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/token_window.h"

namespace tandem::backend {

void CpuBackend::token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                               int64_t frame, Tensor& x, Tensor& y, Tensor& pos) {
  check_token_windows(tokens, mask, cursor, frame, x, y, pos);
  const int64_t B = x.size(0), T = x.size(1), n = tokens.size(0);
  int64_t& drawn = cursor.data<int64_t>()[0];
  const int64_t first = drawn;
  TANDEM_CHECK(first >= 0, "token_windows: the cursor holds a negative window count ", first);
  drawn += B;
  const auto* bytes = tokens.data<uint8_t>();
  const uint8_t* keep = mask.defined() ? mask.data<uint8_t>() : nullptr;
  const int64_t width = tokens.size(1);
  int32_t* xs = x.data<int32_t>();
  int32_t* ys = y.data<int32_t>();
  int32_t* ps = pos.defined() ? pos.data<int32_t>() : nullptr;
  // Token k of a window is its `width` bytes from k * width, least significant first: little-endian on
  // any host. uint32 tokens of a vocabulary below 2^31 fit an i32.
  auto token = [width](const uint8_t* p) -> int32_t {
    if (width == 2) return p[0] | (p[1] << 8);
    return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
  };
  cpu::parallel_for(B, cpu::grain_for(2 * T), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s = token_window_start(seed, first + b, n, T, random, frame);
      const uint8_t* w = bytes + width * s;
      int32_t prev = token(w);
      for (int64_t t = 0; t < T; ++t) {
        const int32_t next = token(w + width * (t + 1));
        xs[b * T + t] = prev;
        ys[b * T + t] = token_window_target(next, keep, s + t + 1);
        prev = next;
      }
      if (ps) {  // each token's position in its document: counted from the last start at or before it
        int32_t p = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (t > 0) p = (keep[s + t] & kDocumentStart) ? 0 : p + 1;
          ps[b * T + t] = p;
        }
      }
    }
  });
}

}  // namespace tandem::backend
