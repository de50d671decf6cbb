// The Python module tandem._tandem: errors, devices and threads; the rest is bound by the other files.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <map>
#include <mutex>
#include <utility>

#include "binding.h"
#include "tandem/error.h"
#include "tandem/profiler.h"

namespace tandem::py {

namespace {

// What a user must fix is a ValueError; a failing device, peer or network is a RuntimeError.
void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyErr_SetString(e.kind() == Error::Kind::Input ? PyExc_ValueError : PyExc_RuntimeError, e.what());
  }
}

}  // namespace

std::shared_ptr<PyDevice> device_object(Device d) {
  static std::mutex mu;
  // Never destroyed: Python may still hand out devices while the interpreter shuts down.
  static auto* devices = new std::map<std::pair<int, int>, std::shared_ptr<PyDevice>>();
  if (d.is_cpu()) d.index = 0;
  check_device(d);
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*devices)[{static_cast<int>(d.type), d.index}];
  if (!slot) slot = std::make_shared<PyDevice>(d);
  return slot;
}

Device to_device(nb::handle h) {
  if (h.is_none()) return Device::cpu();
  if (nb::isinstance<PyDevice>(h)) return nb::cast<PyDevice&>(h).device;
  if (nb::isinstance<nb::str>(h)) return Device::parse(nb::cast<std::string>(h));
  throw nb::type_error("expected a tandem Device, a device name such as 'cpu' or 'cuda:0', or None");
}

