// Where the time of a small allreduce goes on two GPUs of one host: one process drives
// both GPUs (peer access over NVLink), every case is a CUDA graph of N kernel launches per
// GPU replayed on both at once, and the time per call is the graph's time over N. The
// cases take stages away from the real one-shot (allreduce_oneshot_ll128, included from
// kernels/src/device/allreduce.cu and launched with the argument block the collectives
// crate builds) so that differences place the time:
//
//   empty        wait for the previous kernel, let the next one launch, advance the epoch
//   copy         empty + one 16-byte load of the input and store to the output per thread
//   ping         empty + one thread stores a flag into the peer and polls for the peer's
//   ll128        a minimal bf16-sum LL128 one-shot (no dispatch, no deadline, no calls)
//   ll128-2poll  the same, with two loads in flight per poll, staggered by half a trip
//   ll128-fuseK  K calls of ll128 in one kernel: the trip without the kernel boundary
//   real         allreduce_oneshot_ll128 as oxccl launches it
//   typed        allreduce_oneshot_ll128_bf16_sum, the same body for bf16 sum only (no
//                dispatch over the 18 reducers): real - typed is what the dispatch costs
//   mirror       typed written out here, with parts of it taken away one at a time
//                (Strip): typed - ll128, placed part by part
//   barrier      empty + N cross-GPU barriers of block 0 (block_barrier's protocol: a
//                release add into the peer's inbound word, then polls of this GPU's own),
//                variants: "sc" = block_barrier until 2026-11-27 (fence.sc.sys before the
//                release add), "rel" = without the fence (block_barrier since), "relaxed" =
//                relaxed add and polls (start_barrier since: orders no data)
//   bcast-*      the real broadcast_barrier (one barrier) and broadcast_direct (two
//                barriers around the root's stores) kernels, as oxccl launches them
//
// Each case runs with programmatic dependent launch (early launch) unless named "-plain".
// Every case that moves data is checked bit for bit against the host's sum of the two
// random inputs (output poisoned first). Build and run (ci/gpu/session.sh probe does it):
//
//     nvcc -std=c++20 -O3 -arch=sm_90 -Ikernels/include ci/gpu/probe/latency_probe.cu -o probe
//     ./probe [calls per graph] [repetitions]
#include "../../../kernels/src/device/allreduce.cu"
#include "../../../kernels/src/device/broadcast.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "probe_common.cuh"

namespace probe {

using oxccl::Vec16;

// Scratch layout shared with the real kernel (abi_allreduce.h): sync words at 0, lines at
// kLineOffset in two parity halves, staging after them (unused by the one-shots).
constexpr uint64_t kLineOffset = 65536;
constexpr uint64_t kHalfBytes = 262144;
constexpr uint64_t kDataOffset = kLineOffset + 2 * kHalfBytes;
constexpr uint64_t kDataBytes = 65536;
constexpr uint64_t kScratchBytes = kDataOffset + 2 * kDataBytes;
constexpr uint64_t kPingOffset = 64;  // a sync-area word the real kernel does not use
constexpr uint64_t kMaxBytes = 65536;

struct Args {
  const void* input;
  void* output;
  char* own;   // this GPU's scratch
  char* peer;  // the other GPU's scratch, mapped here
  uint64_t bytes;
  uint32_t rank;
  uint32_t fuse;     // calls per kernel (ll128 only)
  uint32_t stagger;  // cycles between the two poll loads (ll128-2poll)
  uint32_t world;    // 2; a run-time value for the generic reducer (kArrays)
};

__device__ __forceinline__ uint64_t* word(char* s, uint64_t off) {
  return reinterpret_cast<uint64_t*>(s + off);
}

__global__ void __launch_bounds__(512, 1) empty_kernel(const __grid_constant__ Args a) {
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  if (blockIdx.x == 0 && threadIdx.x == 0) oxccl::atomic_add_relaxed_device(word(a.own, 0), 1);
}

__global__ void __launch_bounds__(512, 1) copy_kernel(const __grid_constant__ Args a) {
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  const uint64_t units = a.bytes / 16;
  for (uint64_t u = oxccl::thread_index(); u < units; u += oxccl::thread_count()) {
    oxccl::store16(static_cast<char*>(a.output) + u * 16, oxccl::load16(static_cast<const char*>(a.input) + u * 16));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) oxccl::atomic_add_relaxed_device(word(a.own, 0), 1);
}

__global__ void __launch_bounds__(512, 1) ping_kernel(const __grid_constant__ Args a) {
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const uint64_t want = oxccl::atomic_load_relaxed(word(a.own, 0)) + 1;
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(word(a.peer, kPingOffset)), "l"(want) : "memory");
  while (oxccl::atomic_load_relaxed(word(a.own, kPingOffset)) < want) {
  }
  oxccl::atomic_add_relaxed_device(word(a.own, 0), 1);
}

// Barrier variants (Args::fuse = barriers per kernel).
enum BarrierVariant : uint32_t { kBarrierSc = 0, kBarrierRelease = 1, kBarrierRelaxed = 2 };

