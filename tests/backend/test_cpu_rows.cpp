// The softmax and layer-norm row kernels against double-precision references computed from the same
// inputs: f32 rows of every length class of the vectorised paths (shorter than a vector, whole vectors,
// vectors plus a tail, rows of many vectors), several rows per thread, and both thread counts.
#include <cmath>
#include <limits>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 128, 131, 256, 300};

// Softmax (log-softmax with log) of each row of v [n, c] of scale * v, entries from valid on masked out.
std::vector<double> softmax_ref(const std::vector<double>& v, int64_t n, int64_t c, bool log, double scale = 1.0,
                                bool causal = false) {
  std::vector<double> out(n * c);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t valid = causal ? std::min(c, i + 1) : c;
    double mx = -INFINITY, z = 0.0;
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, scale * v[i * c + j]);
    for (int64_t j = 0; j < valid; ++j) z += std::exp(scale * v[i * c + j] - mx);
    for (int64_t j = 0; j < c; ++j) {
      const double s = scale * v[i * c + j] - mx;
      out[i * c + j] = j >= valid ? (log ? -INFINITY : 0.0) : log ? s - std::log(z) : std::exp(s) / z;
    }
  }
  return out;
}

TEST(CpuRows, SoftmaxAndLogSoftmaxForwardAndBackward) {
  Generator gen(61);
  for (int threads : {1, 2}) {
    ThreadScope ts(threads);
    for (int64_t c : kLengths)
      // Every row's values within 87.3 of its maximum (the vector exp's range checks skipped), or not.
      for (double range : {30.0, 100.0})
        for (bool log : {false, true}) {
          const int64_t n = 37;
          Tensor x = rand_tensor({n, c}, DType::f32, gen, -range, range);  // wide: needs the maximum shifted out
          Tensor y = Tensor::empty({n, c}, DType::f32);
          cpu().softmax_forward(x, n, c, 1, log, y);
          const std::vector<double> want = softmax_ref(values(x), n, c, log);
          const std::string what = std::string(log ? "log_softmax" : "softmax") + " c=" + std::to_string(c) +
                                   " range " + std::to_string(static_cast<int>(range));
          expect_close(y, want, tol_for(DType::f32, log ? 5 : 1), what);

          Tensor dy = rand_tensor({n, c}, DType::f32, gen), dx = Tensor::empty({n, c}, DType::f32);
          cpu().softmax_backward(dy, y, n, c, 1, log, dx);
          const std::vector<double> vy = values(y), vdy = values(dy);
          std::vector<double> want_dx(n * c);
          for (int64_t i = 0; i < n; ++i) {
            double acc = 0.0;
            for (int64_t j = 0; j < c; ++j) acc += log ? vdy[i * c + j] : vdy[i * c + j] * vy[i * c + j];
            for (int64_t j = 0; j < c; ++j) {
              const int64_t k = i * c + j;
              want_dx[k] = log ? vdy[k] - std::exp(vy[k]) * acc : vy[k] * (vdy[k] - acc);
            }
          }
          expect_close(dx, want_dx, tol_for(DType::f32, 5), what + " backward");
          cpu().softmax_backward(dy, y, n, c, 1, log, dy);  // in place: dx is dy
          expect_close(dy, want_dx, tol_for(DType::f32, 5), what + " backward in place");
        }
  }
}

TEST(CpuRows, SoftmaxOfMaskedAndLargeEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t c : kLengths) {
    // Entries of -inf (masked scores) get probability 0 exactly; the second row is the first shifted by 1e4.
    std::vector<float> v(2 * c);
    for (int64_t j = 0; j < c; ++j) {
      v[j] = j % 3 == 1 ? -inf : std::sin(0.7f * static_cast<float>(j));
      v[c + j] = 1e4f + v[j];
    }
    if (c > 1) v[0] = v[c] = -inf;  // not the largest: the row's maximum is elsewhere
    Tensor x = Tensor::from_vector(v, {2, c}), y = Tensor::empty({2, c}, DType::f32);
    cpu().softmax_forward(x, 2, c, 1, false, y);
    const std::vector<double> got = values(y);
    const std::vector<double> want = softmax_ref(std::vector<double>(v.begin(), v.end()), 2, c, false);
    expect_close(got, want, tol_for(DType::f32, 2), "masked softmax c=" + std::to_string(c));
    for (int64_t j = 0; j < 2 * c; ++j)
      if (std::isinf(v[j])) {
        EXPECT_EQ(got[j], 0.0) << "c=" << c << " element " << j;
      }
  }
}

