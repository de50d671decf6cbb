// The Gloo communicator: CPU tensors over TCP. Collectives run one after another on a worker thread
// owned by the communicator, in the order they were called, so that every rank issues them in the
// same order and the caller overlaps them with its own work.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "distributed/comm/collective_args.h"
#include "distributed/comm/gloo/gloo_reduce.h"
#include "distributed/launch/progress.h"
#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

namespace {

using std::chrono::milliseconds;

// The slot prefix of tandem's own collectives built from Gloo's point-to-point buffers (Gloo's own
// prefixes are 0x01 to 0x08); tags keep collectives apart within it.
constexpr uint8_t kReduceScatterSlot = 0x40;

// Gloo's rendezvous interface over the job's store, with this communicator's key prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(dist::Store& store, std::string prefix, milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get(prefix_ + key, timeout_, "a peer did not publish its Gloo address");
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    milliseconds t = timeout.count() > 0 ? timeout : timeout_;
    for (const auto& k : keys) store_.get(prefix_ + k, t, "a peer did not publish its Gloo address");
  }

 private:
  dist::Store& store_;
  std::string prefix_;
  milliseconds timeout_;
};

// Gloo prefixes its messages with "[file:line] ".
std::string strip_location(const std::string& msg) {
  if (!msg.empty() && msg[0] == '[') {
    size_t close = msg.find("] ");
    if (close != std::string::npos) return msg.substr(close + 2);
  }
  return msg;
}

// Completion of one queued collective.
class GlooWork final : public Work {
 public:
  // The collective's tensors are held until the caller has waited for it (or dropped it), as NCCL's work holds
  // them until the stream that used them is waited for: what a step holds then does not depend on when the
  // worker thread got to the collective (the memory plan counts it so).
  void wait() override {
    std::function<void()> release;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return finished_; });
      release = std::move(held_);
      held_ = nullptr;
      if (error_) {
        lock.unlock();
        release = nullptr;
        std::rethrow_exception(error_);
      }
    }
    release = nullptr;  // the tensors go here, on the waiting thread
  }
  /// Keeps `tensors` (a callable holding them) until wait().
  void hold(std::function<void()> tensors) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = std::move(tensors);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }
  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      error_ = std::move(e);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::exception_ptr error_;
  std::function<void()> held_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GroupSpec& g);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend_name() const override { return "gloo"; }
  Device device() const override { return Device::cpu(); }

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

 private:
  // A collective body: gets its tag and timeout, runs on the worker thread.
  using Body = std::function<void(uint32_t tag, milliseconds timeout)>;
  WorkPtr enqueue(const char* name, Body body);
  // all_gather and all_gatherv, once checked.
  WorkPtr gather(const char* name, const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts);
  void run_worker();
  void throw_if_broken();

  int rank_, size_, local_rank_, local_size_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::atomic<int64_t> timeout_ms_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  uint32_t next_tag_ = 1;
  std::string broken_;  // the first failure; every later collective reports it
  std::thread worker_;
};

