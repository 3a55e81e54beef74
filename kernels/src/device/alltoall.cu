// All-to-all kernels: chunk p (elements [p * count, (p + 1) * count)) of rank r's input
// lands in slot r of rank p's output; both buffers hold `world * count` elements. The same
// argument block, scratch and epoch as the allreduce kernels
// (include/oxccl/abi_allreduce.h; op and accum unused); data only moves, so the kernels see
// bytes. Host stand-ins with the same protocol: collectives/src/algorithms/all_to_all/.
//
// - alltoall_oneshot_ll: small messages. Chunk p of my input as LL16 packets into slot
//   `me` of peer p's packet half, my own chunk copied locally, then every peer's packets
//   from my half into its output slot. One kernel, no barrier.
// - alltoall_staged: any size on buffers nobody registered. Push chunk c into slot `me` of
//   rank c's staging; barrier; copy every peer's slot from my staging into my output;
//   barrier (the staging is free again). In rounds when it does not fit.
// - alltoall_direct: registered outputs. Barrier (every peer's output is free); store chunk
//   p into slot `me` of rank p's output; barrier.
//
// all_to_all_v (per-peer counts and displacements): the same protocols with the call's
// layout in OxcclAlltoallvArgs (bytes, index = peer; abi_allreduce.h). Chunks are byte
// ranges at any byte offset, cut into 16-byte units from each chunk's start.
// - alltoallv_oneshot_ll: my chunk for p as LL16 packets into slot `me` of p's current
//   half (a fixed slot stride, the half split evenly), my own chunk copied locally; an
//   empty chunk sends an acknowledgement instead; then every peer's packets (or its
//   acknowledgement) from my half. No barrier.
// - alltoallv_direct: outputs every rank reaches. Barrier; every block stores its share of
//   every chunk into peer_output[p] + remote_offset[p], all chunks in one pass; barrier.

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"

namespace oxccl {
namespace alltoall {

using namespace oxccl::allreduce;

/// Chunk `p` of the input (what goes to rank p) and slot `r` of the output (what came from
/// rank r), each `total` bytes.
OXCCL_DEVICE_INLINE const char* chunk(const OxcclAllreduceArgs& a, uint32_t p, uint64_t total) {
  return static_cast<const char*>(a.input) + p * total;
}
OXCCL_DEVICE_INLINE char* slot(void* output, uint32_t r, uint64_t total) { return static_cast<char*>(output) + r * total; }

OXCCL_DEVICE_INLINE void oneshot_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit

  // Write: chunk p of my input into slot `me` of peer p's current half; my own chunk into
  // my own output slot.
  for (uint64_t u = first; u < units; u += stride) {
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = me + k < w ? me + k : me + k - w;
      const Vec16 v = load_unit(chunk(a, p, total), u * 16, total);
      OxcclLL16Packet* dst = reinterpret_cast<OxcclLL16Packet*>(
                                 static_cast<char*>(a.scratch[p]) + half + me * slot_bytes) +
                             2 * u;
      ll16_write(dst, v.w[0], v.w[1], flag);
      ll16_write(dst + 1, v.w[2], v.w[3], flag);
    }
    store_unit(slot(a.output, me, total), u * 16, load_unit(chunk(a, me, total), u * 16, total), total);
  }
  call.count_block(epoch);

  // Read: every peer's chunk for me from my own half into its output slot.
  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t all_peers = ll16_peer_bits(w, me);
  for (uint64_t u = first; u < units; u += stride) {
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
    if (!ll16_read_peers(mine, u, slot_bytes, flag, all_peers, in, call)) return;
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w && r != me) store_unit(slot(a.output, r, total), u * 16, in[r], total);
    }
  }
}

