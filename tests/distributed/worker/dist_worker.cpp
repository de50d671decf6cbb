// A rank of a test job: joins through init_communicator and runs one named scenario. Every expected
// value is computed from the rank numbers. Exit status 0 means the scenario held; failures print why.
//
//   dist_worker SCENARIO [--device cpu|cuda] [--timeout SECONDS]
//   dist_worker store_server [--max-connections N] [--handshake-ms MS] [--job ID] [--secret TEXT]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tandem/distributed/agreement.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/sparse_all_reduce.h"
#include "tandem/error.h"
#include "tandem/tensor.h"

using namespace tandem;
using namespace tandem::dist;
using std::chrono::milliseconds;

namespace {

Device g_device = Device::cpu();
milliseconds g_timeout{60000};
int g_failures = 0;

#define EXPECT_OR_REPORT(cond, ...)                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      ++g_failures;                                                    \
      std::fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);      \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fprintf(stderr, "\n");                                      \
    }                                                                  \
  } while (0)

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// Rank r's element i: exactly representable in every dtype, alternating in sign, and for the wide
// integer types large enough to need all their bits.
template <typename T>
int64_t value(int r, int64_t i) {
  int64_t sign = (i % 2) ? -1 : 1;
  if constexpr (std::is_same_v<T, int64_t>) return sign * ((int64_t{r} + 1) * (int64_t{1} << 40) + i % 1000);
  if constexpr (std::is_same_v<T, int32_t>) return sign * ((r + 1) * 100000 + i % 1000);
  return sign * (r + 1) * (i % 13 + 1);
}

// Tolerance of a comparison in dtype T (the values above make all results exact; this guards only
// against the rounding of an average that is not).
template <typename T>
double tolerance(double expected) {
  double rel = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, double> ? 1e-12
               : std::is_same_v<T, Half> ? 1e-3 : std::is_same_v<T, BFloat16> ? 8e-3 : 0.0;
  return rel * std::fabs(expected);
}

template <typename T>
Tensor make(const std::vector<T>& v) {
  return Tensor::from_vector<T>(v, {static_cast<int64_t>(v.size())}).to(g_device);
}

template <typename T>
std::vector<T> host(const Tensor& t) {
  return t.cpu().to_vector<T>();
}

// ---- scenarios

// Whether got is element `elem` of an all-reduce (or reduce-scatter) over every rank of value<T>(r, i);
// reports a mismatch under `what`.
template <typename T>
bool check_reduced(const char* what, T got, int W, int64_t i, int64_t elem, ReduceOp op, int64_t n) {
  int64_t isum = 0;
  for (int r = 0; r < W; ++r) isum += value<T>(r, i);
  double expected;
  if constexpr (std::is_integral_v<T>)
    expected = static_cast<double>(op == ReduceOp::Sum ? isum : isum / W);  // integer average truncates
  else
    expected = op == ReduceOp::Sum ? static_cast<double>(isum) : static_cast<double>(isum) / W;
  double g = to_double(got);
  bool ok;
  if constexpr (std::is_integral_v<T>)
    ok = static_cast<int64_t>(got) == (op == ReduceOp::Sum ? isum : isum / W);
  else
    ok = std::fabs(g - expected) <= tolerance<T>(expected);
  EXPECT_OR_REPORT(ok, "%s %s %s n=%lld: element %lld is %.17g, expected %.17g", what,
                   op == ReduceOp::Sum ? "sum" : "avg", dtype_name(dtype_of<T>()), static_cast<long long>(n),
                   static_cast<long long>(elem), g, expected);
  return ok;
}

struct ReduceCase {
  Tensor t;
  ReduceOp op;
  WorkPtr work;
  std::function<void()> check;
};

template <typename T>
void add_reduce_cases(Communicator& c, int64_t n, std::vector<ReduceCase>& cases) {
  const int W = c.size(), me = c.rank();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    std::vector<T> mine(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = from_double<T>(static_cast<double>(value<T>(me, i)));
    ReduceCase rc{make(mine), op, nullptr, nullptr};
    Tensor t = rc.t;
    rc.check = [t, op, n, W]() {
      std::vector<T> got = host<T>(t);
      int bad = 0;
      for (int64_t i = 0; i < n && bad < 5; ++i)
        if (!check_reduced<T>("all_reduce", got[static_cast<size_t>(i)], W, i, i, op, n)) ++bad;
    };
    cases.push_back(std::move(rc));
  }
}

