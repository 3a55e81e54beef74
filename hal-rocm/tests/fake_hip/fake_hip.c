/*
 * A fake HIP runtime for oxccl-hal-rocm's tests: no GPU, host memory stands in for device
 * memory. It is built once per HIP ABI generation, against that generation's real headers
 * (5.7, 6.4, 7.2): each build reports the headers' HIP_VERSION from hipRuntimeGetVersion
 * and takes every enum value, flag and structure in that generation's numbering and
 * layout, refusing the values it does not expect. So oxccl's one binary is checked to
 * speak each generation's ABI once it has picked the generation from the version.
 *
 * It records calls, counts IPC opens and closes per handle, refuses a second open of a
 * handle that is already open (as ROCm does), and fails any call on demand
 * (fakehip_fail). The fakehip_* functions are the tests' control interface.
 *
 * State is per loaded copy of the library: the tests load a private copy per test.
 */
#define _GNU_SOURCE
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_CALLS 64
#define MAX_ATTRS 64
#define MAX_MAPS 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- call recording and failure injection ---------------------------------------- */
struct call_stat {
    char name[64];
    int count;
    int fail_code;  /* 0: succeed */
    int fail_times; /* how many more calls fail; < 0: all */
};
static struct call_stat calls[MAX_CALLS];

static struct call_stat *stat_for(const char *name) {
    for (int i = 0; i < MAX_CALLS; i++) {
        if (calls[i].name[0] == 0) {
            strncpy(calls[i].name, name, sizeof calls[i].name - 1);
            return &calls[i];
        }
        if (strcmp(calls[i].name, name) == 0) return &calls[i];
    }
    return &calls[MAX_CALLS - 1];
}

/* Records a call; returns the injected error, or hipSuccess. */
static hipError_t enter(const char *name) {
    pthread_mutex_lock(&lock);
    struct call_stat *s = stat_for(name);
    s->count++;
    hipError_t rc = hipSuccess;
    if (s->fail_code != 0 && s->fail_times != 0) {
        rc = (hipError_t)s->fail_code;
        if (s->fail_times > 0) s->fail_times--;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#define ENTER()                                   \
    do {                                          \
        hipError_t injected_ = enter(__func__);   \
        if (injected_ != hipSuccess) return injected_; \
    } while (0)

/* ---- devices --------------------------------------------------------------------- */
static int device_count = 2;
static __thread int current_device = 0;
static struct { int attr; int value; } attrs[MAX_ATTRS];
static int n_attrs = 0;

static int attr_default(int attr) {
    switch (attr) {
    case hipDeviceAttributeComputeCapabilityMajor: return 9;
    case hipDeviceAttributeComputeCapabilityMinor: return 4;
    case hipDeviceAttributeMultiprocessorCount: return 304;
    case hipDeviceAttributeVirtualMemoryManagementSupported: return 1;
    case hipDeviceAttributeFineGrainSupport: return 1;
    default: return 0;
    }
}

/* ---- IPC ------------------------------------------------------------------------- */
struct mapping {
    void *ptr;
    uint64_t key;
    int open; /* 1 while open */
};
static struct mapping maps[MAX_MAPS];
static int n_maps = 0;
struct ipc_count { uint64_t key; int opens; int closes; };
static struct ipc_count ipc_counts[MAX_MAPS];
static int n_ipc_counts = 0;
static uint64_t next_ipc_key = 0x1000;
static int live_allocs = 0;

static struct ipc_count *count_for(uint64_t key) {
    for (int i = 0; i < n_ipc_counts; i++)
        if (ipc_counts[i].key == key) return &ipc_counts[i];
    if (n_ipc_counts == MAX_MAPS) return &ipc_counts[MAX_MAPS - 1];
    ipc_counts[n_ipc_counts].key = key;
    return &ipc_counts[n_ipc_counts++];
}

/* ---- launches -------------------------------------------------------------------- */
static size_t last_launch_size = 0;
static unsigned char last_launch_args[256];
static unsigned last_launch_grid = 0;

/* ---- control interface ----------------------------------------------------------- */
void fakehip_set_device_count(int n) { device_count = n; }

static void set_attribute_value(int attr, int value) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_attrs; i++)
        if (attrs[i].attr == attr) { attrs[i].value = value; pthread_mutex_unlock(&lock); return; }
    if (n_attrs < MAX_ATTRS) { attrs[n_attrs].attr = attr; attrs[n_attrs].value = value; n_attrs++; }
    pthread_mutex_unlock(&lock);
}

