// Softmax cross-entropy and classification metrics against double-precision references.
#include <cmath>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

Tensor labels_of(const std::vector<int64_t>& v, DType dt) { return Tensor::from_vector(v, {int64_t(v.size())}).to(dt); }

TEST(CpuSoftmaxXent, ForwardAndBackward) {
  Generator gen(51);
  for (DType dt : float_types())
    for (DType lt : {DType::i32, DType::i64})
      for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {4, 10}, {64, 10}, {7, 1000}}) {
        Tensor logits = rand_tensor({n, c}, dt, gen, -30.0, 30.0);  // wide range: needs the max shift
        std::vector<int64_t> lab(n);
        for (int64_t i = 0; i < n; ++i) lab[i] = (i * 7 + 3) % c;
        Tensor labels = labels_of(lab, lt);
        Tensor loss = Tensor::empty({}, dt), probs = Tensor::empty({n, c}, dt);
        cpu().softmax_xent_forward(logits, labels, loss, probs);

        auto vx = values(logits);
        std::vector<double> want_p(n * c);
        double want_loss = 0;
        for (int64_t i = 0; i < n; ++i) {
          double mx = vx[i * c];
          for (int64_t j = 0; j < c; ++j) mx = std::max(mx, vx[i * c + j]);
          double z = 0;
          for (int64_t j = 0; j < c; ++j) z += std::exp(vx[i * c + j] - mx);
          for (int64_t j = 0; j < c; ++j) want_p[i * c + j] = std::exp(vx[i * c + j] - mx) / z;
          want_loss += (std::log(z) + mx - vx[i * c + lab[i]]) / n;
        }
        const Tol tol = tol_for(dt, 5);
        expect_close(probs, want_p, tol, "probs");
        EXPECT_NEAR(loss.item<double>(), want_loss, tol.atol + tol.rtol * std::abs(want_loss));

        Tensor dloss = Tensor::full({}, 2.5, dt), dlogits = Tensor::empty({n, c}, dt);
        cpu().softmax_xent_backward(probs, labels, dloss, dlogits);
        std::vector<double> want_d(n * c);
        auto vp = values(probs);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < c; ++j) want_d[i * c + j] = (vp[i * c + j] - (j == lab[i] ? 1.0 : 0.0)) * 2.5 / n;
        expect_close(dlogits, want_d, tol, "dlogits");
      }
}

