// The CUDA backend's FP8 kernels against the CPU's, byte for byte: the scaled cast from f32, bf16 and f16 (NaN,
// infinities, subnormals and values beyond the formats' range included), the maximum, the decode of every code,
// the transposed cast, and the scale update (zero, infinite and NaN maxima). The FP8 product (cuBLASLt's on
// Hopper, the emulation elsewhere) against the CPU's emulation, fp8_linear on the GPU against the CPU, and a
// delayed-scaling step recorded as a CUDA graph against the same step run eagerly.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/device.h"
#include "tandem/fp8.h"
#include "tandem/graph.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

Tensor scalar_on(float v, Device d) { return Tensor::from_vector(std::vector<float>{v}, {1}).to(d); }

// The same bytes where the CPU's value is not NaN, NaN where it is (a GPU's arithmetic may change a NaN's
// payload).
void expect_same_or_nan(const Tensor& cpu_values, const Tensor& gpu_values, const std::string& what) {
  const std::vector<float> a = cpu_values.to_vector<float>(), b = gpu_values.cpu().to_vector<float>();
  ASSERT_EQ(a.size(), b.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = std::isnan(a[i]) ? std::isnan(b[i]) : std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
    if (!same && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " CPU " << a[i] << ", GPU " << b[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// Random values over a wide range with the special values a cast must handle.
Tensor awkward(int64_t n, uint64_t seed) {
  Tensor x = rand_cpu({n}, seed, -1.0, 1.0);
  std::vector<float> v = x.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i % 41) - 25);  // 2^-25 .. 2^15
  const float special[] = {kNan, kInf, -kInf, 0.0f, -0.0f, 1e-30f, -1e-30f, 5000.0f, -70000.0f, 464.0f, 61440.0f};
  for (size_t i = 0; i < sizeof(special) / sizeof(float); ++i) v[i * 97 % v.size()] = special[i];
  return Tensor::from_vector(v, {n});
}

TEST(CudaFp8, QuantizeAndAmaxMatchTheCpuBytes) {
  REQUIRE_GPU();
  const Tensor x = awkward(100003, 1);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor xc = x.to(dt);
    const Tensor xg = xc.to(gpu());
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      for (float s : {1.0f, 0.37f, 3000.0f}) {
        Tensor qc = Tensor::empty({x.numel()}, DType::u8), qg = Tensor::empty({x.numel()}, DType::u8, gpu());
        Tensor ac = scalar_on(0.5f, Device::cpu()), ag = scalar_on(0.5f, gpu());
        cpu_be().fp8_quantize(xc, scalar_on(s, Device::cpu()), f, qc, ac);
        gpu_be().fp8_quantize(xg, scalar_on(s, gpu()), f, qg, ag);
        const std::string what = std::string(dtype_name(dt)) + " " + fp8_format_name(f) + " scale " + std::to_string(s);
        expect_same_bytes(qc, qg, what);
        expect_same_bytes(ac, ag, what + " amax");
        EXPECT_TRUE(std::isnan(ag.cpu().item<float>())) << what;
      }
    }
    // Without NaN: the infinity; without either, the largest magnitude.
    std::vector<float> v = x.to_vector<float>();
    for (float& e : v)
      if (std::isnan(e)) e = 1.0f;
    Tensor finite_inf = Tensor::from_vector(v, {x.numel()}).to(dt);
    for (float& e : v)
      if (std::isinf(e)) e = -2.0f;
    Tensor finite = Tensor::from_vector(v, {x.numel()}).to(dt);
    for (const Tensor& t : {finite_inf, finite}) {
      Tensor ac = scalar_on(0.0f, Device::cpu()), ag = scalar_on(0.0f, gpu());
      cpu_be().fp8_amax(t, ac);
      gpu_be().fp8_amax(t.to(gpu()), ag);
      expect_same_bytes(ac, ag, std::string("amax ") + dtype_name(dt));
    }
  }
}