/* Sets `hipDeviceAttribute<name>`; returns 0 for a name this fake does not know. */
int fakehip_set_attribute(const char *name, int value) {
    static const struct { const char *name; int attr; } known[] = {
        {"ComputeCapabilityMajor", hipDeviceAttributeComputeCapabilityMajor},
        {"ComputeCapabilityMinor", hipDeviceAttributeComputeCapabilityMinor},
        {"MultiprocessorCount", hipDeviceAttributeMultiprocessorCount},
        {"VirtualMemoryManagementSupported", hipDeviceAttributeVirtualMemoryManagementSupported},
        {"FineGrainSupport", hipDeviceAttributeFineGrainSupport},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(known[i].name, name) == 0) {
            set_attribute_value(known[i].attr, value);
            return 1;
        }
    }
    return 0;
}

/* The headers' value of the hipError_t called `name`; -1 for one this fake does not know. */
int fakehip_error_code(const char *name) {
    static const struct { const char *name; int code; } known[] = {
        {"hipErrorInvalidValue", hipErrorInvalidValue},
        {"hipErrorOutOfMemory", hipErrorOutOfMemory},
        {"hipErrorNoDevice", hipErrorNoDevice},
        {"hipErrorInvalidDevice", hipErrorInvalidDevice},
        {"hipErrorInvalidHandle", hipErrorInvalidHandle},
        {"hipErrorNotFound", hipErrorNotFound},
        {"hipErrorNotSupported", hipErrorNotSupported},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(known[i].name, name) == 0) return known[i].code;
    return -1;
}

/* The next `times` calls of `name` (times < 0: all) return `code`. */
void fakehip_fail(const char *name, int code, int times) {
    pthread_mutex_lock(&lock);
    struct call_stat *s = stat_for(name);
    s->fail_code = code;
    s->fail_times = times;
    pthread_mutex_unlock(&lock);
}

int fakehip_calls(const char *name) {
    pthread_mutex_lock(&lock);
    int n = stat_for(name)->count;
    pthread_mutex_unlock(&lock);
    return n;
}

int fakehip_ipc_opens(uint64_t key) { return count_for(key)->opens; }
int fakehip_ipc_closes(uint64_t key) { return count_for(key)->closes; }
int fakehip_live_allocs(void) { return live_allocs; }
size_t fakehip_last_launch_size(void) { return last_launch_size; }
const unsigned char *fakehip_last_launch_args(void) { return last_launch_args; }
unsigned fakehip_last_launch_grid(void) { return last_launch_grid; }

/* ---- the HIP API ----------------------------------------------------------------- */
const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorAlreadyMapped: return "hipErrorAlreadyMapped";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorPeerAccessAlreadyEnabled: return "hipErrorPeerAccessAlreadyEnabled";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "fake: invalid argument";
    case hipErrorOutOfMemory: return "fake: out of memory";
    case hipErrorAlreadyMapped: return "fake: handle already open in this process";
    case hipErrorNotFound: return "fake: named symbol not found";
    default: return "fake: unknown error";
    }
}

static int runtime_version = HIP_VERSION;
void fakehip_set_version(int v) { runtime_version = v; }
int fakehip_header_version(void) { return HIP_VERSION; }

hipError_t hipRuntimeGetVersion(int *v) { ENTER(); *v = runtime_version; return hipSuccess; }

hipError_t hipGetDeviceCount(int *n) {
    ENTER();
    *n = device_count;
    return device_count == 0 ? hipErrorNoDevice : hipSuccess;
}

hipError_t hipSetDevice(int d) {
    ENTER();
    if (d < 0 || d >= device_count) return hipErrorInvalidDevice;
    current_device = d;
    return hipSuccess;
}

hipError_t hipGetDevice(int *d) { ENTER(); *d = current_device; return hipSuccess; }

