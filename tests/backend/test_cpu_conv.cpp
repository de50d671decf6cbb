// Convolution kernels against direct double-precision loops over many geometries.
#include <sstream>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

using backend::ConvGeom;

struct ConvCase {
  int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
  int64_t groups = 1;
};

ConvGeom geom(const ConvCase& t) {
  ConvGeom g{t.n, t.c, t.h, t.w, t.k, t.r, t.s, t.sh, t.sw, t.ph, t.pw, 0, 0};
  g.groups = t.groups;
  g.oh = (t.h + 2 * t.ph - t.r) / t.sh + 1;
  g.ow = (t.w + 2 * t.pw - t.s) / t.sw + 1;
  return g;
}

std::string name(const ConvCase& t) {
  std::ostringstream o;
  o << "n" << t.n << " c" << t.c << " " << t.h << "x" << t.w << " k" << t.k << " " << t.r << "x" << t.s << " stride "
    << t.sh << "," << t.sw << " pad " << t.ph << "," << t.pw;
  if (t.groups > 1) o << " groups " << t.groups;
  return o.str();
}

// Calls f(y index, x index, w index, k) for every (output, tap) pair that reads a real input element.
// Filter k of a grouped convolution sees the input channels of its group only.
template <typename F>
void for_each_tap(const ConvGeom& g, F f) {
  const int64_t cg = g.group_c(), kg = g.k / g.groups;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t oh = 0; oh < g.oh; ++oh)
        for (int64_t ow = 0; ow < g.ow; ++ow)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < g.r; ++r)
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t ih = oh * g.stride_h - g.pad_h + r, iw = ow * g.stride_w - g.pad_w + s;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const int64_t ic = (k / kg) * cg + c;
                f(((n * g.k + k) * g.oh + oh) * g.ow + ow, ((n * g.c + ic) * g.h + ih) * g.w + iw,
                  ((k * cg + c) * g.r + r) * g.s + s, k);
              }
}

const ConvCase kCases[] = {
    {2, 1, 28, 28, 20, 5, 5, 1, 1, 0, 0},  // the CNN's first layer (smaller batch)
    {3, 20, 12, 12, 50, 5, 5, 1, 1, 0, 0},  // its second layer
    {1, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},      // one image: each GEMM split instead of the images
    {5, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},
    {4, 2, 11, 10, 3, 3, 2, 2, 2, 0, 0},    // stride 2, non-square kernel
    {3, 4, 9, 8, 5, 2, 3, 2, 1, 2, 1},      // mixed strides and paddings
    {2, 3, 6, 5, 2, 5, 3, 1, 2, 2, 2},      // padding 2
    {3, 5, 5, 6, 7, 1, 1, 1, 1, 0, 0},      // pointwise: the input is its own im2col
    {2, 5, 5, 6, 3, 1, 1, 2, 2, 1, 0},      // 1x1 with stride and padding
    {2, 2, 4, 4, 3, 4, 4, 1, 1, 0, 0},      // kernel as large as the input
    {3, 2, 3, 3, 2, 3, 3, 3, 3, 2, 2},      // stride larger than the overlap
    {3, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1, 2},   // two groups
    {5, 6, 8, 7, 6, 3, 2, 2, 1, 1, 0, 6},   // depthwise, stride 2 by 1
    {2, 3, 6, 6, 6, 5, 5, 1, 1, 2, 2, 3},   // depthwise with two filters per channel
    {1, 4, 5, 5, 8, 3, 3, 1, 1, 1, 1, 4},   // one image, grouped: each GEMM split
    {3, 6, 5, 4, 4, 1, 1, 1, 1, 0, 0, 2},   // grouped pointwise: each group's slice its own im2col
};

TEST(CpuConv, ForwardMatchesReference) {
  ThreadScope two(2);
  Generator gen(21);
  for (DType dt : float_types())
    for (const ConvCase& t : kCases)
      for (bool with_bias : {false, true}) {
        ConvGeom g = geom(t);
        Tensor x = rand_tensor({g.n, g.c, g.h, g.w}, dt, gen), w = rand_tensor({g.k, g.group_c(), g.r, g.s}, dt, gen);
        Tensor b = with_bias ? rand_tensor({g.k}, dt, gen) : Tensor();
        auto vx = values(x), vw = values(w);
        std::vector<double> want(g.n * g.k * g.oh * g.ow, 0.0);
        for_each_tap(g, [&](int64_t yi, int64_t xi, int64_t wi, int64_t) { want[yi] += vx[xi] * vw[wi]; });
        if (with_bias) {
          auto vb = values(b);
          for (size_t i = 0; i < want.size(); ++i) want[i] += vb[(i / (g.oh * g.ow)) % g.k];
        }
        Tensor y = Tensor::empty({g.n, g.k, g.oh, g.ow}, dt);
        cpu().conv2d_forward(x, w, b, g, y);
        expect_close(y, want, tol_for(dt, 5), std::string("conv forward ") + dtype_name(dt) + " " + name(t));
      }
}

