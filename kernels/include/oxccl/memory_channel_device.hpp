// oxccl/memory_channel_device.hpp: device side of a MemoryChannel (OxcclMemoryChannel).
//
// GPU threads load and store the peer's buffer directly (NVLink / xGMI through the IPC
// mapping). Data calls (put/get/put_packets/get_packets) are cooperative: every thread of
// the group calls them with its index and the group size, and each moves its share with
// 16-byte accesses. Synchronisation calls (signal/wait) are made by one thread; the caller
// synchronises its group around them (__syncthreads) as the algorithm needs.
//
// The host backend runs the same protocol in Rust (channels/src/memory_channel.rs,
// `host_ops`), including the packet layout, so CI checks the semantics.
#ifndef OXCCL_MEMORY_CHANNEL_DEVICE_HPP_
#define OXCCL_MEMORY_CHANNEL_DEVICE_HPP_

#include "abi.h"
#include "atomics.hpp"
#include "packet.hpp"
#include "semaphore.hpp"
#include "vector.hpp"

namespace oxccl {

/// Cooperative copy of `bytes` bytes: thread `tid` of `nthreads` moves its share.
/// 16-byte loads/stores where dst and src share their alignment modulo 16 (the head and
/// tail bytes one by one), 4 vectors in flight per thread; bytes otherwise.
OXCCL_DEVICE_INLINE void channel_copy(char* dst, const char* src, uint64_t bytes, uint64_t tid,
                                      uint64_t nthreads) {
  const uint64_t mis = reinterpret_cast<uint64_t>(dst) & 15;
  if (mis != (reinterpret_cast<uint64_t>(src) & 15)) {
    for (uint64_t i = tid; i < bytes; i += nthreads) dst[i] = src[i];
    return;
  }
  uint64_t head = mis == 0 ? 0 : 16 - mis;
  if (head > bytes) head = bytes;
  for (uint64_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  char* d = dst + head;
  const char* s = src + head;
  const uint64_t vectors = (bytes - head) / 16;
  constexpr uint64_t kUnroll = 4;
  const uint64_t groups = vectors / kUnroll;
  for (uint64_t g = tid; g < groups; g += nthreads) {
    Vec16 v[kUnroll];
#pragma unroll
    for (uint64_t u = 0; u < kUnroll; ++u) v[u] = load16(s + (g + u * groups) * 16);
#pragma unroll
    for (uint64_t u = 0; u < kUnroll; ++u) store16(d + (g + u * groups) * 16, v[u]);
  }
  for (uint64_t i = groups * kUnroll + tid; i < vectors; i += nthreads) {
    store16(d + i * 16, load16(s + i * 16));
  }
  const uint64_t done = head + vectors * 16;
  for (uint64_t i = done + tid; i < bytes; i += nthreads) dst[i] = src[i];
}

/// Reads up to 8 little-endian bytes (fewer at the end of a buffer; the rest are zero).
OXCCL_DEVICE_INLINE uint64_t channel_load_partial(const char* src, uint64_t n) {
  uint64_t v = 0;
  for (uint64_t b = 0; b < n; ++b) v |= static_cast<uint64_t>(static_cast<uint8_t>(src[b])) << (8 * b);
  return v;
}

/// Writes the low `n` bytes of `v` (little-endian).
OXCCL_DEVICE_INLINE void channel_store_partial(char* dst, uint64_t v, uint64_t n) {
  for (uint64_t b = 0; b < n; ++b) dst[b] = static_cast<char>(v >> (8 * b));
}

struct MemoryChannelDevice {
  OxcclMemoryChannel h;

  OXCCL_DEVICE_INLINE DeviceSemaphore semaphore() const { return DeviceSemaphore{h.semaphore}; }

  /// Copies local[src_offset..+bytes] into the peer's remote[dst_offset..].
  OXCCL_DEVICE_INLINE void put(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                               uint64_t tid, uint64_t nthreads) const {
    channel_copy(static_cast<char*>(h.remote) + dst_offset,
                 static_cast<const char*>(h.local) + src_offset, bytes, tid, nthreads);
  }

  /// Copies the peer's remote[src_offset..+bytes] into local[dst_offset..].
  OXCCL_DEVICE_INLINE void get(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                               uint64_t tid, uint64_t nthreads) const {
    channel_copy(static_cast<char*>(h.local) + dst_offset,
                 static_cast<const char*>(h.remote) + src_offset, bytes, tid, nthreads);
  }

  /// Writes local[src_offset..+bytes] as LL16 packets (8 data bytes each, the last one
  /// zero-padded) at byte `packet_offset` (16-aligned) of the peer's packet buffer.
  OXCCL_DEVICE_INLINE void put_packets_ll16(uint64_t packet_offset, uint64_t src_offset,
                                            uint64_t bytes, uint32_t flag, uint64_t tid,
                                            uint64_t nthreads) const {
    auto* pk = reinterpret_cast<OxcclLL16Packet*>(static_cast<char*>(h.remote_packets) + packet_offset);
    const char* src = static_cast<const char*>(h.local) + src_offset;
    const uint64_t n = (bytes + 7) / 8;
    for (uint64_t i = tid; i < n; i += nthreads) {
      const uint64_t left = bytes - i * 8;
      const uint64_t v = channel_load_partial(src + i * 8, left < 8 ? left : 8);
      ll16_write(&pk[i], static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32), flag);
    }
  }

  /// Reads LL16 packets carrying `flag` from byte `packet_offset` of this GPU's packet
  /// buffer into local[dst_offset..+bytes]. False when a packet did not arrive within
  /// max_spins polls (what was read so far is written).
  OXCCL_DEVICE_INLINE bool get_packets_ll16(uint64_t packet_offset, uint64_t dst_offset,
                                            uint64_t bytes, uint32_t flag, uint64_t tid,
                                            uint64_t nthreads) const {
    const auto* pk = reinterpret_cast<const OxcclLL16Packet*>(
        static_cast<const char*>(h.local_packets) + packet_offset);
    char* dst = static_cast<char*>(h.local) + dst_offset;
    const uint64_t n = (bytes + 7) / 8;
    for (uint64_t i = tid; i < n; i += nthreads) {
      uint32_t d1 = 0, d2 = 0;
      if (ll16_read(&pk[i], flag, h.semaphore.max_spins, &d1, &d2) != WaitResult::Ok) return false;
      const uint64_t left = bytes - i * 8;
      channel_store_partial(dst + i * 8, static_cast<uint64_t>(d1) | (static_cast<uint64_t>(d2) << 32),
                            left < 8 ? left : 8);
    }
    return true;
  }

  /// LL8 version of put_packets_ll16: 4 data bytes per 8-byte packet (8-aligned offset).
  OXCCL_DEVICE_INLINE void put_packets_ll8(uint64_t packet_offset, uint64_t src_offset,
                                           uint64_t bytes, uint32_t flag, uint64_t tid,
                                           uint64_t nthreads) const {
    auto* pk = reinterpret_cast<OxcclLL8Packet*>(static_cast<char*>(h.remote_packets) + packet_offset);
    const char* src = static_cast<const char*>(h.local) + src_offset;
    const uint64_t n = (bytes + 3) / 4;
    for (uint64_t i = tid; i < n; i += nthreads) {
      const uint64_t left = bytes - i * 4;
      ll8_write(&pk[i], static_cast<uint32_t>(channel_load_partial(src + i * 4, left < 4 ? left : 4)), flag);
    }
  }

  /// LL8 version of get_packets_ll16.
  OXCCL_DEVICE_INLINE bool get_packets_ll8(uint64_t packet_offset, uint64_t dst_offset,
                                           uint64_t bytes, uint32_t flag, uint64_t tid,
                                           uint64_t nthreads) const {
    const auto* pk = reinterpret_cast<const OxcclLL8Packet*>(
        static_cast<const char*>(h.local_packets) + packet_offset);
    char* dst = static_cast<char*>(h.local) + dst_offset;
    const uint64_t n = (bytes + 3) / 4;
    for (uint64_t i = tid; i < n; i += nthreads) {
      uint32_t d = 0;
      if (ll8_read(&pk[i], flag, h.semaphore.max_spins, &d) != WaitResult::Ok) return false;
      const uint64_t left = bytes - i * 4;
      channel_store_partial(dst + i * 4, d, left < 4 ? left : 4);
    }
    return true;
  }

  /// Release signal: the peer sees every write made before it (by this thread, or by its
  /// group when the group synchronised first).
  OXCCL_DEVICE_INLINE void signal() const { semaphore().signal(); }

  /// Relaxed signal: counts, orders nothing (pair with flush() or another signal).
  OXCCL_DEVICE_INLINE void relaxed_signal() const {
#if defined(OXCCL_DEVICE_CUDA)
    asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(h.semaphore.remote_inbound),
                 "l"(uint64_t{1})
                 : "memory");
#else
    (void)__hip_atomic_fetch_add(h.semaphore.remote_inbound, uint64_t{1}, __ATOMIC_RELAXED,
                                 __HIP_MEMORY_SCOPE_SYSTEM);
#endif
  }

  /// Waits for the peer's next signal (bounded by max_spins).
  OXCCL_DEVICE_INLINE WaitResult wait() const { return semaphore().wait(); }

  /// Makes this thread's earlier stores to the peer visible system-wide before its later
  /// ones (a MemoryChannel has no queue to drain: the stores are the transfer).
  OXCCL_DEVICE_INLINE void flush() const { fence_system(); }
};

}  // namespace oxccl

#endif  // OXCCL_MEMORY_CHANNEL_DEVICE_HPP_
