/*
 * fake_cuda.c: a CUDA driver test double for reshard's tests. TEST-ONLY,
 * NEVER SHIPPED. tests/fake-cuda/build.sh compiles it into libcuda.so and
 * libcuda.so.1 (Linux) and cuda.dll and nvcuda.dll (Windows, run under
 * Wine); the tests put that folder first on the library search path of the
 * reshard process they start (LD_LIBRARY_PATH, or PATH under Wine), so
 * cudarc's dynamic loading finds this library instead of a driver.
 *
 * It exports the driver API entry points that cudarc 0.19 resolves for the
 * calls reshard makes (cudarc resolves each symbol lazily, on its first
 * call; a missing one panics), with "device memory" in host memory. Copies
 * are synchronous memcpy; streams and events are handles that are always
 * complete. A copy must lie inside one allocation (else
 * CUDA_ERROR_INVALID_VALUE), so an out-of-bounds copy in reshard fails here.
 *
 * Configuration, read once from the environment (sizes are plain bytes):
 *
 *   FAKE_CUDA_DEVICES=N          devices reported (default 1)
 *   FAKE_CUDA_NAME=TEXT          device name (default "reshard fake CUDA device")
 *   FAKE_CUDA_TOTAL_MEM=BYTES    dedicated memory, cuDeviceTotalMem (default 1 GiB)
 *   FAKE_CUDA_FREE_MEM=BYTES     free dedicated memory before any allocation,
 *                                cuMemGetInfo (default: the total); free is
 *                                this less the bytes allocated, never below 0
 *   FAKE_CUDA_SYSMEM_FALLBACK=1  an allocation past the free memory succeeds
 *                                (NVIDIA's System Memory Fallback); without it
 *                                such an allocation is CUDA_ERROR_OUT_OF_MEMORY
 *   FAKE_CUDA_DRIVER_VERSION=N   cuDriverGetVersion, 1000*major + 10*minor
 *                                (default 12080, CUDA 12.8)
 *   FAKE_CUDA_MEMORY_POOLS=0|1   CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
 *                                (default 1: cudarc allocates with
 *                                cuMemAllocAsync; 0: cuMemAlloc_v2)
 *   FAKE_CUDA_PINNED_FAIL=1      cuMemHostAlloc fails (out of memory)
 *
 * Faults (N counts from 1):
 *
 *   FAKE_CUDA_OOM_AT_ALLOC=N     the Nth device allocation is out of memory
 *   FAKE_CUDA_OOM_PAST=BYTES     an allocation that would hold more than
 *                                BYTES in total is out of memory
 *   FAKE_CUDA_FAIL_COPY=N        the Nth host-to-device copy fails
 *                                (CUDA_ERROR_ILLEGAL_ADDRESS)
 *   FAKE_CUDA_CORRUPT_COPY=N     the Nth host-to-device copy succeeds but
 *                                flips every bit of its last byte on the device
 *   FAKE_CUDA_VANISH_AT_COPY=N   from the Nth host-to-device copy on, every
 *                                call (but cuGetErrorString/Name) returns
 *                                CUDA_ERROR_DEVICE_UNAVAILABLE: the device
 *                                fell off the bus mid-load
 *
 * build.sh also builds OUTDIR/lacking/, the same library without
 * cuDeviceGetName: a driver that loads but lacks an entry point.
 *
 * Call log: FAKE_CUDA_LOG=PATH appends one line per call, the entry point's
 * name, so a test can show which driver calls a run made.
 *
 * Commit: on Linux "device memory" is a shared anonymous mapping, which
 * VmData and RLIMIT_DATA do not count, as they do not count a real GPU's
 * memory; pinned host memory (cuMemHostAlloc) is malloc, which they do. On
 * Windows both are private memory, charged, as WDDM charges device memory.
 *
 * Single-threaded use is assumed (reshard drives the device from one thread).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define EXPORT __declspec(dllexport)
#else
#include <sys/mman.h>
#define EXPORT __attribute__((visibility("default")))
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_UNKNOWN = 999,
};

#define ATTR_MEMORY_POOLS_SUPPORTED 115

static struct {
    int loaded;
    long long devices;
    const char *name;
    unsigned long long total, free_at_start, oom_past;
    int fallback, version, pools, pinned_fail;
    long long oom_at_alloc, fail_copy, corrupt_copy, vanish_at_copy;
    FILE *log;
} cfg;

static struct {
    int initialized;
    int vanished;
    long long allocs, copies;
    unsigned long long held;
    CUcontext current;
} st;

/* One live device allocation. */
struct alloc {
    unsigned char *ptr;
    size_t len;
    struct alloc *next;
};
static struct alloc *allocs;

static char contexts[16]; /* one primary context per device: &contexts[dev] */

