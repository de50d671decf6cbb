// The CUDA kernels of the reductions, indexing ops and batched products against the CPU backend on the
// same inputs, in f32, f16 and bf16 (16-bit inputs rounded first; the CPU computes from their f32
// values), over shapes that take every launch path; the ops built on them, forward and backward; and a
// recorded step of them replayed (no op waits for the device).
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/graph.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;
using backend::Backend;
using ReduceOp = Backend::ReduceOp;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

const DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

// x rounded to dtype: as f32 for the CPU, as dtype on the GPU; both new tensors (x.to(f32) of an f32
// tensor is x itself, whose gradient would gather across cases).
std::pair<Tensor, Tensor> rounded(const Tensor& x, DType dt) {
  Tensor r = x.to(dt);
  return {r.to(DType::f32).clone(), r.to(gpu())};
}

// Tolerance of one result stored in dtype (the arithmetic is f32 on both sides).
double rtol_for(DType dt) { return dt == DType::f32 ? 2e-5 : dt == DType::f16 ? 2e-3 : 1.6e-2; }

Tensor index_cpu(const std::vector<int64_t>& v, DType dt = DType::i64) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(dt);
}

std::string name(const char* what, DType dt, const Shape& s) {
  return std::string(what) + " " + dtype_name(dt) + " " + shape_str(s);
}

// [outer, n, inner] cases for every launch path: rows (one chunk, and n split), one thread per column,
// tiles of columns (narrow and wide, one chunk and n split), and empty reductions.
const Shape kReduceShapes[] = {{4096, 100, 1}, {3, 300000, 1}, {2000, 20, 1}, {1, 7, 1},   {5, 1000, 3},
                               {1, 150000, 8}, {20000, 40, 64}, {2, 5000, 300}, {64, 33, 2}, {3, 0, 2}};

TEST(CudaShape, ReduceKernelOnEveryPath) {
  REQUIRE_GPU();
  struct Op {
    ReduceOp op;
    const char* name;
    double arg;
  };
  const Op ops[] = {{ReduceOp::Sum, "sum", 1.0},       {ReduceOp::Sum, "mean", -1.0},   {ReduceOp::Max, "max", 0.0},
                    {ReduceOp::Min, "min", 0.0},       {ReduceOp::ArgMax, "argmax", 0}, {ReduceOp::ArgMin, "argmin", 0},
                    {ReduceOp::Var, "var", 1.0},       {ReduceOp::LogSumExp, "logsumexp", 0.0}};
  for (const Shape& s : kReduceShapes) {
    const int64_t outer = s[0], n = s[1], inner = s[2];
    Tensor x = rand_cpu({outer * n * inner}, 31, -2.0, 2.0);
    for (DType dt : kTypes) {
      auto [xc, xg] = rounded(x, dt);
      for (const Op& o : ops) {
        if (n == 0 && (o.op == ReduceOp::Max || o.op == ReduceOp::Min || o.op == ReduceOp::ArgMax ||
                       o.op == ReduceOp::ArgMin))
          continue;
        const bool arg = o.op == ReduceOp::ArgMax || o.op == ReduceOp::ArgMin;
        const double a = o.arg < 0 ? 1.0 / static_cast<double>(std::max<int64_t>(n, 1)) : o.arg;
        Tensor oc = Tensor::empty({outer * inner}, arg ? DType::i64 : DType::f32);
        Tensor og = Tensor::empty({outer * inner}, arg ? DType::i64 : dt, gpu());
        cpu_be().reduce(o.op, xc, outer, n, inner, a, oc);
        gpu_be().reduce(o.op, xg, outer, n, inner, a, og);
        const std::string what = name(o.name, dt, s);
        if (arg) {
          expect_same_bytes(oc, og, what);
        } else {
          // Long sums differ in their order: the tolerance grows with sqrt(n) for them.
          const double spread = o.op == ReduceOp::Sum && o.arg > 0 ? std::sqrt(static_cast<double>(n)) * 2e-6 : 0.0;
          expect_close(oc, og.to(DType::f32), rtol_for(dt), spread + 1e-5, what);
        }
      }
    }
  }
}

