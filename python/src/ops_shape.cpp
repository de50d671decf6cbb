// Reductions, shape and indexing ops and products, as module functions (tandem.autograd and
// tandem.tensor build SINGA's API on them).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "tandem/ops.h"

namespace tandem::py {

namespace {

using Dims = std::vector<int64_t>;

PadMode pad_mode(const std::string& mode) {
  if (mode == "constant") return PadMode::Constant;
  if (mode == "reflect") return PadMode::Reflect;
  if (mode == "edge") return PadMode::Edge;
  throw nb::value_error(("pad: mode must be 'constant', 'reflect' or 'edge', got '" + mode + "'").c_str());
}

bool block_order(const std::string& mode, const char* op) {
  if (mode == "DCR" || mode == "dcr") return false;
  if (mode == "CRD" || mode == "crd") return true;
  throw nb::value_error((std::string(op) + ": mode must be 'DCR' or 'CRD', got '" + mode + "'").c_str());
}

}  // namespace

void bind_shape(nb::module_& m) {
  // reductions
  m.def("mean_dims", static_cast<Tensor (*)(const Tensor&, const Dims&, bool)>(&mean), nb::arg("x"), nb::arg("dims"),
        nb::arg("keepdim") = false, release_gil(), "Mean over the dimensions (keepdim: as extents of 1).");
  m.def("amax", &amax, nb::arg("x"), nb::arg("dims"), nb::arg("keepdim") = false, release_gil(),
        "Largest element over the dimensions; ties share the gradient evenly.");
  m.def("amin", &amin, nb::arg("x"), nb::arg("dims"), nb::arg("keepdim") = false, release_gil(),
        "Smallest element over the dimensions; ties share the gradient evenly.");
  m.def("argmax_dim", static_cast<Tensor (*)(const Tensor&, int64_t, bool)>(&argmax), nb::arg("x"), nb::arg("dim"),
        nb::arg("keepdim") = false, release_gil(), "Position (i64) of the first largest element along dim.");
  m.def("argmin_dim", &argmin, nb::arg("x"), nb::arg("dim"), nb::arg("keepdim") = false, release_gil(),
        "Position (i64) of the first smallest element along dim.");
  m.def("var", &var, nb::arg("x"), nb::arg("dims"), nb::arg("unbiased") = true, nb::arg("keepdim") = false,
        release_gil(), "Variance over the dimensions (unbiased: divided by count - 1).");
  m.def("logsumexp", &logsumexp, nb::arg("x"), nb::arg("dims"), nb::arg("keepdim") = false, release_gil(),
        "log(sum(exp(x))) over the dimensions, computed stably.");
  m.def("prod", &prod, nb::arg("x"), nb::arg("dims"), nb::arg("keepdim") = false, release_gil(),
        "Product over the dimensions.");
  m.def("cosine_similarity", &cosine_similarity, nb::arg("a"), nb::arg("b"), nb::arg("dim") = 1, nb::arg("eps") = 1e-8,
        release_gil(), "sum((a / max(|a|, eps)) (b / max(|b|, eps))) along dim (PyTorch's).");
  m.def("ranking_loss", &ranking_loss, nb::arg("pos"), nb::arg("neg"), nb::arg("margin") = 0.2, release_gil(),
        "sum(max(0, margin - pos + neg)) / pos.shape[0].");

  // views and rearrangement
  m.def("transpose", static_cast<Tensor (*)(const Tensor&, int64_t, int64_t)>(&transpose), nb::arg("x"),
        nb::arg("dim0"), nb::arg("dim1"), release_gil(), "Two dimensions swapped (a view, recorded by autograd).");
  m.def("squeeze", &squeeze, nb::arg("x"), nb::arg("dims") = Dims{}, release_gil(),
        "Without the listed extent-1 dimensions (all of them when none are listed); a view.");
  m.def("unsqueeze", &unsqueeze, nb::arg("x"), nb::arg("dims"), release_gil(),
        "Extents of 1 inserted at the listed positions of the result; a view.");
  m.def("split", &split, nb::arg("x"), nb::arg("lengths"), nb::arg("dim") = 0, release_gil(),
        "Consecutive pieces of the given lengths along dim (views).");
  m.def("chunk", &chunk, nb::arg("x"), nb::arg("parts"), nb::arg("dim") = 0, release_gil(),
        "`parts` pieces of ceil(extent / parts) along dim, the last shorter (views).");
  m.def(
      "strided_slice",
      [](const Tensor& x, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
        return strided_slice(x, dim, start.value_or(kOpen), end.value_or(kOpen), step);
      },
      nb::arg("x"), nb::arg("dim"), nb::arg("start").none(), nb::arg("end").none(), nb::arg("step") = 1, release_gil(),
      "NumPy's x[start:end:step] along dim (None: an open end); a view for a positive step, a copy otherwise.");
  m.def("slice_ranges", &slice_ranges, nb::arg("x"), nb::arg("starts"), nb::arg("ends"), nb::arg("axes") = Dims{},
        nb::arg("steps") = Dims{}, release_gil(), "ONNX's Slice: starts[i]:ends[i]:steps[i] along axes[i].");
  m.def("tile", &tile, nb::arg("x"), nb::arg("repeats"), release_gil(), "NumPy's tile.");
  m.def("upsample_nearest", &upsample_nearest, nb::arg("x"), nb::arg("scales"), release_gil(),
        "Each element repeated scales[d] times along dimension d.");
  m.def(
      "pad",
      [](const Tensor& x, const Dims& pads, const std::string& mode, double value) {
        const PadMode pm = pad_mode(mode);
        nb::gil_scoped_release unlocked;
        return pad(x, pads, pm, value);
      },
      nb::arg("x"), nb::arg("pads"), nb::arg("mode") = "constant", nb::arg("value") = 0.0,
      "ONNX's Pad: pads before each dimension, then after each; mode 'constant', 'reflect' or 'edge'.");
  m.def(
      "depth_to_space",
      [](const Tensor& x, int64_t blocksize, const std::string& mode) {
        const bool crd = block_order(mode, "depth_to_space");
        nb::gil_scoped_release unlocked;
        return depth_to_space(x, blocksize, crd);
      },
      nb::arg("x"), nb::arg("blocksize"), nb::arg("mode") = "DCR", "ONNX's DepthToSpace of [N, C, H, W].");
  m.def(
      "space_to_depth",
      [](const Tensor& x, int64_t blocksize, const std::string& mode) {
        const bool crd = block_order(mode, "space_to_depth");
        nb::gil_scoped_release unlocked;
        return space_to_depth(x, blocksize, crd);
      },
      nb::arg("x"), nb::arg("blocksize"), nb::arg("mode") = "DCR", "The inverse of depth_to_space.");

  // indexing
  m.def("index_select", &index_select, nb::arg("x"), nb::arg("dim"), nb::arg("index"), release_gil(),
        "ONNX's Gather: x's slices at the indices along dim (shape x[:dim] + index + x[dim+1:]).");
  m.def("gather", &gather, nb::arg("x"), nb::arg("dim"), nb::arg("index"), release_gil(),
        "PyTorch's gather: x[.., index[.., j, ..], ..] along dim.");
  m.def("scatter_add", &scatter_add, nb::arg("x"), nb::arg("dim"), nb::arg("index"), nb::arg("src"), release_gil(),
        "x with src added at index along dim (in a fixed order).");
  m.def("scatter_elements", &scatter_elements, nb::arg("x"), nb::arg("index"), nb::arg("updates"), nb::arg("dim") = 0,
        release_gil(), "ONNX's ScatterElements: x with updates written at index along dim.");
  m.def("one_hot", &one_hot, nb::arg("index"), nb::arg("depth"), nb::arg("axis") = -1, nb::arg("off") = 0.0,
        nb::arg("on") = 1.0, nb::arg("dtype") = DType::f32, release_gil(), "One-hot rows of the indices.");
  m.def("nonzero", &nonzero, nb::arg("x"), release_gil(),
        "Positions of the nonzero elements, i64 [x.ndim, count] (waits for the device).");

  // products
  m.def(
      "gemm",
      [](const Tensor& a, const Tensor& b, const std::optional<Tensor>& c, double alpha, double beta, bool ta, bool tb) {
        return gemm(a, b, c.value_or(Tensor()), alpha, beta, ta, tb);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("c").none() = nb::none(), nb::arg("alpha") = 1.0, nb::arg("beta") = 1.0,
      nb::arg("trans_a") = false, nb::arg("trans_b") = false, release_gil(),
      "alpha op(a) op(b) + beta c (c broadcast to the product, may be None).");
}

}  // namespace tandem::py
