/* The functions' eager fast path in C (see npuops.functional): a call of a signature seen before,
 * from its arguments to the kernel's launch, without running Python bytecode.
 *
 * signature(args, kwargs, by_layout) is the key drop_in files a call under; call(fast_calls, args,
 * kwargs, by_layout) looks the key up and runs what it finds: a Launch (below) in C, any other
 * callable with the call's values. The Python code in npuops.functional does the same where this
 * module was not built; tests hold the two to the same keys.
 *
 * A Launch calls a kernel's host entry point (TileLang's `call`: the tensors' addresses, the
 * launch sizes, the stream) through a function pointer with every argument passed as a 64-bit
 * integer: on the x86-64 and AArch64 Linux ABIs, pointer and 32- or 64-bit integer arguments
 * take the same registers and 8-byte stack slots, so that call is the one ctypes would make.
 *
 * Tensors are read through Python's attributes (shape, dtype, device, is_contiguous(), data_ptr(),
 * empty_like()) until accelerate() gives the table of npuops._torch_fast, which reads them from
 * torch's C++ objects (see npuops.native). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "_torch_fast.h"

#if !defined(__linux__) || !(defined(__x86_64__) || defined(__aarch64__))
#error "npuops._fastpath calls kernel entry points by the x86-64 / AArch64 Linux calling convention"
#endif

#define MAX_ARGS 24
#define VECTOR_BYTES 16

/* Set once by configure(): the plain tensor types, torch's functions, the front calls' recorder, the
 * missing-call marker. */
static PyObject *plain_types, *is_grad_enabled, *empty_like, *empty, *front_calls, *MISS;
/* Set by accelerate(): torch's C++ objects read directly (npuops._torch_fast), where it was built. */
static const NpuopsTorchFast *fast_api;
static PyObject *s_shape, *s_dtype, *s_device, *s_stride, *s_requires_grad, *s_is_contiguous, *s_data_ptr,
    *s_recorder, *s_launch, *s_expand, *dtype_device;

static int is_plain(PyObject *value) {
    PyTypeObject *type = Py_TYPE(value);
    Py_ssize_t n = PyTuple_GET_SIZE(plain_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)type == PyTuple_GET_ITEM(plain_types, i)) return 1;
    return 0;
}

