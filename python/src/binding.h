#pragma once
// Internal to the Python module: what its source files share.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "tandem/device.h"
#include "tandem/optim/optimizer.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace nb = nanobind;

namespace tandem::py {

/// Releases the GIL while a bound function runs: compute, copies and collectives.
using release_gil = nb::call_guard<nb::gil_scoped_release>;

/// A device as Python sees it: one object per device, with the random generator that layers on it
/// initialise their parameters from (SINGA's Device.SetRandSeed).
struct PyDevice {
  Device device;
  Generator generator;
  // SINGA's EnableGraph and ResetGraph: whether models may record their steps on the device, and a
  // count that ResetGraph raises so that models drop the recordings they hold.
  bool graph_enabled = true;
  uint64_t graph_generation = 0;
  explicit PyDevice(Device d) : device(d) {}
};

/// The one PyDevice of a device (created on first use, after checking that the device exists).
std::shared_ptr<PyDevice> device_object(Device d);
/// A device given from Python as a Device object, a string ("cpu", "cuda:1") or None (the CPU).
Device to_device(nb::handle h);

/// A tensor on `device` viewing the memory of an imported array; the array stays alive as long as
/// any tensor uses the memory.
Tensor tensor_from_array(nb::ndarray<> array);

/// The handle of the CUDA stream tandem queues work on for a GPU (0 in a build without CUDA).
uintptr_t compute_stream_handle(int device);

/// A parameter group as Python hands it over: (parameters, learning-rate factor, weight decay or None).
using GroupTuple = std::tuple<std::vector<Tensor>, double, std::optional<double>>;
std::vector<optim::ParamGroup> to_groups(const std::vector<GroupTuple>& groups);

void bind_core(nb::module_& m);
void bind_tensor(nb::module_& m);
/// NumPy and DLPack methods of Tensor, and the module functions around them.
void bind_array(nb::module_& m, nb::class_<Tensor>& t);
void bind_ops(nb::module_& m);
void bind_nn(nb::module_& m);
void bind_dist(nb::module_& m);
void bind_data(nb::module_& m);
void bind_tokenizer(nb::module_& m);
void bind_graph(nb::module_& m);
// op families in files of their own (ops_*.cpp)
// elementwise ops
/// Elementwise math, activations, comparisons, logical masks, where and cast (ops_elementwise.cpp).
void bind_elementwise(nb::module_& m);
// reductions, shape and indexing ops, products
/// Reductions, shape and indexing ops, products (ops_shape.cpp).
void bind_shape(nb::module_& m);
// softmax, normalisation, losses, attention
/// log_softmax, layer_norm, rms_norm, the N-D losses, scaled_dot_product_attention and their layers.
void bind_norm(nb::module_& m);
void bind_pretrained(nb::module_& m);
// embedding, recurrent networks, optimizers, schedules
/// Embedding, recurrent networks, RMSProp and AdaGrad, parameter groups, learning-rate schedules (ops_rnn.cpp).
void bind_rnn(nb::module_& m);

}  // namespace tandem::py
