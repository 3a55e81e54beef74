// How fast large data moves between two GPUs of one host, to choose how oxccl's large
// broadcast / reduce / all-to-all / allreduce kernels move it: SM stores into the peer, SM
// loads from the peer, the copy engines (pushed from the source GPU or pulled by the
// destination's), or both at once. One process drives both GPUs (peer access both ways
// over NVLink); every case is a timed loop of whole copies on GPU 0's main stream (work on
// other streams, GPU 1's included, is forked from it and joined back with events in every
// copy, as a collective call would), timed with events on that stream and cross-checked
// with the host's wall clock. GB/s = bytes per direction (1e9) / time, median of the
// repetitions; "s" below is the size (64 MiB, 256 MiB, 1 GiB by default):
//
//   sm-store-1dir  a GPU 0 kernel loads its own source and stores into GPU 1's buffer:
//                  a  one 16-byte unit per thread per iteration, SMs x 512 threads,
//                     grid-stride loop
//                  b  4 independent 16-byte loads, then 4 stores, per iteration
//                  c  b with streaming stores (st.global.cs)
//                  d  b on 2 x SMs blocks of 256 threads
//                  e  8 loads then 8 stores per iteration
//   sm-store-2dir  a and b on both GPUs at once, each into the other (s each way)
//   sm-load-1dir   a GPU 0 kernel loads GPU 1's source (ld.global.cg) and stores into its
//                  own buffer: a 1 unit per thread per iteration, b 4 units
//   ce-1dir        copy engine, GPU 0's source into GPU 1's buffer:
//                  a       one cudaMemcpyAsync (cudaMemcpyDefault, UVA) on one GPU 0 stream
//                  a-peer  the same with cudaMemcpyPeerAsync
//                  pushK   s in K equal chunks on K streams of GPU 0 (K = 2, 4, 8)
//                  pullK   the same chunks issued on K streams of GPU 1 (its copy engines
//                          read GPU 0's memory; K = 1, 2, 4, 8)
//   ce-2dir        push4 both ways at once (s each way)
//   ce+sm          one direction, s / 2 by the copy engines (push4) and s / 2 by SM stores
//                  (sm-store-1dir b) at once
//   split          one direction (GPU 1's source into GPU 0's buffer), half by each of two
//                  engines at once, each on its own GPU's SMs or copy engine:
//                  store+load    GPU 1's SMs store the first half, GPU 0's SMs load the second
//                  cepush+load   GPU 1's copy engine pushes the first half, GPU 0's SMs load
//                  cepull+store  GPU 0's copy engine pulls the first half, GPU 1's SMs store
//                  does the link carry more than either engine alone (CE 389-396 GB/s)?
//   local-copy     GPU 0's source into its own buffer, by SM (b) and by cudaMemcpyAsync (the
//                  driver may run it as a kernel): HBM for reference (bytes copied; each is
//                  read once and written once)
//   ce+local       one copy-engine copy of s between the GPUs while GPU 0's SMs copy s of its
//                  own (sm-store b into a spare buffer) on another stream: does local memory
//                  traffic slow the copy engine, and on which side?
//                  push-src  GPU 0's engine pushes to GPU 1 (an out-of-place broadcast's root)
//                  push-dst  GPU 1's engine pushes into GPU 0 (a reduce pushed to its root)
//                  pull-dst  GPU 0's engine pulls from GPU 1 (reduce_copy's root)
//                  push-dst16  push-dst with the local copy on 16 blocks
//   ce-pipe        reduce_copy's shape in one process: GPU 0's engine pulls GPU 1's source in
//                  chunks (32 or 128 MiB) into two slots of GPU 0's spare on a side stream,
//                  and as each lands a kernel on the main stream reads it and GPU 0's own
//                  source and writes GPU 0's destination (3 bytes of local traffic per byte,
//                  as a reduce; the result is the landed data, so it is checked); `serial`
//                  runs that kernel on the side stream after each copy instead (no overlap)
//   ce+busy        the same three copies while GPU 0 runs a kernel that holds every SM
//                  whole (1024 threads and all of the shared memory per block) and only
//                  spins for the copy's expected time: level with ce-1dir when the copy
//                  engine needs no SM, about half when the driver moves the copy with SMs
//
// Plain loads of a local source compile to ld.global.nc (it is const __restrict__).
//
// Every case and size is checked once after its warm-up loop: the sources hold a pattern
// of the word's index and the GPU, the destinations are poisoned (0xff bytes) before the
// case, and a compare kernel on the destination's GPU counts the words that differ. The
// wall clock includes issuing the loop's calls from the host: where it is far below the
// event figure the host could not keep up. Build and run (ci/gpu/session.sh bwprobe):
//
//     nvcc -std=c++20 -O3 -arch=sm_90 ci/gpu/probe/bandwidth_probe.cu -o bp
//     ./bp [sizes in MiB, comma-separated: 64,256,1024] [repetitions: 5]
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace bwprobe {

using probe_common::busy_kernel;
using probe_common::fill_kernel;
using probe_common::mix_kernel;
using probe_common::pattern;
using probe_common::verify_kernel;

constexpr int kSideStreams = 8;
constexpr uint64_t kMiB = 1ull << 20;
// Each timed loop moves about this much per direction (at least one copy).
constexpr uint64_t kLoopBytes = 4ull << 30;

__device__ __forceinline__ uint4 load_unit(const uint4* p, bool cg) { return cg ? __ldcg(p) : *p; }

__device__ __forceinline__ void store_unit(uint4* p, const uint4& v, bool cs) {
  if (cs) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    *p = v;
  }
}

