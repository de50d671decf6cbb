#pragma once
// Internal: argument checks every communicator applies before a collective, so that all backends
// reject the same mistakes with the same messages, and a Work that is already finished.
#include <cstdint>
#include <vector>

#include "tandem/distributed/communicator.h"

namespace tandem::dist::detail {

/// "all_reduce", ...: names used in messages.
const char* reduce_op_name(ReduceOp op);

/// t is defined, contiguous and on `device`; `what` names the collective and the argument.
void check_tensor(const Tensor& t, Device device, const char* backend, const char* what);
/// in [n] and out [size * n] of one dtype; in is out's block `rank` or shares no storage with it.
void check_all_gather(const Tensor& in, const Tensor& out, int rank, int size, Device device, const char* backend);
/// in [size * n] and out [n] of one dtype; out is in's block `rank` or shares no storage with it.
void check_reduce_scatter(const Tensor& in, const Tensor& out, int rank, int size, Device device,
                          const char* backend);
/// Whether part is block `rank` of whole (blocks of part's size): a collective's in-place form.
bool is_block(const Tensor& part, const Tensor& whole, int rank);
/// counts has one entry per rank, none negative; in holds counts[rank]; out holds their sum.
void check_all_gatherv(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, int rank, int size,
                       Device device, const char* backend);
/// 0 <= root < size.
void check_root(int root, int size);

/// A collective that finished (or had nothing to do) before it was returned.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

}  // namespace tandem::dist::detail
