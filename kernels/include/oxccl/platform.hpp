// oxccl/platform.hpp: the one place that decides CUDA vs HIP.
//
// Kernels and the other headers never test the vendor's own macros; they use:
//   OXCCL_DEVICE_CUDA / OXCCL_DEVICE_HIP   exactly one is defined (to 1)
//   OXCCL_DEVICE_COMPILE                   defined while compiling device code
//   OXCCL_DEVICE_INLINE                    __device__ forced-inline function
//   OXCCL_HOST_DEVICE_INLINE               __host__ __device__ forced-inline function
//   OXCCL_GLOBAL                           extern "C" __global__ (unmangled kernel names)
//   OXCCL_GRID_CONSTANT                    a by-value kernel parameter used by reference
//   oxccl_thread_index() etc.              launch geometry as 64-bit values
//   wait_prior_grid(), launch_dependents()  programmatic dependent launch (CUDA sm_90)
#ifndef OXCCL_PLATFORM_HPP_
#define OXCCL_PLATFORM_HPP_

#if defined(__HIP__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define OXCCL_DEVICE_HIP 1
#include <hip/hip_runtime.h>
#elif defined(__CUDACC__)
#define OXCCL_DEVICE_CUDA 1
#include <cuda_runtime.h>
#else
#error "oxccl device headers must be compiled as CUDA (nvcc) or HIP (clang -x hip)"
#endif

#if (defined(OXCCL_DEVICE_CUDA) && defined(__CUDA_ARCH__)) || \
    (defined(OXCCL_DEVICE_HIP) && defined(__HIP_DEVICE_COMPILE__))
#define OXCCL_DEVICE_COMPILE 1
#endif

#include <stdint.h>

#define OXCCL_DEVICE_INLINE __device__ __forceinline__
#define OXCCL_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#define OXCCL_GLOBAL extern "C" __global__

// A kernel parameter that device functions may take by reference without a copy. CUDA
// otherwise copies a by-value struct into every thread's local memory as soon as its
// address is taken (280 bytes of stores at the start of an allreduce kernel); HIP's
// kernel arguments live in addressable memory already.
#if defined(OXCCL_DEVICE_CUDA)
#define OXCCL_GRID_CONSTANT __grid_constant__
#else
#define OXCCL_GRID_CONSTANT
#endif

namespace oxccl {

/// Index of this thread in the whole (one-dimensional) grid.
OXCCL_DEVICE_INLINE uint64_t thread_index() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

/// Number of threads in the whole (one-dimensional) grid: the grid-stride step.
OXCCL_DEVICE_INLINE uint64_t thread_count() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

/// Programmatic dependent launch (the HAL's `LaunchConfig::early_launch`): a kernel so
/// launched may already run while the kernel before it on its stream finishes. It must
/// call `wait_prior_grid()` before touching memory earlier work wrote: that returns once
/// the previous kernel has completed and its writes are visible. `launch_dependents()`
/// lets the next kernel on the stream (when it too was launched early) be scheduled now,
/// to wait in its own `wait_prior_grid()`. Both are no-ops on a plain launch, before
/// sm_90, and on HIP, which has no such launch.
OXCCL_DEVICE_INLINE void wait_prior_grid() {
#if defined(OXCCL_DEVICE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

OXCCL_DEVICE_INLINE void launch_dependents() {
#if defined(OXCCL_DEVICE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Reinterprets the bits of `from` as a `To` of the same size.
template <typename To, typename From>
OXCCL_HOST_DEVICE_INLINE To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  __builtin_memcpy(&to, &from, sizeof(To));
  return to;
}

}  // namespace oxccl

#endif  // OXCCL_PLATFORM_HPP_