TEST(CudaShape, ProductAndItsGradient) {
  REQUIRE_GPU();
  for (const Shape& s : {Shape{50, 40, 1}, Shape{3, 20, 7}, Shape{1, 64, 300}}) {
    const int64_t outer = s[0], n = s[1], inner = s[2];
    Tensor x = rand_cpu({outer * n * inner}, 32, 0.8, 1.2), g = rand_cpu({outer * inner}, 33);
    x.view({-1}).narrow(0, 5, 1).zero_();  // a zero factor: the gradient there is the others' product
    for (DType dt : kTypes) {
      auto [xc, xg] = rounded(x, dt);
      auto [gc, gg] = rounded(g, dt);
      Tensor pc = Tensor::empty({outer * inner}), pg = Tensor::empty({outer * inner}, dt, gpu());
      cpu_be().reduce(ReduceOp::Prod, xc, outer, n, inner, 0.0, pc);
      gpu_be().reduce(ReduceOp::Prod, xg, outer, n, inner, 0.0, pg);
      expect_close(pc, pg.to(DType::f32), 4 * rtol_for(dt), 1e-6, name("prod", dt, s));
      Tensor dc = Tensor::empty(xc.shape()), dg = Tensor::empty(xc.shape(), dt, gpu());
      cpu_be().prod_backward(xc, gc, outer, n, inner, dc);
      gpu_be().prod_backward(xg, gg, outer, n, inner, dg);
      expect_close(dc, dg.to(DType::f32), 8 * rtol_for(dt), 1e-5, name("prod_backward", dt, s));
    }
  }
}

TEST(CudaShape, IndexSelectAndIndexAdd) {
  REQUIRE_GPU();
  // inner 8 and 16 move as 16-byte units; 3 and 1 element by element.
  for (const Shape& s : {Shape{3, 10, 8}, Shape{1, 1000, 16}, Shape{7, 5, 3}, Shape{100, 50, 1}}) {
    const int64_t outer = s[0], n = s[1], inner = s[2];
    std::vector<int64_t> picks;
    for (int64_t j = 0; j < 2 * n + 3; ++j) picks.push_back((j * 7919) % n - (j % 3 == 0 ? n : 0));  // negatives too
    const int64_t m = static_cast<int64_t>(picks.size());
    Tensor x = rand_cpu({outer * n * inner}, 34), g = rand_cpu({outer * m * inner}, 35);
    for (DType it : {DType::i64, DType::i32}) {
      Tensor ic = index_cpu(picks, it), ig = ic.to(gpu());
      for (DType dt : kTypes) {
        auto [xc, xg] = rounded(x, dt);
        auto [gc, gg] = rounded(g, dt);
        Tensor oc = Tensor::empty({outer * m * inner}), og = Tensor::empty({outer * m * inner}, dt, gpu());
        cpu_be().index_select(xc, ic, outer, n, inner, oc);
        gpu_be().index_select(xg, ig, outer, n, inner, og);
        expect_same_bytes(oc.to(dt), og, name("index_select", dt, s));
        Tensor dc = Tensor::empty({outer * n * inner}), dg = Tensor::empty({outer * n * inner}, dt, gpu());
        cpu_be().index_add(gc, ic, outer, n, inner, dc);
        gpu_be().index_add(gg, ig, outer, n, inner, dg);
        expect_close(dc, dg.to(DType::f32), rtol_for(dt), 1e-5, name("index_add", dt, s));
      }
    }
    // Integers move as they are.
    Tensor xi = Tensor::from_vector(std::vector<int64_t>(static_cast<size_t>(outer * n * inner), 3), {outer * n * inner});
    Tensor oc = Tensor::empty({outer * m * inner}, DType::i64), og = Tensor::empty({outer * m * inner}, DType::i64, gpu());
    cpu_be().index_select(xi, index_cpu(picks), outer, n, inner, oc);
    gpu_be().index_select(xi.to(gpu()), index_cpu(picks).to(gpu()), outer, n, inner, og);
    expect_same_bytes(oc, og, "index_select i64 " + shape_str(s));
  }
}

