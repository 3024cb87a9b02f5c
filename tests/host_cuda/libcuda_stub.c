/* A stand-in libcuda.so.1 for CPU tests and the CPU mode of bench/launch_overhead.py.
 *
 * Implements the driver calls nvrtc_engine makes on a launch (device queries, primary
 * context, module loading, cuCtxGetCurrent/SetCurrent, cuLaunchKernel, ...) on fake devices,
 * so that cuda.bindings and ctypes run their real argument conversions with no GPU.
 * By default one sm_90 device of 132 SMs; STUB_CUDA_DEVICES, read when the library is
 * loaded, lists others: compute capabilities with an optional SM count, comma-separated
 * ("90,90" two sm_90 devices, "90:132,80:108" an sm_90 and an sm_80 of 108 SMs; at most
 * STUB_MAX_DEVICES). Device d's primary context is STUB_CONTEXT + d * 0x100; the current
 * context is per thread, as the driver's. A module belongs to the context current when it was
 * loaded, and launching one of its functions in another context fails with
 * CUDA_ERROR_INVALID_HANDLE (400), as on a GPU; launching with no device's context current
 * fails with CUDA_ERROR_INVALID_CONTEXT (201). stub_module_loads[d] and stub_device_launches[d]
 * count module loads and launches per device (atomically: threads may launch at once).
 * cuPointerGetAttribute places a pointer on device 0 unless stub_pointer_device gave its range
 * another device.
 * cuLaunchKernel does nothing but record what it was given: the count of launches, the last
 * function, grid, block, shared memory and stream, and its 8-byte parameter slots
 * (copied at launch, as the driver does): as many as stub_count_params set for the function,
 * else stub_param_count. cuLaunchKernelEx does the same and records whether the launch was a
 * programmatic dependent launch.
 * stub_log keeps the same for the last STUB_LOG launches (stub_launches counts them all; launch
 * n is stub_log[n % STUB_LOG]), and for a function given stub_blob_param the bytes of its one
 * by-value parameter (a struct, up to STUB_BLOB bytes).
 * stub_launch_error / stub_ctx_set_error, when set, make cuLaunchKernel / cuCtxSetCurrent fail
 * with that CUresult.
 * Everything else cuda.bindings asks for through cuGetProcAddress is reported missing.
 *
 * Build: cc -O2 -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stub.c -ldl
 * Load it with ctypes.CDLL(path, RTLD_GLOBAL) before cuda.bindings first opens the driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uintptr_t handle_t;

#define STUB_CONTEXT ((handle_t)0xC0DE0000)
#define STUB_MAX_PARAMS 64
#define STUB_LOG 16
#define STUB_BLOB 4096
#define STUB_MAX_DEVICES 8
#define STUB_MAX_MODULES 16384
#define STUB_FIRST_MODULE ((handle_t)0x10000)

/* What the last launch was given (read from Python through ctypes). */
uint64_t stub_launches = 0;
uint64_t stub_last_grid[3], stub_last_block[3], stub_last_shmem;
handle_t stub_last_function, stub_last_stream;
int stub_param_count = 0;
int stub_last_count = 0;
uint64_t stub_params[STUB_MAX_PARAMS];
uint64_t stub_ctx_set_calls = 0;
int stub_last_dependent = 0; /* the last launch: cuLaunchKernelEx with programmatic serialization */
int stub_launch_error = 0;  /* when non-zero, what cuLaunchKernel returns (launching nothing) */
int stub_ctx_set_error = 0; /* when non-zero, what cuCtxSetCurrent returns */

/* One launch as the log keeps it. */
typedef struct {
    handle_t function, stream;
    uint64_t grid[3], block[3], shmem;
    int dependent, count, blob_bytes;
    uint64_t params[STUB_MAX_PARAMS];
    unsigned char blob[STUB_BLOB];
} stub_record_t;
stub_record_t stub_log[STUB_LOG];
int stub_record_size = sizeof(stub_record_t); /* for the reader's layout check */

uint64_t stub_module_loads[STUB_MAX_DEVICES];
uint64_t stub_device_launches[STUB_MAX_DEVICES];
int stub_device_count = 1;

static int device_major[STUB_MAX_DEVICES] = {9}, device_minor[STUB_MAX_DEVICES] = {0};
static int device_sms[STUB_MAX_DEVICES] = {132};

