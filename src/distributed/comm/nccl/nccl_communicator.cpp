// The NCCL communicator: CUDA tensors. Collectives run on a communication stream of their own, ordered
// after the work already queued on the compute stream (an event, no host wait); Work::wait orders the
// compute stream after them. A watchdog thread fails collectives that outlive the timeout and errors
// that NCCL reports asynchronously: it aborts the communicator, and the next wait or collective throws.
//
// The communicator is blocking (cheap calls); its initialisation runs on a thread of its own so that one
// a peer never completes can be abandoned after the timeout. Should a call still answer ncclInProgress,
// `settle` waits until ncclCommGetAsyncError says it finished.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "backend/cuda/cuda_context.h"
#include "distributed/comm/collective_args.h"
#include "distributed/launch/progress.h"
#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ncclDataType_t reduce_type(DType t, const char* what = "all_reduce") {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default:
      TANDEM_CHECK(false, what, ": dtype ", dtype_name(t),
                   " cannot be reduced by the nccl communicator (use f32, f64, f16, bf16, i32 or i64)");
  }
}

// What a communicator and the Works it handed out share: a failure outlives neither.
struct SharedState {
  std::mutex mu;
  std::string failure;  // the first failure; every later wait and collective reports it
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  bool set(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failure.empty()) return false;
    failure = msg;
    return true;
  }
};

// One issued collective, held by its Work and by the watchdog until its completion event fires; it
// keeps the tensors alive until then so that their memory is not reused while NCCL still uses it.
struct Pending {
  std::string name;
  cudaEvent_t done = nullptr;
  Clock::time_point start;
  std::vector<Tensor> keep;
  ~Pending() {
    // Legal while the event is still pending: the runtime releases it once it completes.
    if (done) cudaEventDestroy(done);
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Pending> p, std::shared_ptr<SharedState> s, int device)
      : p_(std::move(p)), s_(std::move(s)), device_(device) {}
  void wait() override {
    std::string f = s_->get();
    TANDEM_RUNTIME_CHECK(f.empty(), f);
    cuda::set_device(device_);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(device_), p_->done, 0));
  }
  bool done() override {
    if (!s_->get().empty()) return true;  // finished by failing; wait() says how
    cudaError_t q = cudaEventQuery(p_->done);
    if (q == cudaErrorNotReady) return false;
    TANDEM_CUDA_CHECK(q);
    return true;
  }

 private:
  std::shared_ptr<Pending> p_;
  std::shared_ptr<SharedState> s_;
  int device_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const GroupSpec& g);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend_name() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  WorkPtr all_reduce(Tensor& t, ReduceOp op) override;
  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  WorkPtr all_gather(const Tensor& in, Tensor& out) override;
  WorkPtr all_gatherv(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) override;
  WorkPtr broadcast(Tensor& t, int root) override;
  void barrier() override;
  void set_timeout(milliseconds t) override {
    TANDEM_CHECK(t.count() > 0, "set_timeout: the timeout must be positive");
    timeout_ms_.store(t.count());
  }
  bool records_collectives() const override { return true; }
  void watch(const char* what) override;

 private:
  // Queues the NCCL calls of one collective on the communication stream; the caller checks arguments.
  template <typename Calls>
  std::shared_ptr<Pending> issue(const char* name, std::vector<Tensor> keep, Calls&& calls);
  // Throws for a failed NCCL call, naming it and the collective; waits out ncclInProgress.
  void check(ncclResult_t r, const char* call, const char* name);
  // Waits until the non-blocking communicator has finished its last call; its final state.
  ncclResult_t settle(Clock::time_point deadline);
  // Records the failure, aborts the communicator; safe from any thread, idempotent.
  void fail(const std::string& msg);
  void watchdog();
  std::string describe(ncclResult_t r);
  milliseconds timeout() const { return milliseconds(timeout_ms_.load()); }

  int rank_, size_, local_rank_, local_size_, device_;
  std::shared_ptr<SharedState> state_ = std::make_shared<SharedState>();
  std::atomic<int64_t> timeout_ms_;

  std::mutex comm_mu_;  // NCCL calls on comm_, and its abort
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // re-recorded per collective: "compute work so far"
  Tensor barrier_buf_;

  std::mutex pending_mu_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