void scenario_allreduce(Communicator& c) {
  const std::vector<int64_t> sizes = {1, 2, 3, 127, 4099, 65537, 1 << 20};
  int checks = 0;
  for (int64_t n : sizes) {
    std::vector<ReduceCase> cases;
    add_reduce_cases<float>(c, n, cases);
    if (c.device().is_cpu()) add_reduce_cases<double>(c, n, cases);
    add_reduce_cases<Half>(c, n, cases);
    add_reduce_cases<BFloat16>(c, n, cases);
    add_reduce_cases<int32_t>(c, n, cases);
    add_reduce_cases<int64_t>(c, n, cases);
    // All issued before any is waited for: they queue up and complete in order.
    for (auto& rc : cases) rc.work = c.all_reduce(rc.t, rc.op);
    for (auto& rc : cases) rc.work->wait();
    for (auto& rc : cases) {
      rc.check();  // reads the result back, after the device finished with it
      // On GPUs wait() only orders the device's later work; once the result was read, it is done.
      EXPECT_OR_REPORT(rc.work->done(), "a collective whose result was read does not report done()");
      ++checks;
    }
  }
  std::printf("rank %d: all_reduce ok on %d ranks (%d cases)\n", c.rank(), c.size(), checks);
}

// Rank r's input holds value<T>(r, i) at every i of [size * n]; block k of it reduces into rank k's
// output. In place, the output is the rank's own block of the input; otherwise the input must come
// back unchanged.
template <typename T>
void check_reduce_scatter(Communicator& c, int64_t n, ReduceOp op, bool in_place) {
  const int W = c.size(), me = c.rank();
  std::vector<T> mine(static_cast<size_t>(W * n));
  for (size_t i = 0; i < mine.size(); ++i)
    mine[i] = from_double<T>(static_cast<double>(value<T>(me, static_cast<int64_t>(i))));
  Tensor in = make(mine);
  Tensor out = in_place ? in.narrow(0, me * n, n) : Tensor::full({n}, -1.0, dtype_of<T>(), g_device);
  WorkPtr w = c.reduce_scatter(in, out, op);
  w->wait();
  std::vector<T> got = host<T>(out);
  const char* what = in_place ? "reduce_scatter in place" : "reduce_scatter";
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i)
    if (!check_reduced<T>(what, got[static_cast<size_t>(i)], W, me * n + i, i, op, n)) ++bad;
  if (in_place) return;
  std::vector<T> after = host<T>(in);
  for (size_t i = 0; i < mine.size(); ++i)
    if (to_double(after[i]) != to_double(mine[i])) {
      EXPECT_OR_REPORT(false, "reduce_scatter %s n=%lld changed its input at %zu", dtype_name(dtype_of<T>()),
                       static_cast<long long>(n), i);
      break;
    }
}

void scenario_reduce_scatter(Communicator& c) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1} << 17}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      for (bool in_place : {false, true}) {
        check_reduce_scatter<float>(c, n, op, in_place);
        if (c.device().is_cpu()) check_reduce_scatter<double>(c, n, op, in_place);
        check_reduce_scatter<Half>(c, n, op, in_place);
        check_reduce_scatter<BFloat16>(c, n, op, in_place);
        check_reduce_scatter<int32_t>(c, n, op, in_place);
        check_reduce_scatter<int64_t>(c, n, op, in_place);
      }
    }
  }
  // Queued back to back, they finish in order, each with its own result.
  const int64_t n = 1000;
  std::vector<Tensor> ins, outs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    ins.push_back(Tensor::full({n * c.size()}, static_cast<double>(c.rank() + k), DType::f32, g_device));
    outs.push_back(Tensor::empty({n}, DType::f32, g_device));
    works.push_back(c.reduce_scatter(ins.back(), outs.back(), ReduceOp::Sum));
  }
  for (int k = 0; k < 4; ++k) {
    works[static_cast<size_t>(k)]->wait();
    double expected = 0;
    for (int r = 0; r < c.size(); ++r) expected += r + k;
    std::vector<float> got = host<float>(outs[static_cast<size_t>(k)]);
    EXPECT_OR_REPORT(got.front() == expected && got.back() == expected, "queued reduce_scatter %d gave %g, expected %g",
                     k, got.front(), expected);
  }
  std::printf("rank %d: reduce_scatter ok\n", c.rank());
}

