/* nvrtc_engine._native_launch: the per-call work of a prepared launch, in C.
 *
 * Built into the wheel (and by an editable install) by nvrtc_engine/_build_hook.py against
 * Python's limited API (abi3), without CUDA headers or libcuda: the few driver types are
 * declared here as cuda.h lays them out, and the driver's cuLaunchKernelEx and
 * cuCtxGetCurrent come as addresses from cuGetProcAddress (nvrtc_engine/native_launch.py).
 * Everything it does, nvrtc_engine/launch.py also does in Python (the pure path), with the
 * same call keys, parameter bytes and errors.
 *
 * Launcher(kernel, torch_types): fast1/fast2/fast3/fastn read a call's key (as
 * launch.call_key) from its tensors, look it up in kernel._prepared and run what is found.
 * Plan(...): one prepared launch (launch.prepare's run): the call's addresses, allocated
 * outputs, offsets and floats go into each launch's parameter slots on the stack, then
 * cuLaunchKernelEx on the call's stream.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef SOURCE_DIGEST
#define SOURCE_DIGEST ""
#endif

#define MAX_ROWS 64     /* array addresses of a call (given and allocated) */
#define MAX_PARAMS 128  /* 8-byte parameter slots of one launch */
#define MAX_TENSORS 32  /* array arguments a fast call reads */
#define MAX_FLOATS 16

/* cuda.h's CUlaunchAttribute and CUlaunchConfig */
typedef struct {
    int id;
    char pad[4];
    union { char bytes[64]; int value; unsigned long long align; } value;
} launch_attribute_t;
typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
    void *stream;
    launch_attribute_t *attrs;
    unsigned num_attrs;
} launch_config_t;
#define PROGRAMMATIC_STREAM_SERIALIZATION 6 /* CU_LAUNCH_ATTRIBUTE_... */

typedef int (*launch_ex_t)(const launch_config_t *, void *, void **, void **);
typedef int (*ctx_get_t)(void **);
typedef int (*ctx_set_t)(void *);

/* set once by setup() */
static launch_ex_t launch_ex = NULL;
static ctx_get_t ctx_get = NULL;
static ctx_set_t ctx_set = NULL;
static PyObject *check = NULL;           /* driver.check((err,), call): raises CudaError */
static PyObject *explicit_stream = NULL; /* interop.explicit_stream(stream) -> int */
static PyObject *s_prepared, *s_get, *s_launch_name, *s_set_name;

/* ------------------------------------------------------------ builtins called directly */

/* A builtin function or method (a C function of an extension, torch's) called without
 * Python's call protocol: its C function, self and calling convention (fn NULL: called as
 * any callable is). */
typedef struct { PyCFunction fn; PyObject *self; int flags; } direct_t;
#define VARARGS_KEYWORDS (METH_VARARGS | METH_KEYWORDS)

static direct_t direct_of(PyObject *callable) {
    direct_t d = {NULL, NULL, 0};
    if (PyCFunction_Check(callable)) {  /* (torch's functions are static methods) */
        int flags = PyCFunction_GetFlags(callable) & ~(METH_STATIC | METH_COEXIST);
        if (flags == METH_NOARGS || flags == METH_O || flags == VARARGS_KEYWORDS) {
            d.fn = PyCFunction_GetFunction(callable);
            d.self = PyCFunction_GetSelf(callable);
            d.flags = flags;
        }
    }
    return d;
}

/* callable(arg) */
static PyObject *call_one(PyObject *callable, const direct_t *d, PyObject *arg) {
    if (d->fn && d->flags == METH_O) return d->fn(d->self, arg);
    return PyObject_CallFunctionObjArgs(callable, arg, NULL);
}

/* callable(*args, **kwargs), kwargs a dict or NULL */
static PyObject *call_args(PyObject *callable, const direct_t *d, PyObject *args,
                           PyObject *kwargs) {
    if (d->fn && d->flags == VARARGS_KEYWORDS)
        return ((PyCFunctionWithKeywords)(void (*)(void))d->fn)(d->self, args, kwargs);
    return PyObject_Call(callable, args, kwargs);
}

/* What a call's key reads from a tensor: its data_ptr(), get_device() and is_contiguous(),
 * dtype and shape, per tensor type through what the type has when first seen here: a builtin
 * method's C function, a getter's descriptor (anything else, e.g. a method patched onto the
 * class before then, is looked up and called on each read as Python does). */
