// Token windows drawn on the GPU (Backend::token_windows) are the CPU's, bit for bit: random and
// sequential windows, contexts spread over several blocks, tokens above 255, the window count kept
// on the device, a recorded draw that takes new windows at every replay, and windows drawn at frames
// with a loss mask (targets -100 where it holds 0).
#include <algorithm>
#include <filesystem>

#include "cuda/cuda_test_util.h"
#include "data/data_test_util.h"
#include "tandem/data/tokens.h"
#include "tandem/graph.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

// n tokens of the whole uint16 (width 2) or uint32 (width 4) range, as u8 [n, width].
Tensor token_bytes(int64_t n, uint32_t seed, int64_t width = 2) {
  std::vector<uint8_t> b = data::testutil::noise(static_cast<size_t>(width * n), seed);
  return Tensor::from_vector(b, {n, width});
}

TEST(CudaTokens, WindowsMatchTheCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t n, B, T;
  };
  // One window exactly; a context of one token; several blocks per window; a batch of many windows.
  for (const Case c : {Case{9, 3, 8}, Case{50, 7, 1}, Case{5000, 4, 1000}, Case{100000, 64, 256}})
  for (int64_t width : {2, 4}) {
    const Tensor tokens = token_bytes(c.n, static_cast<uint32_t>(c.n), width);
    const Tensor tokens_gpu = tokens.to(gpu());
    for (bool random : {true, false}) {
      const std::string what = "n " + std::to_string(c.n) + " B " + std::to_string(c.B) + " T " +
                               std::to_string(c.T) + (random ? " random" : " sequential") + ", " +
                               std::to_string(8 * width) + "-bit tokens";
      Tensor cur_cpu = Tensor::from_vector(std::vector<int64_t>{13, 0}, {2}), cur_gpu = cur_cpu.to(gpu());
      for (int step = 0; step < 3; ++step) {
        Tensor x = Tensor::empty({c.B, c.T}, DType::i32), y = Tensor::empty({c.B, c.T}, DType::i32);
        Tensor xg = Tensor::empty({c.B, c.T}, DType::i32, gpu()), yg = Tensor::empty({c.B, c.T}, DType::i32, gpu());
        cpu_be().token_windows(tokens, Tensor(), cur_cpu, 4242, random, 0, x, y);
        gpu_be().token_windows(tokens_gpu, Tensor(), cur_gpu, 4242, random, 0, xg, yg);
        expect_same_bytes(x, xg, what + " x, step " + std::to_string(step));
        expect_same_bytes(y, yg, what + " y, step " + std::to_string(step));
      }
      EXPECT_EQ(cur_gpu.to_vector<int64_t>(), (std::vector<int64_t>{13 + 3 * c.B, 0})) << what;
      EXPECT_EQ(cur_cpu.to_vector<int64_t>(), cur_gpu.to_vector<int64_t>()) << what;
    }
  }
}

// TokenBatches on the GPU and on the CPU draw the same batches from the same shards, for every rank.
TEST(CudaTokens, TokenBatchesOnTheGpuDrawTheCpusBatches) {
  REQUIRE_GPU();
  data::testutil::TempDir dir;
  data::testutil::write_file(dir.file("a.bin"), data::testutil::noise(2 * 30001, 7));
  data::testutil::write_file(dir.file("b.bin"), data::testutil::noise(2 * 20000, 8));
  const data::TokenStream stream(dir.path());
  for (int rank = 0; rank < 2; ++rank) {
    data::TokenBatchOptions o;
    o.batch = 12;
    o.context = 300;
    o.seed = 99;
    o.rank = rank;
    o.world_size = 2;
    data::TokenBatches on_cpu(stream, o);
    o.device = gpu();
    data::TokenBatches on_gpu(stream, o);
    expect_same_bytes(on_cpu.tokens(), on_gpu.tokens(), "the rank's tokens");
    Tensor x, y, xg, yg;
    for (int step = 0; step < 4; ++step) {
      on_cpu.next(x, y);
      on_gpu.next(xg, yg);
      expect_same_bytes(x, xg, "rank " + std::to_string(rank) + " x, step " + std::to_string(step));
      expect_same_bytes(y, yg, "rank " + std::to_string(rank) + " y, step " + std::to_string(step));
    }
  }
}

