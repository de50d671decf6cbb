// The backward engine: dependency counting over the recorded graph, then a ready queue that runs
// gradient accumulation into leaves first (so hooks fire as early as possible) and otherwise the
// most recently recorded op first (reverse of forward order).
#include <atomic>
#include <queue>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "autograd/column_sums.h"
#include "autograd/retain_graph.h"
#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "ops/op_utils.h"
#include "core/allocator.h"
#include "tandem/autograd.h"
#include "tandem/random.h"
#include "tandem/precision.h"
#include "tandem/profiler.h"

namespace tandem {

namespace {
void run_backward(const Tensor& loss, const GradReadyHook& on_grad_ready, Tensor seed, bool inner = false);
thread_local bool t_grad_enabled = true;
thread_local bool t_retain_graph = false;
std::atomic<uint64_t> g_seq{0};
std::atomic<uint64_t> g_passes{0};
thread_local uint64_t t_pass = 0;  // the backward pass running on this thread, 0 outside one

std::shared_ptr<Node> accumulator_for(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl();
  std::shared_ptr<Node> n = impl->grad_accumulator.lock();
  if (!n) {
    n = std::make_shared<Node>();
    n->name = "AccumulateGrad";
    n->seq = g_seq++;
    n->leaf = leaf.impl_ptr();
    impl->grad_accumulator = n;
  }
  return n;
}

// Where the op running backward may write its inputs' gradients (see grad_destination), and the
// gradients it may add into (see grad_add_target).
thread_local const std::vector<Tensor>* t_destinations = nullptr;
thread_local const std::vector<Tensor>* t_add_targets = nullptr;
thread_local const GradBufferProvider* t_grad_buffers = nullptr;  // GradBufferScope
// recompute's backward: the leaves' gradients of its inner pass, kept here instead of in the leaves.
thread_local std::unordered_map<TensorImpl*, Tensor>* t_captured = nullptr;
thread_local bool t_recomputing = false;  // recompute's second run, in backward

// Lets the provider in force give `leaf` a gradient buffer, where it has none.
void provide_buffer(const std::shared_ptr<TensorImpl>& leaf_impl) {
  if (t_grad_buffers && *t_grad_buffers && !leaf_impl->grad) (*t_grad_buffers)(Tensor(leaf_impl));
}

void accumulate(const std::shared_ptr<TensorImpl>& leaf_impl, Tensor g) {
  Tensor leaf(leaf_impl);
  TANDEM_ASSERT(g.numel() == leaf.numel(), "gradient ", g.str(), " for leaf ", leaf.str());
  if (t_captured) {
    // Handed on unchanged (with the column sums it carries) when it is the only contribution.
    if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
    g = g.contiguous();
    if (g.shape() != leaf.shape()) g = g.view(leaf.shape());
    Tensor& held = (*t_captured)[leaf_impl.get()];
    if (!held.defined()) {
      held = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 ? g : g.clone();
    } else {
      drop_column_sums(held);
      backend::backend_for(held.device()).binary(backend::Binary::Add, held, g, held);
    }
    return;
  }
  drop_column_sums(g);  // a leaf may adopt the buffer and write it later
  provide_buffer(leaf_impl);
  if (leaf_impl->grad && leaf_impl->grad_zeroed) {
    // The buffer holds zeros: the gradient is written over it (one conversion at most), or already is.
    leaf_impl->grad_zeroed = false;
    Tensor acc(leaf_impl->grad);
    if (g.data_ptr() == acc.data_ptr() && g.dtype() == acc.dtype() && g.is_contiguous()) return;
    if (g.device() != acc.device()) g = g.to(acc.device());
    if (g.shape() != acc.shape()) g = g.contiguous().view(acc.shape());
    acc.copy_(g);
    return;
  }
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  if (g.device() != leaf.device()) g = g.to(leaf.device());
  g = g.contiguous();
  if (g.shape() != leaf.shape()) g = g.view(leaf.shape());
  if (!leaf_impl->grad) {
    // Adopt the incoming buffer when nothing else refers to it; copy otherwise.
    bool sole = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1;
    leaf_impl->grad = sole ? g.impl_ptr() : g.clone().impl_ptr();
    return;
  }
  Tensor acc(leaf_impl->grad);
  backend::backend_for(acc.device()).binary(backend::Binary::Add, acc, g, acc);
}

struct Ready {
  Node* node;
  bool operator<(const Ready& o) const {
    bool a = node->leaf != nullptr, b = o.node->leaf != nullptr;
    if (a != b) return !a;          // leaves first
    return node->seq < o.node->seq;  // then the latest op
  }
};
}  // namespace

bool grad_enabled() { return t_grad_enabled; }

EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, const std::vector<Tensor>& params,
                 const std::vector<Generator*>& generators) {
  TANDEM_CHECK(x.defined(), "recompute: the input is an undefined tensor");
  bool any = x.requires_grad();
  for (const Tensor& p : params) any = any || (p.defined() && p.requires_grad());
  if (!t_grad_enabled || !any) return fn(x);
  const Precision precision = current_precision();
  // Where each generator stood before the first run and after it: the second run starts from the first's
  // counters (the same dropout masks) and must end where the first ended.
  std::vector<uint64_t> begin(generators.size()), end(generators.size());
  for (size_t i = 0; i < generators.size(); ++i) {
    TANDEM_CHECK(generators[i] != nullptr, "recompute: generator ", i, " is null");
    begin[i] = generators[i]->offset();
  }
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  for (size_t i = 0; i < generators.size(); ++i) end[i] = generators[i]->offset();
  TANDEM_CHECK(y.defined() && is_floating(y.dtype()), "recompute: fn must return a floating-point tensor, got ",
               y.defined() ? y.str() : std::string("an undefined tensor"));
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  const Tensor saved = x.detach();
  const bool x_grad = x.requires_grad();
  return record_op(y, inputs, "recompute", [fn, saved, params, precision, x_grad, generators, begin,
                                            end](const Tensor& g) {
    PrecisionScope in_precision(precision);
    Tensor xr = saved.detach();
    if (x_grad) xr.requires_grad_();
    std::unordered_map<TensorImpl*, Tensor> captured;
    Tensor yr;
    {
      // The generators replay the first run's draws, then return to where the rest of the step left them.
      struct Replay {
        const std::vector<Generator*>& gens;
        std::vector<uint64_t> now;
        ~Replay() {
          for (size_t i = 0; i < gens.size(); ++i) gens[i]->set_offset(now[i]);
        }
      } replay{generators, {}};
      for (size_t i = 0; i < generators.size(); ++i) {
        replay.now.push_back(generators[i]->offset());
        generators[i]->set_offset(begin[i]);
      }
      EnableGradGuard grad_on;
      struct Recomputing {
        bool prev = t_recomputing;
        Recomputing() { t_recomputing = true; }
        ~Recomputing() { t_recomputing = prev; }
      } recomputing_now;
      yr = fn(xr);
      for (size_t i = 0; i < generators.size(); ++i)
        TANDEM_CHECK(generators[i]->offset() == end[i], "recompute: the second run of the region drew ",
                     generators[i]->offset() - begin[i], " random numbers from generator ", i, ", the first ",
                     end[i] - begin[i], ": the region must draw the same numbers each time it runs");
    }
    std::vector<Tensor> grads(params.size() + 1);
    if (yr.requires_grad()) {
      struct Capture {
        std::unordered_map<TensorImpl*, Tensor>* prev = t_captured;
        ~Capture() { t_captured = prev; }
      } capture;
      t_captured = &captured;
      // A seed of its own (a clone), so that the inner pass adds into it where the plain pass would, carrying the
      // column sums the gradient came with; the inner pass is a part of this one (the sums stay valid in it).
      Tensor seed = g.dtype() == yr.dtype() ? g.clone() : g.to(yr.dtype());
      const ColumnSums* sums = g.is_contiguous() ? g.impl()->storage->column_sums.get() : nullptr;
      if (sums && sums->pass == t_pass && sums->offset == g.impl()->offset && sums->numel == g.numel() &&
          sums->dtype == seed.dtype())
        set_column_sums(seed, sums->cols, sums->sums);
      run_backward(yr, {}, std::move(seed), /*inner=*/true);
    }
    auto take = [&](const Tensor& t) {
      auto it = captured.find(t.impl());
      return it == captured.end() ? Tensor() : it->second;
    };
    if (x_grad) grads[0] = take(xr);
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].defined() && params[i].requires_grad()) grads[i + 1] = take(params[i]);
    return grads;
  });
}