static unsigned long long env_u64(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void load_config(void)
{
    if (cfg.loaded)
        return;
    cfg.loaded = 1;
    cfg.devices = (long long)env_u64("FAKE_CUDA_DEVICES", 1);
    if (cfg.devices > (long long)sizeof contexts)
        cfg.devices = sizeof contexts;
    cfg.name = getenv("FAKE_CUDA_NAME");
    if (!cfg.name || !*cfg.name)
        cfg.name = "reshard fake CUDA device";
    cfg.total = env_u64("FAKE_CUDA_TOTAL_MEM", 1ULL << 30);
    cfg.free_at_start = env_u64("FAKE_CUDA_FREE_MEM", cfg.total);
    cfg.oom_past = env_u64("FAKE_CUDA_OOM_PAST", 0);
    cfg.fallback = (int)env_u64("FAKE_CUDA_SYSMEM_FALLBACK", 0);
    cfg.version = (int)env_u64("FAKE_CUDA_DRIVER_VERSION", 12080);
    cfg.pools = (int)env_u64("FAKE_CUDA_MEMORY_POOLS", 1);
    cfg.pinned_fail = (int)env_u64("FAKE_CUDA_PINNED_FAIL", 0);
    cfg.oom_at_alloc = (long long)env_u64("FAKE_CUDA_OOM_AT_ALLOC", 0);
    cfg.fail_copy = (long long)env_u64("FAKE_CUDA_FAIL_COPY", 0);
    cfg.corrupt_copy = (long long)env_u64("FAKE_CUDA_CORRUPT_COPY", 0);
    cfg.vanish_at_copy = (long long)env_u64("FAKE_CUDA_VANISH_AT_COPY", 0);
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log && *log)
        cfg.log = fopen(log, "a");
}

/* Every entry point starts here: logs the call, and fails it once the
 * device has vanished. */
#define ENTER()                                         \
    do {                                                \
        load_config();                                  \
        if (cfg.log) {                                  \
            fprintf(cfg.log, "%s\n", __func__);         \
            fflush(cfg.log);                            \
        }                                               \
        if (st.vanished)                                \
            return CUDA_ERROR_DEVICE_UNAVAILABLE;       \
    } while (0)

#define NEED_INIT()                                     \
    do {                                                \
        if (!st.initialized)                            \
            return CUDA_ERROR_NOT_INITIALIZED;          \
    } while (0)

static int valid_device(CUdevice dev)
{
    return dev >= 0 && dev < cfg.devices;
}

/* The allocation that holds [ptr, ptr + len), or NULL. */
static struct alloc *find(CUdeviceptr ptr, size_t len)
{
    for (struct alloc *a = allocs; a; a = a->next) {
        uintptr_t base = (uintptr_t)a->ptr;
        if (ptr >= base && ptr - base <= a->len && len <= a->len - (ptr - base))
            return a;
    }
    return NULL;
}

/* ---- initialization, version, devices ---------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    ENTER();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    st.initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    ENTER();
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = cfg.version;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    ENTER();
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)cfg.devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    ENTER();
    NEED_INIT();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

/* Built without it (-DFAKE_CUDA_LACK_NAME), the library is a driver that
 * lacks an entry point reshard needs, for the test of that message. */
#ifndef FAKE_CUDA_LACK_NAME
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    ENTER();
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", cfg.name);
    return CUDA_SUCCESS;
}
#endif

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER();
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)cfg.total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    ENTER();
    NEED_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute == ATTR_MEMORY_POOLS_SUPPORTED ? cfg.pools : 0;
    return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------ */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    ENTER();
    NEED_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER();
    NEED_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    ENTER();
    NEED_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = st.current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    ENTER();
    NEED_INIT();
    st.current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER();
    NEED_INIT();
    return st.current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- memory -------------------------------------------------------------- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ENTER();
    NEED_INIT();
    if (!st.current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = (size_t)(st.held >= cfg.free_at_start ? 0 : cfg.free_at_start - st.held);
    *total_bytes = (size_t)cfg.total;
    return CUDA_SUCCESS;
}

/* Device memory (see "Commit" above); a zero-length allocation still gets
 * a distinct pointer. */
static unsigned char *device_map(size_t len)
{
#ifdef _WIN32
    return malloc(len ? len : 1);
#else
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#endif
}

static void device_unmap(unsigned char *mem, size_t len)
{
    if (!mem)
        return;
#ifdef _WIN32
    (void)len;
    free(mem);
#else
    munmap(mem, len ? len : 1);
#endif
}