TEST(CudaShape, ElementGathersAndScatters) {
  REQUIRE_GPU();
  for (const Shape& s : {Shape{4, 6, 5}, Shape{1, 300, 1}, Shape{30, 3, 40}}) {
    const int64_t outer = s[0], n = s[1], inner = s[2], m = n + 2;
    std::vector<int64_t> at;
    for (int64_t e = 0; e < outer * m * inner; ++e) at.push_back((e * 104729) % n);  // positions met repeatedly
    Tensor x = rand_cpu({outer * n * inner}, 36), src = rand_cpu({outer * m * inner}, 37);
    for (DType it : {DType::i64, DType::i32}) {
      Tensor ic = Tensor::from_vector(at, {outer * m * inner}).to(it), ig = ic.to(gpu());
      for (DType dt : kTypes) {
        auto [xc, xg] = rounded(x, dt);
        auto [sc, sg] = rounded(src, dt);
        Tensor oc = Tensor::empty({outer * m * inner}), og = Tensor::empty({outer * m * inner}, dt, gpu());
        cpu_be().gather_elements(xc, ic, outer, n, inner, oc);
        gpu_be().gather_elements(xg, ig, outer, n, inner, og);
        expect_same_bytes(oc.to(dt), og, name("gather_elements", dt, s));
        for (bool acc : {true, false}) {
          Tensor dc = xc.clone(), dg = xg.clone();
          cpu_be().scatter_elements(sc, ic, outer, n, inner, acc, dc);
          gpu_be().scatter_elements(sg, ig, outer, n, inner, acc, dg);
          if (acc)
            expect_close(dc, dg.to(DType::f32), rtol_for(dt), 1e-5, name("scatter_add", dt, s));
          else  // the value of the largest j: the same on both
            expect_same_bytes(dc.to(dt), dg, name("scatter_elements", dt, s));
        }
      }
    }
  }
}

TEST(CudaShape, PadOneHotNonzeroStridedWrites) {
  REQUIRE_GPU();
  for (bool reflect : {true, false}) {
    for (const Shape& s : {Shape{3, 5, 4}, Shape{2, 7, 1}, Shape{1, 4, 33}}) {
      const int64_t outer = s[0], n = s[1], inner = s[2], before = 3, after = 2, len = before + n + after;
      Tensor x = rand_cpu({outer * n * inner}, 38), g = rand_cpu({outer * len * inner}, 39);
      for (DType dt : kTypes) {
        auto [xc, xg] = rounded(x, dt);
        auto [gc, gg] = rounded(g, dt);
        Tensor oc = Tensor::empty({outer * len * inner}), og = Tensor::empty({outer * len * inner}, dt, gpu());
        cpu_be().pad_axis(xc, outer, n, inner, before, after, reflect, oc);
        gpu_be().pad_axis(xg, outer, n, inner, before, after, reflect, og);
        expect_same_bytes(oc.to(dt), og, name(reflect ? "pad reflect" : "pad edge", dt, s));
        Tensor dc = Tensor::empty({outer * n * inner}), dg = Tensor::empty({outer * n * inner}, dt, gpu());
        cpu_be().pad_axis_backward(gc, outer, n, inner, before, after, reflect, dc);
        gpu_be().pad_axis_backward(gg, outer, n, inner, before, after, reflect, dg);
        expect_close(dc, dg.to(DType::f32), rtol_for(dt), 1e-5, name("pad backward", dt, s));
      }
    }
  }
  Tensor labels = index_cpu({0, 3, -1, 7, -9, 2});  // 7 and -9 fall outside depth 5: rows of off
  for (DType dt : kTypes) {
    Tensor oc = Tensor::empty({2, 5, 3}), og = Tensor::empty({2, 5, 3}, dt, gpu());
    cpu_be().one_hot(labels, 2, 5, 3, -0.5, 2.0, oc);
    gpu_be().one_hot(labels.to(gpu()), 2, 5, 3, -0.5, 2.0, og);
    expect_same_bytes(oc.to(dt), og, std::string("one_hot ") + dtype_name(dt));
  }
  Tensor sparse = rand_cpu({7, 9, 11}, 40);
  sparse = relu(sparse);  // about half zeros
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
    Tensor xs = sparse.to(dt);
    expect_same_bytes(cpu_be().nonzero(xs), gpu_be().nonzero(xs.to(gpu())), std::string("nonzero ") + dtype_name(dt));
  }
  // Writes through views of positive and negative strides.
  for (DType dt : kTypes) {
    Tensor base = rand_cpu({6, 8}, 41).to(dt), src = rand_cpu({3, 4}, 42).to(dt);
    Tensor bc = base.clone(), bg = base.to(gpu());
    for (Tensor* b : {&bc, &bg}) {
      Tensor v = b->transpose(0, 1).narrow(0, 1, 4).narrow(1, 0, 3).transpose(0, 1);
      Tensor s = src.to(b->device());
      (b->device().is_cpu() ? cpu_be() : gpu_be()).copy_into_strided(s, v);
    }
    expect_same_bytes(bc, bg, std::string("copy_into_strided ") + dtype_name(dt));
  }
}