template <typename T>
void check_gatherv(Communicator& c, const std::vector<int64_t>& counts) {
  const int W = c.size(), me = c.rank();
  auto elem = [](int r, int64_t i) { return static_cast<double>((r * 7 + i) % 251); };
  std::vector<T> mine(static_cast<size_t>(counts[static_cast<size_t>(me)]));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = from_double<T>(elem(me, static_cast<int64_t>(i)));
  int64_t total = 0;
  for (int64_t k : counts) total += k;
  Tensor in = make(mine);
  Tensor out = Tensor::full({total}, -1.0, dtype_of<T>(), g_device);
  bool equal = true;
  for (int64_t k : counts) equal = equal && k == counts[0];
  if (equal)
    c.all_gather(in, out)->wait();
  else
    c.all_gatherv(in, out, counts)->wait();
  std::vector<T> got = host<T>(out);
  int64_t off = 0;
  for (int r = 0; r < W; ++r) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
      double g = to_double(got[static_cast<size_t>(off + i)]);
      if (g != elem(r, i)) {
        EXPECT_OR_REPORT(false, "%s %s: element %lld of rank %d is %g, expected %g",
                         equal ? "all_gather" : "all_gatherv", dtype_name(dtype_of<T>()), static_cast<long long>(i),
                         r, g, elem(r, i));
        break;
      }
    }
    off += counts[static_cast<size_t>(r)];
  }
}

// In place: each rank's contribution already lies in its block of the output.
template <typename T>
void check_gather_in_place(Communicator& c, int64_t n) {
  const int W = c.size(), me = c.rank();
  auto elem = [](int r, int64_t i) { return static_cast<double>((r * 5 + i) % 241); };
  Tensor out = Tensor::full({n * W}, -1.0, dtype_of<T>(), g_device);
  std::vector<T> mine(static_cast<size_t>(n));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = from_double<T>(elem(me, static_cast<int64_t>(i)));
  Tensor block = out.narrow(0, me * n, n);
  block.copy_(make(mine));
  c.all_gather(block, out)->wait();
  std::vector<T> got = host<T>(out);
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < n; ++i)
      if (to_double(got[static_cast<size_t>(r * n + i)]) != elem(r, i)) {
        EXPECT_OR_REPORT(false, "all_gather in place %s: element %lld of rank %d is %g, expected %g",
                         dtype_name(dtype_of<T>()), static_cast<long long>(i), r,
                         to_double(got[static_cast<size_t>(r * n + i)]), elem(r, i));
        return;
      }
}

void scenario_allgather(Communicator& c) {
  const size_t W = static_cast<size_t>(c.size());
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{100003}}) {
    std::vector<int64_t> counts(W, n);
    check_gatherv<float>(c, counts);
    check_gatherv<int64_t>(c, counts);
    check_gatherv<Half>(c, counts);
    check_gather_in_place<float>(c, n);
    check_gather_in_place<BFloat16>(c, n);
  }
  std::printf("rank %d: all_gather ok\n", c.rank());
}

void scenario_allgatherv(Communicator& c) {
  const int W = c.size();
  std::vector<int64_t> uneven(static_cast<size_t>(W)), one(static_cast<size_t>(W), 0), big(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    uneven[static_cast<size_t>(r)] = r == 1 ? 0 : 3 + 2 * r;  // rank 1 contributes nothing
    big[static_cast<size_t>(r)] = r == 0 ? 0 : 50000 * r + 17;
  }
  one[static_cast<size_t>(W - 1)] = 9;  // only the last rank contributes
  for (const auto& counts : {uneven, one, big}) {
    check_gatherv<float>(c, counts);
    check_gatherv<int32_t>(c, counts);
    check_gatherv<BFloat16>(c, counts);
  }
  std::printf("rank %d: all_gatherv ok\n", c.rank());
}

