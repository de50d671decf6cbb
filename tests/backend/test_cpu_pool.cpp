// Pooling kernels against direct double-precision loops.
#include <cmath>
#include <limits>

#include <sstream>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

using backend::PoolGeom;

struct PoolCase {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
  int64_t bh = -1, bw = -1;  // padding after the input; -1: ph, pw
  bool ceil = false;          // ceil mode: the output size rounded up
  bool count_pad = true;      // the average's divisor counts padded positions
};

// Output size along one axis, written out as ONNX's reference and PyTorch give it: floor or ceil of
// (in + pads - k) / s, plus one, less a ceil-mode window that would start past the input and its leading pad.
int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pe, bool ceil) {
  const double q = static_cast<double>(in + pb + pe - k) / static_cast<double>(s);
  int64_t o = static_cast<int64_t>(ceil ? std::ceil(q) : std::floor(q)) + 1;
  if (ceil && (o - 1) * s >= in + pb) --o;
  return o;
}

PoolGeom geom(const PoolCase& t) {
  PoolGeom g{t.n, t.c, t.h, t.w, t.kh, t.kw, t.sh, t.sw, t.ph, t.pw, 0, 0};
  g.pad_bottom = t.bh;
  g.pad_right = t.bw;
  g.count_pad = t.count_pad;
  g.oh = out_size(t.h, t.kh, t.sh, t.ph, g.pad_h_end(), t.ceil);
  g.ow = out_size(t.w, t.kw, t.sw, t.pw, g.pad_w_end(), t.ceil);
  return g;
}

const PoolCase kCases[] = {
    {4, 20, 24, 24, 2, 2, 2, 2, 0, 0},  // the CNN's first pooling
    {3, 2, 7, 9, 2, 2, 2, 2, 0, 0},     // odd sizes: the last row and column are dropped
    {2, 3, 7, 6, 3, 3, 2, 2, 1, 1},     // overlapping windows with padding
    {2, 2, 6, 7, 3, 2, 1, 2, 1, 0},     // stride 1, non-square
    {1, 2, 5, 5, 4, 4, 1, 1, 2, 2},     // padding 2
    {2, 1, 8, 8, 2, 2, 1, 1, 0, 0},
    // ONNX's geometries: asymmetric pads, ceil mode (a last window past the padded input; on a 5x5 input
    // with kernel 2, stride 2 and pads 1 a 4th window would start in the padding and is not taken), the
    // mean over the input elements only.
    {1, 2, 5, 5, 2, 2, 2, 2, 1, 1, -1, -1, true},
    {2, 2, 5, 5, 2, 2, 2, 2, 1, 1, -1, -1, true, false},
    {2, 2, 7, 6, 3, 3, 2, 2, 1, 0, 0, 1, true},
    {1, 3, 6, 7, 3, 2, 2, 3, 0, 1, 1, 0, false, false},
    {2, 1, 7, 9, 2, 2, 2, 2, 0, 0, -1, -1, true},  // odd sizes in ceil mode: the 2x2 windows past the input
    {1, 2, 8, 5, 4, 3, 3, 2, 2, 1, 1, 0, true, false},
};

std::string name(const PoolCase& t) {
  std::ostringstream o;
  o << t.h << "x" << t.w << " k" << t.kh << "x" << t.kw << " s" << t.sh << "," << t.sw << " p" << t.ph << "," << t.pw;
  if (t.bh >= 0 || t.bw >= 0) o << " end " << t.bh << "," << t.bw;
  if (t.ceil) o << " ceil";
  if (!t.count_pad) o << " pads not counted";
  return o.str();
}

// The average's divisor of a window: its positions inside the padded input, or inside the input.
double divisor(const PoolGeom& g, int64_t oh, int64_t ow) {
  int64_t count = 0;
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t ih = oh * g.stride_h - g.pad_h + i, iw = ow * g.stride_w - g.pad_w + j;
      const bool in = g.count_pad ? ih >= -g.pad_h && ih < g.h + g.pad_h_end() && iw >= -g.pad_w &&
                                        iw < g.w + g.pad_w_end()
                                  : ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      count += in;
    }
  return static_cast<double>(count);
}

// For each output element: its input plane offset and the in-bounds window positions in row-major order.
template <typename F>
void for_each_window(const PoolGeom& g, F f) {
  for (int64_t pl = 0; pl < g.n * g.c; ++pl)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        std::vector<int64_t> pos;
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t ih = oh * g.stride_h - g.pad_h + i, iw = ow * g.stride_w - g.pad_w + j;
            if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) pos.push_back(ih * g.w + iw);
          }
        f((pl * g.oh + oh) * g.ow + ow, pl * g.h * g.w, pos);
      }
}

