// The memory plan: a language model's training step walked op by op from its shape, counting the tensors each
// op keeps for its backward and what each moment of the step holds beside them (see memory_plan.h). The
// tensors and their dtypes are those the ops in src/ops allocate; a change there that keeps or frees other
// tensors is a change here (MemoryPlanCli.* measure the plan against the allocator).
#include "cli/memory_plan.h"

#include "cli/memory_plan_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "core/allocator.h"
#include "ops/padded_rows.h"
#include "tandem/data/tokens.h"
#include "tandem/error.h"

namespace tandem::cli {

int64_t PlannedParam::numel() const { return shape_numel(shape); }

namespace {

using namespace plan;

// ---- the gradient buckets, as dist::DistOpt lays them out

struct PlanBucket {
  std::vector<int> params;
  std::vector<int64_t> starts;
  int64_t numel = 0, span = 0, offset = 0;
};

struct Layout {
  std::vector<PlanBucket> buckets;
  std::vector<int> bucket_of;  // per parameter
  int64_t total = 0;           // the arena's elements
  int64_t blocks = 0;          // one rank's blocks' elements (sharded)
};

Layout lay_out(const std::vector<PlannedParam>& params, const MemoryPlanSettings& s) {
  const bool sharded = s.shard != dist::Shard::none;
  const int64_t align = 4;  // f32: 16 bytes
  // The optimizer's order of the parameters (AdamW lists the decayed ones, of two or more dimensions, first: its
  // two groups), and the buckets laid out in its reverse, the order backward is expected to finish them.
  std::vector<int> listed;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < params.size(); ++i) {
      const bool matrix = params[i].shape.size() >= 2;
      if (s.optimizer != "adamw" ? pass == 0 : (pass == 0) == matrix) listed.push_back(static_cast<int>(i));
    }
  std::vector<int> order(listed.rbegin(), listed.rend());
  std::vector<int> keys;
  if (s.shard == dist::Shard::parameters) {
    // One group's parameters a bucket, the groups from the last to the first; a parameter of several groups
    // (a tied table) in buckets of its own after the first of them.
    keys.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<int>& g = params[i].groups;
      keys[i] = g.size() == 1 ? 2 * g[0] : 2 * *std::min_element(g.begin(), g.end()) - 1;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[static_cast<size_t>(a)] > keys[static_cast<size_t>(b)]; });
  }
  Layout out;
  auto limit = [&](size_t k) { return static_cast<int64_t>(k == 0 ? s.first_bucket_bytes : s.bucket_bytes); };
  int last_key = -1000000;
  for (int i : order) {
    const int64_t numel = params[static_cast<size_t>(i)].numel();
    const int key = keys.empty() ? 0 : keys[static_cast<size_t>(i)];
    const bool full = !out.buckets.empty() &&
                      ((out.buckets.back().numel + numel) * 4 > limit(out.buckets.size() - 1) || key != last_key);
    last_key = key;
    if (out.buckets.empty() || full) out.buckets.emplace_back();
    PlanBucket& b = out.buckets.back();
    b.params.push_back(i);
    const int64_t start = (b.numel + align - 1) / align * align;
    b.starts.push_back(start);
    b.numel = start + numel;
  }
  const int64_t unit = sharded ? s.world * align : 1;
  out.bucket_of.assign(params.size(), 0);
  for (size_t k = 0; k < out.buckets.size(); ++k) {
    PlanBucket& b = out.buckets[k];
    b.offset = out.total;
    b.span = (b.numel + unit - 1) / unit * unit;
    out.total += (b.span + align - 1) / align * align;
    out.blocks += sharded ? b.span / s.world : b.span;
    for (int i : b.params) out.bucket_of[static_cast<size_t>(i)] = static_cast<int>(k);
  }
  return out;
}

// This rank's pieces of each parameter under sharding (the elements of it inside its block of each bucket).
std::vector<int64_t> pieces_of(const Layout& l, const std::vector<PlannedParam>& params, int world, int rank) {
  std::vector<int64_t> pieces;
  for (const PlanBucket& b : l.buckets) {
    const int64_t block = b.span / world, lo = b.offset + rank * block, hi = lo + block;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const int64_t start = b.offset + b.starts[j], end = start + params[static_cast<size_t>(b.params[j])].numel();
      const int64_t a = std::max(start, lo), z = std::min(end, hi);
      if (a < z) pieces.push_back(z - a);
    }
  }
  return pieces;
}

int state_copies(const MemoryPlanSettings& s) {
  if (s.optimizer == "adam" || s.optimizer == "adamw") return 2;
  return s.optimizer == "sgd" && s.momentum != 0.0 ? 1 : 0;
}

