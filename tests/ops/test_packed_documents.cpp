// Packed documents: several documents in one row of a batch, each token's position in its document given
// (doc_positions). Attention must not cross documents and positions must count from each document's start, so
// that every document gives exactly what it gives alone. Each op and both models are checked against that
// definition: the documents cut out of the rows and run one at a time. Values and gradients, f64 and f32,
// grouped-query heads; finite differences in f64. The same binary runs again with TANDEM_ATTENTION_MATH=1
// (tests/CMakeLists.txt), where attention takes the composed path (masked scores, softmax, products).
#include <algorithm>
#include <cmath>

#include "ops/gradcheck.h"
#include "tandem/autograd.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

// The documents of each row, by length (each row's lengths add up to T).
using Layout = std::vector<std::vector<int64_t>>;

const Layout kLayout = {{3, 4, 2}, {9}, {1, 1, 6, 1}};
constexpr int64_t kT = 9;

// i32 [rows, T]: each token's position in its document.
Tensor positions_of(const Layout& rows) {
  std::vector<int32_t> v;
  for (const auto& row : rows)
    for (int64_t len : row)
      for (int64_t p = 0; p < len; ++p) v.push_back(static_cast<int32_t>(p));
  return Tensor::from_vector(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(v.size() / rows.size())});
}

// f applied to each document alone ([1, ..., len, ...] cut from row b along dim), the results put back in place.
Tensor per_document(const Tensor& x, int64_t dim, const Layout& rows, const std::function<Tensor(const Tensor&)>& f) {
  std::vector<Tensor> out_rows;
  for (size_t b = 0; b < rows.size(); ++b) {
    const Tensor row = slice(x, 0, static_cast<int64_t>(b), 1);
    std::vector<Tensor> docs;
    int64_t at = 0;
    for (int64_t len : rows[b]) {
      docs.push_back(f(slice(row, dim, at, len)));
      at += len;
    }
    out_rows.push_back(concat(docs, dim));
  }
  return concat(out_rows, 0);
}

// A copy of x that takes its own gradient.
Tensor twin(const Tensor& x) {
  Tensor t = x.detach().clone();
  t.requires_grad_();
  return t;
}

struct Heads {
  int64_t heads, kv_heads;
};

TEST(PackedDocuments, AttentionSeesEachDocumentAlone) {
  Generator gen(31);
  const Tensor pos = positions_of(kLayout);
  const int64_t b = static_cast<int64_t>(kLayout.size()), d = 4;
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    for (Heads h : {Heads{4, 4}, Heads{4, 2}, Heads{3, 1}}) {
      Tensor q = Tensor::uniform({b, h.heads, kT, d}, -1.5, 1.5, gen, dt),
             k = Tensor::uniform({b, h.kv_heads, kT, d}, -1.5, 1.5, gen, dt),
             v = Tensor::uniform({b, h.kv_heads, kT, d}, -1.0, 1.0, gen, dt);
      const Tensor w = Tensor::uniform({b, h.heads, kT, d}, -1.0, 1.0, gen, dt);
      Tensor q1 = twin(q), k1 = twin(k), v1 = twin(v), q2 = twin(q), k2 = twin(k), v2 = twin(v);
      const Tensor packed = scaled_dot_product_attention(q1, k1, v1, true, 0.0, 0.0, nullptr, pos);
      // Alone: the document's queries, keys and values cut out together (dim 2 of each).
      std::vector<Tensor> rows;
      for (size_t r = 0; r < kLayout.size(); ++r) {
        std::vector<Tensor> docs;
        int64_t at = 0;
        for (int64_t len : kLayout[r]) {
          auto cut = [&](const Tensor& x) { return slice(slice(x, 0, static_cast<int64_t>(r), 1), 2, at, len); };
          docs.push_back(scaled_dot_product_attention(cut(q2), cut(k2), cut(v2), true));
          at += len;
        }
        rows.push_back(concat(docs, 2));
      }
      const Tensor alone = concat(rows, 0);
      const std::string what = std::string(dtype_name(dt)) + " heads " + std::to_string(h.heads) + "/" +
                               std::to_string(h.kv_heads);
      EXPECT_LT(max_abs_diff(packed, alone), tol) << what;
      backward(sum(mul(packed, w)));
      backward(sum(mul(alone, w)));
      EXPECT_LT(max_abs_diff(q1.grad(), q2.grad()), tol) << what << ": query gradient";
      EXPECT_LT(max_abs_diff(k1.grad(), k2.grad()), tol) << what << ": key gradient";
      EXPECT_LT(max_abs_diff(v1.grad(), v2.grad()), tol) << what << ": value gradient";
    }
  }
}

