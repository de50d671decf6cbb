// Checkpoints that change the number of ranks and the sharding: a job saves a checkpoint under every
// --shard (and one each of sparseTopK, partialUpdate and powerSGD, whose ranks keep state of their
// own: residuals, local momentum, Q); a job of another size
// loads each of them under every --shard, finds the whole state it saved, bit for bit, and continues
// exactly as an unsharded run of its own size that started from the same state. The same with master
// weights (bf16 parameters, f32 masters saved as optimizer state).
//
// The checkpoints live in $TANDEM_TEST_CKPT_DIR; a loading job finds the saving job's size in
// $TANDEM_TEST_CKPT_FROM.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint.h"
#include "tandem/distributed/sharded_layer.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/random.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

const dist::Shard kShards[] = {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients,
                               dist::Shard::parameters};

std::string ckpt_dir() {
  const char* d = std::getenv("TANDEM_TEST_CKPT_DIR");
  return d ? d : "";
}

std::string ckpt_path(const std::string& name) { return ckpt_dir() + "/" + name + ".ckpt"; }
std::string rank_path(const std::string& name, int rank) { return ckpt_path(name) + ".rank" + std::to_string(rank); }

// linear 8->21, relu, linear 21->5: 299 parameters in two 1 KiB buckets, cut mid-parameter on 2 and 3
// ranks. For sharded parameters the linear layers are ShardedLayers, under the same parameter names.
std::shared_ptr<nn::Sequential> small_mlp(uint64_t seed, bool wrap) {
  Generator gen(seed);
  auto group = [&](nn::ModulePtr l) -> nn::ModulePtr {
    return wrap ? std::make_shared<dist::ShardedLayer>(std::move(l)) : l;
  };
  auto m = std::make_shared<nn::Sequential>();
  m->add(group(std::make_shared<nn::Linear>(8, 21, gen)));
  m->add(std::make_shared<nn::ReLU>());
  m->add(group(std::make_shared<nn::Linear>(21, 5, gen)));
  m->to(g_device);
  return m;
}

// AdamW in two groups, the matrices decayed; a schedule, so that the step count matters too.
std::shared_ptr<optim::Optimizer> adamw(const nn::Module& m) {
  optim::AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  o.decoupled = true;
  auto opt = std::make_shared<optim::Adam>(optim::decay_groups(m, 0.1), o);
  opt->set_schedule(std::make_shared<optim::WarmupCosine>(0.01, 3, 40, 0.001));
  return opt;
}

Tensor batch_loss(nn::Module& m, int rank, int step) {
  Generator gen(104729 * static_cast<uint64_t>(rank) + 7 * static_cast<uint64_t>(step) + 1);
  Tensor x = Tensor::normal({4, 8}, 0.0, 1.0, gen, DType::f32, g_device);
  Tensor y = Tensor::normal({4, 5}, 0.0, 1.0, gen, DType::f32, g_device);
  return mse_loss(m.forward(x), y);
}

struct Job {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<dist::DistOpt> opt;
};

Job make_job(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard, const std::string& method,
             uint64_t seed, bool sync = true, DType masters = DType::f32) {
  Job j;
  j.model = small_mlp(seed, shard == dist::Shard::parameters);
  dist::DistOptOptions o = small_buckets();
  o.shard = shard;
  o.sync.method = method;
  o.sync.spars = 0.2;
  o.master_weights = masters;
  j.opt = std::make_unique<dist::DistOpt>(adamw(*j.model), comm, o);
  if (sync) j.opt->sync_parameters(*j.model);
  return j;
}

void train(Job& j, int rank, int first, int steps) {
  for (int s = first; s < first + steps; ++s) j.opt->step(batch_loss(*j.model, rank, s));
}

void save(Job& j, const std::shared_ptr<dist::Communicator>& comm, const std::string& name) {
  dist::RankState st = j.opt->rank_state();
  save_tensor_file(rank_path(name, comm->rank()), st.tensors, st.meta_json);
  j.opt->gather_optimizer_state();
  if (comm->rank() == 0) save_checkpoint(ckpt_path(name), *j.model, &j.opt->optimizer(), "{}");
  comm->barrier();
}