bool recomputing() { return t_recomputing; }

// ---- selective recompute

struct RecomputeRegion::Mark {
  std::weak_ptr<Storage> storage;  // emptied by close(), filled again by the region's node in backward
  int64_t offset = 0;              // where the marked tensor starts in it
  std::function<Tensor()> make;
  Allocator* allocator = nullptr;
  size_t nbytes = 0;
};

namespace {
thread_local std::vector<std::shared_ptr<RecomputeRegion::Mark>>* t_region = nullptr;
}  // namespace

RecomputeRegion::RecomputeRegion() : prev_(t_region) {
  TANDEM_CHECK(t_region == nullptr, "RecomputeRegion: regions do not nest");
  t_region = &marks_;
}

RecomputeRegion::~RecomputeRegion() { t_region = prev_; }

const Tensor& mark_for_recompute(const Tensor& t, std::function<Tensor()> make) {
  if (!t_region || !t_grad_enabled || !t.defined() || !t.impl()->storage) return t;
  auto m = std::make_shared<RecomputeRegion::Mark>();
  m->storage = t.impl()->storage;
  m->offset = t.impl()->offset;
  m->make = std::move(make);
  t_region->push_back(std::move(m));
  return t;
}

Tensor RecomputeRegion::close(const Tensor& out) {
  t_region = prev_;
  std::vector<std::shared_ptr<Mark>> freed;
  for (auto& m : marks_) {
    std::shared_ptr<Storage> st = m->storage.lock();
    // Left alone: gone already, not owned, or the output's own memory.
    if (!st || !st->allocator || !st->ptr || (out.defined() && out.impl()->storage == st)) continue;
    m->allocator = st->allocator;
    m->nbytes = st->nbytes;
    m->allocator->deallocate(st->ptr, st->nbytes);
    st->ptr = nullptr;
    st->allocator = nullptr;
    freed.push_back(m);
  }
  marks_.clear();
  if (freed.empty() || !out.defined() || !out.requires_grad()) return out;
  const Precision precision = current_precision();
  Tensor alias = out.detach();
  return record_op(alias, {out}, "recompute_region", [freed, precision](const Tensor& g) {
    PrecisionScope in_precision(precision);
    for (const auto& m : freed) {
      std::shared_ptr<Storage> st = m->storage.lock();
      if (!st) continue;  // nothing kept it for backward
      // Made as the forward made it (grad mode on: ops choose their layout by it, e.g. rows padded for a
      // product's bias gradient); the graph of this run is dropped with it.
      Tensor v;
      {
        EnableGradGuard as_in_forward;
        v = m->make();
      }
      const std::shared_ptr<Storage> made = v.impl()->storage;
      TANDEM_CHECK(made && made->nbytes == m->nbytes && made->allocator && v.impl()->offset == m->offset,
                   "selective recompute: a marked tensor was made again in another layout (", v.str(), ", ",
                   made ? made->nbytes : 0, " bytes at element ", v.impl()->offset, " against ", m->nbytes,
                   " bytes at element ", m->offset, ")");
      st->ptr = made->ptr;
      st->allocator = made->allocator;
      st->padded_ld = made->padded_ld;
      st->padded_cols = made->padded_cols;
      made->ptr = nullptr;
      made->allocator = nullptr;
    }
    return std::vector<Tensor>{g};
  });
}

