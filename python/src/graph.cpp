// Recorded steps from Python: a training step recorded once as a DeviceGraph and replayed whole
// (Model.compile(use_graph=True) on a GPU).
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "binding.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/graph.h"

namespace tandem::py {

namespace {

struct RecordedStep {
  std::unique_ptr<DeviceGraph> graph;
  dist::DistOpt* opt = nullptr;  // kept alive by the Python object that owns this step
  dist::CommStats delta;         // what one step adds to the DistOpt's counters
  bool first_counted = true;     // recording advanced the counters for the step the first replay runs
  int64_t replays = 0;
};

}  // namespace

void bind_graph(nb::module_& m) {
  m.def(
      "graph_supported", [](nb::handle dev) { return DeviceGraph::supported(to_device(dev)); }, nb::arg("device"),
      "Whether steps on the device can be recorded and replayed (CUDA GPUs can; the CPU cannot).");
  nb::class_<RecordedStep>(m, "RecordedStep",
                           "A training step recorded once; replay() runs it again on the device with the data "
                           "now in its input tensors and rewrites its outputs.")
      .def(
          "replay",
          [](RecordedStep& r) {
            {
              nb::gil_scoped_release unlocked;
              r.graph->replay();
            }
            if (r.opt) r.opt->communicator().watch("a recorded training step");
            if (r.opt && !r.first_counted) r.opt->count_replayed_step(r.delta);
            r.first_counted = false;
            ++r.replays;
          },
          "Queues the recorded step (returns at once) and advances the DistOpt's counters as the step did "
          "(from the second replay on: recording counted the step the first replay runs).")
      .def_ro("replays", &RecordedStep::replays)
      .def_prop_ro("pool_bytes", [](const RecordedStep& r) { return r.graph->pool_bytes(); },
                   "Device memory reserved for the step's tensors.");
  m.def(
      "record_step",
      [](nb::handle dev, nb::callable body, dist::DistOpt* opt) {
        auto r = std::make_unique<RecordedStep>();
        r->opt = opt;
        const dist::CommStats before = opt ? opt->stats() : dist::CommStats{};
        try {
          r->graph = std::make_unique<DeviceGraph>(to_device(dev), [&] { body(); });
        } catch (...) {
          if (opt) opt->abandon_step();  // nothing ran: the step may be taken again eagerly
          throw;
        }
        if (opt) r->delta = opt->stats() - before;
        return r;
      },
      nb::arg("device"), nb::arg("body"), nb::arg("distopt").none() = nb::none(), nb::keep_alive<0, 3>(),
      "Runs body() once, recording the device work it queues instead of running it (see DeviceGraph); "
      "with a DistOpt, its counters learn what one step adds.");
}

}  // namespace tandem::py
