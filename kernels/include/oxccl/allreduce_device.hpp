// oxccl/allreduce_device.hpp: device helpers of the scratch kernels of every collective
// (allreduce.cu, allgather.cu): tail-safe 16-byte units, bounded waits with a wall-clock
// deadline, the per-block cross-rank barrier, the LL16 packet reader, the epoch that
// advances once per call in device memory, and the prologue every kernel shares.
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

/// The bound of every wait: its time limit (`limit_ns == 0` never expires) and the
/// communicator's abort word (`abort`, host memory mapped for the device; null: none). A
/// wait reads the clock only once it has lasted 256 polls (where its bound starts) and every
/// 256 polls after that, so a call whose waits end at once never reads it: a clock read by
/// every thread at the start of a call cost 0.06-0.1 us per call on H200s (ci/gpu/probe).
/// The abort word, a round trip to host memory, is read only by a wait that has lasted
/// `kAbortCheckNs`. Each wait keeps its own `since` (0 until its bound starts). The abort
/// word is read also without a time limit: an abort must end a wait that would otherwise
/// never end.
struct Deadline {
  uint64_t limit_ns;
  const uint64_t* abort;
  /// This rank's failure word (null: not watched): set when an earlier call of the
  /// communicator failed, so its peers are out of step and this wait would only time out.
  const uint64_t* earlier_failure = nullptr;
  /// A wait reads the abort word (and the failure word) only once it has lasted this long.
  /// The abort word is in host memory: every read crosses PCIe, and a multi-block one-shot
  /// whose 33,000 threads each read it every 256 polls took 175-700 us instead of 4-13 us
  /// at 128 KB-2 MB (2 H100s). A wait of a millisecond is already a peer that is late or
  /// gone.
  static constexpr uint64_t kAbortCheckNs = 1000000;
  OXCCL_DEVICE_INLINE bool expired(uint64_t polls, uint64_t& since) const {
    if ((polls & 255) != 255 || (limit_ns == 0 && abort == nullptr && earlier_failure == nullptr)) return false;
    const uint64_t t = now_ns();
    if (since == 0) {
      since = t;
      return false;
    }
    const uint64_t waited = t - since;
    if (waited > kAbortCheckNs && (aborted() || failed_before())) return true;
    return limit_ns != 0 && waited > limit_ns;
  }
  /// Whether this rank's failure word is set (by an earlier call, or by another block of
  /// this one): `report` keeps the first failure, so the wait that stops for it records
  /// nothing new.
  OXCCL_DEVICE_INLINE bool failed_before() const {
    return earlier_failure != nullptr && atomic_load_relaxed(earlier_failure) != 0;
  }
  /// Whether the communicator was aborted (a system-scope relaxed load: the host sets the
  /// word while the kernel runs; nothing else is ordered by it).
  OXCCL_DEVICE_INLINE bool aborted() const { return abort != nullptr && atomic_load_relaxed(abort) != 0; }
  /// The failure code of a wait that `expired`: aborted, else timed out. The abort word
  /// never goes back to 0, so reading it again here gives the reason `expired` saw.
  OXCCL_DEVICE_INLINE uint32_t failure() const {
    return aborted() ? OXCCL_ALLREDUCE_ERR_ABORTED : OXCCL_ALLREDUCE_ERR_TIMEOUT;
  }
};

/// Mirrors a failure word into the communicator's host failure word (`host_words`: the
/// argument block's `abort_flag`; null: none), unless one is there already: the host reads
/// it without synchronizing (ncclCommGetAsyncError). A system-scope relaxed load and store,
/// no atomic read-modify-write (not every host bus has them); racing blocks each write a
/// failure of this call, and which one stays does not matter. Only failing calls get here.
OXCCL_DEVICE_INLINE void mirror_failure(const uint64_t* host_words, uint64_t word) {
  if (host_words == nullptr) return;
  uint64_t* failure = const_cast<uint64_t*>(host_words) + OXCCL_HOST_WORD_FAILURE;
  if (atomic_load_relaxed(failure) == 0) atomic_store_relaxed(failure, word);
}