/* The values of a call: its positional arguments, then its keyword arguments' values. */
static PyObject *call_values(PyObject *args, PyObject *kwargs) {
    if (kwargs == NULL || kwargs == Py_None || PyDict_GET_SIZE(kwargs) == 0) return Py_NewRef(args);
    Py_ssize_t n = PyTuple_GET_SIZE(args), pos = 0, i = 0;
    PyObject *values = PyTuple_New(n + PyDict_GET_SIZE(kwargs)), *key, *value;
    if (values == NULL) return NULL;
    for (; i < n; i++) PyTuple_SET_ITEM(values, i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    while (PyDict_Next(kwargs, &pos, &key, &value)) PyTuple_SET_ITEM(values, i++, Py_NewRef(value));
    return values;
}

static PyObject *tensor_key(PyObject *tensor, int by_layout) {
    if (fast_api) return fast_api->tensor_key(tensor, by_layout);
    PyObject *shape = PyObject_GetAttr(tensor, s_shape), *dtype = NULL, *device = NULL, *stride = NULL,
             *key = NULL;
    if (shape == NULL || (dtype = PyObject_GetAttr(tensor, s_dtype)) == NULL ||
        (device = PyObject_GetAttr(tensor, s_device)) == NULL)
        goto done;
    if (by_layout) {
        if ((stride = PyObject_CallMethodNoArgs(tensor, s_stride)) == NULL) goto done;
        key = PyTuple_Pack(4, shape, dtype, device, stride);
    } else {
        key = PyTuple_Pack(3, shape, dtype, device);
    }
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    Py_XDECREF(stride);
    return key;
}

/* A tuple of ints: itself (no other value's key is a tuple of ints only). Another tuple, (value,
 * tuple of its items' types): a tuple holding a bool or a float is not one of ints. A list, (list,
 * its items as a tuple, their types): hashable, and not the tuple of the same items. */
static PyObject *sequence_key(PyObject *value) {
    PyObject *items = PySequence_Tuple(value);
    if (items == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (PyTuple_CheckExact(value)) {
        Py_ssize_t i = 0;
        while (i < n && PyLong_CheckExact(PyTuple_GET_ITEM(items, i))) i++;
        if (i == n) return items;
    }
    PyObject *types = PyTuple_New(n), *key = NULL;
    if (types != NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(types, i, Py_NewRef((PyObject *)Py_TYPE(PyTuple_GET_ITEM(items, i))));
        key = PyList_CheckExact(value) ? PyTuple_Pack(3, (PyObject *)&PyList_Type, items, types)
                                       : PyTuple_Pack(2, value, types);
        Py_DECREF(types);
    }
    Py_DECREF(items);
    return key;
}

static int grad_enabled(void) {
    if (fast_api) return fast_api->grad_enabled();
    PyObject *flag = PyObject_CallNoArgs(is_grad_enabled);
    if (flag == NULL) return -1;
    int grad = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return grad;
}

static int requires_grad(PyObject *tensor) {
    if (fast_api) return fast_api->requires_grad(tensor);
    PyObject *requires = PyObject_GetAttr(tensor, s_requires_grad);
    if (requires == NULL) return -1;
    int needs = PyObject_IsTrue(requires);
    Py_DECREF(requires);
    return needs;
}

/* The key of a call with these values (Py_None: a tensor that needs a gradient; NULL: an error). */
static PyObject *make_signature(PyObject *values, PyObject *kwargs, int by_layout) {
    int grad = grad_enabled();
    if (grad < 0) return NULL;
    int named = kwargs != NULL && kwargs != Py_None && PyDict_GET_SIZE(kwargs) > 0;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    PyObject *key = PyTuple_New(n + named);
    if (key == NULL) return NULL;
    if (named) {
        PyObject *names = PySequence_Tuple(kwargs);
        if (names == NULL) goto fail;
        PyTuple_SET_ITEM(key, 0, names);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i), *item;
        if (is_plain(value)) {
            if (grad) {
                int needs = requires_grad(value);
                if (needs < 0) goto fail;
                if (needs) {
                    Py_DECREF(key);
                    Py_RETURN_NONE;
                }
            }
            item = tensor_key(value, by_layout);
        } else if (PyTuple_CheckExact(value) || PyList_CheckExact(value)) {
            item = sequence_key(value);
        } else {
            item = PyTuple_Pack(2, (PyObject *)Py_TYPE(value), value);
        }
        if (item == NULL) goto fail;
        PyTuple_SET_ITEM(key, i + named, item);
    }
    return key;
fail:
    Py_DECREF(key);
    return NULL;
}

/* -- Launch ------------------------------------------------------------------------------------ */
enum { FROM_INPUT, LIKE_INPUT, NEW_TENSOR };

typedef struct {
    int kind, input;       /* FROM_INPUT, LIKE_INPUT: which of the call's tensors */
    PyObject *shape, *dtype; /* NEW_TENSOR */
    PyObject *prototype;   /* NEW_TENSOR, where it serves: see prototype_of */
} Slot;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;  /* the Python fast call: for whatever this one does not take */
    PyObject *plan, *launch; /* runs while plan.launch is launch (a failed launch replaces it) */
    PyObject *device, *device_index, *stream; /* stream(index): the device's current stream */
    Py_ssize_t *positions, needed; int tensors; /* where the call's tensors are among its values */
    Slot *slots; int params;            /* the kernel's tensor parameters */
    int64_t sizes[MAX_ARGS]; int nsizes;
    int *result; int nresult, single;   /* which parameters the call returns, one or a tuple */
    intptr_t entry;
    long long launches;
} Launch;