std::string NcclCommunicator::describe(ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

ncclResult_t NcclCommunicator::settle(Clock::time_point deadline) {
  ncclResult_t st = ncclInProgress;
  const auto polling_start = Clock::now();
  for (;;) {
    ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress) return st;
    auto now = Clock::now();
    if (now >= deadline) return st;
    // A non-blocking communicator usually settles within microseconds: spin first, then back off,
    // so that a collective costs no more host time than with a blocking communicator.
    if (now - polling_start < std::chrono::milliseconds(2))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::check(ncclResult_t r, const char* call, const char* name) {
  // A call can stay in progress while NCCL connects to peers on first use of a path: until every
  // peer has reached the same collective. Past the timeout that is a peer that is not coming.
  if (r == ncclInProgress) r = settle(Clock::now() + timeout());
  if (r == ncclSuccess) return;
  std::string msg = "collective " + std::string(name) + " on rank " + std::to_string(rank_) +
                    (r == ncclInProgress ? " timed out after " + net::format_duration(timeout()) +
                                               " (a peer may have died)" + stalled_ranks_note()
                                         : ": " + std::string(call) + " failed: " + describe(r));
  // A usage error leaves the communicator intact; anything else may have broken it for every rank.
  if (r != ncclInvalidArgument && r != ncclInvalidUsage) {
    state_->set(msg);
    aborted_ = true;
    ncclCommAbort(comm_);  // the caller holds comm_mu_
  }
  TANDEM_RUNTIME_CHECK(false, msg);
}

void NcclCommunicator::fail(const std::string& msg) {
  state_->set(msg);
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (aborted_ || !comm_) return;
  aborted_ = true;
  // Makes the communicator's kernels return, so that the streams waiting on them move on.
  ncclCommAbort(comm_);
}

NcclCommunicator::NcclCommunicator(const GroupSpec& g)
    : rank_(g.rank), size_(g.size), local_rank_(g.local_rank), local_size_(g.local_size), device_(g.device.index),
      timeout_ms_(g.timeout.count()) {
  // NVLink multicast can take a host's GPUs out of service on some systems; it stays off unless the
  // user asked for it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  cuda::set_device(device_);

  ncclUniqueId id;
  const std::string key = g.prefix + "nccl_id";
  if (g.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    TANDEM_RUNTIME_CHECK(r == ncclSuccess, "ncclGetUniqueId failed on rank 0: ", ncclGetErrorString(r));
    g.store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    std::string v = g.store->get(key, g.timeout, "rank 0 did not publish the NCCL id");
    TANDEM_RUNTIME_CHECK(v.size() == sizeof id, "the NCCL id published by rank 0 has ", v.size(),
                         " bytes instead of ", sizeof id, " (do all ranks use the same NCCL version?)");
    std::memcpy(&id, v.data(), sizeof id);
  }

  // A blocking communicator keeps each collective call cheap on the host. Its initialisation cannot
  // be interrupted, so it runs on a thread of its own and is given up on after the timeout; and all
  // connections are made during it (NCCL_RUNTIME_CONNECT=0), so that no later call blocks on a peer.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  struct InitResult {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ncclResult_t result = ncclSuccess;
    ncclComm_t comm = nullptr;
  };
  auto init = std::make_shared<InitResult>();
  std::thread([init, id, size = size_, rank = rank_, dev = device_] {
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclSystemError;
    if (cudaSetDevice(dev) == cudaSuccess) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      r = ncclCommInitRankConfig(&c, size, id, rank, &config);
    }
    std::lock_guard<std::mutex> lock(init->mu);
    init->result = r;
    init->comm = c;
    init->done = true;
    init->cv.notify_all();
  }).detach();
  ncclResult_t r;
  {
    std::unique_lock<std::mutex> lock(init->mu);
    bool finished = init->cv.wait_for(lock, g.timeout, [&] { return init->done; });
    TANDEM_RUNTIME_CHECK(finished, "ncclCommInitRankConfig on rank ", rank_, " (GPU cuda:", device_,
                         ") did not finish within ", net::format_duration(g.timeout),
                         " (a peer may have died, or the hosts cannot reach each other; NCCL_DEBUG=INFO tells more)");
    r = init->result;
    comm_ = init->comm;
  }
  if (r != ncclSuccess) {
    std::string why = "failed: " + describe(r);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    TANDEM_RUNTIME_CHECK(false, "ncclCommInitRankConfig on rank ", rank_, " (GPU cuda:", device_, ") ", why);
  }

  try {
    int least = 0, greatest = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // High priority: communication kernels get scheduled ahead of the compute they overlap with.
    TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    barrier_buf_ = Tensor::zeros({1}, DType::f32, Device::cuda(device_));
  } catch (...) {
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw;
  }
  watchdog_ = std::thread([this] { watchdog(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(wd_mu_);
    stop_ = true;
  }
  wd_cv_.notify_all();
  watchdog_.join();
  // Never throws: errors here have nobody left to tell.
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_ && !aborted_) {
    // Collectives still running get the timeout to finish; a communicator whose peers are gone is
    // aborted rather than waited for forever.
    auto deadline = Clock::now() + timeout();
    bool finished = cudaStreamQuery(stream_) == cudaSuccess;
    while (!finished && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
      finished = cudaStreamQuery(stream_) != cudaErrorNotReady;
    }
    ncclResult_t r = finished ? ncclCommFinalize(comm_) : ncclInternalError;
    if (r == ncclInProgress) r = settle(Clock::now() + timeout());
    if (r == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  } else if (comm_) {
    // already aborted by the watchdog
  }
  comm_ = nullptr;
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::watchdog() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(wd_mu_);
      if (wd_cv_.wait_for(lock, milliseconds(100), [&] { return stop_; })) return;
    }
    try {
      cuda::set_device(device_);
    } catch (...) {
    }
    // Errors NCCL found on its own (a peer's connection broke, ...).
    {
      std::unique_lock<std::mutex> lock(comm_mu_);
      if (comm_ && !aborted_) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress) {
          std::string msg = "NCCL reported an error on rank " + std::to_string(rank_) + ": " + describe(st) +
                            " (a peer may have died)";
          lock.unlock();
          fail(msg);
        }
      }
    }
    // Collectives past their time.
    std::string late;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto now = Clock::now();
      milliseconds limit = timeout();
      while (!pending_.empty()) {
        cudaError_t q = cudaEventQuery(pending_.front()->done);
        if (q == cudaSuccess) {
          pending_.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) {
          late = "collective " + pending_.front()->name + " on rank " + std::to_string(rank_) +
                 " failed: " + cudaGetErrorString(q);
          cudaGetLastError();  // a non-sticky error would be reported again by an unrelated call
          pending_.pop_front();
        } else if (now - pending_.front()->start > limit) {
          late = "collective " + pending_.front()->name + " on rank " + std::to_string(rank_) + " timed out after " +
                 net::format_duration(limit) + " (a peer may have died)";
        }
        break;  // collectives finish in issue order: the first unfinished one decides
      }
    }
    // The peers' progress is read once, outside the lock, and only for the first failure.
    if (!late.empty() && state_->get().empty()) fail(late + stalled_ranks_note());
  }
}

