#pragma once
// Internal: the parameters' side of sharded state (ZeRO). The parameters move into one flat buffer
// laid out as the reducer's gradient arena (every bucket padded to one block per rank), so that rank
// r's block r of every bucket is a slice of each parameter it touches. An optimizer of the wrapped
// one's kind and settings steps those slices only, reading their gradients from the reducer's blocks
// of the averages: its state exists for them alone. After the step, every bucket's parameter blocks
// are all-gathered in place, and every rank holds the whole model again.
#include <memory>
#include <string>
#include <vector>

#include "distributed/engine/reducer.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist::detail {

/// One slice of a parameter that this rank steps.
struct ShardPiece {
  int param = 0;       // the wrapped optimizer's index
  int64_t start = 0;   // first element of the slice within the parameter
  int64_t numel = 0;
  int bucket = 0;      // the bucket it lies in
  int64_t offset = 0;  // where the slice starts in the parameter buffer (and the gradient arena)
};

class ShardedStep {
 public:
  /// Moves `params` into the parameter buffer (each keeps its identity and now views the buffer) and
  /// makes the optimizer of this rank's slices after `opt`.
  ShardedStep(const std::vector<Tensor>& params, const Reducer& reducer, std::shared_ptr<Communicator> comm,
              CommStats& stats, const optim::Optimizer& opt);

  /// Every rank takes root's parameters.
  void broadcast(int root);
  /// Steps this rank's slices with `opt`'s settings (learning rate, schedule, step count, group
  /// settings, step guard), counts the step in `opt`, then all-gathers the parameters.
  void step(optim::Optimizer& opt);
  /// Averages the parameters across ranks.
  void average();
  /// Collective: `opt`'s state lists (and step counts) receive the whole state, gathered from every
  /// rank's slices, as if `opt` had taken the steps itself (for a checkpoint of it).
  void gather_state(optim::Optimizer& opt);
  /// Moves whatever state `opt` holds (a checkpoint loaded into it, or gather_state's) into this
  /// rank's slices, cut from each parameter's, and drops it from `opt`. Returns whether it held any.
  bool adopt_state(optim::Optimizer& opt);

  /// The optimizer of this rank's slices (its parameter i is pieces()[i]).
  optim::Optimizer& stepper() { return *stepper_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  /// Bytes of the parameter buffer.
  int64_t parameter_bytes() const { return static_cast<int64_t>(arena_.nbytes()); }
  /// Elements this rank steps (the optimizer's state is this many per copy).
  int64_t stepped_elements() const { return stepped_; }

 private:
  void gather();
  std::shared_ptr<Communicator> comm_;
  CommStats& stats_;
  const Reducer& reducer_;
  Tensor arena_;
  std::vector<ShardPiece> pieces_;                 // in the order of the stepping optimizer's parameters
  std::vector<std::vector<size_t>> bucket_pieces_;  // per bucket, its pieces' indices
  std::shared_ptr<optim::Optimizer> stepper_;
  int64_t stepped_ = 0;
};

}  // namespace tandem::dist::detail
