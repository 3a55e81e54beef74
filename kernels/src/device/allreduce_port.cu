// PortChannel kernels (allreduce_port, reducescatter_port, allgather_port): a one-shot
// exchange through the proxy, then local work: a reduction in rank order (allreduce, and
// reduce-scatter on the chunk each rank owns) or copies into the output slots (all-gather).
// Usable across nodes (the proxy moves the bytes over IPC copies, TCP or InfiniBand);
// within a node the NVLink kernels are faster. Argument block and scratch layout:
// OxcclPortAllreduceArgs in include/oxccl/abi_allreduce.h (one block for the three; for
// all-gather `count` is one rank's input, for reduce-scatter one rank's output). Host
// stand-ins with the same protocol: collectives/src/algorithms/port_channel/host.rs.
//
// The reducers and dispatch_all come from allreduce.cu, which the unity source of
// kernels/build.rs includes before this file (sources are sorted: "allreduce.cu" <
// "allreduce_port.cu"), so there is one copy of them. allreduce_port and
// reducescatter_port share one instantiation per format and reducer (a run-time flag).
//
// One block: thread p (p < world_size, p != rank) drives the channel to peer p (pushes its
// triggers and waits for its signals); every thread stages, copies and reduces. Rounds of
// chunk_bytes in three slots, so the next round is staged and on the wire while this one is
// reduced (TCP peers: the socket is the bottleneck, keep it busy); the round counter
// (`rounds`, device memory) is shared by the three kernels (nothing on the host advances per
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

/// Records the first failure of this rank (code | peer << 32) in the port scratch, and
/// mirrors it for the host (`allreduce::mirror_failure`).
OXCCL_DEVICE_INLINE void port_report(const OxcclPortAllreduceArgs& a, uint32_t code, uint32_t peer) {
  uint64_t* err = port_word(a.scratch, OXCCL_PORT_ALLREDUCE_SYNC_ERROR);
  const uint64_t word = static_cast<uint64_t>(code) | (static_cast<uint64_t>(peer) << 32);
  if (atomic_load_relaxed(err) == 0) atomic_store_relaxed(err, word);
  allreduce::mirror_failure(a.abort_flag, word);
}

/// Waits for the peer's next signal on a PortChannel's host-to-device semaphore, bounded by
/// the call's deadline (time limit and abort word) and by the semaphore's spin limit. On
/// failure nothing is consumed.
OXCCL_DEVICE_INLINE bool wait_signal(const OxcclHostDeviceSemaphore& s, const Deadline& d) {
  const uint64_t want = *s.expected_inbound + 1;
  uint64_t since = 0;
  for (uint64_t polls = 0; atomic_load_acquire(s.inbound) < want; ++polls) {
    if (d.expired(polls, since) || (s.max_spins != 0 && polls + 1 >= s.max_spins)) return false;
  }
  *s.expected_inbound = want;
  return true;
}

/// Round k of a call whose per-rank chunk of the whole call is `total` bytes: its slot
/// (global round mod OXCCL_PORT_ROUND_SLOTS), first byte, 16-byte units, and this rank's
/// recv[slot].
struct PortRound {
  uint64_t slot;
  uint64_t base;
  uint64_t units;
  const char* recv;
};

/// Bytes of one round of this call (at most one slot; port_args_ok checked it).
OXCCL_DEVICE_INLINE uint64_t port_step(const OxcclPortAllreduceArgs& a) {
  return a.round_bytes != 0 ? a.round_bytes : a.chunk_bytes;
}

OXCCL_DEVICE_INLINE PortRound port_round(const OxcclPortAllreduceArgs& a, uint64_t round0,
                                         uint64_t k, uint64_t total) {
  const uint64_t step = port_step(a);
  PortRound r;
  r.slot = (round0 + k) % OXCCL_PORT_ROUND_SLOTS;
  r.base = k * step;
  r.units = ((total - r.base < step ? total - r.base : step) + 15) / 16;
  r.recv = static_cast<const char*>(a.scratch) + a.recv_offset + r.slot * a.world_size * a.chunk_bytes;
  return r;
}

/// The end of a call: `rounds` more rounds completed (one thread; the next call reads it).
OXCCL_DEVICE_INLINE void port_finish(const OxcclPortAllreduceArgs& a, uint64_t round0,
                                     uint64_t rounds) {
  if (threadIdx.x == 0) atomic_store_release(a.rounds, round0 + rounds);
}

/// First byte of send[slot][0].
OXCCL_DEVICE_INLINE uint64_t port_send_group(const OxcclPortAllreduceArgs& a, const PortRound& r) {
  return a.send_offset + r.slot * a.world_size * a.chunk_bytes;
}