// Every rank file the saving job wrote.
std::vector<dist::RankState> saved_states(const std::string& name, int from) {
  std::vector<dist::RankState> out(static_cast<size_t>(from));
  for (int r = 0; r < from; ++r) {
    out[static_cast<size_t>(r)].meta_json = checkpoint_meta(rank_path(name, r));
    out[static_cast<size_t>(r)].tensors = read_checkpoint_tensors(rank_path(name, r));
  }
  return out;
}

Job load(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard, const std::string& method,
         const std::string& name, int from, DType masters = DType::f32) {
  // Other parameters than the saved ones, which the load must replace; loaded before sync_parameters,
  // which shards them under Shard::parameters.
  Job j = make_job(comm, shard, method, 99, /*sync=*/false, masters);
  load_checkpoint(ckpt_path(name), *j.model, &j.opt->optimizer());
  for (const std::string& note : j.opt->load_rank_states(saved_states(name, from)))
    std::printf("%s\n", note.c_str());
  j.opt->sync_parameters(*j.model);
  return j;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous().cpu(), y = b.contiguous().cpu();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// The loaded job's whole state, gathered, against the file: parameters and optimizer state, bit for bit.
void expect_saved_state(Job& j, const std::string& name, const std::string& what, int per_parameter = 3) {
  j.opt->gather_optimizer_state();
  std::map<std::string, Tensor> now;
  for (auto& [n, t] : j.model->named_parameters()) now["param/" + n] = t;
  auto names = j.model->named_parameters();
  optim::Optimizer& o = j.opt->optimizer();
  for (auto& list : o.all_state_lists())
    for (size_t i = 0; i < o.params().size(); ++i)
      for (auto& [n, t] : names)
        if (t.is_same(o.params()[i]) && (*list.tensors)[i].defined()) now["opt/" + list.kind + "/" + n] = (*list.tensors)[i];
  int compared = 0;
  for (auto& [n, t] : read_checkpoint_tensors(ckpt_path(name))) {
    if (n.rfind("buffer/", 0) == 0) continue;
    auto it = now.find(n);
    CHECK_OR_REPORT(it != now.end(), "%s: the loaded job holds no %s", what.c_str(), n.c_str());
    if (it == now.end()) continue;
    CHECK_OR_REPORT(same_bits(it->second, t), "%s: %s differs from the saved one", what.c_str(), n.c_str());
    ++compared;
  }
  CHECK_OR_REPORT(compared == per_parameter * 4, "%s: %d saved tensors compared (4 parameters, %d tensors each)",
                  what.c_str(), compared, per_parameter);
}

}  // namespace

void scenario_reshard_save(const std::shared_ptr<dist::Communicator>& comm) {
  CHECK_OR_REPORT(!ckpt_dir().empty(), "TANDEM_TEST_CKPT_DIR is not set");
  for (dist::Shard shard : kShards) {
    Job j = make_job(comm, shard, "plain", 5);
    train(j, comm->rank(), 0, 4);
    save(j, comm, dist::shard_name(shard));
    // With master weights (bf16 parameters): the masters are saved gathered, beside the moments.
    Job m = make_job(comm, shard, "plain", 5, true, DType::bf16);
    train(m, comm->rank(), 0, 4);
    save(m, comm, std::string("masters-") + dist::shard_name(shard));
  }
  for (const char* method : {"sparseTopK", "partialUpdate", "powerSGD"}) {
    Job j = make_job(comm, dist::Shard::none, method, 5);
    train(j, comm->rank(), 0, 4);
    save(j, comm, method);
  }
}