enum { DATA_PTR, GET_DEVICE, IS_CONTIGUOUS, DTYPE, SHAPE, NREADS };
#define NMETHODS DTYPE /* the first NMETHODS reads are method calls, the others attributes */
#define MAX_TYPES 4
typedef struct {
    PyObject *type;
    direct_t call[NMETHODS];
    PyObject *getter[NREADS]; /* getset descriptors, at DTYPE and SHAPE */
} tensor_type_t;
static tensor_type_t tensor_types[MAX_TYPES];
static int ntensor_types = 0;
static PyObject *read_names[NREADS];
static PyObject *empty_tuple = NULL;
static descrgetfunc getset_get = NULL; /* a getset descriptor's __get__ */

/* What `type` has for each read, learnt from `t`, one of its instances. */
static void learn(tensor_type_t *k, PyObject *type, PyObject *t) {
    for (int i = 0; i < NREADS; i++) {
        PyObject *found = PyObject_GetAttr(i < NMETHODS ? t : type, read_names[i]);
        if (!found) {  /* (the read itself raises) */
            PyErr_Clear();
            continue;
        }
        if (i >= NMETHODS) {
            if (Py_IS_TYPE(found, &PyGetSetDescr_Type)) {
                k->getter[i] = found;  /* (kept) */
                continue;
            }
        } else {
            direct_t d = direct_of(found);
            if (d.fn && PyCFunction_GetSelf(found) == t &&
                (d.flags == METH_NOARGS || d.flags == VARARGS_KEYWORDS))
                k->call[i] = d;
        }
        Py_DECREF(found);
    }
}

/* The entry of `type` (learnt from `t`), or NULL when there is no room. */
static tensor_type_t *tensor_type(PyObject *type, PyObject *t) {
    for (int i = 0; i < ntensor_types; i++)
        if (tensor_types[i].type == type) return &tensor_types[i];
    if (ntensor_types == MAX_TYPES) return NULL;
    tensor_type_t k;
    memset(&k, 0, sizeof k);
    learn(&k, type, t);
    for (int i = 0; i < ntensor_types; i++)  /* (learnt meanwhile by another thread) */
        if (tensor_types[i].type == type) {
            for (int j = 0; j < NREADS; j++) Py_XDECREF(k.getter[j]);
            return &tensor_types[i];
        }
    if (ntensor_types == MAX_TYPES) {
        for (int j = 0; j < NREADS; j++) Py_XDECREF(k.getter[j]);
        return NULL;
    }
    Py_INCREF(type);
    k.type = type;
    tensor_types[ntensor_types] = k;
    return &tensor_types[ntensor_types++];
}

/* One of the reads above: t.<method>() or t.<attribute> */
static PyObject *tensor_read(PyObject *t, int which) {
    PyObject *type = (PyObject *)Py_TYPE(t);
    tensor_type_t *k = tensor_type(type, t);
    if (which >= NMETHODS) {
        if (k && k->getter[which]) return getset_get(k->getter[which], t, type);
        return PyObject_GetAttr(t, read_names[which]);
    }
    if (k && k->call[which].fn) {
        const direct_t *d = &k->call[which];
        if (d->flags == METH_NOARGS) return d->fn(t, NULL);
        return ((PyCFunctionWithKeywords)(void (*)(void))d->fn)(t, empty_tuple, NULL);
    }
    return PyObject_CallMethodObjArgs(t, read_names[which], NULL);
}

/* ---------------------------------------------------------------------------------- Plan */

typedef struct { int slot, row; long long offset; } ref_t;
typedef struct { int slot, index; } float_ref_t;
typedef struct {
    void *function;
    unsigned grid, block, shared;
    int dependent, nparams, nrefs, nfloats;
    uint64_t *image;
    ref_t *refs;
    float_ref_t *floats;
} launch_t;
typedef struct {
    int like;          /* index of the given tensor for empty_like, or -1: empty(*args) */
    PyObject *args;    /* empty's positional sizes (like < 0) */
    PyObject *kwargs;  /* dtype= (and device=), or NULL */
    unsigned residue;  /* the address modulo 16 the key was prepared with */
} alloc_t;
typedef struct {
    PyObject_HEAD
    int ngiven, nallocs, nlaunches, nfloats;
    alloc_t *allocs;
    launch_t *launches;
    void *context;
    PyObject *ordinal, *current_stream, *empty, *empty_like;
    direct_t current_stream_c, empty_c, empty_like_c;
} Plan;