// A draw recorded once takes the next batch at every replay: replay k gives the CPU's batch k.
TEST(CudaTokens, RecordedDrawTakesNewWindowsEachReplay) {
  REQUIRE_GPU();
  const Tensor tokens = token_bytes(20000, 3);
  const Tensor tokens_gpu = tokens.to(gpu());
  Tensor cur_gpu = Tensor::zeros({2}, DType::i64, gpu()), cur_cpu = Tensor::zeros({2}, DType::i64);
  Tensor xg = Tensor::empty({8, 128}, DType::i32, gpu()), yg = Tensor::empty({8, 128}, DType::i32, gpu());
  DeviceGraph graph(gpu(), [&] { gpu_be().token_windows(tokens_gpu, Tensor(), cur_gpu, 11, true, 0, xg, yg); });
  for (int k = 0; k < 4; ++k) {
    graph.replay();
    Tensor x = Tensor::empty({8, 128}, DType::i32), y = Tensor::empty({8, 128}, DType::i32);
    cpu_be().token_windows(tokens, Tensor(), cur_cpu, 11, true, 0, x, y);
    expect_same_bytes(x, xg, "replay " + std::to_string(k) + " x");
    expect_same_bytes(y, yg, "replay " + std::to_string(k) + " y");
  }
  EXPECT_EQ(cur_gpu.to_vector<int64_t>(), (std::vector<int64_t>{32, 0}));
}

// Framed windows with a loss mask: the GPU's x and y are the CPU's (-100 targets included), eagerly and
// replayed from a recording.
TEST(CudaTokens, MaskedFramedWindowsMatchTheCpu) {
  REQUIRE_GPU();
  for (int64_t width : {2, 4}) {
    const int64_t F = 300, n = F * 40;
    const Tensor tokens = token_bytes(n, 21, width), tokens_gpu = tokens.to(gpu());
    std::vector<uint8_t> m = data::testutil::noise(static_cast<size_t>(n), 5);
    for (auto& b : m) b = static_cast<uint8_t>(b > 160);
    const Tensor mask = Tensor::from_vector(m, {n}), mask_gpu = mask.to(gpu());
    for (const int64_t T : {F - 1, int64_t{200}})
    for (bool random : {true, false}) {
      const std::string what = std::to_string(8 * width) + "-bit tokens, T " + std::to_string(T) +
                               (random ? " random" : " sequential");
      Tensor cur_cpu = Tensor::zeros({2}, DType::i64), cur_gpu = cur_cpu.to(gpu());
      for (int step = 0; step < 3; ++step) {
        Tensor x = Tensor::empty({6, T}, DType::i32), y = Tensor::empty({6, T}, DType::i32);
        Tensor xg = Tensor::empty({6, T}, DType::i32, gpu()), yg = Tensor::empty({6, T}, DType::i32, gpu());
        cpu_be().token_windows(tokens, mask, cur_cpu, 77, random, F, x, y);
        gpu_be().token_windows(tokens_gpu, mask_gpu, cur_gpu, 77, random, F, xg, yg);
        expect_same_bytes(x, xg, what + " x, step " + std::to_string(step));
        expect_same_bytes(y, yg, what + " y, step " + std::to_string(step));
        const auto ys = y.to_vector<int32_t>();
        EXPECT_NE(std::count(ys.begin(), ys.end(), -100), 0) << what;
      }
    }
    // Recorded: each replay draws the next batch, masked as the CPU's.
    Tensor cur_gpu = Tensor::zeros({2}, DType::i64, gpu()), cur_cpu = Tensor::zeros({2}, DType::i64);
    Tensor xg = Tensor::empty({4, F - 1}, DType::i32, gpu()), yg = Tensor::empty({4, F - 1}, DType::i32, gpu());
    DeviceGraph graph(gpu(), [&] { gpu_be().token_windows(tokens_gpu, mask_gpu, cur_gpu, 9, true, F, xg, yg); });
    for (int k = 0; k < 3; ++k) {
      graph.replay();
      Tensor x = Tensor::empty({4, F - 1}, DType::i32), y = Tensor::empty({4, F - 1}, DType::i32);
      cpu_be().token_windows(tokens, mask, cur_cpu, 9, true, F, x, y);
      expect_same_bytes(x, xg, "replay " + std::to_string(k) + " x");
      expect_same_bytes(y, yg, "replay " + std::to_string(k) + " y");
    }
  }
}

}  // namespace
}  // namespace tandem
