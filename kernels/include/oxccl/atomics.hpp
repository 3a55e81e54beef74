// oxccl/atomics.hpp: device-side atomics on flags that other GPUs (and the host) read and
// write. Everything here is system scope: the other side may be a peer GPU over NVLink /
// xGMI or the CPU, so device or block scope would be wrong.
//
// NVIDIA: PTX with explicit .acquire/.release and .sys scope (sm_70+). AMD: the clang
// __hip_atomic_* builtins with __HIP_MEMORY_SCOPE_SYSTEM, which emit the sc0/sc1 cache
// policy bits and the L2 writeback/invalidate that gfx942 needs for system coherence.
#ifndef OXCCL_ATOMICS_HPP_
#define OXCCL_ATOMICS_HPP_

#include "platform.hpp"

namespace oxccl {

/// Acquire load: later reads of this thread see everything released before the value.
OXCCL_DEVICE_INLINE uint64_t atomic_load_acquire(const uint64_t* ptr) {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
#else
  return __hip_atomic_load(ptr, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// 32-bit acquire load.
OXCCL_DEVICE_INLINE uint32_t atomic_load_acquire(const uint32_t* ptr) {
#if defined(OXCCL_DEVICE_CUDA)
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
#else
  return __hip_atomic_load(ptr, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Relaxed load: atomic (no tearing, not cached in a register across polls), no ordering.
OXCCL_DEVICE_INLINE uint64_t atomic_load_relaxed(const uint64_t* ptr) {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
#else
  return __hip_atomic_load(ptr, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Release store: everything this thread wrote before is visible to whoever acquires it.
OXCCL_DEVICE_INLINE void atomic_store_release(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  __hip_atomic_store(ptr, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Relaxed store (atomic, unordered).
OXCCL_DEVICE_INLINE void atomic_store_relaxed(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  __hip_atomic_store(ptr, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Fetch-add with release ordering; returns the previous value.
OXCCL_DEVICE_INLINE uint64_t atomic_fetch_add_release(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t old;
  asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(ptr), "l"(value)
               : "memory");
  return old;
#else
  return __hip_atomic_fetch_add(ptr, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Relaxed fetch-add (counters without ordering, e.g. mismatch counts).
OXCCL_DEVICE_INLINE uint64_t atomic_fetch_add_relaxed(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t old;
  asm volatile("atom.relaxed.sys.global.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(ptr), "l"(value)
               : "memory");
  return old;
#else
  return __hip_atomic_fetch_add(ptr, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Fire-and-forget release add: like atomic_fetch_add_release but the old value is not
/// returned, so the thread does not wait for the round trip to the (possibly remote) memory.
/// This is the semaphore signal.
OXCCL_DEVICE_INLINE void atomic_add_release(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  // The result is unused, so the backend selects the no-return form of the atomic.
  (void)__hip_atomic_fetch_add(ptr, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// System-scope relaxed add whose result is not returned: a signal that orders nothing
/// (`start_barrier`: the signaller has written nothing the peer will read).
OXCCL_DEVICE_INLINE void atomic_add_relaxed(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  (void)__hip_atomic_fetch_add(ptr, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

/// Device-scope release add whose result is not returned: a count that only this GPU's
/// blocks read.
OXCCL_DEVICE_INLINE void atomic_add_release_device(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  (void)__hip_atomic_fetch_add(ptr, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

/// Device-scope relaxed add whose result is not returned: a counter that only this GPU
/// reads, ordered for its readers by something else (a kernel boundary).
OXCCL_DEVICE_INLINE void atomic_add_relaxed_device(uint64_t* ptr, uint64_t value) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(value) : "memory");
#else
  (void)__hip_atomic_fetch_add(ptr, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

/// Full system-scope fence (sequentially consistent).
OXCCL_DEVICE_INLINE void fence_system() {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("fence.sc.sys;" ::: "memory");
#else
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "");  // "" = system scope
#endif
}

}  // namespace oxccl

#endif  // OXCCL_ATOMICS_HPP_