TEST(PackedDocuments, AttentionGradientAgainstFiniteDifferences) {
  Generator gen(32);
  const Tensor pos = positions_of(kLayout);
  const int64_t b = static_cast<int64_t>(kLayout.size());
  Tensor q = leaf({b, 4, kT, 3}, gen), k = leaf({b, 2, kT, 3}, gen), v = leaf({b, 2, kT, 3}, gen);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.0, 0.0, nullptr, pos);
      },
      {q, k, v}));
  // The packed projection's path (heads read in place on the fused kernels).
  Tensor qkv = leaf({b, kT, (4 + 2 * 2) * 3}, gen);
  EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return packed_self_attention(x, 4, 2, true, 0.0, 0.0, nullptr, pos); },
                         qkv));
}

TEST(PackedDocuments, PackedSelfAttentionEqualsEachDocumentAlone) {
  Generator gen(33);
  const Tensor pos = positions_of(kLayout);
  const int64_t b = static_cast<int64_t>(kLayout.size()), d = 4;
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    for (Heads h : {Heads{2, 2}, Heads{4, 2}}) {
      const Tensor x = Tensor::uniform({b, kT, (h.heads + 2 * h.kv_heads) * d}, -1.5, 1.5, gen, dt);
      const Tensor w = Tensor::uniform({b, kT, h.heads * d}, -1.0, 1.0, gen, dt);
      Tensor x1 = twin(x), x2 = twin(x);
      const Tensor packed = packed_self_attention(x1, h.heads, h.kv_heads, true, 0.0, 0.0, nullptr, pos);
      const Tensor alone =
          per_document(x2, 1, kLayout, [&](const Tensor& doc) { return packed_self_attention(doc, h.heads, h.kv_heads, true); });
      EXPECT_LT(max_abs_diff(packed, alone), tol) << dtype_name(dt);
      backward(sum(mul(packed, w)));
      backward(sum(mul(alone, w)));
      EXPECT_LT(max_abs_diff(x1.grad(), x2.grad()), tol) << dtype_name(dt) << ": gradient";
    }
  }
}

TEST(PackedDocuments, RotaryCountsFromEachDocumentsStart) {
  Generator gen(34);
  const Tensor pos = positions_of(kLayout);
  const int64_t b = static_cast<int64_t>(kLayout.size()), heads = 4, kv = 2, d = 6;
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 2e-6;
    auto [cos, sin] = rotary_tables(d, kT, 10000.0, RopeScaling{}, dt, Device::cpu());
    const Tensor x = Tensor::uniform({b, kT, (heads + 2 * kv) * d}, -2.0, 2.0, gen, dt);
    const Tensor w = Tensor::uniform(x.shape(), -1.0, 1.0, gen, dt);
    Tensor x1 = twin(x), x2 = twin(x);
    const Tensor packed = rotary_packed(x1, cos, sin, heads, kv, 0, pos);
    const Tensor alone = per_document(x2, 1, kLayout, [&](const Tensor& doc) { return rotary_packed(doc, cos, sin, heads, kv); });
    EXPECT_LT(max_abs_diff(packed, alone), tol) << dtype_name(dt);
    backward(sum(mul(packed, w)));
    backward(sum(mul(alone, w)));
    EXPECT_LT(max_abs_diff(x1.grad(), x2.grad()), tol) << dtype_name(dt) << ": gradient";
    // The composition (tables that take a gradient take it) gives the same rows.
    Tensor c = twin(cos), s = twin(sin);
    EXPECT_LT(max_abs_diff(rotary_packed(x, c, s, heads, kv, 0, pos), packed.detach()), tol) << dtype_name(dt);
  }
  Tensor qkv = leaf({b, kT, (heads + 2 * kv) * d}, gen);
  auto [cos64, sin64] = rotary_tables(d, kT, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  EXPECT_TRUE(gradcheck1([&](const Tensor& y) { return rotary_packed(y, cos64, sin64, heads, kv, 0, pos); }, qkv));
}

