// Data sets read from their standard files (MNIST, Fashion-MNIST, CIFAR-10).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <string>

#include "binding.h"
#include "tandem/data/dataset.h"

namespace tandem::py {

void bind_data(nb::module_& m) {
  nb::class_<data::Dataset>(m, "Dataset", "A labelled image set in host memory.")
      .def_ro("name", &data::Dataset::name)
      .def_ro("images", &data::Dataset::images, "u8 [N, C, H, W]")
      .def_ro("labels", &data::Dataset::labels, "i32 [N]")
      .def_ro("num_classes", &data::Dataset::num_classes)
      .def("__len__", &data::Dataset::size);
  m.def(
      "load_dataset",
      [](const std::string& name, const std::string& dir, bool train) {
        std::string where = dir.empty() ? data::default_data_dir(name) : dir;
        if (!std::filesystem::is_directory(where)) {
          // Python's file functions raise OSError for a missing path; so does this one.
          PyErr_Format(PyExc_FileNotFoundError, "data directory '%s' of %s does not exist", where.c_str(), name.c_str());
          throw nb::python_error();
        }
        nb::gil_scoped_release unlocked;
        return data::load_dataset(name, dir, train);
      },
      nb::arg("name"), nb::arg("dir") = "", nb::arg("train") = true,
      "Loads 'mnist', 'fashion-mnist' or 'cifar10' from dir (empty: the default directory).");
  m.def("default_data_dir", &data::default_data_dir, nb::arg("name"));
  m.def("dataset_names", &data::dataset_names);
}

}  // namespace tandem::py