static PyTypeObject *PlanType = NULL;

static void plan_free_arrays(Plan *p) {
    if (p->allocs) {
        for (int i = 0; i < p->nallocs; i++) {
            Py_XDECREF(p->allocs[i].args);
            Py_XDECREF(p->allocs[i].kwargs);
        }
        PyMem_Free(p->allocs);
        p->allocs = NULL;
    }
    if (p->launches) {
        for (int i = 0; i < p->nlaunches; i++) {
            PyMem_Free(p->launches[i].image);
            PyMem_Free(p->launches[i].refs);
            PyMem_Free(p->launches[i].floats);
        }
        PyMem_Free(p->launches);
        p->launches = NULL;
    }
}

static int plan_traverse(Plan *p, visitproc visit, void *arg) {
    Py_VISIT(p->ordinal); Py_VISIT(p->current_stream);
    Py_VISIT(p->empty); Py_VISIT(p->empty_like);
    for (int i = 0; p->allocs && i < p->nallocs; i++) {
        Py_VISIT(p->allocs[i].args); Py_VISIT(p->allocs[i].kwargs);
    }
    return 0;
}

static int plan_clear(Plan *p) {
    Py_CLEAR(p->ordinal); Py_CLEAR(p->current_stream);
    Py_CLEAR(p->empty); Py_CLEAR(p->empty_like);
    plan_free_arrays(p);
    return 0;
}