template <uint32_t kVariant>
__global__ void __launch_bounds__(512, 1) barrier_kernel(const __grid_constant__ Args a) {
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  for (uint32_t i = 0; i < a.fuse; ++i) {
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t* inbound = word(a.own, OXCCL_ALLREDUCE_SYNC_INBOUND);
      uint64_t* expected = word(a.own, OXCCL_ALLREDUCE_SYNC_EXPECTED);
      uint64_t* peer_inbound = word(a.peer, OXCCL_ALLREDUCE_SYNC_INBOUND);
      if constexpr (kVariant == kBarrierSc) {
        oxccl::fence_system();
        oxccl::atomic_add_release(peer_inbound, 1);
      } else if constexpr (kVariant == kBarrierRelease) {
        oxccl::atomic_add_release(peer_inbound, 1);
      } else {
        asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(peer_inbound), "l"(1ull) : "memory");
      }
      const uint64_t want = *expected + 1;
      if constexpr (kVariant == kBarrierRelaxed) {
        while (oxccl::atomic_load_relaxed(inbound) < want) {
        }
      } else {
        while (oxccl::atomic_load_acquire(inbound) < want) {
        }
      }
      *expected = want;
    }
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) oxccl::atomic_add_relaxed_device(word(a.own, 0), 1);
}

__device__ __forceinline__ bool line_ok(const Vec16& v, uint32_t flag) {
  return v.w[0] == flag && v.w[1] == flag && v.w[2] == flag && v.w[3] == flag;
}

// bf16 sum of two ranks, rank order, f32 accumulation (one rounding: the same bits as
// every accumulation type for two ranks).
__device__ __forceinline__ Vec16 sum2(const Vec16& x, const Vec16& y, bool mine_first) {
  const Vec16& a = mine_first ? x : y;
  const Vec16& b = mine_first ? y : x;
  const Vec16 in[2] = {a, b};
  return oxccl::reduce16<oxccl::Bf16, oxccl::Acc::F32, OXCCL_OP_SUM>([&](uint32_t k) { return in[k]; }, 2);
}

// The bound of a wait as oxccl's kernels kept it before the probe's first run: the clock
// read by every thread at the start, checked every 256 polls.
struct StartDeadline {
  uint64_t start;
  uint64_t limit_ns;
  __device__ __forceinline__ bool expired(uint64_t polls) const {
    if (limit_ns == 0 || (polls & 255) != 255) return false;
    return oxccl::allreduce::now_ns() - start > limit_ns;
  }
};

// Stages of the real kernel (as it was before the probe's first run) that the minimal
// one-shot can take on, one at a time.
enum Extra : uint32_t {
  kPlain = 0,
  kTwoPolls = 1,  // two loads in flight per poll, `stagger` cycles apart
  kDeadline = 2,  // every thread reads the clock at the start and checks it while polling
  kNoinline = 4,  // the body is a call that takes the argument block by reference
  kArrays = 8,    // the real read loop: per-rank arrays indexed by rank, reducer over n
  kShared = 16,   // a __shared__ failure flag, as the real kernel keeps
  kReleaseCount = 32,  // blocks count themselves with a release add (waits for NVLink acks)
};

// Returns the epoch it read.
template <uint32_t kExtra>
__device__ __forceinline__ uint64_t ll128_body(const Args& a, const StartDeadline d) {
  const uint64_t units = a.bytes / 16;
  const uint64_t lines = (units + 6) / 7;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t t = lane & 7;
  const uint64_t warp = oxccl::thread_index() / 32;
  const uint64_t warps = oxccl::thread_count() / 32;
  const uint64_t slot = lines * 128;
  const uint64_t line0 = warp * 4 + lane / 8;
  const auto unit_at = [&](uint64_t line) {
    const uint64_t u = line * 7 + t;
    return line < lines && t < 7 && u < units ? oxccl::load16(static_cast<const char*>(a.input) + u * 16)
                                              : Vec16{{0, 0, 0, 0}};
  };
  const Vec16 first = unit_at(line0);
  const uint64_t epoch0 = oxccl::atomic_load_relaxed(word(a.own, 0));
  for (uint32_t call = 0; call < a.fuse; ++call) {
    const uint64_t epoch = epoch0 + call;
    const uint32_t flag = static_cast<uint32_t>(epoch % 0xffffffffull) + 1u;
    const Vec16 flags{{flag, flag, flag, flag}};
    const uint64_t half = kLineOffset + (epoch & 1) * kHalfBytes;
    // Write my lines into slot `rank` of the peer's half.
    for (uint64_t f = warp * 4; f < lines; f += warps * 4) {
      const uint64_t line = f + lane / 8;
      const Vec16 data = (f == warp * 4 && call == 0) ? first : unit_at(line);
      const Vec16 v = t < 7 ? data : flags;
      __syncwarp();
      if (line < lines) oxccl::store16_volatile(a.peer + half + a.rank * slot + line * 128 + t * 16, v);
    }
    // Read the peer's lines from my half and reduce.
    const uint32_t other = a.rank ^ 1;
    for (uint64_t f = warp * 4; f < lines; f += warps * 4) {
      const uint64_t line = f + lane / 8;
      const bool active = line < lines;
      const uint64_t u = line * 7 + t;
      const Vec16 mine = unit_at(line);
      const char* src = a.own + half + other * slot + line * 128 + t * 16;
      Vec16 out;
      if constexpr ((kExtra & kArrays) != 0) {
        Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
        in[a.rank] = mine;
        uint32_t pending = active ? 1u << other : 0;
        for (uint64_t polls = 0;; ++polls) {
          __syncwarp();
          Vec16 raw[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
          for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
            if (pending >> r & 1) raw[r] = oxccl::load16_volatile(a.own + half + r * slot + line * 128 + t * 16);
          }
          uint32_t ok = 0;
#pragma unroll
          for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
            if ((pending >> r & 1) && line_ok(raw[r], flag)) ok |= 1u << r;
          }
          ok = __shfl_sync(0xffffffffu, ok, lane | 7);
#pragma unroll
          for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
            if (ok >> r & 1) in[r] = raw[r];
          }
          pending &= ~ok;
          if (__all_sync(0xffffffffu, pending == 0)) break;
          if (__any_sync(0xffffffffu, pending != 0 && d.expired(polls))) return epoch0;
        }
        out = oxccl::reduce16<oxccl::Bf16, oxccl::Acc::F32, OXCCL_OP_SUM>([&](uint32_t k) { return in[k]; }, a.world);
      } else {
        Vec16 got{{0, 0, 0, 0}};
        if constexpr ((kExtra & kTwoPolls) != 0) {
          Vec16 r0 = active ? oxccl::load16_volatile(src) : flags;
          const long long t0 = clock64();
          while (clock64() - t0 < a.stagger) {
          }
          for (;;) {
            const Vec16 r1 = active ? oxccl::load16_volatile(src) : flags;
            const int ok0 = __shfl_sync(0xffffffffu, static_cast<int>(line_ok(r0, flag)), lane | 7);
            if (ok0) got = r0;
            if (__all_sync(0xffffffffu, ok0)) break;
            r0 = active ? oxccl::load16_volatile(src) : flags;
            const int ok1 = __shfl_sync(0xffffffffu, static_cast<int>(line_ok(r1, flag)), lane | 7);
            if (ok1) got = r1;
            if (__all_sync(0xffffffffu, ok1)) break;
          }
        } else {
          for (uint64_t polls = 0;; ++polls) {
            __syncwarp();
            const Vec16 r = active ? oxccl::load16_volatile(src) : flags;
            const int ok = __shfl_sync(0xffffffffu, static_cast<int>(line_ok(r, flag)), lane | 7);
            if (ok) got = r;
            if (__all_sync(0xffffffffu, ok)) break;
            if constexpr ((kExtra & kDeadline) != 0) {
              if (__any_sync(0xffffffffu, !ok && d.expired(polls))) return epoch0;
            }
          }
        }
        out = sum2(mine, got, a.rank == 0);
      }
      if (active && t < 7 && u < units) oxccl::store16(static_cast<char*>(a.output) + u * 16, out);
    }
  }
  return epoch0;
}