typedef int64_t A;
#define ARGS1 A
#define ARGS2 ARGS1, A
#define ARGS3 ARGS2, A
#define ARGS4 ARGS3, A
#define ARGS5 ARGS4, A
#define ARGS6 ARGS5, A
#define ARGS7 ARGS6, A
#define ARGS8 ARGS7, A
#define ARGS9 ARGS8, A
#define ARGS10 ARGS9, A
#define ARGS11 ARGS10, A
#define ARGS12 ARGS11, A
#define ARGS13 ARGS12, A
#define ARGS14 ARGS13, A
#define ARGS15 ARGS14, A
#define ARGS16 ARGS15, A
#define ARGS17 ARGS16, A
#define ARGS18 ARGS17, A
#define ARGS19 ARGS18, A
#define ARGS20 ARGS19, A
#define ARGS21 ARGS20, A
#define ARGS22 ARGS21, A
#define ARGS23 ARGS22, A
#define ARGS24 ARGS23, A
#define V1 v[0]
#define V2 V1, v[1]
#define V3 V2, v[2]
#define V4 V3, v[3]
#define V5 V4, v[4]
#define V6 V5, v[5]
#define V7 V6, v[6]
#define V8 V7, v[7]
#define V9 V8, v[8]
#define V10 V9, v[9]
#define V11 V10, v[10]
#define V12 V11, v[11]
#define V13 V12, v[12]
#define V14 V13, v[13]
#define V15 V14, v[14]
#define V16 V15, v[15]
#define V17 V16, v[16]
#define V18 V17, v[17]
#define V19 V18, v[18]
#define V20 V19, v[19]
#define V21 V20, v[20]
#define V22 V21, v[21]
#define V23 V22, v[22]
#define V24 V23, v[23]
#define CALL(n) case n: return ((int (*)(ARGS##n))entry)(V##n);

static int call_entry(intptr_t entry, const int64_t *v, int n) {
    switch (n) {
        CALL(1) CALL(2) CALL(3) CALL(4) CALL(5) CALL(6) CALL(7) CALL(8) CALL(9) CALL(10) CALL(11) CALL(12)
        CALL(13) CALL(14) CALL(15) CALL(16) CALL(17) CALL(18) CALL(19) CALL(20) CALL(21) CALL(22) CALL(23)
        CALL(24)
    }
    return -1;
}

/* A Launch and its plan refer to each other (plan.natives): both are the collector's to free. */
static int Launch_traverse(Launch *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    Py_VISIT(self->plan);
    Py_VISIT(self->launch);
    Py_VISIT(self->device);
    Py_VISIT(self->stream);
    return 0;
}

static int Launch_clear(Launch *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->plan);
    Py_CLEAR(self->launch);
    Py_CLEAR(self->device);
    Py_CLEAR(self->device_index);
    Py_CLEAR(self->stream);
    return 0;
}

static void Launch_dealloc(Launch *self) {
    PyObject_GC_UnTrack(self);
    Launch_clear(self);
    if (self->slots)
        for (int i = 0; i < self->params; i++) {
            Py_XDECREF(self->slots[i].shape);
            Py_XDECREF(self->slots[i].dtype);
            Py_XDECREF(self->slots[i].prototype);
        }
    PyMem_Free(self->slots);
    PyMem_Free(self->positions);
    PyMem_Free(self->result);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int as_index(PyObject *value, int limit, const char *what) {
    long i = PyLong_AsLong(value);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0 || i >= limit) {
        PyErr_Format(PyExc_ValueError, "%s %ld is out of range 0..%d", what, i, limit - 1);
        return -1;
    }
    return (int)i;
}

static PyObject *native_field(PyObject *native, const char *name, PyTypeObject *type) {
    PyObject *value = PyObject_GetAttrString(native, name);
    if (value != NULL && type != NULL && !PyObject_TypeCheck(value, type)) {
        PyErr_Format(PyExc_TypeError, "NativeLaunch.%s must be a %s", name, type->tp_name);
        Py_CLEAR(value);
    }
    return value;
}

/* A one-element tensor of dtype on device, expanded to shape: empty_like() of it is a new contiguous
 * tensor of that shape, dtype and device, about 1 us faster a call than empty(shape, dtype=, device=)
 * (torch's parsing of keyword arguments). NULL, with no error, where there is none such (a shape of
 * no dims) or empty_like() would not give a contiguous tensor: the slot then takes empty(). */