GlooCommunicator::GlooCommunicator(const GroupSpec& g)
    : rank_(g.rank), size_(g.size), local_rank_(g.local_rank), local_size_(g.local_size),
      timeout_ms_(g.timeout.count()) {
  // Gloo writes to sockets with writev: a peer that died would otherwise kill this process with
  // SIGPIPE instead of failing the collective. Only the default disposition is changed.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO))
    signal(SIGPIPE, SIG_IGN);

  gloo::transport::tcp::attr attr;
  attr.hostname = g.single_host ? "127.0.0.1" : g.address;
  try {
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    ctx_ = std::make_shared<gloo::rendezvous::Context>(g.rank, g.size);
    ctx_->setTimeout(g.timeout);
    StoreAdapter adapter(*g.store, g.prefix + "gloo/", g.timeout);
    ctx_->connectFullMesh(adapter, dev);
    // A rank's side of the mesh may be complete before its peers' sides are: meeting once more here
    // means that no rank leaves init_communicator before every connection is up.
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(0);
    opts.setTimeout(g.timeout);
    gloo::barrier(opts);
  } catch (const gloo::Exception& e) {
    TANDEM_RUNTIME_CHECK(false, "gloo: rank ", g.rank, " could not connect to its peers (listening on ",
                         attr.hostname, "): ", strip_location(e.what()),
                         g.single_host ? "" : " (set TANDEM_SOCKET_IFNAME to the interface the hosts share)");
  }
  worker_ = std::thread([this] { run_worker(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();  // queued collectives still run: the peers expect them
}

void GlooCommunicator::run_worker() {
  pthread_setname_np(pthread_self(), "tandem-gloo");
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void GlooCommunicator::throw_if_broken() {
  // the caller holds mu_
  TANDEM_RUNTIME_CHECK(broken_.empty(), "the gloo communicator of rank ", rank_,
                       " can no longer be used: ", broken_);
}

WorkPtr GlooCommunicator::enqueue(const char* name, Body body) {
  auto work = std::make_shared<GlooWork>();
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_broken();
  uint32_t tag = next_tag_++;
  note_collective();
  milliseconds timeout(timeout_ms_.load());
  queue_.push_back([this, work, name, tag, timeout, body = std::move(body)]() mutable {
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure = broken_;
    }
    if (!failure.empty()) {
      work->finish(std::make_exception_ptr(
          Error(Error::Kind::Runtime, "collective " + std::string(name) + " on rank " + std::to_string(rank_) +
                                          " was not run: an earlier collective failed: " + failure)));
      return;
    }
    try {
      body(tag, timeout);
      // The tensors the body captured stay with the work until its caller waits for it.
      work->hold([kept = std::make_shared<Body>(std::move(body))] {});
      body = nullptr;
      work->finish(nullptr);
    } catch (const gloo::Exception& e) {
      std::string what = strip_location(e.what());
      std::string msg = "collective " + std::string(name) + " on rank " + std::to_string(rank_);
      if (what.find("Timed out") != std::string::npos)
        msg += " timed out after " + net::format_duration(timeout) + " (a peer may have died)" + stalled_ranks_note();
      else
        msg += " failed: " + what + " (a peer may have died)";
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (broken_.empty()) broken_ = msg;
      }
      work->finish(std::make_exception_ptr(Error(Error::Kind::Runtime, msg)));
    } catch (...) {
      work->finish(std::current_exception());
    }
  });
  cv_.notify_one();
  return work;
}

WorkPtr GlooCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(t, Device::cpu(), "gloo", "all_reduce");
  gloo_detail::ReduceFn fn = gloo_detail::sum_function(t.dtype());
  if (t.numel() == 0) return std::make_shared<DoneWork>();
  Tensor keep = t;
  return enqueue("all_reduce", [this, keep, fn, op](uint32_t tag, milliseconds timeout) {
    const size_t n = static_cast<size_t>(keep.numel());
    const size_t esize = dtype_size(keep.dtype());
    gloo::AllreduceOptions opts(ctx_);
    // Gloo only needs the element size; the reduction function knows the type.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> out;
    out.push_back(ctx_->createUnboundBuffer(keep.data_ptr(), n * esize));
    if (esize == 2)
      opts.setOutputs<uint16_t>(std::move(out));
    else if (esize == 4)
      opts.setOutputs<uint32_t>(std::move(out));
    else
      opts.setOutputs<uint64_t>(std::move(out));
    opts.setReduceFunction(fn);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
    if (op == ReduceOp::Avg) gloo_detail::divide_in_place(keep.data_ptr(), n, keep.dtype(), size_);
  });
}

// A ring: at step s (of size - 1) rank r sends its partial sum of block r - s - 1 (mod size) to rank
// r + 1 and receives block r - s - 2 from rank r - 1, to which it adds its own values; the block it
// receives last is its own, summed over every rank. Each rank sends (size - 1) / size of the input,
// half an all-reduce's traffic.
WorkPtr GlooCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter(in, out, rank_, size_, Device::cpu(), "gloo");
  gloo_detail::ReduceFn fn = gloo_detail::sum_function(in.dtype(), "reduce_scatter");
  if (out.numel() == 0) return std::make_shared<DoneWork>();
  Tensor kin = in, kout = out;
  return enqueue("reduce_scatter", [this, kin, kout, fn, op](uint32_t tag, milliseconds timeout) {
    const size_t n = static_cast<size_t>(kout.numel()), bytes = kout.nbytes();
    char* input = static_cast<char*>(kin.data_ptr());
    if (size_ == 1) {
      if (kout.data_ptr() != input) std::memcpy(kout.data_ptr(), input, bytes);
      return;
    }
    auto block = [&](int k) { return ((k % size_) + size_) % size_; };
    std::vector<char> partial(size_ > 2 ? bytes : 0), received(bytes);
    auto input_buf = ctx_->createUnboundBuffer(input, kin.nbytes());
    auto partial_buf = size_ > 2 ? ctx_->createUnboundBuffer(partial.data(), bytes) : nullptr;
    auto received_buf = ctx_->createUnboundBuffer(received.data(), bytes);
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlot, tag);
    for (int s = 0; s + 1 < size_; ++s) {
      gloo::transport::UnboundBuffer& from = s == 0 ? *input_buf : *partial_buf;
      from.send(next, slot, s == 0 ? static_cast<size_t>(block(rank_ - 1)) * bytes : 0, bytes);
      received_buf->recv(prev, slot, 0, bytes);
      TANDEM_RUNTIME_CHECK(received_buf->waitRecv(timeout) && from.waitSend(timeout), "reduce_scatter on rank ",
                           rank_, " was aborted");
      const int k = block(rank_ - s - 2);
      void* dst = s + 2 == size_ ? kout.data_ptr() : partial.data();  // the last block received is ours
      fn(dst, received.data(), input + static_cast<size_t>(k) * bytes, n);
    }
    if (op == ReduceOp::Avg) gloo_detail::divide_in_place(kout.data_ptr(), n, kout.dtype(), size_);
  });
}