// ---- the step, moment by moment

enum Kind { kState, kActivations, kGradients, kWork, kKinds };

class Timeline {
 public:
  void add(Kind k, int64_t b) { held_[k] += b; }
  void sub(Kind k, int64_t b) { held_[k] -= b; }
  int64_t now() const { return held_[kState] + held_[kActivations] + held_[kGradients] + held_[kWork]; }
  int64_t held(Kind k) const { return held_[k]; }
  // Records the moment; with extra bytes of scratch held just then.
  void mark(const std::string& at, int64_t extra = 0) {
    const int64_t b = now() + extra;
    if (b > phase_peak_) {
      phase_peak_ = b;
      phase_at_ = at;
    }
    if (b > peak_) {
      peak_ = b;
      peak_at_ = at;
      at_peak_ = held_;
      at_peak_[kWork] += extra;
    }
  }
  // Ends a phase: its largest moment goes into the list.
  void end_phase(std::vector<PlanMoment>& moments) {
    if (phase_peak_ > 0) moments.push_back({phase_at_, phase_peak_});
    phase_peak_ = 0;
    phase_at_.clear();
  }
  int64_t peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }
  int64_t at_peak(Kind k) const { return at_peak_[k]; }

 private:
  std::array<int64_t, kKinds> held_{};
  std::array<int64_t, kKinds> at_peak_{};
  int64_t peak_ = 0, phase_peak_ = 0;
  std::string peak_at_, phase_at_;
};

class StepWalk {
 public:
  StepWalk(const MemoryPlanSettings& s, const Model& m, const Layout& l, Timeline& t)
      : s_(s), m_(m), l_(l), t_(t), nb_(l.buckets.size()) {
    sharded_ = s.shard != dist::Shard::none;
    lazy_ = s.release_gradients && !sharded_;
    staged_ = sharded_ && s.world > 1 && (s.shard == dist::Shard::gradients || s.shard == dist::Shard::parameters);
    stage3_ = s.shard == dist::Shard::parameters;
    alloc_.assign(nb_, false);
    whole_.assign(nb_, false);
    whole16_.assign(nb_, false);
    holders_.assign(nb_, {});
    staging_.assign(nb_, false);
    pending_.assign(nb_, 0);
    for (size_t k = 0; k < nb_; ++k) pending_[k] = static_cast<int>(l.buckets[k].params.size());
    for (size_t i = 0; i < m.params.size(); ++i)
      for (int g : m.params[i].groups) {
        if (group_buckets_.size() <= static_cast<size_t>(g)) group_buckets_.resize(static_cast<size_t>(g) + 1);
        auto& list = group_buckets_[static_cast<size_t>(g)];
        const size_t k = static_cast<size_t>(l.bucket_of[i]);
        if (std::find(list.begin(), list.end(), k) == list.end()) list.push_back(k);
      }
  }

  // One micro-batch's forward and backward (with the buckets of earlier micro-batches held when accumulate > 1).
  void step(bool later_micro_batch) {
    if (lazy_ && later_micro_batch)
      for (size_t k = 0; k < nb_; ++k) bucket(k);
    forward();
    t_.end_phase(moments_);
    backward();
    t_.end_phase(moments_);
  }

