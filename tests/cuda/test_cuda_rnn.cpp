// Embedding, the recurrent networks (cuDNN and the per-step ops on the GPU) and the fused RMSProp and
// AdaGrad kernels against the CPU on the same inputs.
#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;

#define SKIP_WITHOUT_GPU() \
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

// Restores the deterministic-algorithms switch on scope exit.
struct DeterministicScope {
  bool prev = deterministic_algorithms();
  explicit DeterministicScope(bool on) { set_deterministic_algorithms(on); }
  ~DeterministicScope() { set_deterministic_algorithms(prev); }
};

Tensor indices_with_repeats(int64_t n, int64_t rows, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int64_t>(g.next_below(static_cast<uint64_t>(rows)));
  v[0] = v[n - 1] = 3;  // a row picked many times at least
  for (int64_t i = 1; i < n; i += 7) v[i] = 3;
  return Tensor::from_vector(v, {n});
}

// The embedding gradient of dy for the given weight dtype: on the GPU, and on the CPU in f32 then rounded.
struct EmbeddingGrads {
  Tensor cpu, gpu;
};

EmbeddingGrads embedding_grads(DType dt, const Tensor& idx, const Tensor& w32, const Tensor& dy32) {
  Tensor wc = w32.clone().requires_grad_();
  backward(embedding(wc, idx), {}, dy32.to(dt).to(DType::f32));  // the GPU's gradient, rounded to dt
  Tensor wg = w32.to(dt).to(gpu()).requires_grad_();
  backward(embedding(wg, idx.to(gpu())), {}, dy32.to(dt).to(gpu()));
  return {wc.grad().to(dt), wg.grad()};
}

TEST(CudaRnn, EmbeddingMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 50, dim = 24, n = 300;
  Tensor w32 = rand_cpu({rows, dim}, 1), dy32 = rand_cpu({n, dim}, 2);
  for (DType it : {DType::i32, DType::i64}) {
    Tensor idx = indices_with_repeats(n, rows, 3).to(it);
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const std::string what = std::string("embedding ") + dtype_name(dt) + " indices " + dtype_name(it);
      // The lookup copies rows: the same bits as the CPU's.
      Tensor y = embedding(w32.to(dt).to(gpu()), idx.to(gpu()));
      expect_same_bytes(embedding(w32.to(dt), idx), y, what + " forward");
      // f32 atomics: the CPU's sums up to the order of the additions (and one 16-bit rounding).
      DeterministicScope atomics(false);
      EmbeddingGrads g = embedding_grads(dt, idx, w32, dy32);
      const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 2e-3 : 1.6e-2;
      expect_close(g.cpu.to(DType::f32), g.gpu.to(DType::f32), tol, tol, what + " backward (atomics)");
    }
  }
}

TEST(CudaRnn, DeterministicEmbeddingGradientIsTheCpusBitForBit) {
  SKIP_WITHOUT_GPU();
  DeterministicScope on(true);
  const int64_t rows = 37, dim = 19, n = 513;  // odd sizes: no vector path, partial blocks
  Tensor w32 = rand_cpu({rows, dim}, 4), dy32 = rand_cpu({n, dim}, 5);
  Tensor idx = indices_with_repeats(n, rows, 6);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    EmbeddingGrads a = embedding_grads(dt, idx, w32, dy32), b = embedding_grads(dt, idx, w32, dy32);
    const std::string what = std::string("deterministic embedding ") + dtype_name(dt);
    expect_same_bytes(a.gpu, b.gpu, what + ": two runs");
    expect_same_bytes(a.cpu, a.gpu, what + ": against the CPU");
  }
}