static PyObject *prototype_of(PyObject *shape, PyObject *dtype, PyObject *device) {
    PyObject *one = Py_BuildValue("(i)", 1), *single = NULL, *prototype = NULL, *probe = NULL, *contiguous = NULL;
    if (one == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *kw[] = {one, dtype, device};
    if ((single = PyObject_Vectorcall(empty, kw, 1, dtype_device)) == NULL ||
        (prototype = PyObject_CallMethodOneArg(single, s_expand, shape)) == NULL ||
        (probe = PyObject_CallOneArg(empty_like, prototype)) == NULL ||
        (contiguous = PyObject_CallMethodNoArgs(probe, s_is_contiguous)) == NULL) {
        PyErr_Clear();
        Py_CLEAR(prototype);
    } else if (contiguous != Py_True)
        Py_CLEAR(prototype);
    Py_DECREF(one);
    Py_XDECREF(single);
    Py_XDECREF(probe);
    Py_XDECREF(contiguous);
    return prototype;
}

static int Launch_fill(Launch *self, PyObject *fallback, PyObject *plan, PyObject *launch, PyObject *positions,
                       PyObject *entry, PyObject *slots, PyObject *sizes, PyObject *result, int single,
                       PyObject *native) {
    self->tensors = (int)PyTuple_GET_SIZE(positions);
    self->params = (int)PyTuple_GET_SIZE(slots);
    self->nsizes = (int)PyTuple_GET_SIZE(sizes);
    self->nresult = (int)PyTuple_GET_SIZE(result);
    if (self->params + self->nsizes + 1 > MAX_ARGS || self->nresult < 1) {
        PyErr_Format(PyExc_ValueError, "a launch takes 1 to %d arguments and returns at least one tensor", MAX_ARGS);
        return -1;
    }
    self->entry = (intptr_t)PyLong_AsVoidPtr(entry);
    if (PyErr_Occurred()) return -1;
    self->fallback = Py_NewRef(fallback);
    self->plan = Py_NewRef(plan);
    self->launch = Py_NewRef(launch);
    self->single = single;
    if ((self->device = native_field(native, "device", NULL)) == NULL ||
        (self->stream = native_field(native, "stream", NULL)) == NULL)
        return -1;
    PyObject *index = PyObject_GetAttrString(self->device, "index");
    if (index == NULL) return -1;
    if (index == Py_None) {
        Py_DECREF(index);
        PyErr_SetString(PyExc_ValueError, "a launch needs a device with an index");
        return -1;
    }
    self->device_index = index;
    self->positions = PyMem_Calloc(self->tensors, sizeof(Py_ssize_t));
    self->slots = PyMem_Calloc(self->params, sizeof(Slot));
    self->result = PyMem_Calloc(self->nresult, sizeof(int));
    if (!self->positions || !self->slots || !self->result) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < self->tensors; i++) {
        self->positions[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
        if (self->positions[i] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a tensor position must be >= 0");
            return -1;
        }
        if (self->positions[i] >= self->needed) self->needed = self->positions[i] + 1;
    }
    for (int i = 0; i < self->params; i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        Slot *s = &self->slots[i];
        if (PyLong_Check(slot)) {
            s->kind = FROM_INPUT;
            if ((s->input = as_index(slot, self->tensors, "input")) < 0) return -1;
        } else if (PyTuple_Check(slot) && PyTuple_GET_SIZE(slot) == 2 && PyTuple_GET_ITEM(slot, 1) == Py_None) {
            s->kind = LIKE_INPUT;
            if ((s->input = as_index(PyTuple_GET_ITEM(slot, 0), self->tensors, "input")) < 0) return -1;
        } else if (PyTuple_Check(slot) && PyTuple_GET_SIZE(slot) == 2) {
            s->kind = NEW_TENSOR;
            s->shape = PySequence_Tuple(PyTuple_GET_ITEM(slot, 0));
            if (s->shape == NULL) return -1;
            s->dtype = Py_NewRef(PyTuple_GET_ITEM(slot, 1));
            s->prototype = prototype_of(s->shape, s->dtype, self->device);
        } else {
            PyErr_SetString(PyExc_ValueError, "a slot is an input index, (index, None) or (shape, dtype)");
            return -1;
        }
    }
    for (int i = 0; i < self->nsizes; i++) {
        self->sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) return -1;
    }
    for (int i = 0; i < self->nresult; i++)
        if ((self->result[i] = as_index(PyTuple_GET_ITEM(result, i), self->params, "result")) < 0) return -1;
    return 0;
}