  // The forward pass without gradients (an evaluation): each block's tensors only while it runs, the logits whole.
  void evaluate(int64_t rows) {
    const bool llama = s_.model == "llama";
    const int64_t c = llama ? s_.llama.width : s_.gpt.width, v = llama ? s_.llama.vocab : s_.gpt.vocab;
    const Dtypes d = dtypes_of(s_);
    const int64_t n = rows * s_.context;
    const double scale = static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(s_.batch, 1));
    auto scaled = [&](int64_t b) { return static_cast<int64_t>(std::ceil(static_cast<double>(b) * scale)); };
    const int64_t stream = rounded(n * c, d.act);
    for (const Stage& st : m_.stages) {
      if (stage3_) gather(st.group, st.group + 1);
      if (st.block) t_.mark("evaluation, " + label(st), stream + scaled(block_working_set(st)));
      if (stage3_) release(st.group);
    }
    // The batch, the last block's output, the final norm's, the logits and the loss's rows.
    int64_t logits = 2 * rounded(n, DType::i32) + stream + rounded(n * c, d.act) + rounded(n * v, d.act) +
                     3 * rounded(n, DType::f32);
    if (d.weight_saved) logits += rounded(v * c, d.act);
    if (stage3_) gather(m_.stages.back().group, -1);
    t_.mark("evaluation, the logits", logits);
    if (stage3_) release(m_.stages.back().group);
    t_.end_phase(moments_);
  }

  // The end of the step: the gradients applied (and, released, freed); under master weights each parameter
  // takes its master's rounding through a 16-bit copy.
  void update() {
    int64_t rounding = 0;
    if (s_.master_weights != DType::f32)
      for (const PlannedParam& p : m_.params) rounding = std::max(rounding, rounded(p.numel(), s_.master_weights));
    t_.mark("the update", rounding);
    t_.end_phase(moments_);
    if (lazy_)
      for (size_t k = 0; k < nb_; ++k)
        if (alloc_[k]) {
          alloc_[k] = false;
          t_.sub(kGradients, bucket_bytes(k));
        }
  }

  int64_t activations() const { return activations_; }
  std::vector<PlanMoment>& moments() { return moments_; }

 private:
  int64_t bucket_bytes(size_t k) const { return rounded(l_.buckets[k].span, DType::f32); }
  void bucket(size_t k) {
    if (!lazy_ || alloc_[k]) return;
    alloc_[k] = true;
    t_.add(kGradients, bucket_bytes(k));
  }
  // Sharded parameters: a group's buckets gathered whole (and the next group's on their way), freed when no
  // group holds them.
  void launch(size_t k) {
    if (whole_[k]) return;
    whole_[k] = true;
    t_.add(kWork, bucket_bytes(k));
    if (s_.master_weights != DType::f32) {  // under master weights the blocks travel in 16 bits first
      whole16_[k] = true;
      t_.add(kWork, rounded(l_.buckets[k].span, s_.master_weights));
    }
  }
  void bind(size_t k) {
    if (!whole16_[k]) return;
    whole16_[k] = false;
    t_.sub(kWork, rounded(l_.buckets[k].span, s_.master_weights));
  }
  void gather(int group, int next) {
    auto in_range = [&](int g) { return g >= 0 && static_cast<size_t>(g) < group_buckets_.size(); };
    if (in_range(group))
      for (size_t k : group_buckets_[static_cast<size_t>(group)]) launch(k);
    if (in_range(next))
      for (size_t k : group_buckets_[static_cast<size_t>(next)]) launch(k);
    if (in_range(group))
      for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
        bind(k);
        holders_[k].insert(group);
      }
  }
  void release(int group) {
    if (group < 0 || static_cast<size_t>(group) >= group_buckets_.size()) return;
    for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
      holders_[k].erase(group);
      if (holders_[k].empty() && whole_[k]) {
        bind(k);
        whole_[k] = false;
        t_.sub(kWork, bucket_bytes(k));
      }
    }
  }
  // A gradient made by backward, moved into its bucket's staging (sharded gradients), or written into its
  // bucket (allocated before the op ran).
  void staged(int param) {
    const size_t k = static_cast<size_t>(l_.bucket_of[static_cast<size_t>(param)]);
    if (!staging_[k]) {
      staging_[k] = true;
      t_.add(kGradients, bucket_bytes(k));
    }
    // A complete bucket's staging goes to its reduce-scatter, which holds it until the step's synchronisation waits
    // for it at the end of backward: NCCL (a GPU's) and Gloo (the CPU's) keep a collective's tensors until then.
    if (--pending_[k] == 0) pending_[k] = static_cast<int>(l_.buckets[k].params.size());
  }
  // The end of backward: every reduce-scatter waited for, the stagings freed.
  void finish_staging() {
    for (size_t k = 0; k < nb_; ++k)
      if (staging_[k]) {
        staging_[k] = false;
        t_.sub(kGradients, bucket_bytes(k));
      }
  }
  int64_t param_grad_bytes(int param) const {
    return rounded(m_.params[static_cast<size_t>(param)].numel(), DType::f32);
  }

  // The most a block holds while it runs without keeping anything (recompute's forward, an evaluation): its
  // biggest op's tensors beside the stream.
  int64_t block_working_set(const Stage& st) const {
    int64_t most = 0;
    for (const Op& op : st.ops) most = std::max(most, bytes_of(op.saved) + bytes_of(op.fwd_tmp));
    return most + m_.stream.bytes();
  }

  // Under selective recompute: what a block frees at its close and makes again when its backward begins.
  int64_t remade_bytes(const Stage& st) const {
    if (!st.block || s_.recompute != RecomputePolicy::selective) return 0;
    int64_t n = 0;
    for (const Op& op : st.ops) n += bytes_of(op.remade);
    return n;
  }

  void forward() {
    const bool full = s_.recompute == RecomputePolicy::full;
    for (const Stage& st : m_.stages) {
      if (stage3_) gather(st.group, st.group + 1);
      if (st.block) {
        t_.add(kActivations, st.input.bytes());
        activations_ += st.input.bytes();
      }
      if (st.block && full) {
        t_.mark("forward, " + label(st) + " (recomputed later)", block_working_set(st));
      } else {
        for (const Op& op : st.ops) {
          const int64_t kept = bytes_of(op.saved);
          t_.add(kActivations, kept);
          activations_ += kept;
          t_.mark("forward, " + op.what, bytes_of(op.fwd_tmp));
        }
        // Selective: the marked outputs freed when the block closes.
        t_.sub(kActivations, remade_bytes(st));
        activations_ -= remade_bytes(st);
      }
      if (stage3_) release(st.group);
    }
  }

  static std::string label(const Stage& st) {
    const std::string& w = st.ops.front().what;
    return w.substr(0, w.find('\''));
  }

  // Runs one op's backward: its buckets first, then its scratch and the gradients it hands on.
  void op_backward(const Op& op, bool captured) {
    if (!captured && !staged_)
      for (int p : op.params) bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(p)]));
    int64_t made = 0;  // parameter gradients made as tensors of their own (recompute's inner pass, staging)
    if (captured || staged_)
      for (int p : op.params) made += param_grad_bytes(p);
    const int64_t tmp = bytes_of(op.bwd_tmp), out = bytes_of(op.bwd_out), keep = bytes_of(op.bwd_keep);
    t_.add(kWork, out + keep);
    t_.add(kGradients, made);
    t_.mark("backward, " + op.what, tmp);
    held_keep_ += keep;
    t_.sub(kActivations, bytes_of(op.saved));
    if (!op.passes_grad) {
      if (!pending_grads_.empty()) {
        t_.sub(kWork, pending_grads_.back());
        pending_grads_.pop_back();
      }
    }
    if (op.alias) pending_grads_.push_back(0);
    for (const Buf& b : op.bwd_out) pending_grads_.push_back(b.bytes());
    if (captured) {
      captured_ += made;
    } else if (staged_) {
      t_.sub(kGradients, made);
      for (int p : op.params) staged(p);
    }
  }

  void backward() {
    const bool full = s_.recompute == RecomputePolicy::full;
    // The loss's seed.
    pending_grads_ = {rounded(1, DType::f32)};
    t_.add(kWork, pending_grads_.back());
    for (auto it = m_.stages.rbegin(); it != m_.stages.rend(); ++it) {
      const Stage& st = *it;
      if (stage3_) gather(st.group, st.group - 1);
      if (st.block && full) {
        // The block runs again: its output, the gradient's own copy (the inner pass's seed) and every op's tensors.
        if (!staged_)
          for (const Op& op : st.ops)
            for (int p : op.params) bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(p)]));
        const int64_t again = m_.stream.bytes();
        t_.add(kWork, again);
        for (const Op& op : st.ops) {
          t_.add(kActivations, bytes_of(op.saved));
          t_.mark("backward, " + op.what + " (recomputed)", bytes_of(op.fwd_tmp));
        }
        const int64_t incoming = pending_grads_.empty() ? 0 : pending_grads_.back();
        pending_grads_.push_back(incoming);  // the seed, a copy of the incoming gradient
        t_.add(kWork, incoming);
        captured_ = 0;
        for (auto op = st.ops.rbegin(); op != st.ops.rend(); ++op) op_backward(*op, /*captured=*/true);
        // The block's gradients go into their buckets (sharded: their buckets' staging); the incoming gradient
        // and the output are freed; the seed's copy, holding the input's gradient, goes on.
        if (staged_)
          for (const Op& op : st.ops)
            for (int p : op.params) staged(p);
        t_.sub(kGradients, captured_);
        captured_ = 0;
        t_.sub(kWork, again);
        const int64_t carried = pending_grads_.back();
        pending_grads_.pop_back();
        if (!pending_grads_.empty()) {
          t_.sub(kWork, pending_grads_.back());
          pending_grads_.pop_back();
        }
        pending_grads_.push_back(carried);
      } else {
        // Selective: the block's backward begins by making its freed outputs again (op_backward frees them with
        // the rest of each op's saved tensors).
        t_.add(kActivations, remade_bytes(st));
        for (auto op = st.ops.rbegin(); op != st.ops.rend(); ++op) op_backward(*op, false);
      }
      if (st.block) t_.sub(kActivations, st.input.bytes());
      if (stage3_) release(st.group);
    }
    // The tied table's gradient, both shares added, goes into its bucket.
    if (m_.tied_table >= 0) {
      if (staged_) {
        staged(static_cast<int>(m_.tied_table));
      } else {
        bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(m_.tied_table)]));
      }
      t_.mark("end of backward (the token table's gradient added)");
    }
    t_.mark("end of backward");
    finish_staging();
    t_.sub(kWork, held_keep_);
    held_keep_ = 0;
    for (int64_t b : pending_grads_) t_.sub(kWork, b);
    pending_grads_.clear();
  }

  const MemoryPlanSettings& s_;
  const Model& m_;
  const Layout& l_;
  Timeline& t_;
  size_t nb_;
  bool sharded_ = false, lazy_ = false, staged_ = false, stage3_ = false;
  std::vector<bool> alloc_, whole_, whole16_, staging_;
  std::vector<int> pending_;
  std::vector<std::set<int>> holders_;
  std::vector<std::vector<size_t>> group_buckets_;
  std::vector<int64_t> pending_grads_;
  int64_t held_keep_ = 0, captured_ = 0, activations_ = 0;
  std::vector<PlanMoment> moments_;
};

