// Every elementwise op on the GPU against the CPU, forward and backward, in f32, f16 and bf16: the GPU
// computes in the precision, the CPU in f32 from inputs rounded to it. Operands broadcast, transposed
// (read through strides), of size-1 extents, misaligned (the vectorised path's fallback), large (many
// blocks), channels-last and empty.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "cuda/cuda_test_util.h"
#include "ops/layout.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;
using Ins = std::vector<Tensor>;
using Fn = std::function<Tensor(const Ins&)>;

struct Precision {
  DType dtype;
  double rtol, atol;    // outputs
  double grtol, gatol;  // gradients (16-bit ones also carry the rounding of saved intermediates)
};
const Precision kPrecisions[] = {
    {DType::f32, 2e-5, 2e-6, 1e-4, 1e-5},
    {DType::f16, 2e-3, 2e-3, 2e-2, 2e-2},
    {DType::bf16, 1.6e-2, 1.6e-2, 8e-2, 8e-2},
};

/// How an input is made: uniform values in [lo, hi) of `shape`; transposed: the leaf is the (0, 1)
/// transpose of a contiguous tensor; offset: the leaf starts one element into its storage; a mask never
/// requires a gradient.
struct In {
  Shape shape;
  double lo = -1.0, hi = 1.0;
  bool transposed = false;
  bool offset = false;
  bool mask = false;
  bool channels_last = false;
};

Tensor make_leaf(const In& in, uint64_t seed, DType dt, Device d, bool grad) {
  Shape base = in.shape;
  if (in.transposed) std::swap(base[0], base[1]);
  int64_t n = shape_numel(base) + (in.offset ? 1 : 0);
  Tensor flat = rand_cpu({n}, seed, in.lo, in.hi);
  if (in.mask) flat = less(flat, 0.5 * (in.lo + in.hi));
  Tensor t = flat.to(dt).to(d);  // rounded to the precision first, then (on the CPU) back to f32
  if (d.is_cpu()) t = t.to(DType::f32);
  t = t.narrow(0, in.offset ? 1 : 0, n - (in.offset ? 1 : 0)).view(base);
  if (in.transposed) t = t.transpose(0, 1);
  if (in.channels_last) t = ops::to_dense(t, t.dtype(), true);
  if (grad && !in.mask) t.requires_grad_();
  return t;
}

// Runs f on both devices, weights the output by a fixed random tensor, back-propagates, and compares
// the outputs and (with grads) every floating input's gradient.
void check(const std::string& name, const Fn& f, const std::vector<In>& ins, bool grads = true) {
  for (const Precision& p : kPrecisions) {
    const std::string what = name + " " + dtype_name(p.dtype);
    Ins cpu_in, gpu_in;
    for (size_t i = 0; i < ins.size(); ++i) {
      cpu_in.push_back(make_leaf(ins[i], 100 + i, p.dtype, Device::cpu(), grads));
      gpu_in.push_back(make_leaf(ins[i], 100 + i, p.dtype, gpu(), grads));
    }
    Tensor yc = f(cpu_in), yg = f(gpu_in);
    ASSERT_EQ(yg.device(), gpu()) << what;
    ASSERT_EQ(yg.dtype(), p.dtype) << what;
    expect_close(yc, yg.to(DType::f32), p.rtol, p.atol, what + " output");
    if (!grads || !yc.requires_grad()) continue;
    Tensor w = rand_cpu(yc.shape(), 7, -1.0, 1.0).to(p.dtype);
    backward(yc, {}, w.to(DType::f32));
    backward(yg, {}, w.to(gpu()));
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!cpu_in[i].requires_grad()) continue;
      ASSERT_TRUE(gpu_in[i].grad().defined()) << what << " input " << i << " got no gradient on the GPU";
      expect_close(cpu_in[i].grad(), gpu_in[i].grad().to(DType::f32), p.grtol, p.gatol,
                   what + " gradient of input " + std::to_string(i));
    }
  }
}

