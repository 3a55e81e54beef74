// oxccl/semaphore.hpp: device side of the semaphores declared in abi.h.
//
// A semaphore is a pair of monotonically increasing 64-bit counters. Signalling adds 1 to
// the other side's counter with release semantics, so everything written before (for
// example a put into the peer's buffer) is visible to the peer once it sees the count.
// Waiting bumps a local "expected" count and acquire-polls the local counter until it
// catches up. Counters never wrap in practice (2^64 signals).
//
// One thread per semaphore signals or waits; the caller synchronises the rest of its block
// around it (__syncthreads) as the algorithm needs.
#ifndef OXCCL_SEMAPHORE_HPP_
#define OXCCL_SEMAPHORE_HPP_

#include "abi.h"
#include "atomics.hpp"

namespace oxccl {

/// Outcome of a bounded wait.
enum class WaitResult : uint32_t { Ok = OXCCL_WAIT_OK, Timeout = OXCCL_WAIT_TIMEOUT };

/// Polls `*flag` (acquire) until it is >= `expected`; gives up after `max_spins` polls
/// (0 = never). On timeout nothing was acquired and the caller decides what to report.
OXCCL_DEVICE_INLINE WaitResult poll_until_at_least(const uint64_t* flag, uint64_t expected,
                                                   uint64_t max_spins) {
  for (uint64_t spins = 0;; ++spins) {
    if (atomic_load_acquire(flag) >= expected) return WaitResult::Ok;
    if (max_spins != 0 && spins + 1 >= max_spins) return WaitResult::Timeout;
  }
}

/// Device-to-device semaphore operations on an OxcclDeviceSemaphore (abi.h).
struct DeviceSemaphore {
  OxcclDeviceSemaphore h;

  /// Tells the peer that everything written before this call is visible.
  OXCCL_DEVICE_INLINE void signal() const { atomic_add_release(h.remote_inbound, 1); }

  /// Like signal(), but waits for the add to be performed (returns the peer's old count).
  OXCCL_DEVICE_INLINE uint64_t signal_and_fetch() const {
    return atomic_fetch_add_release(h.remote_inbound, 1);
  }

  /// Waits for the next signal of the peer (bounded by h.max_spins). On timeout the
  /// expected count is left unchanged so a retry waits for the same signal.
  OXCCL_DEVICE_INLINE WaitResult wait() const {
    const uint64_t want = *h.expected_inbound + 1;
    const WaitResult r = poll_until_at_least(h.inbound, want, h.max_spins);
    if (r == WaitResult::Ok) *h.expected_inbound = want;
    return r;
  }

  /// Whether the next signal has already arrived (does not consume it).
  OXCCL_DEVICE_INLINE bool poll() const {
    return atomic_load_acquire(h.inbound) > *h.expected_inbound;
  }
};

/// Host-to-device semaphore: the host (proxy) increments `inbound`; the device waits.
struct HostDeviceSemaphore {
  OxcclHostDeviceSemaphore h;

  /// Waits for the host's next signal (bounded by h.max_spins).
  OXCCL_DEVICE_INLINE WaitResult wait() const {
    const uint64_t want = *h.expected_inbound + 1;
    const WaitResult r = poll_until_at_least(h.inbound, want, h.max_spins);
    if (r == WaitResult::Ok) *h.expected_inbound = want;
    return r;
  }
};

}  // namespace oxccl

#endif  // OXCCL_SEMAPHORE_HPP_