TEST(CudaRnn, EmbeddingIndexOutOfRangeIsThrownAtTheNextSync) {
  SKIP_WITHOUT_GPU();
  Tensor w = rand_cpu({4, 8}, 7).to(gpu());
  Tensor idx = Tensor::from_vector<int64_t>({1, 9, 2}, {3}).to(gpu());
  Tensor y = embedding(w, idx);  // queued: no wait for the device
  try {
    (void)y.to_vector<float>();
    ADD_FAILURE() << "the bad index was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("embedding: index 9 at position 1"), std::string::npos) << e.what();
  }
  // The record is cleared: later work is unaffected.
  EXPECT_EQ(embedding(w, Tensor::from_vector<int64_t>({0}, {1}).to(gpu())).to_vector<float>().size(), 8u);
}

struct Net {
  RnnMode mode;
  int64_t T, N, I, H, layers;
  bool bidirectional, batch_first, bias;
};

std::string describe(const Net& c) {
  static const char* names[] = {"tanh", "relu", "lstm", "gru"};
  return std::string(names[static_cast<int>(c.mode)]) + " L" + std::to_string(c.layers) +
         (c.bidirectional ? " bidirectional" : "") + (c.batch_first ? " batch_first" : "") + (c.bias ? "" : " no bias");
}

const Net kNets[] = {
    {RnnMode::RnnTanh, 5, 3, 4, 6, 2, true, false, true},  {RnnMode::RnnRelu, 4, 2, 3, 5, 1, false, true, true},
    {RnnMode::Lstm, 6, 4, 5, 8, 2, true, true, true},      {RnnMode::Lstm, 3, 2, 3, 4, 1, false, false, false},
    {RnnMode::Gru, 5, 3, 4, 6, 2, false, false, true},     {RnnMode::Gru, 4, 2, 3, 5, 1, true, true, true},
};

struct Outcome {
  std::vector<Tensor> values;  // y, hy, cy?, then the gradients of x, w, hx, cx?
};

// Runs the network on device d in dtype dt from the same CPU inputs; the loss weights every output.
Outcome run_net(const Net& c, Device d, DType dt, bool fused, double dropout = 0.0) {
  RnnOptions o;
  o.mode = c.mode;
  o.hidden_size = c.H;
  o.num_layers = c.layers;
  o.bidirectional = c.bidirectional;
  o.batch_first = c.batch_first;
  o.bias = c.bias;
  o.dropout = dropout;
  o.allow_fused = fused;
  const int64_t D = c.bidirectional ? 2 : 1;
  const bool lstm = c.mode == RnnMode::Lstm;
  auto make = [&](const Shape& s, uint64_t seed, double scale) {
    return rand_cpu(s, seed, -scale, scale).to(dt).to(d).requires_grad_();
  };
  Tensor x = make(c.batch_first ? Shape{c.N, c.T, c.I} : Shape{c.T, c.N, c.I}, 10, 1.0);
  Tensor w = make({rnn_weight_size(c.mode, c.I, c.H, c.layers, c.bidirectional, c.bias)}, 11, 0.4);
  Tensor hx = make({c.layers * D, c.N, c.H}, 12, 1.0);
  Tensor cx = lstm ? make({c.layers * D, c.N, c.H}, 13, 1.0) : Tensor();
  Generator masks(21);
  RnnResult r = rnn(x, w, hx, cx, o, &masks);
  // The weighted sums in f32 (a 16-bit tensor does not sum into its own type).
  auto weighted = [&](const Tensor& t, uint64_t seed) {
    return sum(mul(cast(t, DType::f32), rand_cpu(t.shape(), seed).to(dt).to(DType::f32).to(d)));
  };
  Tensor loss = add(weighted(r.y, 14), weighted(r.hy, 15));
  if (lstm) loss = add(loss, weighted(r.cy, 16));
  backward(loss);
  Outcome out;
  out.values = {r.y, r.hy};
  if (lstm) out.values.push_back(r.cy);
  out.values.insert(out.values.end(), {x.grad(), w.grad(), hx.grad()});
  if (lstm) out.values.push_back(cx.grad());
  return out;
}