OXCCL_DEVICE_INLINE void staged_body(const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * dtype_bytes(a.dtype);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const char* own = static_cast<const char*>(a.scratch[me]) + a.data_offset;
  const SlotRounds g(a, units);  // one staging slot per rank

  for (uint64_t base = 0; base < units; base += g.cap) {
    const uint64_t n = units - base < g.cap ? units - base : g.cap;  // units this round
    // 1. Push chunk c of my input into slot `me` of rank c's staging; my own chunk into my
    //    own output slot.
    for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
      const uint64_t off = (base + j) * 16;
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t c = me + k < w ? me + k : me + k - w;
        store16(static_cast<char*>(a.scratch[c]) + a.data_offset + (me * g.cap + j) * 16,
                load_unit(chunk(a, c, total), off, total));
      }
      store_unit(slot(a.output, me, total), off, load_unit(chunk(a, me, total), off, total), total);
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. Every peer's slot from my staging into my output.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t c = me + k < w ? me + k : me + k - w;
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        store_unit(slot(a.output, c, total), (base + j) * 16, load16_peer(own + (c * g.cap + j) * 16), total);
      }
    }
    // My staging is free for the peers' next round (or next call).
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
  for (uint64_t j = spread_index(); j < units; j += thread_count()) {
    // Peers first (remote stores take longest), my own slot last.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = me + k < w ? me + k : me + k - w;
      store_unit(slot(a.peer_output[p], me, total), j * 16, load_unit(chunk(a, p, total), j * 16, total), total);
    }
    store_unit(slot(a.output, me, total), j * 16, load_unit(chunk(a, me, total), j * 16, total), total);
  }
  // Every peer stored its chunk into my output.
  block_barrier(a, call.deadline, call.failed);
}

/// The slot of every rank in a packet half of alltoallv_oneshot_ll: the same on every rank
/// whatever its chunks (a multiple of 16 bytes).
OXCCL_DEVICE_INLINE uint64_t v_slot_bytes(const OxcclAllreduceArgs& a) {
  return a.world_size == 0 ? 0 : a.packet_half_bytes / a.world_size / 16 * 16;
}

/// Whether every chunk this rank sends to or receives from a peer fits a slot as LL16
/// packets (two per 16-byte unit; its own chunk is copied locally), and a slot holds at
/// least one unit (an acknowledgement).
OXCCL_DEVICE_INLINE bool v_fits_slots(const OxcclAlltoallvArgs& v) {
  const uint64_t slot_bytes = v_slot_bytes(v.base);
  bool ok = slot_bytes >= 32;
#pragma unroll
  for (uint32_t p = 0; p < OXCCL_ALLREDUCE_MAX_RANKS; ++p) {
    const bool peer = p < v.base.world_size && p != v.base.rank;
    ok = ok && (!peer || ((v.send_bytes[p] + 15) / 16 * 32 <= slot_bytes &&
                          (v.recv_bytes[p] + 15) / 16 * 32 <= slot_bytes));
  }
  return ok;
}

OXCCL_DEVICE_INLINE void v_oneshot_body(const OxcclAlltoallvArgs& v, const CallState call) {
  const OxcclAllreduceArgs& a = v.base;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = v_slot_bytes(a);
  const char* input = static_cast<const char*>(a.input);
  char* output = static_cast<char*>(a.output);

  // Write: my chunk for peer p into slot `me` of p's current half, an acknowledgement
  // where it is empty; my own chunk into my output.
  for (uint32_t k = 1; k < w; ++k) {
    const uint32_t p = me + k < w ? me + k : me + k - w;
    const uint64_t bytes = v.send_bytes[p];
    const char* src = input + v.send_offset[p];
    OxcclLL16Packet* dst =
        reinterpret_cast<OxcclLL16Packet*>(static_cast<char*>(a.scratch[p]) + half + me * slot_bytes);
    if (bytes == 0 && first == 0) ll16_ack(a, p, half, slot_bytes, flag);
    for (uint64_t u = first; u < (bytes + 15) / 16; u += stride) {
      const Vec16 x = load_unit(src, u * 16, bytes);
      ll16_write(dst + 2 * u, x.w[0], x.w[1], flag);
      ll16_write(dst + 2 * u + 1, x.w[2], x.w[3], flag);
    }
  }
  {
    const uint64_t bytes = v.send_bytes[me];
    const char* src = input + v.send_offset[me];
    char* dst = output + v.recv_offset[me];
    for (uint64_t u = first; u < (bytes + 15) / 16; u += stride) {
      store_unit(dst, u * 16, load_unit(src, u * 16, bytes), bytes);
    }
  }
  call.count_block(epoch);

  // Read: unit u of every peer that sends at least u + 1 units, from my own half; the
  // acknowledgements of the peers that send nothing.
  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  uint64_t most = 0;
  uint32_t empty = 0;
#pragma unroll
  for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
    if (r < w && r != me) {
      const uint64_t n = (v.recv_bytes[r] + 15) / 16;
      most = n > most ? n : most;
      if (n == 0) empty |= 3u << (2 * r);
    }
  }
  for (uint64_t u = first; u < most; u += stride) {
    uint32_t peers = 0;
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w && r != me && u * 16 < v.recv_bytes[r]) peers |= 3u << (2 * r);
    }
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
    if (!ll16_read_peers(mine, u, slot_bytes, flag, peers, in, call)) return;
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (peers >> (2 * r) & 1) store_unit(output + v.recv_offset[r], u * 16, in[r], v.recv_bytes[r]);
    }
  }
  if (first == 0 && empty != 0) ll16_wait_acks(mine, slot_bytes, flag, empty, call);
}

