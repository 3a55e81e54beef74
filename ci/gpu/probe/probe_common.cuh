// What the bandwidth probes share (bandwidth_probe.cu, ce_overlap_probe.cu; latency_probe.cu
// takes CK): the CUDA error check, the source pattern with its fill and its check, a
// reduce-shaped mix kernel and a kernel that holds every SM. Header-only: each probe stays one compile.
#ifndef OXCCL_PROBE_COMMON_CUH_
#define OXCCL_PROBE_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

namespace probe_common {

// The source word at index i of GPU g: never 0xffffffff (the poison), different per GPU.
__host__ __device__ __forceinline__ uint32_t pattern(uint64_t i, uint32_t g) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b1u + (g + 1) * 0x7f4a7c15u + static_cast<uint32_t>(i >> 32);
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return x & 0x7fffffffu;
}

__global__ void fill_kernel(uint32_t* p, uint64_t words, uint32_t g) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words; i += stride) {
    p[i] = pattern(i, g);
  }
}

// Counts the words of p that are not GPU g's pattern; keeps the lowest such index.
__global__ void verify_kernel(const uint32_t* p, uint64_t words, uint32_t g, unsigned long long* bad,
                              unsigned long long* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  unsigned long long lowest = ~0ull;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words; i += stride) {
    if (p[i] != pattern(i, g)) {
      ++mine;
      if (i < lowest) lowest = i;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    mine += __shfl_down_sync(0xffffffffu, mine, o);
    const unsigned long long other = __shfl_down_sync(0xffffffffu, lowest, o);
    if (other < lowest) lowest = other;
  }
  if ((threadIdx.x & 31) == 0 && mine != 0) {
    atomicAdd(bad, mine);
    atomicMin(first, lowest);
  }
}

// out = a ^ (b & mask) in 16-byte units, kUnroll per thread per iteration: a reduce's
// memory traffic (two loads, one store) with a result that is `a` when mask is 0.
template <int kUnroll>
__global__ void __launch_bounds__(512) mix_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                  uint4* __restrict__ out, uint64_t bytes, uint32_t mask) {
  const uint64_t units = bytes / 16;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t u = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const auto mix = [mask](const uint4& x, const uint4& y) {
    return uint4{x.x ^ (y.x & mask), x.y ^ (y.y & mask), x.z ^ (y.z & mask), x.w ^ (y.w & mask)};
  };
  for (; u + (kUnroll - 1) * stride < units; u += kUnroll * stride) {
    uint4 va[kUnroll], vb[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      va[k] = a[u + k * stride];
      vb[k] = b[u + k * stride];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) out[u + k * stride] = mix(va[k], vb[k]);
  }
  for (; u < units; u += stride) out[u] = mix(a[u], b[u]);
}

// Holds its SM (the launch takes all of its threads and shared memory) for `cycles` clocks.
__global__ void __launch_bounds__(1024) busy_kernel(long long cycles) {
  extern __shared__ char hold[];
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0 && cycles < 0) hold[0] = 0;  // never: keeps the allocation
}

}  // namespace probe_common

#endif  // OXCCL_PROBE_COMMON_CUH_
