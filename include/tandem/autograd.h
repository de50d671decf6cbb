#pragma once
// Reverse-mode automatic differentiation over an eagerly recorded graph.
#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem {

class Generator;

/// One recorded operation. backward maps the gradient of its output to gradients of its inputs
/// (an undefined Tensor where an input needs none).
struct Node {
  using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
  std::string name;
  uint64_t seq = 0;                         // creation order: later ops run first in backward
  std::vector<std::shared_ptr<Node>> next;  // one per input; null where the input needs no gradient
  BackwardFn backward;
  std::shared_ptr<TensorImpl> leaf;         // set for the node that accumulates into a leaf's grad
};

/// Called once per leaf, the moment its gradient is final during backward.
using GradReadyHook = std::function<void(const Tensor& leaf)>;

/// Back-propagates from a scalar loss (or from grad_output for other shapes) into every leaf that
/// requires a gradient; gradients accumulate into leaf.grad(). on_grad_ready is called per leaf as
/// soon as its gradient will not change again in this pass. The graph is freed afterwards.
void backward(const Tensor& loss, const GradReadyHook& on_grad_ready = {}, const Tensor& grad_output = {});

/// Called during backward for a leaf that has no gradient buffer yet, just before its first gradient is
/// written: it may give the leaf one (leaf.set_grad(buffer, /*zeroed=*/true)), which backward then writes or
/// adds into, or leave it without (the gradient is then adopted as usual). An optimizer that keeps gradients
/// only while a step needs them uses it to allocate them as backward reaches them.
using GradBufferProvider = std::function<void(const Tensor& leaf)>;

/// Makes `provider` the one backward consults on this thread while alive (the previous one after).
class GradBufferScope {
 public:
  explicit GradBufferScope(const GradBufferProvider* provider);
  ~GradBufferScope();
  GradBufferScope(const GradBufferScope&) = delete;
  GradBufferScope& operator=(const GradBufferScope&) = delete;

 private:
  const GradBufferProvider* prev_;
};

/// True unless a NoGradGuard is alive on this thread.
bool grad_enabled();

/// Disables graph recording on this thread while alive (evaluation, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Enables graph recording on this thread while alive, inside a NoGradGuard (a backward function that runs
/// ops again to differentiate them: recompute).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

/// Activation recompute (gradient checkpointing): y = fn(x), keeping none of fn's intermediate tensors for
/// backward. Backward runs fn on x again (under the precision mode in force at the forward), back-propagates
/// through that second run with the gradient y received, and hands the gradients of x and of `params` (the
/// tensors fn reads that take gradients: a block's parameters) on to the rest of the pass, whose leaves,
/// optimizer hooks and gradient buffers see them as from any op. The gradients are those of fn recorded
/// plainly, bit for bit on the CPU, when fn computes the same values both times. fn may draw random numbers
/// (dropout) from `generators` only: the second run starts each of them where the first began, so it draws
/// the same masks (the counter-based generator replays), and leaves them where they were before it. A second
/// run that draws a different count is an error. Outside grad mode, or when neither x nor a parameter takes a
/// gradient, it is fn(x).
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, const std::vector<Tensor>& params,
                 const std::vector<Generator*>& generators = {});
/// Whether this thread is running a recompute region the second time (in recompute's backward). Layers whose
/// forward updates state of their own (batch normalisation's running statistics) leave it as the first run left
/// it then, so that it moves once a step, as without recompute.
bool recomputing();

/// Selective recompute: while a region is open on this thread, mark_for_recompute(t, make) names a tensor of the
/// region that is cheap to make again (a norm's or an activation's output: `make` runs the same op on inputs
/// the graph keeps anyway). close_recompute_region(out) frees the marked tensors' memory (ops that saved them
/// for backward keep handles to empty storage) and returns out as the region's output: backward, on reaching
/// it, makes the marked tensors again into that same storage (under the precision mode of the forward, without
/// recording) before any op of the region reads them, so the gradients are those of the region recorded
/// plainly, bit for bit. A tensor that shares its storage with another (a view of a larger buffer), or is the
/// region's output, is left alone. Regions do not nest; outside grad mode marks are ignored.
class RecomputeRegion {
 public:
  RecomputeRegion();
  ~RecomputeRegion();
  RecomputeRegion(const RecomputeRegion&) = delete;
  RecomputeRegion& operator=(const RecomputeRegion&) = delete;
  /// Frees the marked tensors and returns out with the node that makes them again (out itself without marks).
  Tensor close(const Tensor& out);
  struct Mark;

 private:
  std::vector<std::shared_ptr<Mark>> marks_;
  std::vector<std::shared_ptr<Mark>>* prev_;
};
/// Marks t (an output of the open region, see RecomputeRegion) to be freed and made again by `make`; returns t.
/// Does nothing without an open region or outside grad mode.
const Tensor& mark_for_recompute(const Tensor& t, std::function<Tensor()> make);

/// Inside a backward function: a tensor the gradient of input `i` may be written into instead of a
/// new one (a leaf's gradient buffer that holds zeros and receives no other gradient in this pass;
/// contiguous, of the leaf's shape and dtype), or an undefined tensor. An op that fills it returns it
/// as that input's gradient, and the engine then has nothing to add.
Tensor grad_destination(size_t i);

/// Inside a backward function: the gradient input `i` has received so far in this pass (from the other
/// ops that read it), when nothing else refers to it, or an undefined tensor. An op may add its
/// gradient for that input into it and return it; the engine then has nothing to add.
Tensor grad_add_target(size_t i);

/// Attaches a backward function to an op's output when grad mode is on and an input needs a
/// gradient; returns out (now carrying the graph node). Used by every differentiable op.
Tensor record_op(Tensor out, std::initializer_list<Tensor> inputs, const char* name, Node::BackwardFn fn);
/// record_op for ops of any number of inputs (concat).
Tensor record_op(Tensor out, const std::vector<Tensor>& inputs, const char* name, Node::BackwardFn fn);

}  // namespace tandem