hipError_t hipDeviceGetAttribute(int *v, hipDeviceAttribute_t attr, int d) {
    ENTER();
    if (d < 0 || d >= device_count) return hipErrorInvalidDevice;
    *v = attr_default((int)attr);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_attrs; i++)
        if (attrs[i].attr == (int)attr) *v = attrs[i].value;
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

hipError_t hipDeviceGetName(char *name, int len, hipDevice_t d) {
    ENTER();
    if (len <= 0) return hipErrorInvalidValue;
    strncpy(name, "Fake AMD Instinct MI300X", (size_t)len - 1);
    name[len - 1] = 0;
    (void)d;
    return hipSuccess;
}

hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t d) {
    ENTER();
    (void)d;
    *bytes = (size_t)192 << 30;
    return hipSuccess;
}

hipError_t hipDeviceCanAccessPeer(int *can, int d, int peer) {
    ENTER();
    *can = d != peer && peer >= 0 && peer < device_count;
    return hipSuccess;
}

hipError_t hipDeviceEnablePeerAccess(int peer, unsigned int flags) {
    ENTER();
    (void)peer; (void)flags;
    return hipSuccess;
}

hipError_t hipDeviceSynchronize(void) { ENTER(); return hipSuccess; }

static void *fake_alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (p) __atomic_add_fetch(&live_allocs, 1, __ATOMIC_SEQ_CST);
    return p;
}
static void fake_free(void *p) {
    if (p) { free(p); __atomic_sub_fetch(&live_allocs, 1, __ATOMIC_SEQ_CST); }
}

