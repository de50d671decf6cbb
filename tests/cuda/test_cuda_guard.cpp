// The kernels that keep a step's verdict on the device (scaling by a factor held there, restoring
// carried state after a non-finite step, counting skips, loss scaling, partialUpdate's chunk index,
// SGD's guard) against the CPU backend, for finite and non-finite verdicts.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

Tensor verdict(float v, Device d) { return Tensor::from_vector(std::vector<float>{v}, {1}).to(d); }

TEST(CudaGuard, ScaleByAFactorOnTheDeviceMatchesTheCpu) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(70001), int64_t(1) << 20}) {  // 4-wide and scalar
    Tensor x = rand_cpu({n}, 7 + n);
    Tensor f = verdict(0.125f, Device::cpu());
    Tensor c = Tensor::empty({n}), g = Tensor::empty({n}, DType::f32, gpu());
    cpu_be().scale_by(x, f, c);
    Tensor xg = x.to(gpu());
    gpu_be().scale_by(xg, f.to(gpu()), g);
    expect_same_bytes(c, g, "scale_by n=" + std::to_string(n));
    gpu_be().scale_by(xg, f.to(gpu()), xg);  // in place
    expect_same_bytes(c, xg, "scale_by in place n=" + std::to_string(n));
  }
}

TEST(CudaGuard, RestoreIfNonFiniteMatchesTheCpu) {
  REQUIRE_GPU();
  // 16-byte words and odd byte counts, finite and non-finite verdicts.
  for (int64_t n : {4, 1001, 65536}) {
    for (float v : {1.0f, kInf, kNan, -kInf}) {
      Tensor saved = rand_cpu({n}, 1), now = rand_cpu({n}, 2);
      Tensor c = now.clone();
      cpu_be().restore_if_nonfinite(verdict(v, Device::cpu()), saved, c);
      Tensor g = now.to(gpu());
      gpu_be().restore_if_nonfinite(verdict(v, gpu()), saved.to(gpu()), g);
      expect_same_bytes(c, g, "restore n=" + std::to_string(n) + " verdict " + std::to_string(v));
      expect_same_bytes(std::isfinite(v) ? now : saved, g, "restore chose the right side");
    }
  }
  // A byte-sized tensor (not a multiple of 16 bytes, unaligned view).
  Tensor saved = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5}, {5}).narrow(0, 1, 3).contiguous();
  Tensor g = Tensor::zeros({3}, DType::f32, gpu());
  gpu_be().restore_if_nonfinite(verdict(kNan, gpu()), saved.to(gpu()), g);
  expect_same_bytes(saved, g, "restore of 12 bytes");
}

TEST(CudaGuard, SkipCountsAndLossScaleUpdatesMatchTheCpu) {
  REQUIRE_GPU();
  Tensor cc = Tensor::zeros({1}, DType::i64), gc = Tensor::zeros({1}, DType::i64, gpu());
  Tensor cs = Tensor::from_vector(std::vector<float>{1024.0f, 1.0f / 1024}, {2}), gs = cs.to(gpu());
  Tensor ck = Tensor::zeros({2}, DType::i64), gk = ck.to(gpu());
  // A pattern of verdicts: growth after 3 clean steps, backoff on every non-finite one.
  const float pattern[] = {1, 1, 1, kInf, 1, kNan, 1, 1, 1, 1, 1, 1, 1, -kInf};
  for (float v : pattern) {
    cpu_be().count_nonfinite(verdict(v, Device::cpu()), cc);
    gpu_be().count_nonfinite(verdict(v, gpu()), gc);
    cpu_be().loss_scale_update(verdict(v, Device::cpu()), cs, ck, 2.0, 0.5, 3);
    gpu_be().loss_scale_update(verdict(v, gpu()), gs, gk, 2.0, 0.5, 3);
    expect_same_bytes(cs, gs, "loss scale");
    expect_same_bytes(ck, gk, "loss scale counters");
  }
  expect_same_bytes(cc, gc, "skip count");
  EXPECT_EQ(gc.cpu().to_vector<int64_t>()[0], 3);
  // 1024 -> 2048 (3 clean) -> 1024 (inf) -> 512 (nan) -> 1024, 2048 (6 clean) -> 1024 (-inf)
  EXPECT_EQ(gs.cpu().to_vector<float>()[0], 1024.0f);
  EXPECT_EQ(gs.cpu().to_vector<float>()[1], 1.0f / 1024);
  EXPECT_EQ(gk.cpu().to_vector<int64_t>()[1], 3);
}

