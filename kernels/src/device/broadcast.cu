// Broadcast kernels: every rank's output (`count` elements) gets the root's input. The same
// argument block (`root` names the root), scratch and epoch as the allreduce kernels
// (include/oxccl/abi_allreduce.h); data only moves, so the kernels see bytes. Host stand-ins
// with the same protocol: collectives/src/algorithms/broadcast/.
//
// - broadcast_oneshot_ll: small messages, no barrier. The root writes its input as LL16
//   packets into slot `root` of every peer's packet half; every other rank writes an
//   acknowledgement into slot `me` of every peer's half (`ll16_ack`: the root receives no
//   data, and the epoch-parity halves are safe only while every rank receives from every
//   peer); then every rank reads the root's packets into its output and waits for the
//   other acknowledgements.
// - broadcast_staged: any size on buffers nobody registered. The root pushes its input into
//   every peer's staging; barrier; every peer copies its staging into its output; barrier
//   (the staging is free again). In rounds when it does not fit.
// - broadcast_direct: registered outputs. Barrier (every peer's output is free); the root
//   stores its input into every rank's output; barrier.
//
// - broadcast_relay: registered outputs, 3 or more ranks. The root's link carries each byte
//   once instead of once per peer: the data is split into one chunk per other rank, the
//   root stores chunk k into the output of the k-th rank after it, and that rank stores it
//   on into every other rank's output, in rounds (RelayRounds) whose barriers let round
//   r + 1's first hop overlap round r's second. Barrier (outputs free); rounds; the last
//   barrier says every output is complete.
// - broadcast_barrier: the two barriers of the copy-engine broadcast (broadcast_copy in
//   collectives/src/algorithms/broadcast/copy_engine.rs), which moves the data itself with
//   the copy engine between them: one block, one barrier.
//
// In place (input == output), the root's own copy is skipped.

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"

namespace oxccl {
namespace broadcast {

using namespace oxccl::allreduce;

OXCCL_DEVICE_INLINE void oneshot_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t root = a.root;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  // The first unit's load and the epoch read go out together: the packets need both.
  Vec16 v = me == root && first < units ? load_unit(a.input, first * 16, total) : Vec16{{0, 0, 0, 0}};
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit

  if (me == root) {
    const bool in_place = a.input == a.output;
    for (uint64_t u = first; u < units; u += stride) {
      if (u != first) v = load_unit(a.input, u * 16, total);
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        OxcclLL16Packet* dst = reinterpret_cast<OxcclLL16Packet*>(
                                   static_cast<char*>(a.scratch[p]) + half + root * slot_bytes) +
                               2 * u;
        ll16_write(dst, v.w[0], v.w[1], flag);
        ll16_write(dst + 1, v.w[2], v.w[3], flag);
      }
      if (!in_place) store_unit(a.output, u * 16, v, total);
    }
  } else if (first == 0) {
    for (uint32_t k = 1; k < w; ++k) ll16_ack(a, me + k < w ? me + k : me + k - w, half, slot_bytes, flag);
  }
  call.count_block(epoch);

  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t peers = ll16_peer_bits(w, me);
  if (me == root) {
    if (first == 0) ll16_wait_acks(mine, slot_bytes, flag, peers, call);
    return;
  }
  const uint32_t from_root = 3u << (2 * root);
  for (uint64_t u = first; u < units; u += stride) {
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
    if (!ll16_read_peers(mine, u, slot_bytes, flag, from_root, in, call)) return;
    // The root's unit, picked with constant indices (a variable index would put `in` on
    // the stack).
    Vec16 got = in[0];
#pragma unroll
    for (uint32_t r = 1; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r == root) got = in[r];
    }
    store_unit(a.output, u * 16, got, total);
  }
  if (first == 0 && (peers & ~from_root) != 0) ll16_wait_acks(mine, slot_bytes, flag, peers & ~from_root, call);
}

