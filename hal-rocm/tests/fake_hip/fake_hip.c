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
 * It keeps a table of the memory it hands out (range, device, buffer id), which
 * hipMemGetAddressRange and hipPointerGetAttribute answer from as ROCm's runtime answers
 * from its own. A legacy IPC handle names the block and the offset of the pointer it was
 * made from (as ROCm's does), and opening it maps that very block at that offset: an
 * importer in the test process reads and writes the exporter's bytes.
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

/* ---- allocations ----------------------------------------------------------------- */
/* Every block handed out (hipMalloc, hipExtMallocWithFlags, hipHostMalloc) and every VMM
 * mapping (hipMemMap). A freed block stays in the table, not live, and the next allocation
 * of its kind and size gets it back at the same address with a new buffer id (a runtime may
 * reuse an address), so tests can free and allocate again at one address for certain. */
#define MAX_ALLOCS 4096
enum { ALLOC_DEVICE = 1, ALLOC_HOST, ALLOC_VMM };
struct alloc {
    char *base;
    size_t size;
    uint32_t id; /* HIP_POINTER_ATTRIBUTE_BUFFER_ID: never given twice */
    int device;
    int kind;
    int managed; /* set by fakehip_set_managed */
    int live;
};
static struct alloc allocs[MAX_ALLOCS];
static int n_allocs = 0;
static uint32_t next_buffer_id = 1;
static int live_allocs = 0;

/* The live entry whose range holds `p` (the caller holds the lock). */
static struct alloc *alloc_holding(const void *p) {
    const char *c = p;
    for (int i = 0; i < n_allocs; i++)
        if (allocs[i].live && c >= allocs[i].base && c < allocs[i].base + allocs[i].size)
            return &allocs[i];
    return NULL;
}

/* A table entry for `size` bytes of `kind` at `base` on `device`, with a fresh buffer id;
 * `base` NULL reuses a freed block of that kind and size, or allocates one. The caller
 * holds the lock. */
static struct alloc *enter_alloc(char *base, size_t size, int kind, int device) {
    struct alloc *a = NULL;
    for (int i = 0; i < n_allocs && !a; i++)
        if (!allocs[i].live && allocs[i].kind == kind &&
            (base ? kind == ALLOC_VMM : allocs[i].size == size))
            a = &allocs[i];
    if (!a) {
        if (n_allocs == MAX_ALLOCS) return NULL;
        a = &allocs[n_allocs];
        a->base = NULL;
    }
    if (base) {
        a->base = base;
    } else if (a->base) {
        memset(a->base, 0, size);
    } else {
        a->base = calloc(1, size ? size : 1);
        if (!a->base) return NULL;
    }
    if (a == &allocs[n_allocs]) n_allocs++;
    a->size = size;
    a->kind = kind;
    a->device = device;
    a->id = next_buffer_id++;
    a->managed = 0;
    a->live = 1;
    return a;
}

static void *tracked_alloc(size_t n, int kind) {
    pthread_mutex_lock(&lock);
    struct alloc *a = enter_alloc(NULL, n, kind, current_device);
    if (a) live_allocs++;
    pthread_mutex_unlock(&lock);
    return a ? a->base : NULL;
}

static hipError_t tracked_free(void *p, int kind) {
    if (!p) return hipSuccess;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_allocs; i++) {
        if (allocs[i].live && allocs[i].kind == kind && allocs[i].base == p) {
            allocs[i].live = 0;
            live_allocs--;
            pthread_mutex_unlock(&lock);
            return hipSuccess;
        }
    }
    pthread_mutex_unlock(&lock);
    return hipErrorInvalidValue;
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
int fakehip_live_allocs(void) {
    pthread_mutex_lock(&lock);
    int n = live_allocs;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Makes the block holding `p` report itself as managed device memory (as CUDA reports
 * cudaMallocManaged memory; ROCm reports hipMallocManaged memory as host memory). Returns 0
 * when no block holds `p`. */
int fakehip_set_managed(void *p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = alloc_holding(p);
    if (a) a->managed = 1;
    pthread_mutex_unlock(&lock);
    return a != NULL;
}
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

/* Backing of VMM handles: counted as live, outside the table (a mapping enters it). */
static void *fake_alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (p) {
        pthread_mutex_lock(&lock);
        live_allocs++;
        pthread_mutex_unlock(&lock);
    }
    return p;
}
static void fake_free(void *p) {
    if (!p) return;
    free(p);
    pthread_mutex_lock(&lock);
    live_allocs--;
    pthread_mutex_unlock(&lock);
}

hipError_t hipMalloc(void **p, size_t n) {
    ENTER();
    *p = tracked_alloc(n, ALLOC_DEVICE);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipExtMallocWithFlags(void **p, size_t n, unsigned int flags) {
    ENTER();
    if (flags != hipDeviceMallocFinegrained && flags != hipDeviceMallocUncached && flags != 0)
        return hipErrorInvalidValue;
    *p = tracked_alloc(n, ALLOC_DEVICE);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipFree(void *p) { ENTER(); return tracked_free(p, ALLOC_DEVICE); }

hipError_t hipHostMalloc(void **p, size_t n, unsigned int flags) {
    ENTER();
    if (flags != (hipHostMallocMapped | hipHostMallocPortable | hipHostMallocCoherent))
        return hipErrorInvalidValue;
    *p = tracked_alloc(n, ALLOC_HOST);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipHostFree(void *p) { ENTER(); return tracked_free(p, ALLOC_HOST); }

hipError_t hipHostGetDevicePointer(void **d, void *h, unsigned int flags) {
    ENTER();
    (void)flags;
    *d = h; /* host memory is its own device address here */
    return hipSuccess;
}

/* What ROCm answers for memory it did not allocate: hipErrorNotFound. */
hipError_t hipMemGetAddressRange(hipDeviceptr_t *base, size_t *size, hipDeviceptr_t p) {
    ENTER();
    if (!base || !size) return hipErrorInvalidValue;
    pthread_mutex_lock(&lock);
    struct alloc *a = alloc_holding(p);
    if (a) {
        *base = a->base;
        *size = a->size;
    }
    pthread_mutex_unlock(&lock);
    return a ? hipSuccess : hipErrorNotFound;
}

/* Each attribute written at the width ROCm writes it. Memory the fake did not hand out is
 * hipErrorInvalidValue, as ROCm answers; attributes ROCm does not answer are refused. */
hipError_t hipPointerGetAttribute(void *data, hipPointer_attribute attr, hipDeviceptr_t p) {
    ENTER();
    if (!data || !p) return hipErrorInvalidValue;
    if (attr != HIP_POINTER_ATTRIBUTE_MEMORY_TYPE && attr != HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL &&
        attr != HIP_POINTER_ATTRIBUTE_BUFFER_ID && attr != HIP_POINTER_ATTRIBUTE_IS_MANAGED)
        return hipErrorNotSupported;
    pthread_mutex_lock(&lock);
    struct alloc *held = alloc_holding(p);
    struct alloc a = held ? *held : (struct alloc){0};
    pthread_mutex_unlock(&lock);
    if (!held) {
        if (attr == HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *(int *)data = -2;
        return hipErrorInvalidValue;
    }
    switch (attr) {
    case HIP_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(uint32_t *)data = a.kind == ALLOC_HOST ? hipMemoryTypeHost : hipMemoryTypeDevice;
        break;
    case HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a.device;
        break;
    case HIP_POINTER_ATTRIBUTE_BUFFER_ID:
        *(uint32_t *)data = a.id;
        break;
    default: /* HIP_POINTER_ATTRIBUTE_IS_MANAGED */
        *(unsigned char *)data = (unsigned char)a.managed;
        break;
    }
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

/* A VMM "handle" is a heap block holding its size and device; the mapping, at the one
 * reserved range below, enters the allocation table while it is mapped. */
struct vmm { size_t size; void *mem; int device; };

hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *h, size_t size,
                        const hipMemAllocationProp *prop, unsigned long long flags) {
    ENTER();
    if (flags != 0 || !valid_prop(prop)) return hipErrorInvalidValue;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return hipErrorOutOfMemory;
    v->size = size;
    v->mem = fake_alloc(size);
    v->device = prop->location.id;
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
    (void)offset; (void)flags;
    struct vmm *v = (struct vmm *)h;
    if (v->size != size) return hipErrorInvalidValue;
    pthread_mutex_lock(&lock);
    struct alloc *a = enter_alloc(p, size, ALLOC_VMM, v->device);
    pthread_mutex_unlock(&lock);
    return a ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipMemUnmap(void *p, size_t size) {
    ENTER();
    pthread_mutex_lock(&lock);
    /* The latest mapping first: an import of the owner's own export maps at the same
     * reserved range here. */
    for (int i = n_allocs - 1; i >= 0; i--) {
        if (allocs[i].live && allocs[i].kind == ALLOC_VMM && allocs[i].base == p &&
            allocs[i].size == size) {
            allocs[i].live = 0;
            pthread_mutex_unlock(&lock);
            return hipSuccess;
        }
    }
    pthread_mutex_unlock(&lock);
    return hipErrorInvalidValue;
}

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
    v->device = current_device;
    *h = (hipMemGenericAllocationHandle_t)v;
    return hipSuccess;
}

/* Handle bytes: a key fresh per call (what the open counts go by), the buffer id of the
 * block holding `p`, and `p`'s offset in it (ROCm's handle records the offset too, and its
 * open maps the block at that offset). Only hipMalloc / hipExtMallocWithFlags blocks are
 * shared: host memory and VMM mappings are refused (what ROCm does with a VMM mapping has
 * not been checked on hardware). */
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *p) {
    ENTER();
    if (!handle || !p) return hipErrorInvalidValue;
    memset(handle, 0, sizeof *handle);
    pthread_mutex_lock(&lock);
    struct alloc *a = alloc_holding(p);
    if (!a || a->kind != ALLOC_DEVICE) {
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidValue;
    }
    uint64_t key = next_ipc_key++;
    uint64_t id = a->id;
    uint64_t offset = (uint64_t)((char *)p - a->base);
    pthread_mutex_unlock(&lock);
    memcpy(handle->reserved, &key, sizeof key);
    memcpy(handle->reserved + 8, &id, sizeof id);
    memcpy(handle->reserved + 16, &offset, sizeof offset);
    return hipSuccess;
}

/* The pointer a handle opens to: its block (by buffer id, still live) at its offset. */
static void *ipc_target(const hipIpcMemHandle_t *handle) {
    uint64_t id, offset;
    memcpy(&id, handle->reserved + 8, sizeof id);
    memcpy(&offset, handle->reserved + 16, sizeof offset);
    for (int i = 0; i < n_allocs; i++)
        if (allocs[i].live && allocs[i].kind == ALLOC_DEVICE && allocs[i].id == id &&
            offset < allocs[i].size)
            return allocs[i].base + offset;
    return NULL;
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
    void *mem = ipc_target(&handle);
    if (!mem) { pthread_mutex_unlock(&lock); return hipErrorInvalidValue; } /* freed since */
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
