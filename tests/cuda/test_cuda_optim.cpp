// Multi-tensor SGD and Adam on the GPU against the CPU backend, over several steps.
#include "cuda/cuda_test_util.h"

namespace tandem {
namespace {

using namespace cudatest;

struct ParamSet {
  std::vector<Tensor> params, bufs0, bufs1;
};

ParamSet make_set(const std::vector<int64_t>& sizes, Device d, bool with_buf0, bool with_buf1) {
  ParamSet s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    s.params.push_back(rand_cpu({sizes[i]}, 100 + i).to(d).clone());
    s.bufs0.push_back(with_buf0 ? Tensor::zeros({sizes[i]}, DType::f32, d) : Tensor());
    s.bufs1.push_back(with_buf1 ? Tensor::zeros({sizes[i]}, DType::f32, d) : Tensor());
  }
  return s;
}

std::vector<backend::ParamSlot> slots_for(ParamSet& s, const std::vector<Tensor>& grads) {
  std::vector<backend::ParamSlot> out;
  for (size_t i = 0; i < s.params.size(); ++i) out.push_back({s.params[i], grads[i], s.bufs0[i], s.bufs1[i], Tensor()});
  return out;
}

std::vector<Tensor> grads_for(const std::vector<int64_t>& sizes, int step, Device d) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < sizes.size(); ++i) g.push_back(rand_cpu({sizes[i]}, 1000 * step + i).to(d));
  return g;
}

void expect_sets_close(const ParamSet& c, const ParamSet& g, double rtol, double atol, const std::string& what) {
  for (size_t i = 0; i < c.params.size(); ++i) {
    expect_close(c.params[i], g.params[i], rtol, atol, what + " param " + std::to_string(i));
    if (c.bufs0[i].defined()) expect_close(c.bufs0[i], g.bufs0[i], rtol, atol, what + " buf0 " + std::to_string(i));
    if (c.bufs1[i].defined()) expect_close(c.bufs1[i], g.bufs1[i], rtol, atol, what + " buf1 " + std::to_string(i));
  }
}

const std::vector<int64_t> kSizes = {1, 1000, 70000, 5, 8193, 8192};

// Momentum with weight decay; Nesterov with dampening; plain SGD with weight decay.
const backend::SgdArgs kSgdConfigs[] = {
    {0.1, 0.9, 0.0, 1e-4, false, false},
    {0.05, 0.9, 0.1, 0.0, true, false},
    {0.01, 0.0, 0.0, 1e-3, false, false},
};

std::vector<int64_t> many_sizes() {  // more tensors than one launch takes
  std::vector<int64_t> s;
  for (int i = 0; i < 93; ++i) s.push_back(1 + (i * 37) % 300);
  return s;
}

TEST(CudaOptim, SgdMatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& sizes : {kSizes, many_sizes()}) {
    for (const backend::SgdArgs& cfg : kSgdConfigs) {
      const bool momentum = cfg.momentum != 0.0;
      ParamSet c = make_set(sizes, Device::cpu(), momentum, false), g = make_set(sizes, gpu(), momentum, false);
      for (int step = 1; step <= 3; ++step) {
        backend::SgdArgs a = cfg;
        a.first_step = step == 1;
        auto sc = slots_for(c, grads_for(sizes, step, Device::cpu()));
        auto sg = slots_for(g, grads_for(sizes, step, gpu()));
        cpu_be().sgd_step(sc.data(), static_cast<int64_t>(sc.size()), a);
        gpu_be().sgd_step(sg.data(), static_cast<int64_t>(sg.size()), a);
        expect_sets_close(c, g, 1e-5, 1e-6,
                          "sgd lr=" + std::to_string(cfg.lr) + " momentum=" + std::to_string(cfg.momentum) +
                              " nesterov=" + std::to_string(cfg.nesterov) + " step " + std::to_string(step) +
                              " tensors " + std::to_string(sizes.size()));
      }
    }
  }
}

