// Times scaled dot-product attention, layer normalisation, softmax and the language-model cross-entropy,
// forward and forward + backward, at GPT-2 (124M) shapes on the GPU: batch 16, 1024 positions, 12 heads of
// 64, width 768, vocabulary 50257, bf16. GPU time between CUDA events, the mean over the timed iterations
// after warm-up; one line per op: "<op> <ms> ms". bench/ops_peer.py times the same ops with PyTorch.
//
//   tandem_ops_bench [--iters N] [--dtype bf16|f16] [--ops attention,layer_norm,softmax,cross_entropy]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "tandem/autograd.h"
#include "tandem/ops.h"
#include "tandem/random.h"
#if TANDEM_BENCH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_context.h"
#endif

using namespace tandem;

namespace {

#if TANDEM_BENCH_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "tandem_ops_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Mean GPU milliseconds of one call of f over `iters` calls, after three untimed ones: events recorded on
// the stream tandem queues its kernels on.
double time_ms(const std::function<void()>& f, int iters) {
  for (int i = 0; i < 3; ++i) f();
  synchronize(Device::cuda(0));
  cudaStream_t stream = cuda::compute_stream(0);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) f();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}
#endif

bool wanted(const std::string& ops, const char* name) {
  return ops.empty() || ("," + ops + ",").find(std::string(",") + name + ",") != std::string::npos;
}

Tensor leaf(const Shape& s, DType t, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor x = Tensor::uniform(s, lo, hi, gen, DType::f32, Device::cuda(0)).to(t);
  x.requires_grad_();
  return x;
}

void clear_grads(std::initializer_list<Tensor> ts) {
  for (Tensor t : ts) t.set_grad(Tensor());
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  std::string dtype = "bf16", ops;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    else if (!std::strcmp(argv[i], "--ops")) ops = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: tandem_ops_bench [--iters N] [--dtype bf16|f16] [--ops a,b,...]\n");
      return 2;
    }
  }
#if !TANDEM_BENCH_CUDA
  (void)iters;
  std::printf("tandem_ops_bench: built without CUDA: skipped\n");
  return 0;
#else
  if (cuda_device_count() == 0) {
    std::printf("tandem_ops_bench: no CUDA GPU: skipped\n");
    return 0;
  }
  const DType t = parse_dtype(dtype);
  const int64_t B = 16, T = 1024, H = 12, D = 64, C = 768, V = 50257;
  Generator gen(1);
  auto row = [](const char* name, double ms) { std::printf("%-26s %9.3f ms\n", name, ms); };
  std::printf("# tandem, %s, B=%lld T=%lld H=%lld d=%lld C=%lld V=%lld\n", dtype.c_str(), (long long)B, (long long)T,
              (long long)H, (long long)D, (long long)C, (long long)V);
  if (wanted(ops, "attention")) {
    Tensor q = leaf({B, H, T, D}, t, gen), k = leaf({B, H, T, D}, t, gen), v = leaf({B, H, T, D}, t, gen);
    Tensor dout = Tensor::uniform({B, H, T, D}, -1, 1, gen, DType::f32, Device::cuda(0)).to(t);
    row("attention_fwd", time_ms([&] { NoGradGuard ng; scaled_dot_product_attention(q, k, v, true); }, iters));
    row("attention_fwd_bwd", time_ms([&] {
          clear_grads({q, k, v});
          backward(scaled_dot_product_attention(q, k, v, true), {}, dout);
        }, iters));
  }
  if (wanted(ops, "layer_norm")) {
    Tensor x = leaf({B * T, C}, t, gen), w = leaf({C}, t, gen, 0.5, 1.5), b = leaf({C}, t, gen);
    Tensor dy = Tensor::uniform({B * T, C}, -1, 1, gen, DType::f32, Device::cuda(0)).to(t);
    row("layer_norm_fwd", time_ms([&] { NoGradGuard ng; layer_norm(x, {C}, w, b); }, iters));
    row("layer_norm_fwd_bwd", time_ms([&] {
          clear_grads({x, w, b});
          backward(layer_norm(x, {C}, w, b), {}, dy);
        }, iters));
  }
  if (wanted(ops, "softmax")) {
    Tensor x = leaf({B * H * T, T}, t, gen, -4, 4);
    Tensor dy = Tensor::uniform({B * H * T, T}, -1, 1, gen, DType::f32, Device::cuda(0)).to(t);
    row("softmax_fwd", time_ms([&] { NoGradGuard ng; softmax(x, -1); }, iters));
    row("softmax_fwd_bwd", time_ms([&] {
          clear_grads({x});
          backward(softmax(x, -1), {}, dy);
        }, iters));
  }
  if (wanted(ops, "cross_entropy")) {
    Tensor logits = leaf({B * T, V}, t, gen, -4, 4);
    Tensor targets = Tensor::uniform({B * T}, 0, static_cast<double>(V), gen, DType::f32, Device::cuda(0)).to(DType::i64);
    row("cross_entropy_fwd", time_ms([&] { NoGradGuard ng; softmax_cross_entropy(logits, targets, Reduction::Mean); }, iters));
    row("cross_entropy_fwd_bwd", time_ms([&] {
          clear_grads({logits});
          backward(softmax_cross_entropy(logits, targets, Reduction::Mean));
        }, iters));
  }
  return 0;
#endif
}
