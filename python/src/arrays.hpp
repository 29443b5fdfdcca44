#pragma once
/// @file
/// The caller's arrays (NumPy arrays through the buffer protocol, torch
/// tensors through DLPack) seen as the library's matrix views, without
/// copies: row-major with a row stride, or the transpose of one (a `w.T`
/// reaches the op as a transposed operand). What goes wrong here is this
/// rank's alone, so it is thrown as a problem (ValueError) or a type_problem
/// (TypeError) for the call to agree on before any rank starts.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "overlap/core/bfloat16.hpp"
#include "overlap/core/dtype.hpp"
#include "overlap/core/matrix.hpp"

namespace overlap::python {

namespace py = pybind11;

/// A wrong type of argument on this rank: a logic_error, so that the
/// agreement (failure::kind::logic_error) carries its kind to every rank,
/// where it is raised as TypeError.
struct type_problem : std::logic_error {
  using std::logic_error::logic_error;
};

// DLPack's ABI (dlpack.h, versions 0.5 to 0.8: what torch 1.x exports as a
// "dltensor" capsule), declared here so the module needs no torch headers.
struct dl_device {
  int32_t device_type;  // 1: CPU
  int32_t device_id;
};
struct dl_data_type {
  uint8_t code;  // 2: float, 4: bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct dl_tensor {
  void* data;
  dl_device device;
  int32_t ndim;
  dl_data_type dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct dl_managed_tensor {
  dl_tensor tensor;
  void* manager_ctx;
  void (*deleter)(dl_managed_tensor*);
};

/// Which library an array comes from; outputs the module allocates are of
/// the same kind as the call's first operand.
enum class array_kind { numpy, torch };

/// One of the caller's arrays, 1-D or 2-D, with what keeps it alive while an
/// op reads or writes it.
struct array {
  py::object owner;                  ///< the caller's object
  std::shared_ptr<void> export_ref;  ///< DLPack: released (its deleter run) with the last copy
  array_kind kind = array_kind::numpy;
  dtype type = dtype::f32;
  void* data = nullptr;
  int ndim = 2;
  int64_t rows = 0, cols = 1;  ///< logical shape (a 1-D array: rows elements)
  int64_t s0 = 0, s1 = 1;      ///< strides in elements
  bool writable = true;
};

/// The array `obj` (named `name` in messages).
inline array as_array(py::handle obj, const std::string& name) {
  array a;
  a.owner = py::reinterpret_borrow<py::object>(obj);
  if (py::isinstance<py::array>(obj)) {
    auto arr = py::reinterpret_borrow<py::array>(obj);
    const py::dtype dt = arr.dtype();
    if (!dt.attr("isnative").cast<bool>() || dt.kind() != 'f' || (dt.itemsize() != 4 && dt.itemsize() != 8))
      throw type_problem(name + " has dtype " + py::repr(static_cast<const py::object&>(dt)).cast<std::string>() +
                         "; NumPy arrays must be float32 or float64 (bfloat16: torch tensors)");
    a.type = dt.itemsize() == 4 ? dtype::f32 : dtype::f64;
    a.ndim = static_cast<int>(arr.ndim());
    if (a.ndim < 1 || a.ndim > 2)
      throw std::invalid_argument(name + " must be 2-D (it has " + std::to_string(a.ndim) + " dimensions)");
    a.rows = arr.shape(0), a.s0 = arr.strides(0) / dt.itemsize();
    if (a.ndim == 2) a.cols = arr.shape(1), a.s1 = arr.strides(1) / dt.itemsize();
    for (int d = 0; d < a.ndim; ++d)
      if (arr.strides(d) % dt.itemsize() != 0)
        throw std::invalid_argument(name + "'s strides are not whole elements: pass a copy (numpy.ascontiguousarray)");
    a.data = const_cast<void*>(arr.data());  // read-only arrays are refused where the op writes
    a.writable = arr.writeable();
    return a;
  }
  if (!py::hasattr(obj, "__dlpack__") || !py::hasattr(obj, "device"))
    throw type_problem(name + " is a " + py::str(py::type::of(obj).attr("__name__")).cast<std::string>() +
                       "; expected a NumPy array or a torch tensor");
  a.kind = array_kind::torch;
  if (py::str(obj.attr("device").attr("type")).cast<std::string>() != "cpu")
    throw type_problem(name + " is on " + py::str(obj.attr("device")).cast<std::string>() +
                       "; overlap computes on CPUs: pass CPU tensors");
  // A tensor that requires grad refuses to export itself; its data is the same.
  py::object plain = py::hasattr(obj, "detach") ? obj.attr("detach")() : py::reinterpret_borrow<py::object>(obj);
  py::capsule cap = plain.attr("__dlpack__")();
  auto* m = static_cast<dl_managed_tensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (m == nullptr) throw py::error_already_set();
  // Consumed: the capsule must not run the deleter too (DLPack's protocol).
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  a.export_ref = std::shared_ptr<void>(m, [](void* p) {
    auto* t = static_cast<dl_managed_tensor*>(p);
    if (t->deleter != nullptr) t->deleter(t);
  });
  const dl_tensor& t = m->tensor;
  const dl_data_type d = t.dtype;
  if (d.lanes == 1 && d.code == 2 && d.bits == 32)
    a.type = dtype::f32;
  else if (d.lanes == 1 && d.code == 2 && d.bits == 64)
    a.type = dtype::f64;
  else if (d.lanes == 1 && d.code == 4 && d.bits == 16)
    a.type = dtype::bf16;
  else
    throw type_problem(name + " has dtype " + py::str(obj.attr("dtype")).cast<std::string>() +
                       "; tensors must be float32, float64 or bfloat16");
  a.ndim = t.ndim;
  if (a.ndim < 1 || a.ndim > 2)
    throw std::invalid_argument(name + " must be 2-D (it has " + std::to_string(a.ndim) + " dimensions)");
  a.rows = t.shape[0];
  if (a.ndim == 2) a.cols = t.shape[1];
  a.s0 = t.strides != nullptr ? t.strides[0] : (a.ndim == 2 ? a.cols : 1);
  a.s1 = t.strides != nullptr && a.ndim == 2 ? t.strides[1] : 1;
  a.data = static_cast<char*>(t.data) + t.byte_offset;
  return a;
}

/// How a 2-D array can reach the library: row-major with a row stride,
/// the transpose of such a matrix, or either (an empty array, or one row or
/// column, whose strides say nothing). The ranks agree on one orientation
/// per operand (the prelude), since the op's transposes must agree.
enum class orientation : int64_t { rows = 0, transposed = 1, either = 2 };

/// `a`'s orientation; std::invalid_argument when it has none (or when it
/// must be row-major, `may_transpose` false, and is not).
inline orientation orientation_of(const array& a, const std::string& name, bool may_transpose) {
  if (a.ndim != 2) throw std::invalid_argument(name + " must be 2-D (it has 1 dimension)");
  const int64_t r = a.rows, c = a.cols;
  const bool empty = r == 0 || c == 0;
  const bool as_rows = empty || ((c <= 1 || a.s1 == 1) && (r <= 1 || a.s0 >= c));
  const bool as_cols = may_transpose && (empty || ((r <= 1 || a.s0 == 1) && (c <= 1 || a.s1 >= r)));
  if (as_rows && as_cols) return orientation::either;
  if (as_rows || as_cols) return as_rows ? orientation::rows : orientation::transposed;
  throw std::invalid_argument(
      name + " (" + std::to_string(r) + " x " + std::to_string(c) + ", strides " + std::to_string(a.s0) + ", " +
      std::to_string(a.s1) + " elements) must be row-major " +
      (may_transpose ? "with a row stride, or the transpose of such an array" : "with a row stride") +
      ": pass a contiguous copy");
}

/// A 2-D array as the library sees it: the stored matrix and whether the
/// array is its transpose.
template <class T>
struct matrix_arg {
  matrix_view<T> view;
  bool transposed = false;
};

/// `a` as a matrix of T, read transposed or not as the ranks agreed (its
/// orientation allows it: orientation_of).
template <class T>
matrix_arg<T> matrix_of(const array& a, bool transposed) {
  auto* data = static_cast<T*>(a.data);
  const int64_t r = a.rows, c = a.cols;
  if (!transposed) return {{data, r, c, r <= 1 ? std::max<int64_t>(c, 1) : std::max(a.s0, c)}};
  return {{data, c, r, c <= 1 ? std::max<int64_t>(r, 1) : std::max(a.s1, r)}, true};
}

/// The element type T of dtype t, as a tag for a generic lambda.
template <class F>
decltype(auto) with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::bf16: break;
  }
  return f(bfloat16{});
}

/// A new rows x cols array of `like`'s kind and dtype (row-major, uninitialised).
inline array allocate_like(const array& like, int64_t rows, int64_t cols, const std::string& name) {
  py::object obj;
  const py::tuple shape = py::make_tuple(rows, cols);
  if (like.kind == array_kind::numpy)
    obj = py::module_::import("numpy").attr("empty")(shape, like.type == dtype::f32 ? "float32" : "float64");
  else
    obj = py::module_::import("torch").attr("empty")(shape, py::arg("dtype") = like.owner.attr("dtype"));
  return as_array(obj, name);
}

}  // namespace overlap::python