template <uint32_t kExtra>
__device__ __noinline__ uint64_t ll128_body_call(const Args& a, const StartDeadline d) {
  return ll128_body<kExtra>(a, d);
}

template <uint32_t kExtra>
__global__ void __launch_bounds__(512, 1) ll128_kernel(const __grid_constant__ Args a) {
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  __shared__ int failed;
  if constexpr ((kExtra & kShared) != 0) {
    if (threadIdx.x == 0) failed = 0;
  }
  StartDeadline d{0, 0};
  if constexpr ((kExtra & kDeadline) != 0) d = StartDeadline{oxccl::allreduce::now_ns(), 10'000'000'000ull};
  uint64_t epoch;
  if constexpr ((kExtra & kNoinline) != 0) {
    epoch = ll128_body_call<kExtra>(a, d);
  } else {
    epoch = ll128_body<kExtra>(a, d);
  }
  // Every block has read the epoch before block 0 advances it (the barrier's predicate
  // waits for each thread's read).
  (void)__syncthreads_or(epoch == ~0ull);
  if (gridDim.x > 1) {
    if (threadIdx.x == 0) {
      if constexpr ((kExtra & kReleaseCount) != 0) {
        oxccl::atomic_add_release_device(word(a.own, 8), 1);
      } else {
        oxccl::atomic_add_relaxed_device(word(a.own, 8), 1);
      }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      while (oxccl::atomic_load_acquire(word(a.own, 8)) < gridDim.x) {
      }
      oxccl::atomic_store_relaxed(word(a.own, 8), 0);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t add = a.fuse;
    if constexpr ((kExtra & kShared) != 0) add += static_cast<uint64_t>(failed);
    oxccl::atomic_add_relaxed_device(word(a.own, 0), add);
  }
}


// ---- mirror: the typed one-shot, rebuilt here so that its parts can be taken away ---------
// mirror_body is allreduce_oneshot_ll128_bf16_sum (run_call + oneshot_ll128_body for bf16
// sum) written out; with no Strip bit it must time as "typed". Each bit takes one part of
// it away (every variant stays correct for 2 ranks and the probe's whole-unit sizes), so
// typed - minimal (the "ll128" case) is placed part by part.
enum Strip : uint32_t {
  kWorldTwo = 1,     // the world size a compile-time 2: the loops over 8 ranks fold away
  kNoBound = 2,      // polls without the wait bound (no deadline, abort or failure checks)
  kNoPrologue = 4,   // no argument-block check and no __shared__ failure flag
  kCountLast = 8,    // the block's epoch barrier after the reads, where "ll128" has it
  kWholeUnits = 16,  // plain 16-byte loads and stores, no tail path for partial units
  kSmallArgs = 32,   // the probe's 56-byte argument block instead of the 288-byte real one
  kOnePeer = 64,     // (2 ranks only) poll the one peer's line and add two units, as "ll128"
                     // does, instead of the gather into 8-rank arrays under a pending mask
};

// The argument block's fields through one interface: the real block, or the probe's.
__device__ __forceinline__ const void* in_of(const OxcclAllreduceArgs& a) { return a.input; }
__device__ __forceinline__ void* out_of(const OxcclAllreduceArgs& a) { return a.output; }
__device__ __forceinline__ char* scratch_of(const OxcclAllreduceArgs& a, uint32_t r) {
  return static_cast<char*>(a.scratch[r]);
}
__device__ __forceinline__ uint64_t count_of(const OxcclAllreduceArgs& a) { return a.count; }
__device__ __forceinline__ uint32_t rank_of(const OxcclAllreduceArgs& a) { return a.rank; }
__device__ __forceinline__ uint32_t world_of(const OxcclAllreduceArgs& a) { return a.world_size; }
__device__ __forceinline__ uint64_t timeout_of(const OxcclAllreduceArgs& a) { return a.timeout_ns; }
__device__ __forceinline__ const uint64_t* abort_of(const OxcclAllreduceArgs& a) { return a.abort_flag; }
__device__ __forceinline__ const void* in_of(const Args& a) { return a.input; }
__device__ __forceinline__ void* out_of(const Args& a) { return a.output; }
__device__ __forceinline__ char* scratch_of(const Args& a, uint32_t r) { return r == a.rank ? a.own : a.peer; }
__device__ __forceinline__ uint64_t count_of(const Args& a) { return a.bytes / 2; }
__device__ __forceinline__ uint32_t rank_of(const Args& a) { return a.rank; }
__device__ __forceinline__ uint32_t world_of(const Args& a) { return a.world; }
__device__ __forceinline__ uint64_t timeout_of(const Args&) { return 10'000'000'000ull; }
__device__ __forceinline__ const uint64_t* abort_of(const Args&) { return nullptr; }

template <uint32_t kStrip, typename A>
__device__ __forceinline__ void mirror_body(const A& a) {
  using namespace oxccl::allreduce;
  using Fmt = oxccl::Bf16;
  const StaticReducer<Fmt, oxccl::Acc::Element, OXCCL_OP_SUM> reduce{};
  oxccl::wait_prior_grid();
  oxccl::launch_dependents();
  const uint32_t me = rank_of(a);
  const uint32_t w = (kStrip & kWorldTwo) != 0 ? 2u : world_of(a);
  char* own = scratch_of(a, me < OXCCL_ALLREDUCE_MAX_RANKS ? me : 0);
  __shared__ int failed;
  if constexpr ((kStrip & kNoPrologue) == 0) {
    if (!(w >= 1 && w <= OXCCL_ALLREDUCE_MAX_RANKS && me < w && blockDim.x >= w &&
          gridDim.x <= OXCCL_ALLREDUCE_MAX_BLOCKS && blockDim.x % 32 == 0)) {
      if (oxccl::thread_index() == 0) report(own, abort_of(a), OXCCL_ALLREDUCE_ERR_ARGS, me);
      return;
    }
    if (threadIdx.x == 0) failed = 0;
  }
  uint64_t* failure = sync_word(own, OXCCL_ALLREDUCE_SYNC_ERROR);
  const CallState call{own, Deadline{timeout_of(a), abort_of(a), failure}, &failed};

  const uint64_t total = count_of(a) * sizeof(typename Fmt::Storage);
  const uint64_t units = (total + 15) / 16;
  const uint64_t lines = (units + kLl128Units - 1) / kLl128Units;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t t = lane & 7;
  const uint64_t warp = oxccl::thread_index() / 32;
  const uint64_t warps = oxccl::thread_count() / 32;
  const auto load = [&](uint64_t u) {
    if constexpr ((kStrip & kWholeUnits) != 0) {
      return u < units ? oxccl::load16(static_cast<const char*>(in_of(a)) + u * 16) : Vec16{{0, 0, 0, 0}};
    } else {
      return load_unit(in_of(a), u * 16, total);
    }
  };
  const auto unit_of = [&](uint64_t first) {
    const uint64_t line = first + lane / 8;
    return line < lines && t < kLl128Units ? load(line * kLl128Units + t) : Vec16{{0, 0, 0, 0}};
  };
  Vec16 data = unit_of(warp * 4);
  const uint64_t epoch = read_epoch(call.own);
  const uint32_t flag = flag_of(epoch);
  const uint64_t half = kLineOffset + (epoch & 1) * kHalfBytes;
  const uint64_t slot_bytes = lines * 128;
  const Vec16 flags{{flag, flag, flag, flag}};
  for (uint64_t first = warp * 4; first < lines; first += warps * 4) {
    const uint64_t line = first + lane / 8;
    const bool active = line < lines;
    if (first != warp * 4) data = unit_of(first);
    const Vec16 v = t < kLl128Units ? data : flags;
    __syncwarp();
    if (active) {
      for (uint32_t k = 1; k < w; ++k) {
        const uint32_t p = me + k < w ? me + k : me + k - w;
        oxccl::store16_volatile(scratch_of(a, p) + half + me * slot_bytes + line * 128 + t * 16, v);
      }
    }
  }
  if constexpr ((kStrip & kCountLast) == 0) call.count_block(epoch);

  const char* mine = own + half;
  uint32_t all_peers = 0;
  for (uint32_t r = 0; r < w; ++r) {
    if (r != me) all_peers |= 1u << r;
  }
  for (uint64_t first = warp * 4; first < lines; first += warps * 4) {
    const uint64_t line = first + lane / 8;
    const bool active = line < lines;
    const uint64_t u = line * kLl128Units + t;
    const Vec16 own_unit = load(u);
    if constexpr ((kStrip & kOnePeer) != 0) {
      const char* src = mine + (me ^ 1u) * slot_bytes + line * 128 + t * 16;
      Vec16 got = own_unit;
      for (uint64_t polls = 0;; ++polls) {
        __syncwarp();
        const Vec16 r = active ? oxccl::load16_volatile(src) : flags;
        const int ok = __shfl_sync(0xffffffffu, static_cast<int>(line_ok(r, flag)), lane | 7);
        if (ok) got = r;
        if (__all_sync(0xffffffffu, ok)) break;
      }
      if (active && t < kLl128Units) {
        auto acc = reduce.first(me == 0 ? own_unit : got);
        reduce.add(acc, me == 0 ? got : own_unit);
        const Vec16 out = reduce.finish(acc, 2);
        if (u < units) oxccl::store16(static_cast<char*>(out_of(a)) + u * 16, out);
      }
    } else {
      Vec16 in[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
      for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) in[r] = own_unit;
      uint32_t pending = active ? all_peers : 0;
      uint64_t since = 0;
      for (uint64_t polls = 0;; ++polls) {
        __syncwarp();
        Vec16 raw[OXCCL_ALLREDUCE_MAX_RANKS];
#pragma unroll
        for (uint32_t r = 0; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
          if (pending >> r & 1) raw[r] = oxccl::load16_volatile(mine + r * slot_bytes + line * 128 + t * 16);
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
        if constexpr ((kStrip & kNoBound) == 0) {
          if (__any_sync(0xffffffffu, pending != 0 && call.deadline.expired(polls, since))) {
            if (pending != 0) {
              report(own, abort_of(a), call.deadline.failure(), static_cast<uint32_t>(__ffs(pending) - 1));
            }
            return;
          }
        }
      }
      if (active && t < kLl128Units) {
        const Vec16 out = reduce_ranks(reduce, in, w);
        if constexpr ((kStrip & kWholeUnits) != 0) {
          if (u < units) oxccl::store16(static_cast<char*>(out_of(a)) + u * 16, out);
        } else {
          store_unit(out_of(a), u * 16, out, total);
        }
      }
    }
  }
  if constexpr ((kStrip & kCountLast) != 0) call.count_block(epoch);
  finish_call(own, true);
}

template <uint32_t kStrip>
__global__ void __launch_bounds__(512) mirror_kernel(const __grid_constant__ OxcclAllreduceArgs param) {
  mirror_body<kStrip>(param);
}

template <uint32_t kStrip>
__global__ void __launch_bounds__(512) mirror_small_kernel(const __grid_constant__ Args a) {
  mirror_body<kStrip>(a);
}

// ---- host ----------------------------------------------------------------------------------

uint16_t bf16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

struct Gpu {
  int dev;
  cudaStream_t stream;
  char* input;
  char* output;
  char* scratch;
  std::vector<uint16_t> host_input;
};

enum class Kind { Empty, Copy, Ping, Ll128, Real, Typed, Mirror, Barrier, BcastBarrier, BcastDirect };

struct Case {
  std::string name;
  Kind kind;
  uint64_t bytes;
  unsigned blocks, threads;
  bool early;
  uint32_t fuse;
  uint32_t stagger;
  uint32_t extra = kPlain;  // Extra bits (ll128), BarrierVariant (barrier)
};

using Kernel = void (*)(Args);

// The ll128 instantiations the cases use (every Extra bit alone, and all of the real
// kernel's together).
Kernel ll128_for(uint32_t extra) {
  switch (extra) {
    case kPlain: return ll128_kernel<kPlain>;
    case kTwoPolls: return ll128_kernel<kTwoPolls>;
    case kDeadline: return ll128_kernel<kDeadline>;
    case kNoinline: return ll128_kernel<kNoinline>;
    case kArrays: return ll128_kernel<kArrays>;
    case kShared: return ll128_kernel<kShared>;
    case kReleaseCount: return ll128_kernel<kReleaseCount>;
    case kDeadline | kNoinline | kArrays | kShared: return ll128_kernel<kDeadline | kNoinline | kArrays | kShared>;
    default: std::fprintf(stderr, "latency_probe: no ll128 kernel for extra %u\n", extra); std::exit(2);
  }
}

// The mirror instantiations the cases use: none, each Strip bit alone, and all.
using RealKernel = void (*)(OxcclAllreduceArgs);
RealKernel mirror_for(uint32_t strip) {
  switch (strip) {
    case 0: return mirror_kernel<0>;
    case kWorldTwo: return mirror_kernel<kWorldTwo>;
    case kNoBound: return mirror_kernel<kNoBound>;
    case kNoPrologue: return mirror_kernel<kNoPrologue>;
    case kCountLast: return mirror_kernel<kCountLast>;
    case kWholeUnits: return mirror_kernel<kWholeUnits>;
    case kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits:
      return mirror_kernel<kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits>;
    case kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kOnePeer:
      return mirror_kernel<kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kOnePeer>;
    default: std::fprintf(stderr, "latency_probe: no mirror kernel for strip %u\n", strip); std::exit(2);
  }
}
Kernel mirror_small_for(uint32_t strip) {
  switch (strip) {
    case kSmallArgs: return mirror_small_kernel<kSmallArgs>;
    case kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kSmallArgs:
      return mirror_small_kernel<kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kSmallArgs>;
    case kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kOnePeer | kSmallArgs:
      return mirror_small_kernel<kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits | kOnePeer | kSmallArgs>;
    default: std::fprintf(stderr, "latency_probe: no small-argument mirror for strip %u\n", strip); std::exit(2);
  }
}

Kernel barrier_for(uint32_t variant) {
  switch (variant) {
    case kBarrierSc: return barrier_kernel<kBarrierSc>;
    case kBarrierRelease: return barrier_kernel<kBarrierRelease>;
    case kBarrierRelaxed: return barrier_kernel<kBarrierRelaxed>;
    default: std::fprintf(stderr, "latency_probe: no barrier variant %u\n", variant); std::exit(2);
  }
}

void launch(const Case& c, Gpu& g, Gpu& peer, uint32_t rank) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(c.blocks);
  cfg.blockDim = dim3(c.threads);
  cfg.stream = g.stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = c.early ? 1 : 0;
  if (c.kind == Kind::Mirror && (c.extra & kSmallArgs) != 0) {
    const Args a{g.input, g.output, g.scratch, peer.scratch, c.bytes, rank, 1, 0, 2};
    CK(cudaLaunchKernelEx(&cfg, mirror_small_for(c.extra), a));
    return;
  }
  if (c.kind == Kind::Real || c.kind == Kind::Typed || c.kind == Kind::Mirror || c.kind == Kind::BcastBarrier || c.kind == Kind::BcastDirect) {
    OxcclAllreduceArgs r{};
    r.input = g.input;
    r.output = g.output;
    r.scratch[rank] = g.scratch;
    r.scratch[rank ^ 1] = peer.scratch;
    r.count = c.bytes / 2;
    r.packet_offset = kLineOffset;
    r.packet_half_bytes = kHalfBytes;
    r.data_offset = kDataOffset;
    r.data_bytes = kDataBytes;
    r.timeout_ns = 10'000'000'000ull;
    r.rank = rank;
    r.world_size = 2;
    r.dtype = OXCCL_DTYPE_BF16;
    r.op = OXCCL_OP_SUM;
    r.accum = OXCCL_ACCUM_AUTO;
    r.root = 0;
    if (c.kind == Kind::Real) {
      CK(cudaLaunchKernelEx(&cfg, allreduce_oneshot_ll128, r));
    } else if (c.kind == Kind::Typed) {
      CK(cudaLaunchKernelEx(&cfg, allreduce_oneshot_ll128_bf16_sum, r));
    } else if (c.kind == Kind::Mirror) {
      CK(cudaLaunchKernelEx(&cfg, mirror_for(c.extra), r));
    } else if (c.kind == Kind::BcastBarrier) {
      CK(cudaLaunchKernelEx(&cfg, broadcast_barrier, r));
    } else {
      // Registered outputs: each GPU's output as the other sees it (peer access is on).
      r.peer_output[rank] = g.output;
      r.peer_output[rank ^ 1] = peer.output;
      CK(cudaLaunchKernelEx(&cfg, broadcast_direct, r));
    }
    return;
  }
  const Args a{g.input, g.output, g.scratch, peer.scratch, c.bytes, rank, c.fuse, c.stagger, 2};
  switch (c.kind) {
    case Kind::Empty: CK(cudaLaunchKernelEx(&cfg, empty_kernel, a)); break;
    case Kind::Copy: CK(cudaLaunchKernelEx(&cfg, copy_kernel, a)); break;
    case Kind::Ping: CK(cudaLaunchKernelEx(&cfg, ping_kernel, a)); break;
    case Kind::Ll128: CK(cudaLaunchKernelEx(&cfg, ll128_for(c.extra), a)); break;
    case Kind::Barrier: CK(cudaLaunchKernelEx(&cfg, barrier_for(c.extra), a)); break;
    default: break;
  }
}

bool moves_data(Kind k) { return k == Kind::Copy || k == Kind::Ll128 || k == Kind::Real || k == Kind::Typed || k == Kind::Mirror || k == Kind::BcastDirect; }

// Runs one case: fresh scratch on both GPUs, poisoned outputs, a graph of `calls` launches
// per GPU; checks the outputs; returns microseconds per call (median of `reps` replays).
double run_case(const Case& c, Gpu* gpus, int calls, int reps, bool* ok) {
  cudaGraphExec_t exec[2];
  for (uint32_t r = 0; r < 2; ++r) {
    Gpu& g = gpus[r];
    CK(cudaSetDevice(g.dev));
    CK(cudaMemset(g.scratch, 0, kScratchBytes));
    CK(cudaMemset(g.output, 0xff, kMaxBytes));
    CK(cudaDeviceSynchronize());
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) launch(c, g, gpus[r ^ 1], r);
    CK(cudaStreamEndCapture(g.stream, &graph));
    CK(cudaGraphInstantiate(&exec[r], graph, 0));
    CK(cudaGraphDestroy(graph));
  }
  // Warm-up replay, then the check.
  for (uint32_t r = 0; r < 2; ++r) {
    CK(cudaSetDevice(gpus[r].dev));
    CK(cudaGraphLaunch(exec[r], gpus[r].stream));
  }
  for (uint32_t r = 0; r < 2; ++r) {
    CK(cudaSetDevice(gpus[r].dev));
    CK(cudaStreamSynchronize(gpus[r].stream));
  }
  *ok = true;
  if (moves_data(c.kind)) {
    const size_t n = c.bytes / 2;
    for (uint32_t r = 0; r < 2; ++r) {
      std::vector<uint16_t> out(n);
      CK(cudaSetDevice(gpus[r].dev));
      CK(cudaMemcpy(out.data(), gpus[r].output, c.bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = c.kind == Kind::Copy          ? gpus[r].host_input[i]
                              : c.kind == Kind::BcastDirect ? gpus[0].host_input[i]
                                                            : bf16_bits(bf16_value(gpus[0].host_input[i]) + bf16_value(gpus[1].host_input[i]));
        if (out[i] != want) {
          std::printf("  MISMATCH %s rank %u element %zu: got %04x want %04x\n", c.name.c_str(), r, i, out[i], want);
          *ok = false;
          break;
        }
      }
    }
  }
  std::vector<double> per_call;
  cudaEvent_t ev[2][2];
  for (uint32_t r = 0; r < 2; ++r) {
    CK(cudaSetDevice(gpus[r].dev));
    CK(cudaEventCreate(&ev[r][0]));
    CK(cudaEventCreate(&ev[r][1]));
  }
  for (int rep = 0; rep < reps; ++rep) {
    for (uint32_t r = 0; r < 2; ++r) {
      CK(cudaSetDevice(gpus[r].dev));
      CK(cudaEventRecord(ev[r][0], gpus[r].stream));
      CK(cudaGraphLaunch(exec[r], gpus[r].stream));
      CK(cudaEventRecord(ev[r][1], gpus[r].stream));
    }
    double ms[2];
    for (uint32_t r = 0; r < 2; ++r) {
      CK(cudaSetDevice(gpus[r].dev));
      CK(cudaEventSynchronize(ev[r][1]));
      float t;
      CK(cudaEventElapsedTime(&t, ev[r][0], ev[r][1]));
      ms[r] = t;
    }
    // The GPU whose graph started second waited least for the other: its time is the
    // closer one to the steady state.
    per_call.push_back(std::min(ms[0], ms[1]) * 1000.0 /
                       (static_cast<double>(calls) * (c.kind == Kind::Ll128 ? c.fuse : 1)));
  }
  for (uint32_t r = 0; r < 2; ++r) {
    CK(cudaSetDevice(gpus[r].dev));
    CK(cudaEventDestroy(ev[r][0]));
    CK(cudaEventDestroy(ev[r][1]));
    CK(cudaGraphExecDestroy(exec[r]));
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const int calls = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "latency_probe: needs 2 GPUs, found %d\n", n);
    return 2;
  }
  int access = 0;
  CK(cudaDeviceCanAccessPeer(&access, 0, 1));
  if (!access) {
    std::fprintf(stderr, "latency_probe: GPU 0 cannot access GPU 1\n");
    return 2;
  }
  Gpu gpus[2];
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(0.25f, 2.0f);
  for (int r = 0; r < 2; ++r) {
    Gpu& g = gpus[r];
    g.dev = r;
    CK(cudaSetDevice(r));
    CK(cudaDeviceEnablePeerAccess(r ^ 1, 0));
    CK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&g.input, kMaxBytes));
    CK(cudaMalloc(&g.output, kMaxBytes));
    CK(cudaMalloc(&g.scratch, kScratchBytes));
    g.host_input.resize(kMaxBytes / 2);
    for (auto& h : g.host_input) h = bf16_bits((rng() & 1 ? -1.0f : 1.0f) * dist(rng));
    CK(cudaMemcpy(g.input, g.host_input.data(), kMaxBytes, cudaMemcpyHostToDevice));
  }
  std::vector<Case> cases;
  for (bool early : {true, false}) {
    const std::string sfx = early ? "" : "-plain";
    cases.push_back({"empty 1x32" + sfx, Kind::Empty, 1024, 1, 32, early, 1, 0});
    cases.push_back({"copy 1K 1x64" + sfx, Kind::Copy, 1024, 1, 64, early, 1, 0});
    cases.push_back({"ping 1x32" + sfx, Kind::Ping, 1024, 1, 32, early, 1, 0});
    cases.push_back({"ll128 1K 1x96" + sfx, Kind::Ll128, 1024, 1, 96, early, 1, 0});
    cases.push_back({"real 1K 1x96" + sfx, Kind::Real, 1024, 1, 96, early, 1, 0});
    cases.push_back({"typed 1K 1x96" + sfx, Kind::Typed, 1024, 1, 96, early, 1, 0});
  }
  cases.push_back({"empty 1x96 (bigger block)", Kind::Empty, 1024, 1, 96, true, 1, 0});
  cases.push_back({"empty 3x64", Kind::Empty, 1024, 3, 64, true, 1, 0});
  cases.push_back({"copy 64K 74x64", Kind::Copy, 65536, 74, 64, true, 1, 0});
  for (uint32_t fuse : {4u, 16u}) {
    cases.push_back({"ll128 1K 1x96 fuse" + std::to_string(fuse), Kind::Ll128, 1024, 1, 96, true, fuse, 0});
  }
  // The real kernel's stages, one at a time, then all together.
  const std::pair<const char*, uint32_t> extras[] = {{"+deadline", kDeadline}, {"+noinline", kNoinline},
                                                     {"+arrays", kArrays}, {"+shared", kShared},
                                                     {"+all four", kDeadline | kNoinline | kArrays | kShared}};
  for (const auto& [tag, extra] : extras) {
    cases.push_back({std::string("ll128 1K 1x96 ") + tag, Kind::Ll128, 1024, 1, 96, true, 1, 0, extra});
    cases.push_back({std::string("ll128 64K 10x512 ") + tag, Kind::Ll128, 65536, 10, 512, true, 1, 0, extra});
  }
  for (uint32_t stagger : {0u, 300u, 600u}) {
    cases.push_back({"ll128-2poll 1K 1x96 stagger" + std::to_string(stagger), Kind::Ll128, 1024, 1, 96, true, 1,
                     stagger, kTwoPolls});
  }
  struct Size {
    uint64_t bytes;
    unsigned blocks, threads;
  };
  for (const Size s : {Size{2048, 3, 64}, Size{2048, 1, 160}, Size{4096, 5, 64}, Size{4096, 1, 320},
                       Size{16384, 19, 64}, Size{65536, 74, 64}, Size{65536, 10, 512}}) {
    const std::string tag = std::to_string(s.bytes / 1024) + "K " + std::to_string(s.blocks) + "x" + std::to_string(s.threads);
    cases.push_back({"ll128 " + tag, Kind::Ll128, s.bytes, s.blocks, s.threads, true, 1, 0});
    cases.push_back({"real " + tag, Kind::Real, s.bytes, s.blocks, s.threads, true, 1, 0});
    cases.push_back({"typed " + tag, Kind::Typed, s.bytes, s.blocks, s.threads, true, 1, 0});
  }
  // The typed kernel part by part (mirror): none taken away must time as "typed"; then each
  // part alone; then all of them, which leaves "ll128" plus whatever no bit names.
  const uint32_t all_parts = kWorldTwo | kNoBound | kNoPrologue | kCountLast | kWholeUnits;
  const std::pair<const char*, uint32_t> parts[] = {
      {"", 0}, {" -world8", kWorldTwo}, {" -bound", kNoBound}, {" -prologue", kNoPrologue},
      {" count-last", kCountLast}, {" -tail", kWholeUnits}, {" small-args", kSmallArgs},
      {" -all", all_parts}, {" -all small-args", all_parts | kSmallArgs},
      {" -all one-peer", all_parts | kOnePeer}, {" -all one-peer small-args", all_parts | kOnePeer | kSmallArgs}};
  for (const auto& [tag, strip] : parts) {
    cases.push_back({std::string("mirror 1K 1x96") + tag, Kind::Mirror, 1024, 1, 96, true, 1, 0, strip});
  }
  for (const Size s : {Size{4096, 5, 64}, Size{65536, 74, 64}}) {
    const std::string tag = std::to_string(s.bytes / 1024) + "K " + std::to_string(s.blocks) + "x" + std::to_string(s.threads);
    cases.push_back({"ll128 " + tag, Kind::Ll128, s.bytes, s.blocks, s.threads, true, 1, 0});
    cases.push_back({"typed " + tag, Kind::Typed, s.bytes, s.blocks, s.threads, true, 1, 0});
    cases.push_back({"mirror " + tag, Kind::Mirror, s.bytes, s.blocks, s.threads, true, 1, 0, 0});
    cases.push_back({"mirror " + tag + " -all", Kind::Mirror, s.bytes, s.blocks, s.threads, true, 1, 0, all_parts});
    cases.push_back({"mirror " + tag + " -all one-peer", Kind::Mirror, s.bytes, s.blocks, s.threads, true, 1, 0,
                     all_parts | kOnePeer});
    cases.push_back({"mirror " + tag + " -all one-peer small-args", Kind::Mirror, s.bytes, s.blocks, s.threads, true,
                     1, 0, all_parts | kOnePeer | kSmallArgs});
  }
  cases.push_back({"ll128 64K 74x64 fuse16", Kind::Ll128, 65536, 74, 64, true, 16, 0});
  cases.push_back({"ll128 2K 3x64 +release-count", Kind::Ll128, 2048, 3, 64, true, 1, 0, kReleaseCount});
  cases.push_back({"ll128 64K 74x64 +release-count", Kind::Ll128, 65536, 74, 64, true, 1, 0, kReleaseCount});
  // One block while it fits, for the real kernel too.
  cases.push_back({"real 8K 1x512", Kind::Real, 8192, 1, 512, true, 1, 0});
  cases.push_back({"real 8K 10x64", Kind::Real, 8192, 10, 64, true, 1, 0});
  cases.push_back({"real 16K 2x512", Kind::Real, 16384, 2, 512, true, 1, 0});
  cases.push_back({"real 32K 37x64", Kind::Real, 32768, 37, 64, true, 1, 0});
  cases.push_back({"real 32K 5x512", Kind::Real, 32768, 5, 512, true, 1, 0});

  // Barriers: the protocol's cost, and the real barrier kernels (BARRIER=only runs just these).
  std::vector<Case> barrier_cases;
  for (bool early : {true, false}) {
    const std::string sfx = early ? "" : "-plain";
    barrier_cases.push_back({"empty 1x64" + sfx, Kind::Empty, 1024, 1, 64, early, 1, 0});
    barrier_cases.push_back({"ping 1x64" + sfx, Kind::Ping, 1024, 1, 64, early, 1, 0});
    for (const auto& [tag, variant] : {std::pair<const char*, uint32_t>{"sc", kBarrierSc}, {"rel", kBarrierRelease},
                                       {"relaxed", kBarrierRelaxed}}) {
      for (uint32_t n : {1u, 2u}) {
        barrier_cases.push_back({"barrier x" + std::to_string(n) + " " + tag + " 1x64" + sfx, Kind::Barrier, 1024, 1,
                                 64, early, n, 0, variant});
      }
    }
    barrier_cases.push_back({"bcast-barrier 1x32" + sfx, Kind::BcastBarrier, 1024, 1, 32, early, 1, 0});
    barrier_cases.push_back({"bcast-direct 1K 1x64" + sfx, Kind::BcastDirect, 1024, 1, 64, early, 1, 0});
    barrier_cases.push_back({"bcast-direct 64K 16x256" + sfx, Kind::BcastDirect, 65536, 16, 256, early, 1, 0});
  }
  if (std::getenv("BARRIER") != nullptr) cases.clear();
  cases.insert(cases.begin(), barrier_cases.begin(), barrier_cases.end());

  std::printf("# latency_probe: 2 GPUs, %d calls per graph, median of %d replays, us per call\n", calls, reps);
  int failures = 0;
  for (const Case& c : cases) {
    bool ok = true;
    const double us = run_case(c, gpus, calls, reps, &ok);
    if (!ok) ++failures;
    std::printf("%-40s %8.3f us%s\n", c.name.c_str(), us, moves_data(c.kind) ? (ok ? "  check ok" : "  CHECK FAILED") : "");
    std::fflush(stdout);
  }
  std::printf("# failures: %d\n", failures);
  return failures == 0 ? 0 : 1;
}
