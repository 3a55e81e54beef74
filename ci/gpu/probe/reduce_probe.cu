// Why does a 2-rank reduce with peer loads (oxccl's `reduce_direct`) move about 348 GB/s at
// 1 GiB where a plain peer-load copy moves 371-374 (bandwidth_probe's sm-load-1dir b)? The
// same root work, GPU 0 reading GPU 1's input over NVLink and its own input, adding them as
// bf16 pairs and storing the sum into its own output, in several shapes; one process drives
// both GPUs (peer access), each case timed with events over repeated whole passes:
//
//   blockK     each block a contiguous share, its threads striding through it, K units of
//              16 bytes per thread per iteration (reduce_direct: K = 2)
//   gridK      a grid-stride loop, K units a grid apart per iteration (bandwidth_probe's b)
//   blockKp    blockK with the next iteration's loads issued before this one's stores
//   gridKp     the same for gridK
//   copy4      grid4 without the local input and the add: a peer-load copy, the ceiling
//   copyblk4   the same copy in block4's shape
//   pushblkK   the other direction (local loads, stores into GPU 1), block shape, K units
//   pushgridK  the same in the grid-stride shape
//
// Every case's output is compared word for word with the first case's (which the host checks
// on a sample of units), after the output was poisoned. Build and run (session.sh
// reduceprobe; no oxccl code):
//
//     nvcc -std=c++20 -O3 -arch=sm_90 ci/gpu/probe/reduce_probe.cu -o rp && ./rp [MiB,...] [reps]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

__device__ __forceinline__ uint4 ld_cg(const uint4* p) { return __ldcg(p); }

__device__ __forceinline__ uint32_t add_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  const __nv_bfloat162 s = __hadd2(x, y);
  uint32_t r;
  std::memcpy(&r, &s, 4);
  return r;
}

__device__ __forceinline__ uint4 add_units(const uint4& a, const uint4& b) {
  return uint4{add_bf16x2(a.x, b.x), add_bf16x2(a.y, b.y), add_bf16x2(a.z, b.z), add_bf16x2(a.w, b.w)};
}

enum class Shape { Block, Grid };

// A thread's walk over `units`: unit `first`, then every `spread`, below `end`.
struct Walk {
  uint64_t first, end, spread;
};

template <Shape kShape>
__device__ __forceinline__ Walk walk_of(uint64_t units) {
  if constexpr (kShape == Shape::Block) {
    const uint64_t share = (units + gridDim.x - 1) / gridDim.x;
    const uint64_t lo = blockIdx.x * share;
    return Walk{lo + threadIdx.x, lo + share < units ? lo + share : units, blockDim.x};
  } else {
    return Walk{blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x, units,
                static_cast<uint64_t>(gridDim.x) * blockDim.x};
  }
}

// out[u] = own[u] + peer[u] (bf16 pairs) for every 16-byte unit; `kAdd` false: out = peer.
template <Shape kShape, int kUnits, bool kPipelined, bool kAdd>
__global__ void __launch_bounds__(512) reduce_kernel(const uint4* __restrict__ own, const uint4* __restrict__ peer,
                                                     uint4* __restrict__ out, uint64_t units) {
  const auto [first, end, spread] = walk_of<kShape>(units);
  const uint64_t step = spread * kUnits;
  uint4 a[kUnits], b[kUnits];
  const auto load = [&](uint64_t u0) {
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const uint64_t u = u0 + k * spread;
      if (u < end) {
        b[k] = ld_cg(peer + u);
        if constexpr (kAdd) a[k] = ld_cg(own + u);
      }
    }
  };
  const auto store = [&](uint64_t u0, const uint4 (&x)[kUnits], const uint4 (&y)[kUnits]) {
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const uint64_t u = u0 + k * spread;
      if (u < end) out[u] = kAdd ? add_units(x[k], y[k]) : y[k];
    }
  };
  if constexpr (kPipelined) {
    if (first < end) load(first);
    for (uint64_t u0 = first; u0 < end; u0 += step) {
      uint4 ca[kUnits], cb[kUnits];
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        ca[k] = a[k];
        cb[k] = b[k];
      }
      if (u0 + step < end) load(u0 + step);
      store(u0, ca, cb);
    }
  } else {
    for (uint64_t u0 = first; u0 < end; u0 += step) {
      load(u0);
      store(u0, a, b);
    }
  }
}