/// Stages what leaves this rank in round `round` in its send slots (the proxy reads
/// registered memory only): `scatter` (reduce-scatter): slot p gets chunk p of my input;
/// otherwise slot 0 gets my input. Every thread stages; the caller syncs the block.
OXCCL_DEVICE_OUTLINED void port_stage(const OxcclPortAllreduceArgs& a, uint64_t total,
                                      const PortRound& round, bool scatter) {
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t c = a.chunk_bytes;
  const uint64_t base = round.base;
  const uint64_t units = round.units;
  char* send = static_cast<char*>(a.scratch) + port_send_group(a, round);
  const char* input = static_cast<const char*>(a.input);
  if (scatter) {
    for (uint64_t i = threadIdx.x; i < w * units; i += blockDim.x) {
      const uint64_t p = i / units;
      const uint64_t u = i - p * units;
      if (p != me) {
        store16(send + p * c + u * 16, allreduce::load_unit(input + p * total, base + u * 16, total));
      }
    }
  } else {
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
      store16(send + u * 16, allreduce::load_unit(input, base + u * 16, total));
    }
  }
}

/// Thread p (a peer) pushes put_with_signal of round `round` into my slot of p's
/// recv[slot]. False (recorded) when the FIFO stayed full.
OXCCL_DEVICE_INLINE bool port_push(const OxcclPortAllreduceArgs& a, const PortRound& round,
                                   bool scatter, const Deadline& d, uint32_t p) {
  fence_system();  // the block's stores into send[] before the trigger
  const PortChannelDevice ch{a.channels[p]};
  const uint64_t c = a.chunk_bytes;
  const uint64_t dst = a.recv_offset + (round.slot * a.world_size + a.rank) * c;
  const uint64_t src = port_send_group(a, round) + (scatter ? p : 0) * c;
  // A full FIFO ends at the FIFO's own spin limit (it does not read the abort word);
  // either failure is reported as an abort once the communicator was aborted.
  if (ch.put_with_signal(dst, src, round.units * 16) == ~uint64_t{0}) {
    port_report(a, d.failure(), p);
    return false;
  }
  return true;
}

/// Round k's exchange and the push of round k + 1, pipelined over OXCCL_PORT_ROUND_SLOTS
/// slots (see abi_allreduce.h): round k + 1 is staged while round k is on the wire, and
/// thread p pushes it to p as soon as p's round k has landed, before this rank reduces
/// round k. Round 0 is staged and pushed first (`k == 0`). Returns false when a push or
/// a wait failed (recorded in the scratch).
OXCCL_DEVICE_OUTLINED bool port_exchange(const OxcclPortAllreduceArgs& a, uint64_t total,
                                         uint64_t round0, uint64_t k, uint64_t rounds,
                                         bool scatter, const Deadline& d, int* failed) {
  const uint32_t p = threadIdx.x;
  const bool peer = p < a.world_size && p != a.rank;
  const PortRound round = port_round(a, round0, k, total);
  if (k == 0) {
    port_stage(a, total, round, scatter);
    __syncthreads();
    if (peer && !port_push(a, round, scatter, d, p)) *failed = 1;
  }
  const bool more = k + 1 < rounds;
  const PortRound next = port_round(a, round0, k + 1, total);
  // send[next.slot] last held round k - 2, which every peer has received (each sent its
  // round k - 1, which it does only after my round k - 2 landed).
  if (more) port_stage(a, total, next, scatter);
  __syncthreads();
  if (peer && *failed == 0) {
    if (!wait_signal(a.channels[p].semaphore, d)) {
      port_report(a, d.failure(), p);
      *failed = 1;
    } else if (more && !port_push(a, next, scatter, d, p)) {
      *failed = 1;
    }
  }
  __syncthreads();
  return *failed == 0;
}

/// Allreduce (`scatter` false: every rank's whole input) and reduce-scatter (`scatter`
/// true: chunk r of every rank's input goes to rank r; `count` is one rank's output) share
/// one body: exchange each round, then reduce every rank's chunk in rank order (mine
/// straight from the input) into the output.
template <typename Fmt, typename Reducer>
OXCCL_DEVICE_OUTLINED void port_reduce_body(const Reducer reduce, const OxcclPortAllreduceArgs& a,
                                            uint64_t round0, bool scatter, const Deadline& d,
                                            int* failed) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t c = a.chunk_bytes;
  const char* mine = static_cast<const char*>(a.input) + (scatter ? me * total : 0);
  const uint64_t rounds = (total + port_step(a) - 1) / port_step(a);

  for (uint64_t k = 0; k < rounds; ++k) {
    const PortRound round = port_round(a, round0, k, total);
    const uint64_t base = round.base;
    const char* recv = round.recv;
    if (w > 1 && !port_exchange(a, total, round0, k, rounds, scatter, d, failed)) return;
    for (uint64_t u = threadIdx.x; u < round.units; u += blockDim.x) {
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
          in[r] = r == me ? allreduce::load_unit(mine, base + u * 16, total)
                          : allreduce::load16_peer(recv + r * c + u * 16);
        }
      }
      allreduce::store_unit(a.output, base + u * 16, allreduce::reduce_ranks(reduce, in, w), total);
    }
    // Every read of recv[slot] is done before a later round's exchange goes on.
    __syncthreads();
  }
  port_finish(a, round0, rounds);
}

