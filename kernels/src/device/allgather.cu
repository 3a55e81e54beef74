// All-gather kernels: every rank's input (`count` elements) lands in slot r (at byte
// r * count * size) of every rank's output. The same argument block, scratch and epoch as
// the allreduce kernels (include/oxccl/abi_allreduce.h; op and accum are unused), so the
// communicator's one shared scratch serves every collective. Data only moves, so the
// kernels see bytes, never elements. Host stand-ins with the same protocol:
// collectives/src/algorithms/all_gather/.
//
// - allgather_oneshot_ll: small messages. My input as LL16 packets into slot `me` of
//   every peer's packet half (as the allreduce one-shot), then every peer's packets from
//   my half into the output. One kernel, no barrier.
// - allgather_staged: any size on buffers nobody registered. Push my input into slot `me`
//   of every peer's staging; barrier; copy every peer's slot from my staging into my
//   output; barrier (the staging is free again). In rounds when it does not fit.
// - allgather_direct: registered outputs. Barrier (every peer's call has started, so its
//   output is free); store my input into slot `me` of every rank's output; barrier.
//
// In place (NCCL's rule: input == output + rank * bytes), the copy of my own slot is
// skipped.

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"

namespace oxccl {
namespace allgather {

using namespace oxccl::allreduce;

/// Bytes of one rank's input.
OXCCL_DEVICE_INLINE uint64_t input_bytes(const OxcclAllreduceArgs& a) { return a.count * dtype_bytes(a.dtype); }

/// Slot `r` of the output: where rank r's input goes.
OXCCL_DEVICE_INLINE char* slot(const OxcclAllreduceArgs& a, uint32_t r, uint64_t total) {
  return static_cast<char*>(a.output) + r * total;
}

OXCCL_DEVICE_INLINE void oneshot_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = input_bytes(a);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  char* own_slot = slot(a, me, total);
  const bool in_place = a.input == own_slot;
  // The first unit's load and the epoch read go out together: the packets need both.
  Vec16 v = first < units ? load_unit(a.input, first * 16, total) : Vec16{{0, 0, 0, 0}};
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit

  // Write: my input as packets into slot `me` of every peer's current half, and into my
  // own output slot.
  for (uint64_t u = first; u < units; u += stride) {
    if (u != first) v = load_unit(a.input, u * 16, total);
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = me + k < w ? me + k : me + k - w;
      OxcclLL16Packet* dst = reinterpret_cast<OxcclLL16Packet*>(
                                 static_cast<char*>(a.scratch[p]) + half + me * slot_bytes) +
                             2 * u;
      ll16_write(dst, v.w[0], v.w[1], flag);
      ll16_write(dst + 1, v.w[2], v.w[3], flag);
    }
    if (!in_place) store_unit(own_slot, u * 16, v, total);
  }
  call.count_block(epoch);

  // Read: every peer's unit from my own half into its output slot.
  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t all_peers = ll16_peer_bits(w, me);
  for (uint64_t u = first; u < units; u += stride) {
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
    if (!ll16_read_peers(mine, u, slot_bytes, flag, all_peers, in, call)) return;
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w && r != me) store_unit(slot(a, r, total), u * 16, in[r], total);
    }
  }
}

OXCCL_DEVICE_INLINE void staged_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = input_bytes(a);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  char* own = static_cast<char*>(a.scratch[me]);
  char* own_slot = slot(a, me, total);
  const bool in_place = a.input == own_slot;
  const SlotRounds g(a, units);  // one staging slot per rank

  for (uint64_t base = 0; base < units; base += g.cap) {
    const uint64_t n = units - base < g.cap ? units - base : g.cap;  // units this round
    // 1. Push my units into slot `me` of every peer's staging (and my own output slot).
    for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
      const uint64_t off = (base + j) * 16;
      const Vec16 v = load_unit(a.input, off, total);
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        store16(static_cast<char*>(a.scratch[p]) + a.data_offset + (me * g.cap + j) * 16, v);
      }
      if (!in_place) store_unit(own_slot, off, v, total);
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. Every peer's units from my staging into its output slot.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t c = me + k < w ? me + k : me + k - w;
      char* dst = slot(a, c, total);
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        store_unit(dst, (base + j) * 16, load16_peer(own + a.data_offset + (c * g.cap + j) * 16), total);
      }
    }
    // My staging is free for the peers' next round (or next call).
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

OXCCL_DEVICE_INLINE void direct_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = input_bytes(a);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  char* own_slot = slot(a, me, total);
  const bool in_place = a.input == own_slot;

  // Every peer's call has started: its output is free to write.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  for (uint64_t j = spread_index(); j < units; j += thread_count()) {
    const Vec16 v = load_unit(a.input, j * 16, total);
    // Peers first (remote stores take longest), my own slot last.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = me + k < w ? me + k : me + k - w;
      store_unit(static_cast<char*>(a.peer_output[p]) + me * total, j * 16, v, total);
    }
    if (!in_place) store_unit(own_slot, j * 16, v, total);
  }
  // Every peer stored its slot into my output.
  block_barrier(a, call.deadline, call.failed);
}

}  // namespace allgather
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allgather_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<true>(args, true, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::allgather::oneshot_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allgather_staged(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<false>(args, true, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::allgather::staged_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allgather_direct(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_output[args.rank] == args.output;
  run_call<false>(args, registered, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::allgather::direct_body(args, call); });
}