/// Records the first failure of this rank (code | peer << 32) in its scratch, and mirrors
/// it for the host (`mirror_failure`).
OXCCL_DEVICE_INLINE void report(void* own_scratch, const uint64_t* host_words, uint32_t code, uint32_t peer) {
  uint64_t* err = sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_ERROR);
  const uint64_t word = static_cast<uint64_t>(code) | (static_cast<uint64_t>(peer) << 32);
  if (atomic_load_relaxed(err) == 0) atomic_store_relaxed(err, word);
  mirror_failure(host_words, word);
}

/// Bytes [off, off + 16) of a buffer of `total` bytes; bytes past the end read as zero.
/// Aligned whole units are one 16-byte load; the rest goes byte by byte, shifted into the
/// words (constant indices after unrolling: no local memory, see `reduce_ranks`).
OXCCL_DEVICE_INLINE Vec16 load_unit(const void* base, uint64_t off, uint64_t total) {
  const unsigned char* p = static_cast<const unsigned char*>(base) + off;
  if (off + 16 <= total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) return load16(p);
  const uint64_t n = total > off ? (total - off < 16 ? total - off : 16) : 0;
#if defined(OXCCL_DEVICE_HIP)
  // HIP: a loop that stays a loop, into two 64-bit halves (no array, so nothing indexed
  // at run time). Unrolled, the 16 guarded byte loads of each of the many copies of this
  // tail path (one per rank and per type body) made the kernels too large for the gfx942
  // backend's superlinear passes (see reducers.hpp, `reduce_ranks`).
  uint64_t lo = 0, hi = 0;
#pragma nounroll
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t b = p[i];
    if (i < 8) {
      lo |= b << (8 * i);
    } else {
      hi |= b << (8 * (i - 8));
    }
  }
  return Vec16{{static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32), static_cast<uint32_t>(hi),
                static_cast<uint32_t>(hi >> 32)}};
#else
  Vec16 v{{0, 0, 0, 0}};
#pragma unroll
  for (uint32_t i = 0; i < 16; ++i) {
    if (i < n) v.w[i / 4] |= static_cast<uint32_t>(p[i]) << (8 * (i % 4));
  }
  return v;
#endif
}