TEST(CudaShape, BatchedGemm) {
  REQUIRE_GPU();
  struct Case {
    bool ta, tb;
    int64_t batch, m, n, k, sa, sb;  // strides in matrices: 0 reads one matrix for every batch index
  };
  for (const Case& c : {Case{false, false, 4, 33, 17, 9, 1, 1}, Case{true, false, 3, 8, 64, 40, 1, 0},
                        Case{false, true, 5, 16, 16, 16, 0, 1}, Case{true, true, 2, 7, 5, 130, 1, 1}}) {
    Tensor a = rand_cpu({c.batch * c.m * c.k}, 43), b = rand_cpu({c.batch * c.k * c.n}, 44);
    for (DType dt : kTypes) {
      auto [ac, ag] = rounded(a, dt);
      auto [bc, bg] = rounded(b, dt);
      Tensor cc = Tensor::empty({c.batch * c.m * c.n}), cg = Tensor::empty({c.batch * c.m * c.n}, dt, gpu());
      cpu_be().gemm_batched(c.ta, c.tb, c.batch, c.m, c.n, c.k, 1.0, ac, c.sa * c.m * c.k, bc, c.sb * c.k * c.n, 0.0,
                            cc, c.m * c.n);
      gpu_be().gemm_batched(c.ta, c.tb, c.batch, c.m, c.n, c.k, 1.0, ag, c.sa * c.m * c.k, bg, c.sb * c.k * c.n, 0.0,
                            cg, c.m * c.n);
      expect_norm_close(cc, cg.to(DType::f32), dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 2e-3 : 1e-2,
                        std::string("gemm_batched ") + dtype_name(dt) + " m=" + std::to_string(c.m));
    }
  }
}

// ---- the ops, forward and backward
using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

void compare_op(const std::vector<Tensor>& inputs, const Graph& f, DType dt, const std::string& what) {
  std::vector<Tensor> lc, lg;
  for (const Tensor& t : inputs) {
    if (!is_floating(t.dtype())) {
      lc.push_back(t);
      lg.push_back(t.to(gpu()));
      continue;
    }
    auto [c, g] = rounded(t, dt);
    c.requires_grad_();
    g.requires_grad_();
    lc.push_back(c);
    lg.push_back(g);
  }
  Tensor yc = f(lc), yg = f(lg);
  ASSERT_EQ(yc.shape(), yg.shape()) << what;
  Tensor w = rand_cpu(yc.shape(), 4242);
  auto [wc, wg] = rounded(w, dt);
  backward(sum(mul(yc, wc)));
  backward(sum(mul(yg, wg)));
  const double tol = 4 * rtol_for(dt);
  expect_norm_close(yc.detach(), yg.detach().to(DType::f32), tol, what + " forward");
  for (size_t i = 0; i < lc.size(); ++i) {
    if (!lc[i].requires_grad()) continue;
    ASSERT_TRUE(lg[i].grad().defined()) << what << " input " << i;
    expect_norm_close(lc[i].grad(), lg[i].grad().to(DType::f32), tol, what + " gradient of input " + std::to_string(i));
  }
}

