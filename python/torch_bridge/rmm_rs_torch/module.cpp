// rmm_rs_torch._shim: the Python module around the pluggable-allocator functions (shim.cpp).
// It connects them to rmm-rs (set_functions) and calls them as PyTorch does, with no GPU
// needed (allocate, deallocate), for tests and checks.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <c10/util/Exception.h>

#include <exception>

#include "shim.h"

namespace {

/// Raises `name` from the torch module (torch.OutOfMemoryError), else `fallback`.
void raise_torch(const char* name, PyObject* fallback, const char* message) {
  PyObject* torch = PyImport_ImportModule("torch");
  PyObject* type = torch != nullptr ? PyObject_GetAttrString(torch, name) : nullptr;
  Py_XDECREF(torch);
  PyErr_Clear();
  PyErr_SetString(type != nullptr ? type : fallback, message);
  Py_XDECREF(type);
}

PyObject* set_functions(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"alloc", "free", nullptr};
  PyObject* alloc_obj = nullptr;
  PyObject* free_obj = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!:set_functions",
                                   const_cast<char**>(keywords), &PyLong_Type, &alloc_obj,
                                   &PyLong_Type, &free_obj)) {
    return nullptr;
  }
  void* alloc = PyLong_AsVoidPtr(alloc_obj);
  void* free = PyLong_AsVoidPtr(free_obj);
  if (PyErr_Occurred() != nullptr) {
    return nullptr;
  }
  if (alloc == nullptr || free == nullptr) {
    PyErr_Format(PyExc_ValueError,
                 "set_functions(alloc=%p, free=%p): both are addresses of rmm-rs's C "
                 "functions, never 0 (importing rmm_rs_torch passes them)",
                 alloc, free);
    return nullptr;
  }
  rmm_rs_torch_set_functions(reinterpret_cast<rmm_rs_torch_alloc_fn>(alloc),
                             reinterpret_cast<rmm_rs_torch_free_fn>(free));
  Py_RETURN_NONE;
}

PyObject* allocate(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"size", "device", "stream", nullptr};
  Py_ssize_t size = 0;
  int device = 0;
  PyObject* stream_obj = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|iO!:allocate", const_cast<char**>(keywords),
                                   &size, &device, &PyLong_Type, &stream_obj)) {
    return nullptr;
  }
  void* stream = stream_obj != nullptr ? PyLong_AsVoidPtr(stream_obj) : nullptr;
  if (PyErr_Occurred() != nullptr) {
    return nullptr;
  }
  void* ptr = nullptr;
  try {
    ptr = rmm_rs_torch_malloc(size, device, stream);
  } catch (const c10::OutOfMemoryError& e) {
    raise_torch("OutOfMemoryError", PyExc_MemoryError, e.what_without_backtrace());
    return nullptr;
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return PyLong_FromVoidPtr(ptr);
}

PyObject* deallocate(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"ptr", "size", "device", "stream", nullptr};
  PyObject* ptr_obj = nullptr;
  Py_ssize_t size = 0;
  int device = 0;
  PyObject* stream_obj = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!n|iO!:deallocate",
                                   const_cast<char**>(keywords), &PyLong_Type, &ptr_obj, &size,
                                   &device, &PyLong_Type, &stream_obj)) {
    return nullptr;
  }
  void* ptr = PyLong_AsVoidPtr(ptr_obj);
  void* stream = stream_obj != nullptr ? PyLong_AsVoidPtr(stream_obj) : nullptr;
  if (PyErr_Occurred() != nullptr) {
    return nullptr;
  }
  rmm_rs_torch_free(ptr, size, device, stream);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"set_functions", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_functions)),
     METH_VARARGS | METH_KEYWORDS,
     "set_functions(alloc, free)\n--\n\nConnects the shim to rmm-rs: the addresses of its C "
     "functions rmm_rs_torch_alloc and rmm_rs_torch_free."},
    {"allocate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(allocate)),
     METH_VARARGS | METH_KEYWORDS,
     "allocate(size, device=0, stream=0)\n--\n\nCalls rmm_rs_torch_malloc as PyTorch does: "
     "the address (0 for size 0), or torch.OutOfMemoryError when rmm-rs has no memory."},
    {"deallocate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(deallocate)),
     METH_VARARGS | METH_KEYWORDS,
     "deallocate(ptr, size, device=0, stream=0)\n--\n\nCalls rmm_rs_torch_free as PyTorch "
     "does."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "rmm_rs_torch._shim",
    "PyTorch's pluggable-allocator functions over rmm-rs (rmm_rs_torch_malloc, "
    "rmm_rs_torch_free), which raise torch.OutOfMemoryError where rmm-rs is out of memory.",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__shim() {
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) {
    return nullptr;
  }
  if (PyModule_AddStringConstant(m, "MALLOC", "rmm_rs_torch_malloc") < 0 ||
      PyModule_AddStringConstant(m, "FREE", "rmm_rs_torch_free") < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
