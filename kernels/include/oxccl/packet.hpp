// oxccl/packet.hpp: LL ("low latency") packets, data and flag in one store.
//
// The writer puts data and the current flag value into one 16-byte (LL16) or 8-byte (LL8)
// store; the reader spins with single loads of the same width until the flag(s) equal the
// value it expects, at which point the data in the same load is valid. No fence and no
// separate semaphore are needed, because a 16-/8-byte aligned store is not torn. The flag
// changes each round (e.g. an iteration counter), so stale packets never match.
//
// Correctness needs: same-width single accesses (volatile so the compiler keeps them
// whole and re-reads), and buffers aligned to the packet size.
#ifndef OXCCL_PACKET_HPP_
#define OXCCL_PACKET_HPP_

#include "abi.h"
#include "semaphore.hpp"
#include "vector.hpp"

namespace oxccl {

/// Writes an LL16 packet holding two data words under `flag`.
OXCCL_DEVICE_INLINE void ll16_write(OxcclLL16Packet* p, uint32_t d1, uint32_t d2,
                                    uint32_t flag) {
  store16_volatile(p, Vec16{{d1, flag, d2, flag}});
}

/// Reads an LL16 packet once: true (and the data) when both flags equal `flag`.
OXCCL_DEVICE_INLINE bool ll16_try_read(const OxcclLL16Packet* p, uint32_t flag, uint32_t* d1,
                                       uint32_t* d2) {
  const Vec16 v = load16_volatile(p);
  if (v.w[1] != flag || v.w[3] != flag) return false;
  *d1 = v.w[0];
  *d2 = v.w[2];
  return true;
}

/// Spins until an LL16 packet carries `flag`, at most `max_spins` reads (0 = unbounded).
OXCCL_DEVICE_INLINE WaitResult ll16_read(const OxcclLL16Packet* p, uint32_t flag,
                                         uint64_t max_spins, uint32_t* d1, uint32_t* d2) {
  for (uint64_t spins = 0;; ++spins) {
    if (ll16_try_read(p, flag, d1, d2)) return WaitResult::Ok;
    if (max_spins != 0 && spins + 1 >= max_spins) return WaitResult::Timeout;
  }
}

/// Writes an LL8 packet holding one data word under `flag`.
OXCCL_DEVICE_INLINE void ll8_write(OxcclLL8Packet* p, uint32_t data, uint32_t flag) {
  store8_volatile(p, Vec8{{data, flag}});
}

/// Reads an LL8 packet once: true (and the data) when its flag equals `flag`.
OXCCL_DEVICE_INLINE bool ll8_try_read(const OxcclLL8Packet* p, uint32_t flag, uint32_t* data) {
  const Vec8 v = load8_volatile(p);
  if (v.w[1] != flag) return false;
  *data = v.w[0];
  return true;
}

/// Spins until an LL8 packet carries `flag`, at most `max_spins` reads (0 = unbounded).
OXCCL_DEVICE_INLINE WaitResult ll8_read(const OxcclLL8Packet* p, uint32_t flag,
                                        uint64_t max_spins, uint32_t* data) {
  for (uint64_t spins = 0;; ++spins) {
    if (ll8_try_read(p, flag, data)) return WaitResult::Ok;
    if (max_spins != 0 && spins + 1 >= max_spins) return WaitResult::Timeout;
  }
}

}  // namespace oxccl

#endif  // OXCCL_PACKET_HPP_