std::string human(double b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  else if (b < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace

std::string format_bytes(int64_t bytes) { return human(static_cast<double>(bytes)); }

int64_t token_data_bytes(int64_t tokens, int width, bool masked, int64_t frame, int rank, int world) {
  int64_t part = 0;
  if (frame > 0) {
    part = data::rank_part(tokens / frame, rank, world).size() * frame;
  } else {
    part = data::rank_part(tokens, rank, world).size();
  }
  return rounded(part * width, DType::u8) + (masked ? rounded(part, DType::u8) : 0) + rounded(2, DType::i64);
}

MemoryPlan plan_memory(const MemoryPlanSettings& given) {
  // Offloaded, the optimizer's step is sharded (each rank its slices), whatever the --shard stage.
  MemoryPlanSettings s = given;
  if (s.offload_parameters) {
    s.offload_optimizer = true;
    s.shard = dist::Shard::parameters;
  }
  if (s.offload_optimizer && s.shard == dist::Shard::none) s.shard = dist::Shard::optimizer;
  TANDEM_CHECK(s.batch > 0 && s.context > 0 && s.world > 0 && s.accumulate > 0, "memory plan: batch ", s.batch,
               ", context ", s.context, ", ranks ", s.world, ", micro-batches ", s.accumulate, " must be positive");
  const plan::Model m = plan::build_model(s);
  const Layout l = lay_out(m.params, s);
  const Dtypes d = dtypes_of(s);
  const bool sharded = s.shard != dist::Shard::none;
  const bool masters = s.master_weights != DType::f32;
  const bool whole_arena = !sharded || s.shard == dist::Shard::optimizer || s.world == 1;
  const bool lazy = s.release_gradients && !sharded;
  MemoryPlan plan;

  // ---- what is held between steps
  int64_t per_param_f32 = 0, per_param_act = 0;
  for (const PlannedParam& p : m.params) {
    per_param_f32 += rounded(p.numel(), DType::f32);
    per_param_act += rounded(p.numel(), d.act);
  }
  if (!sharded) {
    // Rebound into one arena of whole chunks (dist::DistOpt's parameter averager; a chunk is a bucket's size),
    // with a chunk's staging on more than one rank.
    int64_t total = 0;
    for (const PlannedParam& p : m.params) total += p.numel();
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(s.bucket_bytes / 4), total));
    const int64_t chunks = (total + chunk - 1) / chunk;
    plan.weights = rounded(chunks * chunk, DType::f32) + (s.world > 1 && chunks > 1 ? rounded(chunk, DType::f32) : 0);
  } else if (s.shard == dist::Shard::parameters) {
    plan.weights = s.offload_parameters ? 0 : rounded(l.blocks, DType::f32);  // offloaded: the host's values
  } else {
    plan.weights = rounded(l.total, DType::f32);  // the parameters rebound into one arena
  }
  // The stepped tensors: every parameter, or this rank's pieces of them (the largest share of any rank).
  int64_t stepped = per_param_f32;
  if (sharded) {
    stepped = 0;
    for (int r = 0; r < s.world; ++r) {
      int64_t mine = 0;
      for (int64_t piece : pieces_of(l, m.params, s.world, r)) mine += rounded(piece, DType::f32);
      stepped = std::max(stepped, mine);
    }
  }
  if (s.offload_optimizer) {
    // On the host: the slices' values and gradients (f32, pinned) and the optimizer's state of them; the masters
    // are the slices themselves.
    plan.host_state = (2 + state_copies(s)) * stepped;
  } else {
    plan.optimizer_state = state_copies(s) * stepped;
    if (masters) plan.master_weights = stepped;
  }
  if (d.copies) plan.weight_copies = sharded && s.world > 1 ? rounded(l.total, d.act) : per_param_act;
  int64_t kept_gradients = 0;  // held between steps
  if (lazy) {
    for (const PlanBucket& b : l.buckets) plan.gradients += rounded(b.span, DType::f32);
  } else if (whole_arena) {
    kept_gradients = rounded(l.total, DType::f32);
    plan.gradients = kept_gradients;
  } else {
    kept_gradients = rounded(l.blocks, DType::f32);
    plan.gradients = kept_gradients;
  }
  // What the -d method keeps beside the gradients: error-feedback residuals (a whole arena), and its buffers.
  const bool residuals = (s.method == "sparseTopK" || s.method == "sparseThreshold" || s.method == "powerSGD");
  int64_t residual = residuals && s.error_feedback ? rounded(l.total, DType::f32) : 0;
  if (s.method == "half")
    for (const PlanBucket& b : l.buckets) residual += rounded(b.span, s.half_dtype);  // each bucket's wire
  if (s.method == "sparseTopK")
    for (const PlanBucket& b : l.buckets) {
      const double exact = s.spars * static_cast<double>(b.numel);
      const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(exact, 1.0))), 1, b.numel);
      residual += rounded(2 * k, DType::i32) + rounded(2 * k * s.world, DType::i32);  // its pairs, and every rank's
    }
  if (s.method == "powerSGD") {
    int64_t longest = 1;
    for (const PlanBucket& b : l.buckets) {
      int64_t pt = 0, qt = 0, whole = 0;
      for (int i : b.params) {
        const Shape& sh = m.params[static_cast<size_t>(i)].shape;
        const int64_t numel = shape_numel(sh), rows = sh.size() >= 2 ? sh[0] : 1, cols = rows > 0 ? numel / rows : 0;
        const int64_t r = std::min<int64_t>({static_cast<int64_t>(s.low_rank), rows, cols});
        if (sh.size() >= 2 && r >= 1 && 2 * r * (rows + cols) <= numel) {
          pt += r * rows;
          qt += r * cols;
          longest = std::max(longest, rows);
          residual += rounded(r * cols, DType::f32);  // the first Q, kept
        } else {
          whole += numel;
        }
      }
      residual += rounded(pt, DType::f32) + rounded(qt, DType::f32) + rounded(whole, DType::f32);
    }
    residual += rounded(longest, DType::f32) + 2 * rounded(1, DType::f32);
  }
  plan.gradients += residual;
  // The batch's tokens and targets, the model's buffers, and the step's small bookkeeping tensors.
  // On a GPU, also cuBLAS's workspace (taken from the device's allocator once, for the process).
  const int64_t small = 2 * rounded(s.batch * s.context, DType::i32) + m.persistent + 16 * rounded(1, DType::f32) +
                        (s.device.is_cuda() ? rounded(int64_t(32) << 20, DType::u8) : 0);
  plan.data = s.data_bytes;
  plan.between_steps = plan.weights + plan.weight_copies + plan.master_weights + plan.optimizer_state +
                       kept_gradients + residual + small + plan.data;
  // On the CPU backend the host is the device: the offloaded state is held beside the rest.
  if (s.device.is_cpu()) plan.between_steps += plan.host_state;

  // ---- building the model: its parameters, then the optimizer's arena they are copied into (the parameter
  // averager's, or under --shard the sharded step's, cut a second time along the layer groups for stage 3)
  Timeline t;
  int64_t largest_param = 0;
  for (const PlannedParam& p : m.params) largest_param = std::max(largest_param, rounded(p.numel(), DType::f32));
  {
    const int64_t arena = sharded ? rounded(l.total, DType::f32) : plan.weights;
    int64_t setup = per_param_f32 + arena + kept_gradients;
    if (s.shard == dist::Shard::parameters) setup = std::max(setup, 2 * arena + kept_gradients);
    setup += small;
    t.add(kState, setup);
    t.mark("building the model (its parameters copied into the optimizer's arena)");
    t.sub(kState, setup);
    t.end_phase(plan.moments);
  }

  // ---- the step
  t.add(kState, plan.between_steps);
  StepWalk walk(s, m, l, t);
  for (int64_t i = 0; i < std::min<int64_t>(s.accumulate, 2); ++i) walk.step(i > 0);
  plan.activations = walk.activations() / std::min<int64_t>(s.accumulate, 2);
  walk.update();
  if (s.eval_batch > 0) walk.evaluate(s.eval_batch);
  plan.moments.insert(plan.moments.end(), walk.moments().begin(), walk.moments().end());
  plan.peak = t.peak();
  plan.peak_at = t.peak_at();
  // A checkpoint of sharded state: the optimizer's state gathered whole on every rank (and, stage 3, the parameters).
  if (s.checkpoint && sharded) {
    int64_t gathered = state_copies(s) * per_param_f32 + (masters ? per_param_f32 : 0);
    int64_t largest = 0;
    for (const PlanBucket& b : l.buckets) largest = std::max(largest, rounded(b.span, DType::f32));
    if (s.shard == dist::Shard::parameters)
      for (const PlanBucket& b : l.buckets) gathered += rounded(b.span, DType::f32);
    const int64_t at = plan.between_steps + gathered + largest;
    plan.moments.push_back({"saving a checkpoint (the sharded state gathered)", at});
    if (at > plan.peak) {
      plan.peak = at;
      plan.peak_at = "saving a checkpoint (the sharded state gathered)";
    }
  }
  plan.workspace = std::max<int64_t>(0, plan.peak - t.at_peak(kState) - t.at_peak(kActivations) - t.at_peak(kGradients));
  if (plan.peak != t.peak()) plan.workspace = plan.peak - plan.between_steps;
  // Host memory beside a GPU run: the model as it is built (on the host, then moved), and a checkpoint's tensors
  // on their way to the file (the model, the optimizer's state).
  if (s.device.is_cuda()) {
    plan.host = per_param_f32 + largest_param;
    if (s.checkpoint)
      plan.host = std::max(plan.host, per_param_f32 + state_copies(s) * per_param_f32 + (masters ? per_param_f32 : 0));
  }
  if (s.device.is_cuda()) plan.host += plan.host_state;
  return plan;
}