template <typename T>
void check_broadcast(Communicator& c, int64_t n, int root) {
  auto elem = [](int r, int64_t i) { return static_cast<double>(r * 10 + i % 7); };
  std::vector<T> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = from_double<T>(elem(c.rank(), i));
  Tensor t = make(mine);
  c.broadcast(t, root)->wait();
  std::vector<T> got = host<T>(t);
  for (int64_t i = 0; i < n; ++i) {
    double g = to_double(got[static_cast<size_t>(i)]);
    if (g != elem(root, i)) {
      EXPECT_OR_REPORT(false, "broadcast from %d %s n=%lld: element %lld is %g, expected %g", root,
                       dtype_name(dtype_of<T>()), static_cast<long long>(n), static_cast<long long>(i), g,
                       elem(root, i));
      break;
    }
  }
}

void scenario_broadcast(Communicator& c) {
  const int root = c.size() - 1;  // a non-zero root
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 18}) {
    check_broadcast<float>(c, n, root);
    check_broadcast<BFloat16>(c, n, root);
    check_broadcast<int32_t>(c, n, root);
  }
  std::printf("rank %d: broadcast ok\n", c.rank());
}

// sparse_all_reduce (SINGA's sparsification) against the same selection made here for every rank.
// Rank r's call s: element i has magnitude scale_s * ((7 i + 3 r) mod n + 1), a permutation, so that no two
// magnitudes tie; its sign alternates with i, and so does the residual's.
void scenario_sparse(Communicator& c) {
  const int W = c.size(), me = c.rank();
  const int64_t n = 20;
  auto value = [n](int r, int s, int64_t i) {
    const double scale = s == 0 ? 0.25 : 16.0;  // the second call's values dwarf what the first kept
    return (i % 2 ? -1.0 : 1.0) * scale * static_cast<double>((7 * i + 3 * r) % n + 1);
  };
  struct Case {
    const char* name;
    bool top_k, feedback;
    double spars;
  };
  const Case cases[] = {{"topK", true, true, 0.25},
                        {"topK without accumulation", true, false, 0.1},
                        {"threshold", false, true, 3.0},
                        {"threshold without accumulation", false, false, 40.0}};
  for (const Case& k : cases) {
    std::vector<std::vector<double>> residual(static_cast<size_t>(W), std::vector<double>(n, 0.0));
    Tensor acc = k.feedback ? Tensor::zeros({n}).to(g_device) : Tensor();
    for (int s = 0; s < 2; ++s) {
      std::vector<double> want(n, 0.0);
      for (int r = 0; r < W; ++r) {
        std::vector<double> x(n);
        for (int64_t i = 0; i < n; ++i) x[i] = value(r, s, i) + residual[r][i];
        std::vector<bool> sent(n, false);
        if (k.top_k) {
          const auto count = static_cast<size_t>(std::ceil(k.spars * n - 1e-9));
          std::vector<double> mags;
          for (double v : x) mags.push_back(std::fabs(v));
          std::sort(mags.rbegin(), mags.rend());
          for (int64_t i = 0; i < n; ++i) sent[i] = std::fabs(x[i]) >= mags[count - 1];
        } else {
          for (int64_t i = 0; i < n; ++i) sent[i] = std::fabs(x[i]) >= k.spars;
        }
        for (int64_t i = 0; i < n; ++i) {
          if (sent[i]) want[i] += x[i];
          if (k.feedback) residual[r][i] = sent[i] ? 0.0 : x[i];
        }
      }
      std::vector<float> mine(n);
      for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>(value(me, s, i));
      Tensor t = make(mine);
      sparse_all_reduce(c, t, acc, k.spars, k.top_k);
      std::vector<float> got = host<float>(t);
      std::vector<float> kept = acc.defined() ? host<float>(acc) : std::vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        if (got[i] != static_cast<float>(want[i])) {
          EXPECT_OR_REPORT(false, "sparse all-reduce %s call %d: element %lld is %g, expected %g", k.name, s,
                           static_cast<long long>(i), got[i], want[i]);
          break;
        }
        if (k.feedback && kept[i] != static_cast<float>(residual[me][i])) {
          EXPECT_OR_REPORT(false, "sparse all-reduce %s call %d: accumulation %lld is %g, expected %g", k.name, s,
                           static_cast<long long>(i), kept[i], residual[me][i]);
          break;
        }
      }
    }
  }
  std::printf("rank %d: sparse all-reduce ok\n", c.rank());
}

