#pragma once
// Shared helpers of the CUDA tests: inputs are made on the CPU, copied up, and what the GPU computes
// is compared with what the CPU backend computes from the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tandem/device.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem::cudatest {

inline Device gpu() { return Device::cuda(0); }
inline backend::Backend& cpu_be() { return backend::cpu_backend(); }
inline backend::Backend& gpu_be() { return backend::backend_for(gpu()); }

/// A CPU f32 tensor of uniform values in [lo, hi), reproducible from the seed.
inline Tensor rand_cpu(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  return Tensor::uniform(shape, lo, hi, g);
}

/// Every element as double, on the host.
inline std::vector<double> host_values(const Tensor& t) { return t.cpu().to_vector<double>(); }

/// Expects |actual - expected| <= atol + rtol * |expected| for every element; equal values (infinities of
/// one sign included) and NaN against NaN pass.
inline void expect_close(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  const std::vector<double> e = host_values(expected), a = host_values(actual);
  int64_t bad = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double tol = atol + rtol * std::fabs(e[i]);
    if (!(e[i] == a[i]) && !(std::fabs(e[i] - a[i]) <= tol) && !(std::isnan(e[i]) && std::isnan(a[i]))) {
      if (bad < 5) ADD_FAILURE() << what << ": element " << i << " expected " << e[i] << ", got " << a[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << e.size() << " elements differ";
}

/// Expects ||actual - expected||_2 <= rel * ||expected||_2 (for GEMM and convolution, whose
/// summation order differs between devices).
inline void expect_norm_close(const Tensor& expected, const Tensor& actual, double rel, const std::string& what) {
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  const std::vector<double> e = host_values(expected), a = host_values(actual);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < e.size(); ++i) {
    diff += (e[i] - a[i]) * (e[i] - a[i]);
    norm += e[i] * e[i];
  }
  EXPECT_TRUE(std::isfinite(diff)) << what;
  EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm) + 1e-30) << what << ": relative error "
                                                            << std::sqrt(diff) / std::sqrt(norm);
}

/// Expects both tensors to hold the same bytes (same dtype and shape).
inline void expect_same_bytes(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  Tensor e = expected.cpu().contiguous(), a = actual.cpu().contiguous();
  const size_t elem = dtype_size(e.dtype());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  int64_t bad = 0;
  for (int64_t i = 0; i < e.numel(); ++i) {
    if (std::memcmp(pe + i * elem, pa + i * elem, elem) != 0) {
      if (bad < 5) ADD_FAILURE() << what << ": element " << i << " differs in its bytes";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << e.numel() << " elements differ";
}

/// The L2 norm of (got - ref) over the L2 norm of ref.
inline double rel_error(const Tensor& ref, const Tensor& got) {
  const std::vector<double> e = host_values(ref), a = host_values(got);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < e.size(); ++i) {
    diff += (e[i] - a[i]) * (e[i] - a[i]);
    norm += e[i] * e[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace tandem::cudatest
