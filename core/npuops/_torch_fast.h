/* The table npuops._torch_fast hands npuops._fastpath (a capsule named NPUOPS_TORCH_FAST_CAPSULE):
 * what the fast path asks of a plain tensor, answered from torch's C++ objects. C and C++ alike. */
#ifndef NPUOPS_TORCH_FAST_H
#define NPUOPS_TORCH_FAST_H

#include <Python.h>
#include <stdint.h>

#define NPUOPS_TORCH_FAST_CAPSULE "npuops._torch_fast.api"
#define NPUOPS_TORCH_FAST_VERSION 1

typedef struct {
    int version;
    int (*grad_enabled)(void);
    /* The tensor's key (bytes: dims, sizes, strides with by_layout, layout, dtype, device); NULL on error. */
    PyObject *(*tensor_key)(PyObject *tensor, int by_layout);
    int (*requires_grad)(PyObject *tensor);
    /* 1 and *address: the tensor is contiguous; 0: it is not. */
    int (*contiguous_address)(PyObject *tensor, int64_t *address);
    /* A new contiguous tensor of like's sizes, dtype and device, and its address; NULL on error. */
    PyObject *(*empty_like)(PyObject *like, int64_t *address);
} NpuopsTorchFast;

#endif