// SGD's 16-bit copies are the updated parameters' rounding (Tensor::to), in bf16 and f16, and writing them leaves
// the update's bits as they are; parameters that start at any element (slices of one buffer, as a sharded step's
// are: the kernel's four-element path and its one-element path) step as whole tensors do; the first step does not
// read the momentum buffer (NaN there, not carried into the update).
TEST(CudaOptim, SgdCopiesAndUnalignedSlicesGiveTheBitsOfThePlainStep) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& sizes : {kSizes, many_sizes()}) {
    for (DType copy_type : {DType::bf16, DType::f16}) {
      for (int64_t shift : {0, 1, 3}) {
        for (const backend::SgdArgs& cfg : kSgdConfigs) {
          const bool momentum = cfg.momentum != 0.0;
          ParamSet plain = make_set(sizes, gpu(), momentum, false);
          // The same parameters as slices of one buffer, each starting `shift` elements past a 16-byte boundary
          // (shift 0: every slice aligned), their momentum and copies likewise.
          int64_t total = 0;
          for (int64_t n : sizes) total += (n + shift + 3) / 4 * 4;
          Tensor arena = Tensor::zeros({total}, DType::f32, gpu());
          Tensor moms = Tensor::full({total}, std::nan(""), DType::f32, gpu());
          Tensor copy_arena = Tensor::zeros({total}, copy_type, gpu());
          ParamSet sliced;
          std::vector<Tensor> copies;
          int64_t at = 0;
          for (size_t i = 0; i < sizes.size(); ++i) {
            Tensor p = arena.narrow(0, at + shift, sizes[i]);
            p.copy_(plain.params[i]);
            sliced.params.push_back(p);
            sliced.bufs0.push_back(momentum ? moms.narrow(0, at + shift, sizes[i]) : Tensor());
            sliced.bufs1.push_back(Tensor());
            copies.push_back(copy_arena.narrow(0, at + shift, sizes[i]));
            at += (sizes[i] + shift + 3) / 4 * 4;
          }
          for (int step = 1; step <= 3; ++step) {
            backend::SgdArgs a = cfg;
            a.first_step = step == 1;
            auto sp = slots_for(plain, grads_for(sizes, step, gpu()));
            auto ss = slots_for(sliced, grads_for(sizes, step, gpu()));
            for (size_t i = 0; i < ss.size(); ++i) ss[i].copy = copies[i];
            gpu_be().sgd_step(sp.data(), static_cast<int64_t>(sp.size()), a);
            gpu_be().sgd_step(ss.data(), static_cast<int64_t>(ss.size()), a);
            const std::string what = std::string(dtype_name(copy_type)) + " shift " + std::to_string(shift) +
                                     " momentum " + std::to_string(cfg.momentum) + " nesterov " +
                                     std::to_string(cfg.nesterov) + " step " + std::to_string(step) + " tensors " +
                                     std::to_string(sizes.size());
            for (size_t i = 0; i < sizes.size(); ++i) {
              EXPECT_EQ(sliced.params[i].to_vector<float>(), plain.params[i].to_vector<float>()) << what << " param " << i;
              if (momentum) {
                EXPECT_EQ(sliced.bufs0[i].to_vector<float>(), plain.bufs0[i].to_vector<float>()) << what << " buf " << i;
              }
              EXPECT_EQ(copies[i].to(DType::f32).to_vector<float>(),
                        plain.params[i].to(copy_type).to(DType::f32).to_vector<float>())
                  << what << " copy " << i;
            }
          }
        }
      }
    }
  }
}

TEST(CudaOptim, AdamMatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& sizes : {kSizes, many_sizes()}) {
    for (bool decoupled : {false, true}) {
      ParamSet c = make_set(sizes, Device::cpu(), true, true), g = make_set(sizes, gpu(), true, true);
      for (int step = 1; step <= 3; ++step) {
        backend::AdamArgs a{1e-2, 0.9, 0.999, 1e-8, 0.05, step, decoupled};
        auto sc = slots_for(c, grads_for(sizes, step, Device::cpu()));
        auto sg = slots_for(g, grads_for(sizes, step, gpu()));
        cpu_be().adam_step(sc.data(), static_cast<int64_t>(sc.size()), a);
        gpu_be().adam_step(sg.data(), static_cast<int64_t>(sg.size()), a);
        expect_sets_close(c, g, 1e-5, 1e-6,
                          std::string("adam ") + (decoupled ? "decoupled" : "l2") + " step " + std::to_string(step) +
                              " tensors " + std::to_string(sizes.size()));
      }
    }
  }
}