TEST(CudaGuard, ChunkCopiesAndTheRoundRobinMatchTheCpu) {
  REQUIRE_GPU();
  const int64_t chunk = 1000, chunks = 5;
  Tensor arena = rand_cpu({chunk * chunks}, 3), part = rand_cpu({chunk}, 4);
  Tensor ca = arena.clone(), ga = arena.to(gpu());
  Tensor ci = Tensor::zeros({1}, DType::i64), gi = Tensor::zeros({1}, DType::i64, gpu());
  for (int step = 0; step < 7; ++step) {
    const float v = step == 3 ? kInf : 1.0f;
    Tensor cs = Tensor::empty({chunk}), gs = Tensor::empty({chunk}, DType::f32, gpu());
    cpu_be().copy_chunk(ca, cs, ci, false, Tensor());
    gpu_be().copy_chunk(ga, gs, gi, false, Tensor());
    expect_same_bytes(cs, gs, "chunk out, step " + std::to_string(step));
    cpu_be().copy_chunk(part, ca, ci, true, verdict(v, Device::cpu()));
    gpu_be().copy_chunk(part.to(gpu()), ga, gi, true, verdict(v, gpu()));
    expect_same_bytes(ca, ga, "chunk in, step " + std::to_string(step));
    cpu_be().advance_counter(ci, chunks, verdict(v, Device::cpu()));
    gpu_be().advance_counter(gi, chunks, verdict(v, gpu()));
    expect_same_bytes(ci, gi, "chunk index, step " + std::to_string(step));
  }
  // Six finite steps of seven: index 6 % 5.
  EXPECT_EQ(gi.cpu().to_vector<int64_t>()[0], 1);
  gpu_be().advance_counter(gi, chunks, Tensor());
  EXPECT_EQ(gi.cpu().to_vector<int64_t>()[0], 2);
}

TEST(CudaGuard, SgdStepsUnderAGuardMatchTheCpu) {
  REQUIRE_GPU();
  for (float v : {1.0f, kInf, kNan}) {
    Tensor p = rand_cpu({5000}, 5), g = rand_cpu({5000}, 6), m = rand_cpu({5000}, 8);
    Tensor cp = p.clone(), cm = m.clone(), gp = p.to(gpu()), gm = m.to(gpu()), gg = g.to(gpu());
    Tensor cv = verdict(v, Device::cpu()), gv = verdict(v, gpu());
    backend::SgdArgs a{0.1, 0.9, 0.0, 1e-4, false, false};
    backend::ParamSlot cs{cp, g, cm, Tensor(), Tensor()}, gs{gp, gg, gm, Tensor(), Tensor()};
    a.guard = static_cast<const float*>(cv.data_ptr());
    cpu_be().sgd_step(&cs, 1, a);
    a.guard = static_cast<const float*>(gv.data_ptr());
    gpu_be().sgd_step(&gs, 1, a);
    expect_close(cp, gp, 1e-6, 1e-7, "sgd param under verdict " + std::to_string(v));
    expect_close(cm, gm, 1e-6, 1e-7, "sgd momentum under verdict " + std::to_string(v));
    if (!std::isfinite(v)) {
      expect_same_bytes(p, gp, "a guarded step left the parameters");
      expect_same_bytes(m, gm, "a guarded step left the momentum");
    }
  }
}

}  // namespace
}  // namespace tandem