TEST(CudaShape, OpsForwardAndBackward) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({6, 5, 8}, 50), y = rand_cpu({6, 5, 8}, 51), m = rand_cpu({4, 8, 3}, 52);
  Tensor rows = index_cpu({2, 0, 2, -1}), at = Tensor::from_vector(std::vector<int64_t>(6 * 2 * 8, 1), {6, 2, 8});
  struct Named {
    const char* what;
    std::vector<Tensor> in;
    Graph f;
  };
  const Named cases[] = {
      {"sum", {x}, [](const std::vector<Tensor>& t) { return sum(t[0], {0, 2}); }},
      {"mean", {x}, [](const std::vector<Tensor>& t) { return mean(t[0], {1}, true); }},
      {"amax", {x}, [](const std::vector<Tensor>& t) { return amax(t[0], {0, 2}); }},
      {"amin", {x}, [](const std::vector<Tensor>& t) { return amin(t[0], {-1}); }},
      {"var", {x}, [](const std::vector<Tensor>& t) { return var(t[0], {0, 2}); }},
      {"logsumexp", {x}, [](const std::vector<Tensor>& t) { return logsumexp(t[0], {1}); }},
      {"prod", {x}, [](const std::vector<Tensor>& t) { return prod(add_scalar(t[0], 1.5), {1}); }},
      {"strided slices", {x},
       [](const std::vector<Tensor>& t) { return strided_slice(strided_slice(t[0], 2, kOpen, kOpen, -3), 0, 1, 5, 2); }},
      {"gather", {x, rows}, [](const std::vector<Tensor>& t) { return index_select(t[0], 1, t[1]); }},
      {"gather_elements", {x, at}, [](const std::vector<Tensor>& t) { return gather(t[0], 1, t[1]); }},
      {"scatter_add", {x, at, rand_cpu({6, 2, 8}, 53)},
       [](const std::vector<Tensor>& t) { return scatter_add(t[0], 1, t[1], t[2]); }},
      {"pad reflect", {x}, [](const std::vector<Tensor>& t) { return pad(t[0], {0, 2, 3, 1, 2, 4}, PadMode::Reflect); }},
      {"pad constant", {x}, [](const std::vector<Tensor>& t) { return pad(t[0], {1, 0, 2, 0, 3, 1}, PadMode::Constant, 0.5); }},
      {"tile", {m}, [](const std::vector<Tensor>& t) { return tile(t[0], {2, 1, 3}); }},
      {"upsample", {m}, [](const std::vector<Tensor>& t) { return upsample_nearest(t[0], {1, 2, 2}); }},
      {"cosine_similarity", {x, y}, [](const std::vector<Tensor>& t) { return cosine_similarity(t[0], t[1], 2); }},
      {"matmul broadcast", {x, m}, [](const std::vector<Tensor>& t) { return matmul(unsqueeze(t[0], {1}), t[1]); }},
      {"matmul transposed", {x, y}, [](const std::vector<Tensor>& t) { return matmul(t[0], transpose(t[1], 1, 2)); }},
      {"linear N-D", {x, rand_cpu({7, 8}, 54), rand_cpu({7}, 55)},
       [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); }},
      {"gemm", {rand_cpu({8, 5}, 56), rand_cpu({3, 8}, 57), rand_cpu({3}, 58)},
       [](const std::vector<Tensor>& t) { return gemm(t[0], t[1], t[2], 0.5, 2.0, true, true); }},
  };
  for (DType dt : kTypes)
    for (const Named& c : cases) compare_op(c.in, c.f, dt, std::string(c.what) + " " + dtype_name(dt));
}

TEST(CudaShape, BadIndexIsReportedAtTheNextSynchronisation) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({3, 4}, 60).to(gpu());
  Tensor y = index_select(x, 1, index_cpu({1, 9}).to(gpu()));  // queued: no wait for the device
  try {
    synchronize(gpu());
    ADD_FAILURE() << "no error at synchronize";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("index 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[-4, 4)"), std::string::npos) << msg;
  }
  synchronize(gpu());  // reported once
  EXPECT_EQ(y.cpu().to_vector<float>()[1], 0.0f);  // the bad element reads as 0
}

TEST(CudaShape, RecordedStepOfTheseOpsReplaysTheEagerResult) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({8, 6, 5}, 70).to(gpu()), w = rand_cpu({6, 5, 4}, 71).to(gpu());
  Tensor rows = index_cpu({3, 0, 3, 5}).to(gpu());
  x.requires_grad_();
  w.requires_grad_();
  auto step = [&] {
    Tensor h = matmul(index_select(x, 1, rows), slice(w, 0, 0, 1));  // [8, 4, 5] x [1, 5, 4]
    h = pad(strided_slice(h, 2, kOpen, kOpen, -1), {0, 1, 0, 0, 2, 1}, PadMode::Edge);
    Tensor loss = add(sum(logsumexp(h, {1})), mean(amax(var(h, {0}), {0, 1})));
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    backward(loss);
    return std::vector<Tensor>{loss.detach(), x.grad(), w.grad()};
  };
  std::vector<Tensor> eager = step();
  std::vector<Tensor> expected;
  for (const Tensor& t : eager) expected.push_back(t.cpu());
  std::vector<Tensor> recorded;
  DeviceGraph graph(gpu(), [&] { recorded = step(); });
  graph.replay();
  graph.replay();
  synchronize(gpu());
  for (size_t i = 0; i < expected.size(); ++i)
    expect_same_bytes(expected[i], recorded[i].cpu(), "recorded step output " + std::to_string(i));
}

}  // namespace
}  // namespace tandem