GradBufferScope::GradBufferScope(const GradBufferProvider* provider) : prev_(t_grad_buffers) { t_grad_buffers = provider; }
GradBufferScope::~GradBufferScope() { t_grad_buffers = prev_; }

Tensor grad_destination(size_t i) {
  return t_destinations && i < t_destinations->size() ? (*t_destinations)[i] : Tensor();
}

Tensor grad_add_target(size_t i) {
  Tensor t = t_add_targets && i < t_add_targets->size() ? (*t_add_targets)[i] : Tensor();
  drop_column_sums(t);  // the caller adds into it
  return t;
}

void set_column_sums(const Tensor& t, int64_t cols, const Tensor& sums) {
  if (!t.defined() || t_pass == 0 || cols <= 0 || !t.is_contiguous() || t.numel() % cols != 0) return;
  TANDEM_ASSERT(sums.defined() && sums.numel() == cols && sums.dtype() == DType::f32, "column sums ", sums.str(),
                " for ", cols, " columns");
  auto h = std::make_unique<ColumnSums>();
  h->sums = sums;
  h->offset = t.impl()->offset;
  h->numel = t.numel();
  h->cols = cols;
  h->dtype = t.dtype();
  h->pass = t_pass;
  t.impl()->storage->column_sums = std::move(h);
}