#define REQUIRE_GPU() \
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo, hi;
};

TEST(CudaElementwise, UnaryOpsEveryPrecision) {
  REQUIRE_GPU();
  const UnaryCase cases[] = {
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.2, 3},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.5, 2},
      {"abs", [](const Tensor& x) { return abs(x); }, -1, 1},
      {"neg", [](const Tensor& x) { return neg(x); }, -1, 1},
      {"sign", [](const Tensor& x) { return sign(x); }, -1, 1},
      {"erf", [](const Tensor& x) { return erf(x); }, -2, 2},
      {"sin", [](const Tensor& x) { return sin(x); }, -3, 3},
      {"cos", [](const Tensor& x) { return cos(x); }, -3, 3},
      {"tan", [](const Tensor& x) { return tan(x); }, -1, 1},
      {"asin", [](const Tensor& x) { return asin(x); }, -0.8, 0.8},
      {"acos", [](const Tensor& x) { return acos(x); }, -0.8, 0.8},
      {"atan", [](const Tensor& x) { return atan(x); }, -3, 3},
      {"sinh", [](const Tensor& x) { return sinh(x); }, -2, 2},
      {"cosh", [](const Tensor& x) { return cosh(x); }, -2, 2},
      {"asinh", [](const Tensor& x) { return asinh(x); }, -3, 3},
      {"acosh", [](const Tensor& x) { return acosh(x); }, 1.5, 4},
      {"atanh", [](const Tensor& x) { return atanh(x); }, -0.8, 0.8},
      {"ceil", [](const Tensor& x) { return ceil(x); }, -3, 3},
      {"floor", [](const Tensor& x) { return floor(x); }, -3, 3},
      {"round", [](const Tensor& x) { return round(x); }, -3, 3},
      {"rounde", [](const Tensor& x) { return rounde(x); }, -3, 3},
      {"relu", [](const Tensor& x) { return relu(x); }, -1, 1},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); }, -1, 1},
      {"elu", [](const Tensor& x) { return elu(x, 0.7); }, -2, 2},
      {"selu", [](const Tensor& x) { return selu(x); }, -2, 2},
      {"softplus", [](const Tensor& x) { return softplus(x); }, -5, 5},
      {"softsign", [](const Tensor& x) { return softsign(x); }, -3, 3},
      // Binary-exact parameters: the CPU and the GPU (which fuses a multiply-add) then agree at the edges.
      {"hard_sigmoid", [](const Tensor& x) { return hard_sigmoid(x, 0.25, 0.5); }, -4, 4},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, -4, 4},
      {"clip", [](const Tensor& x) { return clip(x, -0.3, 0.5); }, -1, 1},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 1.5); }, 0.2, 2},
      {"scalar_pow", [](const Tensor& x) { return pow(2.0, x); }, -1, 1},
      {"affine", [](const Tensor& x) { return 1.5 - x * 0.5; }, -1, 1},
      {"logical_not", [](const Tensor& x) { return logical_not(relu(x)); }, -1, 1},
  };
  for (const UnaryCase& c : cases) {
    const Fn f = [&](const Ins& in) { return c.f(in[0]); };
    check(std::string(c.name) + " [7]", f, {In{{7}, c.lo, c.hi}});
    check(std::string(c.name) + " [33, 65] (vectorised, with a tail)", f, {In{{33, 65}, c.lo, c.hi}});
    check(std::string(c.name) + " transposed", f, {In{{5, 9}, c.lo, c.hi, true}});
    check(std::string(c.name) + " misaligned", f, {In{{64}, c.lo, c.hi, false, true}});
  }
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> f;
  double lo_a, hi_a, lo_b, hi_b;
  bool grads = true;
};