hipError_t hipMalloc(void **p, size_t n) {
    ENTER();
    *p = fake_alloc(n);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipExtMallocWithFlags(void **p, size_t n, unsigned int flags) {
    ENTER();
    if (flags != hipDeviceMallocFinegrained && flags != hipDeviceMallocUncached && flags != 0)
        return hipErrorInvalidValue;
    *p = fake_alloc(n);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipFree(void *p) { ENTER(); fake_free(p); return hipSuccess; }

hipError_t hipHostMalloc(void **p, size_t n, unsigned int flags) {
    ENTER();
    if (flags != (hipHostMallocMapped | hipHostMallocPortable | hipHostMallocCoherent))
        return hipErrorInvalidValue;
    *p = fake_alloc(n);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipHostFree(void *p) { ENTER(); fake_free(p); return hipSuccess; }

hipError_t hipHostGetDevicePointer(void **d, void *h, unsigned int flags) {
    ENTER();
    (void)flags;
    *d = h; /* host memory is its own device address here */
    return hipSuccess;
}

/* The properties oxccl asks for: pinned device memory exportable as a POSIX FD (7.x
 * reaches requestedHandleType through an anonymous union; C spells it the same). */
static int valid_prop(const hipMemAllocationProp *prop) {
    return prop->type == hipMemAllocationTypePinned &&
           prop->requestedHandleType == hipMemHandleTypePosixFileDescriptor &&
           prop->location.type == hipMemLocationTypeDevice && prop->location.id >= 0 &&
           prop->location.id < device_count;
}

hipError_t hipMemGetAllocationGranularity(size_t *g, const hipMemAllocationProp *prop,
                                          hipMemAllocationGranularity_flags option) {
    ENTER();
    if (option != hipMemAllocationGranularityMinimum || !valid_prop(prop)) return hipErrorInvalidValue;
    *g = 2u << 20;
    return hipSuccess;
}

/* A VMM "handle" is a heap block holding its size; the mapping is the block itself. */
struct vmm { size_t size; void *mem; };

hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *h, size_t size,
                        const hipMemAllocationProp *prop, unsigned long long flags) {
    ENTER();
    if (flags != 0 || !valid_prop(prop)) return hipErrorInvalidValue;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return hipErrorOutOfMemory;
    v->size = size;
    v->mem = fake_alloc(size);
    *h = (hipMemGenericAllocationHandle_t)v;
    return hipSuccess;
}

hipError_t hipMemRelease(hipMemGenericAllocationHandle_t h) {
    ENTER();
    struct vmm *v = (struct vmm *)h;
    fake_free(v->mem);
    free(v);
    return hipSuccess;
}

static char reserved_range[64 << 20];

hipError_t hipMemAddressReserve(void **p, size_t size, size_t align, void *addr,
                                unsigned long long flags) {
    ENTER();
    (void)align; (void)addr; (void)flags;
    if (size > sizeof reserved_range) return hipErrorOutOfMemory;
    *p = reserved_range;
    return hipSuccess;
}

hipError_t hipMemAddressFree(void *p, size_t size) { ENTER(); (void)p; (void)size; return hipSuccess; }

hipError_t hipMemMap(void *p, size_t size, size_t offset, hipMemGenericAllocationHandle_t h,
                     unsigned long long flags) {
    ENTER();
    (void)p; (void)offset; (void)flags;
    return ((struct vmm *)h)->size == size ? hipSuccess : hipErrorInvalidValue;
}

hipError_t hipMemUnmap(void *p, size_t size) { ENTER(); (void)p; (void)size; return hipSuccess; }

hipError_t hipMemSetAccess(void *p, size_t size, const hipMemAccessDesc *desc, size_t count) {
    ENTER();
    (void)p; (void)size;
    if (count != 1 || desc->flags != hipMemAccessFlagsProtReadWrite ||
        desc->location.type != hipMemLocationTypeDevice)
        return hipErrorInvalidValue;
    return hipSuccess;
}

/* Exports a memfd of the allocation's size: the importer learns the size from it. */
hipError_t hipMemExportToShareableHandle(void *out, hipMemGenericAllocationHandle_t h,
                                         hipMemAllocationHandleType type, unsigned long long flags) {
    ENTER();
    if (type != hipMemHandleTypePosixFileDescriptor || flags != 0) return hipErrorInvalidValue;
    int fd = memfd_create("fakehip-vmm", MFD_CLOEXEC);
    if (fd < 0) return hipErrorOutOfMemory;
    if (ftruncate(fd, (off_t)((struct vmm *)h)->size) != 0) { close(fd); return hipErrorOutOfMemory; }
    *(int *)out = fd;
    return hipSuccess;
}

hipError_t hipMemImportFromShareableHandle(hipMemGenericAllocationHandle_t *h, void *os,
                                           hipMemAllocationHandleType type) {
    ENTER();
    if (type != hipMemHandleTypePosixFileDescriptor) return hipErrorInvalidValue;
    struct stat st;
    if (fstat((int)(intptr_t)os, &st) != 0) return hipErrorInvalidValue;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return hipErrorOutOfMemory;
    v->size = (size_t)st.st_size;
    v->mem = fake_alloc(v->size);
    *h = (hipMemGenericAllocationHandle_t)v;
    return hipSuccess;
}

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *p) {
    ENTER();
    memset(handle, 0, sizeof *handle);
    pthread_mutex_lock(&lock);
    uint64_t key = next_ipc_key++;
    pthread_mutex_unlock(&lock);
    memcpy(handle->reserved, &key, sizeof key);
    memcpy(handle->reserved + 8, &p, sizeof p);
    return hipSuccess;
}

hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t handle, unsigned int flags) {
    ENTER();
    if (flags != hipIpcMemLazyEnablePeerAccess) return hipErrorInvalidValue;
    uint64_t key;
    memcpy(&key, handle.reserved, sizeof key);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_maps; i++) {
        if (maps[i].open && maps[i].key == key) {
            pthread_mutex_unlock(&lock);
            return hipErrorAlreadyMapped; /* ROCm refuses a second open */
        }
    }
    if (n_maps == MAX_MAPS) { pthread_mutex_unlock(&lock); return hipErrorOutOfMemory; }
    void *mem = fake_alloc(4096);
    maps[n_maps].ptr = mem;
    maps[n_maps].key = key;
    maps[n_maps].open = 1;
    n_maps++;
    count_for(key)->opens++;
    pthread_mutex_unlock(&lock);
    *p = mem;
    return hipSuccess;
}

hipError_t hipIpcCloseMemHandle(void *p) {
    ENTER();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_maps; i++) {
        if (maps[i].open && maps[i].ptr == p) {
            maps[i].open = 0;
            count_for(maps[i].key)->closes++;
            pthread_mutex_unlock(&lock);
            fake_free(p);
            return hipSuccess;
        }
    }
    pthread_mutex_unlock(&lock);
    return hipErrorInvalidValue;
}

struct fake_stream { int capturing; };
void fakehip_set_capturing(hipStream_t s, int on) { ((struct fake_stream *)s)->capturing = on; }