Tensor column_sums_of(const Tensor& t, int64_t cols) {
  if (!t.defined() || t_pass == 0 || !t.is_contiguous()) return Tensor();
  const ColumnSums* h = t.impl()->storage->column_sums.get();
  if (!h || h->pass != t_pass || h->offset != t.impl()->offset || h->numel != t.numel() || h->cols != cols ||
      h->dtype != t.dtype())
    return Tensor();
  return h->sums;
}

void drop_column_sums(const Tensor& t) {
  if (t.defined() && t.impl()->storage) t.impl()->storage->column_sums.reset();
}

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

RetainGraphGuard::RetainGraphGuard() : prev_(t_retain_graph) { t_retain_graph = true; }
RetainGraphGuard::~RetainGraphGuard() { t_retain_graph = prev_; }
bool retaining_graph() { return t_retain_graph; }

namespace {
Tensor record(Tensor out, const Tensor* begin, const Tensor* end, const char* name, Node::BackwardFn fn) {
  if (!t_grad_enabled) return out;
  std::vector<std::shared_ptr<Node>> next;
  next.reserve(static_cast<size_t>(end - begin));
  bool any = false;
  for (const Tensor* it = begin; it != end; ++it) {
    const Tensor& in = *it;
    if (in.defined() && in.requires_grad()) {
      any = true;
      next.push_back(in.grad_fn() ? in.grad_fn() : accumulator_for(in));
    } else {
      next.push_back(nullptr);
    }
  }
  if (!any) return out;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->seq = g_seq++;
  node->next = std::move(next);
  node->backward = std::move(fn);
  TANDEM_ASSERT(!out.grad_fn(), "op output already has a graph node");
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}
}  // namespace

Tensor record_op(Tensor out, std::initializer_list<Tensor> inputs, const char* name, Node::BackwardFn fn) {
  return record(std::move(out), inputs.begin(), inputs.end(), name, std::move(fn));
}

Tensor record_op(Tensor out, const std::vector<Tensor>& inputs, const char* name, Node::BackwardFn fn) {
  return record(std::move(out), inputs.data(), inputs.data() + inputs.size(), name, std::move(fn));
}

void backward(const Tensor& loss, const GradReadyHook& on_grad_ready, const Tensor& grad_output) {
  run_backward(loss, on_grad_ready, grad_output);
}

namespace {
// The pass, from a seed it owns: where nothing else holds the seed, the root's gradient is the pass's alone, as
// a gradient handed on between ops is (recompute's inner pass gives it so, to add as the plain pass adds).
void run_backward(const Tensor& loss, const GradReadyHook& on_grad_ready, Tensor seed, bool inner) {
  TANDEM_CHECK(loss.defined(), "backward: the loss is an undefined tensor");
  TANDEM_CHECK(loss.requires_grad(),
               "backward: the loss does not depend on any tensor that requires a gradient (was it computed "
               "under NoGradGuard, or are the parameters frozen?)");
  if (!seed.defined()) {
    TANDEM_CHECK(loss.numel() == 1, "backward: the loss must have one element, got ", loss.str(),
                 "; pass grad_output for other shapes");
    seed = Tensor::ones(loss.shape(), loss.dtype(), loss.device());
  } else {
    TANDEM_CHECK(seed.shape() == loss.shape(), "backward: grad_output ", seed.str(), " does not match ", loss.str());
  }
  NoGradGuard no_grad;
  profiler::BackwardScope profiled_as_backward;
  struct PassScope {
    uint64_t prev = t_pass;
    explicit PassScope(bool inner) {
      if (!inner || t_pass == 0) t_pass = ++g_passes;
    }
    ~PassScope() { t_pass = prev; }
  } pass_scope(inner);

  std::shared_ptr<Node> root = loss.grad_fn() ? loss.grad_fn() : accumulator_for(loss);

  // Count, for every node reachable from the root, how many gradients it will receive.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root.get()};
  std::unordered_set<Node*> seen{root.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& c : n->next) {
      if (!c) continue;
      deps[c.get()]++;
      if (seen.insert(c.get()).second) stack.push_back(c.get());
    }
  }