TEST(CudaElementwise, BinaryOpsBroadcastEveryPrecision) {
  REQUIRE_GPU();
  const BinaryCase cases[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, -1, 1, -1, 1},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -1, 1, -1, 1},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -1, 1, -1, 1},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, -1, 1, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.3, 2, -1, 1},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -1, 1, -1, 1},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -1, 1, -1, 1},
      {"prelu", [](const Tensor& a, const Tensor& b) { return prelu(a, b); }, -1, 1, 0.1, 0.5},
      {"less", [](const Tensor& a, const Tensor& b) { return less(a, b); }, -1, 1, -1, 1, false},
      {"less_equal", [](const Tensor& a, const Tensor& b) { return less_equal(a, b); }, -1, 1, -1, 1, false},
      {"greater", [](const Tensor& a, const Tensor& b) { return greater(a, b); }, -1, 1, -1, 1, false},
      {"greater_equal", [](const Tensor& a, const Tensor& b) { return greater_equal(a, b); }, -1, 1, -1, 1, false},
      {"equal", [](const Tensor& a, const Tensor& b) { return equal(a, relu(b)); }, -1, 1, -1, 1, false},
      {"not_equal", [](const Tensor& a, const Tensor& b) { return not_equal(relu(a), b); }, -1, 1, -1, 1, false},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(relu(a), relu(b)); }, -1, 1, -1, 1,
       false},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(relu(a), relu(b)); }, -1, 1, -1, 1,
       false},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(relu(a), relu(b)); }, -1, 1, -1, 1,
       false},
  };
  struct Shapes {
    In a, b;
  };
  for (const BinaryCase& c : cases) {
    const Fn f = [&](const Ins& in) { return c.f(in[0], in[1]); };
    const Shapes shapes[] = {
        {In{{1000}, c.lo_a, c.hi_a}, In{{1000}, c.lo_b, c.hi_b}},              // flat, vectorised
        {In{{17, 33}, c.lo_a, c.hi_a}, In{{33}, c.lo_b, c.hi_b}},              // a row broadcast
        {In{{17, 1}, c.lo_a, c.hi_a}, In{{1, 33}, c.lo_b, c.hi_b}},            // both stretched
        {In{{4, 6}, c.lo_a, c.hi_a}, In{{}, c.lo_b, c.hi_b}},                  // a 0-d operand (flat path)
        {In{{6, 4}, c.lo_a, c.hi_a, true}, In{{6, 1}, c.lo_b, c.hi_b}},        // transposed and broadcast
        {In{{2, 1, 3, 1, 5}, c.lo_a, c.hi_a}, In{{4, 1, 1, 5}, c.lo_b, c.hi_b}},  // size-1 extents
        {In{{100}, c.lo_a, c.hi_a, false, true}, In{{100}, c.lo_b, c.hi_b}},   // misaligned
        {In{{0, 3}, c.lo_a, c.hi_a}, In{{3}, c.lo_b, c.hi_b}},                 // empty
    };
    for (const Shapes& s : shapes)
      check(std::string(c.name) + " " + shape_str(s.a.shape) + (s.a.transposed ? "^T" : "") +
                (s.a.offset ? "+1" : "") + " with " + shape_str(s.b.shape),
            f, {s.a, s.b}, c.grads);
  }
}

TEST(CudaElementwise, ChannelsLastOperandsKeepTheirLayout) {
  REQUIRE_GPU();
  In x{{2, 8, 3, 5}};
  x.channels_last = true;
  check("channels-last * contiguous", [](const Ins& in) { return in[0] * exp(in[1]); }, {x, In{{2, 8, 3, 5}}});
  check("channels-last + per-channel", [](const Ins& in) { return maximum(in[0], in[1]); }, {x, In{{8, 1, 1}}});
  Tensor t = ops::to_dense(Tensor::ones({2, 8, 3, 5}, DType::f16, gpu()), DType::f16, true);
  EXPECT_TRUE(ops::is_channels_last(relu(t)));
  EXPECT_TRUE(ops::is_channels_last(t + Tensor::ones({8, 1, 1}, DType::f16, gpu())));
}

