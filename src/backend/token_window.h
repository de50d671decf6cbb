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
/// With frame > 0 (frame >= T + 1: a stream cut into frames of that many tokens, each one padded example
/// or one window of packed examples) windows start at frames only: frame k of the n / frame, k being
/// rng::mix(seed, j) modulo n / frame (random) or j modulo n / frame (sequential).
TANDEM_HD int64_t token_window_start(uint64_t seed, int64_t j, int64_t n, int64_t T, bool random, int64_t frame = 0) {
  if (frame > 0) {
    const int64_t frames = n / frame;
    const int64_t k =
        random ? static_cast<int64_t>(rng::mix(seed, static_cast<uint64_t>(j)) % static_cast<uint64_t>(frames))
               : j % frames;
    return k * frame;
  }
  if (random) return static_cast<int64_t>(rng::mix(seed, static_cast<uint64_t>(j)) % static_cast<uint64_t>(n - T));
  return (j % ((n - 1) / T)) * T;
}

/// The target of a window's token at stream position p: the token, or ignore (-100, what the losses
/// leave out) where a loss mask (one byte per token, null: none) has bit 0 clear. (Bit 1 marks a
/// document's first token: Backend::token_windows' positions.)
TANDEM_HD int32_t token_window_target(int32_t token, const uint8_t* mask, int64_t p) {
  return mask && (mask[p] & 1) == 0 ? int32_t{-100} : token;
}

/// The mask byte's bit marking the first token of a document (an example of packed instruction data).
constexpr uint8_t kDocumentStart = 2;

/// The checks of Backend::token_windows' arguments that need no device data (both backends make them).
inline void check_token_windows(const Tensor& tokens, const Tensor& mask, const Tensor& cursor, int64_t frame,
                                const Tensor& x, const Tensor& y, const Tensor& pos = Tensor()) {
  TANDEM_CHECK(!pos.defined() || (pos.dtype() == DType::i32 && pos.shape() == x.shape() && pos.is_contiguous() &&
                                  pos.device() == x.device() && mask.defined()),
               "token_windows: document positions must be i32 ", x.str(), " like x, and need the mask that marks ",
               "the documents, got ", pos.str(), mask.defined() ? "" : " without a mask");
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
  TANDEM_CHECK(!mask.defined() || (mask.dtype() == DType::u8 && mask.dim() == 1 && mask.size(0) == tokens.size(0) &&
                                   mask.is_contiguous() && mask.device() == x.device()),
               "token_windows: the loss mask must be u8 [", tokens.size(0), "] (a byte per token) on ",
               x.device().str(), ", got ", mask.str());
  TANDEM_CHECK(frame == 0 || (frame >= x.size(1) + 1 && tokens.size(0) >= frame),
               "token_windows: frames of ", frame, " tokens cannot hold a window of T + 1 = ", x.size(1) + 1,
               " or do not fit in ", tokens.size(0), " tokens");
}

}  // namespace tandem::backend