  std::unordered_map<Node*, Tensor> pending;
  pending[root.get()] = std::move(seed);
  std::priority_queue<Ready> ready;
  ready.push({root.get()});
  while (!ready.empty()) {
    Node* n = ready.top().node;
    ready.pop();
    Tensor g;
    if (auto it = pending.find(n); it != pending.end()) {
      g = std::move(it->second);
      pending.erase(it);
    }
    if (n->leaf) {
      if (g.defined()) accumulate(n->leaf, std::move(g));
      if (on_grad_ready) on_grad_ready(Tensor(n->leaf));
      continue;
    }
    std::vector<Tensor> grads, add_to;
    if (g.defined()) {
      TANDEM_CHECK(static_cast<bool>(n->backward), "backward through the graph of '", n->name,
                   "' a second time: the graph is freed after each backward; run the forward pass again");
      // A leaf whose zeroed buffer this op alone feeds can take the gradient in place; a gradient
      // other ops have begun and nothing else holds can take this op's share added in place.
      std::vector<Tensor> dest(n->next.size());
      add_to.assign(n->next.size(), Tensor());
      bool any_dest = false, any_add = false;
      for (size_t i = 0; i < n->next.size(); ++i) {
        Node* c = n->next[i].get();
        if (!c) continue;
        auto it = pending.find(c);
        if (it == pending.end()) {
          if (c->leaf && deps[c] == 1 && !t_captured) provide_buffer(c->leaf);
          if (c->leaf && c->leaf->grad && c->leaf->grad_zeroed && deps[c] == 1 && !t_captured) {
            dest[i] = Tensor(c->leaf->grad);
            any_dest = true;
          }
        } else if (it->second.defined() && it->second.impl_ptr().use_count() == 1 &&
                   it->second.impl()->storage.use_count() == 1) {
          add_to[i] = it->second;
          any_add = true;
        }
      }
      for (size_t i = 0; (any_dest || any_add) && i < n->next.size(); ++i)  // an input read twice takes none
        for (size_t j = i + 1; j < n->next.size(); ++j)
          if (n->next[i] && n->next[i] == n->next[j]) dest[i] = dest[j] = add_to[i] = add_to[j] = Tensor();
      struct Scope {
        const std::vector<Tensor>*prev_dest, *prev_add;
        ~Scope() {
          t_destinations = prev_dest;
          t_add_targets = prev_add;
        }
      } scope{t_destinations, t_add_targets};
      t_destinations = any_dest ? &dest : nullptr;
      t_add_targets = any_add ? &add_to : nullptr;
      grads = n->backward(g);
      TANDEM_ASSERT(grads.size() == n->next.size(), n->name, " returned ", grads.size(), " gradients for ",
                    n->next.size(), " inputs");
    }
    if (!t_retain_graph) n->backward = nullptr;  // frees the tensors the op saved
    for (size_t i = 0; i < n->next.size(); ++i) {
      Node* c = n->next[i].get();
      if (!c) continue;
      if (i < grads.size() && grads[i].defined()) {
        Tensor& slot = pending[c];
        if (!slot.defined())
          slot = std::move(grads[i]);
        else if (!(i < add_to.size() && add_to[i].defined() && grads[i].impl() == add_to[i].impl()))
          // (else the op added its share into the slot it was offered)
          slot = ops::binary_raw(backend::Binary::Add, slot, grads[i]);
      }
      if (--deps[c] == 0) ready.push({c});
    }
  }
  // A pass is one iteration of the device's time profile; recording a step runs no kernel.
  if (profiler::detail::any_enabled() && !backend::backend_for(loss.device()).recording(loss.device().index))
    profiler::end_iteration(loss.device());
}
}  // namespace

}  // namespace tandem