TEST(CudaFp8, DequantizeEveryCode) {
  REQUIRE_GPU();
  std::vector<uint8_t> all(256);
  for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
  Tensor q = Tensor::from_data(all.data(), {256}, DType::u8);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (float si : {1.0f, 0.003f}) {
      Tensor yc = Tensor::empty({256}), yg = Tensor::empty({256}, DType::f32, gpu());
      cpu_be().fp8_dequantize(q, scalar_on(si, Device::cpu()), f, yc);
      gpu_be().fp8_dequantize(q.to(gpu()), scalar_on(si, gpu()), f, yg);
      expect_same_or_nan(yc, yg, std::string("decode ") + fp8_format_name(f));
      for (DType dt : {DType::bf16, DType::f16}) {
        Tensor hc = Tensor::empty({256}, dt), hg = Tensor::empty({256}, dt, gpu());
        cpu_be().fp8_dequantize(q, scalar_on(si, Device::cpu()), f, hc);
        gpu_be().fp8_dequantize(q.to(gpu()), scalar_on(si, gpu()), f, hg);
        expect_close(hc.to(DType::f32), hg.cpu().to(DType::f32), 0.0, 0.0,
                     std::string("decode to ") + dtype_name(dt));
      }
    }
  }
}

TEST(CudaFp8, TransposedCastEqualsTheTransposeOfTheCast) {
  REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 53}, {256, 128}, {1, 1000}, {1000, 1}, {33, 32}}) {
    const Tensor x = awkward(rows * cols, static_cast<uint64_t>(rows * 7 + cols)).view({rows, cols});
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      Tensor s = scalar_on(2.5f, Device::cpu());
      Tensor q = Tensor::empty({rows, cols}, DType::u8), qt = Tensor::empty({cols, rows}, DType::u8);
      Tensor a = scalar_on(0.0f, Device::cpu());
      cpu_be().fp8_quantize_transposed(x, s, f, rows, cols, q, qt, a);
      Tensor qg = Tensor::empty({rows, cols}, DType::u8, gpu()), qtg = Tensor::empty({cols, rows}, DType::u8, gpu());
      Tensor ag = scalar_on(0.0f, gpu());
      gpu_be().fp8_quantize_transposed(x.to(gpu()), s.to(gpu()), f, rows, cols, qg, qtg, ag);
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + fp8_format_name(f);
      expect_same_bytes(q, qg, what + " codes");
      expect_same_bytes(qt, qtg, what + " transposed codes");
      expect_same_bytes(a, ag, what + " amax");
      // The transposed codes are the codes transposed (on the GPU's own output).
      Tensor direct = Tensor::empty({rows, cols}, DType::u8, gpu()), none;
      gpu_be().fp8_quantize(x.to(gpu()), s.to(gpu()), f, direct, none);
      const Tensor d = direct.cpu(), t = qtg.cpu();
      const uint8_t* pd = static_cast<const uint8_t*>(d.data_ptr());
      const uint8_t* pt = static_cast<const uint8_t*>(t.data_ptr());
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) bad += pt[c * rows + r] != pd[r * cols + c];
      EXPECT_EQ(bad, 0) << what;
    }
  }
}