TEST(CpuRows, AttentionSoftmaxScaledAndCausal) {
  Generator gen(62);
  for (int64_t tk : {5, 8, 17, 64, 100})
    for (bool causal : {false, true}) {
      const int64_t batch = 3, tq = tk;
      Tensor s = rand_tensor({batch, tq, tk}, DType::f32, gen, -20.0, 20.0);
      Tensor y = Tensor::empty(s.shape(), DType::f32);
      cpu().attention_softmax(s, batch, tq, tk, 0.125, causal, y);
      std::vector<double> want;
      const std::vector<double> vs = values(s);
      for (int64_t b = 0; b < batch; ++b) {
        const std::vector<double> part(vs.begin() + b * tq * tk, vs.begin() + (b + 1) * tq * tk);
        const std::vector<double> w = softmax_ref(part, tq, tk, false, 0.125, causal);
        want.insert(want.end(), w.begin(), w.end());
      }
      expect_close(y, want, tol_for(DType::f32), "attention softmax tk=" + std::to_string(tk));
      cpu().attention_softmax(s, batch, tq, tk, 0.125, causal, s);  // in place: y is s
      expect_close(s, want, tol_for(DType::f32), "attention softmax in place tk=" + std::to_string(tk));
    }
}

TEST(CpuRows, LayerNormAndRmsNormForwardAndBackward) {
  Generator gen(63);
  const double eps = 1e-5;
  for (int threads : {1, 2}) {
    ThreadScope ts(threads);
    for (int64_t c : kLengths)
      for (int64_t n : {1, 5, 64, 130})  // parameter gradients summed per 64 rows: one block, several, a part
        for (bool rms : {false, true})
          for (bool affine : {true, false}) {
            Tensor x = rand_tensor({n, c}, DType::f32, gen, 1.0, 4.0);  // nonzero mean
            Tensor w = affine ? rand_tensor({c}, DType::f32, gen, 0.5, 1.5) : Tensor();
            Tensor b = affine && !rms ? rand_tensor({c}, DType::f32, gen) : Tensor();
            Tensor y = Tensor::empty({n, c}, DType::f32), rstd = Tensor::empty({n}, DType::f32);
            Tensor mean = rms ? Tensor() : Tensor::empty({n}, DType::f32);
            cpu().layer_norm_forward(x, w, b, n, c, eps, rms, y, mean, rstd);

            const std::vector<double> vx = values(x);
            const std::vector<double> vw = affine ? values(w) : std::vector<double>(c, 1.0);
            const std::vector<double> vb = b.defined() ? values(b) : std::vector<double>(c, 0.0);
            std::vector<double> mu(n, 0.0), r(n), xhat(n * c), want_y(n * c);
            for (int64_t i = 0; i < n; ++i) {
              double ss = 0.0;
              if (!rms)
                for (int64_t j = 0; j < c; ++j) mu[i] += vx[i * c + j] / c;
              for (int64_t j = 0; j < c; ++j) ss += (vx[i * c + j] - mu[i]) * (vx[i * c + j] - mu[i]);
              r[i] = 1.0 / std::sqrt(ss / c + eps);
              for (int64_t j = 0; j < c; ++j) {
                xhat[i * c + j] = (vx[i * c + j] - mu[i]) * r[i];
                want_y[i * c + j] = xhat[i * c + j] * vw[j] + vb[j];
              }
            }
            const std::string what = std::string(rms ? "rms_norm" : "layer_norm") + (affine ? " affine" : "") +
                                     " n=" + std::to_string(n) + " c=" + std::to_string(c);
            // c = 1 without RMS: x - mean is rounding noise that rstd (1 / sqrt(eps)) magnifies.
            const bool one = c == 1 && !rms;
            expect_close(y, want_y, one ? Tol{0, 2e-2} : tol_for(DType::f32, 5), what);
            expect_close(rstd, r, tol_for(DType::f32, 5), what + " rstd");
            if (!rms) expect_close(mean, mu, tol_for(DType::f32, 5), what + " mean");

            Tensor dy = rand_tensor({n, c}, DType::f32, gen), dx = Tensor::empty({n, c}, DType::f32);
            Tensor dw = affine ? Tensor::empty({c}, DType::f32) : Tensor();
            Tensor db = b.defined() ? Tensor::empty({c}, DType::f32) : Tensor();
            Tensor dx_sums = Tensor::empty({c}, DType::f32);
            EXPECT_TRUE(cpu().layer_norm_backward(dy, x, w, mean, rstd, n, c, rms, dx, dw, db, dx_sums)) << what;
            const std::vector<double> vdy = values(dy);
            std::vector<double> want_dx(n * c), want_dw(c, 0.0), want_db(c, 0.0);
            for (int64_t i = 0; i < n; ++i) {
              double m1 = 0.0, m2 = 0.0;
              for (int64_t j = 0; j < c; ++j) {
                const double gw = vdy[i * c + j] * vw[j];
                m1 += rms ? 0.0 : gw / c;
                m2 += gw * xhat[i * c + j] / c;
                want_dw[j] += vdy[i * c + j] * xhat[i * c + j];
                want_db[j] += vdy[i * c + j];
              }
              for (int64_t j = 0; j < c; ++j)
                want_dx[i * c + j] = r[i] * (vdy[i * c + j] * vw[j] - m1 - xhat[i * c + j] * m2);
            }
            if (!one) expect_close(dx, want_dx, tol_for(DType::f32, 50), what + " dx");
            if (dw.defined() && !one) expect_close(dw, want_dw, tol_for(DType::f32, 50), what + " dw");
            if (db.defined()) expect_close(db, want_db, tol_for(DType::f32, 50), what + " db");
            // The column sums of dx as stored, and of dx added into a gradient already there.
            const std::vector<double> vdx = values(dx);
            auto column_sums = [&](const std::vector<double>& v) {
              std::vector<double> out(c, 0.0);
              for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < c; ++j) out[j] += v[i * c + j];
              return out;
            };
            expect_close(dx_sums, column_sums(vdx), tol_for(DType::f32, 50), what + " dx column sums");
            Tensor acc = rand_tensor({n, c}, DType::f32, gen), acc_sums = Tensor::empty({c}, DType::f32);
            std::vector<double> want_acc = values(acc);
            for (int64_t e = 0; e < n * c; ++e) want_acc[e] += vdx[e];
            Tensor dw3 = affine ? Tensor::empty({c}, DType::f32) : Tensor(), db3;
            EXPECT_TRUE(cpu().layer_norm_backward_add(dy, x, w, mean, rstd, n, c, rms, acc, dw3, db3, acc_sums)) << what;
            if (!one) {
              expect_close(acc, want_acc, tol_for(DType::f32, 50), what + " dx added");
            }
            expect_close(acc_sums, column_sums(values(acc)), tol_for(DType::f32, 50), what + " added column sums");
            if (dw3.defined()) {
              EXPECT_EQ(values(dw3), values(dw)) << what;
            }

            if (!affine) continue;
            // The parameters' gradients without dx, then dx alone: the same values.
            Tensor none, dw2 = Tensor::empty({c}, DType::f32), dx2 = Tensor::empty({n, c}, DType::f32), none2, none_sums;
            cpu().layer_norm_backward(dy, x, w, mean, rstd, n, c, rms, none, dw2, none2, none_sums);
            EXPECT_EQ(values(dw2), values(dw)) << what;
            cpu().layer_norm_backward(dy, x, w, mean, rstd, n, c, rms, dx2, none, none2, none_sums);
            EXPECT_EQ(values(dx2), values(dx)) << what;
          }
  }
}

}  // namespace
}  // namespace tandem::testing