template <typename Calls>
std::shared_ptr<Pending> NcclCommunicator::issue(const char* name, std::vector<Tensor> keep, Calls&& calls) {
  std::lock_guard<std::mutex> lock(comm_mu_);
  std::string f = state_->get();
  TANDEM_RUNTIME_CHECK(f.empty(), "the nccl communicator of rank ", rank_, " can no longer be used: ", f);
  cuda::set_device(device_);
  auto p = std::make_shared<Pending>();
  p->name = name;
  p->keep = std::move(keep);
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
  // While the compute stream is being recorded, the communication stream joins the recording through
  // these events, and the collective becomes part of the graph: the watchdog watches its replays
  // (watch), not this call, whose events never fire.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamIsCapturing(cuda::compute_stream(device_), &capture));
  TANDEM_CUDA_CHECK(cudaEventRecord(ready_, cuda::compute_stream(device_)));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  p->start = Clock::now();
  note_collective();
  calls();
  TANDEM_CUDA_CHECK(cudaEventRecord(p->done, stream_));
  if (capture == cudaStreamCaptureStatusNone) {
    std::lock_guard<std::mutex> plock(pending_mu_);
    pending_.push_back(p);
  }
  return p;
}

void NcclCommunicator::watch(const char* what) {
  if (size() == 1) return;
  cuda::set_device(device_);
  auto p = std::make_shared<Pending>();
  p->name = what;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventRecord(p->done, cuda::compute_stream(device_)));
  p->start = Clock::now();
  std::lock_guard<std::mutex> plock(pending_mu_);
  pending_.push_back(p);
}

