// Packed documents on the GPU against the CPU: the document positions the windows' kernel draws (the same
// windows, the same positions), rotary rows taken at those positions, and grouped-query packed attention that
// does not cross documents (cuDNN's fused attention with its additive mask in bf16 and f16, and the math path's
// masked scores in f32 and under TANDEM_DOCUMENT_ATTENTION=math: tests/CMakeLists.txt runs these again so),
// values and gradients, against the CPU's f32 kernel on the same 16-bit-rounded inputs.
#include <cmath>
#include <string>

#include "backend/token_window.h"
#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

// i32 [rows, t]: positions in documents of the given lengths (row r's lengths add up to t).
Tensor positions_of(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> v;
  for (const auto& row : rows)
    for (int64_t len : row)
      for (int64_t p = 0; p < len; ++p) v.push_back(static_cast<int32_t>(p));
  return Tensor::from_vector(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(v.size() / rows.size())});
}

TEST(CudaPackedDocuments, WindowsGiveTheCpusPositions) {
  REQUIRE_GPU();
  // 40 frames of 600 tokens (windows of T = 599 + 1): documents of varied lengths, some longer than the
  // kernel's 256-token chunks, some a token long.
  const int64_t frame = 600, frames = 40, n = frame * frames, T = frame - 1;
  std::vector<uint16_t> toks(static_cast<size_t>(n));
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  Generator gen(5);
  for (int64_t f = 0; f < frames; ++f) {
    int64_t at = 0;
    while (at < frame) {
      const int64_t len = 1 + static_cast<int64_t>(gen.next_below(f % 3 == 0 ? 400 : 40));
      for (int64_t p = at; p < std::min(frame, at + len); ++p) {
        mask[static_cast<size_t>(f * frame + p)] = static_cast<uint8_t>(gen.next_below(2));
        if (p == at) mask[static_cast<size_t>(f * frame + p)] |= backend::kDocumentStart;
      }
      at += len;
    }
  }
  for (auto& t : toks) t = static_cast<uint16_t>(gen.next_below(50000));
  const Tensor tokens = Tensor::from_data(toks.data(), {n, 2}, DType::u8), m = Tensor::from_vector(mask, {n});
  const Tensor tokens_gpu = tokens.to(gpu()), mask_gpu = m.to(gpu());
  for (bool random : {true, false}) {
    Tensor cur = Tensor::zeros({2}, DType::i64), cur_gpu = cur.to(gpu());
    for (int batch = 0; batch < 3; ++batch) {
      Tensor x = Tensor::empty({5, T}, DType::i32), y = x.clone(), pos = x.clone();
      Tensor xg = x.to(gpu()), yg = xg.clone(), pg = xg.clone();
      cpu_be().token_windows(tokens, m, cur, 21, random, frame, x, y, pos);
      gpu_be().token_windows(tokens_gpu, mask_gpu, cur_gpu, 21, random, frame, xg, yg, pg);
      const std::string what = std::string(random ? "random" : "sequential") + " batch " + std::to_string(batch);
      expect_close(x, xg, 0, 0, what + ": tokens");
      expect_close(y, yg, 0, 0, what + ": targets");
      expect_close(pos, pg, 0, 0, what + ": positions");
    }
  }
}

TEST(CudaPackedDocuments, RotaryRowsAtTheDocumentsPositions) {
  REQUIRE_GPU();
  const std::vector<std::vector<int64_t>> rows = {{5, 7, 4}, {16}, {1, 15}};
  const Tensor pos = positions_of(rows);
  const int64_t b = 3, t = 16, heads = 4, kv = 2, d = 64;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto [cos, sin] = rotary_tables(d, t, 500000.0, RopeScaling{}, DType::f32, Device::cpu());
    const Tensor x = rand_cpu({b, t, (heads + 2 * kv) * d}, 7).to(dt).to(DType::f32);
    const Tensor want = rotary_packed(x, cos, sin, heads, kv, 0, pos);
    const Tensor got = rotary_packed(x.to(gpu()).to(dt), cos.to(gpu()).to(dt), sin.to(gpu()).to(dt), heads, kv, 0,
                                     pos.to(gpu()));
    const double tol = dt == DType::f32 ? 1e-5 : 2e-2;
    expect_close(want, got.to(DType::f32), tol, tol, std::string("rotary ") + dtype_name(dt));
  }
}

// Grouped-query packed attention over documents: the GPU's output and the projection's gradient against the
// CPU's f32 kernel on the same rounded inputs.
void expect_packed_attention(DType dt, double out_tol, double grad_tol) {
  const std::vector<std::vector<int64_t>> rows = {{70, 100, 30, 56}, {256}, {1, 200, 55}};
  const Tensor pos = positions_of(rows);
  const int64_t b = 3, t = 256, heads = 4, kv = 2, d = 64;
  const Tensor x = rand_cpu({b, t, (heads + 2 * kv) * d}, 8).to(dt).to(DType::f32);
  const Tensor w = rand_cpu({b, t, heads * d}, 9).to(dt).to(DType::f32);
  Tensor xc = x.clone();
  xc.requires_grad_();
  const Tensor oc = packed_self_attention(xc, heads, kv, true, 0.0, 0.0, nullptr, pos);
  backward(sum(mul(oc, w)));
  Tensor xg = x.to(gpu()).to(dt);
  xg.requires_grad_();
  const Tensor og = packed_self_attention(xg, heads, kv, true, 0.0, 0.0, nullptr, pos.to(gpu()));
  backward(og, {}, w.to(gpu()).to(dt));
  const std::string what = std::string("packed documents ") + dtype_name(dt);
  expect_norm_close(oc.detach(), og.detach().to(DType::f32), out_tol, what + ": output");
  expect_norm_close(xc.grad(), xg.grad().to(DType::f32), grad_tol, what + ": gradient");
  // Without the positions the result is another (the check above can fail).
  const Tensor crossing = packed_self_attention(x, heads, kv, true);
  double diff = 0.0;
  const std::vector<double> a = host_values(crossing), c = host_values(oc.detach());
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - c[i]));
  EXPECT_GT(diff, 1e-2) << what;
}

TEST(CudaPackedDocuments, AttentionKeepsToEachDocumentBf16) {
  REQUIRE_GPU();
  expect_packed_attention(DType::bf16, 1e-2, 2e-2);
}

TEST(CudaPackedDocuments, AttentionKeepsToEachDocumentF16) {
  REQUIRE_GPU();
  expect_packed_attention(DType::f16, 2e-3, 5e-3);
}

TEST(CudaPackedDocuments, AttentionKeepsToEachDocumentF32) {
  REQUIRE_GPU();
  expect_packed_attention(DType::f32, 2e-3, 2e-3);  // products may take TF32
}

}  // namespace
}  // namespace tandem