std::string memory_table(const MemoryPlan& plan, const MemoryPlanSettings& s, int64_t available, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> cols;
  cols.push_back({"weights", format_bytes(plan.weights)});
  if (plan.data > 0) cols.push_back({"data", format_bytes(plan.data)});
  if (plan.weight_copies > 0) cols.push_back({"16-bit copies", format_bytes(plan.weight_copies)});
  if (plan.master_weights > 0) cols.push_back({"masters", format_bytes(plan.master_weights)});
  cols.push_back({"gradients", format_bytes(plan.gradients)});
  cols.push_back({"optimizer", s.offload_optimizer ? "on the host" : format_bytes(plan.optimizer_state)});
  cols.push_back({"activations", format_bytes(plan.activations)});
  cols.push_back({"workspace", format_bytes(plan.workspace)});
  cols.push_back({"peak", format_bytes(plan.peak)});
  cols.push_back({"available", available > 0 ? format_bytes(available) : std::string("?")});
  std::string head = "tandem: memory per rank |", row = "tandem: (planned)       |";
  for (auto& [name, value] : cols) {
    const size_t w = std::max(name.size(), value.size());
    head += " " + name + std::string(w - name.size(), ' ') + " |";
    row += " " + value + std::string(w - value.size(), ' ') + " |";
  }
  head.pop_back();
  row.pop_back();
  while (!head.empty() && head.back() == ' ') head.pop_back();
  while (!row.empty() && row.back() == ' ') row.pop_back();
  const bool released = s.release_gradients && s.shard == dist::Shard::none && !s.offload_optimizer;
  std::string grads = !released ? "kept between steps"
                      : s.accumulate > 1 ? "held from the first micro-batch's backward to the update (" +
                                               std::to_string(s.accumulate) + " micro-batches a step)"
                                         : "held from backward to the update";
  std::string note = "tandem: activations of one micro-batch of " + std::to_string(s.batch) + " x " +
                     std::to_string(s.context) + " tokens under --recompute " + nn::recompute_name(s.recompute) +
                     "; gradients " + grads + "; peak at " + plan.peak_at + "; " + where;
  if (plan.host > 0)
    note += "; host memory beside: " + format_bytes(plan.host) +
            (plan.host_state > 0 ? " (" + format_bytes(plan.host_state) + " the offloaded optimizer's: its state, the slices and their gradients)"
             : s.checkpoint     ? " (the model built, a checkpoint saved)"
                                : " (the model built)");
  return head + "\n" + row + "\n" + note;
}

