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

// A device function that the CUDA build keeps out of line (one per instantiation, called
// from a type dispatch) and the HIP build inlines: on gfx942 a call needs a stack in
// scratch memory (ci/toolchains/check-artifacts.sh allows none).
#if defined(OXCCL_DEVICE_CUDA)
#define OXCCL_DEVICE_OUTLINED __device__ __noinline__
#else
#define OXCCL_DEVICE_OUTLINED __device__ __forceinline__
#endif

// A device function that the HIP build must inline and the CUDA build leaves to nvcc (as
// before: its sm_90 code is unchanged). On gfx942 a call needs a stack in scratch memory.
#if defined(OXCCL_DEVICE_CUDA)
#define OXCCL_DEVICE_INLINE_ON_HIP __device__
#else
#define OXCCL_DEVICE_INLINE_ON_HIP __device__ __forceinline__
#endif

// A kernel parameter that device functions may take by reference without a copy. CUDA
// otherwise copies a by-value struct into every thread's local memory as soon as its
// address is taken (280 bytes of stores at the start of an allreduce kernel); HIP's
// kernel arguments live in addressable memory already.
#if defined(OXCCL_DEVICE_CUDA)
#define OXCCL_GRID_CONSTANT __grid_constant__
#else
#define OXCCL_GRID_CONSTANT
#endif

// A lambda that must be inlined into its caller on HIP, written after its parameter list:
// `[&](...) OXCCL_INLINE_LAMBDA { ... }`. The kernels pass their bodies to the prologue
// (`run_call`) and the type dispatchers as lambdas; clang (HIP) left some of those calls
// in place, and on gfx942 a call needs a stack in scratch memory and pins the caller's
// registers around it (ci/toolchains/check-artifacts.sh fails on any scratch). Nothing on
// CUDA: forced there, the inlined lambdas made nvcc keep dispatch_all out of line, and
// the reducing kernels went from STACK 0 to 48 bytes (and the LL16 one-shot from 192 to
// 360) on sm_90.
#if defined(OXCCL_DEVICE_HIP)
#define OXCCL_INLINE_LAMBDA __attribute__((always_inline))
#else
#define OXCCL_INLINE_LAMBDA
#endif

// Launch bounds of a kernel of at most `threads` threads per block. CUDA: that maximum and
// at least one block per SM (the register budget is then the whole 255 per thread). HIP:
// that maximum and at least 4 waves per SIMD: gfx942 gives a SIMD 512 VGPRs per lane
// (ArchVGPRs and AGPRs from one file), so a wave may use at most 128 of them; without
// the bound a 512-thread block (2 waves per SIMD) let clang take up to 256, and the
// budget in ci/toolchains/check-artifacts.sh is 128 with no scratch.
#define OXCCL_HIP_MIN_WAVES_PER_EU 4
#if defined(OXCCL_DEVICE_CUDA)
#define OXCCL_LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define OXCCL_LAUNCH_BOUNDS(threads) \
  __launch_bounds__(threads) __attribute__((amdgpu_waves_per_eu(OXCCL_HIP_MIN_WAVES_PER_EU)))
#endif

namespace oxccl {

/// LL16 readers poll the packets of this many ranks at once (all of them in flight before
/// any is checked; see `allreduce::ll16_read_peers`). CUDA: every rank (8: 16 packets,
/// 64 registers). HIP: 4, so the packets in flight take 32 of a gfx942 wave's 128 VGPRs.
#if defined(OXCCL_DEVICE_CUDA)
constexpr uint32_t kLl16PollRanks = 8;
#else
constexpr uint32_t kLl16PollRanks = 4;
#endif

/// Index of this thread in the whole (one-dimensional) grid.
OXCCL_DEVICE_INLINE uint64_t thread_index() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

/// Number of threads in the whole (one-dimensional) grid: the grid-stride step.
OXCCL_DEVICE_INLINE uint64_t thread_count() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

/// The kernel's argument block, read where the launch put it. A kernel takes exactly one
/// by-value parameter (kernels/build.rs checks it) and reads it only through this. CUDA:
/// the parameter itself (`OXCCL_GRID_CONSTANT`: in the constant bank, no copy). HIP: clang
/// copies a by-value struct parameter into private memory when it is indexed at run time
/// (`a.scratch[peer]`), and the copy went to scratch or to VGPRs (70 of them for the 280
/// bytes of an allreduce block) on gfx942; the kernarg segment it comes from starts with
/// the parameter, so the reads go there instead (scalar loads for uniform indices).
template <typename T>
OXCCL_DEVICE_INLINE const T& kernel_args(const T& param) {
#if defined(OXCCL_DEVICE_HIP) && defined(__HIP_DEVICE_COMPILE__)
  (void)param;
  // A C-style cast: the segment pointer is in the constant address space.
  return *(const T*)__builtin_amdgcn_kernarg_segment_ptr();
#else
  return param;
#endif
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