// Copies `bytes` (a multiple of 16) from src to dst, either of them a peer's: kUnroll
// independent 16-byte loads per thread, then their stores, per grid-stride iteration; the
// tail one unit at a time. kLoadCg: loads bypass L1 (ld.global.cg); kStoreCs: streaming
// stores (st.global.cs).
template <int kUnroll, bool kLoadCg, bool kStoreCs>
__global__ void __launch_bounds__(512) copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                   uint64_t bytes) {
  const uint64_t units = bytes / 16;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t u = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  for (; u + (kUnroll - 1) * stride < units; u += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = load_unit(src + u + k * stride, kLoadCg);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) store_unit(dst + u + k * stride, v[k], kStoreCs);
  }
  for (; u < units; u += stride) store_unit(dst + u, load_unit(src + u, kLoadCg), kStoreCs);
}

using Kernel = void (*)(const uint4*, uint4*, uint64_t);

struct SmVariant {
  const char* tag;
  Kernel kernel;
  int blocks_per_sm;
  int threads;
};

// ---- host ----------------------------------------------------------------------------------

struct Lane {
  int dev;
  cudaStream_t stream;
  cudaEvent_t done;  // no timing: fork / join only
};

struct Gpu {
  int dev;
  int sms;
  char* src;
  char* dst;
  char* spare;  // a second destination (the ce+local cases' local copy)
  Lane main;
  Lane side[kSideStreams];
  unsigned long long* counters;  // [0] mismatches, [1] first mismatching word
};

Lane make_lane(int dev) {
  Lane l{dev, nullptr, nullptr};
  CK(cudaSetDevice(dev));
  CK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming));
  return l;
}

// `to` waits for everything issued to `from` so far.
void after(const Lane& to, const Lane& from) {
  CK(cudaSetDevice(from.dev));
  CK(cudaEventRecord(from.done, from.stream));
  CK(cudaSetDevice(to.dev));
  CK(cudaStreamWaitEvent(to.stream, from.done, 0));
}

