#pragma once
// Shared pieces of the distopt_worker scenarios: the device they run on, failure reporting, and
// parameter fixtures whose gradients each rank chooses, so that a step's effect can be predicted.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/optim/optimizer.h"
#include "tandem/tensor.h"

namespace distopt_worker {

using namespace tandem;
using Values = std::vector<std::vector<double>>;  // per parameter, per element

/// The device every scenario puts its tensors on (the communicator's).
extern Device g_device;
/// Checks that failed so far on this rank.
extern int g_failures;

/// printf into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/// Counts a failed check and prints where and why.
void report_failure(const char* file, int line, const std::string& what);

#define CHECK_OR_REPORT(cond, ...)                                           \
  do {                                                                       \
    if (!(cond)) ::distopt_worker::report_failure(__FILE__, __LINE__, ::distopt_worker::strf(__VA_ARGS__)); \
  } while (0)

/// The value rank `rank` chooses as the gradient of element `elem` of parameter `param`.
using GradFn = std::function<float(int rank, size_t param, int64_t elem)>;

/// Zero parameters of the given sizes under SGD with lr 1 (no momentum, no weight decay): a step
/// then lowers each parameter by exactly the synchronised gradient.
struct Fixture {
  std::vector<int64_t> sizes;
  std::vector<Tensor> params;
  std::shared_ptr<optim::SGD> sgd;
  std::unique_ptr<dist::DistOpt> opt;
};
Fixture make_fixture(const std::shared_ptr<dist::Communicator>& comm, const std::vector<int64_t>& sizes,
                     const dist::DistOptOptions& options);
/// Options with 1 KiB buckets, so that small parameters already fill several.
dist::DistOptOptions small_buckets();

/// loss = sum_i sum(p_i * c_i) with c_i[j] = g(rank, i, j), so that dloss/dp_i = c_i exactly. Terms
/// are added in parameter order (backward then reaches the last parameter first), or with
/// `reversed` in the opposite order (backward reaches the first parameter first).
Tensor known_loss(const std::vector<Tensor>& ps, int rank, const GradFn& g, bool reversed = false);
/// A tensor of the given values on g_device.
Tensor device_tensor(const std::vector<float>& v, const Shape& shape);
/// Parameter values on the host.
Values host_values(const std::vector<Tensor>& ps);

/// How much each element fell during `run` (the synchronised gradient under lr 1), with a bound on
/// the float rounding of the update itself.
struct Change {
  Values drop;
  Values rounding;
};
Change measure_change(Fixture& f, const std::function<void()>& run);

/// expected[i][j] for every element, from a function of (param, elem).
Values tabulate(const std::vector<int64_t>& sizes, const std::function<double(size_t, int64_t)>& f);
/// Compares got with expected within tol (+ rounding when given); reports the first few mismatches
/// under the label `what`. Returns whether everything matched.
bool expect_near(const std::string& what, const Values& got, const Values& expected, const Values& tol,
                 const Values* rounding = nullptr);

/// What rank `rank` contributes to element `elem` of parameter `param` (a double, for expectations).
using Contrib = std::function<double(int rank, size_t param, int64_t elem)>;
Contrib as_contrib(const GradFn& g);

/// The average over ranks of what each contributes, and a tolerance of `unit` times the sum of the
/// magnitudes (the rounding of a sum of W terms), plus `floor`.
struct Expect {
  Values value, tol;
};
Expect average(int W, const std::vector<int64_t>& sizes, const Contrib& contrib, double unit, double floor = 0.0);

/// Checks, per parameter, that the largest |got - ref| is at most rel times the largest |ref|, and
/// prints the largest relative difference found under `what`.
void expect_close_models(const std::string& what, const Values& got, const Values& ref, double rel);
/// Checks that f throws, with a message mentioning every string of `mentions` (printed with the rank).
void expect_error(const std::string& what, int rank, const std::function<void()>& f,
                  const std::vector<std::string>& mentions);

/// Bytes a rank sends per step (several ranks) for the agreement on which of `params` parameters some rank
/// used: one i32 flag per parameter, all-reduced (an all-reduce's 2 (N - 1) / N of it).
inline int64_t usage_wire(int64_t params, int64_t W) { return W > 1 ? 4 * params * 2 * (W - 1) / W : 0; }

/// Rounding units the tolerances are built from.
constexpr double kF32Eps = 1.0 / (1 << 23);  // f32 spacing at 1
constexpr double kF16Unit = 1.0 / (1 << 11);  // f16 unit roundoff
constexpr double kBf16Unit = 1.0 / (1 << 8);  // bf16 unit roundoff

// ---- scenarios (each returns normally; failures go through CHECK_OR_REPORT)
void scenario_plain(const std::shared_ptr<dist::Communicator>& comm);
void scenario_half(const std::shared_ptr<dist::Communicator>& comm);
void scenario_topk(const std::shared_ptr<dist::Communicator>& comm);
void scenario_threshold(const std::shared_ptr<dist::Communicator>& comm);
void scenario_layout(const std::shared_ptr<dist::Communicator>& comm);
void scenario_feedback(const std::shared_ptr<dist::Communicator>& comm);
void scenario_partial(const std::shared_ptr<dist::Communicator>& comm);
void scenario_equivalence(const std::shared_ptr<dist::Communicator>& comm);
void scenario_overlap(const std::shared_ptr<dist::Communicator>& comm);
void scenario_sync(const std::shared_ptr<dist::Communicator>& comm);
void scenario_grads(const std::shared_ptr<dist::Communicator>& comm);
void scenario_clip_switch(const std::shared_ptr<dist::Communicator>& comm);
void scenario_clip_norm(const std::shared_ptr<dist::Communicator>& comm);
void scenario_accumulate(const std::shared_ptr<dist::Communicator>& comm);
void scenario_sync_bn(const std::shared_ptr<dist::Communicator>& comm);
void scenario_power_sgd(const std::shared_ptr<dist::Communicator>& comm);
void scenario_introspection(const std::shared_ptr<dist::Communicator>& comm);
void scenario_nonfinite(const std::shared_ptr<dist::Communicator>& comm);
void scenario_arena16(const std::shared_ptr<dist::Communicator>& comm);
void scenario_loss_scaling(const std::shared_ptr<dist::Communicator>& comm);
void scenario_carried_nonfinite(const std::shared_ptr<dist::Communicator>& comm);
void scenario_scaled_feedback(const std::shared_ptr<dist::Communicator>& comm);
void scenario_misuse(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_equal(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_memory(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_traffic(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_refusals(const std::shared_ptr<dist::Communicator>& comm);
void scenario_reshard_save(const std::shared_ptr<dist::Communicator>& comm);
void scenario_reshard_load(const std::shared_ptr<dist::Communicator>& comm);
void scenario_uneven(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_parameters(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_parameters_memory(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_fold(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_overlap(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_masters(const std::shared_ptr<dist::Communicator>& comm);
void scenario_unused(const std::shared_ptr<dist::Communicator>& comm);
void scenario_frozen_sync(const std::shared_ptr<dist::Communicator>& comm);
void scenario_shard_regroup(const std::shared_ptr<dist::Communicator>& comm);

}  // namespace distopt_worker
