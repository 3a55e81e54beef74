// Reduce-scatter kernels: rank r's output (`count` elements) is the reduction, in rank
// order, of chunk r (elements [r * count, (r + 1) * count)) of every rank's input. The
// same argument block, scratch and epoch as the allreduce kernels
// (include/oxccl/abi_allreduce.h), the same reducers (oxccl/reducers.hpp), so every rank
// gets the bits of the host reference. Host stand-ins with the same protocol:
// collectives/src/algorithms/reduce_scatter/.
//
// - reducescatter_oneshot_ll: small messages. Chunk p of my input as LL16 packets into slot
//   `me` of peer p's packet half, then my chunk from every peer's packets, reduced. One
//   kernel, no barrier.
// - reducescatter_staged: any size on buffers nobody registered (the first half of the
//   push two-shot). Push chunk c of my input into slot `me` of rank c's staging; barrier;
//   reduce my chunk from my input and my staging; barrier (the staging is free again). In
//   rounds when it does not fit.
// - reducescatter_direct: registered inputs. Barrier (every peer's input is ready); reduce
//   my chunk straight from every rank's input (peer loads); barrier (no peer reads my input
//   any more).
//
// In place (NCCL's rule: output == input + rank * count elements), my chunk of the input is
// the output: each unit is read before the same thread writes it.

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"
#include "oxccl/reducers.hpp"

namespace oxccl {
namespace reducescatter {

using namespace oxccl::allreduce;

/// Chunk `r` of the input: what rank r reduces.
OXCCL_DEVICE_INLINE const char* chunk(const OxcclAllreduceArgs& a, uint32_t r, uint64_t total) {
  return static_cast<const char*>(a.input) + r * total;
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void oneshot_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit

  // Write: chunk p of my input into slot `me` of peer p's current half.
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
  }
  call.count_block(epoch);

  // Read and reduce: my chunk of every rank, in rank order.
  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t all_peers = ll16_peer_bits(w, me);
  for (uint64_t u = first; u < units; u += stride) {
    const Vec16 own_unit = load_unit(chunk(a, me, total), u * 16, total);
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) in[r] = own_unit;  // peers' replaced below
    // Peers polled two at a time, as the reduce root (reduce.cu): with every peer's packets
    // in flight at once nvcc kept them on a 192-byte stack.
    if (!ll16_read_peers<2>(mine, u, slot_bytes, flag, all_peers, in, call)) return;
    store_unit(a.output, u * 16, reduce_ranks(reduce, in, w), total);
  }
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void staged_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const char* own = static_cast<const char*>(a.scratch[me]) + a.data_offset;
  const SlotRounds g(a, units);  // `cap` units of every chunk per round

  for (uint64_t base = 0; base < units; base += g.cap) {
    const uint64_t n = units - base < g.cap ? units - base : g.cap;  // units this round
    // 1. Push: chunk c of my input into slot `me` of rank c's staging.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t c = me + k < w ? me + k : me + k - w;
      char* dst = static_cast<char*>(a.scratch[c]) + a.data_offset + me * g.cap * 16;
      for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
        store16(dst + j * 16, load_unit(chunk(a, c, total), (base + j) * 16, total));
      }
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. Reduce my chunk (rank order) from my input and my staging.
    for (uint64_t j = g.first; j < g.cap && j < n; j += g.step) {
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
          in[r] = r == me ? load_unit(chunk(a, me, total), (base + j) * 16, total)
                          : load16_peer(own + (r * g.cap + j) * 16);  // written by r
        }
      }
      store_unit(a.output, (base + j) * 16, reduce_ranks(reduce, in, w), total);
    }
    // My staging is free for the peers' next round (or next call).
    if (!block_barrier(a, call.deadline, call.failed)) return;
  }
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void direct_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;

  // Every peer's call has started: its input is ready.
  if (!start_barrier(a, call.deadline, call.failed)) return;
  for (uint64_t j = spread_index(); j < units; j += thread_count()) {
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w) in[r] = peer_unit(static_cast<const char*>(a.peer_input[r]) + me * total, j, total);
    }
    store_unit(a.output, j * 16, reduce_ranks(reduce, in, w), total);
  }
  // No peer reads my input any more.
  block_barrier(a, call.deadline, call.failed);
}

}  // namespace reducescatter
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reducescatter_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  // The type dispatch inlined, as reduce_oneshot_ll's (no call that spills around it).
  run_reducing<true, OXCCL_ALLREDUCE_SYNC_EPOCH, true>(
      args, true, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
        oxccl::reducescatter::oneshot_body<Fmt>(reducer, args, call);
      });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reducescatter_staged(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_reducing<false>(args, true, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    oxccl::reducescatter::staged_body<Fmt>(reducer, args, call);
  });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reducescatter_direct(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_input[args.rank] == args.input;
  run_reducing<false>(args, registered, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    oxccl::reducescatter::direct_body<Fmt>(reducer, args, call);
  });
}