/// Stores the bytes of `v` that fall inside a buffer of `total` bytes at [off, off + 16).
OXCCL_DEVICE_INLINE void store_unit(void* base, uint64_t off, const Vec16& v, uint64_t total) {
  unsigned char* p = static_cast<unsigned char*>(base) + off;
  if (off + 16 <= total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    store16(p, v);
    return;
  }
  const uint64_t n = total > off ? (total - off < 16 ? total - off : 16) : 0;
#if defined(OXCCL_DEVICE_HIP)
  // HIP: a loop that stays a loop (see `load_unit`).
  const uint64_t lo = v.w[0] | static_cast<uint64_t>(v.w[1]) << 32;
  const uint64_t hi = v.w[2] | static_cast<uint64_t>(v.w[3]) << 32;
#pragma nounroll
  for (uint32_t i = 0; i < n; ++i) {
    p[i] = static_cast<unsigned char>((i < 8 ? lo : hi) >> (8 * (i & 7)));
  }
#else
#pragma unroll
  for (uint32_t i = 0; i < 16; ++i) {
    if (i < n) p[i] = static_cast<unsigned char>(v.w[i / 4] >> (8 * (i % 4)));
  }
#endif
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

/// Unit `j` of a peer's buffer of `total` bytes at `base` (registered inputs: reduce-scatter,
/// reduce): one L2-only 16-byte load when whole and aligned, else the bytes inside the
/// buffer and zeros.
OXCCL_DEVICE_INLINE Vec16 peer_unit(const char* base, uint64_t j, uint64_t total) {
  const char* p = base + j * 16;
  if (j * 16 + 16 <= total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) return load16_peer(p);
  return load_unit(base, j * 16, total);
}

/// This thread's first unit of a grid stride over units (then every thread_count()): lanes
/// take consecutive units, and consecutive 32-unit groups go to the warps of consecutive
/// blocks in turn. The grid still works in one window of memory (`SlotRounds`), and a walk
/// over fewer units than there are threads reaches every block (every SM's share of the
/// NVLink bandwidth) instead of the first blocks only, as thread_index() order would: a
/// staged kernel's grid is sized for the message, its slots are a rank's part of it.
/// Blocks whose size is not a multiple of 32 take thread_index() order.
OXCCL_DEVICE_INLINE uint64_t spread_index() {
  if ((blockDim.x & 31) != 0) return thread_index();
  return (threadIdx.x & 31) + 32 * (blockIdx.x + static_cast<uint64_t>(gridDim.x) * (threadIdx.x >> 5));
}

/// Rounds of the staged kernels that give every rank one slot of the staging (every
/// collective's staged kernel; the host stand-ins' `equal_rounds`): `cap` units of each
/// slot per round, `world` slots of `cap` units filling at most the staging, in equal rounds
/// over `units`. Each thread always owns the same units of every slot (so does its block,
/// and the per-block barriers order every reuse of a staging position): a grid stride,
/// unit `first` (`spread_index`), then every `step` (thread_count()) after it.
///
/// Why a grid stride and not a contiguous share per block: at any moment the whole grid
/// then works in one window of memory. Per-block shares cost 5% of the NVLink bandwidth
/// both ways (2 H200s, ci/gpu/probe/reduce_probe.cu, one block of 512 threads per SM: peer
/// loads 355 GB/s against 374 at 1 GiB and 349 against 368 at 128 MiB; peer stores 348
/// against 370 at 1 GiB), whatever the units per thread or software pipelining. The direct,
/// staged and two-shot kernels walk their units this way; the relays keep shares
/// (`RelayRounds`).
struct SlotRounds {
  uint64_t cap;
  uint64_t first, step;
  OXCCL_DEVICE_INLINE SlotRounds(const OxcclAllreduceArgs& a, uint64_t units) {
    const uint64_t cap_max = a.data_bytes / (16 * a.world_size);
    const uint64_t rounds = (units + cap_max - 1) / cap_max;
    cap = rounds == 0 ? 0 : (units + rounds - 1) / rounds;
    first = spread_index();
    step = thread_count();
  }
};

/// Rounds of the relay kernels (broadcast_relay): the data in one chunk per
/// rank other than the root (`chunks` = world - 1, or 1 on one rank), every chunk in equal rounds of at most
/// `cap` units, so that the next round's first hop overlaps this round's second. Block b
/// owns the same share of every chunk's round on every rank, so the per-block barriers
/// between rounds order each hop after the one it depends on. `cap` comes from the staging
/// (`relay_cap`), so `OXCCL_STAGING_MB` sizes the rounds.
///
/// Contiguous shares per block, not the grid stride of `SlotRounds`: a rank works on one
/// chunk of a round (a third of the message on 4 ranks) with a grid sized for the whole
/// message, and in a grid stride only the first third of the blocks got units. 4 H200s,
/// reduce_relay at 1 MB: 23.6 us in thread order against 15.0 with shares, but the 15.0 was
/// an earlier build's (2026-11-27); with the shares back it took 25.0 (2026-11-28), so the
/// order is not what slowed it there. From 64 MB the two orders were level (reduce 1 GB
/// 3498 against 3507 us, broadcast 3101 against 3085). `spread_index` would give every
/// block units again; not measured on 4 GPUs yet.
struct RelayRounds {
  uint64_t units;      // of the whole message
  uint64_t chunk;      // units per chunk (the last one may be shorter)
  uint64_t rounds;     // >= 1
  uint64_t per_round;  // units of a chunk per round
  uint64_t share;      // units of a chunk's round per block
  OXCCL_DEVICE_INLINE RelayRounds(uint64_t units_, uint32_t chunks, uint64_t cap) : units(units_) {
    chunk = (units + chunks - 1) / chunks;
    rounds = chunk > cap ? (chunk + cap - 1) / cap : 1;
    per_round = (chunk + rounds - 1) / rounds;
    share = (per_round + gridDim.x - 1) / gridDim.x;
  }
  /// First unit of chunk `i`'s round `r` (clamped to the message).
  OXCCL_DEVICE_INLINE uint64_t round_start(uint32_t i, uint64_t r) const {
    const uint64_t c_lo = i * chunk < units ? i * chunk : units;
    const uint64_t c_hi = c_lo + chunk < units ? c_lo + chunk : units;
    return c_lo + r * per_round < c_hi ? c_lo + r * per_round : c_hi;
  }
  /// This block's units [lo, hi) of chunk `i`'s round `r`.
  OXCCL_DEVICE_INLINE void part(uint32_t i, uint64_t r, uint64_t& lo, uint64_t& hi) const {
    const uint64_t c_lo = i * chunk < units ? i * chunk : units;
    const uint64_t c_hi = c_lo + chunk < units ? c_lo + chunk : units;
    const uint64_t r_lo = round_start(i, r);
    const uint64_t r_hi = r_lo + per_round < c_hi ? r_lo + per_round : c_hi;
    lo = r_lo + blockIdx.x * share < r_hi ? r_lo + blockIdx.x * share : r_hi;
    hi = lo + share < r_hi ? lo + share : r_hi;
  }
};

/// Units of one chunk per relay round: one half of the staging holds a round of every chunk
/// (0 when the staging is too small: the kernels refuse the call).
OXCCL_DEVICE_INLINE uint64_t relay_cap(const OxcclAllreduceArgs& a) {
  return a.data_bytes / (32ull * (a.world_size > 1 ? a.world_size - 1 : 1));
}

/// The relay kernels' chunk of rank `me`: the k-th rank after the root relays chunk k - 1
/// (the root has none, unless it is the only rank: chunk 0).
OXCCL_DEVICE_INLINE uint32_t relay_chunk(uint32_t me, uint32_t root, uint32_t w) {
  return me > root ? me - root - 1 : me + w - root - 1;
}

/// The rank that relays chunk `i`.
OXCCL_DEVICE_INLINE uint32_t relay_rank(uint32_t i, uint32_t root, uint32_t w) {
  return root + 1 + i < w ? root + 1 + i : root + 1 + i - w;
}

/// The LL flag of a call: never 0 (the zeroed scratch must not match).
OXCCL_DEVICE_INLINE uint32_t flag_of(uint64_t epoch) {
  return static_cast<uint32_t>(epoch % 0xffffffffull) + 1u;
}

/// Barrier of block `blockIdx.x` of every rank: signal every peer, wait for every peer.
/// Needs blockDim.x >= world_size. Returns false (and reports) when a wait timed out or
/// the communicator was aborted. `kOrders`: the signal publishes what the block wrote
/// before it, and the wait makes the peers' writes visible (`block_barrier`); without it
/// both are relaxed (`start_barrier`). On 2 H100s (ci/gpu/probe, one block) a barrier took
/// 3.9 us with a sequentially consistent system fence before the release add, 2.3 us with
/// the release add alone (its own fence covers what bar.sync ordered before it), 0.7 us
/// relaxed. `ordered_from` (a rank; none by default): without `kOrders`, that rank's signal
/// alone publishes what its block wrote, and only the waits on it acquire.
template <bool kOrders>
OXCCL_DEVICE_INLINE bool barrier_of_block(const OxcclAllreduceArgs& a, const Deadline& d, int* failed,
                                          uint32_t ordered_from = OXCCL_ALLREDUCE_MAX_RANKS) {
  __syncthreads();
  const uint32_t p = threadIdx.x;
  const uint64_t slot = static_cast<uint64_t>(blockIdx.x) * OXCCL_ALLREDUCE_MAX_RANKS;
  if (p < a.world_size && p != a.rank) {
    uint64_t* signal = sync_word(a.scratch[p], OXCCL_ALLREDUCE_SYNC_INBOUND) + slot + a.rank;
    if (kOrders || a.rank == ordered_from) {
      // Everything the block wrote is ordered before the signal: bar.sync above, then
      // this thread's release add (cumulative over what bar.sync ordered before it).
      atomic_add_release(signal, 1);
    } else {
      atomic_add_relaxed(signal, 1);
    }
    void* own = a.scratch[a.rank];
    const uint64_t* inbound = sync_word(own, OXCCL_ALLREDUCE_SYNC_INBOUND) + slot + p;
    uint64_t* expected = sync_word(own, OXCCL_ALLREDUCE_SYNC_EXPECTED) + slot + p;
    const uint64_t want = *expected + 1;
    const bool acquire = kOrders || p == ordered_from;
    bool ok = true;
    uint64_t since = 0;
    for (uint64_t polls = 0; (acquire ? atomic_load_acquire(inbound) : atomic_load_relaxed(inbound)) < want;
         ++polls) {
      if (d.expired(polls, since)) {
        ok = false;
        break;
      }
    }
    if (ok) {
      *expected = want;
    } else {
      *failed = 1;
      report(own, d.abort, d.failure(), p);
    }
  }
  __syncthreads();
  return *failed == 0;
}

/// The barrier after a block wrote (or read) data its peers depend on: the signal releases
/// the block's writes, the wait acquires the peers'.
OXCCL_DEVICE_INLINE bool block_barrier(const OxcclAllreduceArgs& a, const Deadline& d, int* failed) {
  return barrier_of_block<true>(a, d, failed);
}

/// The first barrier of a call, before the block moved any data: "every peer's call has
/// started", so its earlier kernels, which finished before it, no longer use its buffers,
/// and what they wrote (a peer's input) is in its memory. Nothing of this call is ordered
/// by it, so the signal and the wait are relaxed (1.6 us less than `block_barrier` on
/// H100s); the block's first access to peer memory comes after the wait in program order.
OXCCL_DEVICE_INLINE bool start_barrier(const OxcclAllreduceArgs& a, const Deadline& d, int* failed) {
  return barrier_of_block<false>(a, d, failed);
}

/// `start_barrier`, except that what the block of rank `from` wrote before it is visible to
/// the blocks of the others after it (`from` signals with release, the waits on it acquire;
/// the rest stays relaxed): for a word that rank publishes about the call (its mode).
OXCCL_DEVICE_INLINE bool start_barrier_from(const OxcclAllreduceArgs& a, const Deadline& d, int* failed,
                                            uint32_t from) {
  return barrier_of_block<false>(a, d, failed, from);
}

/// What a kernel body knows about its call besides the argument block: its own scratch,
/// the bound of its waits, and the block's shared failure flag (set by `block_barrier`).
/// Bodies are inlined into their kernels and take it by value: a call, or a structure
/// in memory, puts a stack in local memory, which cost about 0.5 us per call on H200s
/// (ci/gpu/probe).
struct CallState {
  void* own;
  Deadline deadline;
  int* failed;

  /// Every thread of this block has read the epoch (`read_epoch`) and passes the value.
  /// The block meets at a barrier whose predicate is the epoch, so no thread arrives
  /// before its read has returned. In a grid of several blocks, thread 0 then counts the
  /// block (a relaxed no-return add) so that `finish_call` knows when every block has
  /// read it; a single block needs only the barrier (its thread 0 advances the epoch). The
  /// count is relaxed on purpose: a release add waits for the block's stores to the peers
  /// to be acknowledged over NVLink, and block 0 then waited about 0.5 us for it at the
  /// end of every multi-block call (2 H200s, ci/gpu/probe). A kernel that reads the epoch
  /// calls this with every thread of every block exactly once, on every path to
  /// `finish_call`. The one-shots call it after their writes to the peers, to keep the
  /// barrier off the path of their data.
  OXCCL_DEVICE_INLINE void count_block(uint64_t epoch) const {
    (void)__syncthreads_or(epoch == ~uint64_t{0});
    if (threadIdx.x == 0 && gridDim.x > 1) {
      atomic_add_relaxed_device(sync_word(own, OXCCL_ALLREDUCE_SYNC_DONE), 1);
    }
  }
};

/// The epoch of the call running now (see `CallState::count_block`). The one-shots read
/// it themselves, beside their first input load, so that both round trips overlap.
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
/// `counter`: the sync word the call advances (EPOCH; MAILBOX_SEQ for reduce_oneshot_ll).
OXCCL_DEVICE_INLINE void finish_call(void* own_scratch, bool counted,
                                     uint64_t counter = OXCCL_ALLREDUCE_SYNC_EPOCH) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (counted && gridDim.x > 1) {
    uint64_t* done = sync_word(own_scratch, OXCCL_ALLREDUCE_SYNC_DONE);
    while (atomic_load_acquire(done) < gridDim.x) {
    }
    atomic_store_relaxed(done, 0);
  }
  atomic_add_relaxed_device(sync_word(own_scratch, counter), 1);
}

/// Bytes of one element of a data type code (0 for an unknown code).
OXCCL_DEVICE_INLINE uint64_t dtype_bytes(uint32_t dtype) {
  switch (dtype) {
    case OXCCL_DTYPE_I64:
    case OXCCL_DTYPE_U64:
    case OXCCL_DTYPE_F64: return 8;
    case OXCCL_DTYPE_F32:
    case OXCCL_DTYPE_I32:
    case OXCCL_DTYPE_U32: return 4;
    case OXCCL_DTYPE_F16:
    case OXCCL_DTYPE_BF16: return 2;
    default: return dtype < OXCCL_DTYPE_COUNT ? 1 : 0;  // the fp8 formats, i8, u8
  }
}

/// The pending-packet mask of an LL16 read: two bits (a unit's two packets) per peer.
OXCCL_DEVICE_INLINE uint32_t ll16_peer_bits(uint32_t w, uint32_t me) {
  uint32_t bits = 0;
  for (uint32_t r = 0; r < w; ++r) {
    if (r != me) bits |= 3u << (2 * r);
  }
  return bits;
}

/// Unit `u` of every peer in `all_peers` (`ll16_peer_bits`) from this rank's packet half
/// `mine` (one slot of `slot_bytes` per rank) into `in[peer]`. All pending packets of a
/// group of `kLl16PollRanks` ranks are read before any is checked, so the reads of the
/// peers' packets overlap instead of waiting for one another (one L2 round trip per poll,
/// not 2(w-1)); the groups are polled one after the other (one group of every rank on
/// CUDA; two groups of 4 on HIP, whose 64-lane waves have 128 VGPRs per lane for the whole
/// kernel: 16 packets in flight took 64 of them, see platform.hpp). Returns false, after
/// reporting the first missing peer, when the wait timed out or was aborted.
template <uint32_t kGroup = kLl16PollRanks>
OXCCL_DEVICE_INLINE bool ll16_read_peers(const char* mine, uint64_t u, uint64_t slot_bytes, uint32_t flag,
                                         uint32_t all_peers, Vec16 (&in)[OXCCL_ALLREDUCE_MAX_RANKS],
                                         const CallState call) {
  constexpr uint32_t kPackets = 2 * kGroup;
  static_assert(OXCCL_ALLREDUCE_MAX_RANKS % kGroup == 0, "rank groups must tile the ranks");
  const OxcclLL16Packet* base = reinterpret_cast<const OxcclLL16Packet*>(mine) + 2 * u;
#pragma unroll
  for (uint32_t g = 0; g < OXCCL_ALLREDUCE_MAX_RANKS; g += kGroup) {
    uint32_t pending = (all_peers >> (2 * g)) & ((1u << kPackets) - 1u);
    uint64_t since = 0;
    for (uint64_t polls = 0; pending != 0; ++polls) {
      Vec16 raw[kPackets];
#pragma unroll
      for (uint32_t i = 0; i < kPackets; ++i) {
        if (pending >> i & 1) {
          raw[i] = load16_volatile(reinterpret_cast<const char*>(base + (i & 1)) + (g + (i >> 1)) * slot_bytes);
        }
      }
#pragma unroll
      for (uint32_t i = 0; i < kPackets; ++i) {
        if ((pending >> i & 1) && raw[i].w[1] == flag && raw[i].w[3] == flag) {
          in[g + (i >> 1)].w[2 * (i & 1)] = raw[i].w[0];
          in[g + (i >> 1)].w[2 * (i & 1) + 1] = raw[i].w[2];
          pending &= ~(1u << i);
        }
      }
      if (pending != 0 && call.deadline.expired(polls, since)) {
        report(call.own, call.deadline.abort, call.deadline.failure(),
               g + static_cast<uint32_t>(__ffs(pending) - 1) / 2);
        return false;
      }
    }
  }
  return true;
}

