/*
 * One thread drives every visible GPU (one or more) through liboxccl_nccl (linked directly; the real
 * NCCL comes from OXCCL_NCCL_LIB_PATH): the start-up of issue #17 (ncclGroupStart; per
 * GPU make its context current and ncclCommInitRankConfig; ncclGroupEnd), then grouped
 * allreduces (served by oxccl) and gathers (forwarded to the real NCCL), a grouped split,
 * non-blocking inits polled until ready, and a group failed by a bad rank. Only the driver API is used (loaded with
 * dlopen), so the program needs no CUDA runtime: making a primary context current is what
 * cudaSetDevice does, and the real NCCL's runtime takes it as the current device.
 *
 * Build (here):  gcc -std=c11 -O1 -Wall -Wextra -I nccl-api/include \
 *                  -I $CUDA_HOME/include ci/gpu/nccl_group_test.c -L <dir of the .so> \
 *                  -loxccl_nccl -Wl,-rpath,'$ORIGIN' -ldl -o nccl_group_test
 * Run (GPU):     OXCCL_NCCL_LIB_PATH=.../libnccl.so.2 ./nccl_group_test
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

#define MAXG 8
static CUcontext ctx[MAXG];

#define CU(call)                                                              \
  do {                                                                        \
    CUresult e_ = (call);                                                     \
    if (e_ != CUDA_SUCCESS) {                                                 \
      fprintf(stderr, "FAIL %s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)e_); \
      exit(2);                                                                \
    }                                                                         \
  } while (0)

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
}

/* cudaSetDevice(d), in driver terms. */
static void set_device(int d) { CU(p_cuCtxSetCurrent(ctx[d])); }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One allreduce (sum, in place) per GPU inside one group, checked exactly: element i of
 * GPU g holds (g + 1) * (i % 97), so the sum is n(n+1)/2 * (i % 97). */
static void grouped_allreduce(ncclComm_t* comms, int n, size_t count, ncclDataType_t type) {
  size_t esz = type == ncclFloat64 ? 8 : 4;
  CUdeviceptr buf[MAXG];
  void* host = malloc(count * esz);
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuMemAlloc(&buf[g], count * esz));
    for (size_t i = 0; i < count; i++) {
      double v = (double)(g + 1) * (double)(i % 97);
      if (type == ncclFloat64) ((double*)host)[i] = v; else ((float*)host)[i] = (float)v;
    }
    CU(p_cuMemcpyHtoD(buf[g], host, count * esz));
  }
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    NCCLOK(ncclAllReduce((void*)buf[g], (void*)buf[g], count, type, ncclSum, comms[g], NULL));
  }
  NCCLOK(ncclGroupEnd());
  double tri = (double)n * (n + 1) / 2;
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuCtxSynchronize());
    CU(p_cuMemcpyDtoH(host, buf[g], count * esz));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
      double want = tri * (double)(i % 97);
      double got = type == ncclFloat64 ? ((double*)host)[i] : (double)((float*)host)[i];
      bad += got != want;
    }
    CHECK(bad == 0, "%s allreduce of %zu on GPU %d: %zu wrong", type == ncclFloat64 ? "fp64" : "fp32", count, g, bad);
    CU(p_cuMemFree(buf[g]));
  }
  free(host);
}

/* One gather (forwarded to the real NCCL) per GPU to rank 0 inside one group: the GPU of
 * rank r sends count floats of r + 1 + i % 7. Rank 0 need not be on GPU 0 (a split can
 * reorder the ranks), so the receive buffer is on the root's GPU and given only there. */