void expect_outcomes_close(const Outcome& cpu, const Outcome& gpu, double rel, const std::string& what) {
  ASSERT_EQ(cpu.values.size(), gpu.values.size()) << what;
  for (size_t i = 0; i < cpu.values.size(); ++i)
    expect_norm_close(cpu.values[i].to(DType::f32), gpu.values[i].to(DType::f32), rel,
                      what + " value " + std::to_string(i));
}

TEST(CudaRnn, CudnnMatchesTheCpuInF32) {
  SKIP_WITHOUT_GPU();
  PrecisionScope exact(Precision::f32);
  for (const Net& c : kNets)
    expect_outcomes_close(run_net(c, Device::cpu(), DType::f32, true), run_net(c, gpu(), DType::f32, true), 2e-5,
                          "cudnn f32 " + describe(c));
}

TEST(CudaRnn, PerStepOpsOnTheGpuMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  PrecisionScope exact(Precision::f32);
  for (const Net& c : kNets)
    expect_outcomes_close(run_net(c, Device::cpu(), DType::f32, true), run_net(c, gpu(), DType::f32, false), 2e-5,
                          "per-step ops f32 " + describe(c));
}

TEST(CudaRnn, SixteenBitMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  // f16 through cuDNN, bf16 as per-step ops; both against the CPU's f32.
  for (DType dt : {DType::f16, DType::bf16})
    for (const Net& c : kNets)
      expect_outcomes_close(run_net(c, Device::cpu(), DType::f32, true), run_net(c, gpu(), dt, true),
                            dt == DType::f16 ? 1e-2 : 4e-2, std::string(dtype_name(dt)) + " " + describe(c));
}

TEST(CudaRnn, DropoutBetweenLayersMatchesThePerStepOps) {
  SKIP_WITHOUT_GPU();
  // Both draw tandem's dropout masks on the same device (a GPU's masks also depend on its count of
  // replayed recordings), layer by layer in the input's layout.
  PrecisionScope exact(Precision::f32);
  for (const Net& c : kNets) {
    if (c.layers < 2) continue;
    expect_outcomes_close(run_net(c, gpu(), DType::f32, false, 0.3), run_net(c, gpu(), DType::f32, true, 0.3), 2e-5,
                          "dropout 0.3 " + describe(c));
  }
}

TEST(CudaRnn, ModelMovesBetweenDevices) {
  SKIP_WITHOUT_GPU();
  PrecisionScope exact(Precision::f32);
  Generator gen(30);
  nn::LSTM cpu_net(3, 4, gen, 2, true, true, 0.0, true);
  Tensor x = rand_cpu({2, 5, 3}, 31);
  Tensor y_cpu = cpu_net.forward(x);
  cpu_net.to(gpu());
  expect_norm_close(y_cpu, cpu_net.forward(x.to(gpu())), 2e-5, "an LSTM moved to the GPU");
}

// ---- fused optimizer kernels

std::vector<Tensor> rand_set(const std::vector<int64_t>& sizes, uint64_t seed, Device d, double lo = -1.0) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < sizes.size(); ++i) out.push_back(rand_cpu({sizes[i]}, seed + i, lo, 1.0).to(d).clone());
  return out;
}

std::vector<int64_t> optimizer_sizes() {
  std::vector<int64_t> s = {1, 1000, 70000, 5, 8193};
  for (int i = 0; i < 50; ++i) s.push_back(1 + (i * 37) % 300);  // more tensors than one launch takes
  return s;
}

