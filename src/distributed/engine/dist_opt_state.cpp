// DistOpt: a rank's own state beside the model and the optimizer (bucket layout, error-feedback residuals,
// PowerSGD's Q, partialUpdate's position and replica state), saved and loaded with checkpoints, re-cut
// for another number of ranks; and the sharded optimizer state gathered whole for one.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/engine/dist_opt_impl.h"
#include "tandem/ops.h"

namespace tandem::dist {

// ---- a rank's own state

namespace {

using Json = nlohmann::json;
constexpr int kRankStateFormat = 1;

Json sync_json(const SyncOptions& s) {
  return {{"method", s.method},     {"half_dtype", dtype_name(s.half_dtype)}, {"clip", s.clip}, {"spars", s.spars},
          {"error_feedback", s.error_feedback}, {"rank", s.rank}};
}

}  // namespace

RankState DistOpt::rank_state() {
  Impl& m = *impl_;
  RankState out;
  Json meta{{"format", kRankStateFormat},
            {"rank", comm_->rank()},
            {"world_size", comm_->size()},
            {"parameters", opt_->params().size()},
            {"sync", sync_json(m.active_)},
            {"layout", m.reducer_.layout_order()},
            {"layout_learnt", m.reducer_.layout_learnt()}};
  if (m.reducer_.residuals().defined()) out.tensors.emplace_back("residuals", m.reducer_.residuals());
  if (!m.partial())
    for (auto& [name, t] : m.reducer_.codec().named_state()) out.tensors.emplace_back("codec/" + name, t);
  if (m.partial()) {
    meta["partial_chunk"] = m.averager_->next_chunk();
    meta["partial_chunks"] = m.averager_->chunks();
    // Replicas differ between averages, and so does each one's optimizer state.
    const auto& ps = opt_->params();
    for (size_t i = 0; i < ps.size(); ++i) out.tensors.emplace_back("param/" + std::to_string(i), ps[i].detach());
    for (auto& list : opt_->state_lists())
      for (size_t i = 0; i < ps.size(); ++i)
        if ((*list.tensors)[i].defined())
          out.tensors.emplace_back("opt/" + list.kind + "/" + std::to_string(i), (*list.tensors)[i]);
  }
  out.meta_json = meta.dump();
  return out;
}

namespace {

// What load_rank_state takes from a saved rank's meta data, checked.
struct SavedRank {
  std::string problem;  // why nothing of it can be used ("" when it can)
  std::vector<int> layout;  // the learnt bucket layout, empty when none was learnt
  int64_t partial_chunk = -1, partial_chunks = -1;
};

SavedRank check_saved(const std::string& meta_json, int rank, int world, size_t params, const SyncOptions& active) {
  SavedRank out;
  if (meta_json.empty()) {
    out.problem = "no state was saved for this rank";
    return out;
  }
  try {
    Json meta = Json::parse(meta_json);
    if (!meta.is_object() || meta.value("format", 0) != kRankStateFormat) {
      out.problem = "the saved rank state is not in a format this tandem reads";
      return out;
    }
    const int saved_rank = meta.at("rank").get<int>(), saved_world = meta.at("world_size").get<int>();
    const Json& sync = meta.at("sync");
    const std::string method = sync.at("method").get<std::string>();
    const bool compresses = method == "sparseTopK" || method == "sparseThreshold" || method == "powerSGD";
    if (saved_rank != rank || saved_world != world)
      out.problem = "it was saved by rank " + std::to_string(saved_rank) + " of " + std::to_string(saved_world) +
                    " ranks, this is rank " + std::to_string(rank) + " of " + std::to_string(world);
    else if (meta.at("parameters").get<int64_t>() != static_cast<int64_t>(params))
      out.problem = "it was saved for another number of parameters";
    else if (method != active.method)
      out.problem = "it was saved under -d " + method + ", this run uses -d " + active.method;
    else if ((compresses && sync.at("error_feedback").get<bool>() != active.error_feedback) ||
             (method == "powerSGD" && sync.at("rank").get<int>() != active.rank))
      out.problem = "it was saved with other " + method + " settings (--rank, --no-error-feedback)";
    if (!out.problem.empty()) return out;
    if (meta.value("layout_learnt", false)) out.layout = meta.at("layout").get<std::vector<int>>();
    if (meta.contains("partial_chunk")) {
      out.partial_chunk = meta.at("partial_chunk").get<int64_t>();
      out.partial_chunks = meta.at("partial_chunks").get<int64_t>();
    }
  } catch (const Json::exception& e) {
    out.problem = std::string("its description is malformed (") + e.what() + ")";
  }
  return out;
}

}  // namespace

std::vector<std::string> DistOpt::load_rank_state(const RankState& saved) {
  Impl& m = *impl_;
  const auto& ps = opt_->params();
  SavedRank mine = check_saved(saved.meta_json, comm_->rank(), comm_->size(), ps.size(), m.active_);
  // Every rank must reduce the same buckets: all adopt rank 0's learnt layout (as a rebuild does), or
  // none. [0] says whether rank 0 has one; its order follows.
  std::vector<int> layout = mine.layout;
  if (comm_->size() > 1) {
    std::vector<int64_t> wire(ps.size() + 1, 0);
    if (mine.layout.size() == ps.size()) {
      wire[0] = 1;
      for (size_t i = 0; i < ps.size(); ++i) wire[i + 1] = mine.layout[i];
    }
    Tensor t = Tensor::from_vector(wire, {static_cast<int64_t>(wire.size())}).to(comm_->device());
    WorkPtr w = comm_->broadcast(t, 0);
    detail::timed_wait(w, m.stats_);
    std::vector<int64_t> agreed = t.to_vector<int64_t>();
    layout.clear();
    if (agreed[0] == 1)
      for (size_t i = 1; i < agreed.size(); ++i) layout.push_back(static_cast<int>(agreed[i]));
  }
  // A sharded layout is never rebuilt: the parameters' blocks and the optimizer's state are cut along it.
  if (layout.size() == ps.size() && !m.sharded_) m.reducer_.restore_layout(layout);
  if (mine.problem.empty() && mine.layout != layout) mine.problem = "its bucket layout is not rank 0's";

  std::vector<std::string> parts;  // what this rank's state holds
  if (m.reducer_.residuals().defined()) parts.push_back("the error-feedback residuals");
  if (!m.partial() && !m.reducer_.codec().named_state().empty()) parts.push_back(m.active_.method + "'s factors");
  if (m.partial()) parts.push_back("partialUpdate's position and this rank's own replica and optimizer state");
  std::vector<std::string> fresh;
  if (!mine.problem.empty()) {
    if (parts.empty()) return fresh;  // nothing would have been loaded anyway
    std::string list;
    for (size_t i = 0; i < parts.size(); ++i) list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
    fresh.push_back("rank " + std::to_string(comm_->rank()) + ": " + list + " start afresh: " + mine.problem);
    return fresh;
  }
  std::map<std::string, Tensor> by_name(saved.tensors.begin(), saved.tensors.end());
  auto load_into = [&](const std::string& name, Tensor dst, const std::string& what) {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second.numel() != dst.numel() || it->second.dtype() != dst.dtype()) {
      fresh.push_back("rank " + std::to_string(comm_->rank()) + ": " + what + " start afresh: the saved state " +
                      (it == by_name.end() ? "lacks " + name : "holds " + name + " as " + it->second.str()));
      return;
    }
    dst.copy_(it->second.view(dst.shape()));
  };
  if (m.reducer_.residuals().defined()) load_into("residuals", m.reducer_.residuals(), "the error-feedback residuals");
  if (!m.partial())
    for (auto& [name, t] : m.reducer_.codec().named_state()) load_into("codec/" + name, t, m.active_.method + "'s factors");
  if (m.partial()) {
    if (mine.partial_chunks == m.averager_->chunks() && mine.partial_chunk >= 0 && mine.partial_chunk < mine.partial_chunks)
      m.averager_->set_next_chunk(mine.partial_chunk);
    else
      fresh.push_back("rank " + std::to_string(comm_->rank()) + ": partialUpdate's round robin starts at chunk 0: "
                      "the parameters were cut into other chunks (--bucket-mb)");
    for (auto& list : opt_->state_lists())
      for (size_t i = 0; i < ps.size(); ++i) {
        const std::string name = "opt/" + list.kind + "/" + std::to_string(i);
        if (!by_name.count(name)) continue;
        Tensor& slot = (*list.tensors)[i];
        if (!slot.defined()) slot = Tensor::zeros(ps[i].shape(), ps[i].dtype(), ps[i].device());
        load_into(name, slot, "this rank's " + list.kind);
      }
    // This rank's replica, taken once sync_parameters has broadcast rank 0's (the checkpoint's) parameters.
    std::vector<Tensor> replica;
    for (size_t i = 0; i < ps.size(); ++i) {
      auto it = by_name.find("param/" + std::to_string(i));
      if (it == by_name.end() || it->second.numel() != ps[i].numel() || it->second.dtype() != ps[i].dtype()) {
        replica.clear();
        fresh.push_back("rank " + std::to_string(comm_->rank()) + ": this rank's replica starts from the "
                        "checkpoint's parameters: the saved state holds none of parameter " + std::to_string(i));
        break;
      }
      replica.push_back(it->second.view(ps[i].shape()).to(ps[i].device()));
    }
    m.loaded_replica_ = std::move(replica);
    take_loaded_replica();
  }
  return fresh;
}

