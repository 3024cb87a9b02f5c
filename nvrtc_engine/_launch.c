/* nvrtc_engine's compiled launcher: cuLaunchKernel from a Python call with plain ints.
 *
 * Built at run time by nvrtc_engine/launcher.py with the system's C compiler and the Python
 * headers, then imported as nvrtc_engine._nve_launch. It links against neither CUDA nor
 * libcuda: bind() receives the driver's function pointers (from cuGetProcAddress, through
 * cuda.bindings), so the driver it calls is exactly the one cuda.bindings uses.
 *
 *   bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent[, cuLaunchKernelEx])    addresses
 *   launch(function, grid, block, shmem, stream, params, context, flags=0) -> int
 *
 * launch makes `context` current on the calling thread if it is not (0: leave the context
 * alone), then launches `function` (a CUfunction's address) on a 1-D grid of 1-D blocks with
 * `shmem` bytes of dynamic shared memory on `stream` (a CUstream's address; 0 is the default
 * stream) with kernel parameters `params` (the address of a void*[]). It returns 0, the
 * CUresult of a failed cuLaunchKernel, or minus the CUresult of a failed context query or
 * switch (nothing launched). The GIL is released around the driver calls, as cuda.bindings
 * does: cuLaunchKernel can block while the GPU's queue of pending launches is full.
 * flags & LAUNCH_DEPENDENT: a programmatic dependent launch instead, cuLaunchKernelEx with
 * the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (the kernel waits for
 * its grid dependency itself: templates/include/nve_memory.cuh); an ordinary launch when
 * bind was not given cuLaunchKernelEx.
 *
 *   setup_fast(torch_types)
 *   fast(kernel, tensors, floats, stream, extra=None) -> (done, key)
 *
 * fast is Kernel._fast (nvrtc_engine/plans.py) in C: it reads the plan key of a call from its
 * array arguments exactly as the generated Python does (the same tuple, so plans made by
 * either are found by both), finds the kernel's plan and, when the plan has a native spec
 * (LaunchPlan.native: every launch's function, grid, block, shared memory, parameter image
 * and the slots each call rewrites), launches it here: the parameters are copied into this
 * call's stack frame, the pointers and floats written, and the launches made with the GIL
 * released once. A plan without one (it allocates outputs) runs through its Python run().
 * setup_fast hands it interop.TORCH_TYPES, the classes whose attributes it may read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult_t;
typedef CUresult_t (*launch_kernel_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, void *, void **, void **);
typedef CUresult_t (*ctx_get_current_t)(void **);
typedef CUresult_t (*ctx_set_current_t)(void *);

/* cuda.h's CUlaunchAttribute and CUlaunchConfig, as laid out there (an enum id padded to 8
 * bytes, a 64-byte value union; the config's dimensions, stream, attributes and count). */
typedef struct {
    int id;
    char pad[4];
    union {
        char pad[64];
        int value;
        long long align; /* the union's 8-byte alignment, as cuda.h's members give it */
    } value;
} launch_attribute_t;
typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shmem;
    void *stream;
    launch_attribute_t *attrs;
    unsigned num_attrs;
} launch_config_t;
typedef CUresult_t (*launch_kernel_ex_t)(const launch_config_t *, void *, void **, void **);
#define ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6 /* CUlaunchAttributeID */
#define LAUNCH_DEPENDENT 1u                            /* a launch's flags */

static launch_kernel_t launch_kernel;
static ctx_get_current_t ctx_get_current;
static ctx_set_current_t ctx_set_current;
static launch_kernel_ex_t launch_kernel_ex;

