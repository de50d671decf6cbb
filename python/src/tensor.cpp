// tandem.Tensor: the C++ tensor handle with SINGA's constructor, attributes and arithmetic.
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "core/tensor_impl.h"
#include "tandem/error.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem::py {

namespace {

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

// An undefined tensor (no gradient yet, no bias) is None in Python.
nb::object maybe(const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }

// Overwrites t's values in place with those of value: t keeps its identity, storage and autograd role
// (SINGA's `t /= n` on a parameter changes the parameter, it records no op).
nb::object assign(nb::handle_t<Tensor> self, const Tensor& value) {
  Tensor& t = nb::cast<Tensor&>(self);
  {
    nb::gil_scoped_release unlocked;
    NoGradGuard no_grad;
    t.copy_(value);
  }
  return nb::borrow(self);
}

}  // namespace

void bind_tensor(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element type of a tensor.")
      .value("float32", DType::f32)
      .value("float64", DType::f64)
      .value("float16", DType::f16)
      .value("bfloat16", DType::bf16)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("uint8", DType::u8);
  m.def("parse_dtype", [](const std::string& s) { return parse_dtype(s); }, nb::arg("name"),
        "The DType named 'f32', 'float16', 'bf16', ...");

  nb::class_<Tensor> t(m, "Tensor", "An n-dimensional array on the CPU or a GPU; copying it copies the handle.");
  t.def(
       "__init__",
       [](Tensor* self, const std::vector<int64_t>& shape, nb::handle device, DType dtype, nb::handle data,
          bool requires_grad, bool stores_grad, nb::handle creator, std::optional<std::string> name) {
         if (!creator.is_none())
           throw nb::value_error(
               "Tensor(creator=...): tandem records the operations that make a tensor itself; pass creator=None");
         Tensor made;
         if (data.is_none()) {
           Device d = to_device(device);
           nb::gil_scoped_release unlocked;
           made = Tensor::zeros(shape, dtype, d);
         } else if (nb::isinstance<Tensor>(data)) {
           // The same memory, with an autograd role of its own (SINGA wraps the given tensor).
           const Tensor& src = nb::cast<const Tensor&>(data);
           TANDEM_CHECK(device.is_none() || to_device(device) == src.device(), "Tensor(data=...): the data is on ",
                        src.device().str(), ", not on the device given (", to_device(device).str(), ")");
           made = src.detach();
         } else {
           // An array (or anything NumPy makes one of): its values, converted to dtype, on the device.
           nb::object array = nb::module_::import_("numpy").attr("ascontiguousarray")(data);
           Tensor src = tensor_from_array(nb::cast<nb::ndarray<>>(array));
           Device d = to_device(device);
           nb::gil_scoped_release unlocked;
           made = Tensor::empty(src.shape(), dtype, d);
           NoGradGuard no_grad;
           made.copy_(src);
         }
         // SINGA computes gradients for every tensor that requires one but keeps only those of tensors
         // that store them; tandem computes only the kept ones.
         if (requires_grad && stores_grad) made.requires_grad_(true);
         if (name) made.impl()->name = *name;
         new (self) Tensor(std::move(made));
       },
       nb::arg("shape") = std::vector<int64_t>{}, nb::arg("device").none() = nb::none(), nb::arg("dtype") = DType::f32,
       nb::arg("data").none() = nb::none(), nb::arg("requires_grad") = true, nb::arg("stores_grad") = false,
       nb::arg("creator").none() = nb::none(), nb::arg("name").none() = nb::none(),
       "Tensor(shape=(), device=None, dtype=float32, data=None, requires_grad=True, stores_grad=False, "
       "creator=None, name=None), as SINGA's: zeros of that shape on the device (None: the CPU), or a copy of the "
       "array `data` converted to dtype, or a tensor sharing the memory of the tensor `data`. A tensor that "
       "requires and stores a gradient is a leaf autograd fills the gradient of (a parameter).")
      .def_prop_ro("shape", [](const Tensor& x) { return shape_tuple(x.shape()); })
      .def_prop_ro("strides", [](const Tensor& x) { return shape_tuple(x.strides()); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("data_ptr", [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.data_ptr()); },
                   "The address of the first element (0 for an empty tensor).")
      .def_prop_ro("device", [](const Tensor& x) { return device_object(x.device()); })
      .def_prop_ro("ndim", &Tensor::dim)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("data", [](nb::handle_t<Tensor> self) { return nb::borrow(self); },
                   "The tensor itself (SINGA code passes `t.data` to the distributed optimizer).")
      .def("size", &Tensor::numel, "Number of elements.")
      .def("numel", &Tensor::numel)
      .def("dim", &Tensor::dim)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("__len__", [](const Tensor& x) {
        if (x.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
        return x.size(0);
      })
      .def("__repr__", &Tensor::str)
      // autograd
      .def_prop_rw("requires_grad", &Tensor::requires_grad, [](Tensor& x, bool on) { x.requires_grad_(on); })
      .def_prop_rw(
          "stores_grad", [](const Tensor& x) { return x.is_leaf() && x.requires_grad(); },
          [](Tensor& x, bool on) { x.requires_grad_(on); },
          "True for a leaf whose gradient backward computes and keeps (a parameter).")
      .def_prop_rw(
          "name",
          [](const Tensor& x) {
            // Unnamed tensors are told apart as SINGA's are ("Dummy#N"), by a name kept from then on.
            static uint64_t next = 0;
            std::string& n = x.impl()->name;
            if (n.empty()) n = "Dummy#" + std::to_string(next++);
            return n;
          },
          [](Tensor& x, const std::string& n) { x.impl()->name = n; }, "The tensor's name (parameters: their path).")
      .def_prop_rw(
          "grad", [](const Tensor& x) { return maybe(x.grad()); },
          [](Tensor& x, const std::optional<Tensor>& g) { x.set_grad(g ? g->detach() : Tensor()); },
          nb::for_setter(nb::arg("value").none()),
          "The gradient backward accumulated (None before any); assign None to drop it, or a tensor of this "
          "tensor's shape, dtype and device.")
      .def_prop_ro("is_leaf", &Tensor::is_leaf)
      // For tandem.sonnx's export trace: the identity of the tensor a handle points to, its place in the
      // order tensors are made, and another handle to the same tensor (which a later in-place conversion
      // of this handle, to_type or to_device, leaves as it is).
      .def_prop_ro("_impl_id", [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.impl()); })
      .def_prop_ro("_serial", [](const Tensor& x) { return x.impl() ? x.impl()->serial.value : uint64_t{0}; })
      .def("_handle", [](const Tensor& x) { return x; })
      .def("backward", [](const Tensor& x, std::optional<Tensor> g) { backward(x, {}, g.value_or(Tensor())); },
           nb::arg("grad_output").none() = nb::none(), release_gil(),
           "Back-propagates into every leaf that requires a gradient (grad_output for non-scalars).")
      .def("detach", &Tensor::detach, "Same data, cut off from autograd.")
      // copies and conversions
      .def("clone", &Tensor::clone, release_gil())
      .def(
          "contiguous",
          [](const Tensor& x) {
            if (x.is_contiguous()) return x;
            // A copy that autograd records (its gradient passes through): Tensor::contiguous is the raw
            // copy operations use on their inputs, which would cut a view off its graph here.
            return record_op(x.contiguous(), {x}, "contiguous",
                             [](const Tensor& g) { return std::vector<Tensor>{g}; });
          },
          release_gil(), "The same values laid out densely (itself when already so); recorded by autograd.")
      .def(
          "to",
          [](const Tensor& x, nb::handle target) {
            if (nb::isinstance<DType>(target)) {
              DType dt = nb::cast<DType>(target);
              nb::gil_scoped_release unlocked;
              return x.to(dt);
            }
            Device d = to_device(target);
            nb::gil_scoped_release unlocked;
            return x.to(d);
          },
          nb::arg("target"), "A copy on another device (Device or name) or of another DType; itself when already so.")
      .def("as_type", [](const Tensor& x, DType dt) { return x.to(dt); }, nb::arg("dtype"), release_gil(),
           "A copy converted to dtype (the tensor itself when already of it).")
      .def(
          "to_type",
          [](nb::handle_t<Tensor> self, DType dt) {
            Tensor& x = nb::cast<Tensor&>(self);
            {
              nb::gil_scoped_release unlocked;
              Tensor converted = x.to(dt);
              x = converted;
            }
            return nb::borrow(self);
          },
          nb::arg("dtype"), "Converts this handle's data to dtype, in place (other handles keep the old values).")
      .def(
          "to_device",
          [](Tensor& x, nb::handle device) {
            Device d = to_device(device);
            nb::gil_scoped_release unlocked;
            Tensor moved = x.to(d);
            x = moved;
          },
          nb::arg("device"), "Moves this handle's data to the device (other handles keep the old copy).")
      .def("copy_", [](nb::handle_t<Tensor> self, const Tensor& src) { return assign(self, src); }, nb::arg("src"),
           "Copies src's values (same element count; any device and type) into this tensor.")
      .def("copy_data", [](nb::handle_t<Tensor> self, const Tensor& t) { return assign(self, t); }, nb::arg("t"),
           "Copies the values of t (same element count) into this tensor.")
      .def(
          "set_value",
          [](nb::handle_t<Tensor> self, double v) {
            nb::cast<Tensor&>(self).fill_(v);
            return nb::borrow(self);
          },
          nb::arg("value"), "Sets every element to value.")
      .def("fill_", [](nb::handle_t<Tensor> self, double v) {
        nb::cast<Tensor&>(self).fill_(v);
        return nb::borrow(self);
      })
      .def("zero_", [](nb::handle_t<Tensor> self) {
        nb::cast<Tensor&>(self).zero_();
        return nb::borrow(self);
      })
      .def(
          "gaussian",
          [](nb::handle_t<Tensor> self, double mean, double std) {
            Tensor& x = nb::cast<Tensor&>(self);
            auto dev = device_object(x.device());
            return assign(self, Tensor::normal(x.shape(), mean, std, dev->generator, x.dtype(), x.device()));
          },
          nb::arg("mean"), nb::arg("std"), "Fills with N(mean, std^2) values from the device's generator.")
      .def(
          "uniform",
          [](nb::handle_t<Tensor> self, double lo, double hi) {
            Tensor& x = nb::cast<Tensor&>(self);
            auto dev = device_object(x.device());
            return assign(self, Tensor::uniform(x.shape(), lo, hi, dev->generator, x.dtype(), x.device()));
          },
          nb::arg("low"), nb::arg("high"), "Fills with U[low, high) values from the device's generator.")
      .def("item", [](const Tensor& x) { return x.item<double>(); }, release_gil(),
           "The single element, as a float (waits for the device).")
      .def("__float__", [](const Tensor& x) { return x.item<double>(); }, release_gil())
      // views
      .def("reshape", [](const Tensor& x, const std::vector<int64_t>& s) { return reshape(x, s); }, nb::arg("shape"),
           release_gil(), "Same elements in another shape (recorded by autograd).")
      .def("view", &Tensor::view, nb::arg("shape"))
      .def("transpose", &Tensor::transpose, nb::arg("dim0"), nb::arg("dim1"))
      .def("narrow", &Tensor::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"))
      .def("shares_storage", &Tensor::shares_storage, nb::arg("other"))
      // arithmetic (recorded by autograd); in-place forms overwrite values without recording
      .def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); }, release_gil())
      .def("__add__", [](const Tensor& a, double s) { return add_scalar(a, s); }, release_gil())
      .def("__radd__", [](const Tensor& a, double s) { return add_scalar(a, s); }, release_gil())
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, release_gil())
      .def("__sub__", [](const Tensor& a, double s) { return add_scalar(a, -s); }, release_gil())
      .def("__rsub__", [](const Tensor& a, double s) { return add_scalar(scale(a, -1.0), s); }, release_gil())
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, release_gil())
      .def("__mul__", [](const Tensor& a, double s) { return scale(a, s); }, release_gil())
      .def("__rmul__", [](const Tensor& a, double s) { return scale(a, s); }, release_gil())
      .def("__truediv__", [](const Tensor& a, const Tensor& b) { return div(a, b); }, release_gil())
      .def("__truediv__", [](const Tensor& a, double s) { return scale(a, 1.0 / s); }, release_gil())
      .def("__rtruediv__", [](const Tensor& a, double s) { return div(Tensor::full({}, s, a.dtype(), a.device()), a); },
           release_gil())
      .def("__neg__", [](const Tensor& a) { return scale(a, -1.0); }, release_gil())
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, release_gil())
      .def("__iadd__", [](nb::handle_t<Tensor> h, const Tensor& b) {
        const Tensor& a = nb::cast<const Tensor&>(h);
        return assign(h, add(a.detach(), b.detach()));
      })
      .def("__iadd__", [](nb::handle_t<Tensor> h, double s) {
        return assign(h, add_scalar(nb::cast<const Tensor&>(h).detach(), s));
      })
      .def("__isub__", [](nb::handle_t<Tensor> h, const Tensor& b) {
        const Tensor& a = nb::cast<const Tensor&>(h);
        return assign(h, sub(a.detach(), b.detach()));
      })
      .def("__isub__", [](nb::handle_t<Tensor> h, double s) {
        return assign(h, add_scalar(nb::cast<const Tensor&>(h).detach(), -s));
      })
      .def("__imul__", [](nb::handle_t<Tensor> h, const Tensor& b) {
        const Tensor& a = nb::cast<const Tensor&>(h);
        return assign(h, mul(a.detach(), b.detach()));
      })
      .def("__imul__", [](nb::handle_t<Tensor> h, double s) {
        return assign(h, scale(nb::cast<const Tensor&>(h).detach(), s));
      })
      .def("__itruediv__", [](nb::handle_t<Tensor> h, double s) {
        return assign(h, scale(nb::cast<const Tensor&>(h).detach(), 1.0 / s));
      });

  m.def("_tensor_serial", &tensor_serial_now, "The creation number the next tensor will take (see Tensor._serial).");
  m.def(
      "full", [](const std::vector<int64_t>& shape, double v, nb::handle device, DType dtype) {
        Device d = to_device(device);
        nb::gil_scoped_release unlocked;
        return Tensor::full(shape, v, dtype, d);
      },
      nb::arg("shape"), nb::arg("value"), nb::arg("device").none() = nb::none(), nb::arg("dtype") = DType::f32);
  m.def(
      "random", [](const std::vector<int64_t>& shape, bool normal, double a, double b, Generator& gen,
                   nb::handle device, DType dtype) {
        Device d = to_device(device);
        nb::gil_scoped_release unlocked;
        return normal ? Tensor::normal(shape, a, b, gen, dtype, d) : Tensor::uniform(shape, a, b, gen, dtype, d);
      },
      nb::arg("shape"), nb::arg("normal"), nb::arg("a"), nb::arg("b"), nb::arg("generator"),
      nb::arg("device").none() = nb::none(), nb::arg("dtype") = DType::f32,
      "N(a, b^2) values when normal, else U[a, b), from the generator.");
  bind_array(m, t);
}

}  // namespace tandem::py
