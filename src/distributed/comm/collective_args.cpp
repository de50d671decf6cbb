#include "distributed/comm/collective_args.h"

#include "tandem/error.h"

namespace tandem::dist::detail {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

void check_tensor(const Tensor& t, Device device, const char* backend, const char* what) {
  TANDEM_CHECK(t.defined(), what, ": the tensor is undefined");
  TANDEM_CHECK(t.device() == device, what, ": the ", backend, " communicator moves tensors on ", device.str(),
               ", got ", t.str(), device.is_cpu() ? " (copy it with .cpu(), or use a communicator for the GPU)"
                                                  : " (copy it to that GPU first)");
  TANDEM_CHECK(t.is_contiguous(), what, ": ", t.str(), " must be contiguous (call .contiguous() first)");
}

bool is_block(const Tensor& part, const Tensor& whole, int rank) {
  return part.shares_storage(whole) &&
         static_cast<const char*>(part.data_ptr()) ==
             static_cast<const char*>(whole.data_ptr()) + static_cast<size_t>(rank) * part.nbytes();
}

void check_all_gather(const Tensor& in, const Tensor& out, int rank, int size, Device device, const char* backend) {
  check_tensor(in, device, backend, "all_gather input");
  check_tensor(out, device, backend, "all_gather output");
  TANDEM_CHECK(in.dtype() == out.dtype(), "all_gather: input ", in.str(), " and output ", out.str(),
               " differ in dtype");
  TANDEM_CHECK(out.numel() == in.numel() * size, "all_gather: the output ", out.str(), " must hold ", size,
               " x ", in.numel(), " = ", in.numel() * size, " elements (one input per rank)");
  TANDEM_CHECK(!in.shares_storage(out) || in.numel() == 0 || size == 1 || is_block(in, out, rank),
               "all_gather: the input must be this rank's block of the output (rank ", rank,
               ", in place) or share no storage with it");
}

void check_reduce_scatter(const Tensor& in, const Tensor& out, int rank, int size, Device device,
                          const char* backend) {
  check_tensor(in, device, backend, "reduce_scatter input");
  check_tensor(out, device, backend, "reduce_scatter output");
  TANDEM_CHECK(in.dtype() == out.dtype(), "reduce_scatter: input ", in.str(), " and output ", out.str(),
               " differ in dtype");
  TANDEM_CHECK(in.numel() == out.numel() * size, "reduce_scatter: the input ", in.str(), " must hold ", size,
               " x ", out.numel(), " = ", out.numel() * size, " elements (one block of the output's size per rank)");
  TANDEM_CHECK(!in.shares_storage(out) || out.numel() == 0 || is_block(out, in, rank),
               "reduce_scatter: the output must be this rank's block of the input (rank ", rank,
               ", in place) or share no storage with it");
}

void check_all_gatherv(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, int rank, int size,
                       Device device, const char* backend) {
  check_tensor(in, device, backend, "all_gatherv input");
  check_tensor(out, device, backend, "all_gatherv output");
  TANDEM_CHECK(in.dtype() == out.dtype(), "all_gatherv: input ", in.str(), " and output ", out.str(),
               " differ in dtype");
  TANDEM_CHECK(static_cast<int>(counts.size()) == size, "all_gatherv: counts has ", counts.size(),
               " entries but the group has ", size, " ranks");
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    TANDEM_CHECK(counts[r] >= 0, "all_gatherv: counts[", r, "] = ", counts[r], " is negative");
    total += counts[r];
  }
  TANDEM_CHECK(in.numel() == counts[static_cast<size_t>(rank)], "all_gatherv: rank ", rank, " passed ", in.str(),
               " but counts[", rank, "] = ", counts[static_cast<size_t>(rank)]);
  TANDEM_CHECK(out.numel() == total, "all_gatherv: the output ", out.str(), " must hold the sum of counts, ", total,
               " elements");
  TANDEM_CHECK(!in.shares_storage(out) || in.numel() == 0 || size == 1,
               "all_gatherv: the input must not share storage with the output");
}

void check_root(int root, int size) {
  TANDEM_CHECK(root >= 0 && root < size, "broadcast: root ", root, " is not a rank of this group (0 .. ", size - 1,
               ")");
}

}  // namespace tandem::dist::detail
