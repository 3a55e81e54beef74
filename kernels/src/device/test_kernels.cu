// Transport test kernels: the smallest pieces the CUDA/ROCm backends and the channel tests
// launch by name (signal/wait across GPUs, peer-store bandwidth, data patterns).
#include "oxccl/abi.h"
#include "oxccl/atomics.hpp"
#include "oxccl/semaphore.hpp"
#include "oxccl/vector.hpp"

namespace oxccl {

/// The test pattern; kernels/src/pattern.rs (`pattern::value`) is the same function.
OXCCL_DEVICE_INLINE uint32_t pattern_value(uint32_t seed, uint64_t index) {
  const uint32_t lo = static_cast<uint32_t>(index);
  const uint32_t hi = static_cast<uint32_t>(index >> 32);
  uint32_t x = (lo * 0x9e3779b9u) ^ (hi * 0x85ebca6bu) ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

}  // namespace oxccl

OXCCL_GLOBAL void oxccl_test_signal(OxcclSignalArgs args) {
  if (oxccl::thread_index() == 0) oxccl::atomic_add_release(args.flag, args.value);
}

OXCCL_GLOBAL void oxccl_test_wait(OxcclWaitArgs args) {
  if (oxccl::thread_index() != 0) return;
  const oxccl::WaitResult r = oxccl::poll_until_at_least(args.flag, args.expected, args.max_spins);
  *args.result = static_cast<uint32_t>(r);
}

OXCCL_GLOBAL void oxccl_test_store16(OxcclCopyArgs args) {
  const uint64_t tid = oxccl::thread_index();
  const uint64_t stride = oxccl::thread_count();
  const uint64_t vectors = args.bytes / 16;
  auto* dst = static_cast<char*>(args.dst);
  const auto* src = static_cast<const char*>(args.src);
  for (uint64_t i = tid; i < vectors; i += stride) {
    oxccl::store16(dst + i * 16, oxccl::load16(src + i * 16));
  }
  // Tail (< 16 bytes): one byte per thread.
  for (uint64_t i = vectors * 16 + tid; i < args.bytes; i += stride) dst[i] = src[i];
}

OXCCL_GLOBAL void oxccl_test_fill_pattern(OxcclPatternArgs args) {
  const uint64_t stride = oxccl::thread_count();
  for (uint64_t i = oxccl::thread_index(); i < args.count; i += stride) {
    args.data[i] = oxccl::pattern_value(args.seed, i);
  }
}

OXCCL_GLOBAL void oxccl_test_check_pattern(OxcclPatternArgs args) {
  const uint64_t stride = oxccl::thread_count();
  uint64_t bad = 0;
  for (uint64_t i = oxccl::thread_index(); i < args.count; i += stride) {
    bad += args.data[i] != oxccl::pattern_value(args.seed, i) ? 1 : 0;
  }
  if (bad != 0) oxccl::atomic_fetch_add_relaxed(args.mismatches, bad);
}
