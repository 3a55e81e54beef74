// Reduce kernels: the root's output (`count` elements) is the reduction, in rank order, of
// every rank's input (`count` elements each); the other ranks' outputs are not touched (NCCL:
// recvbuff matters at the root only; the communicator passes their input as output). The
// same argument block (`root` names the root), scratch and epoch as the allreduce kernels
// (include/oxccl/abi_allreduce.h), the same reducers (oxccl/reducers.hpp), so the root gets
// the bits of the host reference. Host stand-ins with the same protocol:
// collectives/src/algorithms/reduce/.
//
// - reduce_oneshot_ll: small messages, no barrier, and no sender waits for the root.
//   Every other rank writes its input as LL16 packets into slot `me` of the root's mailbox
//   half (a packet region of its own, halves by the MAILBOX_SEQ parity) and leaves: the
//   root reduces its input and every peer's packets in rank order. What keeps a sender
//   from overwriting packets the root has not read yet is the root's MAILBOX_SEEN word
//   (abi_allreduce.h): before call s writes into half s & 1, the sender waits until the
//   root has started call s - 1, which it usually did long before. So back-to-back reduces
//   pipeline: a sender runs up to one call ahead and its packets are waiting when the root
//   starts, instead of every call paying a round trip for the root's acknowledgement.
// - reduce_staged: any size on buffers nobody registered. Every non-root rank pushes its
//   input into slot `me` of the root's staging; barrier; the root reduces its own input and
//   every slot of its staging, in rank order, into its output; barrier (the staging is free
//   again). In rounds when it does not fit.
// - reduce_direct: registered inputs. Barrier (every peer's input is ready); the root reduces
//   straight from every rank's input (peer loads) into its output; barrier (no one reads the
//   peers' inputs any more).
//
// - reduce_relay: registered inputs, 3 or more ranks. reduce_direct's root loads every
//   byte of every peer through its one link, (world - 1) times the message. Here the message
//   is split into one chunk per rank other than the root (RelayRounds, as broadcast_relay):
//   the rank that owns chunk k reduces it from every rank's input (peer loads) and stores
//   the result into the root's staging; the root copies it into its output a round later.
//   Every rank's links then carry about the message once each way, as NCCL's ring does. In
//   rounds of half the staging per parity (the halves alternate), a per-block barrier
//   between rounds: barrier; rounds 0..=R (round r: the owners write round r, the root
//   copies round r - 1); each block copies out exactly the staging positions the same block
//   of the owners wrote, so the per-block barriers order every reuse. In place at the root
//   (its output is its registered input, which the owners map), which the root publishes
//   with the start barrier (SYNC_ROOT_IN_PLACE), and when a chunk takes one round, the
//   owners store their chunks straight into it instead: barrier, one pass, barrier.
//
// - reduce_local: one GPU's half of reduce_copy (collectives/src/algorithms/reduce/copy.rs).
//   No peer, no barrier, no epoch: a.peer_input[0..world) are buffers of this GPU in rank
//   order (the root's input and the peers' inputs its copy engine pulled), reduced into
//   a.output. Launched per chunk on the root only, so it leaves the epoch alone (the other
//   ranks' epochs would fall behind, and the one-shots' flags with them).
//
// In place (input == output at the root), each unit is read before the same thread writes it.

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"
#include "oxccl/reducers.hpp"

