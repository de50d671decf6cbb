// Times scaled dot-product attention, layer normalisation, softmax and the language-model cross-entropy,
// forward and forward + backward. On the GPU (the default), at GPT-2 (124M) shapes: batch 16, 1024
// positions, 12 heads of 64, width 768, vocabulary 50257, bf16; GPU time between CUDA events, the mean over
// the timed iterations after three untimed ones. With --device cpu, at a small shape in f32 (batch 4, 256
// positions, 4 heads of 32, width 128, vocabulary 256: a character model's), on --threads threads (2); wall
// time, the median of --repeats rounds of the mean over --iters calls. One line per op: "<op> <ms> ms".
// bench/ops_peer.py times the same ops with PyTorch.
//
//   tandem_ops_bench [--device cuda|cpu] [--iters N] [--dtype bf16|f16|f32] [--threads N] [--repeats N]
//                    [--ops attention,layer_norm,softmax,cross_entropy]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/device.h"
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

// Median over `repeats` rounds of the mean wall milliseconds of one call of f over `iters` calls, after
// three untimed ones (the CPU runs each op to completion before returning).
double cpu_time_ms(const std::function<void()>& f, int iters, int repeats) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> rounds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) f();
    rounds.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

bool wanted(const std::string& ops, const char* name) {
  return ops.empty() || ("," + ops + ",").find(std::string(",") + name + ",") != std::string::npos;
}

Device g_device = Device::cpu();

Tensor leaf(const Shape& s, DType t, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor x = Tensor::uniform(s, lo, hi, gen, DType::f32, g_device).to(t);
  x.requires_grad_();
  return x;
}

void clear_grads(std::initializer_list<Tensor> ts) {
  for (Tensor t : ts) t.set_grad(Tensor());
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, threads = 2, repeats = 5;
  std::string dtype, ops, device = "cuda";
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tandem_ops_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    else if (!std::strcmp(argv[i], "--ops")) ops = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: tandem_ops_bench [--device cuda|cpu] [--iters N] [--dtype bf16|f16|f32] [--threads N] "
                   "[--repeats N] [--ops a,b,...]\n");
      return 2;
    }
  }
  if ((device != "cpu" && device != "cuda") || iters < 1 || threads < 1 || repeats < 1) {
    std::fprintf(stderr, "tandem_ops_bench: --device is cpu or cuda; --iters, --threads, --repeats are positive\n");
    return 2;
  }
  const bool cpu = device == "cpu";
  std::function<double(const std::function<void()>&, int)> time_fn;
  if (cpu) {
    set_num_threads(threads);
    time_fn = [repeats](const std::function<void()>& f, int n) { return cpu_time_ms(f, n, repeats); };
  } else {
#if !TANDEM_BENCH_CUDA
    std::printf("tandem_ops_bench: built without CUDA: skipped (--device cpu times the CPU)\n");
    return 0;
#else
    if (cuda_device_count() == 0) {
      std::printf("tandem_ops_bench: no CUDA GPU: skipped (--device cpu times the CPU)\n");
      return 0;
    }
    g_device = Device::cuda(0);
    time_fn = time_ms;
#endif
  }
  if (dtype.empty()) dtype = cpu ? "f32" : "bf16";
  const DType t = parse_dtype(dtype);
  const int64_t B = cpu ? 4 : 16, T = cpu ? 256 : 1024, H = cpu ? 4 : 12, D = cpu ? 32 : 64, C = cpu ? 128 : 768,
                V = cpu ? 256 : 50257;
  Generator gen(1);
  auto row = [](const char* name, double ms) { std::printf("%-26s %9.3f ms\n", name, ms); };
  std::printf("# tandem, %s, %s%s, B=%lld T=%lld H=%lld d=%lld C=%lld V=%lld\n", device.c_str(), dtype.c_str(),
              cpu ? (", " + std::to_string(threads) + " threads").c_str() : "", (long long)B, (long long)T,
              (long long)H, (long long)D, (long long)C, (long long)V);
  const Device dev = g_device;
  if (wanted(ops, "attention")) {
    Tensor q = leaf({B, H, T, D}, t, gen), k = leaf({B, H, T, D}, t, gen), v = leaf({B, H, T, D}, t, gen);
    Tensor dout = Tensor::uniform({B, H, T, D}, -1, 1, gen, DType::f32, dev).to(t);
    row("attention_fwd", time_fn([&] { NoGradGuard ng; scaled_dot_product_attention(q, k, v, true); }, iters));
    row("attention_fwd_bwd", time_fn([&] {
          clear_grads({q, k, v});
          backward(scaled_dot_product_attention(q, k, v, true), {}, dout);
        }, iters));
  }
  if (wanted(ops, "layer_norm")) {
    Tensor x = leaf({B * T, C}, t, gen), w = leaf({C}, t, gen, 0.5, 1.5), b = leaf({C}, t, gen);
    Tensor dy = Tensor::uniform({B * T, C}, -1, 1, gen, DType::f32, dev).to(t);
    row("layer_norm_fwd", time_fn([&] { NoGradGuard ng; layer_norm(x, {C}, w, b); }, iters));
    row("layer_norm_fwd_bwd", time_fn([&] {
          clear_grads({x, w, b});
          backward(layer_norm(x, {C}, w, b), {}, dy);
        }, iters));
  }
  if (wanted(ops, "softmax")) {
    Tensor x = leaf({B * H * T, T}, t, gen, -4, 4);
    Tensor dy = Tensor::uniform({B * H * T, T}, -1, 1, gen, DType::f32, dev).to(t);
    row("softmax_fwd", time_fn([&] { NoGradGuard ng; softmax(x, -1); }, iters));
    row("softmax_fwd_bwd", time_fn([&] {
          clear_grads({x});
          backward(softmax(x, -1), {}, dy);
        }, iters));
  }
  if (wanted(ops, "cross_entropy")) {
    Tensor logits = leaf({B * T, V}, t, gen, -4, 4);
    Tensor targets = Tensor::uniform({B * T}, 0, static_cast<double>(V), gen, DType::f32, dev).to(DType::i64);
    row("cross_entropy_fwd", time_fn([&] { NoGradGuard ng; softmax_cross_entropy(logits, targets, Reduction::Mean); }, iters));
    row("cross_entropy_fwd_bwd", time_fn([&] {
          clear_grads({logits});
          backward(softmax_cross_entropy(logits, targets, Reduction::Mean));
        }, iters));
  }
  return 0;
}