void fork(const Lane& main, const std::vector<const Lane*>& lanes) {
  CK(cudaSetDevice(main.dev));
  CK(cudaEventRecord(main.done, main.stream));
  for (const Lane* l : lanes) {
    CK(cudaSetDevice(l->dev));
    CK(cudaStreamWaitEvent(l->stream, main.done, 0));
  }
}

void join(const Lane& main, const std::vector<const Lane*>& lanes) {
  for (const Lane* l : lanes) after(main, *l);
}

void launch(const SmVariant& v, const Lane& lane, int sms, const char* src, char* dst, uint64_t bytes) {
  CK(cudaSetDevice(lane.dev));
  v.kernel<<<sms * v.blocks_per_sm, v.threads, 0, lane.stream>>>(reinterpret_cast<const uint4*>(src),
                                                                  reinterpret_cast<uint4*>(dst), bytes);
  CK(cudaGetLastError());
}

void copy(const Lane& lane, const char* src, char* dst, uint64_t bytes) {
  CK(cudaSetDevice(lane.dev));
  CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane.stream));
}

// Chunk i of k of [0, bytes), 16-byte aligned.
uint64_t cut(uint64_t bytes, int i, int k) { return i == k ? bytes : (bytes * i / k) & ~15ull; }

// Copies [0, bytes) of src into dst in k chunks, chunk i on lanes[i].
void copy_chunks(const std::vector<const Lane*>& lanes, const char* src, char* dst, uint64_t bytes) {
  const int k = static_cast<int>(lanes.size());
  for (int i = 0; i < k; ++i) {
    const uint64_t a = cut(bytes, i, k), b = cut(bytes, i + 1, k);
    copy(*lanes[i], src + a, dst + a, b - a);
  }
}

void sync_all(Gpu* gpus) {
  for (int r = 0; r < 2; ++r) {
    CK(cudaSetDevice(gpus[r].dev));
    CK(cudaDeviceSynchronize());
  }
}

// A destination that a case fills: GPU `gpu`'s dst (or spare), expected to hold GPU
// `from`'s source.
struct Target {
  int gpu;
  int from;
  bool spare = false;
};

struct Runner {
  Gpu* gpus;
  int reps;
  cudaEvent_t start, stop;  // timing, on GPU 0
  int failures = 0;

  // Poisons the targets, runs one loop (warm-up) and checks them, then times `reps` loops
  // of `once` (which begins and ends on GPU 0's main stream) and prints the medians.
  void run(const char* name, const std::string& variant, uint64_t bytes, const std::vector<Target>& targets,
           const std::function<void()>& once) {
    const int iters = static_cast<int>(std::max<uint64_t>(1, kLoopBytes / bytes));
    sync_all(gpus);
    for (const Target& t : targets) {
      CK(cudaSetDevice(gpus[t.gpu].dev));
      CK(cudaMemset(t.spare ? gpus[t.gpu].spare : gpus[t.gpu].dst, 0xff, bytes));
    }
    sync_all(gpus);
    for (int i = 0; i < iters; ++i) once();
    sync_all(gpus);
    std::string verdict = "ok";
    for (const Target& t : targets) {
      Gpu& g = gpus[t.gpu];
      CK(cudaSetDevice(g.dev));
      const unsigned long long init[2] = {0, ~0ull};
      CK(cudaMemcpy(g.counters, init, sizeof(init), cudaMemcpyHostToDevice));
      verify_kernel<<<g.sms * 4, 512>>>(reinterpret_cast<const uint32_t*>(t.spare ? g.spare : g.dst), bytes / 4,
                                        t.from, g.counters, g.counters + 1);
      CK(cudaGetLastError());
      unsigned long long got[2];
      CK(cudaMemcpy(got, g.counters, sizeof(got), cudaMemcpyDeviceToHost));
      if (got[0] != 0) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "FAIL (GPU %d: %llu of %llu words wrong, first at byte %llu)", t.gpu, got[0],
                      static_cast<unsigned long long>(bytes / 4), got[1] * 4);
        verdict = buf;
      }
    }
    if (verdict != "ok") ++failures;
    std::vector<double> gpu_s, wall_s;
    for (int rep = 0; rep < reps; ++rep) {
      sync_all(gpus);
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaSetDevice(gpus[0].dev));
      CK(cudaEventRecord(start, gpus[0].main.stream));
      for (int i = 0; i < iters; ++i) once();
      CK(cudaSetDevice(gpus[0].dev));
      CK(cudaEventRecord(stop, gpus[0].main.stream));
      CK(cudaEventSynchronize(stop));
      const auto t1 = std::chrono::steady_clock::now();
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start, stop));
      gpu_s.push_back(ms * 1e-3);
      wall_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    sync_all(gpus);
    std::sort(gpu_s.begin(), gpu_s.end());
    std::sort(wall_s.begin(), wall_s.end());
    const double moved = static_cast<double>(bytes) * iters;
    std::printf("%-14s %-7s %11llu B %8.1f GB/s   wall %8.1f GB/s  %s\n", name, variant.c_str(),
                static_cast<unsigned long long>(bytes), moved / gpu_s[gpu_s.size() / 2] * 1e-9,
                moved / wall_s[wall_s.size() / 2] * 1e-9, verdict.c_str());
    std::fflush(stdout);
  }
};