/* STUB_CUDA_DEVICES (see the top of the file), read once when the library is loaded. */
__attribute__((constructor)) static void read_devices(void) {
    const char *spec = getenv("STUB_CUDA_DEVICES");
    if (!spec || !*spec) return;
    int n = 0;
    for (const char *at = spec;; at++) {
        char *end;
        long cc = strtol(at, &end, 10), sms = 132;
        if (end != at && *end == ':') {
            const char *from = end + 1;
            sms = strtol(from, &end, 10);
            if (end == from) sms = 0;
        }
        if (end == at || cc < 10 || cc > 999 || sms < 1 || n == STUB_MAX_DEVICES ||
            (*end != ',' && *end != 0)) {
            fprintf(stderr, "libcuda stub: bad STUB_CUDA_DEVICES %s (e.g. 90,90 or 90:132,80:108,"
                            " at most %d)\n", spec, STUB_MAX_DEVICES);
            abort();
        }
        device_major[n] = (int)(cc / 10);
        device_minor[n] = (int)(cc % 10);
        device_sms[n++] = (int)sms;
        at = end;
        if (!*at) break;
    }
    stub_device_count = n;
}

static handle_t context_of(int device) { return STUB_CONTEXT + (handle_t)device * 0x100; }

/* The ordinal of the device whose primary context is ctx; -1 for any other handle. */
static int device_of(handle_t ctx) {
    if (ctx < STUB_CONTEXT || (ctx - STUB_CONTEXT) % 0x100) return -1;
    handle_t d = (ctx - STUB_CONTEXT) / 0x100;
    return d < (handle_t)stub_device_count ? (int)d : -1;
}

static handle_t module_context[STUB_MAX_MODULES];
static uint64_t modules_loaded = 0;

/* Pointer ranges [low, high) on devices other than 0 (stub_pointer_device). */
static uint64_t range_low[16], range_high[16];
static int range_device[16], ranges = 0;

void stub_pointer_device(uint64_t low, uint64_t high, int device) {
    if (ranges < 16) {
        range_low[ranges] = low;
        range_high[ranges] = high;
        range_device[ranges++] = device;
    }
}

static __thread handle_t current_ctx = 0;
static handle_t counted_function[256];
static int counted_params[256], counted = 0;
static handle_t blob_function[16];
static int blob_bytes[16], blobs = 0;

/* Launches of function f pass one by-value struct of n bytes: the log keeps its bytes. */
void stub_blob_param(handle_t f, int n) {
    if (n > STUB_BLOB) n = STUB_BLOB;
    for (int i = 0; i < blobs; i++)
        if (blob_function[i] == f) { blob_bytes[i] = n; return; }
    if (blobs < 16) { blob_function[blobs] = f; blob_bytes[blobs++] = n; }
}