void bind_core(nb::module_& m) {
  nb::register_exception_translator(&translate_error);

  nb::class_<Generator>(m, "Generator", "Counter-based random numbers: the same seed gives the same values on every device.")
      .def(nb::init<uint64_t>(), nb::arg("seed") = 0)
      .def_prop_ro("seed", &Generator::seed)
      .def_prop_ro("offset", &Generator::offset)
      .def("next_below", &Generator::next_below, nb::arg("n"), "A uniform integer in [0, n).")
      .def("next_double", &Generator::next_double, "A uniform float in [0, 1).");

  nb::class_<PyDevice>(m, "Device", "The CPU or one CUDA GPU, with the random generator of the layers initialised on it.")
      .def_prop_ro("type", [](const PyDevice& d) { return d.device.is_cpu() ? "cpu" : "cuda"; })
      .def_prop_ro("index", [](const PyDevice& d) { return d.device.index; })
      .def("id", [](const PyDevice& d) { return d.device.is_cpu() ? -1 : d.device.index; },
           "SINGA's device id: the GPU index, -1 for the CPU.")
      .def("is_cuda", [](const PyDevice& d) { return d.device.is_cuda(); })
      .def("is_cpu", [](const PyDevice& d) { return d.device.is_cpu(); })
      .def(
          "set_rand_seed", [](PyDevice& d, uint64_t seed) { d.generator = Generator(seed); }, nb::arg("seed"),
          "Restarts the generator that initialises parameters of layers on this device.")
      .def(
          "SetRandSeed", [](PyDevice& d, uint64_t seed) { d.generator = Generator(seed); }, nb::arg("seed"),
          "SINGA's spelling of set_rand_seed.")
      .def_prop_ro(
          "generator", [](PyDevice& d) -> Generator& { return d.generator; }, nb::rv_policy::reference_internal)
      .def("synchronize", [](const PyDevice& d) { synchronize(d.device); }, release_gil(),
           "Waits until all work queued on the device is done.")
      .def("Sync", [](const PyDevice& d) { synchronize(d.device); }, release_gil(),
           "SINGA's spelling of synchronize: waits until all work queued on the device is done.")
      .def(
          "SetVerbosity", [](const PyDevice& d, int verbosity) { profiler::set_verbosity(d.device, verbosity); },
          nb::arg("verbosity"),
          "Time profiling of the operations run on the device: 0 off (the default), 1 forward and backward time "
          "per iteration, 2 each operation, 3 the distributed optimizer's operations. While on, each operation "
          "is timed alone (on a GPU the host waits for it), so steps run slower.")
      .def(
          "SetSkipIteration",
          [](const PyDevice& d, int skip_iteration) { profiler::set_skip_iterations(d.device, skip_iteration); },
          nb::arg("skip_iteration"), "The first skip_iteration iterations (default 5) are not profiled.")
      .def(
          "PrintTimeProfiling",
          [](const PyDevice& d) {
            const std::string r = profiler::report(d.device);
            if (!r.empty()) nb::print(nb::str(r.c_str()), nb::str(""));
          },
          "Prints the time profile at the verbosity set (nothing at 0): per iteration after the skipped ones.")
      .def(
          "time_profile",
          [](const PyDevice& d) {
            const profiler::Profile p = profiler::profile(d.device);
            nb::list ops;
            for (const profiler::OpTime& op : p.ops) {
              nb::dict e;
              e["name"] = op.name;
              e["phase"] = profiler::phase_name(op.phase);
              e["calls"] = op.calls;
              e["seconds"] = op.seconds;
              ops.append(e);
            }
            nb::dict out;
            out["verbosity"] = p.verbosity;
            out["skip_iterations"] = p.skip_iterations;
            out["iterations"] = p.iterations;
            out["profiled_iterations"] = p.profiled;
            out["ops"] = ops;
            return out;
          },
          "The profile as data: iterations, and per operation and phase its calls and seconds (summed).")
      .def(
          "ResetTimeProfiling", [](const PyDevice& d) { profiler::reset(d.device); },
          "Forgets the time profile measured so far; the skipped iterations start again.")
      .def(
          "EnableGraph", [](PyDevice& d, bool enable) { d.graph_enabled = enable; }, nb::arg("enable"),
          "Whether models compiled with use_graph=True may record their training steps on this device and "
          "replay them (on by default; off: every step runs eagerly).")
      .def("graph_enabled", [](const PyDevice& d) { return d.graph_enabled; },
           "False after EnableGraph(False).")
      .def(
          "ResetGraph", [](PyDevice& d) { ++d.graph_generation; },
          "Drops the recorded steps of models on this device: the next steps run eagerly and are recorded anew.")
      .def_prop_ro("graph_generation", [](const PyDevice& d) { return d.graph_generation; },
                   "How many times ResetGraph was called on this device.")
      .def(
          "Reset",
          [](PyDevice& d) {
            {
              nb::gil_scoped_release unlocked;
              synchronize(d.device);
            }
            d.graph_enabled = true;
            ++d.graph_generation;
            profiler::set_verbosity(d.device, 0);
            profiler::set_skip_iterations(d.device, 5);
            profiler::reset(d.device);
          },
          "SINGA's Device.Reset: waits for the device, drops recorded steps, turns profiling off (skip 5).")
      .def("host", [](const PyDevice&) { return device_object(Device::cpu()); }, "The CPU (SINGA's host device).")
      .def("__str__", [](const PyDevice& d) { return d.device.str(); })
      .def("__repr__", [](const PyDevice& d) { return "Device('" + d.device.str() + "')"; });

  m.def("device", [](nb::handle spec) { return device_object(to_device(spec)); }, nb::arg("spec").none(),
        "The Device object of 'cpu', 'cuda', 'cuda:N' (None: the CPU).");
  m.def("cuda_device_count", &cuda_device_count, "Number of usable CUDA GPUs (0 without the CUDA backend).");
  m.def("set_num_threads", &set_num_threads, nb::arg("n"), "CPU threads for kernels and BLAS (0: all cores).");
  m.def("num_threads", &num_threads, "CPU threads the kernels use.");
}

}  // namespace tandem::py

NB_MODULE(_tandem, m) {
  m.doc() = "tandem's C++ core: tensors, autograd, layers, optimizers and the distributed optimizer";
  tandem::py::bind_core(m);
  tandem::py::bind_tensor(m);
  tandem::py::bind_ops(m);
  tandem::py::bind_nn(m);
  tandem::py::bind_dist(m);
  tandem::py::bind_data(m);
  tandem::py::bind_tokenizer(m);
  tandem::py::bind_graph(m);
  // elementwise ops
  tandem::py::bind_elementwise(m);
  // reductions, shape and indexing ops, products
  tandem::py::bind_shape(m);
  // softmax, normalisation, losses, attention
  tandem::py::bind_norm(m);
  tandem::py::bind_pretrained(m);
  // embedding, recurrent networks, optimizers, schedules
  tandem::py::bind_rnn(m);
}