TEST(CudaFp8, ScaleUpdateMatchesTheCpu) {
  REQUIRE_GPU();
  const int64_t rows = 5, count = 7;
  // Columns: a usual history, zeros, inf now, NaN now, a tiny maximum, an odd maximum, a large one.
  std::vector<float> h(rows * count, 0.0f);
  auto set = [&](int64_t r, int64_t i, float v) { h[r * count + i] = v; };
  set(0, 0, 3.5f), set(1, 0, 7.0f), set(4, 0, 1.0f);
  set(0, 2, kInf), set(1, 2, 2.0f);
  set(0, 3, kNan), set(2, 3, 4.0f);
  set(0, 4, 1e-38f);
  set(0, 5, 3.0f), set(3, 5, 0.3f);
  set(0, 6, 3e5f);
  for (bool use_max : {true, false}) {
    for (float margin : {1.0f, 4.0f}) {
      Tensor hc = Tensor::from_vector(h, {rows, count}), hg = hc.to(gpu());
      Tensor sc = Tensor::full({count}, 5.0), sg = sc.to(gpu());
      Tensor sic = Tensor::full({count}, 0.2), sig = sic.to(gpu());
      Tensor vc = Tensor::zeros({1}), vg = vc.to(gpu());
      cpu_be().fp8_scale_update(hc, sc, sic, 57344.0f, margin, use_max, vc);
      gpu_be().fp8_scale_update(hg, sg, sig, 57344.0f, margin, use_max, vg);
      const std::string what = std::string(use_max ? "max" : "most recent") + " margin " + std::to_string(margin);
      expect_same_bytes(hc, hg, what + " history");
      expect_same_bytes(sc, sg, what + " scale");
      expect_same_bytes(sic, sig, what + " scale_inv");
      expect_same_bytes(vc, vg, what + " verdict");
      EXPECT_TRUE(std::isnan(vg.cpu().item<float>())) << what;
    }
  }
  // All finite: the verdict stays.
  Tensor hg = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {1, 2}).to(gpu());
  Tensor sg = Tensor::ones({2}, DType::f32, gpu()), sig = Tensor::ones({2}, DType::f32, gpu());
  Tensor vg = Tensor::zeros({1}, DType::f32, gpu());
  gpu_be().fp8_scale_update(hg, sg, sig, 448.0f, 1.0f, true, vg);
  EXPECT_EQ(vg.cpu().item<float>(), 0.0f);
  EXPECT_EQ(sg.cpu().to_vector<float>(), (std::vector<float>{448.0f, 224.0f}));
}

// The FP8 product on the GPU (cuBLASLt's where it takes the case) against the CPU's emulation: both sum exact
// f32 products of the decoded values, in different orders.
TEST(CudaFp8, ProductMatchesTheEmulation) {
  REQUIRE_GPU();
  struct Case {
    int64_t m, n, k;
    Fp8Format fa, fb;
    DType out;
  };
  const Case cases[] = {
      {64, 128, 256, Fp8Format::e4m3, Fp8Format::e4m3, DType::f32},
      {48, 32, 64, Fp8Format::e5m2, Fp8Format::e4m3, DType::bf16},
      {128, 64, 96, Fp8Format::e4m3, Fp8Format::e5m2, DType::f32},
      {16, 16, 32, Fp8Format::e5m2, Fp8Format::e5m2, DType::f32},  // not cuBLASLt's: the emulation
      {10, 12, 20, Fp8Format::e4m3, Fp8Format::e4m3, DType::f32},  // shapes cuBLASLt does not take
  };
  for (const Case& c : cases) {
    Tensor a = rand_cpu({c.m, c.k}, 3, -2.0, 2.0), b = rand_cpu({c.n, c.k}, 4, -2.0, 2.0);
    const float sa = fp8_max(c.fa) / 2.0f, sb = fp8_max(c.fb) / 2.0f;
    Tensor qa = Tensor::empty({c.m, c.k}, DType::u8), qb = Tensor::empty({c.n, c.k}, DType::u8), none;
    cpu_be().fp8_quantize(a, scalar_on(sa, Device::cpu()), c.fa, qa, none);
    cpu_be().fp8_quantize(b, scalar_on(sb, Device::cpu()), c.fb, qb, none);
    Tensor ia = scalar_on(1.0f / sa, Device::cpu()), ib = scalar_on(1.0f / sb, Device::cpu());
    Tensor yc = Tensor::empty({c.m, c.n}, c.out), yg = Tensor::empty({c.m, c.n}, c.out, gpu());
    cpu_be().fp8_gemm(qa, c.fa, ia, qb, c.fb, ib, c.m, c.n, c.k, yc);
    gpu_be().fp8_gemm(qa.to(gpu()), c.fa, ia.to(gpu()), qb.to(gpu()), c.fb, ib.to(gpu()), c.m, c.n, c.k, yg);
    const std::string what = std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " " +
                             fp8_format_name(c.fa) + " by " + fp8_format_name(c.fb);
    // Hopper's FP8 tensor cores sum in a narrower accumulator between cuBLASLt's f32 promotions: 1e-3, far below
    // the casts' own error (about 3e-2) and far below what a wrong scale or layout gives.
    expect_norm_close(yc.to(DType::f32), yg.cpu().to(DType::f32), c.out == DType::bf16 ? 4e-3 : 1e-3, what);
  }
}