// The clipping factor read as the step reads each gradient gives the bits scaling the gradients first gives;
// the 16-bit copies are the updated parameters' rounding (Tensor::to), in bf16 and f16.
TEST(CudaOptim, AdamsGradientFactorAndCopiesGiveTheBitsOfScalingFirstAndConverting) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& sizes : {kSizes, many_sizes()}) {
    for (DType copy_type : {DType::bf16, DType::f16}) {
      for (bool decoupled : {false, true}) {
        ParamSet folded = make_set(sizes, gpu(), true, true), first = make_set(sizes, gpu(), true, true);
        std::vector<Tensor> copies;
        for (const Tensor& p : folded.params) copies.push_back(Tensor::zeros(p.shape(), copy_type, gpu()));
        for (int step = 1; step <= 3; ++step) {
          backend::AdamArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, step, decoupled};
          const Tensor factor = Tensor::full({1}, 0.37 + 0.1 * step, DType::f32, gpu());
          std::vector<Tensor> g1 = grads_for(sizes, step, gpu()), g2 = grads_for(sizes, step, gpu());
          for (Tensor& g : g2) gpu_be().scale_by(g, factor, g);
          auto sf = slots_for(folded, g1);
          for (size_t i = 0; i < sf.size(); ++i) sf[i].copy = copies[i];
          backend::AdamArgs af = a;
          af.grad_factor = factor.data<float>();
          gpu_be().adam_step(sf.data(), static_cast<int64_t>(sf.size()), af);
          auto ss = slots_for(first, g2);
          gpu_be().adam_step(ss.data(), static_cast<int64_t>(ss.size()), a);
          const std::string what = std::string(dtype_name(copy_type)) + (decoupled ? " decoupled" : " l2") + " step " +
                                   std::to_string(step) + " tensors " + std::to_string(sizes.size());
          for (size_t i = 0; i < sizes.size(); ++i) {
            EXPECT_EQ(folded.params[i].to_vector<float>(), first.params[i].to_vector<float>()) << what << " param " << i;
            EXPECT_EQ(folded.bufs0[i].to_vector<float>(), first.bufs0[i].to_vector<float>()) << what << " m " << i;
            EXPECT_EQ(folded.bufs1[i].to_vector<float>(), first.bufs1[i].to_vector<float>()) << what << " v " << i;
            EXPECT_EQ(copies[i].to(DType::f32).to_vector<float>(),
                      first.params[i].to(copy_type).to(DType::f32).to_vector<float>())
                << what << " copy " << i;
            // The gradients are read, not rescaled.
            EXPECT_EQ(g1[i].to_vector<float>(), grads_for(sizes, step, gpu())[i].to_vector<float>()) << what;
          }
        }
      }
    }
  }
}

TEST(CudaOptim, RejectsMismatchedSlots) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Tensor p = Tensor::zeros({10}, DType::f32, gpu()), g = Tensor::zeros({9}, DType::f32, gpu());
  backend::ParamSlot slot{p, g, Tensor(), Tensor(), Tensor()};
  backend::SgdArgs a{0.1, 0.0, 0.0, 0.0, false, true};
  EXPECT_THROW(gpu_be().sgd_step(&slot, 1, a), Error);
  Tensor p64 = Tensor::zeros({10}, DType::f64, gpu()), g64 = Tensor::zeros({10}, DType::f64, gpu());
  backend::ParamSlot slot64{p64, g64, Tensor(), Tensor(), Tensor()};
  try {
    gpu_be().sgd_step(&slot64, 1, a);
    ADD_FAILURE() << "an f64 parameter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
