// The tokenizer.json reader (tandem::data::Tokenizer) for Python: tandem.tokenizer wraps it.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>
#include <vector>

#include "binding.h"
#include "tandem/data/tokenizer.h"

namespace tandem::py {

namespace {

// The bytes of a str (UTF-8) or of a bytes-like object, as they are.
std::string text_bytes(nb::handle text) {
  if (nb::isinstance<nb::str>(text)) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
    if (!p) throw nb::python_error();  // a str with lone surrogates has no UTF-8
    return std::string(p, static_cast<size_t>(n));
  }
  if (nb::isinstance<nb::bytes>(text)) {
    const nb::bytes b = nb::borrow<nb::bytes>(text);
    return std::string(b.c_str(), b.size());
  }
  if (PyByteArray_Check(text.ptr()))
    return std::string(PyByteArray_AsString(text.ptr()), static_cast<size_t>(PyByteArray_Size(text.ptr())));
  PyErr_Format(PyExc_TypeError, "expected str or bytes, got %s", Py_TYPE(text.ptr())->tp_name);
  throw nb::python_error();
}

}  // namespace

void bind_tokenizer(nb::module_& m) {
  using data::Tokenizer;
  nb::class_<Tokenizer>(m, "Tokenizer", "A byte-level BPE tokenizer read from Hugging Face's tokenizer.json.")
      .def_static(
          "from_file",
          [](const std::string& path) {
            nb::gil_scoped_release unlocked;
            return Tokenizer::from_file(path);
          },
          nb::arg("path"))
      .def_static("from_str", [](const std::string& json) { return Tokenizer::from_json(json, "<string>"); },
                  nb::arg("json"))
      .def(
          "encode",
          [](const Tokenizer& t, nb::handle text) {
            const std::string s = text_bytes(text);
            nb::gil_scoped_release unlocked;
            return t.encode(s);
          },
          nb::arg("text"))
      .def(
          "encode_batch",
          [](const Tokenizer& t, nb::handle texts, int threads) {
            std::vector<std::string> owned;
            for (nb::handle h : texts) owned.push_back(text_bytes(h));
            std::vector<std::string_view> views(owned.begin(), owned.end());
            nb::gil_scoped_release unlocked;
            return t.encode_batch(views, threads);
          },
          nb::arg("texts"), nb::arg("threads") = 0)
      .def("decode", &Tokenizer::decode, nb::arg("ids"), nb::arg("skip_special_tokens") = false)
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<uint32_t>& ids, bool skip) {
            const std::string b = t.decode_bytes(ids, skip);
            return nb::bytes(b.data(), b.size());
          },
          nb::arg("ids"), nb::arg("skip_special_tokens") = false)
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, nb::arg("token"))
      .def("id_to_token", &Tokenizer::id_to_token, nb::arg("id"))
      .def("is_special", &Tokenizer::is_special, nb::arg("id"))
      .def_prop_ro("document_token", &Tokenizer::document_token)
      .def_prop_ro("path", &Tokenizer::path)
      .def("__repr__", [](const Tokenizer& t) { return "Tokenizer('" + t.path() + "': " + t.describe() + ")"; });
}

}  // namespace tandem::py