// The push direction, for the kernels that store into peers: peer_out[u] = own[u] (local
// loads, stores over NVLink), in either shape, K units per thread per iteration.
template <Shape kShape, int kUnits>
__global__ void __launch_bounds__(512) push_kernel(const uint4* __restrict__ own, const uint4* __restrict__ unused,
                                                   uint4* __restrict__ peer_out, uint64_t units) {
  (void)unused;
  const auto [first, end, spread] = walk_of<kShape>(units);
  for (uint64_t u0 = first; u0 < end; u0 += spread * kUnits) {
    uint4 v[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (u0 + k * spread < end) v[k] = ld_cg(own + u0 + k * spread);
    }
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (u0 + k * spread < end) peer_out[u0 + k * spread] = v[k];
    }
  }
}

__global__ void compare_kernel(const uint32_t* x, const uint32_t* y, uint64_t words, unsigned long long* bad) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words; i += stride) {
    mine += x[i] != y[i];
  }
  if (mine != 0) atomicAdd(bad, mine);
}

using Kernel = void (*)(const uint4*, const uint4*, uint4*, uint64_t);

enum class Want { Sum, Peer, Own };

struct Case {
  const char* name;
  Kernel kernel;
  Want want;       // what the output must hold
  bool to_peer;    // the output is GPU 1's buffer (the push cases)
};

const Case kCases[] = {
    {"block2", reduce_kernel<Shape::Block, 2, false, true>, Want::Sum, false},
    {"block4", reduce_kernel<Shape::Block, 4, false, true>, Want::Sum, false},
    {"block2p", reduce_kernel<Shape::Block, 2, true, true>, Want::Sum, false},
    {"block4p", reduce_kernel<Shape::Block, 4, true, true>, Want::Sum, false},
    {"grid2", reduce_kernel<Shape::Grid, 2, false, true>, Want::Sum, false},
    {"grid4", reduce_kernel<Shape::Grid, 4, false, true>, Want::Sum, false},
    {"grid8", reduce_kernel<Shape::Grid, 8, false, true>, Want::Sum, false},
    {"grid2p", reduce_kernel<Shape::Grid, 2, true, true>, Want::Sum, false},
    {"grid4p", reduce_kernel<Shape::Grid, 4, true, true>, Want::Sum, false},
    {"copy4", reduce_kernel<Shape::Grid, 4, false, false>, Want::Peer, false},
    {"copyblk4", reduce_kernel<Shape::Block, 4, false, false>, Want::Peer, false},
    {"pushblk1", push_kernel<Shape::Block, 1>, Want::Own, true},
    {"pushblk4", push_kernel<Shape::Block, 4>, Want::Own, true},
    {"pushgrid1", push_kernel<Shape::Grid, 1>, Want::Own, true},
    {"pushgrid4", push_kernel<Shape::Grid, 4>, Want::Own, true},
};