void scenario_barrier(Communicator& c) {
  Store& store = rendezvous_store();
  for (int round = 0; round < 3; ++round) {
    std::string key = "test/barrier/" + std::to_string(round);
    // Later ranks arrive later: a barrier that did not wait would let rank 0 see fewer arrivals.
    std::this_thread::sleep_for(milliseconds(100 * c.rank()));
    store.add(key, 1);
    c.barrier();
    int64_t arrived = store.add(key, 0);
    EXPECT_OR_REPORT(arrived == c.size(), "barrier round %d: %lld of %d ranks had arrived when it returned", round,
                     static_cast<long long>(arrived), c.size());
  }
  std::printf("rank %d: barrier ok\n", c.rank());
}

// One rank leaves the job, in one of several ways; the others wait for the launcher to stop them.
void scenario_exit3(Communicator& c, bool stubborn) {
  if (c.rank() == 1) {
    std::this_thread::sleep_for(milliseconds(200));
    std::exit(3);
  }
  if (stubborn) signal(SIGTERM, SIG_IGN);
  std::printf("rank %d: waiting to be stopped\n", c.rank());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

// Ranks that keep reducing until a peer goes: a rank killed from outside makes the others fail with a
// connection error moments later, as a training job's ranks do.
void scenario_reduce_loop(Communicator& c) {
  Tensor t = Tensor::ones({16}, DType::f32, g_device);
  c.all_reduce(t)->wait();
  std::printf("ready pid=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < until;) {
    c.all_reduce(t)->wait();
    std::this_thread::sleep_for(milliseconds(5));
  }
}

// A peer that is gone (or never takes part) makes the collective fail within the timeout.
void scenario_peer_fails(Communicator& c, bool dies) {
  Store& store = rendezvous_store();
  Tensor t = Tensor::ones({1000}, DType::f32, g_device);
  c.all_reduce(t)->wait();  // one that works: the connections are up, what follows is a peer gone silent
  EXPECT_OR_REPORT(host<float>(t)[0] == c.size(), "the first all_reduce gave %g", host<float>(t)[0]);
  if (c.rank() == 0) store.set("test/warm", "1");
  if (c.rank() == 1) {
    store.get("test/warm", std::chrono::seconds(60));  // rank 0 is done with the first one too
    if (dies) std::_Exit(0);  // gone without a word
    store.get("test/peer_done", std::chrono::seconds(60));  // alive but never joins the collective
    return;
  }
  c.set_timeout(milliseconds(1000));
  auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    c.all_reduce(t)->wait();
    if (c.device().is_cuda()) c.barrier();  // on GPUs wait() does not block the host: this does
  } catch (const std::exception& e) {
    error = e.what();
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!dies) store.set("test/peer_done", "1");
  std::printf("rank %d: collective error after %.2f s: %s\n", c.rank(), took, error.c_str());
  EXPECT_OR_REPORT(!error.empty(), "the all_reduce with a missing peer did not fail");
  EXPECT_OR_REPORT(error.find("all_reduce") != std::string::npos && error.find("rank 0") != std::string::npos,
                   "the error does not name the collective and the rank");
  if (!dies)
    EXPECT_OR_REPORT(error.find("timed out after 1 s") != std::string::npos, "the error does not report the timeout");
  EXPECT_OR_REPORT(took < 10.0, "failing took %.1f s", took);
  // The communicator stays failed: the next collective says why at once.
  std::string second;
  try {
    c.all_reduce(t)->wait();
  } catch (const std::exception& e) {
    second = e.what();
  }
  EXPECT_OR_REPORT(!second.empty(), "a collective after a failed one did not fail");
}