/// The epoch one-shots that send some peers no data (broadcast, all_to_all_v's empty
/// chunks). To such a peer a rank writes one packet instead, the first of unit 0 of its
/// slot in the peer's current half: an acknowledgement that this rank's call has started.
/// Every rank waits for every peer's data or acknowledgement, so, as in the one-shots where
/// everyone sends to everyone, no rank finishes a call before every peer has started it,
/// and none can run two calls ahead into a packet half a peer is still reading.
OXCCL_DEVICE_INLINE void ll16_ack(const OxcclAllreduceArgs& a, uint32_t to, uint64_t half, uint64_t slot_bytes,
                                  uint32_t flag) {
  ll16_write(reinterpret_cast<OxcclLL16Packet*>(static_cast<char*>(a.scratch[to]) + half + a.rank * slot_bytes), 0, 0,
             flag);
}

/// Waits for the acknowledgement (`ll16_ack`) of every peer in `peers` (a `ll16_peer_bits`
/// mask) in this rank's half `mine`. False, after reporting, when the wait timed out or
/// was aborted.
OXCCL_DEVICE_INLINE bool ll16_wait_acks(const char* mine, uint64_t slot_bytes, uint32_t flag, uint32_t peers,
                                        const CallState call) {
  Vec16 unused[OXCCL_ALLREDUCE_MAX_RANKS];
  return ll16_read_peers(mine, 0, slot_bytes, flag, peers & 0x55555555u, unused, call);
}