template <typename Args, typename Step>
void compare_square_kernel(const Args& a, double init, Step step, const std::string& what) {
  const auto sizes = optimizer_sizes();
  std::vector<Tensor> pc = rand_set(sizes, 100, Device::cpu()), pg = rand_set(sizes, 100, gpu());
  std::vector<Tensor> vc, vg;
  for (int64_t n : sizes) {
    vc.push_back(Tensor::full({n}, init));
    vg.push_back(Tensor::full({n}, init, DType::f32, gpu()));
  }
  for (int s = 1; s <= 3; ++s) {
    std::vector<Tensor> gc = rand_set(sizes, 1000 * s, Device::cpu()), gg = rand_set(sizes, 1000 * s, gpu());
    std::vector<backend::ParamSlot> sc, sg;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sc.push_back({pc[i], gc[i], vc[i], Tensor(), Tensor()});
      sg.push_back({pg[i], gg[i], vg[i], Tensor(), Tensor()});
    }
    step(cpu_be(), sc, a);
    step(gpu_be(), sg, a);
    for (size_t i = 0; i < sizes.size(); ++i) {
      expect_close(pc[i], pg[i], 1e-5, 1e-6, what + " param " + std::to_string(i) + " step " + std::to_string(s));
      expect_close(vc[i], vg[i], 1e-5, 1e-6, what + " state " + std::to_string(i) + " step " + std::to_string(s));
    }
  }
}

TEST(CudaRnn, FusedRmsPropAndAdaGradMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool inside : {false, true}) {
    const std::string form = inside ? " (eps inside sqrt)" : "";
    compare_square_kernel(backend::RmsPropArgs{0.01, 0.9, 1e-6, 0.05, inside}, 0.0,
                          [](backend::Backend& b, std::vector<backend::ParamSlot>& s, const backend::RmsPropArgs& a) {
                            b.rmsprop_step(s.data(), static_cast<int64_t>(s.size()), a);
                          },
                          "rmsprop" + form);
    compare_square_kernel(backend::AdagradArgs{0.05, 1e-8, 0.01, inside}, 0.1,
                          [](backend::Backend& b, std::vector<backend::ParamSlot>& s, const backend::AdagradArgs& a) {
                            b.adagrad_step(s.data(), static_cast<int64_t>(s.size()), a);
                          },
                          "adagrad" + form);
  }
}

TEST(CudaRnn, FusedKernelsHonourTheGuard) {
  SKIP_WITHOUT_GPU();
  Tensor p = rand_cpu({100}, 1).to(gpu()).clone(), g = rand_cpu({100}, 2).to(gpu()), v = Tensor::zeros({100}, DType::f32, gpu());
  Tensor before = p.cpu();
  Tensor inf = Tensor::full({1}, std::numeric_limits<double>::infinity(), DType::f32, gpu());
  backend::ParamSlot slot{p, g, v, Tensor(), Tensor()};
  backend::RmsPropArgs r{0.1, 0.9, 1e-8, 0.0, false, inf.data<float>()};
  gpu_be().rmsprop_step(&slot, 1, r);
  backend::AdagradArgs a{0.1, 1e-8, 0.0, false, inf.data<float>()};
  gpu_be().adagrad_step(&slot, 1, a);
  expect_same_bytes(before, p, "guarded steps");
}

TEST(CudaRnn, GroupedOptimizersOnTheGpuMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  auto run = [](Device d) {
    std::vector<Tensor> ps = rand_set({300, 7, 1000}, 50, d);
    for (Tensor& p : ps) p.requires_grad_();
    optim::AdaGrad opt(std::vector<optim::ParamGroup>{{{ps[0], ps[2]}, 1.0, 0.1}, {{ps[1]}, 0.5, 0.0}},
                       optim::AdagradOptions{.lr = 0.05, .initial_accumulator_value = 0.1});
    opt.set_schedule(std::make_shared<optim::WarmupCosine>(0.05, 2, 5));
    for (int s = 0; s < 4; ++s) {
      std::vector<Tensor> gs = rand_set({300, 7, 1000}, 60 + 10 * s, d);
      for (size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(gs[i]);
      opt.step();
    }
    return ps;
  };
  std::vector<Tensor> c = run(Device::cpu()), g = run(gpu());
  for (size_t i = 0; i < c.size(); ++i) expect_close(c[i], g[i], 1e-5, 1e-6, "grouped adagrad param " + std::to_string(i));
}

}  // namespace
}  // namespace tandem
