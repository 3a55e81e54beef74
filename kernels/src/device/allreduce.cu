// Allreduce kernels: one-shot all-pairs LL16 packets (small sizes), two-shot
// reduce-scatter + all-gather through staging buffers with per-block barriers, and the
// zero-copy two-shot on registered buffers (peer loads of inputs, peer stores of outputs).
// Argument block and scratch layout: include/oxccl/abi_allreduce.h. Host stand-ins with
// the same protocol: collectives/src/host_kernels.rs.
//
// Every rank reduces in rank order (r = 0, 1, ...), so every rank's result is bit-identical
// and equal to the host reference (kernels/src/reduce.rs).

#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"
#include "oxccl/reducers.hpp"

namespace oxccl {
namespace allreduce {

// ---- one-shot ----------------------------------------------------------------------------

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void oneshot_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t first = thread_index();
  const uint64_t stride = thread_count();
  // The first unit's load and the epoch read go out together: the packets need both.
  Vec16 v = first < units ? load_unit(a.input, first * 16, total) : Vec16{{0, 0, 0, 0}};
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = units * 32;  // two LL16 packets per 16-byte unit

  // Write: my input as packets into slot `me` of every peer's current half.
  for (uint64_t u = first; u < units; u += stride) {
    if (u != first) v = load_unit(a.input, u * 16, total);
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t p = (me + k) % w;
      OxcclLL16Packet* dst = reinterpret_cast<OxcclLL16Packet*>(
                                 static_cast<char*>(a.scratch[p]) + half + me * slot_bytes) +
                             2 * u;
      ll16_write(dst, v.w[0], v.w[1], flag);
      ll16_write(dst + 1, v.w[2], v.w[3], flag);
    }
  }
  call.count_block(epoch);

  // Read and reduce: every rank's unit, in rank order, from my own scratch.
  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  const uint32_t all_peers = ll16_peer_bits(w, me);
  for (uint64_t u = first; u < units; u += stride) {
    const Vec16 own_unit = load_unit(a.input, u * 16, total);
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) in[r] = own_unit;  // peers' replaced below
    if (!ll16_read_peers(mine, u, slot_bytes, flag, all_peers, in, call)) return;
    store_unit(a.output, u * 16, reduce_ranks(reduce, in, w), total);
  }
}

// ---- one-shot LL128 -----------------------------------------------------------------------
// The one-shot with 128-byte lines instead of 16-byte packets: 8 lanes of a warp store one
// line in one instruction, lanes 0-6 seven 16-byte units of the message and lane 7 the
// call's flag in all four words. NVLink delivers a warp's 16-byte stores to one aligned
// 128-byte line as one write, and a warp's loads of one line read one snapshot, so a line
// whose flag lane matches holds that call's data (the property NCCL's LL128 relies on, on
// NVLink GPUs). 112 of every 128 bytes carry data (LL16: 64 of 128). Lines live in their
// own region (packet_offset/packet_half_bytes of the launch point at it), so no LL16
// reader ever sees user data where it expects a flag.
#if defined(OXCCL_DEVICE_CUDA)
constexpr uint32_t kLl128Units = 7;  // data units per line