OXCCL_DEVICE_INLINE void staged_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const bool root = me == a.root;
  const bool in_place = a.input == a.output;
  const char* own = static_cast<const char*>(a.scratch[me]) + a.data_offset;
  const SlotRounds g(a, units);  // one staging slot per rank

  for (uint64_t base = 0; base < units; base += g.cap) {
    const uint64_t n = units - base < g.cap ? units - base : g.cap;  // units this round
    // 1. The root pushes this round into every peer's staging (and its own output).
    if (root) {
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        const uint64_t off = (base + j) * 16;
        const Vec16 v = load_unit(a.input, off, total);
        for (uint32_t k = 1; k < w; ++k) {
          const uint32_t p = me + k < w ? me + k : me + k - w;
          store16(static_cast<char*>(a.scratch[p]) + a.data_offset + j * 16, v);
        }
        if (!in_place) store_unit(a.output, off, v, total);
      }
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;
    // 2. Every peer copies its staging into its output.
    if (!root) {
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        store_unit(a.output, (base + j) * 16, load16_peer(own + j * 16), total);
      }
    }
    // The staging is free for the root's next round (or next call).
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

OXCCL_DEVICE_INLINE void direct_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;

  // Every peer's call has started: its output is free to write.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  if (me == a.root) {
    const bool in_place = a.input == a.output;
    for (uint64_t j = spread_index(); j < units; j += thread_count()) {
      const Vec16 v = load_unit(a.input, j * 16, total);
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        store_unit(a.peer_output[p], j * 16, v, total);
      }
      if (!in_place) store_unit(a.output, j * 16, v, total);
    }
  }
  // The root's stores into every output are done.
  block_barrier(a, call.deadline, call.failed);
}

OXCCL_DEVICE_INLINE void relay_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t root = a.root;
  const uint32_t chunks = w > 1 ? w - 1 : 1;  // one rank: the root relays to itself
  const RelayRounds g((total + 15) / 16, chunks, relay_cap(a));
  const bool in_place = a.input == a.output;

  // Every peer's call has started: its output is free to write.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  for (uint64_t r = 0; r <= g.rounds; ++r) {
    if (me == root && r < g.rounds) {
      // First hop of round r: chunk i to the rank that relays it (every chunk at once,
      // so every link is busy).
      for (uint64_t t = threadIdx.x; t < g.share; t += blockDim.x) {
        for (uint32_t i = 0; i < chunks; ++i) {
          uint64_t lo, hi;
          g.part(i, r, lo, hi);
          if (lo + t >= hi) continue;
          const uint64_t off = (lo + t) * 16;
          const Vec16 v = load_unit(a.input, off, total);
          store_unit(a.peer_output[relay_rank(i, root, w)], off, v, total);
          if (!in_place) store_unit(a.output, off, v, total);
        }
      }
    } else if (me != root && r > 0) {
      // Second hop of round r - 1: this rank's chunk, which the root stored here, to every
      // rank but the root.
      uint64_t lo, hi;
      g.part(relay_chunk(me, root, w), r - 1, lo, hi);
      for (uint64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const Vec16 v = peer_unit(static_cast<const char*>(a.output), j, total);  // written by the root
        for (uint32_t k = 1; k < w; ++k) {
          const uint32_t q = me + k < w ? me + k : me + k - w;
          if (q != root) store_unit(a.peer_output[q], j * 16, v, total);
        }
      }
    }
    // Round r's first hop has landed (and round r - 1's second): the next round may go.
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

}  // namespace broadcast
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void broadcast_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<true>(args, args.root < args.world_size,
                 [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::broadcast::oneshot_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void broadcast_staged(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<false>(args, args.root < args.world_size,
                  [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::broadcast::staged_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void broadcast_direct(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_output[args.rank] == args.output;
  run_call<false>(args, registered && args.root < args.world_size,
                  [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::broadcast::direct_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void broadcast_relay(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_output[args.rank] == args.output;
  run_call<false>(args, registered && args.root < args.world_size && relay_cap(args) > 0,
                  [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::broadcast::relay_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void broadcast_barrier(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<false>(args, gridDim.x == 1 && args.root < args.world_size,
                  [&](const CallState call) OXCCL_INLINE_LAMBDA { block_barrier(args, call.deadline, call.failed); });
}