std::vector<std::string> DistOpt::load_rank_states(const std::vector<RankState>& saved) {
  const int world = comm_->size(), rank = comm_->rank();
  if (static_cast<int>(saved.size()) == world) return load_rank_state(saved[static_cast<size_t>(rank)]);
  if (saved.empty() || saved[0].meta_json.empty()) return load_rank_state(RankState{});
  Json meta = Json::parse(saved[0].meta_json, nullptr, false);
  if (!meta.is_object()) return load_rank_state(RankState{});
  meta["rank"] = rank;
  meta["world_size"] = world;
  RankState merged;
  merged.meta_json = meta.dump();
  NoGradGuard no_grad;
  int averaged = 0;
  for (const auto& [name, first] : saved[0].tensors) {
    // What each rank kept for itself.
    const bool own = name == "residuals" || name.rfind("opt/", 0) == 0 || name.rfind("param/", 0) == 0;
    if (!own || !is_floating(first.dtype())) {
      merged.tensors.emplace_back(name, first);
      continue;
    }
    Tensor sum = first.to(DType::f32).cpu();
    int n = 1;
    for (size_t r = 1; r < saved.size(); ++r)
      for (const auto& [other, t] : saved[r].tensors)
        if (other == name && t.numel() == first.numel()) {
          sum = add(sum, t.to(DType::f32).cpu().view(sum.shape()));
          ++n;
        }
    merged.tensors.emplace_back(name, scale(sum, 1.0 / n).to(first.dtype()));
    averaged = std::max(averaged, n);
  }
  std::vector<std::string> notes = load_rank_state(merged);
  if (averaged > 0)
    notes.push_back("rank " + std::to_string(rank) + ": the state each of the " + std::to_string(saved.size()) +
                    " saved ranks kept for itself (error-feedback residuals, partialUpdate's optimizer state) is "
                    "their average on " +
                    (world == 1 ? std::string("the one rank now") : "each of the " + std::to_string(world) + " ranks now"));
  return notes;
}

void DistOpt::gather_optimizer_state() {
  if (!impl_->sharded_) return;
  impl_->sharded_->wait_all();
  impl_->sharded_->gather_state(*opt_);
  impl_->sharded_->gather_all();  // sharded parameters: whole until their layers' next use frees them
}

void DistOpt::release_optimizer_state() {
  if (impl_->sharded_) impl_->sharded_->release_gathered_state(*opt_);
}

void DistOpt::gather_parameters() {
  // Before sync_parameters the parameters are whole (in one buffer) already.
  if (impl_->synced_ && impl_->sharded_ && impl_->sharded_->shards_parameters()) impl_->sharded_->gather_all();
}

void DistOpt::release_parameters(bool keep) {
  if (!impl_->synced_ || !impl_->sharded_ || !impl_->sharded_->shards_parameters()) return;
  if (keep)
    impl_->sharded_->keep_whole();
  else
    impl_->sharded_->release_all();
}

}  // namespace tandem::dist
