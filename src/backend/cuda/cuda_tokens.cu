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
}  // namespace

void CudaBackend::token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                                int64_t frame, Tensor& x, Tensor& y) {
  check_token_windows(tokens, mask, cursor, frame, x, y);
  const int64_t B = x.size(0), T = x.size(1);
  if (B == 0) return;
  TANDEM_CHECK(B <= INT_MAX, "token_windows: ", B, " windows in one batch");
  DeviceState& st = state_for(x);
  const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>(std::clamp<int64_t>((T + kBlock - 1) / kBlock, 1, 64)));
  auto* cur = reinterpret_cast<long long*>(cursor.data<int64_t>());
  const uint8_t* keep = mask.defined() ? mask.data<uint8_t>() : nullptr;
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
