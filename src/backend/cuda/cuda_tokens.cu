// CUDA kernel: a language model's batch of token windows (Backend::token_windows), drawn on the
// device from a window count kept on the device, so that a recorded step draws new windows each replay.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/token_window.h"

namespace tandem::backend {

namespace {
using kern::kBlock;

// One block row per window (blockIdx.x), its tokens spread over blockIdx.y. The first window's index
// is read from cursor[0]; the last block to finish (counted in cursor[1]) advances it by the batch
// and zeroes the count: every block has read it by then (as in gather_samples_kernel).
// Token is uint16_t or uint32_t: the stream's width. mask: a byte per token (null: every target kept).
template <typename Token>
__global__ void token_windows_kernel(const Token* __restrict__ tokens, const uint8_t* __restrict__ mask, int64_t n,
                                     int64_t T, uint64_t seed, bool random, int64_t frame, long long* cursor,
                                     int32_t* __restrict__ x, int32_t* __restrict__ y) {
  __shared__ long long first;
  __shared__ int64_t start;
  if (threadIdx.x == 0) {
    first = *reinterpret_cast<volatile long long*>(cursor);
    start = token_window_start(seed, first + blockIdx.x, n, T, random, frame);
  }
  __syncthreads();
  const Token* w = tokens + start;
  int32_t* xs = x + static_cast<int64_t>(blockIdx.x) * T;
  int32_t* ys = y + static_cast<int64_t>(blockIdx.x) * T;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; t < T; t += step) {
    xs[t] = static_cast<int32_t>(w[t]);
    ys[t] = token_window_target(static_cast<int32_t>(w[t + 1]), mask, start + t + 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long blocks = static_cast<unsigned long long>(gridDim.x) * gridDim.y;
    auto* done = reinterpret_cast<unsigned long long*>(cursor + 1);
    if (atomicAdd(done, 1ull) == blocks - 1) {  // the last block: all others have read the cursor
      cursor[0] = first + gridDim.x;
      *done = 0;
    }
  }
}
// The document positions of a batch's windows: block b takes window b (whose start it computes from
// cursor[0] before token_windows_kernel advances it: launched first, on the same stream). Each chunk of
// blockDim.x tokens finds, by a max-scan in shared memory, the last document start at or before each
// token (the window's first token counts as one), carried from chunk to chunk.
__global__ void document_positions_kernel(const uint8_t* __restrict__ mask, int64_t n, int64_t T, uint64_t seed,
                                          bool random, int64_t frame, const long long* cursor,
                                          int32_t* __restrict__ pos) {
  extern __shared__ int32_t scan[];
  __shared__ int64_t start;
  __shared__ int32_t carry;
  if (threadIdx.x == 0) {
    const long long first = *reinterpret_cast<const volatile long long*>(cursor);
    start = token_window_start(seed, first + blockIdx.x, n, T, random, frame);
    carry = 0;
  }
  __syncthreads();
  int32_t* out = pos + static_cast<int64_t>(blockIdx.x) * T;
  for (int64_t c0 = 0; c0 < T; c0 += blockDim.x) {
    const int64_t t = c0 + threadIdx.x;
    scan[threadIdx.x] = t < T && (t == 0 || (mask[start + t] & kDocumentStart)) ? static_cast<int32_t>(t) : -1;
    __syncthreads();
    for (unsigned off = 1; off < blockDim.x; off <<= 1) {  // inclusive max-scan (Hillis-Steele)
      const int32_t other = threadIdx.x >= off ? scan[threadIdx.x - off] : -1;
      __syncthreads();
      scan[threadIdx.x] = max(scan[threadIdx.x], other);
      __syncthreads();
    }
    const int32_t last = max(scan[threadIdx.x], carry);
    if (t < T) out[t] = static_cast<int32_t>(t) - last;
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry = last;
    __syncthreads();
  }
}
}  // namespace

void CudaBackend::token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                                int64_t frame, Tensor& x, Tensor& y, Tensor& pos) {
  check_token_windows(tokens, mask, cursor, frame, x, y, pos);
  const int64_t B = x.size(0), T = x.size(1);
  if (B == 0) return;
  TANDEM_CHECK(B <= INT_MAX, "token_windows: ", B, " windows in one batch");
  DeviceState& st = state_for(x);
  const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>(std::clamp<int64_t>((T + kBlock - 1) / kBlock, 1, 64)));
  auto* cur = reinterpret_cast<long long*>(cursor.data<int64_t>());
  const uint8_t* keep = mask.defined() ? mask.data<uint8_t>() : nullptr;
  if (pos.defined()) {  // before the windows' kernel, which advances the cursor
    document_positions_kernel<<<static_cast<unsigned>(B), kBlock, kBlock * sizeof(int32_t), st.stream>>>(
        keep, tokens.size(0), T, seed, random, frame, cur, pos.data<int32_t>());
    TANDEM_CUDA_LAUNCH_CHECK("document_positions_kernel");
  }
  if (tokens.size(1) == 4)
    token_windows_kernel<uint32_t><<<grid, kBlock, 0, st.stream>>>(
        reinterpret_cast<const uint32_t*>(tokens.data<uint8_t>()), keep, tokens.size(0), T, seed, random, frame, cur,
        x.data<int32_t>(), y.data<int32_t>());
  else
    token_windows_kernel<uint16_t><<<grid, kBlock, 0, st.stream>>>(
        reinterpret_cast<const uint16_t*>(tokens.data<uint8_t>()), keep, tokens.size(0), T, seed, random, frame, cur,
        x.data<int32_t>(), y.data<int32_t>());
  TANDEM_CUDA_LAUNCH_CHECK("token_windows_kernel");
}

}  // namespace tandem::backend