/* Launch(fallback, plan, positions, native, result, single): ``native`` a NativeLaunch (npuops.kernels)
 * of plan.launch; slots per kernel tensor parameter: i (the call's tensor i), (i, None) (a new
 * one like it) or (shape, dtype) (a new one); result: the parameters returned. */
static int Launch_init(Launch *self, PyObject *args, PyObject *kwargs) {
    PyObject *fallback, *plan, *positions, *native, *result;
    int single;
    if (!PyArg_ParseTuple(args, "OOO!OO!p", &fallback, &plan, &PyTuple_Type, &positions, &native, &PyTuple_Type,
                          &result, &single))
        return -1;
    if (self->plan != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Launch is made once");
        return -1;
    }
    PyObject *entry = native_field(native, "entry", &PyLong_Type), *slots = native_field(native, "slots", &PyTuple_Type),
             *sizes = native_field(native, "sizes", &PyTuple_Type), *launch = PyObject_GetAttr(plan, s_launch);
    int ok = entry && slots && sizes && launch && Launch_fill(self, fallback, plan, launch, positions, entry, slots, sizes,
                                                               result, single, native) == 0;
    Py_XDECREF(entry);
    Py_XDECREF(slots);
    Py_XDECREF(sizes);
    Py_XDECREF(launch);
    return ok ? 0 : -1;
}
static int64_t address(PyObject *tensor) {
    PyObject *ptr = PyObject_CallMethodNoArgs(tensor, s_data_ptr);
    if (ptr == NULL) return -1;
    int64_t value = (int64_t)PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return value;
}

/* 1 with the address of a contiguous tensor's data, 0 for another layout, -1 on error. */
static int contiguous_address(PyObject *tensor, int64_t *at) {
    if (fast_api) return fast_api->contiguous_address(tensor, at);
    PyObject *contiguous = PyObject_CallMethodNoArgs(tensor, s_is_contiguous);
    if (contiguous == NULL) return -1;
    int ok = contiguous == Py_True;
    Py_DECREF(contiguous);
    if (ok && (*at = address(tensor)) == -1 && PyErr_Occurred()) return -1;
    return ok;
}

/* A new output for slot s (LIKE_INPUT, NEW_TENSOR) and its address (*at). */
static PyObject *new_tensor(Launch *self, Slot *s, PyObject **tensors, int64_t *at) {
    PyObject *like = s->kind == LIKE_INPUT ? tensors[s->input] : s->prototype, *made;
    if (fast_api && like) return fast_api->empty_like(like, at);
    if (like) {
        made = PyObject_CallOneArg(empty_like, like);
    } else {
        PyObject *kw[] = {s->shape, s->dtype, self->device};
        made = PyObject_Vectorcall(empty, kw, 1, dtype_device);
    }
    if (made != NULL && (*at = address(made)) == -1 && PyErr_Occurred()) Py_CLEAR(made);
    return made;
}

/* Runs the kernel on the call's values; Py_NotImplemented (borrowed marker) where the fallback
 * must take the call (a tensor not contiguous or not aligned, a front call recording, the plan's
 * launch replaced, a failed launch). */