TEST(CpuConv, BackwardMatchesReference) {
  ThreadScope two(2);
  Generator gen(22);
  for (DType dt : float_types())
    for (const ConvCase& t : kCases) {
      ConvGeom g = geom(t);
      Tensor x = rand_tensor({g.n, g.c, g.h, g.w}, dt, gen), w = rand_tensor({g.k, g.group_c(), g.r, g.s}, dt, gen);
      Tensor dy = rand_tensor({g.n, g.k, g.oh, g.ow}, dt, gen);
      auto vx = values(x), vw = values(w), vdy = values(dy);
      std::vector<double> dx(x.numel(), 0.0), dw(w.numel(), 0.0), db(g.k, 0.0);
      for_each_tap(g, [&](int64_t yi, int64_t xi, int64_t wi, int64_t) {
        dx[xi] += vdy[yi] * vw[wi];
        dw[wi] += vdy[yi] * vx[xi];
      });
      for (size_t i = 0; i < vdy.size(); ++i) db[(i / (g.oh * g.ow)) % g.k] += vdy[i];
      const std::string what = std::string(dtype_name(dt)) + " " + name(t);

      Tensor gdx = Tensor::full({g.n, g.c, g.h, g.w}, 123.0, dt);  // stale values must be overwritten
      cpu().conv2d_backward_data(dy, w, g, gdx);
      expect_close(gdx, dx, tol_for(dt, 5), "conv backward data " + what);

      Tensor gdw = Tensor::full({g.k, g.group_c(), g.r, g.s}, 123.0, dt), gdb = Tensor::full({g.k}, 123.0, dt);
      cpu().conv2d_backward_weight(dy, x, g, gdw, gdb);
      expect_close(gdw, dw, tol_for(dt, 20), "conv backward weight " + what);
      expect_close(gdb, db, tol_for(dt, 20), "conv backward bias " + what);

      Tensor none, only_w = Tensor::empty({g.k, g.group_c(), g.r, g.s}, dt), only_b = Tensor::empty({g.k}, dt);
      cpu().conv2d_backward_weight(dy, x, g, only_w, none);
      expect_close(only_w, dw, tol_for(dt, 20), "conv backward weight without bias " + what);
      cpu().conv2d_backward_weight(dy, Tensor(), g, none, only_b);  // no input needed for the bias alone
      expect_close(only_b, db, tol_for(dt, 20), "conv backward bias alone " + what);
    }
}

// The same convolution on one, two and four threads gives bitwise the same results: per-image GEMMs
// do not depend on the thread count, and the weight gradient sums fixed chunks of images in order.
TEST(CpuConv, ThreadCountDoesNotChangeResults) {
  Generator gen(23);
  const ConvCase cases[] = {{6, 3, 10, 10, 4, 3, 3, 1, 1, 1, 1}, {6, 4, 10, 10, 8, 3, 3, 1, 1, 1, 1, 4}};
  for (const ConvCase& t : cases) {
    ConvGeom g = geom(t);
    Tensor x = rand_tensor({g.n, g.c, g.h, g.w}, DType::f32, gen);
    Tensor w = rand_tensor({g.k, g.group_c(), g.r, g.s}, DType::f32, gen);
    Tensor dy = rand_tensor({g.n, g.k, g.oh, g.ow}, DType::f32, gen), b = rand_tensor({g.k}, DType::f32, gen);
    std::vector<float> ref[4];
    for (int threads : {1, 2, 4}) {
      ThreadScope scope(threads);
      Tensor y = Tensor::empty({g.n, g.k, g.oh, g.ow}), dx = Tensor::empty(x.shape());
      Tensor dw = Tensor::empty(w.shape()), db = Tensor::empty({g.k});
      cpu().conv2d_forward(x, w, b, g, y);
      cpu().conv2d_backward_data(dy, w, g, dx);
      cpu().conv2d_backward_weight(dy, x, g, dw, db);
      std::vector<float> got[4] = {y.to_vector<float>(), dx.to_vector<float>(), dw.to_vector<float>(),
                                   db.to_vector<float>()};
      for (int i = 0; i < 4; ++i) {
        if (threads == 1)
          ref[i] = got[i];
        else
          EXPECT_EQ(got[i], ref[i]) << "output " << i << " on " << threads << " threads, " << name(t);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing
