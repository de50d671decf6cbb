#pragma once
// Shared helpers for the CPU kernel tests: random inputs, conversions and element comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem::testing {

/// The CPU backend under test.
inline backend::Backend& cpu() { return backend::cpu_backend(); }

/// Uniform random tensor in [lo, hi).
inline Tensor rand_tensor(const Shape& shape, DType dt, Generator& gen, double lo = -1.0, double hi = 1.0) {
  return Tensor::uniform(shape, lo, hi, gen, dt);
}

/// All elements as doubles.
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

/// Tolerances that suit the precision of dt: tight for f64, loose for f32.
struct Tol {
  double rtol, atol;
};
inline Tol tol_for(DType dt, double scale = 1.0) {
  return dt == DType::f64 ? Tol{1e-11 * scale, 1e-11 * scale} : Tol{2e-5 * scale, 2e-5 * scale};
}

/// Asserts |got - want| <= atol + rtol * |want| everywhere, naming the first element that is not.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, Tol tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= tol.atol + tol.rtol * std::abs(want[i])) || std::isnan(got[i]) != std::isnan(want[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i] << " (error " << err
                    << ")";
      return;
    }
  }
}

inline void expect_close(const Tensor& got, const std::vector<double>& want, Tol tol, const std::string& what) {
  expect_close(values(got), want, tol, what);
}

/// The float types the compute kernels take.
inline const std::vector<DType>& float_types() {
  static const std::vector<DType> t{DType::f32, DType::f64};
  return t;
}

/// Runs the test body under a given thread count and restores the previous count afterwards.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : prev_(num_threads()) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(prev_); }

 private:
  int prev_;
};

}  // namespace tandem::testing