WorkPtr NcclCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(t, device(), "nccl", "all_reduce");
  ncclDataType_t dt = reduce_type(t.dtype());
  if (t.numel() == 0) return std::make_shared<DoneWork>();
  void* p = t.data_ptr();
  size_t n = static_cast<size_t>(t.numel());
  auto pend = issue("all_reduce", {t}, [&] {
    check(ncclAllReduce(p, p, n, dt, op == ReduceOp::Sum ? ncclSum : ncclAvg, comm_, stream_), "ncclAllReduce",
          "all_reduce");
  });
  return std::make_shared<NcclWork>(pend, state_, device_);
}

WorkPtr NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter(in, out, rank_, size_, device(), "nccl");
  ncclDataType_t dt = reduce_type(in.dtype(), "reduce_scatter");
  if (out.numel() == 0) return std::make_shared<DoneWork>();
  // In place when out is this rank's block of in, which NCCL supports as such.
  const void* send = in.data_ptr();
  void* recv = out.data_ptr();
  size_t n = static_cast<size_t>(out.numel());
  auto pend = issue("reduce_scatter", {in, out}, [&] {
    check(ncclReduceScatter(send, recv, n, dt, op == ReduceOp::Sum ? ncclSum : ncclAvg, comm_, stream_),
          "ncclReduceScatter", "reduce_scatter");
  });
  return std::make_shared<NcclWork>(pend, state_, device_);
}

WorkPtr NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather(in, out, rank_, size_, device(), "nccl");
  if (out.numel() == 0) return std::make_shared<DoneWork>();
  // Bytes: gathering moves data without looking at it, so every dtype goes. In place when in is this
  // rank's block of out, which NCCL supports as such.
  auto pend = issue("all_gather", {in, out}, [&] {
    check(ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_, stream_), "ncclAllGather",
          "all_gather");
  });
  return std::make_shared<NcclWork>(pend, state_, device_);
}

WorkPtr NcclCommunicator::all_gatherv(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) {
  check_all_gatherv(in, out, counts, rank_, size_, device(), "nccl");
  if (out.numel() == 0) return std::make_shared<DoneWork>();
  const size_t esize = dtype_size(out.dtype());
  auto pend = issue("all_gatherv", {in, out}, [&] {
    // One broadcast per contributing rank into its slice of out, fused into one launch by the group.
    check(ncclGroupStart(), "ncclGroupStart", "all_gatherv");
    ncclResult_t first = ncclSuccess;
    const char* first_call = nullptr;
    char* base = static_cast<char*>(out.data_ptr());
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(r)]) * esize;
      if (bytes > 0 && first == ncclSuccess) {
        const void* send = r == rank_ ? in.data_ptr() : base + offset;
        ncclResult_t res = ncclBroadcast(send, base + offset, bytes, ncclUint8, r, comm_, stream_);
        if (res != ncclSuccess && res != ncclInProgress) {
          first = res;
          first_call = "ncclBroadcast";
        }
      }
      offset += bytes;
    }
    ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed call in it
    if (first != ncclSuccess) check(first, first_call, "all_gatherv");
    check(end, "ncclGroupEnd", "all_gatherv");
  });
  return std::make_shared<NcclWork>(pend, state_, device_);
}

WorkPtr NcclCommunicator::broadcast(Tensor& t, int root) {
  check_tensor(t, device(), "nccl", "broadcast");
  check_root(root, size_);
  if (t.numel() == 0) return std::make_shared<DoneWork>();
  auto pend = issue("broadcast", {t}, [&] {
    check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast",
          "broadcast");
  });
  return std::make_shared<NcclWork>(pend, state_, device_);
}

void NcclCommunicator::barrier() {
  float* p = barrier_buf_.data<float>();
  auto pend = issue("barrier", {}, [&] {
    check(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce", "barrier");
  });
  // The host waits here, unlike other collectives; polling rather than synchronising lets a failure
  // found by the watchdog (which aborts the communicator) end the wait.
  int sleep_us = 20;
  for (;;) {
    cudaError_t q = cudaEventQuery(pend->done);
    if (q == cudaSuccess) break;
    std::string f = state_->get();
    TANDEM_RUNTIME_CHECK(f.empty(), f);
    if (q != cudaErrorNotReady) TANDEM_CUDA_CHECK(q);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 1000);
  }
  std::string f = state_->get();
  TANDEM_RUNTIME_CHECK(f.empty(), f);
}

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const GroupSpec& g) {
  return std::make_shared<NcclCommunicator>(g);
}

}  // namespace tandem::dist::detail
