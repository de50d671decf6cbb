// A rank of a DistOpt test job: joins through init_communicator and runs the named scenarios (a
// comma-separated list). Every expected value is computed here from the rank numbers, independently
// of the code under test. Each scenario ends with "rank R: NAME ok" or "rank R: NAME FAILED"; the exit
// status is 0 only when every check held.
//
//   distopt_worker SCENARIO[,SCENARIO...] [--device cpu|cuda] [--timeout SECONDS]
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "tandem/distributed/bootstrap.h"
#include "tandem/ops.h"
#include "worker_util.h"

namespace distopt_worker {

Device g_device = Device::cpu();
int g_failures = 0;

std::string strf(const char* fmt, ...) {
  va_list a;
  va_start(a, fmt);
  va_list b;
  va_copy(b, a);
  int n = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  std::string s(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(s.data(), s.size(), fmt, b);
  va_end(b);
  s.resize(static_cast<size_t>(std::max(n, 0)));
  return s;
}

void report_failure(const char* file, int line, const std::string& what) {
  ++g_failures;
  const char* base = std::strrchr(file, '/');
  std::fprintf(stderr, "FAILED %s:%d: %s\n", base ? base + 1 : file, line, what.c_str());
}

dist::DistOptOptions small_buckets() {
  dist::DistOptOptions o;
  o.bucket_bytes = 1024;
  o.first_bucket_bytes = 1024;
  return o;
}

Fixture make_fixture(const std::shared_ptr<dist::Communicator>& comm, const std::vector<int64_t>& sizes,
                     const dist::DistOptOptions& options) {
  Fixture f;
  f.sizes = sizes;
  for (int64_t n : sizes) f.params.push_back(Tensor::zeros({n}, DType::f32, g_device).requires_grad_());
  optim::SgdOptions so;
  so.lr = 1.0;
  f.sgd = std::make_shared<optim::SGD>(f.params, so);
  f.opt = std::make_unique<dist::DistOpt>(f.sgd, comm, options);
  return f;
}

Tensor device_tensor(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape).to(g_device);
}

Tensor known_loss(const std::vector<Tensor>& ps, int rank, const GradFn& g, bool reversed) {
  Tensor loss;
  for (size_t n = 0; n < ps.size(); ++n) {
    size_t i = reversed ? ps.size() - 1 - n : n;
    std::vector<float> c(static_cast<size_t>(ps[i].numel()));
    for (size_t j = 0; j < c.size(); ++j) c[j] = g(rank, i, static_cast<int64_t>(j));
    Tensor term = sum(mul(ps[i], device_tensor(c, ps[i].shape())));
    loss = loss.defined() ? add(loss, term) : term;
  }
  return loss;
}

Values host_values(const std::vector<Tensor>& ps) {
  Values out;
  for (const Tensor& p : ps) {
    std::vector<float> v = p.detach().cpu().to_vector<float>();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

Change measure_change(Fixture& f, const std::function<void()>& run) {
  Values before = host_values(f.params);
  run();
  Values after = host_values(f.params);
  Change c;
  for (size_t i = 0; i < before.size(); ++i) {
    c.drop.emplace_back(before[i].size());
    c.rounding.emplace_back(before[i].size());
    for (size_t j = 0; j < before[i].size(); ++j) {
      c.drop[i][j] = before[i][j] - after[i][j];
      // p - g in f32 is off by at most half an ulp of the result.
      c.rounding[i][j] = kF32Eps * (std::fabs(before[i][j]) + std::fabs(after[i][j]));
    }
  }
  return c;
}

Values tabulate(const std::vector<int64_t>& sizes, const std::function<double(size_t, int64_t)>& f) {
  Values out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.emplace_back(static_cast<size_t>(sizes[i]));
    for (int64_t j = 0; j < sizes[i]; ++j) out[i][static_cast<size_t>(j)] = f(i, j);
  }
  return out;
}

Contrib as_contrib(const GradFn& g) {
  return [g](int r, size_t i, int64_t j) { return static_cast<double>(g(r, i, j)); };
}

Expect average(int W, const std::vector<int64_t>& sizes, const Contrib& contrib, double unit, double floor) {
  Expect e;
  e.value = tabulate(sizes, [&](size_t i, int64_t j) {
    double s = 0;
    for (int r = 0; r < W; ++r) s += contrib(r, i, j);
    return s / W;
  });
  e.tol = tabulate(sizes, [&](size_t i, int64_t j) {
    double s = 0;
    for (int r = 0; r < W; ++r) s += std::fabs(contrib(r, i, j));
    return unit * s + floor;
  });
  return e;
}

bool expect_near(const std::string& what, const Values& got, const Values& expected, const Values& tol,
                 const Values* rounding) {
  int bad = 0;
  int64_t total_bad = 0;
  if (got.size() != expected.size()) {
    CHECK_OR_REPORT(false, "%s: %zu parameters, expected %zu", what.c_str(), got.size(), expected.size());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != expected[i].size()) {
      CHECK_OR_REPORT(false, "%s: parameter %zu has %zu values, expected %zu", what.c_str(), i, got[i].size(),
                      expected[i].size());
      return false;
    }
    for (size_t j = 0; j < got[i].size(); ++j) {
      double t = tol[i][j] + (rounding ? (*rounding)[i][j] : 0.0);
      if (std::isfinite(got[i][j]) && std::fabs(got[i][j] - expected[i][j]) <= t) continue;
      ++total_bad;
      if (bad++ < 5)
        CHECK_OR_REPORT(false, "%s: parameter %zu element %zu is %.9g, expected %.9g (tolerance %.3g)", what.c_str(),
                        i, j, got[i][j], expected[i][j], t);
    }
  }
  if (total_bad > 5) std::fprintf(stderr, "  ... %lld mismatches in all\n", static_cast<long long>(total_bad));
  return total_bad == 0;
}

// Largest |a - b| over the tensor relative to the largest |b|, per parameter; reports above `rel`.
void expect_close_models(const std::string& what, const Values& got, const Values& ref, double rel) {
  double largest = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double worst = 0, scale = 0;
    for (size_t j = 0; j < ref[i].size(); ++j) {
      worst = std::max(worst, std::fabs(got[i][j] - ref[i][j]));
      scale = std::max(scale, std::fabs(ref[i][j]));
    }
    CHECK_OR_REPORT(worst <= rel * scale, "%s: parameter %zu differs by %.3g relative (allowed %.3g)", what.c_str(), i,
                    scale > 0 ? worst / scale : worst, rel);
    largest = std::max(largest, scale > 0 ? worst / scale : worst);
  }
  std::printf("%s: largest relative difference %.3g (allowed %.3g)\n", what.c_str(), largest, rel);
}