// fp8_linear on the GPU against the CPU: the same scales (bit for bit: the maxima and the update are exact),
// outputs and gradients within the products' summation differences (see ProductMatchesTheEmulation).
TEST(CudaFp8, LinearMatchesTheCpu) {
  REQUIRE_GPU();
  const int64_t n = 64, in = 128, out = 96;
  Tensor x0 = rand_cpu({n, in}, 5), w0 = rand_cpu({out, in}, 6, -0.3, 0.3), b0 = rand_cpu({out}, 7);
  Tensor g0 = rand_cpu({n, out}, 8, -0.01, 0.01);
  for (Fp8Recipe recipe : {Fp8Recipe::current(), Fp8Recipe::delayed(8)}) {
    std::vector<Tensor> results[2];
    std::vector<Tensor> scales[2];
    for (int dev = 0; dev < 2; ++dev) {
      const Device d = dev ? gpu() : Device::cpu();
      Fp8LinearState st(recipe, d);
      for (int step = 0; step < 2; ++step) {  // delayed: the second step uses the first one's maxima
        Tensor x = x0.to(d).clone().requires_grad_(), w = w0.to(d).clone().requires_grad_();
        Tensor b = b0.to(d).clone().requires_grad_();
        Tensor y = fp8_linear(x, w, b, st);
        backward(y, {}, g0.to(d));
        st.update();
        if (step == 1) results[dev] = {y.cpu(), x.grad().cpu(), w.grad().cpu(), b.grad().cpu()};
      }
      scales[dev] = {st.forward.scale().cpu(), st.backward.scale().cpu(), st.forward.amax_history().cpu(),
                     st.verdict.cpu()};
    }
    const char* names[] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; ++i) expect_norm_close(results[0][i], results[1][i], 1e-3, names[i]);
    for (int i = 0; i < 4; ++i) expect_same_bytes(scales[0][i], scales[1][i], "scale state " + std::to_string(i));
  }
}

// A delayed-scaling step (forward, backward, update) recorded once and replayed gives what the same steps
// give run eagerly: the scales and maxima live on the device and nothing waits for the host.
TEST(CudaFp8, DelayedStepRecordsAsAGraph) {
  REQUIRE_GPU();
  const int64_t n = 32, in = 64, out = 32;
  Tensor x0 = rand_cpu({n, in}, 9).to(gpu()), w0 = rand_cpu({out, in}, 10, -0.5, 0.5).to(gpu());
  Tensor g0 = rand_cpu({n, out}, 11, -0.1, 0.1).to(gpu());
  auto make = [&] {
    Tensor w = w0.clone().requires_grad_();
    return w;
  };
  Fp8LinearState eager(Fp8Recipe::delayed(4), gpu()), recorded(Fp8Recipe::delayed(4), gpu());
  Tensor we = make(), wr = make();
  Tensor ye, yr, dwe, dwr;
  auto step = [&](Fp8LinearState& st, Tensor& w, Tensor& y, Tensor& dw) {
    w.set_grad(Tensor());
    y = fp8_linear(x0, w, Tensor(), st);
    backward(y, {}, g0);
    dw = w.grad();
    st.update();
  };
  for (int i = 0; i < 3; ++i) step(eager, we, ye, dwe);
  step(recorded, wr, yr, dwr);  // warm-up outside the recording (plans, workspaces)
  std::unique_ptr<DeviceGraph> graph;
  graph = std::make_unique<DeviceGraph>(gpu(), [&] { step(recorded, wr, yr, dwr); });
  graph->replay();
  graph->replay();
  synchronize(gpu());
  expect_same_bytes(eager.forward.scale(), recorded.forward.scale(), "forward scales");
  expect_same_bytes(eager.backward.scale(), recorded.backward.scale(), "backward scale");
  expect_same_bytes(eager.forward.amax_history(), recorded.forward.amax_history(), "history");
  expect_same_bytes(ye, yr, "y of the third step");
  expect_same_bytes(dwe, dwr, "dw of the third step");
}

}  // namespace
}  // namespace tandem