TEST(PackedDocuments, BadPositionsAreRefused) {
  Generator gen(35);
  const Tensor q = Tensor::uniform({1, 2, 4, 4}, -1.0, 1.0, gen, DType::f32);
  const Tensor good = Tensor::from_vector(std::vector<int32_t>{0, 1, 0, 1}, {1, 4});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, q, q, false, 0.0, 0.0, nullptr, good); }).find("causal"),
            std::string::npos);
  const Tensor wide = Tensor::from_vector(std::vector<int64_t>{0, 1, 0, 1}, {1, 4});
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, q, q, true, 0.0, 0.0, nullptr, wide); }).find("i32 [1, 4]"),
            std::string::npos);
  const Tensor short_rows = Tensor::from_vector(std::vector<int32_t>{0, 1, 2}, {1, 3});
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, q, q, true, 0.0, 0.0, nullptr, short_rows); }).find("i32 [1, 4]"),
            std::string::npos);
  auto [cos, sin] = rotary_tables(4, 6, 10000.0, RopeScaling{}, DType::f32, Device::cpu());
  const Tensor qkv = Tensor::uniform({1, 4, 12}, -1.0, 1.0, gen, DType::f32);
  EXPECT_NE(message([&] { rotary_packed(qkv, cos, sin, 1, 1, 1, good); }).find("cannot be given together"),
            std::string::npos);
  const Tensor past = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 7}, {1, 4});
  EXPECT_NE(message([&] { rotary_packed(qkv, cos, sin, 1, 1, 0, past); }).find("outside the 6 rows"), std::string::npos);
}

// A causal language model's logits and parameter gradients over packed rows equal those of each document run
// alone (its own row, positions from 0).
template <typename Model>
void expect_documents_alone(Model& model, int64_t vocab, const char* what) {
  Generator gen(36);
  const int64_t b = static_cast<int64_t>(kLayout.size());
  std::vector<int32_t> ids(static_cast<size_t>(b * kT));
  for (auto& id : ids) id = static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab)));
  const Tensor tokens = Tensor::from_vector(ids, {b, kT});
  std::vector<int32_t> next(ids.size());
  for (auto& id : next) id = static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(vocab)));
  const Tensor targets = Tensor::from_vector(next, {b, kT});
  auto params = model.named_parameters();
  auto grads = [&] {
    std::map<std::string, Tensor> g;
    for (auto& [name, p] : params) {
      g[name] = p.grad().defined() ? p.grad().clone() : Tensor::zeros(p.shape(), p.dtype());
      Tensor(p).set_grad(Tensor());
    }
    return g;
  };
  model.set_document_positions(positions_of(kLayout));
  const Tensor packed = model.forward(tokens);
  backward(softmax_cross_entropy(packed, targets, Reduction::Sum));
  const auto packed_grads = grads();
  model.set_document_positions(Tensor());
  std::vector<Tensor> rows;
  Tensor total;
  for (size_t r = 0; r < kLayout.size(); ++r) {
    std::vector<Tensor> docs;
    int64_t at = 0;
    for (int64_t len : kLayout[r]) {
      auto cut = [&](const Tensor& x) { return slice(slice(x, 0, static_cast<int64_t>(r), 1), 1, at, len); };
      Tensor logits = model.forward(cut(tokens));
      Tensor l = softmax_cross_entropy(logits, cut(targets), Reduction::Sum);
      total = total.defined() ? add(total, l) : l;
      docs.push_back(logits.detach());
      at += len;
    }
    rows.push_back(concat(docs, 1));
  }
  backward(total);
  const auto alone_grads = grads();
  EXPECT_LT(max_abs_diff(packed.detach(), concat(rows, 0)), 2e-5) << what << ": logits";
  for (auto& [name, g] : packed_grads) {
    double scale = 1.0;
    for (double x : Tensor(g).contiguous().to_vector<double>()) scale = std::max(scale, std::abs(x));
    EXPECT_LT(max_abs_diff(g, alone_grads.at(name)) / scale, 1e-4) << what << ": gradient of " << name;
  }
}

TEST(PackedDocuments, GptSeesEachDocumentAlone) {
  nn::GptConfig c;
  c.layers = 2, c.heads = 2, c.width = 16, c.context = kT, c.vocab = 40;
  nn::GPT model(c, 5);
  expect_documents_alone(model, c.vocab, "gpt");
}

TEST(PackedDocuments, LlamaSeesEachDocumentAlone) {
  nn::LlamaConfig c;
  c.layers = 2, c.width = 32, c.heads = 4, c.kv_heads = 2, c.mlp_hidden = 48, c.vocab = 40, c.context = kT;
  c.rope_theta = 10000.0;
  nn::Llama model(c, 6);
  expect_documents_alone(model, c.vocab, "llama");
}

TEST(PackedDocuments, ModelsRefusePositionsOfAnotherShape) {
  nn::GptConfig c;
  c.layers = 1, c.heads = 2, c.width = 8, c.context = kT, c.vocab = 16;
  nn::GPT model(c, 1);
  model.set_document_positions(positions_of(kLayout));
  const Tensor tokens = Tensor::zeros({2, kT}, DType::i32);
  try {
    model.forward(tokens);
    FAIL() << "positions of 3 rows were taken for 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not match the tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::testing
