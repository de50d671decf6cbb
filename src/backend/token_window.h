#pragma once
// Internal: where window j of a token stream starts (Backend::token_windows), shared by the CPU and
// CUDA kernels and the host, so that every device draws the same windows. Integer arithmetic only.
#include <cstdint>

#include "core/counter_rng.h"
#include "tandem/error.h"
#include "tandem/tensor.h"

namespace tandem::backend {

/// Start of window j (T + 1 tokens) in a stream of n >= T + 1 tokens: random, rng::mix(seed, j)
/// modulo the n - T possible starts; sequential, window j modulo the (n - 1) / T consecutive ones, times T.
TANDEM_HD int64_t token_window_start(uint64_t seed, int64_t j, int64_t n, int64_t T, bool random) {
  if (random) return static_cast<int64_t>(rng::mix(seed, static_cast<uint64_t>(j)) % static_cast<uint64_t>(n - T));
  return (j % ((n - 1) / T)) * T;
}

/// The checks of Backend::token_windows' arguments that need no device data (both backends make them).
inline void check_token_windows(const Tensor& tokens, const Tensor& cursor, const Tensor& x, const Tensor& y) {
  TANDEM_CHECK(tokens.dtype() == DType::u8 && tokens.dim() == 2 && (tokens.size(1) == 2 || tokens.size(1) == 4) &&
                   tokens.is_contiguous(),
               "token_windows: tokens must be u8 [n, 2] or u8 [n, 4] (uint16 or uint32 tokens as bytes), got ",
               tokens.str());
  TANDEM_CHECK(x.dtype() == DType::i32 && x.dim() == 2 && y.dtype() == DType::i32 && y.shape() == x.shape(),
               "token_windows: x and y must be i32 [B, T] of one shape, got ", x.str(), " and ", y.str());
  TANDEM_CHECK(x.size(1) >= 1, "token_windows: the context T must be at least 1, got ", x.str());
  TANDEM_CHECK(tokens.size(0) >= x.size(1) + 1, "token_windows: ", tokens.size(0),
               " tokens cannot hold a window of T + 1 = ", x.size(1) + 1);
  TANDEM_CHECK(cursor.dtype() == DType::i64 && cursor.numel() == 2 && cursor.device() == x.device() &&
                   tokens.device() == x.device() && y.device() == x.device(),
               "token_windows: the cursor must be i64 [2] and every tensor on ", x.device().str(), ", got cursor ",
               cursor.str(), ", tokens ", tokens.str());
}

}  // namespace tandem::backend