OXCCL_DEVICE_INLINE void v_direct_body(const OxcclAlltoallvArgs& v, const CallState call) {
  const OxcclAllreduceArgs& a = v.base;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const char* input = static_cast<const char*>(a.input);

  // Every chunk in sending order (index k: peer me + 1 + k, my own chunk last): its source,
  // destination, bytes and units. Indexed by k, constant after unrolling.
  const char* src[OXCCL_ALLREDUCE_MAX_RANKS];
  char* dst[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t rest[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t mine[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t most = 0;
#pragma unroll
  for (uint32_t k = 0; k < OXCCL_ALLREDUCE_MAX_RANKS; ++k) {
    const uint32_t p = k < w ? (me + 1 + k) % w : me;
    const uint64_t bytes = k < w ? v.send_bytes[p] : 0;
    const uint64_t units = (bytes + 15) / 16;
    char* out = p == me ? static_cast<char*>(a.output) + v.recv_offset[me]
                        : static_cast<char*>(a.peer_output[p]) + v.remote_offset[p];
    src[k] = input + v.send_offset[p];
    dst[k] = out;
    rest[k] = bytes;
    mine[k] = units;
    most = mine[k] > most ? mine[k] : most;
  }

  // Every peer's call has started: its output is free to write.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  // Every thread moves its unit of every chunk in one pass: the remote stores of all the
  // peers are in flight together and my own chunk's local copy fills their gaps (chunk
  // after chunk left the local copy for the end, after the slowest peer's stores).
  for (uint64_t i = spread_index(); i < most; i += thread_count()) {
#pragma unroll
    for (uint32_t k = 0; k < OXCCL_ALLREDUCE_MAX_RANKS; ++k) {
      if (i < mine[k]) store_unit(dst[k], i * 16, load_unit(src[k], i * 16, rest[k]), rest[k]);
    }
  }
  // Every peer stored its chunk into my output.
  block_barrier(a, call.deadline, call.failed);
}

}  // namespace alltoall
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void alltoall_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<true>(args, true, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::alltoall::oneshot_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void alltoall_staged(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<false>(args, true, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::alltoall::staged_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void alltoall_direct(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_output[args.rank] == args.output;
  run_call<false>(args, registered, [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::alltoall::direct_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void alltoallv_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAlltoallvArgs param) {
  const OxcclAlltoallvArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_call<true>(args.base, oxccl::alltoall::v_fits_slots(args),
                 [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::alltoall::v_oneshot_body(args, call); });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void alltoallv_direct(const OXCCL_GRID_CONSTANT OxcclAlltoallvArgs param) {
  const OxcclAlltoallvArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered =
      args.base.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.base.peer_output[args.base.rank] == args.base.output;
  run_call<false>(args.base, registered,
                  [&](const CallState call) OXCCL_INLINE_LAMBDA { oxccl::alltoall::v_direct_body(args, call); });
}
