// oxccl/allreduce_device.hpp: device helpers of the allreduce kernels (allreduce.cu):
// tail-safe 16-byte units, bounded waits with a wall-clock deadline, the per-block
// cross-rank barrier, and the epoch that advances once per call in device memory.
//
// The layout of the scratch and its sync area is in abi_allreduce.h.
#ifndef OXCCL_ALLREDUCE_DEVICE_HPP_
#define OXCCL_ALLREDUCE_DEVICE_HPP_

#include "abi.h"
#include "atomics.hpp"
#include "packet.hpp"
#include "vector.hpp"

namespace oxccl {
namespace allreduce {

/// A word of a scratch allocation's sync area.
OXCCL_DEVICE_INLINE uint64_t* sync_word(void* scratch, uint64_t byte_offset) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + byte_offset);
}

/// Nanoseconds from a free-running device clock (only differences are used).
OXCCL_DEVICE_INLINE uint64_t now_ns() {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return wall_clock64() * 10;  // 100 MHz constant clock on gfx9
#endif
}

/// A wait bound: `limit_ns == 0` never expires. The clock is read every 256 polls.
struct Deadline {
  uint64_t start;
  uint64_t limit_ns;
  OXCCL_DEVICE_INLINE bool expired(uint64_t polls) const {
    if (limit_ns == 0 || (polls & 255) != 255) return false;
    return now_ns() - start > limit_ns;
  }
};

/// Records the first failure of this rank (code | peer << 32).
OXCCL_DEVICE_INLINE void report(void* own_scratch, uint32_t code, uint32_t peer) {
  uint64_t* err = sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_ERROR);
  if (atomic_load_relaxed(err) == 0) {
    atomic_store_relaxed(err, static_cast<uint64_t>(code) | (static_cast<uint64_t>(peer) << 32));
  }
}

/// Bytes [off, off + 16) of a buffer of `total` bytes; bytes past the end read as zero.
/// Aligned whole units are one 16-byte load; the rest goes byte by byte.
OXCCL_DEVICE_INLINE Vec16 load_unit(const void* base, uint64_t off, uint64_t total) {
  const unsigned char* p = static_cast<const unsigned char*>(base) + off;
  if (off + 16 <= total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) return load16(p);
  Vec16 v{{0, 0, 0, 0}};
  unsigned char* b = reinterpret_cast<unsigned char*>(&v);
  const uint64_t n = total > off ? (total - off < 16 ? total - off : 16) : 0;
  for (uint64_t i = 0; i < n; ++i) b[i] = p[i];
  return v;
}