/// All-gather: exchange each round, then copy every rank's chunk into its slot of the
/// output (slot r at byte r * total). In place (input == my slot) my own copy is skipped.
OXCCL_DEVICE_OUTLINED void port_gather_body(const OxcclPortAllreduceArgs& a, uint64_t round0,
                                            const Deadline& d, int* failed) {
  const uint64_t total = a.count * allreduce::dtype_bytes(a.dtype);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t c = a.chunk_bytes;
  char* output = static_cast<char*>(a.output);
  const bool in_place = a.input == output + me * total;
  const uint64_t rounds = (total + port_step(a) - 1) / port_step(a);

  for (uint64_t k = 0; k < rounds; ++k) {
    const PortRound round = port_round(a, round0, k, total);
    const uint64_t base = round.base;
    const uint64_t units = round.units;
    const char* recv = round.recv;
    if (w > 1 && !port_exchange(a, total, round0, k, rounds, false, d, failed)) return;
    for (uint64_t i = threadIdx.x; i < w * units; i += blockDim.x) {
      const uint64_t r = i / units;
      const uint64_t u = i - r * units;
      if (r == me && in_place) continue;
      const Vec16 v = r == me ? allreduce::load_unit(a.input, base + u * 16, total)
                              : allreduce::load16_peer(recv + r * c + u * 16);
      allreduce::store_unit(output + r * total, base + u * 16, v, total);
    }
    __syncthreads();
  }
  port_finish(a, round0, rounds);
}

OXCCL_DEVICE_INLINE bool port_args_ok(const OxcclPortAllreduceArgs& a) {
  return a.world_size >= 1 && a.world_size <= OXCCL_ALLREDUCE_MAX_RANKS &&
         a.rank < a.world_size && blockDim.x >= a.world_size && gridDim.x == 1 &&
         a.chunk_bytes != 0 && a.chunk_bytes % 16 == 0 && a.round_bytes % 16 == 0 &&
         a.round_bytes <= a.chunk_bytes && a.scratch != nullptr && a.rounds != nullptr &&
         (a.world_size == 1 || a.channels != nullptr) && a.dtype < OXCCL_DTYPE_COUNT &&
         a.op <= OXCCL_OP_AVG && a.accum <= OXCCL_ACCUM_F32;
}

/// The common entry: checks the block, reads the round counter, runs `body`.
template <typename Body>
OXCCL_DEVICE_INLINE void port_entry(const OxcclPortAllreduceArgs& args, Body body) {
  if (!port_args_ok(args)) {
    if (thread_index() == 0 && args.scratch != nullptr) {
      port_report(args, OXCCL_ALLREDUCE_ERR_ARGS, args.rank);
    }
    return;
  }
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  const uint64_t round0 = atomic_load_relaxed(args.rounds);
  __syncthreads();
  const Deadline d{args.timeout_ns, args.abort_flag};
  body(round0, d, &failed);
}

/// Allreduce and reduce-scatter: one instantiation per format and reducer serves both.
OXCCL_DEVICE_INLINE void port_reduce_entry(const OxcclPortAllreduceArgs& args, bool scatter) {
  port_entry(args, [&](uint64_t round0, const Deadline& d, int* failed) OXCCL_INLINE_LAMBDA {
    // dispatch_all reads only dtype, op and accum of its block.
    OxcclAllreduceArgs types{};
    types.dtype = args.dtype;
    types.op = args.op;
    types.accum = args.accum;
    allreduce::dispatch_all(types, [&]<typename Fmt>(auto reducer) OXCCL_INLINE_LAMBDA {
      port_reduce_body<Fmt>(reducer, args, round0, scatter, d, failed);
    });
  });
}

}  // namespace port_allreduce
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_port(const OXCCL_GRID_CONSTANT OxcclPortAllreduceArgs param) {
  oxccl::port_allreduce::port_reduce_entry(oxccl::kernel_args(param), false);
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void reducescatter_port(const OXCCL_GRID_CONSTANT OxcclPortAllreduceArgs param) {
  oxccl::port_allreduce::port_reduce_entry(oxccl::kernel_args(param), true);
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allgather_port(const OXCCL_GRID_CONSTANT OxcclPortAllreduceArgs param) {
  const OxcclPortAllreduceArgs& args = oxccl::kernel_args(param);
  using oxccl::port_allreduce::Deadline;
  oxccl::port_allreduce::port_entry(args, [&](uint64_t round0, const Deadline& d, int* failed) OXCCL_INLINE_LAMBDA {
    oxccl::port_allreduce::port_gather_body(args, round0, d, failed);
  });
}