TEST(CpuSoftmaxXent, LabelOutOfRangeNamesLabelRowAndClasses) {
  for (DType lt : {DType::i32, DType::i64})
    for (int64_t bad : {int64_t(10), int64_t(-1)}) {
      Tensor logits = Tensor::zeros({3, 10});
      Tensor labels = labels_of({1, bad, 2}, lt);
      Tensor loss = Tensor::empty({}), probs = Tensor::empty({3, 10});
      try {
        cpu().softmax_xent_forward(logits, labels, loss, probs);
        FAIL() << "label " << bad << " accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.kind(), Error::Kind::Input);
        EXPECT_NE(msg.find("label " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
        EXPECT_NE(msg.find("10"), std::string::npos) << msg;
      }
      Tensor dl = Tensor::ones({}), d = Tensor::empty({3, 10});
      EXPECT_THROW(cpu().softmax_xent_backward(probs, labels, dl, d), Error);
      Tensor count = Tensor::empty({}, DType::i64);
      EXPECT_THROW(cpu().count_correct(logits, labels, count), Error);
    }
}

// Targets [n, c]: rows of non-negative weights (one-hot, a distribution or neither), a class of
// target 0 adding nothing to the loss even where its logit is -inf.
TEST(CpuSoftmaxXent, TargetsForwardAndBackward) {
  Generator gen(53);
  for (DType dt : float_types())
    for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {4, 10}, {64, 10}, {7, 1000}}) {
      Tensor logits = rand_tensor({n, c}, dt, gen, -30.0, 30.0);
      std::vector<double> tv = values(rand_tensor({n, c}, dt, gen, 0.0, 1.0));
      for (int64_t i = 0; i < n; i += 3)  // every third row one-hot
        for (int64_t j = 0; j < c; ++j) tv[i * c + j] = j == (i * 7 + 3) % c ? 1.0 : 0.0;
      if (c > 1) {
        std::vector<double> vx = values(logits);
        vx[1] = -INFINITY;  // row 0 is one-hot at class 3 % c
        tv[1] = 0.0;
        logits = Tensor::from_vector(vx, {n, c}).to(dt);
      }
      Tensor targets = Tensor::from_vector(tv, {n, c}).to(dt);
      tv = values(targets);  // as rounded to dt
      Tensor loss = Tensor::empty({}, dt), probs = Tensor::empty({n, c}, dt);
      cpu().softmax_xent_targets_forward(logits, targets, loss, probs);

      auto vx = values(logits);
      std::vector<double> want_p(n * c), row_sum(n, 0.0);
      double want_loss = 0;
      for (int64_t i = 0; i < n; ++i) {
        double mx = vx[i * c];
        for (int64_t j = 0; j < c; ++j) mx = std::max(mx, vx[i * c + j]);
        double z = 0;
        for (int64_t j = 0; j < c; ++j) z += std::exp(vx[i * c + j] - mx);
        for (int64_t j = 0; j < c; ++j) {
          want_p[i * c + j] = std::exp(vx[i * c + j] - mx) / z;
          row_sum[i] += tv[i * c + j];
          if (tv[i * c + j] != 0.0) want_loss += tv[i * c + j] * (std::log(z) + mx - vx[i * c + j]) / n;
        }
      }
      const Tol tol = tol_for(dt, 5);
      expect_close(probs, want_p, tol, "probs");
      ASSERT_TRUE(std::isfinite(loss.item<double>()));
      EXPECT_NEAR(loss.item<double>(), want_loss, tol.atol + tol.rtol * std::abs(want_loss));

      Tensor dloss = Tensor::full({}, 2.5, dt), dlogits = Tensor::empty({n, c}, dt);
      cpu().softmax_xent_targets_backward(probs, targets, dloss, dlogits);
      std::vector<double> want_d(n * c);
      auto vp = values(probs);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < c; ++j) want_d[i * c + j] = (vp[i * c + j] * row_sum[i] - tv[i * c + j]) * 2.5 / n;
      expect_close(dlogits, want_d, tol, "dlogits");
    }
}

TEST(CpuMetrics, ArgmaxTakesTheFirstMaximum) {
  Tensor x = Tensor::from_vector<float>({1, 3, 3, 0,  //
                                         5, 5, 5, 5,  //
                                         -1, -2, -3, -0.5f},
                                        {3, 4});
  Tensor out = Tensor::empty({3}, DType::i64);
  cpu().argmax_rows(x, out);
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 3}));
}

TEST(CpuMetrics, ArgmaxAndCountCorrectOnRandomRows) {
  Generator gen(52);
  for (DType dt : float_types()) {
    const int64_t n = 5000, c = 13;  // enough rows to run on several threads
    Tensor x = rand_tensor({n, c}, dt, gen);
    auto v = values(x);
    std::vector<int64_t> want(n), lab(n);
    int64_t hits = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t b = 0;
      for (int64_t j = 1; j < c; ++j)
        if (v[i * c + j] > v[i * c + b]) b = j;
      want[i] = b;
      lab[i] = (i % 3 == 0) ? b : (b + 1) % c;
      hits += lab[i] == b;
    }
    Tensor out = Tensor::empty({n}, DType::i64);
    cpu().argmax_rows(x, out);
    EXPECT_EQ(out.to_vector<int64_t>(), want);
    for (DType lt : {DType::i32, DType::i64}) {
      Tensor count = Tensor::empty({}, DType::i64);
      cpu().count_correct(x, labels_of(lab, lt), count);
      EXPECT_EQ(count.item<int64_t>(), hits);
    }
  }
}

}  // namespace
}  // namespace tandem::testing
