/* What the functions' C fast path (npuops._fastpath) asks of a tensor, read from torch's C++ objects
 * instead of through Python attributes: a call's key, its contiguity and address, a new output.
 * Built at run time against the torch installed (npuops.native: its headers are its ABI), loaded
 * where it builds; _fastpath.accelerate() takes the table below from the capsule "api".
 *
 * Why: through Python, a pool call's tensor key (torch.Size, dtype and device objects, a tuple of
 * them, their hashes) and its output (torch.empty_like's argument parsing) took about half of the
 * ~3.4 us its fast path cost in all, on a CPU host, where torch's own avg_pool2d took less. */
#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>

#include "_torch_fast.h"

namespace {

/* Each entry point turns a C++ exception (a sparse tensor's strides, an allocation that fails) into
 * the Python exception torch raises for it (HANDLE_TH_ERRORS): none may cross into C. */

/* c10's, which ATen aliases in headers that not every torch release includes here (2.11 does not). */
int grad_enabled(void) { return c10::GradMode::is_enabled(); }

/* The key of a plain tensor (the caller checked its type): bytes of its dims, sizes (and strides,
 * by_layout), layout, dtype and device, compared and hashed as bytes. */
PyObject *tensor_key(PyObject *tensor, int by_layout) {
    HANDLE_TH_ERRORS
    const at::Tensor &t = THPVariable_Unpack(tensor);
    c10::SmallVector<int64_t, 24> key;
    key.push_back(t.dim());
    key.append(t.sizes().begin(), t.sizes().end());
    if (by_layout) key.append(t.strides().begin(), t.strides().end());
    key.push_back(static_cast<int64_t>(t.layout()));  /* a sparse tensor is not a strided one of its shape */
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back(t.device().index());
    return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(key.data()), key.size() * sizeof(int64_t));
    END_HANDLE_TH_ERRORS
}

int requires_grad(PyObject *tensor) {
    HANDLE_TH_ERRORS
    return THPVariable_Unpack(tensor).requires_grad();
    END_HANDLE_TH_ERRORS_RET(-1)
}

/* 1 with the address of a contiguous tensor's data, 0 for another layout. */
int contiguous_address(PyObject *tensor, int64_t *address) {
    HANDLE_TH_ERRORS
    const at::Tensor &t = THPVariable_Unpack(tensor);
    if (!t.is_contiguous()) return 0;
    *address = reinterpret_cast<int64_t>(t.data_ptr());
    return 1;
    END_HANDLE_TH_ERRORS_RET(-1)
}

/* A new contiguous tensor of like's sizes, dtype and device (like: a plain tensor). */
PyObject *empty_like(PyObject *like, int64_t *address) {
    HANDLE_TH_ERRORS
    const at::Tensor &t = THPVariable_Unpack(like);
    at::Tensor made = at::empty(t.sizes(), t.options());
    *address = reinterpret_cast<int64_t>(made.data_ptr());
    return THPVariable_Wrap(std::move(made));
    END_HANDLE_TH_ERRORS
}

const NpuopsTorchFast api = {NPUOPS_TORCH_FAST_VERSION, grad_enabled, tensor_key, requires_grad, contiguous_address, empty_like};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast", NULL, -1, NULL};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(const_cast<NpuopsTorchFast *>(&api), NPUOPS_TORCH_FAST_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "api", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