/* One 1-D launch, dependent (flags & LAUNCH_DEPENDENT, where bound) or ordinary. */
static CUresult_t launch_one(void *function, unsigned grid, unsigned block, unsigned shmem,
                             void *stream, void **params, unsigned flags) {
    if ((flags & LAUNCH_DEPENDENT) && launch_kernel_ex != NULL) {
        launch_attribute_t attr;
        memset(&attr, 0, sizeof(attr));
        attr.id = ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.value = 1;
        launch_config_t config = {grid, 1, 1, block, 1, 1, shmem, stream, &attr, 1};
        return launch_kernel_ex(&config, function, params, NULL);
    }
    return launch_kernel(function, grid, 1, 1, block, 1, 1, shmem, stream, params, NULL);
}

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
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent[, "
                        "cuLaunchKernelEx]) takes 3 or 4 addresses");
        return NULL;
    }
    void *pointers[4] = {NULL, NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nargs; i++) {
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
    launch_kernel_ex = (launch_kernel_ex_t)pointers[3];
    Py_RETURN_NONE;
}

/* Make `context` current on this thread if it is not (NULL: leave the context alone); 0, or
 * minus the CUresult of the failed query or switch. Called without the GIL. */
static CUresult_t make_current(void *context) {
    if (context == NULL) return 0;
    void *current = NULL;
    CUresult_t err = ctx_get_current(&current);
    if (err == 0 && current != context) err = ctx_set_current(context);
    return -err;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "launch(function, grid, block, shmem, stream, params, context, flags=0) "
                        "takes 7 or 8 arguments");
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
    unsigned flags = 0;
    if (nargs == 8 && !unsigned_of(args[7], &flags)) return NULL;

    CUresult_t err;
    Py_BEGIN_ALLOW_THREADS
    err = make_current(context);
    if (err == 0) err = launch_one(function, grid, block, shmem, stream, params, flags);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

/* ---- the compiled fast path -------------------------------------------------------- */

#define MAX_ARRAYS 32  /* array arguments of one call (families take at most 10) */
#define MAX_SLOTS 64   /* 8-byte parameter slots of one launch */
#define MAX_LAUNCHES 4 /* launches of one plan */

static PyObject *torch_types;
static PyObject *s_is_cuda, *s_data_ptr, *s_dtype, *s_shape, *s_get_device, *s_is_contiguous;
static PyObject *s_last_plan, *s_launch_plans, *s_key, *s_native, *s_run;

static int intern_names(void) {
    if (s_run != NULL) return 1;
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_is_cuda, "is_cuda"}, {&s_data_ptr, "data_ptr"}, {&s_dtype, "dtype"},
        {&s_shape, "shape"}, {&s_get_device, "get_device"},
        {&s_is_contiguous, "is_contiguous"}, {&s_last_plan, "_last_plan"},
        {&s_launch_plans, "_launch_plans"}, {&s_key, "key"}, {&s_native, "native"},
        {&s_run, "run"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL) {
            *names[i].slot = PyUnicode_InternFromString(names[i].text);
            if (*names[i].slot == NULL) return 0;
        }
    }
    return 1;
}

