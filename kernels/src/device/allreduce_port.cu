// PortChannel allreduce (allreduce_port): one-shot all-gather through the proxy, then a
// local reduction in rank order. Usable across nodes (the proxy moves the bytes over IPC
// copies, TCP or InfiniBand); within a node the NVLink kernels of allreduce.cu are faster.
// Argument block and scratch layout: OxcclPortAllreduceArgs in include/oxccl/abi_allreduce.h.
// Host stand-in with the same protocol: collectives/src/port_allreduce.rs.
//
// The reducers and dispatch_all come from allreduce.cu, which the unity source of
// kernels/build.rs includes before this file (sources are sorted: "allreduce.cu" <
// "allreduce_port.cu"), so there is one copy of them.
//
// One block: thread p (p < world_size, p != rank) drives the channel to peer p (pushes its
// trigger and waits for its signal); every thread copies and reduces. Rounds of chunk_bytes;
// the round counter lives in the scratch's sync area (nothing on the host advances per
// call, so graph replays stay correct).

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"
#include "oxccl/port_channel_device.hpp"

namespace oxccl {
namespace port_allreduce {

using allreduce::Deadline;

OXCCL_DEVICE_INLINE uint64_t* port_word(void* scratch, uint64_t offset) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + offset);
}

/// Records the first failure of this rank (code | peer << 32) in the port scratch.
OXCCL_DEVICE_INLINE void port_report(void* scratch, uint32_t code, uint32_t peer) {
  uint64_t* err = port_word(scratch, OXCCL_PORT_ALLREDUCE_SYNC_ERROR);
  if (atomic_load_relaxed(err) == 0) {
    atomic_store_relaxed(err, static_cast<uint64_t>(code) | (static_cast<uint64_t>(peer) << 32));
  }
}

/// Waits for the peer's next signal on a PortChannel's host-to-device semaphore, bounded by
/// the call's deadline and by the semaphore's spin limit. On timeout nothing is consumed.
OXCCL_DEVICE_INLINE bool wait_signal(const OxcclHostDeviceSemaphore& s, const Deadline& d) {
  const uint64_t want = *s.expected_inbound + 1;
  uint64_t since = 0;
  for (uint64_t polls = 0; atomic_load_acquire(s.inbound) < want; ++polls) {
    if (d.expired(polls, since) || (s.max_spins != 0 && polls + 1 >= s.max_spins)) return false;
  }
  *s.expected_inbound = want;
  return true;
}

template <typename Fmt, typename Reducer>
__device__ __noinline__ void port_body(const Reducer reduce, const OxcclPortAllreduceArgs& a,
                                       uint64_t round0, const Deadline& d, int* failed) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t c = a.chunk_bytes;
  char* scratch = static_cast<char*>(a.scratch);
  const uint64_t rounds = (total + c - 1) / c;

  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t parity = (round0 + k) & 1;
    const uint64_t base = k * c;
    const uint64_t len = total - base < c ? total - base : c;
    const uint64_t units = (len + 15) / 16;
    if (w > 1) {
      // 1. My chunk into send[parity] (the proxy reads registered memory only).
      char* send = scratch + a.send_offset + parity * c;
      for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
        store16(send + u * 16, allreduce::load_unit(a.input, base + u * 16, total));
      }
      __syncthreads();
      // 2. Thread p: put into my slot of peer p's recv[parity] with a signal, then wait
      //    for p's signal (its chunk of this round has landed in my recv[parity][p]).
      const uint32_t p = threadIdx.x;
      if (p < w && p != me) {
        fence_system();  // the block's stores into send[] before the trigger
        const PortChannelDevice ch{a.channels[p]};
        const uint64_t dst = a.recv_offset + (parity * w + me) * c;
        if (ch.put_with_signal(dst, a.send_offset + parity * c, units * 16) == ~uint64_t{0}) {
          port_report(a.scratch, OXCCL_ALLREDUCE_ERR_TIMEOUT, p);
          *failed = 1;
        } else if (!wait_signal(ch.h.semaphore, d)) {
          port_report(a.scratch, OXCCL_ALLREDUCE_ERR_TIMEOUT, p);
          *failed = 1;
        }
      }
      __syncthreads();
      if (*failed != 0) return;
    }
    // 3. Reduce every rank's chunk in rank order (mine straight from the input).
    const char* recv = scratch + a.recv_offset + parity * w * c;
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
          in[r] = r == me ? allreduce::load_unit(a.input, base + u * 16, total)
                          : allreduce::load16_peer(recv + r * c + u * 16);
        }
      }
      allreduce::store_unit(a.output, base + u * 16, allreduce::reduce_ranks(reduce, in, w), total);
    }
    // Every read of recv[parity] is done before the next round's triggers are pushed.
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomic_store_release(port_word(a.scratch, OXCCL_PORT_ALLREDUCE_SYNC_ROUND), round0 + rounds);
  }
}

OXCCL_DEVICE_INLINE bool port_args_ok(const OxcclPortAllreduceArgs& a) {
  return a.world_size >= 1 && a.world_size <= OXCCL_ALLREDUCE_MAX_RANKS &&
         a.rank < a.world_size && blockDim.x >= a.world_size && gridDim.x == 1 &&
         a.chunk_bytes != 0 && a.chunk_bytes % 16 == 0 && a.scratch != nullptr &&
         (a.world_size == 1 || a.channels != nullptr) && a.dtype < OXCCL_DTYPE_COUNT &&
         a.op <= OXCCL_OP_AVG && a.accum <= OXCCL_ACCUM_F32;
}

}  // namespace port_allreduce
}  // namespace oxccl

OXCCL_GLOBAL __launch_bounds__(512, 1) void allreduce_port(OxcclPortAllreduceArgs args) {
  using namespace oxccl::port_allreduce;
  if (!port_args_ok(args)) {
    if (oxccl::thread_index() == 0 && args.scratch != nullptr) {
      port_report(args.scratch, OXCCL_ALLREDUCE_ERR_ARGS, args.rank);
    }
    return;
  }
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  const uint64_t round0 =
      oxccl::atomic_load_relaxed(port_word(args.scratch, OXCCL_PORT_ALLREDUCE_SYNC_ROUND));
  __syncthreads();
  const Deadline d{args.timeout_ns};
  // dispatch_all reads only dtype, op and accum of its block.
  OxcclAllreduceArgs types{};
  types.dtype = args.dtype;
  types.op = args.op;
  types.accum = args.accum;
  oxccl::allreduce::dispatch_all(types, [&]<typename Fmt>(auto reducer) {
    port_body<Fmt>(reducer, args, round0, d, &failed);
  });
}
