// The group of one process: single-process and distributed training share one code path.
#include <atomic>

#include "distributed/comm/collective_args.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(Device device) : device_(device) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend_name() const override { return "single"; }
  Device device() const override { return device_; }

  WorkPtr all_reduce(Tensor& t, ReduceOp op) override {
    detail::check_tensor(t, device_, "single", "all_reduce");
    return done();  // the sum, and the average, over one rank is the tensor itself
  }

  WorkPtr all_gather(const Tensor& in, Tensor& out) override {
    detail::check_all_gather(in, out, 0, 1, device_, "single");
    if (in.data_ptr() != out.data_ptr() && in.numel() > 0) out.copy_(in);
    return done();
  }

  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) override {
    detail::check_reduce_scatter(in, out, 0, 1, device_, "single");
    if (in.data_ptr() != out.data_ptr() && in.numel() > 0) out.copy_(in);
    return done();
  }

  WorkPtr all_gatherv(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) override {
    detail::check_all_gatherv(in, out, counts, 0, 1, device_, "single");
    if (!in.is_same(out) && in.numel() > 0) out.copy_(in);
    return done();
  }

  WorkPtr broadcast(Tensor& t, int root) override {
    detail::check_tensor(t, device_, "single", "broadcast");
    detail::check_root(root, 1);
    return done();
  }

  void barrier() override {}
  void set_timeout(std::chrono::milliseconds t) override {
    TANDEM_CHECK(t.count() > 0, "set_timeout: the timeout must be positive");
  }

 private:
  static WorkPtr done() {
    static const WorkPtr w = std::make_shared<detail::DoneWork>();
    return w;
  }
  Device device_;
};

}  // namespace

std::shared_ptr<Communicator> make_single_communicator(Device device) {
  check_device(device);
  return std::make_shared<SingleCommunicator>(device);
}

}  // namespace tandem::dist