static PyObject *setup_fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1 || !PyAnySet_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_fast(torch_types) takes one set");
        return NULL;
    }
    if (!intern_names()) return NULL;
    Py_XSETREF(torch_types, Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

/* (None, None): not a call for a plan. */
static PyObject *no_plan(void) {
    return PyTuple_Pack(2, Py_None, Py_None);
}

/* One array argument's part of the plan key, a new reference (None, or (dtype, shape,
 * device, contiguous) for a CUDA torch tensor), and its address in *ptr. NULL: an exception
 * is set, or (*planned = 0, no exception) the argument is not a CUDA torch tensor. */
static PyObject *key_part(PyObject *t, unsigned long long *ptr, int *planned) {
    *ptr = 0;
    if (t == Py_None) return Py_NewRef(Py_None);
    int known = PySet_Contains(torch_types, (PyObject *)Py_TYPE(t));
    if (known <= 0) {
        *planned = known < 0 ? 1 : 0;
        return NULL;
    }
    PyObject *is_cuda = PyObject_GetAttr(t, s_is_cuda);
    if (is_cuda == NULL) return NULL;
    int cuda = PyObject_IsTrue(is_cuda);
    Py_DECREF(is_cuda);
    if (cuda <= 0) {
        *planned = cuda < 0 ? 1 : 0;
        return NULL;
    }
    PyObject *address = PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (address == NULL) return NULL;
    *ptr = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
    if (*ptr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *dtype = NULL, *shape = NULL, *device = NULL, *contiguous = NULL, *part = NULL;
    if ((dtype = PyObject_GetAttr(t, s_dtype)) != NULL &&
        (shape = PyObject_GetAttr(t, s_shape)) != NULL &&
        (device = PyObject_CallMethodNoArgs(t, s_get_device)) != NULL &&
        (contiguous = PyObject_CallMethodNoArgs(t, s_is_contiguous)) != NULL)
        part = PyTuple_Pack(4, dtype, shape, device, contiguous);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(device);
    Py_XDECREF(contiguous);
    return part;
}

/* The plan key of a call: (extra, part...), plus (address % 16 ...) when any address is not
 * 16-byte aligned. NULL with *planned = 0 (no exception): not a call for a plan. */
static PyObject *plan_key(PyObject *seq, PyObject *extra, unsigned long long *ptrs,
                          int *planned) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *parts[MAX_ARRAYS];
    unsigned long long low = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        parts[i] = key_part(items[i], &ptrs[i], planned);
        if (parts[i] == NULL) {
            while (i--) Py_DECREF(parts[i]);
            return NULL;
        }
        low |= ptrs[i];
    }
    int misaligned = (low & 15) != 0;
    PyObject *key = PyTuple_New(1 + n + misaligned);
    if (key == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(parts[i]);
        *planned = 1;
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, Py_NewRef(extra));
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(key, 1 + i, parts[i]);
    if (misaligned) {
        PyObject *residues = PyTuple_New(n);
        if (residues == NULL) {
            Py_DECREF(key);
            *planned = 1;
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(residues, i, PyLong_FromLong((long)(ptrs[i] & 15)));
        PyTuple_SET_ITEM(key, 1 + n, residues);
    }
    return key;
}

/* The kernel's plan for key (a new reference), None when it has none; NULL on error. */
static PyObject *find_plan(PyObject *kernel, PyObject *key) {
    PyObject *plan = PyObject_GetAttr(kernel, s_last_plan);
    if (plan == NULL) return NULL;
    PyObject *last_key = PyObject_GetAttr(plan, s_key);
    if (last_key == NULL) {
        Py_DECREF(plan);
        return NULL;
    }
    int differs = PyObject_RichCompareBool(last_key, key, Py_NE);
    Py_DECREF(last_key);
    if (differs <= 0) {
        if (differs < 0) Py_CLEAR(plan);
        return plan;
    }
    Py_DECREF(plan);
    PyObject *plans = PyObject_GetAttr(kernel, s_launch_plans);
    if (plans == NULL) return NULL;
    if (!PyDict_Check(plans)) {
        Py_DECREF(plans);
        PyErr_SetString(PyExc_TypeError, "Kernel._launch_plans is not a dict");
        return NULL;
    }
    plan = PyDict_GetItemWithError(plans, key);
    Py_XINCREF(plan);
    Py_DECREF(plans);
    if (plan == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    if (PyObject_SetAttr(kernel, s_last_plan, plan) < 0) Py_CLEAR(plan);
    return plan;
}

typedef struct {
    void *function;
    unsigned grid, block, shmem, nslots, flags;
    unsigned long long slots[MAX_SLOTS];
    void *args[MAX_SLOTS];
} prepared_t;

static int spec_error(void) {
    PyErr_SetString(PyExc_ValueError, "malformed native launch spec (a bug in nvrtc_engine)");
    return 0;
}

static unsigned read_u32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static unsigned long long read_u64(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Fill launches from a native spec (see plans.LaunchPlan._native) and this call's addresses
 * and floats; returns the number of launches, 0 with an exception set on error. Spec:
 *   u32 launches, u32 device ordinal, u64 context, then per launch
 *   u64 function, u32 grid, block, shmem, slots, writes, flags (LAUNCH_DEPENDENT),
 *   slots x 8 bytes (the image),
 *   writes x (u32 kind (0: address, 1: float), u32 slot, u32 index, u32 0, u64 offset). */
static int prepare(const char *spec, Py_ssize_t size, const unsigned long long *ptrs,
                   Py_ssize_t nptrs, PyObject *floats, prepared_t *launches,
                   unsigned *ordinal, void **context) {
    if (size < 16) return spec_error();
    unsigned count = read_u32(spec);
    *ordinal = read_u32(spec + 4);
    *context = (void *)(uintptr_t)read_u64(spec + 8);
    if (count == 0 || count > MAX_LAUNCHES) return spec_error();
    Py_ssize_t at = 16;
    for (unsigned j = 0; j < count; j++) {
        prepared_t *l = &launches[j];
        if (size - at < 32) return spec_error();
        l->function = (void *)(uintptr_t)read_u64(spec + at);
        l->grid = read_u32(spec + at + 8);
        l->block = read_u32(spec + at + 12);
        l->shmem = read_u32(spec + at + 16);
        l->nslots = read_u32(spec + at + 20);
        unsigned writes = read_u32(spec + at + 24);
        l->flags = read_u32(spec + at + 28);
        at += 32;
        if (l->nslots > MAX_SLOTS || size - at < (Py_ssize_t)(8 * l->nslots + 24 * writes))
            return spec_error();
        memcpy(l->slots, spec + at, 8 * l->nslots);
        at += 8 * l->nslots;
        for (unsigned w = 0; w < writes; w++, at += 24) {
            unsigned kind = read_u32(spec + at), slot = read_u32(spec + at + 4);
            unsigned index = read_u32(spec + at + 8);
            if (slot >= l->nslots) return spec_error();
            if (kind == 0) {
                if ((Py_ssize_t)index >= nptrs) return spec_error();
                l->slots[slot] = ptrs[index] + read_u64(spec + at + 16);
            } else {
                if ((Py_ssize_t)index >= PySequence_Fast_GET_SIZE(floats)) {
                    PyErr_SetString(PyExc_IndexError, "launch plan: a per-call float is missing");
                    return 0;
                }
                double value = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(floats, index));
                if (value == -1.0 && PyErr_Occurred()) return 0;
                float single = (float)value;
                if (isinf(single) && !isinf(value)) {
                    PyErr_SetString(PyExc_OverflowError, "float too large to pack with f format");
                    return 0;
                }
                memcpy(&l->slots[slot], &single, 4);
            }
        }
        for (unsigned i = 0; i < l->nslots; i++) l->args[i] = &l->slots[i];
    }
    if (at != size) return spec_error();
    return (int)count;
}

/* Launch a plan's native spec; returns 1 (launched) or 0 with an exception set. */
static int run_native(PyObject *native, const unsigned long long *ptrs, Py_ssize_t nptrs,
                      PyObject *floats, PyObject *stream) {
    if (!PyTuple_Check(native) || PyTuple_GET_SIZE(native) != 4 ||
        !PyBytes_Check(PyTuple_GET_ITEM(native, 0)))
        return spec_error();
    PyObject *spec = PyTuple_GET_ITEM(native, 0);
    PyObject *fseq = PySequence_Fast(floats, "floats must be a sequence");
    if (fseq == NULL) return 0;
    prepared_t launches[MAX_LAUNCHES];
    unsigned ordinal;
    void *context;
    int count = prepare(PyBytes_AS_STRING(spec), PyBytes_GET_SIZE(spec), ptrs, nptrs, fseq,
                        launches, &ordinal, &context);
    Py_DECREF(fseq);
    if (count == 0) return 0;
    PyObject *handle;
    if (stream == Py_None) {
        PyObject *device = PyLong_FromUnsignedLong(ordinal);
        if (device == NULL) return 0;
        handle = PyObject_CallOneArg(PyTuple_GET_ITEM(native, 1), device);
        Py_DECREF(device);
    } else {
        handle = PyObject_CallOneArg(PyTuple_GET_ITEM(native, 2), stream);
    }
    if (handle == NULL) return 0;
    void *cu_stream = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    if (cu_stream == NULL && PyErr_Occurred()) return 0;
    if (launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch before bind");
        return 0;
    }
    CUresult_t err;
    Py_BEGIN_ALLOW_THREADS
    err = make_current(context);
    for (int j = 0; j < count && err == 0; j++) {
        prepared_t *l = &launches[j];
        err = launch_one(l->function, l->grid, l->block, l->shmem, cu_stream, l->args,
                         l->flags);
    }
    Py_END_ALLOW_THREADS
    if (err == 0) return 1;
    PyObject *code = PyLong_FromLong(err);
    if (code == NULL) return 0;
    PyObject *raised = PyObject_CallOneArg(PyTuple_GET_ITEM(native, 3), code);
    Py_DECREF(code);
    Py_XDECREF(raised);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed (%d)", err);
    return 0;
}

static PyObject *fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(kernel, tensors, floats, stream, extra=None) takes 4 or 5 arguments");
        return NULL;
    }
    if (torch_types == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fast before setup_fast");
        return NULL;
    }
    PyObject *kernel = args[0], *floats = args[2], *stream = args[3];
    PyObject *extra = nargs == 5 ? args[4] : Py_None;
    PyObject *seq = PySequence_Fast(args[1], "tensors must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_ARRAYS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "fast: more than %d array arguments", MAX_ARRAYS);
        return NULL;
    }
    unsigned long long ptrs[MAX_ARRAYS];
    int planned = 1;
    PyObject *key = plan_key(seq, extra, ptrs, &planned);
    Py_DECREF(seq);
    if (key == NULL) return planned ? NULL : no_plan();
    PyObject *plan = find_plan(kernel, key);
    if (plan == NULL) goto fail;
    if (plan == Py_None) {
        Py_DECREF(plan);
        PyObject *result = PyTuple_Pack(2, Py_None, key);
        Py_DECREF(key);
        return result;
    }
    PyObject *native = PyObject_GetAttr(plan, s_native);
    if (native == NULL) goto fail_plan;
    PyObject *done;
    if (native != Py_None) {
        int ok = run_native(native, ptrs, n, floats, stream);
        Py_DECREF(native);
        if (!ok) goto fail_plan;
        done = Py_NewRef(args[1]);
    } else {
        Py_DECREF(native);
        PyObject *list = PyList_New(n);
        if (list == NULL) goto fail_plan;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *p = PyLong_FromUnsignedLongLong(ptrs[i]);
            if (p == NULL) {
                Py_DECREF(list);
                goto fail_plan;
            }
            PyList_SET_ITEM(list, i, p);
        }
        PyObject *run = PyObject_GetAttr(plan, s_run);
        if (run == NULL) {
            Py_DECREF(list);
            goto fail_plan;
        }
        PyObject *call[4] = {args[1], list, floats, stream};
        done = PyObject_Vectorcall(run, call, 4, NULL);
        Py_DECREF(run);
        Py_DECREF(list);
        if (done == NULL) goto fail_plan;
    }
    Py_DECREF(plan);
    PyObject *result = PyTuple_Pack(2, done, done == Py_None ? Py_None : key);
    Py_DECREF(done);
    Py_DECREF(key);
    return result;
fail_plan:
    Py_DECREF(plan);
fail:
    Py_DECREF(key);
    return NULL;
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(cuLaunchKernel, cuCtxGetCurrent, cuCtxSetCurrent[, cuLaunchKernelEx]): the "
     "driver's function addresses"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid, block, shmem, stream, params, context, flags=0) -> CUresult (0: "
     "launched; negative: the context query or switch failed; flags 1: a dependent launch)"},
    {"setup_fast", (PyCFunction)(void (*)(void))setup_fast, METH_FASTCALL,
     "setup_fast(torch_types): the set of classes whose attributes fast() may read"},
    {"fast", (PyCFunction)(void (*)(void))fast, METH_FASTCALL,
     "fast(kernel, tensors, floats, stream, extra=None) -> (done, key): Kernel._fast in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_nve_launch", "nvrtc_engine's compiled cuLaunchKernel caller", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nve_launch(void) {
    return PyModule_Create(&module);
}