// Rank 1 stops for good at step 3 without leaving the job; the others go on to the next collective,
// which times out and must name rank 1 and its step. The error ends the worker (rank 0's exit status
// is 1): under mpiexec that must stop rank 1 too.
void scenario_stuck_rank(Communicator& c) {
  Tensor t = Tensor::ones({1000}, DType::f32, g_device);
  c.set_timeout(milliseconds(2000));
  for (int64_t step = 0; step < 10; ++step) {
    report_step(step);
    if (step == 3 && c.rank() == 1) {
      std::printf("rank 1: stuck at step 3\n");
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    c.all_reduce(t)->wait();
    if (c.device().is_cuda()) c.barrier();
  }
}

// The ranks compare what they were started with: a batch size that rank 1 got wrong (when `mismatch`)
// must stop every rank; a seed that differs per rank is only a warning.
void scenario_agree(Communicator& c, bool mismatch) {
  int batch = mismatch && c.rank() == 1 ? 32 : 64;
  std::vector<AgreementField> fields = {{"--model", "cnn", true},
                                        {"--batch-size", std::to_string(batch), true},
                                        {"--seed", std::to_string(c.rank() % 2), false}};
  std::vector<std::string> warnings = check_agreement(fields);
  std::printf("rank %d: agreed (%zu warnings)\n", c.rank(), warnings.size());
}

// A store server for tests of hostile clients: prints its port, then serves until killed.
int serve_store(int argc, char** argv) {
  StoreServerOptions o;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--max-connections") o.limits.max_connections = std::stoul(value);
    if (flag == "--handshake-ms") o.limits.handshake_timeout = milliseconds(std::stoll(value));
    if (flag == "--job") o.auth.job_id = value;
    if (flag == "--secret") o.auth.secret = value;
  }
  StoreServer server(o);
  std::printf("port=%d\n", server.port());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
}

void scenario_sleep(bool ignore_int) {
  if (ignore_int) signal(SIGINT, SIG_IGN);
  std::printf("ready pid=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dist_worker SCENARIO [--device cpu|cuda] [--timeout SECONDS]\n");
    return 2;
  }
  std::string scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) g_device = Device::parse(argv[i + 1]);
    if (std::strcmp(argv[i], "--timeout") == 0) g_timeout = milliseconds(static_cast<int64_t>(std::atof(argv[i + 1]) * 1000));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    if (scenario == "store_server") return serve_store(argc, argv);
    if (scenario == "sleep" || scenario == "sleep_ignore_int") {
      scenario_sleep(scenario == "sleep_ignore_int");
      return 0;
    }
    DistEnv env = detect_env();
    if (scenario == "env") {
      std::printf("rank=%d world=%d local=%d/%d launcher=%s\n", env.rank, env.world_size, env.local_rank,
                  env.local_size, env.launcher.c_str());
      return 0;
    }
    auto comm = init_communicator(g_device, g_timeout);
    g_device = comm->device();  // on GPUs: the one this rank was given (cuda:local_rank)
    if (scenario == "join") {
      std::printf("rank %d: joined %s group of %d\n", comm->rank(), comm->backend_name().c_str(), comm->size());
      comm->barrier();
      return 0;
    }
    if (scenario == "allreduce") {
      scenario_allreduce(*comm);
    } else if (scenario == "collectives") {
      scenario_reduce_scatter(*comm);
      scenario_allgather(*comm);
      scenario_allgatherv(*comm);
      scenario_broadcast(*comm);
      scenario_barrier(*comm);
    } else if (scenario == "all") {
      scenario_allreduce(*comm);
      scenario_reduce_scatter(*comm);
      scenario_allgather(*comm);
      scenario_allgatherv(*comm);
      scenario_broadcast(*comm);
      scenario_barrier(*comm);
    } else if (scenario == "sparse") {
      scenario_sparse(*comm);
    } else if (scenario == "reduce_loop") {
      scenario_reduce_loop(*comm);
    } else if (scenario == "exit3" || scenario == "exit3_stubborn") {
      scenario_exit3(*comm, scenario == "exit3_stubborn");
    } else if (scenario == "peer_dies" || scenario == "peer_hangs") {
      scenario_peer_fails(*comm, scenario == "peer_dies");
    } else if (scenario == "stuck_rank") {
      scenario_stuck_rank(*comm);
    } else if (scenario == "agree" || scenario == "agree_mismatch") {
      scenario_agree(*comm, scenario == "agree_mismatch");
    } else {
      std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
      return 2;
    }
    if (comm->size() > 1 && scenario != "peer_dies" && scenario != "peer_hangs") comm->barrier();
  } catch (const Error& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    int rc = e.kind() == Error::Kind::Input ? 2 : 1;
    abort_job_after_error(rc);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    abort_job_after_error(1);
    return 1;
  }
  if (g_failures) std::fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures ? 1 : 0;
}