TEST(CudaElementwise, WhereAndCastEveryPrecision) {
  REQUIRE_GPU();
  In cond{{17, 1}};
  cond.mask = true;
  check("where broadcast", [](const Ins& in) { return where(in[0], in[1], in[2]); }, {cond, In{{17, 9}}, In{{9}}});
  In tcond{{17, 9}};
  tcond.mask = true;
  tcond.transposed = true;
  check("where transposed", [](const Ins& in) { return where(in[0], in[1], in[2]); },
        {tcond, In{{17, 9}}, In{{}}});
  check("cast to f32 and back", [](const Ins& in) { return cast(cast(in[0], DType::f32), in[0].dtype()) * in[0]; },
        {In{{300}}});
}

TEST(CudaElementwise, LargeTensorsTakeManyBlocks) {
  REQUIRE_GPU();
  check("mul 2^20 + 3", [](const Ins& in) { return in[0] * in[1]; }, {In{{(1 << 20) + 3}}, In{{(1 << 20) + 3}}});
  check("gelu 1024 x 1031 broadcast", [](const Ins& in) { return gelu(in[0] + in[1]); },
        {In{{1024, 1031}}, In{{1031}}});
}

TEST(CudaElementwise, IntegerOpsBroadcastExactly) {
  REQUIRE_GPU();
  std::vector<int64_t> av, bv;
  for (int64_t i = 0; i < 7 * 11; ++i) av.push_back((i * 7919) % 201 - 100);
  for (int64_t i = 0; i < 11; ++i) bv.push_back(i % 3 == 0 ? 5 : (i * 31) % 17 - 8);
  for (DType dt : {DType::i32, DType::i64}) {
    Tensor a = Tensor::from_vector(av, {7, 11}).to(dt), b = Tensor::from_vector(bv, {11}).to(dt);
    for (backend::Binary op : {backend::Binary::Add, backend::Binary::Sub, backend::Binary::Mul, backend::Binary::Max,
                               backend::Binary::Min, backend::Binary::Gt, backend::Binary::Eq, backend::Binary::Ne,
                               backend::Binary::And, backend::Binary::Xor}) {
      Tensor oc = Tensor::empty({7, 11}, dt), og = Tensor::empty({7, 11}, dt, gpu());
      cpu_be().binary(op, a, b, oc);
      gpu_be().binary(op, a.to(gpu()), b.to(gpu()), og);
      expect_same_bytes(oc, og, std::string(backend::op_name(op)) + " " + dtype_name(dt));
    }
    Tensor cond = Tensor::from_vector<int64_t>({1, 0, 1, 0, 0, 1, 1}, {7, 1}).to(dt);
    Tensor wc = Tensor::empty({7, 11}, dt), wg = Tensor::empty({7, 11}, dt, gpu());
    cpu_be().ternary(backend::Ternary::Where, cond, a, b, wc);
    gpu_be().ternary(backend::Ternary::Where, cond.to(gpu()), a.to(gpu()), b.to(gpu()), wg);
    expect_same_bytes(wc, wg, std::string("where ") + dtype_name(dt));
  }
}

TEST(CudaElementwise, RefusesWhatItDoesNotTake) {
  REQUIRE_GPU();
  Tensor i = Tensor::zeros({4}, DType::i32, gpu()), o = Tensor::empty({4}, DType::i32, gpu());
  try {
    gpu_be().binary(backend::Binary::Pow, i, i, o);
    ADD_FAILURE() << "integer pow accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pow"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  Tensor h = Tensor::zeros({4}, DType::f16, gpu()), f = Tensor::zeros({4}, DType::f32, gpu());
  EXPECT_THROW(gpu_be().binary(backend::Binary::Add, h, f, h), Error);
  EXPECT_THROW(gpu_be().unary_backward(backend::Unary::Floor, h, h, h), Error);
}

}  // namespace
}  // namespace tandem