namespace oxccl {
namespace reduce_to_root {

using namespace oxccl::allreduce;

/// Waits until this rank's MAILBOX_SEEN word of `peer` is at least `want`; false, after
/// reporting, when the wait timed out or was aborted. Acquire: the packets written after it
/// are ordered after the root's reads that the word vouches for.
OXCCL_DEVICE_INLINE bool wait_seen(const uint64_t* seen, uint32_t peer, uint64_t want, const CallState call) {
  uint64_t since = 0;
  for (uint64_t polls = 0; atomic_load_acquire(seen + peer) < want; ++polls) {
    if (call.deadline.expired(polls, since)) {
      report(call.own, call.deadline.abort, call.deadline.failure(), peer);
      return false;
    }
  }
  return true;
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void oneshot_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t root = a.root;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  const uint64_t* seen = sync_word(call.own, OXCCL_ALLREDUCE_SYNC_MAILBOX_SEEN);
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit
  // A sender's first unit load, the call's number and the root's progress go out together.
  Vec16 v = me != root && first < units ? load_unit(a.input, first * 16, total) : Vec16{{0, 0, 0, 0}};
  const uint64_t seq = atomic_load_relaxed(sync_word(call.own, OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ));
  const uint64_t root_seen = me != root ? atomic_load_acquire(seen + root) : 0;
  const uint32_t flag = flag_of(seq);
  const uint64_t half = a.packet_offset + (seq & 1) * a.packet_half_bytes;

  if (first == 0) {
    // This rank has started call `seq`: its kernel of call seq - 1 (the stream's previous
    // grid, waited for) read its last packets, so senders may reuse that call's half.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = me + k < w ? me + k : me + k - w;
      atomic_store_relaxed(sync_word(a.scratch[p], OXCCL_ALLREDUCE_SYNC_MAILBOX_SEEN) + me, seq + 1);
    }
  }
  if (me != root && (root_seen >= seq || wait_seen(seen, root, seq, call))) {
    for (uint64_t u = first; u < units; u += stride) {
      if (u != first) v = load_unit(a.input, u * 16, total);
      OxcclLL16Packet* dst = reinterpret_cast<OxcclLL16Packet*>(
                                 static_cast<char*>(a.scratch[root]) + half + me * slot_bytes) +
                             2 * u;
      ll16_write(dst, v.w[0], v.w[1], flag);
      ll16_write(dst + 1, v.w[2], v.w[3], flag);
    }
  }
  call.count_block(seq);
  if (me != root) return;

  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t peers = ll16_peer_bits(w, me);
  for (uint64_t u = first; u < units; u += stride) {
    const Vec16 own_unit = load_unit(a.input, u * 16, total);
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) in[r] = own_unit;  // peers' replaced below
    // Peers polled two at a time: with every peer's packets in flight at once (groups of 8
    // on CUDA) nvcc spilled (sm_90: 296-byte stack, 2306 bytes of spill stores, against 8
    // and none). Two covers the 2-rank root's one peer in one round.
    if (!ll16_read_peers<2>(mine, u, slot_bytes, flag, peers, in, call)) return;
    store_unit(a.output, u * 16, reduce_ranks(reduce, in, w), total);
  }
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void staged_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t root = a.root;
  const char* own = static_cast<const char*>(a.scratch[me]) + a.data_offset;
  const SlotRounds g(a, units);  // `cap` units of every rank's input per round

  for (uint64_t base = 0; base < units; base += g.cap) {
    const uint64_t n = units - base < g.cap ? units - base : g.cap;  // units this round
    // 1. Every other rank pushes this round of its input into slot `me` of the root's staging.
    if (me != root) {
      char* dst = static_cast<char*>(a.scratch[root]) + a.data_offset + me * g.cap * 16;
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        store16(dst + j * 16, load_unit(a.input, (base + j) * 16, total));
      }
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. The root reduces (rank order) its input and every peer's slot of its staging.
    if (me == root) {
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
        for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
          if (r < w) {
            in[r] = r == me ? load_unit(a.input, (base + j) * 16, total)
                            : load16_peer(own + (r * g.cap + j) * 16);  // written by r
          }
        }
        store_unit(a.output, (base + j) * 16, reduce_ranks(reduce, in, w), total);
      }
    }
    // The root's staging is free for the peers' next round (or next call).
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

/// 16-byte units of every rank's input each thread of `reduce_direct` loads before it
/// reduces the first (world_size x kDirectUnits loads in flight, as `allreduce_twoshot_zc`'s
/// kZcUnits). 2 H200s, against one: 1-2% faster at 64-128 MB (189.6 against 193.4 us at
/// 64 MB), level at 1 GiB (3082 against 3086-3095 us, 348 GB/s, where plain peer loads reach
/// 371-374). HIP: 1, for gfx942's register budget (see kZcUnits).
#if defined(OXCCL_DEVICE_CUDA)
constexpr int kDirectUnits = 2;
#else
constexpr int kDirectUnits = 1;
#endif

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void direct_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint64_t spread = thread_count();  // a grid stride (see `SlotRounds`)

  // Every peer's call has started: its input is ready.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  if (a.rank == a.root) {
    const uint64_t step = spread * kDirectUnits;
    for (uint64_t j0 = spread_index(); j0 < units; j0 += step) {
      Vec16 in[kDirectUnits][OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
#pragma unroll
          for (int k = 0; k < kDirectUnits; ++k) {
            const uint64_t j = j0 + static_cast<uint64_t>(k) * spread;
            in[k][r] = j < units ? peer_unit(static_cast<const char*>(a.peer_input[r]), j, total) : Vec16{{0, 0, 0, 0}};
          }
        }
      }
      // No `break` (see twoshot_zc_body): the loop must unroll for `in` to stay in registers.