float bf16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> mib;
  for (const char* p = argc > 1 ? argv[1] : "128,1024"; *p != 0;) {
    mib.push_back(std::strtoull(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (!can) {
    std::fprintf(stderr, "GPU 0 cannot reach GPU 1\n");
    return 2;
  }
  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const uint64_t most = *std::max_element(mib.begin(), mib.end()) << 20;
  uint4 *own, *out, *ref, *peer, *peer_out;
  unsigned long long* bad;
  CK(cudaMalloc(&own, most));
  CK(cudaMalloc(&out, most));
  CK(cudaMalloc(&ref, most));
  CK(cudaMallocManaged(&bad, sizeof(unsigned long long)));
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&peer, most));
  CK(cudaMalloc(&peer_out, most));
  // Inputs: small positive bf16 values (exponent kept in range: no infinities or NaNs).
  probe_common::fill_kernel<<<1024, 512>>>(reinterpret_cast<uint32_t*>(peer), most / 4, 1);
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(0));
  probe_common::fill_kernel<<<1024, 512>>>(reinterpret_cast<uint32_t*>(own), most / 4, 0);
  CK(cudaDeviceSynchronize());
  // Keep every bf16 finite: clear the top exponent bit of both halves of every word.
  const auto tame = [&](uint4* p, int dev) {
    CK(cudaSetDevice(dev));
    std::vector<uint32_t> h(most / 4);
    CK(cudaMemcpy(h.data(), p, most, cudaMemcpyDefault));
    for (auto& w : h) w &= 0x3fff3fffu;
    CK(cudaMemcpy(p, h.data(), most, cudaMemcpyDefault));
  };
  tame(peer, 1);
  tame(own, 0);
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  const int blocks = prop.multiProcessorCount;
  std::printf("# reduce_probe: %s, %d SMs, one block of 512 threads per SM, %d passes per case\n", prop.name,
              blocks, reps);
  int failures = 0;
  for (const uint64_t m : mib) {
    const uint64_t bytes = m << 20;
    const uint64_t units = bytes / 16;
    // The reference: block2 (reduce_direct's shape), checked on the host at sampled units.
    kCases[0].kernel<<<blocks, 512, 0, s>>>(own, peer, ref, units);
    CK(cudaStreamSynchronize(s));
    {
      std::vector<uint16_t> a(8), b(8), r(8);
      int wrong = 0;
      for (uint64_t u = 0; u < units; u += units / 997 + 1) {
        CK(cudaMemcpy(a.data(), own + u, 16, cudaMemcpyDefault));
        CK(cudaMemcpy(b.data(), peer + u, 16, cudaMemcpyDefault));
        CK(cudaMemcpy(r.data(), ref + u, 16, cudaMemcpyDefault));
        for (int i = 0; i < 8; ++i) {
          const float want = bf16_to_float(a[i]) + bf16_to_float(b[i]);
          const float got = bf16_to_float(r[i]);
          if (std::abs(got - want) > std::abs(want) * (1.0f / 128) + 1e-30f) ++wrong;
        }
      }
      std::printf("# %llu MiB: reference %s on the host's sample\n", static_cast<unsigned long long>(m),
                  wrong == 0 ? "matches" : "DOES NOT match");
      failures += wrong != 0;
    }
    for (const Case& c : kCases) {
      uint4* dst = c.to_peer ? peer_out : out;
      CK(cudaMemsetAsync(dst, 0xff, bytes, s));
      c.kernel<<<blocks, 512, 0, s>>>(own, peer, dst, units);  // warm-up, then checked
      *bad = 0;
      CK(cudaStreamSynchronize(s));
      const uint4* want = c.want == Want::Sum ? ref : c.want == Want::Peer ? peer : own;
      compare_kernel<<<1024, 512, 0, s>>>(reinterpret_cast<const uint32_t*>(dst),
                                          reinterpret_cast<const uint32_t*>(want), bytes / 4, bad);
      CK(cudaStreamSynchronize(s));
      const unsigned long long wrong = *bad;
      std::vector<float> times;
      for (int r = 0; r < 3; ++r) {
        CK(cudaEventRecord(t0, s));
        for (int i = 0; i < reps; ++i) c.kernel<<<blocks, 512, 0, s>>>(own, peer, dst, units);
        CK(cudaEventRecord(t1, s));
        CK(cudaEventSynchronize(t1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        times.push_back(ms * 1000 / reps);
      }
      std::sort(times.begin(), times.end());
      std::printf("%-9s %6llu MiB  %9.1f us  %6.1f GB/s (bytes over NVLink)  %s\n", c.name,
                  static_cast<unsigned long long>(m), times[1], bytes / (times[1] * 1e3),
                  wrong == 0 ? "ok" : "WRONG");
      failures += wrong != 0;
    }
  }
  return failures == 0 ? 0 : 1;
}
