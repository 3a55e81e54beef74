/*
 * PreMulSum on the GPU through liboxccl_nccl (linked directly; a real NCCL from
 * OXCCL_NCCL_LIB_PATH is optional: with one, every operator also gets its real twin). One
 * thread drives every visible GPU (one or more, ncclCommInitAll): allreduce, reduce-scatter
 * and reduce with an fp32 scalar on the host (ncclScalarHostImmediate) and an int32 and an
 * fp32 scalar in device memory (ncclScalarDevice), checked exactly; then an allreduce with
 * the device scalar captured into a CUDA graph and replayed three times, the scalar's
 * memory rewritten before each replay: each replay must use the value it finds. Only the
 * driver API is used (loaded with dlopen), as in nccl_group_test.c.
 *
 * Build (here):  gcc -std=c11 -O1 -Wall -Wextra -I nccl-api/include \
 *                  -I $CUDA_HOME/include ci/gpu/nccl_premul_test.c -L <dir of the .so> \
 *                  -loxccl_nccl -Wl,-rpath,'$ORIGIN' -ldl -o nccl_premul_test
 * Run (GPU):     [OXCCL_NCCL_LIB_PATH=.../libnccl.so.2] OXCCL_NCCL_LOG=info ./nccl_premul_test
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl.h"

static int failures = 0;
#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, " (last error: %s)\n", ncclGetLastError(NULL));         \
      failures++;                                                             \
    }                                                                         \
  } while (0)
#define NCCLOK(call)                                                          \
  do {                                                                        \
    ncclResult_t r_ = (call);                                                 \
    CHECK(r_ == ncclSuccess, "%s returned %d", #call, (int)r_);               \
  } while (0)
#define CU(call)                                                              \
  do {                                                                        \
    CUresult e_ = (call);                                                     \
    if (e_ != CUDA_SUCCESS) {                                                 \
      fprintf(stderr, "FAIL %s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)e_); \
      exit(2);                                                                \
    }                                                                         \
  } while (0)

static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGetCount)(int*);
static CUresult (*p_cuDeviceGet)(CUdevice*, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuCtxSynchronize)(void);
static CUresult (*p_cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
static CUresult (*p_cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
static CUresult (*p_cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
static CUresult (*p_cuStreamCreate)(CUstream*, unsigned);
static CUresult (*p_cuStreamSynchronize)(CUstream);
static CUresult (*p_cuStreamBeginCapture)(CUstream, CUstreamCaptureMode);
static CUresult (*p_cuStreamEndCapture)(CUstream, CUgraph*);
static CUresult (*p_cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
static CUresult (*p_cuGraphLaunch)(CUgraphExec, CUstream);

#define MAXG 8
static CUcontext ctx[MAXG];

static void load_driver(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
    exit(2);
  }
#define SYM(var, name)                                                        \
  do {                                                                        \
    *(void**)(&var) = dlsym(h, name);                                         \
    if (!var) { fprintf(stderr, "no %s\n", name); exit(2); }                   \
  } while (0)
  SYM(p_cuInit, "cuInit");
  SYM(p_cuDeviceGetCount, "cuDeviceGetCount");
  SYM(p_cuDeviceGet, "cuDeviceGet");
  SYM(p_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(p_cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(p_cuCtxSynchronize, "cuCtxSynchronize");
  SYM(p_cuMemAlloc, "cuMemAlloc_v2");
  SYM(p_cuMemFree, "cuMemFree_v2");
  SYM(p_cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(p_cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(p_cuStreamCreate, "cuStreamCreate");
  SYM(p_cuStreamSynchronize, "cuStreamSynchronize");
  SYM(p_cuStreamBeginCapture, "cuStreamBeginCapture_v2");
  SYM(p_cuStreamEndCapture, "cuStreamEndCapture");
  SYM(p_cuGraphInstantiate, "cuGraphInstantiateWithFlags");
  SYM(p_cuGraphLaunch, "cuGraphLaunch");
}

static void set_device(int d) { CU(p_cuCtxSetCurrent(ctx[d])); }

/* Element i of GPU g's input (a multiple of 1/8, so every product and sum below is exact). */
static float input_of(int g, size_t i) { return (float)((int)((i * 7 + (size_t)g * 13) % 201) - 100) / 8.0f; }

/* Copies `bytes` of GPU g's buffer to the host and back into `out`. */
static void fetch(int g, void* out, CUdeviceptr p, size_t bytes) {
  set_device(g);
  CU(p_cuCtxSynchronize());
  CU(p_cuMemcpyDtoH(out, p, bytes));
}

/* One collective (0 allreduce, 1 reduce-scatter, 2 reduce to the last GPU) of `count` fp32
 * per GPU with operator op[g] whose scalar on GPU g is scale[g], checked exactly. */