/* Both types' tp_dealloc: untrack, clear (the type's tp_clear), free, release the type. */
static void dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ((inquiry)PyType_GetSlot(tp, Py_tp_clear))(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

static int as_int(PyObject *tuple, Py_ssize_t i, long long *out) {
    PyObject *v = PyTuple_GetItem(tuple, i);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *tuple_item(PyObject *tuple, Py_ssize_t i, Py_ssize_t size) {
    PyObject *v = PyTuple_GetItem(tuple, i);
    if (v && (!PyTuple_Check(v) || (size >= 0 && PyTuple_Size(v) != size))) {
        PyErr_Format(PyExc_TypeError, "plan: item %zd must be a tuple of %zd", i, size);
        return NULL;
    }
    return v;
}

/* One launch: (function, grid, block, shared, dependent, image, refs, floats). */
static int parse_launch(PyObject *t, launch_t *l, int nrows, int nfloats) {
    long long v[5];
    for (int i = 0; i < 5; i++)
        if (as_int(t, i, &v[i])) return -1;
    l->function = (void *)(uintptr_t)v[0];
    l->grid = (unsigned)v[1]; l->block = (unsigned)v[2]; l->shared = (unsigned)v[3];
    l->dependent = v[4] != 0;
    char *bytes; Py_ssize_t n;
    PyObject *image = PyTuple_GetItem(t, 5);
    if (image == NULL || PyBytes_AsStringAndSize(image, &bytes, &n)) return -1;
    if (n % 8 || n / 8 > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "plan: parameter image too long or not 8-byte slots");
        return -1;
    }
    l->nparams = (int)(n / 8);
    l->image = PyMem_Malloc(n ? (size_t)n : 1);
    if (!l->image) { PyErr_NoMemory(); return -1; }
    memcpy(l->image, bytes, (size_t)n);
    PyObject *refs = tuple_item(t, 6, -1), *floats = tuple_item(t, 7, -1);
    if (!refs || !floats) return -1;
    l->nrefs = (int)PyTuple_Size(refs);
    l->nfloats = (int)PyTuple_Size(floats);
    l->refs = PyMem_Malloc(sizeof(ref_t) * (size_t)(l->nrefs + 1));
    l->floats = PyMem_Malloc(sizeof(float_ref_t) * (size_t)(l->nfloats + 1));
    if (!l->refs || !l->floats) { PyErr_NoMemory(); return -1; }
    for (int i = 0; i < l->nrefs; i++) {
        PyObject *r = tuple_item(refs, i, 3);
        long long slot, row, offset;
        if (!r || as_int(r, 0, &slot) || as_int(r, 1, &row) || as_int(r, 2, &offset)) return -1;
        if (slot < 0 || slot >= l->nparams || row < 0 || row >= nrows) {
            PyErr_SetString(PyExc_ValueError, "plan: reference out of range");
            return -1;
        }
        l->refs[i] = (ref_t){(int)slot, (int)row, offset};
    }
    for (int i = 0; i < l->nfloats; i++) {
        PyObject *r = tuple_item(floats, i, 2);
        long long slot, index;
        if (!r || as_int(r, 0, &slot) || as_int(r, 1, &index)) return -1;
        if (slot < 0 || slot >= l->nparams || index < 0 || index >= nfloats) {
            PyErr_SetString(PyExc_ValueError, "plan: float reference out of range");
            return -1;
        }
        l->floats[i] = (float_ref_t){(int)slot, (int)index};
    }
    return 0;
}

/* Plan(ngiven, allocs, launches, nfloats, context, ordinal, current_stream, empty,
 *      empty_like); allocs: ((like, args, kwargs, residue), ...), launches: see parse_launch */
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    int ngiven, nfloats;
    unsigned long long context;
    PyObject *allocs, *launches, *ordinal, *current_stream, *empty, *empty_like;
    if (kw && PyDict_Size(kw)) {
        PyErr_SetString(PyExc_TypeError, "Plan takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "iO!O!iKOOOO", &ngiven, &PyTuple_Type, &allocs, &PyTuple_Type,
                          &launches, &nfloats, &context, &ordinal, &current_stream, &empty,
                          &empty_like))
        return NULL;
    Py_ssize_t nallocs = PyTuple_Size(allocs), nlaunches = PyTuple_Size(launches);
    if (ngiven < 0 || ngiven + nallocs > MAX_ROWS || nfloats < 0 || nfloats > MAX_FLOATS) {
        PyErr_SetString(PyExc_ValueError, "plan: too many arrays or floats");
        return NULL;
    }
    allocfunc tp_alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Plan *p = (Plan *)tp_alloc(type, 0);
    if (!p) return NULL;
    p->ngiven = ngiven; p->nfloats = nfloats;
    p->context = (void *)(uintptr_t)context;
    Py_INCREF(ordinal); p->ordinal = ordinal;
    Py_INCREF(current_stream); p->current_stream = current_stream;
    Py_INCREF(empty); p->empty = empty;
    Py_INCREF(empty_like); p->empty_like = empty_like;
    p->current_stream_c = direct_of(current_stream);
    p->empty_c = direct_of(empty);
    p->empty_like_c = direct_of(empty_like);
    p->allocs = PyMem_Calloc((size_t)nallocs + 1, sizeof(alloc_t));
    p->launches = PyMem_Calloc((size_t)nlaunches + 1, sizeof(launch_t));
    if (!p->allocs || !p->launches) { PyErr_NoMemory(); goto fail; }
    p->nallocs = (int)nallocs;
    p->nlaunches = (int)nlaunches;
    for (int i = 0; i < p->nallocs; i++) {
        PyObject *a = tuple_item(allocs, i, 4);
        long long like, residue;
        if (!a || as_int(a, 0, &like) || as_int(a, 3, &residue)) goto fail;
        if (like >= ngiven) {
            PyErr_SetString(PyExc_ValueError, "plan: allocation like an absent tensor");
            goto fail;
        }
        alloc_t *al = &p->allocs[i];
        al->like = (int)like;
        al->residue = (unsigned)residue;
        PyObject *sizes = PyTuple_GetItem(a, 1), *kwargs = PyTuple_GetItem(a, 2);
        if (like < 0 && !PyTuple_Check(sizes)) {
            PyErr_SetString(PyExc_TypeError, "plan: empty() needs a tuple of sizes");
            goto fail;
        }
        if (sizes != Py_None) { Py_INCREF(sizes); al->args = sizes; }
        if (kwargs != Py_None) { Py_INCREF(kwargs); al->kwargs = kwargs; }
    }
    for (int i = 0; i < p->nlaunches; i++) {
        PyObject *l = tuple_item(launches, i, 8);
        if (!l || parse_launch(l, &p->launches[i], ngiven + p->nallocs, nfloats)) goto fail;
    }
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

static int address_of(PyObject *t, uint64_t *out) {
    PyObject *r = tensor_read(t, DATA_PTR);
    if (!r) return -1;
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int stream_of(Plan *p, PyObject *stream, void **out) {
    PyObject *h;
    if (stream == Py_None)
        h = call_one(p->current_stream, &p->current_stream_c, p->ordinal);
    else if (PyLong_CheckExact(stream)) {
        Py_INCREF(stream);
        h = stream;
    } else
        h = PyObject_CallFunctionObjArgs(explicit_stream, stream, NULL);
    if (!h) return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (void *)(uintptr_t)v;
    return 0;
}

static PyObject *fail_with(int err, PyObject *call) {
    PyObject *result = Py_BuildValue("(i)", err);
    if (!result) return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(check, result, call, NULL);
    Py_DECREF(result);
    Py_XDECREF(r);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "%U failed (%d)", call, err);
    return NULL;
}

/* The prepared launch: given tensors t[0..ngiven), their addresses, the floats, the stream.
 * Returns the allocated outputs (a tuple), or None when one is aligned otherwise than the
 * key's (nothing launched). */
static PyObject *plan_run(Plan *p, PyObject *const *t, const uint64_t *given, PyObject *floats,
                          PyObject *stream) {
    uint64_t rows[MAX_ROWS];
    float fv[MAX_FLOATS];
    memcpy(rows, given, sizeof(uint64_t) * (size_t)p->ngiven);
    if (p->nfloats) {
        Py_ssize_t n = PySequence_Size(floats);
        if (n < 0) return NULL;
        if (n != p->nfloats) {
            PyErr_Format(PyExc_ValueError, "%d floats expected, got %zd", p->nfloats, n);
            return NULL;
        }
        for (int i = 0; i < p->nfloats; i++) {
            PyObject *f = PySequence_GetItem(floats, i);
            if (!f) return NULL;
            double d = PyFloat_AsDouble(f);
            Py_DECREF(f);
            if (d == -1.0 && PyErr_Occurred()) return NULL;
            fv[i] = (float)d;
        }
    }
    PyObject *made = PyTuple_New(p->nallocs);  /* (no allocation: the empty tuple) */
    if (!made) return NULL;
    for (int i = 0; i < p->nallocs; i++) {
        alloc_t *a = &p->allocs[i];
        PyObject *out;
        if (a->like < 0)
            out = call_args(p->empty, &p->empty_c, a->args, a->kwargs);
        else {  /* (torch's functions take an argument tuple) */
            PyObject *args = PyTuple_Pack(1, t[a->like]);
            out = args ? call_args(p->empty_like, &p->empty_like_c, args, a->kwargs) : NULL;
            Py_XDECREF(args);
        }
        if (!out) goto fail;
        PyTuple_SetItem(made, i, out);
        uint64_t address;
        if (address_of(out, &address)) goto fail;
        if ((address & 15) != a->residue) {
            Py_DECREF(made);
            Py_RETURN_NONE;
        }
        rows[p->ngiven + i] = address;
    }
    void *handle;
    if (stream_of(p, stream, &handle)) goto fail;
    /* the device's context for the launch, the thread's previous one (or none) after it,
       as driver.on_device does */
    void *previous = NULL;
    int switched = ctx_get(&previous) || previous != p->context;
    if (switched) {
        int err = ctx_set(p->context);
        if (err) {
            fail_with(err, s_set_name);
            goto fail;
        }
    }
    int err = 0;
    for (int i = 0; i < p->nlaunches && !err; i++) {
        const launch_t *l = &p->launches[i];
        uint64_t slots[MAX_PARAMS];
        void *params[MAX_PARAMS];
        memcpy(slots, l->image, 8 * (size_t)l->nparams);
        for (int j = 0; j < l->nrefs; j++) {
            uint64_t address = rows[l->refs[j].row];
            slots[l->refs[j].slot] = address ? address + (uint64_t)l->refs[j].offset : 0;
        }
        for (int j = 0; j < l->nfloats; j++)  /* the slot's first 4 bytes; the rest stay 0 */
            memcpy(&slots[l->floats[j].slot], &fv[l->floats[j].index], 4);
        for (int j = 0; j < l->nparams; j++)
            params[j] = &slots[j];
        launch_attribute_t attr;
        memset(&attr, 0, sizeof attr);
        attr.id = PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.value = 1;
        launch_config_t config = {l->grid, 1, 1, l->block, 1, 1, l->shared, handle,
                                  l->dependent ? &attr : NULL, l->dependent ? 1u : 0u};
        err = launch_ex(&config, l->function, params, NULL);
    }
    int restored = switched ? ctx_set(previous) : 0;
    if (err) {
        fail_with(err, s_launch_name);
        goto fail;
    }
    if (restored) {
        fail_with(restored, s_set_name);
        goto fail;
    }
    return made;
fail:
    Py_DECREF(made);
    return NULL;
}

/* plan(tensors, ptrs, floats, stream): as launch.prepare's run */
static PyObject *plan_call(PyObject *self, PyObject *args, PyObject *kw) {
    PyObject *tensors, *ptrs, *floats, *stream;
    if (kw && PyDict_Size(kw)) {
        PyErr_SetString(PyExc_TypeError, "a prepared launch takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOO", &tensors, &ptrs, &floats, &stream)) return NULL;
    Plan *p = (Plan *)self;
    PyObject *t[MAX_ROWS] = {NULL};
    uint64_t given[MAX_ROWS];
    Py_ssize_t nt = PySequence_Size(tensors), np = PySequence_Size(ptrs);
    if (nt < 0 || np < 0) return NULL;
    if (nt != p->ngiven || np != p->ngiven) {
        PyErr_Format(PyExc_ValueError, "%d tensors and addresses expected", p->ngiven);
        return NULL;
    }
    PyObject *result = NULL;
    int i = 0;
    for (; i < p->ngiven; i++) {
        t[i] = PySequence_GetItem(tensors, i);
        PyObject *a = PySequence_GetItem(ptrs, i);
        if (!t[i] || !a) { Py_XDECREF(a); goto done; }
        given[i] = PyLong_AsUnsignedLongLong(a);
        Py_DECREF(a);
        if (given[i] == (uint64_t)-1 && PyErr_Occurred()) goto done;
    }
    result = plan_run(p, t, given, floats, stream);
done:
    for (int j = 0; j < p->ngiven; j++) Py_XDECREF(t[j]);
    return result;
}

static PyType_Slot plan_slots[] = {
    {Py_tp_new, plan_new},
    {Py_tp_call, plan_call},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, plan_traverse},
    {Py_tp_clear, plan_clear},
    {Py_tp_doc, "A prepared launch: run(tensors, ptrs, floats, stream) (launch.prepare)."},
    {0, NULL},
};
static PyType_Spec plan_spec = {"nvrtc_engine._native_launch.Plan", sizeof(Plan), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, plan_slots};