int64_t usable_memory(Device d, int local_ranks) {
  if (const char* e = std::getenv("TANDEM_MEMORY_LIMIT_MIB"); e && *e) {
    char* end = nullptr;
    const double mib = std::strtod(e, &end);
    TANDEM_CHECK(end && *end == '\0' && std::isfinite(mib) && mib > 0, "TANDEM_MEMORY_LIMIT_MIB=", e,
                 ": expected a positive number of MiB");
    return static_cast<int64_t>(mib * 1048576.0);
  }
  const DeviceMemory m = device_memory(d);
  if (m.free == 0) return 0;
  const double total = static_cast<double>(m.total);
  if (d.is_cuda()) {
    // Beside the tensors: library workspaces (cuBLAS, cuDNN), the communicator's buffers, and the blocks the
    // caching allocator rounds up to whole sizes.
    const int64_t reserve = static_cast<int64_t>(512.0 * 1048576.0 + 0.03 * total);
    return std::max<int64_t>(0, static_cast<int64_t>(m.free) - reserve);
  }
  // The host's memory is shared by the ranks on it; each keeps some beside its tensors (the program, its
  // threads, the data's pages).
  const int64_t share = static_cast<int64_t>(m.free) / std::max(local_ranks, 1);
  return std::max<int64_t>(0, share - static_cast<int64_t>(256.0 * 1048576.0));
}

