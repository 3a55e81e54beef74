// oxccl/fifo_device.hpp: the producer side of a PortChannel FIFO (OxcclFifo in abi.h).
//
// Protocol (the proxy in channels/src/proxy.rs is the consumer; channels/src/fifo.rs has a
// host producer that mirrors this code line by line for the host backend):
// 1. claim a slot: `slot = atomic add(head, 1)` (head lives in device memory; only
//    producers touch it);
// 2. back-pressure: wait until `slot < tail + size` (tail lives in host memory and only the
//    proxy advances it), so a slot is never overwritten before the proxy consumed it. The
//    last tail a producer read is kept beside head (`head[1]`, device memory; release after
//    the acquire of tail, acquire here, so it vouches for what tail did): only a producer
//    that this cached value does not clear crosses PCIe to read tail again;
// 3. write `snd`, then `fst` with a system-scope release store: `fst != 0` tells the proxy
//    that the slot is full and `snd` is valid;
// 4. the proxy performs the trigger, zeroes `fst`, then release-stores tail = slot + 1.
// A flush pushes a SYNC trigger and waits until tail passes its slot: the proxy advances
// tail past a SYNC only after its connection flushed everything before it.
#ifndef OXCCL_FIFO_DEVICE_HPP_
#define OXCCL_FIFO_DEVICE_HPP_

#include "abi.h"
#include "atomics.hpp"
#include "semaphore.hpp"

namespace oxccl {

/// Builds a trigger (see abi_channels.h for the bit layout).
OXCCL_DEVICE_INLINE OxcclProxyTrigger make_trigger(uint32_t kind, uint32_t semaphore_id,
                                                   uint32_t dst_memory_id, uint32_t src_memory_id,
                                                   uint64_t dst_offset, uint64_t src_offset,
                                                   uint32_t size) {
  OxcclProxyTrigger t;
  t.fst = (static_cast<uint64_t>(kind & 7u) << OXCCL_TRIGGER_KIND_SHIFT) |
          (static_cast<uint64_t>(semaphore_id & 0x1ffu) << OXCCL_TRIGGER_SEMAPHORE_SHIFT) |
          (static_cast<uint64_t>(dst_memory_id & 0x3ffu) << OXCCL_TRIGGER_DST_MEMORY_SHIFT) |
          (static_cast<uint64_t>(src_memory_id & 0x3ffu) << OXCCL_TRIGGER_SRC_MEMORY_SHIFT) |
          static_cast<uint64_t>(size);
  t.snd = ((dst_offset & 0xffffffffull) << 32) | (src_offset & 0xffffffffull);
  return t;
}

/// Producer handle over an OxcclFifo. One thread pushes at a time per call; any number of
/// threads (of any block) may push concurrently.
struct FifoDevice {
  OxcclFifo f;

  /// Pushes `t`; returns the slot it took, or ~0 when back-pressure lasted more than
  /// `max_spins` polls (0 = wait forever). A timed-out push leaves its slot claimed but
  /// unwritten: the FIFO is then unusable and the caller must report the error.
  OXCCL_DEVICE_INLINE uint64_t push(const OxcclProxyTrigger& t, uint64_t max_spins) const {
#if defined(OXCCL_DEVICE_CUDA)
    const uint64_t slot = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), 1ull);
#else
    const uint64_t slot =
        __hip_atomic_fetch_add(f.head, uint64_t{1}, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#endif
    if (slot >= f.size) {
      const uint64_t need = slot - f.size + 1;
      uint64_t* cached = f.head + 1;
      if (atomic_load_acquire(cached) < need) {
        // The tail read crosses PCIe: only producers the cached tail does not clear pay.
        uint64_t seen = 0;
        for (uint64_t spins = 0; (seen = atomic_load_acquire(f.tail)) < need; ++spins) {
          if (max_spins != 0 && spins + 1 >= max_spins) return ~uint64_t{0};
        }
        // A race may store an older value over a newer one: it only costs a later read.
        atomic_store_release(cached, seen);
      }
    }
    OxcclProxyTrigger* p = &f.triggers[slot & (f.size - 1)];
    atomic_store_relaxed(&p->snd, t.snd);
    atomic_store_release(&p->fst, t.fst);
    return slot;
  }

  /// Waits until the proxy has consumed slot `slot` (and, for a SYNC trigger, flushed).
  OXCCL_DEVICE_INLINE WaitResult sync(uint64_t slot, uint64_t max_spins) const {
    return poll_until_at_least(f.tail, slot + 1, max_spins);
  }
};

}  // namespace oxccl

#endif  // OXCCL_FIFO_DEVICE_HPP_