static void premul_f32(ncclComm_t* comms, int n, int coll, size_t count, const ncclRedOp_t* op, const float* scale,
                       const char* what) {
  size_t in_n = coll == 1 ? count * (size_t)n : count;
  CUdeviceptr in[MAXG], out[MAXG];
  float* host = malloc(in_n * sizeof(float));
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuMemAlloc(&in[g], in_n * sizeof(float)));
    CU(p_cuMemAlloc(&out[g], count * sizeof(float)));
    for (size_t i = 0; i < in_n; i++) host[i] = input_of(g, i);
    CU(p_cuMemcpyHtoD(in[g], host, in_n * sizeof(float)));
    for (size_t i = 0; i < count; i++) host[i] = -12345.0f;
    CU(p_cuMemcpyHtoD(out[g], host, count * sizeof(float)));
  }
  int root = n - 1;
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    void *s = (void*)in[g], *r = (void*)out[g];
    if (coll == 0) NCCLOK(ncclAllReduce(s, r, count, ncclFloat32, op[g], comms[g], NULL));
    if (coll == 1) NCCLOK(ncclReduceScatter(s, r, count, ncclFloat32, op[g], comms[g], NULL));
    if (coll == 2) NCCLOK(ncclReduce(s, r, count, ncclFloat32, op[g], root, comms[g], NULL));
  }
  NCCLOK(ncclGroupEnd());
  for (int g = 0; g < n; g++) {
    fetch(g, host, out[g], count * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      size_t at = coll == 1 ? (size_t)g * count + i : i;
      for (int r = 0; r < n; r++) want += scale[r] * input_of(r, at);
      if (coll == 2 && g != root) want = -12345.0f;
      bad += host[i] != want;
    }
    CHECK(bad == 0, "%s of %zu on GPU %d: %zu wrong", what, count, g, bad);
    set_device(g);
    CU(p_cuMemFree(in[g]));
    CU(p_cuMemFree(out[g]));
  }
  free(host);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  load_driver();
  CU(p_cuInit(0));
  int n = 0;
  CU(p_cuDeviceGetCount(&n));
  if (n > MAXG) n = MAXG;
  if (n < 1) {
    printf("nccl_premul_test: no GPU\n");
    return 2;
  }
  alarm(300);
  for (int g = 0; g < n; g++) {
    CUdevice d;
    CU(p_cuDeviceGet(&d, g));
    CU(p_cuDevicePrimaryCtxRetain(&ctx[g], d));
  }
  int version = 0;
  NCCLOK(ncclGetVersion(&version));
  printf("nccl_premul_test: %d GPUs, NCCL version %d\n", n, version);
  ncclComm_t comms[MAXG] = {0};
  NCCLOK(ncclCommInitAll(comms, n, NULL));
  for (int g = 0; g < n; g++)
    if (!comms[g]) {
      printf("nccl_premul_test: no communicators\n");
      return 1;
    }

  /* Operators: fp32 on the host (g + 2), fp32 and int32 in device memory. */
  ncclRedOp_t host_op[MAXG], dev_op[MAXG], int_op[MAXG];
  CUdeviceptr dscalar[MAXG], iscalar[MAXG];
  float host_scale[MAXG], dev_scale[MAXG];
  for (int g = 0; g < n; g++) {
    set_device(g);
    host_scale[g] = (float)(g + 2);
    NCCLOK(ncclRedOpCreatePreMulSum(&host_op[g], &host_scale[g], ncclFloat32, ncclScalarHostImmediate, comms[g]));
    CU(p_cuMemAlloc(&dscalar[g], 16));
    CU(p_cuMemAlloc(&iscalar[g], 16));
    NCCLOK(ncclRedOpCreatePreMulSum(&dev_op[g], (void*)dscalar[g], ncclFloat32, ncclScalarDevice, comms[g]));
    NCCLOK(ncclRedOpCreatePreMulSum(&int_op[g], (void*)iscalar[g], ncclInt32, ncclScalarDevice, comms[g]));
    dev_scale[g] = g % 2 ? -0.5f : 1.5f;
    CU(p_cuMemcpyHtoD(dscalar[g], &dev_scale[g], 4));
    int32_t k = 3 - 7 * g;
    CU(p_cuMemcpyHtoD(iscalar[g], &k, 4));
  }
  static const size_t COUNTS[] = {1, 1001, 12345, (1u << 20) + 7};
  static const char* NAMES[] = {"PreMulSum allreduce", "PreMulSum reduce-scatter", "PreMulSum reduce"};
  for (int coll = 0; coll < 3; coll++)
    for (size_t ci = 0; ci < 4; ci++) {
      premul_f32(comms, n, coll, COUNTS[ci], host_op, host_scale, NAMES[coll]);
      premul_f32(comms, n, coll, COUNTS[ci], dev_op, dev_scale, NAMES[coll]);
    }

  /* int32 allreduce with the device scalar: wrapping products and sums. */
  {
    size_t count = 100003;
    CUdeviceptr buf[MAXG];
    int32_t* host = malloc(count * sizeof(int32_t));
    for (int g = 0; g < n; g++) {
      set_device(g);
      CU(p_cuMemAlloc(&buf[g], count * sizeof(int32_t)));
      for (size_t i = 0; i < count; i++) host[i] = (int32_t)(uint32_t)((i + 1) * 2654435761u + (uint32_t)g);
      CU(p_cuMemcpyHtoD(buf[g], host, count * sizeof(int32_t)));
    }
    NCCLOK(ncclGroupStart());
    for (int g = 0; g < n; g++) {
      set_device(g);
      NCCLOK(ncclAllReduce((void*)buf[g], (void*)buf[g], count, ncclInt32, int_op[g], comms[g], NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int g = 0; g < n; g++) {
      fetch(g, host, buf[g], count * sizeof(int32_t));
      size_t bad = 0;
      for (size_t i = 0; i < count; i++) {
        uint32_t want = 0;
        for (int r = 0; r < n; r++)
          want += ((uint32_t)((i + 1) * 2654435761u + (uint32_t)r)) * (uint32_t)(3 - 7 * r);
        bad += (uint32_t)host[i] != want;
      }
      CHECK(bad == 0, "int32 PreMulSum allreduce on GPU %d: %zu wrong", g, bad);
      set_device(g);
      CU(p_cuMemFree(buf[g]));
    }
    free(host);
  }

  /* A captured allreduce replayed with the device scalar rewritten before each replay. */
  {
    size_t count = 4099;
    CUstream stream[MAXG];
    CUgraph graph[MAXG];
    CUgraphExec exec[MAXG];
    CUdeviceptr in[MAXG], out[MAXG];
    float* host = malloc(count * sizeof(float));
    for (int g = 0; g < n; g++) {
      set_device(g);
      CU(p_cuStreamCreate(&stream[g], CU_STREAM_NON_BLOCKING));
      CU(p_cuMemAlloc(&in[g], count * sizeof(float)));
      CU(p_cuMemAlloc(&out[g], count * sizeof(float)));
      for (size_t i = 0; i < count; i++) host[i] = input_of(g, i);
      CU(p_cuMemcpyHtoD(in[g], host, count * sizeof(float)));
    }
    /* The first call of a signature is checked across ranks: once before the capture. */
    NCCLOK(ncclGroupStart());
    for (int g = 0; g < n; g++) {
      set_device(g);
      NCCLOK(ncclAllReduce((void*)in[g], (void*)out[g], count, ncclFloat32, dev_op[g], comms[g], stream[g]));
    }
    NCCLOK(ncclGroupEnd());
    for (int g = 0; g < n; g++) {
      set_device(g);
      CU(p_cuStreamSynchronize(stream[g]));
      CU(p_cuStreamBeginCapture(stream[g], CU_STREAM_CAPTURE_MODE_RELAXED));
    }
    NCCLOK(ncclGroupStart());
    for (int g = 0; g < n; g++) {
      set_device(g);
      NCCLOK(ncclAllReduce((void*)in[g], (void*)out[g], count, ncclFloat32, dev_op[g], comms[g], stream[g]));
    }
    NCCLOK(ncclGroupEnd());
    for (int g = 0; g < n; g++) {
      set_device(g);
      CU(p_cuStreamEndCapture(stream[g], &graph[g]));
      CU(p_cuGraphInstantiate(&exec[g], graph[g], 0));
    }
    for (int replay = 1; replay <= 3; replay++) {
      float scale[MAXG];
      for (int g = 0; g < n; g++) {
        set_device(g);
        scale[g] = (float)(replay * (g + 1)) * 0.25f;
        CU(p_cuMemcpyHtoD(dscalar[g], &scale[g], 4));
        CU(p_cuGraphLaunch(exec[g], stream[g]));
      }
      for (int g = 0; g < n; g++) {
        set_device(g);
        CU(p_cuStreamSynchronize(stream[g]));
        CU(p_cuMemcpyDtoH(host, out[g], count * sizeof(float)));
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
          float want = 0;
          for (int r = 0; r < n; r++) want += scale[r] * input_of(r, i);
          bad += host[i] != want;
        }
        CHECK(bad == 0, "graph replay %d on GPU %d: %zu wrong (scalar %g)", replay, g, bad, scale[g]);
      }
    }
    free(host);
  }

  /* Bad uses. */
  set_device(0);
  CHECK(ncclAllReduce((void*)dscalar[0], (void*)dscalar[0], 1, ncclBfloat16, host_op[0], comms[0], NULL) ==
            ncclInvalidArgument,
        "an fp32 operator with a bf16 call");
  for (int g = 0; g < n; g++) {
    set_device(g);
    NCCLOK(ncclRedOpDestroy(host_op[g], comms[g]));
    NCCLOK(ncclRedOpDestroy(dev_op[g], comms[g]));
    NCCLOK(ncclRedOpDestroy(int_op[g], comms[g]));
  }
  CHECK(ncclRedOpDestroy(host_op[0], comms[0]) == ncclInvalidArgument, "a second destroy");
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuCtxSynchronize());
    NCCLOK(ncclCommDestroy(comms[g]));
  }
  printf("nccl_premul_test: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
