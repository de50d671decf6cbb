// The Python module tandem._tandem: errors, devices and threads; the rest is bound by the other files.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <map>
#include <mutex>
#include <utility>

#include "binding.h"
#include "tandem/error.h"

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
  tandem::py::bind_graph(m);
}
