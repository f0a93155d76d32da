// The extension `sparse_mla._native` (docs/python.md): the library's devices,
// streams, operations and index groups with the reference's Python
// signatures, tensors through DLPack. The package `sparse_mla`
// (python/sparse_mla) re-exports it and adds the torch ops and the
// reference-named functions, in Python.
//
// Errors: every sparse_mla::Error (a rejected argument names the call, the
// argument and the values, and nothing was written) becomes a ValueError
// carrying the library's message, or a TypeError for a dtype mismatch (the
// form TensorCheck::dtype writes: "<name> has dtype I16, expected I32").
#include <pybind11/pybind11.h>

#include <cstring>

#include "dlpack.hpp"
#include "groups.hpp"
#include "operations.hpp"
#include "streams.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla::python {
namespace {

bool is_dtype_mismatch(const char* message) {
  const char* at = std::strstr(message, " has dtype ");
  return at != nullptr && std::strstr(at, ", expected ") != nullptr;
}

}  // namespace
}  // namespace sparse_mla::python

PYBIND11_MODULE(_native, m) {
  namespace sp = sparse_mla::python;
  m.doc() = "sparse-mla: DeepSeek-V3.2 sparse MLA attention bookkeeping (index groups, top-k conversion, FP8 "
            "gather-upconvert, HiSparse) on host, CUDA and HIP devices. Tensors through DLPack.";
  m.attr("__version__") = "0.1.0";
  pybind11::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const sparse_mla::Error& e) {
      PyErr_SetString(sp::is_dtype_mismatch(e.what()) ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });
  sp::register_dlpack(m);
  sp::register_streams(m);
  sp::register_operations(m);
  sp::register_groups(m);
  // Devices go before the library's own exit handlers finalise Kokkos.
  pybind11::module_::import("atexit").attr("register")(pybind11::cpp_function(&sp::release_device_handles));
}
