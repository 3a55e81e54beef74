/* Compiled by build.rs with the host C compiler: runs the headers' static asserts as C,
 * rejects implicit padding in their structs, and reports the C compiler's size and alignment
 * of every struct of abi.h, abi_channels.h and abi_allreduce.h, by name, so a Rust test can
 * compare them with the bindgen structs (see abi.rs). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Rust's KernelArgs views these structs as bytes, which is sound only if no byte is
 * padding: a header struct that the compiler pads (inside or at the end) fails the build
 * here, and wants an explicit `_pad` field. GCC and clang both honour this pragma; clang
 * reports a struct once its layout is computed, which the sizeof()s below force for all. */
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#include "oxccl/abi.h"
#pragma GCC diagnostic pop

/* Where the abort word sits in the scratch kernels' blocks: after the 64-bit fields, before
 * the 32-bit ones, so neither block gains padding (device code and the Rust structs read
 * it at these offsets). */
_Static_assert(offsetof(OxcclAllreduceArgs, abort_flag) == 128, "OxcclAllreduceArgs.abort_flag");
_Static_assert(offsetof(OxcclAllreduceArgs, rank) == 136, "OxcclAllreduceArgs.rank");
_Static_assert(offsetof(OxcclPortAllreduceArgs, abort_flag) == 72,
               "OxcclPortAllreduceArgs.abort_flag");
_Static_assert(_Alignof(OxcclAllreduceArgs) == 8 && _Alignof(OxcclPortAllreduceArgs) == 8,
               "argument blocks are 8-byte aligned");

typedef struct OxcclAbiLayout {
  const char* name;
  uint64_t size;
  uint64_t align;
} OxcclAbiLayout;

#define OXCCL_LAYOUT(t) {#t, sizeof(t), _Alignof(t)}

/* Every struct of the three headers: a new struct gets a line here and in abi.rs's
 * OXCCL_ABI_STRUCTS (the Rust tests check both lists against each other and the headers). */
static const OxcclAbiLayout kLayouts[] = {
    OXCCL_LAYOUT(OxcclLL16Packet),
    OXCCL_LAYOUT(OxcclLL8Packet),
    OXCCL_LAYOUT(OxcclDeviceSemaphore),
    OXCCL_LAYOUT(OxcclHostDeviceSemaphore),
    OXCCL_LAYOUT(OxcclMemoryChannel),
    OXCCL_LAYOUT(OxcclProxyTrigger),
    OXCCL_LAYOUT(OxcclFifo),
    OXCCL_LAYOUT(OxcclPortChannel),
    OXCCL_LAYOUT(OxcclSignalArgs),
    OXCCL_LAYOUT(OxcclWaitArgs),
    OXCCL_LAYOUT(OxcclCopyArgs),
    OXCCL_LAYOUT(OxcclPatternArgs),
    OXCCL_LAYOUT(OxcclSelftestDecodeArgs),
    OXCCL_LAYOUT(OxcclSelftestEncodeArgs),
    OXCCL_LAYOUT(OxcclSelftestReduceArgs),
    OXCCL_LAYOUT(OxcclScaleArgs),
    OXCCL_LAYOUT(OxcclSwitchChannel),
    OXCCL_LAYOUT(OxcclMemoryChannelArgs),
    OXCCL_LAYOUT(OxcclPortChannelArgs),
    OXCCL_LAYOUT(OxcclSwitchChannelArgs),
    OXCCL_LAYOUT(OxcclAllreduceArgs),
    OXCCL_LAYOUT(OxcclAlltoallvArgs),
    OXCCL_LAYOUT(OxcclPortAllreduceArgs),
};

/* Number of structs listed. */
uint32_t oxccl_abi_struct_count(void) {
  return (uint32_t)(sizeof(kLayouts) / sizeof(kLayouts[0]));
}

/* Size (high 32 bits) and alignment (low 32 bits) of the struct named `name` (a
 * NUL-terminated string); 0 for a name not listed. */
uint64_t oxccl_abi_layout(const char* name) {
  for (size_t i = 0; i < sizeof(kLayouts) / sizeof(kLayouts[0]); ++i) {
    if (strcmp(kLayouts[i].name, name) == 0) {
      return (kLayouts[i].size << 32) | kLayouts[i].align;
    }
  }
  return 0;
}
