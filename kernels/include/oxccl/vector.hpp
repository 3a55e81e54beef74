// oxccl/vector.hpp: 16-byte (and 8-byte) vector loads and stores, the unit every copy and
// reduction moves. Plain loads/stores compile to LDG.E.128 / STG.E.128 on NVIDIA and
// global_load_dwordx4 / global_store_dwordx4 on AMD; the volatile forms are for data that
// another GPU may be writing while we read (LL packets), so the compiler neither caches
// nor splits the access.
#ifndef OXCCL_VECTOR_HPP_
#define OXCCL_VECTOR_HPP_

#include "platform.hpp"

namespace oxccl {

/// 16 bytes as four 32-bit words, 16-byte aligned.
struct alignas(16) Vec16 {
  uint32_t w[4];
};

/// 8 bytes as two 32-bit words, 8-byte aligned.
struct alignas(8) Vec8 {
  uint32_t w[2];
};

/// Loads 16 bytes from a 16-byte aligned address.
OXCCL_DEVICE_INLINE Vec16 load16(const void* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return Vec16{{v.x, v.y, v.z, v.w}};
}

/// Stores 16 bytes to a 16-byte aligned address.
OXCCL_DEVICE_INLINE void store16(void* p, const Vec16& v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

/// Loads 16 bytes with one volatile (uncached-by-the-compiler, not split) access.
OXCCL_DEVICE_INLINE Vec16 load16_volatile(const void* p) {
#if defined(OXCCL_DEVICE_CUDA)
  Vec16 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p)
               : "memory");
  return v;
#else
  // A 128-bit integer access is one global_load_dwordx4; __builtin_nontemporal_load keeps
  // it a single instruction and uncached-by-the-compiler (it is re-read on every call).
  typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
  const u32x4 x = __builtin_nontemporal_load(reinterpret_cast<const u32x4*>(p));
  return Vec16{{x[0], x[1], x[2], x[3]}};
#endif
}

/// Stores 16 bytes with one volatile access.
OXCCL_DEVICE_INLINE void store16_volatile(void* p, const Vec16& v) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.w[0]),
               "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3])
               : "memory");
#else
  typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
  u32x4 x = {v.w[0], v.w[1], v.w[2], v.w[3]};
  __builtin_nontemporal_store(x, reinterpret_cast<u32x4*>(p));
#endif
}

/// Loads 8 bytes with one volatile access.
OXCCL_DEVICE_INLINE Vec8 load8_volatile(const void* p) {
#if defined(OXCCL_DEVICE_CUDA)
  Vec8 v;
  asm volatile("ld.volatile.global.v2.u32 {%0,%1}, [%2];"
               : "=r"(v.w[0]), "=r"(v.w[1])
               : "l"(p)
               : "memory");
  return v;
#else
  const uint64_t x = __builtin_nontemporal_load(reinterpret_cast<const uint64_t*>(p));
  return Vec8{{static_cast<uint32_t>(x), static_cast<uint32_t>(x >> 32)}};
#endif
}

/// Stores 8 bytes with one volatile access.
OXCCL_DEVICE_INLINE void store8_volatile(void* p, const Vec8& v) {
#if defined(OXCCL_DEVICE_CUDA)
  asm volatile("st.volatile.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1])
               : "memory");
#else
  const uint64_t x = static_cast<uint64_t>(v.w[0]) | (static_cast<uint64_t>(v.w[1]) << 32);
  __builtin_nontemporal_store(x, reinterpret_cast<uint64_t*>(p));
#endif
}

}  // namespace oxccl

#endif  // OXCCL_VECTOR_HPP_
