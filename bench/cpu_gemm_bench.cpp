// The f32 matrix products of a small transformer's training step on the CPU, through OpenBLAS and through
// tandem's own kernel (backend/cpu/cpu_sgemm.h), one after the other in rounds: the measurement behind
// sgemm_preferred. Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: other processes on
// the machine do not count), the median over rounds; each pair of results is also compared.
//
//   cpu_gemm_bench [--rounds N] [--tokens N] [--width N] [--threads N]
//
// The shapes: a layer of width w over N tokens (N = batch x context): the products of the query-key-value
// projection (3w), the attention's output projection (w), the MLP (4w and back) and the tied head (vocab
// 256), forward (x W^T), input gradient (g W) and weight gradient (g^T x).
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_sgemm.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

using namespace tandem;
namespace cpu = tandem::backend::cpu;

namespace {

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Shape3 {
  const char* what;
  bool ta, tb;
  int64_t m, n, k;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double smallest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  int rounds = 31, threads = 1;
  int64_t tokens = 512, w = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (a == "--width") w = std::atoll(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "cpu_gemm_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (!cpu::sgemm_available()) {
    std::fprintf(stderr, "cpu_gemm_bench: this processor or build has no AVX2 + FMA: nothing to compare\n");
    return 1;
  }
  set_num_threads(threads);
  const int64_t n = tokens;
  const std::vector<Shape3> shapes = {
      {"qkv fwd", false, true, n, 3 * w, w},      {"qkv dx", false, false, n, w, 3 * w},
      {"qkv dW", true, false, 3 * w, w, n},       {"proj fwd", false, true, n, w, w},
      {"proj dx", false, false, n, w, w},         {"proj dW", true, false, w, w, n},
      {"fc fwd", false, true, n, 4 * w, w},       {"fc dx", false, false, n, w, 4 * w},
      {"fc dW", true, false, 4 * w, w, n},        {"out fwd", false, true, n, w, 4 * w},
      {"out dx", false, false, n, 4 * w, w},      {"out dW", true, false, w, 4 * w, n},
      {"head fwd", false, true, n, 256, w},       {"head dx", false, false, n, w, 256},
      {"head dW", true, false, 256, w, n},        {"attn qk (64)", false, true, 64, 64, w / 4},
      {"attn pv (64)", false, false, 64, w / 4, 64}, {"square 1024", false, false, 1024, 1024, 1024},
      {"square 2048", false, true, 2048, 2048, 2048},
  };
  std::printf("# cpu_gemm_bench: %lld tokens, width %lld, %d thread(s), %d rounds; us per product (thread CPU "
              "time, median), wall in brackets\n",
              static_cast<long long>(tokens), static_cast<long long>(w), threads, rounds);
  std::printf("%-16s %-3s %6s %6s %6s %9s %9s %7s %9s %9s %7s %7s %9s\n", "product", "op", "m", "n", "k", "openblas",
              "own", "ratio", "min blas", "min own", "ratio", "GFLOPS", "max diff");
  Generator gen(7);
  double total_blas = 0, total_own = 0;
  for (const Shape3& s : shapes) {
    Tensor a = Tensor::uniform({s.m * s.k}, -1, 1, gen), b = Tensor::uniform({s.k * s.n}, -1, 1, gen);
    Tensor c1 = Tensor::zeros({s.m * s.n}), c2 = Tensor::zeros({s.m * s.n});
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
    const int reps = std::max<int>(1, static_cast<int>(2e7 / flops));
    auto blas = [&] {
      cpu::ensure_blas_serial();
      if (threads > 1)
        cpu::gemm_parallel<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, c1.data<float>(), s.n);
      else
        cpu::blas_gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, c1.data<float>(), s.n);
    };
    auto own = [&] {
      cpu::sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, c2.data<float>(), s.n, {}, threads);
    };
    blas();
    own();
    std::vector<double> tb_cpu, to_cpu, tb_wall, to_wall;
    for (int r = 0; r < rounds; ++r) {
      for (int which = 0; which < 2; ++which) {
        const double c0 = thread_seconds(), w0 = wall_seconds();
        for (int i = 0; i < reps; ++i) which == 0 ? blas() : own();
        const double dc = (thread_seconds() - c0) / reps, dw = (wall_seconds() - w0) / reps;
        (which == 0 ? tb_cpu : to_cpu).push_back(dc);
        (which == 0 ? tb_wall : to_wall).push_back(dw);
      }
    }
    double diff = 0;
    const float* x1 = c1.data<float>();
    const float* x2 = c2.data<float>();
    for (int64_t i = 0; i < s.m * s.n; ++i) diff = std::max(diff, static_cast<double>(std::fabs(x1[i] - x2[i])));
    // With threads the calling thread's CPU time misses the workers': the wall time is the measure then.
    const double bt = threads > 1 ? median(tb_wall) : median(tb_cpu), ot = threads > 1 ? median(to_wall) : median(to_cpu);
    const double bmin = threads > 1 ? smallest(tb_wall) : smallest(tb_cpu), omin = threads > 1 ? smallest(to_wall) : smallest(to_cpu);
    total_blas += bt;
    total_own += ot;
    std::printf("%-16s %c%c  %6lld %6lld %6lld %9.1f %9.1f %7.2f %9.1f %9.1f %7.2f %7.1f %9.2g\n", s.what,
                s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), bt * 1e6, ot * 1e6, ot / bt, bmin * 1e6, omin * 1e6, omin / bmin,
                flops / omin * 1e-9, diff);
  }
  std::printf("# sum over the transformer's products (all but the squares): see the rows above; all rows: openblas "
              "%.1f us, own %.1f us\n",
              total_blas * 1e6, total_own * 1e6);
  return 0;
}
