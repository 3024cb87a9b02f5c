/* nvrtc_engine's compiled launcher: cuLaunchKernel from a Python call with plain ints.
 *
 * Built at run time by nvrtc_engine/launcher.py with the system's C compiler and the Python
 * headers, then imported as nvrtc_engine._nve_launch. It links against neither CUDA nor
 * libcuda: bind() receives the driver's function pointers (from cuGetProcAddress, through
 * cuda.bindings), so the driver it calls is exactly the one cuda.bindings uses.
 *
 *   bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent)    addresses, as ints
 *   launch(function, grid, block, shmem, stream, params, context) -> int
 *
 * launch makes `context` current on the calling thread if it is not (0: leave the context
 * alone), then launches `function` (a CUfunction's address) on a 1-D grid of 1-D blocks with
 * `shmem` bytes of dynamic shared memory on `stream` (a CUstream's address; 0 is the default
 * stream) with kernel parameters `params` (the address of a void*[]). It returns 0, the
 * CUresult of a failed cuLaunchKernel, or minus the CUresult of a failed context query or
 * switch (nothing launched). The GIL is released around the driver calls, as cuda.bindings
 * does: cuLaunchKernel can block while the GPU's queue of pending launches is full.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int CUresult_t;
typedef CUresult_t (*launch_kernel_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, void *, void **, void **);
typedef CUresult_t (*ctx_get_current_t)(void **);
typedef CUresult_t (*ctx_set_current_t)(void *);

static launch_kernel_t launch_kernel;
static ctx_get_current_t ctx_get_current;
static ctx_set_current_t ctx_set_current;

/* An int argument as an address; 0 on error with the exception set (check PyErr_Occurred). */
static void *address_of(PyObject *value) {
    return PyLong_AsVoidPtr(value);
}

/* An int argument as an unsigned int; returns 0 with the exception set when out of range. */
static int unsigned_of(PyObject *value, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(value);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return 0;
    if (v > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "launch dimension or size above 2**32 - 1");
        return 0;
    }
    *out = (unsigned)v;
    return 1;
}

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent) takes 3 addresses");
        return NULL;
    }
    void *pointers[3];
    for (int i = 0; i < 3; i++) {
        pointers[i] = address_of(args[i]);
        if (pointers[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "bind: a driver function address is 0");
            return NULL;
        }
    }
    launch_kernel = (launch_kernel_t)pointers[0];
    ctx_get_current = (ctx_get_current_t)pointers[1];
    ctx_set_current = (ctx_set_current_t)pointers[2];
    Py_RETURN_NONE;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "launch(function, grid, block, shmem, stream, params, context) takes 7 "
                        "arguments");
        return NULL;
    }
    if (launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch before bind");
        return NULL;
    }
    unsigned grid, block, shmem;
    void *function = address_of(args[0]);
    if (function == NULL && PyErr_Occurred()) return NULL;
    if (!unsigned_of(args[1], &grid) || !unsigned_of(args[2], &block) ||
        !unsigned_of(args[3], &shmem))
        return NULL;
    void *stream = address_of(args[4]);
    if (stream == NULL && PyErr_Occurred()) return NULL;
    void **params = (void **)address_of(args[5]);
    if (params == NULL && PyErr_Occurred()) return NULL;
    void *context = address_of(args[6]);
    if (context == NULL && PyErr_Occurred()) return NULL;

    CUresult_t err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (context != NULL) {
        void *current = NULL;
        err = ctx_get_current(&current);
        if (err == 0 && current != context) err = ctx_set_current(context);
        err = -err;
    }
    if (err == 0)
        err = launch_kernel(function, grid, 1, 1, block, 1, 1, shmem, stream, params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent): the driver's function addresses"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid, block, shmem, stream, params, context) -> CUresult (0: launched; "
     "negative: the context query or switch failed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_nve_launch", "nvrtc_engine's compiled cuLaunchKernel caller", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nve_launch(void) {
    return PyModule_Create(&module);
}