WorkPtr GlooCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather(in, out, rank_, size_, Device::cpu(), "gloo");
  return gather("all_gather", in, out, std::vector<int64_t>(static_cast<size_t>(size_), in.numel()));
}

WorkPtr GlooCommunicator::all_gatherv(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) {
  check_all_gatherv(in, out, counts, rank_, size_, Device::cpu(), "gloo");
  return gather("all_gatherv", in, out, counts);
}

WorkPtr GlooCommunicator::gather(const char* name, const Tensor& in, const Tensor& out,
                                 const std::vector<int64_t>& counts) {
  if (out.numel() == 0) return std::make_shared<DoneWork>();
  Tensor kin = in, kout = out;
  return enqueue(name, [this, kin, kout, counts](uint32_t tag, milliseconds timeout) {
    const size_t esize = dtype_size(kout.dtype());
    std::vector<size_t> bytes(counts.size());
    size_t offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      bytes[r] = static_cast<size_t>(counts[r]) * esize;
      if (static_cast<int>(r) < rank_) offset += bytes[r];
    }
    // Place this rank's share ourselves (unless it is there already: in place): Gloo then only moves
    // the others' shares.
    char* mine = static_cast<char*>(kout.data_ptr()) + offset;
    if (kin.numel() > 0 && kin.data_ptr() != mine) std::memcpy(mine, kin.data_ptr(), kin.nbytes());
    gloo::AllgathervOptions opts(ctx_);
    opts.setOutput<char>(static_cast<char*>(kout.data_ptr()), bytes);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allgatherv(opts);
  });
}

WorkPtr GlooCommunicator::broadcast(Tensor& t, int root) {
  check_tensor(t, Device::cpu(), "gloo", "broadcast");
  check_root(root, size_);
  if (t.numel() == 0) return std::make_shared<DoneWork>();
  Tensor keep = t;
  return enqueue("broadcast", [this, keep, root](uint32_t tag, milliseconds timeout) {
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput<char>(static_cast<char*>(keep.data_ptr()), keep.nbytes());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::barrier() {
  enqueue("barrier", [this](uint32_t tag, milliseconds timeout) {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  })->wait();
}

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(const GroupSpec& g) {
  return std::make_shared<GlooCommunicator>(g);
}

}  // namespace tandem::dist::detail
