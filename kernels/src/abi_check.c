/* Compiled by build.rs with the host C compiler: runs abi.h's static asserts as C, and
 * reports the C compiler's sizes and alignments so Rust tests can compare them with the
 * bindgen structs (see abi.rs). */
#include <stddef.h>

#include "oxccl/abi.h"

#define OXCCL_LAYOUT(t) (((uint64_t)sizeof(t) << 32) | (uint64_t)_Alignof(t))

/* Size (high 32 bits) and alignment (low 32 bits) of struct number `which`, in the order
 * of OXCCL_ABI_STRUCTS in abi.rs; 0 for an unknown number. */
uint64_t oxccl_abi_layout(uint32_t which) {
  switch (which) {
    case 0: return OXCCL_LAYOUT(OxcclLL16Packet);
    case 1: return OXCCL_LAYOUT(OxcclLL8Packet);
    case 2: return OXCCL_LAYOUT(OxcclDeviceSemaphore);
    case 3: return OXCCL_LAYOUT(OxcclHostDeviceSemaphore);
    case 4: return OXCCL_LAYOUT(OxcclMemoryChannel);
    case 5: return OXCCL_LAYOUT(OxcclProxyTrigger);
    case 6: return OXCCL_LAYOUT(OxcclFifo);
    case 7: return OXCCL_LAYOUT(OxcclPortChannel);
    case 8: return OXCCL_LAYOUT(OxcclSignalArgs);
    case 9: return OXCCL_LAYOUT(OxcclWaitArgs);
    case 10: return OXCCL_LAYOUT(OxcclCopyArgs);
    case 11: return OXCCL_LAYOUT(OxcclPatternArgs);
    case 12: return OXCCL_LAYOUT(OxcclSelftestDecodeArgs);
    case 13: return OXCCL_LAYOUT(OxcclSelftestEncodeArgs);
    case 14: return OXCCL_LAYOUT(OxcclSelftestReduceArgs);
    default: return 0;
  }
}