#pragma unroll
      for (int k = 0; k < kDirectUnits; ++k) {
        const uint64_t j = j0 + static_cast<uint64_t>(k) * spread;
        if (j < units) store_unit(a.output, j * 16, reduce_ranks(reduce, in[k], w), total);
      }
    }
  }
  // The root reads no peer's input any more.
  block_barrier(a, call.deadline, call.failed);
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void relay_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t root = a.root;
  const uint32_t chunks = w > 1 ? w - 1 : 1;  // one rank: the root owns chunk 0 itself
  const bool owner = me != root || w == 1;
  const uint32_t mine = relay_chunk(me, root, w);

  // Whether the root's output is its input, published with the start barrier: the other
  // ranks pass their input as output whatever the root does, so only the root knows.
  uint64_t* root_in_place = sync_word(a.scratch[root], OXCCL_ALLREDUCE_SYNC_ROOT_IN_PLACE);
  if (me == root && threadIdx.x == 0) atomic_store_relaxed(root_in_place, a.input == a.output ? 1 : 0);
  // Every peer's call has started: its input is ready and the root's staging is free.
  if (!start_barrier_from(a, call.deadline, call.failed, root)) return;
  // In place at the root, when a chunk takes one round, each owner stores its reduced
  // chunk straight into the root's output, which is the root's registered input (only its
  // owner reads or writes chunk `mine` of it, each unit read before the same thread writes
  // it): no staging, no copy-out, and the round's barrier publishes the stores. 4 H200s:
  // 1-64 MB 8-16% faster than through the staging. Larger calls keep the staging rounds:
  // one pass over a whole chunk (341 MB per owner for 1 GiB) took 3623-3628 us against
  // 3506-3508 in rounds.
  const RelayRounds g((total + 15) / 16, chunks, relay_cap(a));
  const bool in_place = atomic_load_relaxed(root_in_place) != 0 && g.rounds == 1;
  // Unit j of chunk i's round r in the root's staging: half r & 1, chunk i's round at units
  // [i * per_round, (i + 1) * per_round) of it (per_round <= relay_cap: the half holds all).
  const uint64_t half_bytes = a.data_bytes / 2;
  const auto at = [&](uint64_t r, uint32_t i, uint64_t j) {
    return a.data_offset + (r & 1) * half_bytes + (i * g.per_round + (j - g.round_start(i, r))) * 16;
  };
  char* root_output = static_cast<char*>(const_cast<void*>(a.peer_input[root]));  // in place
  for (uint64_t r = 0; r < g.rounds + (in_place ? 0 : 1); ++r) {
    if (owner && r < g.rounds) {
      // Round r of this rank's chunk, reduced from every rank's input into the root's
      // staging (in place: into its output).
      char* staging = static_cast<char*>(a.scratch[root]);
      uint64_t lo, hi;
      g.part(mine, r, lo, hi);
      for (uint64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
        for (uint32_t q = 0; q < OXCCL_ALLREDUCE_MAX_RANKS; ++q) {
          if (q < w) in[q] = peer_unit(static_cast<const char*>(a.peer_input[q]), j, total);
        }
        const Vec16 v = reduce_ranks(reduce, in, w);
        if (in_place) {
          store_unit(root_output, j * 16, v, total);
        } else {
          store16(staging + at(r, mine, j), v);
        }
      }
    }
    if (me == root && r > 0 && !in_place) {
      // Round r - 1 of every chunk, which its owner's same block stored here, into the output.
      const char* staging = static_cast<const char*>(a.scratch[me]);
      for (uint32_t i = 0; i < chunks; ++i) {
        uint64_t lo, hi;
        g.part(i, r - 1, lo, hi);
        for (uint64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
          store_unit(a.output, j * 16, load16_peer(staging + at(r - 1, i, j)), total);
        }
      }
    }
    // Round r has landed in the root's staging, round r - 1 is in the output: the next
    // round may reuse round r - 1's half.
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void local_body(const Reducer reduce, const OxcclAllreduceArgs& a) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  for (uint64_t j = thread_index(); j < units; j += thread_count()) {
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w) in[r] = load_unit(a.peer_input[r], j * 16, total);
    }
    store_unit(a.output, j * 16, reduce_ranks(reduce, in, w), total);
  }
}

}  // namespace reduce_to_root
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reduce_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  // Advances MAILBOX_SEQ, not the epoch (see the file's head). The type dispatch inlined
  // (sm_90: 8 bytes of stack against 72 and spills when nvcc chose).
  run_reducing<true, OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ, true>(
      args, args.root < args.world_size, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
        oxccl::reduce_to_root::oneshot_body<Fmt>(reducer, args, call);
      });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reduce_staged(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_reducing<false>(args, args.root < args.world_size, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    oxccl::reduce_to_root::staged_body<Fmt>(reducer, args, call);
  });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reduce_direct(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_input[args.rank] == args.input;
  run_reducing<false>(args, registered && args.root < args.world_size,
                      [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
                        oxccl::reduce_to_root::direct_body<Fmt>(reducer, args, call);
                      });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reduce_relay(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_input[args.rank] == args.input;
  run_reducing<false>(args, registered && args.root < args.world_size && relay_cap(args) > 0,
                      [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
                        oxccl::reduce_to_root::relay_body<Fmt>(reducer, args, call);
                      });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reduce_local(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  // Not run_call: that advances the epoch (see the file's head).
  if (!args_ok(args)) {
    if (oxccl::thread_index() == 0) report(own_scratch(args), args.abort_flag, OXCCL_ALLREDUCE_ERR_ARGS, args.rank);
    return;
  }
  dispatch_all(args, [&]<typename Fmt>(auto reducer) OXCCL_INLINE_LAMBDA {
    oxccl::reduce_to_root::local_body<Fmt>(reducer, args);
  });
}
