// The distributed side: where this process sits in the job, communicators, DistOpt, and the
// rendezvous store server behind the multiprocessing ticket.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "binding.h"
#include "tandem/distributed/agreement.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/communicator.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/distributed/sparse_all_reduce.h"
#include "tandem/distributed/store.h"
#include "tandem/distributed/sync_batch_norm.h"

namespace tandem::py {

namespace {

using std::chrono::milliseconds;

milliseconds to_ms(double seconds) {
  TANDEM_CHECK(seconds > 0, "a timeout must be a positive number of seconds, got ", seconds);
  return milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// The store server of a multiprocessing ticket. A child forked while it runs inherits this object but
// not the server's thread: there it is let go of without being stopped (the parent still serves).
class TicketServer {
 public:
  TicketServer(const std::string& host, const std::string& job_id, const std::string& secret)
      : server_(std::make_unique<dist::StoreServer>(
            dist::StoreServerOptions{host, 0, dist::StoreAuth{job_id, secret}, {}, {}})),
        owner_(getpid()) {}
  ~TicketServer() {
    if (getpid() != owner_) (void)server_.release();
  }
  TicketServer(const TicketServer&) = delete;
  TicketServer& operator=(const TicketServer&) = delete;
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<dist::StoreServer> server_;
  pid_t owner_;
};

// Lets a `with` block accumulate gradients without communication (DistOpt::no_sync).
struct NoSyncBlock {
  dist::DistOpt& opt;
  std::unique_ptr<dist::DistOpt::NoSync> guard;
};

}  // namespace

void bind_dist(nb::module_& m) {
  nb::class_<dist::DistEnv>(m, "DistEnv", "Where this process sits in the job, as its launcher described it.")
      .def_ro("rank", &dist::DistEnv::rank)
      .def_ro("world_size", &dist::DistEnv::world_size)
      .def_ro("local_rank", &dist::DistEnv::local_rank)
      .def_ro("local_size", &dist::DistEnv::local_size)
      .def_ro("launcher", &dist::DistEnv::launcher)
      .def("__repr__", [](const dist::DistEnv& e) {
        return "DistEnv(rank=" + std::to_string(e.rank) + ", world_size=" + std::to_string(e.world_size) +
               ", local_rank=" + std::to_string(e.local_rank) + ", local_size=" + std::to_string(e.local_size) +
               ", launcher='" + e.launcher + "')";
      });
  m.def("detect_env", &dist::detect_env, release_gil(),
        "Reads the launcher's environment once (tandem launch, mpiexec, torchrun, or none); later calls agree.");

  nb::enum_<dist::ReduceOp>(m, "ReduceOp").value("sum", dist::ReduceOp::Sum).value("avg", dist::ReduceOp::Avg);
  nb::class_<dist::Work>(m, "Work", "Completion handle of an asynchronous collective.")
      .def("wait", &dist::Work::wait, release_gil(), "Orders later work after the collective; rethrows its failure.")
      .def("done", &dist::Work::done);
  nb::class_<dist::Communicator>(m, "Communicator", "The ranks of the job (NCCL for GPUs, Gloo for CPUs).")
      .def_prop_ro("rank", &dist::Communicator::rank)
      .def_prop_ro("size", &dist::Communicator::size)
      .def_prop_ro("local_rank", &dist::Communicator::local_rank)
      .def_prop_ro("local_size", &dist::Communicator::local_size)
      .def_prop_ro("backend", &dist::Communicator::backend_name)
      .def_prop_ro("device", [](const dist::Communicator& c) { return device_object(c.device()); })
      .def("all_reduce", [](dist::Communicator& c, Tensor t, dist::ReduceOp op) { return c.all_reduce(t, op); },
           nb::arg("tensor"), nb::arg("op") = dist::ReduceOp::Sum, release_gil(), "In place, asynchronous.")
      .def("broadcast", [](dist::Communicator& c, Tensor t, int root) { return c.broadcast(t, root); },
           nb::arg("tensor"), nb::arg("root") = 0, release_gil(), "In place, asynchronous.")
      .def("all_gather", [](dist::Communicator& c, const Tensor& in, Tensor out) { return c.all_gather(in, out); },
           nb::arg("input"), nb::arg("output"), release_gil(), "output [size * n] = every rank's input [n].")
      .def(
          "reduce_scatter",
          [](dist::Communicator& c, const Tensor& in, Tensor out, dist::ReduceOp op) {
            return c.reduce_scatter(in, out, op);
          },
          nb::arg("input"), nb::arg("output"), nb::arg("op") = dist::ReduceOp::Sum, release_gil(),
          "output [n] = op over ranks of block rank of input [size * n]; asynchronous.")
      .def("barrier", &dist::Communicator::barrier, release_gil())
      .def("set_timeout", [](dist::Communicator& c, double s) { c.set_timeout(to_ms(s)); }, nb::arg("seconds"));
  m.def(
      "sparse_all_reduce",
      [](dist::Communicator& c, Tensor t, const std::optional<Tensor>& accumulation, double spars, bool top_k) {
        dist::sparse_all_reduce(c, t, accumulation.value_or(Tensor()), spars, top_k);
      },
      nb::arg("communicator"), nb::arg("tensor"), nb::arg("accumulation").none(), nb::arg("spars"),
      nb::arg("top_k"), release_gil(),
      "In place, blocking: the sum over ranks of each rank's selection from tensor (+ accumulation): the "
      "ceil(spars * n) largest magnitudes with top_k, else |x| >= spars; accumulation keeps what was not sent.");
  m.def(
      "init_communicator", [](nb::handle device, double timeout_s) {
        Device d = to_device(device);
        nb::gil_scoped_release unlocked;
        return dist::init_communicator(d, to_ms(timeout_s));
      },
      nb::arg("device").none(), nb::arg("timeout") = 300.0,
      "Joins the job: the communicator for tensors on the device. Every rank calls it in the same order.");

  nb::class_<dist::CommStats>(m, "CommStats")
      .def_ro("steps", &dist::CommStats::steps)
      .def_ro("collectives", &dist::CommStats::collectives)
      .def_ro("bytes_sent", &dist::CommStats::bytes_sent)
      .def_ro("bytes_received", &dist::CommStats::bytes_received)
      .def_ro("wait_seconds", &dist::CommStats::wait_seconds)
      .def_ro("skipped_updates", &dist::CommStats::skipped_updates);

  nb::class_<dist::BucketInfo>(m, "BucketInfo")
      .def_ro("offset", &dist::BucketInfo::offset)
      .def_ro("numel", &dist::BucketInfo::numel)
      .def_ro("span", &dist::BucketInfo::span)
      .def_ro("params", &dist::BucketInfo::params)
      .def_ro("offsets", &dist::BucketInfo::offsets);
  m.def("sync_method_names", &dist::sync_method_names, "plain, half, partialUpdate, sparseTopK, sparseThreshold, powerSGD");

  nb::class_<NoSyncBlock>(m, "NoSync")
      .def("__enter__", [](NoSyncBlock& b) { b.guard = std::make_unique<dist::DistOpt::NoSync>(b.opt); })
      .def("__exit__", [](NoSyncBlock& b, nb::args) { b.guard.reset(); });

  nb::class_<dist::DistOpt>(m, "DistOpt", "Averages gradients across ranks while backward runs, then steps the wrapped optimizer.")
      .def(
          "__init__",
          [](dist::DistOpt* self, std::shared_ptr<optim::Optimizer> opt, std::shared_ptr<dist::Communicator> comm,
             size_t bucket_bytes, size_t first_bucket_bytes, const std::string& method, DType half_dtype,
             double clip, double spars, bool error_feedback, int rank, bool skip_nonfinite, const std::string& shard,
             bool uneven_inputs, DType master_weights, bool release_gradients, const std::string& offload) {
            TANDEM_CHECK(offload == "none" || offload == "optimizer" || offload == "parameters", "DistOpt: offload ",
                         "is 'none', 'optimizer' or 'parameters', not '", offload, "'");
            dist::DistOptOptions o;
            o.release_gradients = release_gradients;
            o.offload_optimizer = offload != "none";
            o.offload_parameters = offload == "parameters";
            o.shard = dist::parse_shard(shard);
            o.master_weights = master_weights;
            o.uneven_inputs = uneven_inputs;
            o.bucket_bytes = bucket_bytes;
            o.first_bucket_bytes = first_bucket_bytes;
            o.sync = dist::SyncOptions{dist::parse_sync_method(method), half_dtype, clip, spars, error_feedback, rank};
            o.skip_nonfinite = skip_nonfinite;
            nb::gil_scoped_release unlocked;
            new (self) dist::DistOpt(std::move(opt), std::move(comm), o);
          },
          nb::arg("optimizer"), nb::arg("communicator"), nb::arg("bucket_bytes") = size_t(16) << 20,
          nb::arg("first_bucket_bytes") = size_t(1) << 20, nb::arg("method") = "plain",
          nb::arg("half_dtype") = DType::f16, nb::arg("clip") = 0.0, nb::arg("spars") = 0.05,
          nb::arg("error_feedback") = true, nb::arg("rank") = 2, nb::arg("skip_nonfinite") = false,
          nb::arg("shard") = "none", nb::arg("uneven_inputs") = false, nb::arg("master_weights") = DType::f32,
          nb::arg("release_gradients") = false, nb::arg("offload") = "none",
          "Wraps optimizer; every rank must pass the same parameters and options. method and the settings "
          "after it are what step() and backward_and_sync() do; shard (none, optimizer, gradients) what each "
          "rank keeps only its own share of (ZeRO); master_weights (bf16, f16) makes the parameters hold values of "
          "that type while the optimizer steps f32 masters (f32: none); release_gradients holds gradients only from "
          "backward to update() (shard none without master weights), so that a step's peak memory holds none; "
          "offload (optimizer, parameters) keeps the optimizer's state (and stage 3's slices) in host memory, as "
          "tandem train --offload does.")
      .def("join", &dist::DistOpt::join, nb::arg("clip_norm") = 0.0, release_gil(),
           "With uneven_inputs: this rank has no data left; takes part in the others' steps until every rank has "
           "joined. Returns how many steps it took part in.")
      .def("join_step", &dist::DistOpt::join_step, nb::arg("clip_norm") = 0.0, release_gil(),
           "join() one step at a time: True when update() must follow, False once every rank has joined.")
      .def("gather_optimizer_state", &dist::DistOpt::gather_optimizer_state, release_gil(),
           "Sharded: the wrapped optimizer's state becomes the whole state, gathered from every rank, for a checkpoint.")
      .def("release_optimizer_state", &dist::DistOpt::release_optimizer_state,
           "Drops the copy gather_optimizer_state made, once the checkpoint is written.")
      .def("gather_parameters", &dist::DistOpt::gather_parameters, release_gil(),
           "--shard parameters: every parameter whole (collective), to be read or written until release_parameters "
           "or the next use of its layer group; nothing otherwise.")
      .def("release_parameters", &dist::DistOpt::release_parameters, nb::arg("keep") = false, release_gil(),
           "--shard parameters: frees what gather_parameters made whole; with keep, this rank first keeps its "
           "blocks of the values written into them (the same on every rank).")
      .def(
          "set_param_groups",
          [](dist::DistOpt& d, const std::vector<GroupTuple>& groups) {
            std::vector<optim::ParamGroup> g = to_groups(groups);
            nb::gil_scoped_release unlocked;
            d.set_param_groups(g);
          },
          nb::arg("groups"),
          "Regroups the wrapped optimizer's parameters, (params, lr_scale, weight_decay or None) each; under "
          "--shard the slices are cut again along the new groups (a collective: every rank calls it).")
      .def(
          "memory_report",
          [](const dist::DistOpt& d) {
            const dist::MemoryReport r = d.memory_report();
            nb::dict out;
            out["parameters"] = r.parameters;
            out["gradients"] = r.gradients;
            out["optimizer_state"] = r.optimizer_state;
            out["master_weights"] = r.master_weights;
            out["total"] = r.total();
            return out;
          },
          "Bytes this rank keeps for parameters, gradients, optimizer state and master weights.")
      .def_prop_ro("rank_in_local", &dist::DistOpt::rank_in_local)
      .def_prop_ro("rank_in_global", &dist::DistOpt::rank_in_global)
      .def_prop_ro("world_size", &dist::DistOpt::world_size)
      .def("sync_parameters", &dist::DistOpt::sync_parameters, nb::arg("model"), release_gil(),
           "Checks that every rank built the same model, then copies rank 0's parameters and buffers to all.")
      .def("backward_and_sync", &dist::DistOpt::backward_and_sync, nb::arg("loss"), release_gil(),
           "Backward with the gradients averaged across ranks; grads then hold the average.")
      .def("clip_grad_norm", &dist::DistOpt::clip_grad_norm, nb::arg("max_norm"), release_gil(),
           "Scales the averaged gradients to a global L2 norm of at most max_norm; returns the norm before.")
      .def("update", &dist::DistOpt::update, release_gil(),
           "Applies the gradients; False (on every rank) when the step was skipped for inf/NaN gradients.")
      .def("step", &dist::DistOpt::step, nb::arg("loss"), release_gil(), "backward_and_sync, then update.")
      .def("no_sync", [](dist::DistOpt& d) { return NoSyncBlock{d, nullptr}; }, nb::keep_alive<0, 1>(),
           "with opt.no_sync(): backward_and_sync accumulates this rank's gradients without communicating.")
      .def("backward_and_update", &dist::DistOpt::backward_and_update, nb::arg("loss"), release_gil())
      .def("backward_and_update_half", &dist::DistOpt::backward_and_update_half, nb::arg("loss"),
           nb::arg("clipping") = false, nb::arg("clip_value") = 100.0, release_gil())
      .def("backward_and_partial_update", &dist::DistOpt::backward_and_partial_update, nb::arg("loss"), release_gil())
      .def("backward_and_sparse_update", &dist::DistOpt::backward_and_sparse_update, nb::arg("loss"),
           nb::arg("spars") = 0.05, nb::arg("topK") = false, nb::arg("corr") = true, release_gil())
      .def("average_parameters", &dist::DistOpt::average_parameters, release_gil())
      .def("average_buffers", &dist::DistOpt::average_buffers, release_gil())
      .def("check_consistency", &dist::DistOpt::check_consistency, nb::arg("include_buffers") = true, release_gil())
      .def_prop_ro("stats", &dist::DistOpt::stats)
      .def("reset_stats", &dist::DistOpt::reset_stats)
      .def("bucket_sizes", &dist::DistOpt::bucket_sizes)
      .def("bucket_layout", &dist::DistOpt::bucket_layout)
      .def("residual_norms", &dist::DistOpt::residual_norms)
      .def_prop_ro("method", [](const dist::DistOpt& d) { return d.active_sync().method; },
                   "The method the last step ran with.")
      .def("step_capturable", &dist::DistOpt::step_capturable)
      .def("replay_blocker", &dist::DistOpt::replay_blocker,
           "Why the next step could not be recorded once and replayed; empty when it can.");

  m.def("convert_sync_batch_norm", &dist::convert_sync_batch_norm, nb::arg("model"), nb::arg("communicator"),
        "Makes every BatchNorm2d of the model take its training statistics over all ranks; returns how many.");
  m.def(
      "check_agreement",
      [](const std::vector<std::tuple<std::string, std::string, bool>>& fields) {
        std::vector<dist::AgreementField> f;
        for (const auto& [name, value, must_match] : fields) f.push_back({name, value, must_match});
        nb::gil_scoped_release unlocked;
        return dist::check_agreement(f);
      },
      nb::arg("fields"),
      "Compares (name, value, must_match) across the ranks; raises naming the first must-match field that differs.");
  m.def("report_step", &dist::report_step, nb::arg("step"), "Records the training step this rank reached.");
  m.def("abort_job_after_error", &dist::abort_job_after_error, nb::arg("exit_code"),
        "Under mpiexec, stops every rank of the job (the others would wait for this one); elsewhere nothing.");

  nb::class_<TicketServer>(m, "StoreServer", "A rendezvous store served from a thread of this process.")
      .def(nb::init<const std::string&, const std::string&, const std::string&>(), nb::arg("host"),
           nb::arg("job_id"), nb::arg("secret"), release_gil(),
           "Serves clients of job_id that prove they know secret (at least 16 bytes).")
      .def_prop_ro("port", &TicketServer::port);
}

}  // namespace tandem::py