hipError_t hipStreamCreateWithFlags(hipStream_t *s, unsigned int flags) {
    ENTER();
    if (flags != hipStreamNonBlocking) return hipErrorInvalidValue;
    *s = (hipStream_t)calloc(1, sizeof(struct fake_stream));
    return *s ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipStreamDestroy(hipStream_t s) { ENTER(); free(s); return hipSuccess; }
hipError_t hipStreamSynchronize(hipStream_t s) { ENTER(); (void)s; return hipSuccess; }

hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t e, unsigned int flags) {
    ENTER();
    (void)s; (void)e; (void)flags;
    return hipSuccess;
}

hipError_t hipStreamIsCapturing(hipStream_t s, hipStreamCaptureStatus *status) {
    ENTER();
    *status = ((struct fake_stream *)s)->capturing ? hipStreamCaptureStatusActive
                                                   : hipStreamCaptureStatusNone;
    return hipSuccess;
}

struct fake_event { float t_ms; };
static float clock_ms = 0;

hipError_t hipEventCreateWithFlags(hipEvent_t *e, unsigned flags) {
    ENTER();
    if (flags != hipEventDefault) return hipErrorInvalidValue;
    *e = (hipEvent_t)calloc(1, sizeof(struct fake_event));
    return *e ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipEventDestroy(hipEvent_t e) { ENTER(); free(e); return hipSuccess; }

hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) {
    ENTER();
    (void)s;
    clock_ms += 1.5f; /* each record is 1.5 ms after the previous one */
    ((struct fake_event *)e)->t_ms = clock_ms;
    return hipSuccess;
}

hipError_t hipEventSynchronize(hipEvent_t e) { ENTER(); (void)e; return hipSuccess; }

hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop) {
    ENTER();
    *ms = ((struct fake_event *)stop)->t_ms - ((struct fake_event *)start)->t_ms;
    return hipSuccess;
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind kind, hipStream_t s) {
    ENTER();
    (void)s;
    if (kind != hipMemcpyHostToDevice && kind != hipMemcpyDeviceToHost && kind != hipMemcpyDefault)
        return hipErrorInvalidValue;
    memmove(dst, src, n);
    return hipSuccess;
}

hipError_t hipMemsetD8Async(hipDeviceptr_t dst, unsigned char v, size_t n, hipStream_t s) {
    ENTER();
    (void)s;
    memset(dst, v, n);
    return hipSuccess;
}

/* A module is the image pointer; a function is a heap copy of its name. */
hipError_t hipModuleLoadData(hipModule_t *m, const void *image) {
    ENTER();
    *m = (hipModule_t)image;
    return hipSuccess;
}

hipError_t hipModuleUnload(hipModule_t m) { ENTER(); (void)m; return hipSuccess; }

hipError_t hipModuleGetFunction(hipFunction_t *f, hipModule_t m, const char *name) {
    ENTER();
    (void)m;
    if (strncmp(name, "oxccl_", 6) != 0) return hipErrorNotFound;
    static char names[16][64];
    static int n = 0;
    pthread_mutex_lock(&lock);
    int i = n < 16 ? n++ : 15;
    strncpy(names[i], name, 63);
    pthread_mutex_unlock(&lock);
    *f = (hipFunction_t)names[i];
    return hipSuccess;
}

hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
                                 unsigned int bx, unsigned int by, unsigned int bz,
                                 unsigned int shared, hipStream_t s, void **params, void **extra) {
    ENTER();
    (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s;
    /* oxccl passes its argument block through `extra`, checked against the headers. */
    if (params != NULL || extra == NULL) return hipErrorInvalidValue;
    if (extra[0] != HIP_LAUNCH_PARAM_BUFFER_POINTER || extra[2] != HIP_LAUNCH_PARAM_BUFFER_SIZE ||
        extra[4] != HIP_LAUNCH_PARAM_END)
        return hipErrorInvalidValue;
    size_t n = *(size_t *)extra[3];
    if (n > sizeof last_launch_args) return hipErrorInvalidValue;
    memcpy(last_launch_args, extra[1], n);
    last_launch_size = n;
    last_launch_grid = gx;
    return hipSuccess;
}