static void grouped_gather(ncclComm_t* comms, int n, size_t count) {
  CUdeviceptr send[MAXG], recv = 0;
  int rank[MAXG], root_gpu = -1;
  float* host = malloc(count * (size_t)n * sizeof(float));
  for (int g = 0; g < n; g++) {
    NCCLOK(ncclCommUserRank(comms[g], &rank[g]));
    if (rank[g] == 0) root_gpu = g;
  }
  CHECK(root_gpu >= 0, "no GPU holds rank 0 of %d", n);
  if (root_gpu < 0) {
    free(host);
    return;
  }
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuMemAlloc(&send[g], count * sizeof(float)));
    for (size_t i = 0; i < count; i++) host[i] = (float)(rank[g] + 1) + (float)(i % 7);
    CU(p_cuMemcpyHtoD(send[g], host, count * sizeof(float)));
    if (g == root_gpu) CU(p_cuMemAlloc(&recv, count * (size_t)n * sizeof(float)));
  }
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    NCCLOK(ncclGather((void*)send[g], g == root_gpu ? (void*)recv : NULL, count, ncclFloat32, 0, comms[g], NULL));
  }
  NCCLOK(ncclGroupEnd());
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuCtxSynchronize());
  }
  set_device(root_gpu);
  CU(p_cuMemcpyDtoH(host, recv, count * (size_t)n * sizeof(float)));
  size_t bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) bad += host[(size_t)r * count + i] != (float)(r + 1) + (float)(i % 7);
  CHECK(bad == 0, "forwarded gather of %zu x %d: %zu wrong", count, n, bad);
  for (int g = 0; g < n; g++) {
    set_device(g);
    CU(p_cuMemFree(send[g]));
  }
  set_device(root_gpu);
  CU(p_cuMemFree(recv));
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
    printf("nccl_group_test: no GPU\n");
    return 2;
  }
  /* Whatever goes wrong below, never more than this. */
  alarm(540);
  for (int g = 0; g < n; g++) {
    CUdevice d;
    CU(p_cuDeviceGet(&d, g));
    CU(p_cuDevicePrimaryCtxRetain(&ctx[g], d));
  }
  int version = 0;
  NCCLOK(ncclGetVersion(&version));
  printf("nccl_group_test: %d GPUs, NCCL version %d\n", n, version);

  /* Issue #17's start-up. */
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  ncclComm_t comms[MAXG] = {0};
  double t0 = now_s();
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    NCCLOK(ncclCommInitRankConfig(&comms[g], n, id, g, &cfg));
  }
  NCCLOK(ncclGroupEnd());
  printf("grouped init of %d ranks from one thread: %.2f s\n", n, now_s() - t0);
  for (int g = 0; g < n; g++) {
    int v = -1;
    ncclResult_t state = ncclInternalError;
    NCCLOK(ncclCommGetAsyncError(comms[g], &state));
    CHECK(state == ncclSuccess, "rank %d state %d", g, (int)state);
    NCCLOK(ncclCommCuDevice(comms[g], &v));
    CHECK(v == g, "rank %d on device %d", g, v);
    NCCLOK(ncclCommUserRank(comms[g], &v));
    CHECK(v == g, "rank %d reports %d", g, v);
  }
  static const size_t COUNTS[] = {1, 1000, 12345, (1u << 20) + 7};
  for (int c = 0; c < 4; c++) {
    grouped_allreduce(comms, n, COUNTS[c], ncclFloat32);
    grouped_allreduce(comms, n, COUNTS[c], ncclFloat64);
    grouped_gather(comms, n, COUNTS[c]); /* forwarded to the real NCCL */
  }
  printf("grouped allreduces (served) and gathers (forwarded): done\n");

  /* A grouped split into one communicator of all ranks, reversed. */
  ncclComm_t subs[MAXG] = {0};
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    NCCLOK(ncclCommSplit(comms[g], 0, -g, &subs[g], NULL));
  }
  NCCLOK(ncclGroupEnd());
  ncclComm_t byrank[MAXG] = {0};
  for (int g = 0; g < n; g++) {
    int r = -1;
    NCCLOK(ncclCommUserRank(subs[g], &r));
    CHECK(r == n - 1 - g, "split rank %d on GPU %d", r, g);
    byrank[g] = subs[g];
  }
  grouped_allreduce(byrank, n, 4097, ncclFloat32);
  grouped_gather(byrank, n, 4097);
  printf("grouped split and allreduces on it: done\n");
  for (int g = 0; g < n; g++) NCCLOK(ncclCommDestroy(subs[g]));
  for (int g = 0; g < n; g++) NCCLOK(ncclCommDestroy(comms[g]));

  /* Non-blocking inits from one thread: each returns ncclInProgress, then all are polled. */
  NCCLOK(ncclGetUniqueId(&id));
  t0 = now_s();
  for (int g = 0; g < n; g++) {
    set_device(g);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comms[g], n, id, g, &cfg);
    CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking init on GPU %d returned %d", g, (int)r);
  }
  for (int g = 0; g < n; g++) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && now_s() - t0 < 120) {
      NCCLOK(ncclCommGetAsyncError(comms[g], &state));
      if (state == ncclInProgress) usleep(1000);
    }
    CHECK(state == ncclSuccess, "non-blocking rank %d ended with %d", g, (int)state);
    int v = -1;
    NCCLOK(ncclCommCuDevice(comms[g], &v));
    CHECK(v == g, "non-blocking rank %d on device %d", g, v);
  }
  printf("non-blocking inits of %d ranks from one thread: %.2f s\n", n, now_s() - t0);
  grouped_allreduce(comms, n, 12345, ncclFloat32);
  grouped_gather(comms, n, 12345);
  for (int g = 0; g < n; g++) NCCLOK(ncclCommDestroy(comms[g]));

  /* A bad rank inside a group: refused at the call, and ncclGroupEnd fails at once (the
   * real library's group is failed too, so its begun init of rank 0 does not wait for a
   * rank 1 that never comes). */
  NCCLOK(ncclGetUniqueId(&id));
  ncclComm_t good = NULL, bad = NULL;
  t0 = now_s();
  NCCLOK(ncclGroupStart());
  set_device(0);
  NCCLOK(ncclCommInitRank(&good, 2, id, 0));
  ncclResult_t r = ncclCommInitRank(&bad, 2, id, 7);
  CHECK(r == ncclInvalidArgument, "a bad rank in a group returned %d", (int)r);
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidArgument, "the failed group's ncclGroupEnd returned %d", (int)r);
  printf("failed group: ncclGroupEnd returned %d after %.2f s: %s\n", (int)r, now_s() - t0, ncclGetLastError(NULL));
  if (good) {
    ncclResult_t state = ncclSuccess;
    NCCLOK(ncclCommGetAsyncError(good, &state));
    CHECK(state == ncclInvalidArgument, "the failed group's member reports %d", (int)state);
    NCCLOK(ncclCommDestroy(good));
  }
  /* The thread's groups still work after a failed one. */
  NCCLOK(ncclGetUniqueId(&id));
  NCCLOK(ncclGroupStart());
  for (int g = 0; g < n; g++) {
    set_device(g);
    NCCLOK(ncclCommInitRank(&comms[g], n, id, g));
  }
  NCCLOK(ncclGroupEnd());
  grouped_allreduce(comms, n, 1000, ncclFloat32);
  grouped_gather(comms, n, 1000);
  for (int g = 0; g < n; g++) NCCLOK(ncclCommDestroy(comms[g]));

  printf("nccl_group_test: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