/* How many parameter slots launches of function f have (the driver knows; the stub not). */
void stub_count_params(handle_t f, int n) {
    for (int i = 0; i < counted; i++)
        if (counted_function[i] == f) { counted_params[i] = n; return; }
    if (counted < 256) { counted_function[counted] = f; counted_params[counted++] = n; }
}
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuDeviceGetCount(int *count) { *count = stub_device_count; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) {
    *device = ordinal;
    return ordinal >= 0 && ordinal < stub_device_count ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (device < 0 || device >= stub_device_count) return 101;
    switch (attribute) {
    case 75: *value = device_major[device]; break; /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = device_minor[device]; break; /* COMPUTE_CAPABILITY_MINOR */
    case 16: *value = device_sms[device]; break;   /* MULTIPROCESSOR_COUNT */
    default: *value = 0;
    }
    return 0;
}
CUresult cuDeviceGetName(char *name, int length, int device) {
    if (device < 0 || device >= stub_device_count) return 101;
    snprintf(name, (size_t)length, "Stub sm_%d%d device", device_major[device],
             device_minor[device]);
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(handle_t *ctx, int device) {
    if (device < 0 || device >= stub_device_count) return 101;
    *ctx = context_of(device);
    return 0;
}
CUresult cuDevicePrimaryCtxRelease(int device) { return 0; }
CUresult cuCtxGetCurrent(handle_t *ctx) { *ctx = current_ctx; return 0; }
CUresult cuCtxSetCurrent(handle_t ctx) {
    if (stub_ctx_set_error) return stub_ctx_set_error;
    __atomic_fetch_add(&stub_ctx_set_calls, 1, __ATOMIC_RELAXED);
    current_ctx = ctx;
    return 0;
}
CUresult cuCtxGetDevice(int *device) {
    int d = device_of(current_ctx);
    if (d < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    *device = d;
    return 0;
}
CUresult cuCtxSynchronize(void) { return device_of(current_ctx) < 0 ? 201 : 0; }
CUresult cuModuleLoadData(handle_t *module, const void *image) {
    int d = device_of(current_ctx);
    if (d < 0) return 201;
    uint64_t n = __atomic_fetch_add(&modules_loaded, 1, __ATOMIC_RELAXED);
    if (n >= STUB_MAX_MODULES) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    module_context[n] = current_ctx;
    __atomic_fetch_add(&stub_module_loads[d], 1, __ATOMIC_RELAXED);
    *module = STUB_FIRST_MODULE + n;
    return 0;
}
CUresult cuModuleGetFunction(handle_t *function, handle_t module, const char *name) {
    *function = module * 0x100 + (handle_t)(strlen(name) & 0xFF);
    return 0;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, handle_t f, int threads, size_t shmem) {
    *blocks = 2;
    return 0;
}
/* the staged kernels' opt-in to more dynamic shared memory: accepted, nothing recorded */
CUresult cuFuncSetAttribute(handle_t f, int attribute, int value) { return 0; }
CUresult cuPointerGetAttribute(void *data, int attribute, uint64_t ptr) {
    *(int *)data = 0;
    for (int i = 0; i < ranges; i++)
        if (range_low[i] <= ptr && ptr < range_high[i]) *(int *)data = range_device[i];
    return ptr ? 0 : 1;
}
CUresult cuMemsetD8Async(uint64_t ptr, unsigned char value, size_t n, handle_t stream) {
    return device_of(current_ctx) < 0 ? 201 : 0; /* a stream of the current context's */
}
CUresult cuGetErrorString(CUresult error, const char **text) { *text = "stub error"; return 0; }
CUresult cuGetErrorName(CUresult error, const char **text) { *text = "STUB_ERROR"; return 0; }

/* What cuLaunchKernelEx is given (cuda.h's CUlaunchAttribute and CUlaunchConfig). */
typedef struct {
    int id;
    char pad[4];
    union { char pad[64]; int value; long long align; } value;
} stub_attribute_t;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shmem;
    handle_t stream;
    stub_attribute_t *attrs;
    unsigned num_attrs;
} stub_config_t;

static CUresult record(handle_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shmem, handle_t stream, void **params,
                       int dependent) {
    int d = device_of(current_ctx);
    if (d < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    handle_t m = (f >> 8) - STUB_FIRST_MODULE; /* cuModuleGetFunction's handles */
    uint64_t loaded = __atomic_load_n(&modules_loaded, __ATOMIC_RELAXED);
    if ((f >> 8) < STUB_FIRST_MODULE || m >= loaded || m >= STUB_MAX_MODULES ||
        module_context[m] != current_ctx)
        return 400; /* CUDA_ERROR_INVALID_HANDLE: a function of another context's module */
    if (stub_launch_error) return stub_launch_error;
    __atomic_fetch_add(&stub_device_launches[d], 1, __ATOMIC_RELAXED);
    uint64_t at = __atomic_fetch_add(&stub_launches, 1, __ATOMIC_RELAXED);
    stub_record_t *r = &stub_log[at % STUB_LOG];
    stub_last_dependent = r->dependent = dependent;
    stub_last_function = r->function = f;
    stub_last_grid[0] = r->grid[0] = gx; stub_last_grid[1] = r->grid[1] = gy;
    stub_last_grid[2] = r->grid[2] = gz;
    stub_last_block[0] = r->block[0] = bx; stub_last_block[1] = r->block[1] = by;
    stub_last_block[2] = r->block[2] = bz;
    stub_last_shmem = r->shmem = shmem;
    stub_last_stream = r->stream = stream;
    int n = stub_param_count;
    for (int i = 0; i < counted; i++)
        if (counted_function[i] == f) n = counted_params[i];
    stub_last_count = r->count = n < STUB_MAX_PARAMS ? n : STUB_MAX_PARAMS;
    for (int i = 0; i < stub_last_count; i++) {
        memcpy(&stub_params[i], params[i], 8);
        r->params[i] = stub_params[i];
    }
    r->blob_bytes = 0;
    for (int i = 0; i < blobs; i++)
        if (blob_function[i] == f) {
            r->blob_bytes = blob_bytes[i];
            memcpy(r->blob, params[0], (size_t)blob_bytes[i]);
        }
    return 0;
}

/* As cuLaunchKernel, also recording in stub_last_dependent whether the attribute
 * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) was set to non-zero. */
CUresult cuLaunchKernelEx(const stub_config_t *c, handle_t f, void **params, void **extra) {
    int dependent = 0;
    for (unsigned i = 0; i < c->num_attrs; i++)
        if (c->attrs[i].id == 6 && c->attrs[i].value.value) dependent = 1;
    return record(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shmem, c->stream, params,
                  dependent);
}

CUresult cuLaunchKernel(handle_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, handle_t stream, void **params, void **extra) {
    return record(f, gx, gy, gz, bx, by, bz, shmem, stream, params, 0);
}

/* NVRTC opens the driver too and asks for its private export tables: there are none. */
CUresult cuGetExportTable(const void **table, const void *id) {
    *table = NULL;
    return 500; /* CUDA_ERROR_NOT_FOUND */
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    static void *self;
    if (!self) self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *pfn = self ? dlsym(self, symbol) : NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0 && version >= 12000)
        *pfn = (void *)cuGetProcAddress_v2; /* as the driver: from 12.0 on, the _v2 ABI */
    if (status) *status = *pfn ? 0 : 1;
    return *pfn ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