// kTwoRanks: a path of its own for two ranks (below). Only the typed kernels take it: in
// the generic kernel, 18 more copies of it pushed the registers past 128 into a 144-byte stack.
template <typename Fmt, bool kTwoRanks = false, typename Reducer>
OXCCL_DEVICE_INLINE void oneshot_ll128_body(const Reducer reduce, const OxcclAllreduceArgs& a,
                                                const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint64_t lines = (units + kLl128Units - 1) / kLl128Units;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t t = lane & 7;            // position in the line; 7 = the flag
  const uint64_t warp = thread_index() / 32;
  const uint64_t warps = thread_count() / 32;
  // This lane's unit of the line at `first + lane / 8` (zeros past the end; none for lane 7).
  const auto unit_of = [&](uint64_t first) OXCCL_INLINE_LAMBDA {
    const uint64_t line = first + lane / 8;
    return line < lines && t < kLl128Units ? load_unit(a.input, (line * kLl128Units + t) * 16, total)
                                           : Vec16{{0, 0, 0, 0}};
  };
  // The first round's load and the epoch read go out together: the lines need both.
  Vec16 data = unit_of(warp * 4);
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = a.packet_offset + (epoch & 1) * a.packet_half_bytes;
  const uint64_t slot_bytes = lines * 128;
  const Vec16 flags{{flag, flag, flag, flag}};

  // Write: my lines into slot `me` of every peer's current half. The loop is uniform per
  // warp and __syncwarp precedes every store, so the 8 lanes of a line store together.
  for (uint64_t first = warp * 4; first < lines; first += warps * 4) {
    const uint64_t line = first + lane / 8;
    const bool active = line < lines;
    if (first != warp * 4) data = unit_of(first);
    const Vec16 v = t < kLl128Units ? data : flags;
    __syncwarp();
    if (active) {
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        store16_volatile(static_cast<char*>(a.scratch[p]) + half + me * slot_bytes + line * 128 + t * 16, v);
      }
    }
  }
  call.count_block(epoch);

  const char* mine = static_cast<const char*>(a.scratch[me]) + half;
  // Two ranks: poll the one peer's line, then add the two units in rank order. The gather
  // below (every pending peer's line into 8-rank arrays under a mask) took about 0.3 us
  // more per call at 1-64 KB on 2 H200s (ci/gpu/probe, "mirror ... one-peer").
  if constexpr (kTwoRanks) {
    if (w == 2) {
      const uint32_t peer = me ^ 1u;
      for (uint64_t first = warp * 4; first < lines; first += warps * 4) {
        const uint64_t line = first + lane / 8;
        const bool active = line < lines;
        const uint64_t u = line * kLl128Units + t;
        const Vec16 own_unit = load_unit(a.input, u * 16, total);
        const char* src = mine + peer * slot_bytes + line * 128 + t * 16;
        Vec16 got = own_unit;
        uint64_t since = 0;
        for (uint64_t polls = 0;; ++polls) {
          __syncwarp();
          const Vec16 raw = active ? load16_volatile(src) : flags;
          const bool line_ok = raw.w[0] == flag && raw.w[1] == flag && raw.w[2] == flag && raw.w[3] == flag;
          const bool ok = __shfl_sync(0xffffffffu, static_cast<int>(line_ok), lane | 7) != 0;
          if (ok) got = raw;
          if (__all_sync(0xffffffffu, ok)) break;
          if (__any_sync(0xffffffffu, !ok && call.deadline.expired(polls, since))) {
            if (!ok) report(a.scratch[me], a.abort_flag, call.deadline.failure(), peer);
            return;
          }
        }
        if (active && t < kLl128Units) {
          typename Reducer::State s = reduce.first(me == 0 ? own_unit : got);
          reduce.add(s, me == 0 ? got : own_unit);
          store_unit(a.output, u * 16, reduce.finish(s, 2), total);
        }
      }
      return;
    }
  }

  // Read: every peer's line from my own half, all pending peers' lines read before any is
  // checked; lane 7 checks the flag and the 8 lanes of the line take its answer.
  uint32_t all_peers = 0;
  for (uint32_t r = 0; r < w; ++r) {
    if (r != me) all_peers |= 1u << r;
  }
  for (uint64_t first = warp * 4; first < lines; first += warps * 4) {
    const uint64_t line = first + lane / 8;
    const bool active = line < lines;
    const uint64_t u = line * kLl128Units + t;
    const Vec16 own_unit = load_unit(a.input, u * 16, total);
    Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) in[r] = own_unit;  // peers' replaced below
    uint32_t pending = active ? all_peers : 0;
    uint64_t since = 0;
    for (uint64_t polls = 0;; ++polls) {
      __syncwarp();
      Vec16 raw[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (pending >> r & 1) raw[r] = load16_volatile(mine + r * slot_bytes + line * 128 + t * 16);
      }
      uint32_t ok = 0;
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if ((pending >> r & 1) && raw[r].w[0] == flag && raw[r].w[1] == flag && raw[r].w[2] == flag &&
            raw[r].w[3] == flag) {
          ok |= 1u << r;
        }
      }
      ok = __shfl_sync(0xffffffffu, ok, lane | 7);
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (ok >> r & 1) in[r] = raw[r];
      }
      pending &= ~ok;
      if (__all_sync(0xffffffffu, pending == 0)) break;
      if (__any_sync(0xffffffffu, pending != 0 && call.deadline.expired(polls, since))) {
        if (pending != 0) {
          report(a.scratch[me], a.abort_flag, call.deadline.failure(), static_cast<uint32_t>(__ffs(pending) - 1));
        }
        return;
      }
    }
    if (active && t < kLl128Units) store_unit(a.output, u * 16, reduce_ranks(reduce, in, w), total);
  }
}
#endif