static PyObject *launch_values(Launch *self, PyObject *values) {
    PyObject *recorder = PyObject_GetAttr(front_calls, s_recorder);
    if (recorder == NULL) return NULL;
    int recording = recorder != Py_None;
    Py_DECREF(recorder);
    PyObject *current = PyObject_GetAttr(self->plan, s_launch);
    if (current == NULL) return NULL;
    Py_DECREF(current);  /* compared by identity only; the plan holds it */
    if (recording || current != self->launch || PyTuple_GET_SIZE(values) < self->needed)
        return Py_NotImplemented;

    PyObject *tensors[MAX_ARGS], *made[MAX_ARGS] = {NULL};
    int64_t v[MAX_ARGS], addresses[MAX_ARGS];
    PyObject *result = NULL;
    for (int i = 0; i < self->tensors; i++) {
        tensors[i] = PyTuple_GET_ITEM(values, self->positions[i]);
        int ok = contiguous_address(tensors[i], &addresses[i]);
        if (ok < 0) return NULL;
        if (!ok) return Py_NotImplemented;
    }
    for (int i = 0; i < self->params; i++) {
        Slot *s = &self->slots[i];
        if (s->kind != FROM_INPUT) {
            if ((made[i] = new_tensor(self, s, tensors, &v[i])) == NULL) goto done;
        } else if ((v[i] = addresses[s->input]) % VECTOR_BYTES) {
            result = Py_NotImplemented;
            goto done;
        }
    }
    for (int i = 0; i < self->nsizes; i++) v[self->params + i] = self->sizes[i];
    PyObject *stream = PyObject_CallOneArg(self->stream, self->device_index);
    if (stream == NULL) goto done;
    v[self->params + self->nsizes] = (int64_t)PyLong_AsVoidPtr(stream);
    Py_DECREF(stream);
    if (PyErr_Occurred()) goto done;
    if (call_entry(self->entry, v, self->params + self->nsizes + 1) != 0) {
        result = Py_NotImplemented;
        goto done;
    }
    self->launches++;
    if (self->single) {
        result = Py_NewRef(made[self->result[0]] ? made[self->result[0]] : tensors[self->slots[self->result[0]].input]);
    } else {
        result = PyTuple_New(self->nresult);
        for (int i = 0; result && i < self->nresult; i++) {
            int p = self->result[i];
            PyTuple_SET_ITEM(result, i, Py_NewRef(made[p] ? made[p] : tensors[self->slots[p].input]));
        }
    }
done:
    for (int i = 0; i < self->params; i++) Py_XDECREF(made[i]);
    return result;
}

static PyObject *run_launch(Launch *self, PyObject *values) {
    if (self->plan == NULL || self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Launch not made (or already freed) was called");
        return NULL;
    }
    PyObject *result = launch_values(self, values);
    if (result == Py_NotImplemented) return PyObject_CallOneArg(self->fallback, values);
    return result;
}

static PyObject *Launch_call(Launch *self, PyObject *args, PyObject *kwargs) {
    PyObject *values;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &values)) return NULL;
    return run_launch(self, values);
}

static PyMemberDef Launch_members[] = {
    {"launches", T_LONGLONG, offsetof(Launch, launches), 0, "calls that ran the kernel"},
    {NULL},
};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npuops._fastpath.Launch",
    .tp_doc = "A kernel's launch for calls of one signature, run in C (see the module).",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_traverse = (traverseproc)Launch_traverse,
    .tp_clear = (inquiry)Launch_clear,
    .tp_call = (ternaryfunc)Launch_call,
    .tp_members = Launch_members,
};

/* -- module functions -------------------------------------------------------------------------- */
static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *plain, *grad, *like, *new, *local, *miss;
    if (!PyArg_ParseTuple(args, "O!OOOOO", &PyTuple_Type, &plain, &grad, &like, &new, &local, &miss))
        return NULL;
    Py_XSETREF(plain_types, Py_NewRef(plain));
    Py_XSETREF(is_grad_enabled, Py_NewRef(grad));
    Py_XSETREF(empty_like, Py_NewRef(like));
    Py_XSETREF(empty, Py_NewRef(new));
    Py_XSETREF(front_calls, Py_NewRef(local));
    Py_XSETREF(MISS, Py_NewRef(miss));
    Py_RETURN_NONE;
}

/* accelerate(capsule or None): read tensors through npuops._torch_fast's table from now on (None:
 * through Python again). Keys change form with it: the caller forgets the fast calls filed before. */