static CUresult device_alloc(CUdeviceptr *ptr, size_t len)
{
    if (!st.current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ptr)
        return CUDA_ERROR_INVALID_VALUE;
    st.allocs++;
    if (cfg.oom_at_alloc && st.allocs == cfg.oom_at_alloc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (cfg.oom_past && st.held + len > cfg.oom_past)
        return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long free_now = st.held >= cfg.free_at_start ? 0 : cfg.free_at_start - st.held;
    if (len > free_now && !cfg.fallback)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = malloc(sizeof *a);
    unsigned char *mem = device_map(len);
    if (!a || !mem) {
        free(a);
        device_unmap(mem, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ptr = mem;
    a->len = len;
    a->next = allocs;
    allocs = a;
    st.held += len;
    *ptr = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

static CUresult device_free(CUdeviceptr ptr)
{
    for (struct alloc **p = &allocs; *p; p = &(*p)->next) {
        struct alloc *a = *p;
        if ((uintptr_t)a->ptr == ptr) {
            *p = a->next;
            st.held -= a->len;
            device_unmap(a->ptr, a->len);
            free(a);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t len)
{
    ENTER();
    NEED_INIT();
    return device_alloc(ptr, len);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t len, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    if (!cfg.pools)
        return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(ptr, len);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    ENTER();
    NEED_INIT();
    return device_free(ptr);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    return device_free(ptr);
}

EXPORT CUresult cuMemHostAlloc(void **ptr, size_t len, unsigned int flags)
{
    ENTER();
    NEED_INIT();
    (void)flags;
    if (!st.current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (cfg.pinned_fail)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Page-aligned, as the driver's pinned memory is. */
    void *mem = malloc(len + 4096);
    if (!mem)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t aligned = ((uintptr_t)mem + 4096) & ~(uintptr_t)4095;
    ((void **)aligned)[-1] = mem;
    *ptr = (void *)aligned;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *ptr)
{
    ENTER();
    NEED_INIT();
    if (!ptr)
        return CUDA_ERROR_INVALID_VALUE;
    free(((void **)ptr)[-1]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    if (!find(dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dst, value, n);
    return CUDA_SUCCESS;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n)
{
    if (!src || !find(dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    st.copies++;
    if (cfg.vanish_at_copy && st.copies >= cfg.vanish_at_copy) {
        st.vanished = 1;
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    if (cfg.fail_copy && st.copies == cfg.fail_copy)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    memcpy((void *)(uintptr_t)dst, src, n);
    if (cfg.corrupt_copy && st.copies == cfg.corrupt_copy && n > 0)
        ((unsigned char *)(uintptr_t)dst)[n - 1] ^= 0xFF;
    return CUDA_SUCCESS;
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n)
{
    if (!dst || !find(src, n))
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER();
    NEED_INIT();
    return htod(dst, src, n);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    return htod(dst, src, n);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    ENTER();
    NEED_INIT();
    return dtoh(dst, src, n);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    return dtoh(dst, src, n);
}

/* ---- streams and events: always complete ---------------------------------- */

EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    ENTER();
    NEED_INIT();
    (void)flags;
    if (!stream)
        return CUDA_ERROR_INVALID_VALUE;
    *stream = malloc(1);
    return *stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    ENTER();
    NEED_INIT();
    free(stream);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    (void)flags;
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    ENTER();
    NEED_INIT();
    (void)flags;
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    *event = malloc(1);
    return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    ENTER();
    NEED_INIT();
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    ENTER();
    NEED_INIT();
    (void)stream;
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventSynchronize(CUevent event)
{
    ENTER();
    NEED_INIT();
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventQuery(CUevent event)
{
    ENTER();
    NEED_INIT();
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- errors: answered even after the device vanished ---------------------- */

static const char *error_text(CUresult e, int name)
{
    switch (e) {
    case CUDA_SUCCESS: return name ? "CUDA_SUCCESS" : "no error";
    case CUDA_ERROR_INVALID_VALUE: return name ? "CUDA_ERROR_INVALID_VALUE" : "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return name ? "CUDA_ERROR_OUT_OF_MEMORY" : "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return name ? "CUDA_ERROR_NOT_INITIALIZED" : "initialization error";
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return name ? "CUDA_ERROR_DEVICE_UNAVAILABLE" : "CUDA-capable device(s) is/are busy or unavailable";
    case CUDA_ERROR_NO_DEVICE: return name ? "CUDA_ERROR_NO_DEVICE" : "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return name ? "CUDA_ERROR_INVALID_DEVICE" : "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return name ? "CUDA_ERROR_INVALID_CONTEXT" : "invalid device context";
    case CUDA_ERROR_INVALID_HANDLE: return name ? "CUDA_ERROR_INVALID_HANDLE" : "invalid resource handle";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return name ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "an illegal memory access was encountered";
    case CUDA_ERROR_UNKNOWN: return name ? "CUDA_ERROR_UNKNOWN" : "unknown error";
    default: return NULL;
    }
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text)
{
    load_config();
    if (cfg.log) {
        fprintf(cfg.log, "cuGetErrorString\n");
        fflush(cfg.log);
    }
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    *text = error_text(error, 0);
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **text)
{
    load_config();
    if (cfg.log) {
        fprintf(cfg.log, "cuGetErrorName\n");
        fflush(cfg.log);
    }
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    *text = error_text(error, 1);
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