// ---- two-shot ----------------------------------------------------------------------------

/// Rounds of the staging kernels. A message that fits the staging takes one round whose
/// slots are exactly its chunks (every block gets a share). A larger one is cut into equal
/// rounds, and every round, also the shorter last one, uses the same geometry: `world`
/// slots of `cap` units, each thread always owning the same units of every slot (a grid
/// stride, see `SlotRounds`), so a block only touches the staging positions that the same
/// block of every peer touches, and the per-block barriers order all reuse of staging
/// across rounds (a peer's other blocks may still be a phase behind; they never touch
/// these positions).
struct Rounds {
  uint64_t cap;         // units per slot (per rank's chunk) of a full round
  uint64_t round_bytes; // message bytes per full round = w * cap * 16
  uint64_t first, step;  // this thread's units of a slot: first, first + step, ...
  OXCCL_DEVICE_INLINE Rounds(const OxcclAllreduceArgs& a, uint64_t total) {
    const uint64_t w = a.world_size;
    const uint64_t units = (total + 15) / 16;
    const uint64_t cap_max = a.data_bytes / (16 * w);
    const uint64_t rounds = (units + w * cap_max - 1) / (w * cap_max);
    cap = (units + rounds * w - 1) / (rounds * w);
    round_bytes = cap * 16 * w;
    first = spread_index();
    step = thread_count();
  }
};

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void twoshot_body(const Reducer reduce, const OxcclAllreduceArgs& a, const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  char* own = static_cast<char*>(a.scratch[me]);
  const uint64_t in_off = a.data_offset;
  const uint64_t out_off = a.data_offset + a.data_bytes;
  const Rounds g(a, total);

  for (uint64_t base = 0; base < total; base += g.round_bytes) {
    const uint64_t bytes = total - base < g.round_bytes ? total - base : g.round_bytes;
    const uint64_t units = (bytes + 15) / 16;
    const uint64_t chunk = (units + w - 1) / w;  // units of each rank's chunk this round

    // 1. Stage the chunks the peers will reduce (my own chunk is read from the input).
    for (uint32_t c = 0; c < w; ++c) {
      if (c == me) continue;
      for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
        const uint64_t u = c * chunk + j;
        if (u >= units) break;
        store16(own + in_off + (c * g.cap + j) * 16, load_unit(a.input, base + u * 16, total));
      }
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. Reduce my chunk from every rank's staging, in rank order.
    for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
      const uint64_t u = me * chunk + j;
      if (u >= units) break;
      const uint64_t pos = (me * g.cap + j) * 16;
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
          in[r] = r == me ? load_unit(a.input, base + u * 16, total)
                          : load16_peer(static_cast<const char*>(a.scratch[r]) + in_off + pos);
        }
      }
      const Vec16 v = reduce_ranks(reduce, in, w);
      store16(own + out_off + pos, v);
      store_unit(a.output, base + u * 16, v, total);
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 3. Gather the peers' reduced chunks.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t c = (me + k) % w;
      const char* peer = static_cast<const char*>(a.scratch[c]) + out_off;
      for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
        const uint64_t u = c * chunk + j;
        if (u >= units) break;
        store_unit(a.output, base + u * 16, load16_peer(peer + (c * g.cap + j) * 16), total);
      }
    }
  }
}

// ---- push two-shot -----------------------------------------------------------------------

