// oxccl/switch_channel_device.hpp: device side of a SwitchChannel (OxcclSwitchChannel).
//
// NVLink SHARP (NVLS): loads through the multicast address with multimem.ld_reduce return
// the reduction over every member's copy, and multimem.st stores to every member at once.
// sm_90 inline PTX; compiled for sm_90 and checked by nvcc here, never run on the lent
// machines (multicast objects are forbidden there, see the HAL's multicast gate). HIP has
// no multicast: on AMD the functions compile to a trap so that a misuse is loud.
#ifndef OXCCL_SWITCH_CHANNEL_DEVICE_HPP_
#define OXCCL_SWITCH_CHANNEL_DEVICE_HPP_

#include "abi.h"
#include "vector.hpp"

namespace oxccl {

struct SwitchChannelDevice {
  OxcclSwitchChannel h;

  /// Sum over every member of 4 f32 at byte `offset` (16-aligned).
  OXCCL_DEVICE_INLINE Vec16 reduce_f32x4(uint64_t offset) const {
    Vec16 v{{0, 0, 0, 0}};
#if defined(OXCCL_DEVICE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char* p = static_cast<const char*>(h.multicast) + offset;
    asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                 : "l"(p)
                 : "memory");
#elif defined(OXCCL_DEVICE_COMPILE)
    (void)offset;
    __builtin_trap();
#endif
    return v;
  }

  /// Stores 4 f32 at byte `offset` (16-aligned) of every member.
  OXCCL_DEVICE_INLINE void broadcast_f32x4(uint64_t offset, const Vec16& v) const {
#if defined(OXCCL_DEVICE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    char* p = static_cast<char*>(h.multicast) + offset;
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1,%2,%3,%4};" ::"l"(p),
                 "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3])
                 : "memory");
#elif defined(OXCCL_DEVICE_COMPILE)
    (void)offset;
    (void)v;
    __builtin_trap();
#endif
  }
};

}  // namespace oxccl

#endif  // OXCCL_SWITCH_CHANNEL_DEVICE_HPP_