/// Whether an argument block is one the scratch kernels can run.
OXCCL_DEVICE_INLINE bool args_ok(const OxcclAllreduceArgs& a) {
  return a.world_size >= 1 && a.world_size <= OXCCL_ALLREDUCE_MAX_RANKS &&
         a.rank < a.world_size && blockDim.x >= a.world_size &&
         gridDim.x <= OXCCL_ALLREDUCE_MAX_BLOCKS && a.data_bytes % 16 == 0 &&
         a.data_bytes >= 16ull * a.world_size &&
         a.dtype < OXCCL_DTYPE_COUNT && a.op <= OXCCL_OP_AVG && a.accum <= OXCCL_ACCUM_F32;
}

/// This rank's scratch, also when the argument block is bad (for the error report).
OXCCL_DEVICE_INLINE void* own_scratch(const OxcclAllreduceArgs& a) {
  return a.scratch[a.rank < OXCCL_ALLREDUCE_MAX_RANKS ? a.rank : 0];
}

/// What every scratch kernel (any collective) does around its body: wait for the previous
/// kernel on the stream (a no-op unless launched early) and let the next one be scheduled;
/// refuse a bad argument block (`kernel_ok`: the kernel's own conditions on top of
/// `args_ok`); run `body(call)`; advance the epoch. `kReadsEpoch`: the body reads the epoch
/// (the one-shots' flags and halves) and counts its blocks (`CallState::count_block`); the
/// barrier kernels synchronize through their barriers and need neither. `kCounter`: the
/// sync word the call advances (`finish_call`).
template <bool kReadsEpoch, uint64_t kCounter = OXCCL_ALLREDUCE_SYNC_EPOCH, typename Body>
__device__ __forceinline__ void run_call(const OxcclAllreduceArgs& a, bool kernel_ok, Body&& body) {
  wait_prior_grid();
  launch_dependents();
  void* own = own_scratch(a);
  if (!args_ok(a) || !kernel_ok) {
    if (thread_index() == 0) report(own, a.abort_flag, OXCCL_ALLREDUCE_ERR_ARGS, a.rank);
    return;
  }
  // An earlier call of this communicator failed (its peers are out of step): end instead
  // of waiting out the bound again; the failure word already says why. The barrier kernels
  // return before their first signal, which a peer out of step would count. The one-shots
  // start at once: that dependent load before their first write cost about 0.4 us per call
  // (1 KB allreduce 2.87 us on 2 H200s before it, 3.26-3.37 with it), and what they write
  // before waiting is packets whose flag (the call's epoch) no peer of another call
  // accepts; their waits then stop at the failure word after 1 ms (Deadline).
  uint64_t* failure = sync_word(own, OXCCL_ALLREDUCE_SYNC_ERROR);
  if (!kReadsEpoch && atomic_load_relaxed(failure) != 0) return;
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  const CallState call{own, Deadline{a.timeout_ns, a.abort_flag, failure}, &failed};
  body(call);
  finish_call(own, kReadsEpoch, kCounter);
}

}  // namespace allreduce
}  // namespace oxccl

#endif  // OXCCL_ALLREDUCE_DEVICE_HPP_