void expect_error(const std::string& what, int rank, const std::function<void()>& f,
                  const std::vector<std::string>& mentions) {
  std::string msg;
  try {
    f();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  CHECK_OR_REPORT(!msg.empty(), "%s: no error on rank %d", what.c_str(), rank);
  if (msg.empty()) return;
  std::printf("rank %d: %s: %s\n", rank, what.c_str(), msg.c_str());
  for (const std::string& m : mentions)
    CHECK_OR_REPORT(msg.find(m) != std::string::npos, "%s: the error does not mention '%s': %s", what.c_str(),
                    m.c_str(), msg.c_str());
}

}  // namespace distopt_worker

using namespace distopt_worker;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: distopt_worker SCENARIO[,SCENARIO...] [--device cpu|cuda] [--timeout SECONDS]\n");
    return 2;
  }
  std::chrono::milliseconds timeout{60000};
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) g_device = Device::parse(argv[i + 1]);
    if (std::strcmp(argv[i], "--timeout") == 0)
      timeout = std::chrono::milliseconds(static_cast<int64_t>(std::atof(argv[i + 1]) * 1000));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (g_device.is_cuda() && !cuda_available()) {
    std::printf("no CUDA GPU: skipped\n");
    return 77;  // ctest's SKIP_RETURN_CODE
  }
  using Scenario = void (*)(const std::shared_ptr<dist::Communicator>&);
  const std::map<std::string, Scenario> scenarios = {
      {"plain", scenario_plain},         {"half", scenario_half},         {"topk", scenario_topk},
      {"threshold", scenario_threshold}, {"layout", scenario_layout},     {"feedback", scenario_feedback},
      {"partial", scenario_partial},     {"equivalence", scenario_equivalence}, {"overlap", scenario_overlap},
      {"sync", scenario_sync},           {"grads", scenario_grads},       {"clipswitch", scenario_clip_switch},
      {"introspection", scenario_introspection}, {"nonfinite", scenario_nonfinite}, {"arena16", scenario_arena16},
      {"clipnorm", scenario_clip_norm},  {"accumulate", scenario_accumulate},
      {"syncbn", scenario_sync_bn},      {"powersgd", scenario_power_sgd},
      {"lossscale", scenario_loss_scaling}, {"carried", scenario_carried_nonfinite},
      {"scaledfeedback", scenario_scaled_feedback}, {"misuse", scenario_misuse},
      {"shardequal", scenario_shard_equal}, {"shardmemory", scenario_shard_memory},
      {"shardtraffic", scenario_shard_traffic}, {"shardrefusals", scenario_shard_refusals},
      {"reshardsave", scenario_reshard_save}, {"reshardload", scenario_reshard_load},
      {"uneven", scenario_uneven}, {"shard3", scenario_shard_parameters},
      {"shard3memory", scenario_shard_parameters_memory}, {"shardfold", scenario_shard_fold},
      {"shardoverlap", scenario_shard_overlap}, {"shardmasters", scenario_shard_masters},
      {"unused", scenario_unused}, {"frozensync", scenario_frozen_sync},
      {"shardregroup", scenario_shard_regroup}};
  std::vector<std::string> names;
  std::stringstream list(argv[1]);
  for (std::string s; std::getline(list, s, ',');) {
    if (!scenarios.count(s)) {
      std::fprintf(stderr, "unknown scenario '%s'\n", s.c_str());
      return 2;
    }
    names.push_back(s);
  }
  try {
    // Ranks share the machine: one kernel thread each keeps them from crowding each other out.
    set_num_threads(1);
    auto comm = dist::init_communicator(g_device, timeout);
    g_device = comm->device();  // on GPUs: the one this rank was given
    for (const std::string& name : names) {
      int before = g_failures;
      scenarios.at(name)(comm);
      std::printf("rank %d: %s %s\n", comm->rank(), name.c_str(), g_failures == before ? "ok" : "FAILED");
    }
    if (comm->size() > 1) comm->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    return 1;
  }
  if (g_failures) std::fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures ? 1 : 0;
}