void scenario_reshard_load(const std::shared_ptr<dist::Communicator>& comm) {
  const char* from_env = std::getenv("TANDEM_TEST_CKPT_FROM");
  CHECK_OR_REPORT(!ckpt_dir().empty() && from_env, "TANDEM_TEST_CKPT_DIR or TANDEM_TEST_CKPT_FROM is not set");
  if (!from_env) return;
  const int from = std::atoi(from_env), W = comm->size(), me = comm->rank();
  for (dist::Shard saved : kShards) {
    const std::string name = dist::shard_name(saved);
    // The unsharded run of this job's size from the saved state: what every load must continue as.
    Job ref = load(comm, dist::Shard::none, "plain", name, from);
    train(ref, me, 4, 5);
    const Values expected = host_values(ref.model->parameters());
    for (dist::Shard shard : kShards) {
      const std::string what = strf("saved on %d ranks with --shard %s, loaded on %d with --shard %s", from,
                                    name.c_str(), W, dist::shard_name(shard));
      Job j = load(comm, shard, "plain", name, from);
      expect_saved_state(j, name, what);
      train(j, me, 4, 5);
      j.opt->gather_optimizer_state();  // sharded parameters: whole again, to be read
      const Values got = host_values(j.model->parameters());
      // Two ranks add in either order alike: the continuation is exact; three sum in another order.
      expect_close_models(what + ", 5 steps on", got, expected, W <= 2 ? 0.0 : 1e-6);
    }
  }
  // Master weights: every stage's checkpoint, loaded under every stage, holds the saved masters and
  // continues as the unsharded run with masters of this size.
  for (dist::Shard saved : kShards) {
    const std::string name = std::string("masters-") + dist::shard_name(saved);
    Job ref = load(comm, dist::Shard::none, "plain", name, from, DType::bf16);
    train(ref, me, 4, 5);
    const Values expected = host_values(ref.model->parameters());
    for (dist::Shard shard : kShards) {
      const std::string what = strf("master weights saved on %d ranks with --shard %s, loaded on %d with --shard %s",
                                    from, dist::shard_name(saved), W, dist::shard_name(shard));
      Job j = load(comm, shard, "plain", name, from, DType::bf16);
      expect_saved_state(j, name, what, 4);
      train(j, me, 4, 5);
      j.opt->gather_optimizer_state();
      expect_close_models(what + ", 5 steps on", host_values(j.model->parameters()), expected, W <= 2 ? 0.0 : 1e-2);
    }
  }
  if (from == W) return;
  // What each saved rank kept for itself (sparseTopK's residuals, partialUpdate's replica and momentum) becomes
  // their average on every rank; PowerSGD's Q, the same on every saved rank, is rank 0's.
  for (const char* method : {"sparseTopK", "partialUpdate", "powerSGD"}) {
    const std::vector<dist::RankState> states = saved_states(method, from);
    Job j = load(comm, dist::Shard::none, method, method, from);
    int checked = 0;
    for (auto& [n, t] : j.opt->rank_state().tensors) {
      const bool own = n == "residuals" || n.rfind("opt/", 0) == 0 || n.rfind("param/", 0) == 0;
      std::vector<double> want;
      for (int r = 0; r < (own ? from : 1); ++r)
        for (auto& [sn, st] : states[static_cast<size_t>(r)].tensors)
          if (sn == n) {
            std::vector<float> v = st.to_vector<float>();
            want.resize(v.size(), 0.0);
            for (size_t i = 0; i < v.size(); ++i) want[i] += v[i] / (own ? static_cast<double>(from) : 1.0);
          }
      std::vector<float> got = t.cpu().to_vector<float>();
      CHECK_OR_REPORT(got.size() == want.size(), "%s: %s has %zu values loaded, %zu saved", method, n.c_str(),
                      got.size(), want.size());
      double largest = 0, bad = 0;
      for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        largest = std::max(largest, std::fabs(want[i]));
        bad = std::max(bad, std::fabs(got[i] - want[i]));
      }
      CHECK_OR_REPORT(largest > 0 && bad <= (own ? 1e-6 * largest : 0.0), "%s: the loaded %s differs by %g from %s "
                      "(largest %g)", method, n.c_str(), bad, own ? "the saved ranks' average" : "rank 0's", largest);
      ++checked;
    }
    CHECK_OR_REPORT(checked > 0, "%s: no state of its own was loaded", method);
  }
}

}  // namespace distopt_worker