/// Stores the bytes of `v` that fall inside a buffer of `total` bytes at [off, off + 16).
OXCCL_DEVICE_INLINE void store_unit(void* base, uint64_t off, const Vec16& v, uint64_t total) {
  unsigned char* p = static_cast<unsigned char*>(base) + off;
  if (off + 16 <= total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    store16(p, v);
    return;
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(&v);
  const uint64_t n = total > off ? (total - off < 16 ? total - off : 16) : 0;
  for (uint64_t i = 0; i < n; ++i) p[i] = b[i];
}

/// 16-byte load of data another GPU wrote (cached in L2 only, never a stale L1 line).
OXCCL_DEVICE_INLINE Vec16 load16_peer(const void* p) {
#if defined(OXCCL_DEVICE_CUDA)
  const uint4 v = __ldcg(reinterpret_cast<const uint4*>(p));
  return Vec16{{v.x, v.y, v.z, v.w}};
#else
  return load16_volatile(p);
#endif
}

/// The LL flag of a call: never 0 (the zeroed scratch must not match).
OXCCL_DEVICE_INLINE uint32_t flag_of(uint64_t epoch) {
  return static_cast<uint32_t>(epoch % 0xffffffffull) + 1u;
}

/// Spins on an LL16 packet until it carries `flag`; false when the deadline passed.
OXCCL_DEVICE_INLINE bool ll16_wait(const OxcclLL16Packet* p, uint32_t flag, const Deadline& d,
                                   uint32_t* d1, uint32_t* d2) {
  for (uint64_t polls = 0;; ++polls) {
    if (ll16_try_read(p, flag, d1, d2)) return true;
    if (d.expired(polls)) return false;
  }
}

/// Barrier of block `blockIdx.x` of every rank: signal every peer, wait for every peer.
/// Needs blockDim.x >= world_size. Returns false (and reports) when a wait timed out.
OXCCL_DEVICE_INLINE bool block_barrier(const OxcclAllreduceArgs& a, const Deadline& d,
                                       int* failed) {
  __syncthreads();
  const uint32_t p = threadIdx.x;
  const uint64_t slot = static_cast<uint64_t>(blockIdx.x) * OXCCL_ALLREDUCE_MAX_RANKS;
  if (p < a.world_size && p != a.rank) {
    // Everything the block wrote is ordered before the signal: bar.sync above, then a
    // system fence and a release add by this thread.
    fence_system();
    atomic_add_release(sync_word(a.scratch[p], OXCCL_ALLREDUCE_SYNC_INBOUND) + slot + a.rank, 1);
    void* own = a.scratch[a.rank];
    const uint64_t* inbound = sync_word(own, OXCCL_ALLREDUCE_SYNC_INBOUND) + slot + p;
    uint64_t* expected = sync_word(own, OXCCL_ALLREDUCE_SYNC_EXPECTED) + slot + p;
    const uint64_t want = *expected + 1;
    bool ok = true;
    for (uint64_t polls = 0; atomic_load_acquire(inbound) < want; ++polls) {
      if (d.expired(polls)) {
        ok = false;
        break;
      }
    }
    if (ok) {
      *expected = want;
    } else {
      *failed = 1;
      report(own, OXCCL_ALLREDUCE_ERR_TIMEOUT, p);
    }
  }
  __syncthreads();
  return *failed == 0;
}

/// What a kernel body knows about its call besides the argument block: its own scratch,
/// the deadline of its waits, and the block's shared failure flag (set by
/// `block_barrier`). Bodies take it by value (registers): a reference would store it to
/// local memory first, which waits for the clock read.
struct CallState {
  void* own;
  Deadline deadline;
  int* failed;

  /// Every thread of this block has read the epoch (`read_epoch`). In a grid of several
  /// blocks, block `b` then counts itself (a barrier, then a no-return add) so that
  /// `finish_call` knows when every block has read it without a returned atomic at the
  /// end; a single block only needs the barrier (its thread 0 advances the epoch). A
  /// kernel that reads the epoch calls this with every thread of every block exactly once,
  /// on every path to `finish_call`. The one-shots call it after their writes to the
  /// peers, to keep the barrier off the path of their data.
  OXCCL_DEVICE_INLINE void count_block() const {
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1) {
      atomic_add_release_device(sync_word(own, OXCCL_ALLREDUCE_SYNC_DONE), 1);
    }
  }
};

/// The epoch of the call running now (see `CallState::count_block`). No body function
/// receives it from the kernel's entry: a function call waits for every load in flight,
/// so the one-shots read it themselves, beside their first input load.
OXCCL_DEVICE_INLINE uint64_t read_epoch(void* own_scratch) {
  return atomic_load_relaxed(sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_EPOCH));
}

/// End of a call: block 0 advances the epoch by one (a no-return add; it is read at the
/// start of the next call on this stream, after the kernel boundary or `wait_prior_grid`,
/// which order it). When the blocks read the epoch (`counted`), block 0 first waits until
/// every block has (at once in a single block: the barrier in `count_block` covered it;
/// else until the count of `count_block` is complete, which it resets for the next call:
/// every block added before, so nothing adds after). No fence and no returned atomic on
/// the way out.
OXCCL_DEVICE_INLINE void finish_call(void* own_scratch, bool counted) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (counted && gridDim.x > 1) {
    uint64_t* done = sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_DONE);
    while (atomic_load_acquire(done) < gridDim.x) {
    }
    atomic_store_relaxed(done, 0);
  }
  atomic_add_relaxed_device(sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_EPOCH), 1);
}

}  // namespace allreduce
}  // namespace oxccl

#endif  // OXCCL_ALLREDUCE_DEVICE_HPP_