static PyObject *accelerate(PyObject *module, PyObject *capsule) {
    if (capsule == Py_None) {
        fast_api = NULL;
        Py_RETURN_NONE;
    }
    const NpuopsTorchFast *api = PyCapsule_GetPointer(capsule, NPUOPS_TORCH_FAST_CAPSULE);
    if (api == NULL) return NULL;
    if (api->version != NPUOPS_TORCH_FAST_VERSION) {
        PyErr_Format(PyExc_ValueError, "npuops._torch_fast table version %d, this module reads %d", api->version,
                     NPUOPS_TORCH_FAST_VERSION);
        return NULL;
    }
    fast_api = api;
    Py_RETURN_NONE;
}

static PyObject *accelerated(PyObject *module, PyObject *unused) { return PyBool_FromLong(fast_api != NULL); }

static int configured(void) {
    if (MISS == NULL) PyErr_SetString(PyExc_RuntimeError, "npuops._fastpath.configure() was not called");
    return MISS != NULL;
}

static PyObject *signature(PyObject *module, PyObject *args) {
    PyObject *call_args, *kwargs;
    int by_layout;
    if (!configured() || !PyArg_ParseTuple(args, "O!Op", &PyTuple_Type, &call_args, &kwargs, &by_layout)) return NULL;
    PyObject *values = call_values(call_args, kwargs);
    if (values == NULL) return NULL;
    PyObject *key = make_signature(values, kwargs, by_layout);
    Py_DECREF(values);
    return key;
}

/* call(fast_calls, args, kwargs, by_layout): the result of the fast call filed under the call's
 * key, or MISS (none filed, a tensor that needs a gradient, an unhashable argument). */
static PyObject *fast_call(PyObject *module, PyObject *const *argv, Py_ssize_t argc) {
    if (!configured()) return NULL;
    if (argc != 4 || !PyDict_CheckExact(argv[0]) || !PyTuple_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "call(fast_calls: dict, args: tuple, kwargs, by_layout)");
        return NULL;
    }
    int by_layout = PyObject_IsTrue(argv[3]);
    if (by_layout < 0) return NULL;
    PyObject *values = call_values(argv[1], argv[2]), *result = NULL;
    if (values == NULL) return NULL;
    PyObject *key = make_signature(values, argv[2], by_layout);
    if (key == NULL) goto done;
    if (key == Py_None) {
        result = Py_NewRef(MISS);
        goto done;
    }
    PyObject *fast = PyDict_GetItemWithError(argv[0], key);  /* borrowed */
    if (fast == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) goto done;
            PyErr_Clear();  /* an unhashable argument (a list): no fast path for it */
        }
        result = Py_NewRef(MISS);
        goto done;
    }
    Py_INCREF(fast);  /* the dict may change while it runs */
    result = Py_IS_TYPE(fast, &LaunchType) ? run_launch((Launch *)fast, values) : PyObject_CallOneArg(fast, values);
    Py_DECREF(fast);
done:
    Py_XDECREF(key);
    Py_DECREF(values);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(plain_types, is_grad_enabled, empty_like, empty, front_calls, miss)"},
    {"signature", signature, METH_VARARGS,
     "signature(args, kwargs, by_layout): a call's key, None where a tensor needs a gradient"},
    {"call", (PyCFunction)(void (*)(void))fast_call, METH_FASTCALL,
     "call(fast_calls, args, kwargs, by_layout): the filed fast call's result, or the miss marker"},
    {"accelerate", accelerate, METH_O,
     "accelerate(capsule or None): read tensors through npuops._torch_fast's table (keys change form)"},
    {"accelerated", accelerated, METH_NOARGS, "whether accelerate() gave a table"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "npuops._fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&LaunchType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    const char *names[] = {"shape", "dtype", "device", "stride", "requires_grad", "is_contiguous", "data_ptr",
                           "recorder", "launch", "expand"};
    PyObject **slots[] = {&s_shape, &s_dtype, &s_device, &s_stride, &s_requires_grad, &s_is_contiguous,
                          &s_data_ptr, &s_recorder, &s_launch, &s_expand};
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    if ((dtype_device = Py_BuildValue("(ss)", "dtype", "device")) == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "MAX_ARGS", MAX_ARGS) < 0 ||
        PyModule_AddObjectRef(m, "Launch", (PyObject *)&LaunchType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