/// Two-shot where every NVLink transfer is a peer store (no peer loads): push my input's
/// chunk c into slot `me` of rank c's "in" staging; barrier; reduce my chunk from my own
/// staging (local loads) and store it into every peer's output (registered: direct) or
/// "out" staging; barrier; without registration, copy the peers' chunks from my "out"
/// staging into my output (local).
template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void twoshot_push_body(const Reducer reduce, const OxcclAllreduceArgs& a,
                                               const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  char* own = static_cast<char*>(a.scratch[me]);
  const uint64_t in_off = a.data_offset;
  const uint64_t out_off = a.data_offset + a.data_bytes;
  const bool direct = a.peer_output[me] == a.output && a.output != nullptr;
  const Rounds g(a, total);

  for (uint64_t base = 0; base < total; base += g.round_bytes) {
    const uint64_t bytes = total - base < g.round_bytes ? total - base : g.round_bytes;
    const uint64_t units = (bytes + 15) / 16;
    const uint64_t chunk = (units + w - 1) / w;

    // 1. Push: chunk c of my input into slot `me` of rank c's "in" staging.
    for (uint32_t k = 1; k < w; ++k) {
      const uint32_t c = me + k < w ? me + k : me + k - w;
      char* dst = static_cast<char*>(a.scratch[c]) + in_off + me * g.cap * 16;
      for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
        const uint64_t u = c * chunk + j;
        if (u >= units) break;
        store16(dst + j * 16, load_unit(a.input, base + u * 16, total));
      }
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 2. Reduce my chunk (rank order) from my input and my staging; store it everywhere.
    for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
      const uint64_t u = me * chunk + j;
      if (u >= units) break;
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
        if (r < w) {
          in[r] = r == me ? load_unit(a.input, base + u * 16, total)
                          : load16_peer(own + in_off + (r * g.cap + j) * 16);  // written by r
        }
      }
      const Vec16 v = reduce_ranks(reduce, in, w);
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        if (direct) {
          store_unit(a.peer_output[p], base + u * 16, v, total);
        } else {
          store16(static_cast<char*>(a.scratch[p]) + out_off + (me * g.cap + j) * 16, v);
        }
      }
      store_unit(a.output, base + u * 16, v, total);
    }
    if (!block_barrier(a, call.deadline, call.failed)) return;

    // 3. Without registered outputs: the peers' chunks from my "out" staging.
    if (!direct) {
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t c = me + k < w ? me + k : me + k - w;
        for (uint64_t j = g.first; j < g.cap && j < chunk; j += g.step) {
          const uint64_t u = c * chunk + j;
          if (u >= units) break;
          store_unit(a.output, base + u * 16, load16_peer(own + out_off + (c * g.cap + j) * 16), total);
        }
      }
    }
  }
}

// ---- zero-copy two-shot -----------------------------------------------------------------

/// 16-byte units each thread loads per rank per pass; every rank's loads of a pass are
/// issued before the first is used (world_size x kZcUnits peer loads in flight). CUDA: 2
/// (16 loads, 64 registers). HIP: 1, so the loads in flight take 32 of a gfx942 wave's 128
/// VGPRs; with 2 the fp8 bodies spilled (1088 bytes of scratch, see platform.hpp).
#if defined(OXCCL_DEVICE_CUDA)
constexpr int kZcUnits = 2;
#else
constexpr int kZcUnits = 1;
#endif

/// Unit `j` of a rank's input: one L2-only 16-byte load when whole (the input is 16-byte
/// aligned, checked by the host), else the bytes inside the buffer and zeros.
OXCCL_DEVICE_INLINE Vec16 zc_load(const void* base, uint64_t j, uint64_t total) {
  if (j * 16 + 16 <= total) return load16_peer(static_cast<const char*>(base) + j * 16);
  return load_unit(base, j * 16, total);
}