std::vector<uint64_t> parse_sizes(const char* arg) {
  std::vector<uint64_t> sizes;
  std::string s(arg);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    if (!item.empty()) {
      const long long mib = std::atoll(item.c_str());
      if (mib <= 0) {
        std::fprintf(stderr, "bandwidth_probe: bad size '%s' (MiB)\n", item.c_str());
        std::exit(2);
      }
      sizes.push_back(static_cast<uint64_t>(mib) * kMiB);
    }
    pos = comma + 1;
  }
  return sizes;
}

}  // namespace bwprobe

int main(int argc, char** argv) {
  using namespace bwprobe;
  const auto begin = std::chrono::steady_clock::now();
  const std::vector<uint64_t> sizes = parse_sizes(argc > 1 ? argv[1] : "64,256,1024");
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  if (sizes.empty()) {
    std::fprintf(stderr, "usage: bandwidth_probe [MiB,MiB,...] [repetitions]\n");
    return 2;
  }
  const uint64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "bandwidth_probe: needs 2 GPUs, found %d\n", n);
    return 2;
  }
  for (int r = 0; r < 2; ++r) {
    int access = 0;
    CK(cudaDeviceCanAccessPeer(&access, r, r ^ 1));
    if (!access) {
      std::fprintf(stderr, "bandwidth_probe: GPU %d cannot access GPU %d\n", r, r ^ 1);
      return 2;
    }
  }
  int driver = 0, runtime = 0, rank = 0;
  CK(cudaDriverGetVersion(&driver));
  CK(cudaRuntimeGetVersion(&runtime));
  CK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
  std::printf("# bandwidth_probe: driver %d, runtime %d, P2P performance rank %d\n", driver, runtime, rank);

  Gpu gpus[2];
  for (int r = 0; r < 2; ++r) {
    Gpu& g = gpus[r];
    g.dev = r;
    CK(cudaSetDevice(r));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, r));
    g.sms = prop.multiProcessorCount;
    std::printf("# GPU %d: %s, %d SMs, sm_%d%d, %.1f GiB\n", r, prop.name, g.sms, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
    const cudaError_t e = cudaDeviceEnablePeerAccess(r ^ 1, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      CK(e);
    }
    CK(cudaMalloc(&g.src, max_bytes));
    CK(cudaMalloc(&g.dst, max_bytes));
    CK(cudaMalloc(&g.spare, max_bytes));
    CK(cudaMalloc(&g.counters, 2 * sizeof(unsigned long long)));
    g.main = make_lane(r);
    for (Lane& l : g.side) l = make_lane(r);
    CK(cudaSetDevice(r));
    fill_kernel<<<g.sms * 4, 512>>>(reinterpret_cast<uint32_t*>(g.src), max_bytes / 4, r);
    CK(cudaGetLastError());
  }
  sync_all(gpus);
  std::printf("# sizes per direction up to %llu MiB; median of %d timed loops of ~%llu MiB per direction each;"
              " GB/s = 1e9 bytes per direction per second\n",
              static_cast<unsigned long long>(max_bytes / kMiB), reps,
              static_cast<unsigned long long>(kLoopBytes / kMiB));

  Runner bench{gpus, reps, nullptr, nullptr};
  CK(cudaSetDevice(0));
  CK(cudaEventCreate(&bench.start));
  CK(cudaEventCreate(&bench.stop));

  Gpu& g0 = gpus[0];
  Gpu& g1 = gpus[1];
  const int sms0 = g0.sms, sms1 = g1.sms;
  int clock_khz0 = 0, busy_smem0 = 0;
  CK(cudaSetDevice(g0.dev));
  CK(cudaDeviceGetAttribute(&clock_khz0, cudaDevAttrClockRate, g0.dev));
  CK(cudaDeviceGetAttribute(&busy_smem0, cudaDevAttrMaxSharedMemoryPerBlockOptin, g0.dev));
  CK(cudaFuncSetAttribute(busy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, busy_smem0));
  cudaEvent_t pipe_landed[2], pipe_mixed[2];
  for (int i = 0; i < 2; ++i) {
    CK(cudaEventCreateWithFlags(&pipe_landed[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&pipe_mixed[i], cudaEventDisableTiming));
  }
  const SmVariant store[] = {
      {"a", copy_kernel<1, false, false>, 1, 512}, {"b", copy_kernel<4, false, false>, 1, 512},
      {"c", copy_kernel<4, false, true>, 1, 512},  {"d", copy_kernel<4, false, false>, 2, 256},
      {"e", copy_kernel<8, false, false>, 1, 512},
  };
  const SmVariant& store_b = store[1];
  const SmVariant load[] = {{"a", copy_kernel<1, true, false>, 1, 512}, {"b", copy_kernel<4, true, false>, 1, 512}};
  const auto sides = [](Gpu& g, int first, int k) {
    std::vector<const Lane*> v;
    for (int i = first; i < first + k; ++i) v.push_back(&g.side[i]);
    return v;
  };
  const std::vector<Target> to1{{1, 0}}, to0{{0, 1}}, both{{1, 0}, {0, 1}}, local0{{0, 0}};

  for (const uint64_t bytes : sizes) {
    for (const SmVariant& v : store) {
      bench.run("sm-store-1dir", v.tag, bytes, to1, [&] { launch(v, g0.main, sms0, g0.src, g1.dst, bytes); });
    }
    for (const SmVariant& v : {store[0], store[1]}) {
      bench.run("sm-store-2dir", v.tag, bytes, both, [&] {
        const std::vector<const Lane*> peer{&g1.side[0]};
        fork(g0.main, peer);
        launch(v, g0.main, sms0, g0.src, g1.dst, bytes);
        launch(v, g1.side[0], sms1, g1.src, g0.dst, bytes);
        join(g0.main, peer);
      });
    }
    for (const SmVariant& v : load) {
      bench.run("sm-load-1dir", v.tag, bytes, to0, [&] { launch(v, g0.main, sms0, g1.src, g0.dst, bytes); });
    }
    bench.run("ce-1dir", "a", bytes, to1, [&] { copy(g0.main, g0.src, g1.dst, bytes); });
    bench.run("ce-1dir", "a-peer", bytes, to1, [&] {
      CK(cudaSetDevice(g0.dev));
      CK(cudaMemcpyPeerAsync(g1.dst, g1.dev, g0.src, g0.dev, bytes, g0.main.stream));
    });
    for (const int k : {2, 4, 8}) {
      bench.run("ce-1dir", "push" + std::to_string(k), bytes, to1, [&] {
        const std::vector<const Lane*> lanes = sides(g0, 0, k);
        fork(g0.main, lanes);
        copy_chunks(lanes, g0.src, g1.dst, bytes);
        join(g0.main, lanes);
      });
    }
    for (const int k : {1, 2, 4, 8}) {
      bench.run("ce-1dir", "pull" + std::to_string(k), bytes, to1, [&] {
        const std::vector<const Lane*> lanes = sides(g1, 0, k);
        fork(g0.main, lanes);
        copy_chunks(lanes, g0.src, g1.dst, bytes);
        join(g0.main, lanes);
      });
    }
    bench.run("ce-2dir", "push4", bytes, both, [&] {
      const std::vector<const Lane*> out = sides(g0, 0, 4), in = sides(g1, 0, 4);
      std::vector<const Lane*> lanes = out;
      lanes.insert(lanes.end(), in.begin(), in.end());
      fork(g0.main, lanes);
      copy_chunks(out, g0.src, g1.dst, bytes);
      copy_chunks(in, g1.src, g0.dst, bytes);
      join(g0.main, lanes);
    });
    bench.run("ce+sm", "push4+b", bytes, to1, [&] {
      const uint64_t half = (bytes / 2) & ~15ull;
      const std::vector<const Lane*> ce = sides(g0, 0, 4);
      std::vector<const Lane*> lanes = ce;
      lanes.push_back(&g0.side[4]);
      fork(g0.main, lanes);
      copy_chunks(ce, g0.src, g1.dst, half);
      launch(store_b, g0.side[4], sms0, g0.src + half, g1.dst + half, bytes - half);
      join(g0.main, lanes);
    });
    // split: the first half by `first` (issued on GPU 1's side[0] or GPU 0's side[0]), the
    // second by `second`, at once.
    {
      const uint64_t half = (bytes / 2) & ~15ull;
      const auto split = [&](const char* tag, const std::function<void(const Lane&)>& first, const Lane& first_lane,
                             const std::function<void(const Lane&)>& second, const Lane& second_lane) {
        bench.run("split", tag, bytes, to0, [&] {
          const std::vector<const Lane*> lanes{&first_lane, &second_lane};
          fork(g0.main, lanes);
          first(first_lane);
          second(second_lane);
          join(g0.main, lanes);
        });
      };
      const auto load_second = [&](const Lane& l) { launch(load[1], l, sms0, g1.src + half, g0.dst + half, bytes - half); };
      const auto store_first = [&](const Lane& l) { launch(store_b, l, sms1, g1.src, g0.dst, half); };
      const auto store_second = [&](const Lane& l) { launch(store_b, l, sms1, g1.src + half, g0.dst + half, bytes - half); };
      const auto copy_first = [&](const Lane& l) { copy(l, g1.src, g0.dst, half); };
      split("store+load", store_first, g1.side[0], load_second, g0.side[0]);
      split("cepush+load", copy_first, g1.side[0], load_second, g0.side[0]);
      split("cepull+store", copy_first, g0.side[0], store_second, g1.side[1]);
    }
    bench.run("local-copy", "sm-b", bytes, local0, [&] { launch(store_b, g0.main, sms0, g0.src, g0.dst, bytes); });
    bench.run("local-copy", "ce", bytes, local0, [&] { copy(g0.main, g0.src, g0.dst, bytes); });
    // The engine's copy on lane `ce` while `sm` queues GPU 0's SM work on its side[1].
    const auto beside = [&](const Lane& ce, const char* src, char* dst, const std::function<void(const Lane&)>& sm) {
      const std::vector<const Lane*> lanes{&ce, &g0.side[1]};
      fork(g0.main, lanes);
      copy(ce, src, dst, bytes);
      sm(g0.side[1]);
      join(g0.main, lanes);
    };
    // ce+local: GPU 0's SMs copy its source into its spare.
    const Target spare0{0, 0, true};
    const auto beside_local = [&](const Lane& ce, const char* src, char* dst, int local_blocks) {
      beside(ce, src, dst, [&](const Lane& l) { launch(store_b, l, local_blocks, g0.src, g0.spare, bytes); });
    };
    bench.run("ce+local", "push-src", bytes, {{1, 0}, spare0}, [&] { beside_local(g0.side[0], g0.src, g1.dst, sms0); });
    bench.run("ce+local", "push-dst", bytes, {{0, 1}, spare0}, [&] { beside_local(g1.side[0], g1.src, g0.dst, sms0); });
    bench.run("ce+local", "pull-dst", bytes, {{0, 1}, spare0}, [&] { beside_local(g0.side[0], g1.src, g0.dst, sms0); });
    bench.run("ce+local", "push-dst16", bytes, {{0, 1}, spare0}, [&] { beside_local(g1.side[0], g1.src, g0.dst, 16); });
    // ce-pipe: chunk i's pull on side[0] into slot i % 2, its mix on main (or on side[0]).
    for (const uint64_t chunk : {32 * kMiB, 128 * kMiB}) {
      if (chunk > bytes) continue;
      for (const bool serial : {false, true}) {
        const std::string tag = std::to_string(chunk / kMiB) + "M" + (serial ? "-serial" : "");
        bench.run("ce-pipe", tag, bytes, to0, [&] {
          const Lane& ce = g0.side[0];
          const Lane& mixer = serial ? ce : g0.main;
          fork(g0.main, {&ce});
          CK(cudaSetDevice(g0.dev));
          for (uint64_t off = 0, i = 0; off < bytes; off += chunk, ++i) {
            const uint64_t len = std::min(chunk, bytes - off);
            const int slot = static_cast<int>(i % 2);
            char* landing = g0.spare + slot * chunk;
            if (i >= 2) CK(cudaStreamWaitEvent(ce.stream, pipe_mixed[slot], 0));
            CK(cudaMemcpyAsync(landing, g1.src + off, len, cudaMemcpyDefault, ce.stream));
            CK(cudaEventRecord(pipe_landed[slot], ce.stream));
            CK(cudaStreamWaitEvent(mixer.stream, pipe_landed[slot], 0));
            mix_kernel<4><<<sms0, 512, 0, mixer.stream>>>(reinterpret_cast<const uint4*>(landing),
                                                          reinterpret_cast<const uint4*>(g0.src + off),
                                                          reinterpret_cast<uint4*>(g0.dst + off), len, 0u);
            CK(cudaGetLastError());
            CK(cudaEventRecord(pipe_mixed[slot], mixer.stream));
          }
          join(g0.main, {&ce});
        });
      }
    }
    // ce+busy: GPU 0's SMs all held for about the copy's time at 390 GB/s.
    const long long spin = static_cast<long long>(static_cast<double>(bytes) / 390e9 * clock_khz0 * 1e3);
    const auto beside_busy = [&](const Lane& ce, const char* src, char* dst) {
      beside(ce, src, dst, [&](const Lane& l) {
        CK(cudaSetDevice(l.dev));
        busy_kernel<<<sms0, 1024, busy_smem0, l.stream>>>(spin);
        CK(cudaGetLastError());
      });
    };
    bench.run("ce+busy", "push-src", bytes, to1, [&] { beside_busy(g0.side[0], g0.src, g1.dst); });
    bench.run("ce+busy", "push-dst", bytes, to0, [&] { beside_busy(g1.side[0], g1.src, g0.dst); });
    bench.run("ce+busy", "pull-dst", bytes, to0, [&] { beside_busy(g0.side[0], g1.src, g0.dst); });
  }

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf("# failures: %d\n# total %.1f s\n", bench.failures, total);
  return bench.failures == 0 ? 0 : 1;
}