/* ------------------------------------------------------------------------------ Launcher */

typedef struct {
    PyObject_HEAD
    PyObject *kernel, *types;
} Launcher;

static PyTypeObject *LauncherType = NULL;

/* A call's key, as launch.call_key: (tag, then per tensor dtype, shape, device, contiguous,
 * address % 16); its prepared launch run on the tensors. None when an argument is no tensor
 * of `types` or the key has no prepared launch. */
static PyObject *lookup_run(Launcher *self, PyObject *tag, PyObject *const *t, int n,
                            PyObject *floats, PyObject *stream) {
    uint64_t ptrs[MAX_TENSORS];
    for (int i = 0; i < n; i++) {
        int is = PySet_Contains(self->types, (PyObject *)Py_TYPE(t[i]));
        if (is <= 0) {
            if (is < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    PyObject *key = PyTuple_New(1 + 5 * (Py_ssize_t)n);
    if (!key) return NULL;
    Py_INCREF(tag);
    PyTuple_SetItem(key, 0, tag);
    for (int i = 0; i < n; i++) {
        if (address_of(t[i], &ptrs[i])) goto fail;
        PyObject *v[5];
        v[0] = tensor_read(t[i], DTYPE);
        v[1] = v[0] ? tensor_read(t[i], SHAPE) : NULL;
        v[2] = v[1] ? tensor_read(t[i], GET_DEVICE) : NULL;
        v[3] = v[2] ? tensor_read(t[i], IS_CONTIGUOUS) : NULL;
        v[4] = v[3] ? PyLong_FromLong((long)(ptrs[i] & 15)) : NULL;
        for (int j = 0; j < 5; j++)
            if (v[j]) PyTuple_SetItem(key, 1 + 5 * i + j, v[j]);
        if (!v[4]) goto fail;
    }
    PyObject *table = PyObject_GetAttr(self->kernel, s_prepared);
    if (!table) goto fail;
    /* (a dict subclass, e.g. a test's, may override get) */
    int exact = PyDict_CheckExact(table);
    PyObject *run = exact ? PyDict_GetItemWithError(table, key)
                          : PyObject_CallMethodObjArgs(table, s_get, key, NULL);
    if (run && exact) Py_INCREF(run);
    Py_DECREF(table);
    Py_DECREF(key);
    if (!run) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result;
    if (run == Py_None) {
        result = run;  /* (a table's get that found nothing) */
    } else if (Py_TYPE(run) == PlanType) {
        result = plan_run((Plan *)run, t, ptrs, floats, stream);
        Py_DECREF(run);
    } else {  /* a pure-Python prepared launch */
        PyObject *ts = PyTuple_New(n), *ps = PyTuple_New(n);
        result = NULL;
        if (ts && ps) {
            int ok = 1;
            for (int i = 0; i < n; i++) {
                PyObject *a = PyLong_FromUnsignedLongLong(ptrs[i]);
                if (!a) { ok = 0; break; }
                Py_INCREF(t[i]);
                PyTuple_SetItem(ts, i, t[i]);
                PyTuple_SetItem(ps, i, a);
            }
            if (ok) result = PyObject_CallFunctionObjArgs(run, ts, ps, floats, stream, NULL);
        }
        Py_XDECREF(ts);
        Py_XDECREF(ps);
        Py_DECREF(run);
    }
    return result;
fail:
    Py_DECREF(key);
    return NULL;
}

static PyObject *fast_k(PyObject *self, PyObject *const *args, Py_ssize_t nargs, int k) {
    if (nargs != k + 3) {
        PyErr_Format(PyExc_TypeError, "fast%d takes %d arguments, got %zd", k, k + 3, nargs);
        return NULL;
    }
    return lookup_run((Launcher *)self, args[0], args + 1, k, args[k + 1], args[k + 2]);
}

static PyObject *fast1(PyObject *s, PyObject *const *a, Py_ssize_t n) { return fast_k(s, a, n, 1); }
static PyObject *fast2(PyObject *s, PyObject *const *a, Py_ssize_t n) { return fast_k(s, a, n, 2); }
static PyObject *fast3(PyObject *s, PyObject *const *a, Py_ssize_t n) { return fast_k(s, a, n, 3); }

/* fastn(given, floats, stream, extra=None): the given (not None) arrays' key, tagged with
 * their mask, or (mask, extra) */
static PyObject *fastn(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 4) {
        PyErr_Format(PyExc_TypeError, "fastn takes 3 or 4 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *extra = nargs == 4 ? args[3] : Py_None;
    PyObject *given = args[0];
    Py_ssize_t count = PySequence_Size(given);
    if (count < 0) return NULL;
    if (count > MAX_TENSORS) {
        PyErr_SetString(PyExc_ValueError, "fastn: too many arrays");
        return NULL;
    }
    PyObject *t[MAX_TENSORS];
    int n = 0;
    unsigned long long mask = 0;
    PyObject *result = NULL, *tag = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_GetItem(given, i);
        if (!item) goto done;
        if (item == Py_None) {
            Py_DECREF(item);
            continue;
        }
        mask |= 1ull << i;
        t[n++] = item;
    }
    tag = PyLong_FromUnsignedLongLong(mask);
    if (tag && extra != Py_None) {
        PyObject *pair = PyTuple_Pack(2, tag, extra);
        Py_DECREF(tag);
        tag = pair;
    }
    if (tag) result = lookup_run((Launcher *)self, tag, t, n, args[1], args[2]);
done:
    Py_XDECREF(tag);
    for (int i = 0; i < n; i++) Py_DECREF(t[i]);
    return result;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *kernel, *types;
    if (kw && PyDict_Size(kw)) {
        PyErr_SetString(PyExc_TypeError, "Launcher takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!", &kernel, &PySet_Type, &types)) return NULL;
    allocfunc tp_alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Launcher *self = (Launcher *)tp_alloc(type, 0);
    if (!self) return NULL;
    Py_INCREF(kernel); self->kernel = kernel;
    Py_INCREF(types); self->types = types;
    return (PyObject *)self;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->kernel); Py_VISIT(self->types);
    return 0;
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->kernel); Py_CLEAR(self->types);
    return 0;
}

static PyMethodDef launcher_methods[] = {
    {"fast1", (PyCFunction)(void (*)(void))fast1, METH_FASTCALL,
     "fast1(tag, a, floats, stream): Kernel._fast1"},
    {"fast2", (PyCFunction)(void (*)(void))fast2, METH_FASTCALL,
     "fast2(tag, a, b, floats, stream): Kernel._fast2"},
    {"fast3", (PyCFunction)(void (*)(void))fast3, METH_FASTCALL,
     "fast3(tag, a, b, c, floats, stream): Kernel._fast3"},
    {"fastn", (PyCFunction)(void (*)(void))fastn, METH_FASTCALL,
     "fastn(given, floats, stream, extra=None): Kernel._fastn"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot launcher_slots[] = {
    {Py_tp_new, launcher_new},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, launcher_traverse},
    {Py_tp_clear, launcher_clear},
    {Py_tp_methods, launcher_methods},
    {Py_tp_doc, "Launcher(kernel, torch_types): a kernel's call-key reads, in C."},
    {0, NULL},
};
static PyType_Spec launcher_spec = {"nvrtc_engine._native_launch.Launcher", sizeof(Launcher), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, launcher_slots};

/* -------------------------------------------------------------------------------- module */

/* setup(launch_ex, ctx_get, ctx_set, check, explicit_stream): the driver's
 * cuLaunchKernelEx, cuCtxGetCurrent and cuCtxSetCurrent (addresses) and the Python functions
 * the rare paths call. */
static PyObject *setup(PyObject *module, PyObject *args) {
    unsigned long long launch, get, set;
    PyObject *chk, *explicit;
    (void)module;
    if (!PyArg_ParseTuple(args, "KKKOO", &launch, &get, &set, &chk, &explicit)) return NULL;
    if (!launch || !get || !set) {
        PyErr_SetString(PyExc_ValueError, "setup: a driver function's address is 0");
        return NULL;
    }
    launch_ex = (launch_ex_t)(uintptr_t)launch;
    ctx_get = (ctx_get_t)(uintptr_t)get;
    ctx_set = (ctx_set_t)(uintptr_t)set;
    Py_INCREF(chk); Py_XDECREF(check); check = chk;
    Py_INCREF(explicit); Py_XDECREF(explicit_stream); explicit_stream = explicit;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(launch_ex, ctx_get, ctx_set, check, explicit_stream)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native_launch",
    "The per-call work of nvrtc_engine's prepared launches (see nvrtc_engine.native_launch).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native_launch(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    const char *names[NREADS] = {"data_ptr", "get_device", "is_contiguous", "dtype", "shape"};
    for (int i = 0; i < NREADS; i++)
        if (!(read_names[i] = PyUnicode_InternFromString(names[i]))) goto fail;
    empty_tuple = PyTuple_New(0);
    getset_get = (descrgetfunc)PyType_GetSlot(&PyGetSetDescr_Type, Py_tp_descr_get);
    s_prepared = PyUnicode_InternFromString("_prepared");
    s_get = PyUnicode_InternFromString("get");
    s_launch_name = PyUnicode_InternFromString("cuLaunchKernelEx");
    s_set_name = PyUnicode_InternFromString("cuCtxSetCurrent");
    PlanType = (PyTypeObject *)PyType_FromSpec(&plan_spec);
    LauncherType = (PyTypeObject *)PyType_FromSpec(&launcher_spec);
    if (!empty_tuple || !getset_get ||
        !s_prepared || !s_get || !s_launch_name || !s_set_name || !PlanType || !LauncherType)
        goto fail;
    Py_INCREF(PlanType);
    Py_INCREF(LauncherType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)PlanType) ||
        PyModule_AddObject(m, "Launcher", (PyObject *)LauncherType) ||
        PyModule_AddStringConstant(m, "SOURCE_DIGEST", SOURCE_DIGEST))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