template <typename Fmt, typename Reducer>
OXCCL_DEVICE_INLINE void twoshot_zc_body(const Reducer reduce, const OxcclAllreduceArgs& a,
                                             const CallState call) {
  const uint64_t total = a.count * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint32_t w = a.world_size;
  const uint32_t me = a.rank;
  const uint64_t chunk = (units + w - 1) / w;
  const uint64_t start = me * chunk;
  const uint64_t end = start + chunk < units ? start + chunk : units;
  const uint64_t spread = thread_count();  // a grid stride (see `SlotRounds`)

  // Every peer's call has started: its input is ready and its output free to write.
  if (!start_barrier(a, call.deadline, call.failed)) return;

  const uint64_t step = spread * kZcUnits;
  for (uint64_t j0 = start + spread_index(); j0 < end; j0 += step) {
    Vec16 v[kZcUnits][OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
    for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
      if (r < w) {
#pragma unroll
        for (int k = 0; k < kZcUnits; ++k) {
          const uint64_t j = j0 + static_cast<uint64_t>(k) * spread;
          v[k][r] = j < end ? zc_load(a.peer_input[r], j, total) : Vec16{{0, 0, 0, 0}};
        }
      }
    }
    // No `break` in this loop (j only grows with k): clang does not unroll a loop that
    // leaves early, and v then went to scratch on gfx942.
#pragma unroll
    for (int k = 0; k < kZcUnits; ++k) {
      const uint64_t j = j0 + static_cast<uint64_t>(k) * spread;
      if (j < end) {
        const Vec16 out = reduce_ranks(reduce, v[k], w);
        // Peers first (remote stores take longest), my own output last.
        for (uint32_t q = 1; q < w; ++q) {
          const uint32_t p = me + q < w ? me + q : me + q - w;
          store_unit(a.peer_output[p], j * 16, out, total);
        }
        store_unit(a.output, j * 16, out, total);
      }
    }
  }

  // Every peer stored its chunk into my output (and finished reading my input).
  block_barrier(a, call.deadline, call.failed);
}

}  // namespace allreduce
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_oneshot_ll(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_reducing<true>(args, true, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    oneshot_body<Fmt>(reducer, args, call);
  });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_oneshot_ll128(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
#if defined(OXCCL_DEVICE_CUDA)
  run_reducing<true>(args, blockDim.x % 32 == 0, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    oneshot_ll128_body<Fmt>(reducer, args, call);
  });
#else
  // The 128-byte line atomicity LL128 needs is an NVLink property; on this architecture
  // the host refuses the algorithm before launching, and a launch anyway is an error.
  if (oxccl::thread_index() == 0) report(own_scratch(args), args.abort_flag, OXCCL_ALLREDUCE_ERR_ARGS, args.rank);
#endif
}

// The LL128 one-shot for one element type with the sum and one accumulation: no dispatch
// over the 18 reducers, whose inlined bodies make the generic kernel about 100,000 SASS
// instructions (0.24-0.27 us less per call at 1-64 KB on 2 H200s; ci/gpu/probe, "typed"),
// and with the two-rank read loop (`kTwoRanks`: another 0.25-0.3 us).
// The host launches one for the calls it matches (collectives one_shot_ll128.rs, `TYPED`);
// any other call's arguments are refused here as a bad argument block.
namespace oxccl {
namespace allreduce {
template <typename Fmt, Acc kAcc>
OXCCL_DEVICE_INLINE void oneshot_ll128_typed(const OxcclAllreduceArgs& args) {
#if defined(OXCCL_DEVICE_CUDA)
  const bool typed = args.dtype == Fmt::kCode && args.op == OXCCL_OP_SUM && resolve_accum<Fmt>(args.accum) == kAcc;
  run_call<true>(args, typed && blockDim.x % 32 == 0, [&](const CallState call) OXCCL_INLINE_LAMBDA {
    oneshot_ll128_body<Fmt, true>(StaticReducer<Fmt, kAcc, OXCCL_OP_SUM>{}, args, call);
  });
#else
  if (thread_index() == 0) report(own_scratch(args), args.abort_flag, OXCCL_ALLREDUCE_ERR_ARGS, args.rank);
#endif
}
}  // namespace allreduce
}  // namespace oxccl

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_oneshot_ll128_bf16_sum(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  oxccl::allreduce::oneshot_ll128_typed<oxccl::Bf16, oxccl::Acc::Element>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_oneshot_ll128_f16_sum(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  oxccl::allreduce::oneshot_ll128_typed<oxccl::F16, oxccl::Acc::F16>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_oneshot_ll128_f32_sum(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  oxccl::allreduce::oneshot_ll128_typed<oxccl::F32, oxccl::Acc::F32>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_twoshot(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_reducing<false>(args, true, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    twoshot_body<Fmt>(reducer, args, call);
  });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_twoshot_zc(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const bool registered = args.rank < OXCCL_ALLREDUCE_MAX_RANKS && args.peer_input[args.rank] == args.input &&
                          args.peer_output[args.rank] == args.output;
  run_reducing<false>(args, registered, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    twoshot_zc_body<Fmt>(reducer, args, call);
  });
}

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void allreduce_twoshot_push(const OXCCL_GRID_CONSTANT OxcclAllreduceArgs param) {
  const OxcclAllreduceArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  run_reducing<false>(args, true, [&]<typename Fmt>(auto reducer, const CallState call) OXCCL_INLINE_LAMBDA {
    twoshot_push_body<Fmt>(reducer, args, call);
  });
}