TEST(CpuPool, MaxForwardAndBackward) {
  ThreadScope two(2);
  Generator gen(31);
  for (DType dt : float_types())
    for (const PoolCase& t : kCases) {
      PoolGeom g = geom(t);
      // Negative inputs: a padded zero would win if padding were allowed to.
      Tensor x = rand_tensor({g.n, g.c, g.h, g.w}, dt, gen, -2.0, -0.1);
      Tensor dy = rand_tensor({g.n, g.c, g.oh, g.ow}, dt, gen);
      auto vx = values(x), vdy = values(dy);
      std::vector<double> y(dy.numel()), idx(dy.numel()), dx(x.numel(), 0.0);
      for_each_window(g, [&](int64_t o, int64_t base, const std::vector<int64_t>& pos) {
        ASSERT_FALSE(pos.empty()) << name(t) << ": a window with no input element";
        int64_t best = pos[0];
        for (int64_t p : pos)
          if (vx[base + p] > vx[base + best]) best = p;
        y[o] = vx[base + best];
        idx[o] = static_cast<double>(best);
        dx[base + best] += vdy[o];
      });
      Tensor gy = Tensor::empty(dy.shape(), dt), gi = Tensor::empty(dy.shape(), DType::i32);
      cpu().max_pool2d_forward(x, g, gy, gi);
      const std::string what = std::string(dtype_name(dt)) + " " + name(t);
      expect_close(gy, y, Tol{0, 0}, "max pool " + what);
      expect_close(gi, idx, Tol{0, 0}, "max pool indices " + what);
      Tensor gdx = Tensor::full(x.shape(), 7.0, dt);
      cpu().max_pool2d_backward(dy, x, gy, gi, g, gdx);
      expect_close(gdx, dx, tol_for(dt), "max pool backward " + what);
    }
}

TEST(CpuPool, MaxTiesPickTheFirstMaximum) {
  for (const PoolCase& t : {PoolCase{1, 1, 4, 4, 2, 2, 2, 2, 0, 0}, PoolCase{1, 1, 4, 4, 3, 3, 1, 1, 1, 1}}) {
    PoolGeom g = geom(t);
    Tensor x = Tensor::ones({1, 1, 4, 4});
    Tensor y = Tensor::empty({1, 1, g.oh, g.ow}), idx = Tensor::empty({1, 1, g.oh, g.ow}, DType::i32);
    cpu().max_pool2d_forward(x, g, y, idx);
    auto got = idx.to_vector<int32_t>();
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        const int64_t ih = std::max<int64_t>(0, oh * g.stride_h - g.pad_h);
        const int64_t iw = std::max<int64_t>(0, ow * g.stride_w - g.pad_w);
        EXPECT_EQ(got[oh * g.ow + ow], ih * 4 + iw) << name(t) << " output " << oh << "," << ow;
      }
  }
}

TEST(CpuPool, MaxPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector<float>({1, nan, 3, 4}, {1, 1, 2, 2});
  PoolGeom g = geom({1, 1, 2, 2, 2, 2, 2, 2, 0, 0});
  Tensor y = Tensor::empty({1, 1, 1, 1}), idx = Tensor::empty({1, 1, 1, 1}, DType::i32);
  cpu().max_pool2d_forward(x, g, y, idx);
  EXPECT_TRUE(std::isnan(y.item<float>()));
  EXPECT_EQ(idx.item<int32_t>(), 1);
}

TEST(CpuPool, AvgForwardAndBackward) {
  ThreadScope two(2);
  Generator gen(32);
  for (DType dt : float_types())
    for (const PoolCase& t : kCases) {
      PoolGeom g = geom(t);
      Tensor x = rand_tensor({g.n, g.c, g.h, g.w}, dt, gen), dy = rand_tensor({g.n, g.c, g.oh, g.ow}, dt, gen);
      auto vx = values(x), vdy = values(dy);
      std::vector<double> y(dy.numel()), dx(x.numel(), 0.0);
      for_each_window(g, [&](int64_t o, int64_t base, const std::vector<int64_t>& pos) {
        const double area = divisor(g, o / g.ow % g.oh, o % g.ow);
        double s = 0;
        for (int64_t p : pos) s += vx[base + p];
        y[o] = s / area;
        for (int64_t p : pos) dx[base + p] += vdy[o] / area;
      });
      const std::string what = std::string(dtype_name(dt)) + " " + name(t);
      Tensor gy = Tensor::empty(dy.shape(), dt);
      cpu().avg_pool2d_forward(x, g, gy);
      expect_close(gy, y, tol_for(dt), "avg pool " + what);
      Tensor gdx = Tensor::full(x.shape(), 7.0, dt);
      cpu().avg_pool2d_backward(dy, g, gdx);
      expect_close(gdx, dx, tol_for(dt), "avg pool backward " + what);
    }
}

}  // namespace
}  // namespace tandem::testing