std::vector<std::string> fitting_flags(const MemoryPlanSettings& s, int64_t budget, bool total_batch_tokens) {
  std::vector<std::string> out;
  auto fits = [&](const MemoryPlanSettings& c) { return plan_memory(c).peak <= budget; };
  const double dropout = s.model == "llama" ? s.llama.dropout : s.gpt.dropout;
  const std::string recompute = dropout > 0.0 ? "--dropout 0 --recompute full" : "--recompute full";
  auto with_recompute = [&](MemoryPlanSettings c) {
    c.recompute = RecomputePolicy::full;
    c.gpt.dropout = 0.0;
    c.llama.dropout = 0.0;
    return c;
  };
  const int64_t step_tokens = s.batch * s.context * s.accumulate * s.world;
  // A smaller micro-batch, the step's tokens kept by more of them.
  auto smaller_batch = [&](const MemoryPlanSettings& base, const std::string& extra) {
    for (int64_t b = s.batch / 2; b >= 1; b /= 2) {
      MemoryPlanSettings c = base;
      c.batch = b;
      if (total_batch_tokens) c.accumulate = s.accumulate * s.batch / b;
      if (total_batch_tokens && s.batch % b != 0) continue;
      if (!fits(c)) continue;
      std::string f = "--batch-size " + std::to_string(b);
      if (total_batch_tokens) f += " --total-batch-tokens " + std::to_string(step_tokens);
      return extra.empty() ? f : extra + " " + f;
    }
    return std::string();
  };
  if (s.recompute != RecomputePolicy::full && fits(with_recompute(s))) out.push_back(recompute);
  if (std::string f = smaller_batch(s, ""); !f.empty()) out.push_back(f);
  if (out.empty() && s.recompute != RecomputePolicy::full)
    if (std::string f = smaller_batch(with_recompute(s), recompute); !f.empty()) out.push_back(f);
  const bool shardable = s.method == "plain" || s.method == "half";
  // The optimizer's state in host memory (a GPU's memory is what it frees; on the CPU it is the same memory).
  // Then the parameters' slices too (stage 3's, f32 parameters only), where the optimizer's alone do not do.
  if (shardable && !s.offload_optimizer && s.device.is_cuda() && out.size() < 3)
    for (const bool parameters : {false, true}) {
      if (parameters && (s.master_weights != DType::f32 ||
                         (s.shard != dist::Shard::none && s.shard != dist::Shard::parameters)))
        break;
      const std::string flag = parameters ? "--offload parameters" : "--offload optimizer";
      MemoryPlanSettings c = s;
      c.offload_optimizer = true;
      c.offload_parameters = parameters;
      if (fits(c)) {
        out.push_back(flag);
        break;
      }
      if (s.recompute != RecomputePolicy::full && fits(with_recompute(c))) {
        out.push_back(recompute + " " + flag);
        break;
      }
    }
  // Sharded state: on these ranks, or on more.
  const std::vector<std::pair<dist::Shard, const char*>> stages = {{dist::Shard::optimizer, "optimizer"},
                                                                   {dist::Shard::gradients, "gradients"},
                                                                   {dist::Shard::parameters, "parameters"}};
  if (shardable && s.world > 1)
    for (auto [stage, name] : stages) {
      if (static_cast<int>(stage) <= static_cast<int>(s.shard)) continue;
      MemoryPlanSettings c = s;
      c.shard = stage;
      if (fits(c)) {
        out.push_back(std::string("--shard ") + name);
        break;
      }
    }
  if (shardable && out.size() < 3)
    for (int n = std::max(2, s.world * 2); n <= 1024; n *= 2) {
      MemoryPlanSettings c = s;
      c.shard = dist::Shard::parameters;
      c.world = n;
      if (fits(c)) {
        out.push_back("--shard parameters on " + std::to_string(n) + " ranks");
        break;
      }
      if (s.recompute != RecomputePolicy::full && fits(with_recompute(c))) {
        out.push_back(recompute + " --shard parameters on " + std::to_string(n) + " ranks");
        break;
      }
    }
  if (out.size() > 3) out.resize(3);
  return out;
}

}  // namespace tandem::cli
