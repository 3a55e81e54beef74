/*
 * The host cost of one ncclAllReduce call: one process, one GPU, a one-rank communicator
 * (ncclCommInitAll), out-of-place calls (a one-rank NCCL returns at once in place) queued
 * back to back on one stream in batches of 50 (the stream synchronized between batches, so
 * the launch queue never fills), the host time of each batch divided by its calls; the
 * median batch per size is printed, and beside it the same for cuMemsetD32Async of the
 * same bytes (one driver enqueue, the floor of any call that queues GPU work). The NCCL library is
 * loaded with dlopen from the path given, so the same binary times the real NCCL and
 * liboxccl_nccl.so (which forwards what it does not serve to OXCCL_NCCL_LIB_PATH).
 *
 * Build (here):  gcc -std=c11 -O2 -Wall -Wextra -I nccl-api/include -I $CUDA_HOME/include \
 *                  ci/gpu/nccl_call_cost.c -ldl -o nccl_call_cost
 * Run (GPU):     ./nccl_call_cost /path/to/libnccl.so.2
 *                OXCCL_NCCL_LIB_PATH=/path/to/libnccl.so.2 ./nccl_call_cost .gpu/bin/liboxccl_nccl.so
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nccl.h"

#define BATCH 50
#define BATCHES 41

static void* must(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (f == NULL) {
    fprintf(stderr, "nccl_call_cost: %s not found: %s\n", name, dlerror());
    exit(2);
  }
  return f;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: nccl_call_cost LIBNCCL\n");
    return 2;
  }
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (cuda == NULL || nccl == NULL) {
    fprintf(stderr, "nccl_call_cost: dlopen: %s\n", dlerror());
    return 2;
  }
  CUresult (*cuInit_)(unsigned) = must(cuda, "cuInit");
  CUresult (*cuDeviceGet_)(CUdevice*, int) = must(cuda, "cuDeviceGet");
  CUresult (*cuPrimaryCtxRetain_)(CUcontext*, CUdevice) = must(cuda, "cuDevicePrimaryCtxRetain");
  CUresult (*cuCtxSetCurrent_)(CUcontext) = must(cuda, "cuCtxSetCurrent");
  CUresult (*cuMemAlloc_)(CUdeviceptr*, size_t) = must(cuda, "cuMemAlloc_v2");
  CUresult (*cuStreamCreate_)(CUstream*, unsigned) = must(cuda, "cuStreamCreate");
  CUresult (*cuStreamSynchronize_)(CUstream) = must(cuda, "cuStreamSynchronize");
  CUresult (*cuMemsetD32Async_)(CUdeviceptr, unsigned, size_t, CUstream) = must(cuda, "cuMemsetD32Async");
  ncclResult_t (*initAll)(ncclComm_t*, int, const int*) = must(nccl, "ncclCommInitAll");
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = must(nccl, "ncclAllReduce");
  ncclResult_t (*destroy)(ncclComm_t) = must(nccl, "ncclCommDestroy");

  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CUdeviceptr buf;
  if (cuInit_(0) || cuDeviceGet_(&dev, 0) || cuPrimaryCtxRetain_(&ctx, dev) || cuCtxSetCurrent_(ctx) ||
      cuStreamCreate_(&stream, 0) || cuMemAlloc_(&buf, 16 << 20)) {
    fprintf(stderr, "nccl_call_cost: CUDA setup failed\n");
    return 2;
  }
  ncclComm_t comm;
  int devs[1] = {0};
  if (initAll(&comm, 1, devs) != ncclSuccess) {
    fprintf(stderr, "nccl_call_cost: ncclCommInitAll failed\n");
    return 1;
  }
  const size_t counts[] = {1, 1000, 1 << 20};
  printf("library %s\n%10s %12s %12s %14s\n", argv[1], "bf16 elems", "host us/call", "min us/call",
         "memset us/call");
  const CUdeviceptr out = buf + (8 << 20);
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    double per[BATCHES], floor[BATCHES];
    for (int b = -2; b < BATCHES; b++) { /* two warm-up batches */
      double t0 = now_us();
      for (int i = 0; i < BATCH; i++) {
        if (allReduce((void*)buf, (void*)out, counts[k], ncclBfloat16, ncclSum, comm, (cudaStream_t)stream) !=
            ncclSuccess) {
          fprintf(stderr, "nccl_call_cost: ncclAllReduce failed\n");
          return 1;
        }
      }
      double t1 = now_us();
      cuStreamSynchronize_(stream);
      double t2 = now_us();
      for (int i = 0; i < BATCH; i++) cuMemsetD32Async_(out, 0, (counts[k] + 1) / 2, stream);
      double t3 = now_us();
      cuStreamSynchronize_(stream);
      if (b >= 0) {
        per[b] = (t1 - t0) / BATCH;
        floor[b] = (t3 - t2) / BATCH;
      }
    }
    qsort(per, BATCHES, sizeof per[0], cmp);
    qsort(floor, BATCHES, sizeof floor[0], cmp);
    printf("%10zu %12.2f %12.2f %14.2f\n", counts[k], per[BATCHES / 2], per[0], floor[BATCHES / 2]);
  }
  destroy(comm);
  return 0;
}
