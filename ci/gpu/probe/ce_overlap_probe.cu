// Does a copy engine's peer copy overlap SM work on the GPU that issues it, for each way
// oxccl's memory can be set up? In one process with cudaMalloc buffers and peer access it
// does (bandwidth_probe's ce-pipe, ce+local, ce+busy); in oxccl's reduce_copy (a process per
// GPU, VMM buffers exported as POSIX file descriptors, GPU-direct-RDMA flag) it did not.
// This probe runs the same GPU 0 work over memory set up five ways and changes nothing else:
//
//   malloc      one process, cudaMalloc on both GPUs, peer access enabled
//   vmm         one process, cuMemCreate (POSIX-FD shareable) on both GPUs, each mapping
//               opened to both GPUs with cuMemSetAccess
//   vmm-rdma    vmm with the gpuDirectRDMACapable flag (what oxccl asks for where the device
//               has it)
//   ipc-vmm     two processes: a child owns GPU 1, allocates its source as vmm-rdma and sends
//               the file descriptor over a Unix socket; the parent (GPU 0 only, as an oxccl
//               rank) imports and maps it for GPU 0; the parent's own buffers are vmm-rdma
//   ipc-legacy  two processes: the child's source is cudaMalloc memory shared with
//               cudaIpcGetMemHandle, opened with cudaIpcOpenMemHandle; own buffers cudaMalloc
//   oxccl       as oxccl-perf's reduce_copy: ipc-legacy, but the landing slots (oxccl's
//               staging) are vmm-rdma
//   landing-vmm one process: cudaMalloc buffers and peer access, vmm-rdma landing slots
//   oxccl+N     oxccl with the landing slots N bytes into their allocation (oxccl's staging
//               starts after its flag regions: 4 KiB-aligned, not 2 MiB-aligned)
//   oxccl-perf  oxccl+1M with sources and destination of 64 bytes more than the size (as
//               oxccl-perf allocated them); extra-64K, extra-2M the same with that much more;
//               malloc+64, vmm+64 those modes with 64 bytes more
//
// Cases (GPU 0 only; "peer" is GPU 1's source, 1 GiB by default; GB/s = bytes / time):
//   pull        GPU 0's copy engine copies the peer's source into GPU 0's destination
//   mix         a kernel on every SM reads two local buffers and writes a third (a reduce's
//               traffic: 3 bytes per byte)
//   pipe-K      reduce_copy's shape: the peer's source pulled in K MiB chunks into two slots
//               on a side stream; as each lands, the mix kernel on the main stream reads it
//               and GPU 0's source and writes the destination. Overlapped it approaches pull.
//   serial-K    the same with the mix on the side stream after each copy (no overlap)
//   pipe1-K     pipe-K with one unit per thread per iteration in the mix (as oxccl's
//               reduce_local) instead of four
//   pulls-K     pipe-K's copies alone, back to back (into the destination)
//   pipe2-K     pipe-K with the pulls alternating between two side streams (two in flight,
//               four landing slots); pulls2-K its copies alone
//   pull+busy   pull on a side stream while a kernel holds every SM for pull's time
//
// Every case is checked once after its warm-up loop (destinations poisoned with 0xff
// first, the words compared with the source's pattern on GPU 0). Build and run
// (ci/gpu/session.sh ceoverlap):
//
//     nvcc -std=c++20 -O3 -arch=sm_90 ci/gpu/probe/ce_overlap_probe.cu -lcuda -o cop
//     ./cop [mode|all] [MiB: 1024] [repetitions: 5]
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_common.cuh"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CU(x)                                                                       \
  do {                                                                              \
    CUresult r_ = (x);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                       \
      const char* s_ = nullptr;                                                     \
      cuGetErrorString(r_, &s_);                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

namespace ceoverlap {

using probe_common::busy_kernel;
using probe_common::fill_kernel;
using probe_common::mix_kernel;
using probe_common::verify_kernel;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kLoopBytes = 4ull << 30;  // each timed loop moves about this much

// ---- memory ---------------------------------------------------------------------------------

enum class Kind { Malloc, Vmm, VmmRdma };

CUmemAllocationProp vmm_prop(int dev, bool rdma) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  return p;
}

uint64_t vmm_round(int dev, uint64_t bytes) {
  const CUmemAllocationProp p = vmm_prop(dev, false);
  size_t g = 0;
  CU(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return (bytes + g - 1) / g * g;
}

// Maps `h` (size bytes) into a fresh range opened to every device of `access`.
char* vmm_map(CUmemGenericAllocationHandle h, uint64_t size, const std::vector<int>& access) {
  CUdeviceptr ptr = 0;
  CU(cuMemAddressReserve(&ptr, size, 0, 0, 0));
  CU(cuMemMap(ptr, size, 0, h, 0));
  std::vector<CUmemAccessDesc> d(access.size());
  for (size_t i = 0; i < access.size(); ++i) {
    d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d[i].location.id = access[i];
    d[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(ptr, size, d.data(), d.size()));
  return reinterpret_cast<char*>(ptr);
}

CUmemGenericAllocationHandle vmm_create(int dev, uint64_t size, bool rdma) {
  const CUmemAllocationProp p = vmm_prop(dev, rdma);
  CUmemGenericAllocationHandle h = 0;
  CU(cuMemCreate(&h, size, &p, 0));
  return h;
}

// `bytes` on device `dev` of the given kind, reachable from every device of `access`.
char* alloc_on(int dev, uint64_t bytes, Kind kind, const std::vector<int>& access) {
  CK(cudaSetDevice(dev));
  if (kind == Kind::Malloc) {
    char* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    return p;
  }
  const uint64_t size = vmm_round(dev, bytes);
  return vmm_map(vmm_create(dev, size, kind == Kind::VmmRdma), size, access);
}

// ---- the child of the two-process modes -------------------------------------------------

// Sends `len` bytes and, if fd >= 0, the file descriptor with them.
void send_msg(int sock, const void* data, size_t len, int fd) {
  iovec iov{const_cast<void*>(data), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    m.msg_control = ctrl;
    m.msg_controllen = sizeof(ctrl);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  if (sendmsg(sock, &m, 0) != static_cast<ssize_t>(len)) {
    std::perror("ce_overlap_probe: sendmsg");
    std::exit(2);
  }
}

// Receives exactly `len` bytes and the file descriptor sent with them (-1 if none).
int recv_msg(int sock, void* data, size_t len) {
  iovec iov{data, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  m.msg_control = ctrl;
  m.msg_controllen = sizeof(ctrl);
  if (recvmsg(sock, &m, MSG_WAITALL) != static_cast<ssize_t>(len)) {
    std::perror("ce_overlap_probe: recvmsg");
    std::exit(2);
  }
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  }
  return fd;
}

struct Offer {  // what the child sends: the legacy handle or the VMM allocation's size
  cudaIpcMemHandle_t legacy;
  uint64_t vmm_size;
};

// GPU 1's process: allocates and fills the source, shares it, holds it until told to stop.
[[noreturn]] void child(int sock, bool legacy, uint64_t bytes, uint64_t extra) {
  CU(cuInit(0));
  CK(cudaSetDevice(1));
  Offer offer{};
  int fd = -1;
  char* src = nullptr;
  if (legacy) {
    CK(cudaMalloc(&src, bytes + extra));
    CK(cudaIpcGetMemHandle(&offer.legacy, src));
  } else {
    offer.vmm_size = vmm_round(1, bytes + extra);
    const CUmemGenericAllocationHandle h = vmm_create(1, offer.vmm_size, true);
    CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    src = vmm_map(h, offer.vmm_size, {1});
  }
  fill_kernel<<<528, 512>>>(reinterpret_cast<uint32_t*>(src), bytes / 4, 1);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  send_msg(sock, &offer, sizeof(offer), fd);
  char done = 0;
  (void)recv_msg(sock, &done, 1);
  std::_Exit(0);
}

// ---- GPU 0's side ---------------------------------------------------------------------------

struct Setup {
  const char* mode;
  Kind own;        // GPU 0's source and destination
  Kind landing;    // GPU 0's landing slots (the pipeline's) ; oxccl: its staging
  Kind peer;       // GPU 1's source (one-process modes)
  int processes;   // 2: the source comes from a child process
  bool legacy;     // 2 processes: cudaIpc instead of a VMM file descriptor
  uint64_t landing_offset = 0;  // where the slots start in their allocation
  uint64_t extra = 0;           // bytes allocated past the end of the sources and destination
};

struct Runner {
  int reps;
  cudaStream_t main;
  cudaEvent_t start, stop;
  unsigned long long* counters;  // device: [0] words wrong, [1] the first of them
  int failures = 0;

  // Poisons `dst`, runs one loop and checks it holds `want`'s pattern, then times `reps`
  // loops of `once` (begins and ends on the main stream) and prints the median.
  void run(const char* mode, const std::string& name, uint64_t bytes, char* dst, uint32_t want,
           const std::function<void()>& once) {
    const int iters = static_cast<int>(std::max<uint64_t>(1, kLoopBytes / bytes));
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(dst, 0xff, bytes));
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < iters; ++i) once();
    CK(cudaDeviceSynchronize());
    const unsigned long long init[2] = {0, ~0ull};
    CK(cudaMemcpy(counters, init, sizeof(init), cudaMemcpyHostToDevice));
    verify_kernel<<<528, 512>>>(reinterpret_cast<const uint32_t*>(dst), bytes / 4, want, counters, counters + 1);
    CK(cudaGetLastError());
    unsigned long long got[2];
    CK(cudaMemcpy(got, counters, sizeof(got), cudaMemcpyDeviceToHost));
    std::string verdict = "ok";
    if (got[0] != 0) {
      verdict = "FAIL (" + std::to_string(got[0]) + " words wrong, first at byte " + std::to_string(got[1] * 4) + ")";
      ++failures;
    }
    std::vector<double> t;
    for (int rep = 0; rep < reps; ++rep) {
      CK(cudaDeviceSynchronize());
      CK(cudaEventRecord(start, main));
      for (int i = 0; i < iters; ++i) once();
      CK(cudaEventRecord(stop, main));
      CK(cudaEventSynchronize(stop));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start, stop));
      t.push_back(ms * 1e-3 / iters);
    }
    std::sort(t.begin(), t.end());
    const double s = t[t.size() / 2];
    std::printf("%-10s %-12s %11llu B %9.1f us %8.1f GB/s  %s\n", mode, name.c_str(),
                static_cast<unsigned long long>(bytes), s * 1e6, static_cast<double>(bytes) / s * 1e-9,
                verdict.c_str());
    std::fflush(stdout);
  }
};

int run_mode(const Setup& m, uint64_t bytes, int reps) {
  int sock[2] = {-1, -1};
  pid_t pid = -1;
  if (m.processes == 2) {
    // Before any CUDA call in this process: the child must not inherit a context.
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sock) != 0) {
      std::perror("ce_overlap_probe: socketpair");
      return 2;
    }
    std::fflush(stdout);
    pid = fork();
    if (pid < 0) {
      std::perror("ce_overlap_probe: fork");
      return 2;
    }
    if (pid == 0) {
      close(sock[0]);
      child(sock[1], m.legacy, bytes, m.extra);
    }
    close(sock[1]);
  }
  CU(cuInit(0));
  const std::vector<int> both{0, 1}, only0{0};
  char* peer = nullptr;
  if (m.processes == 1) {
    peer = alloc_on(1, bytes + m.extra, m.peer, both);
    if (m.peer == Kind::Malloc) {
      CK(cudaSetDevice(0));
      const cudaError_t e = cudaDeviceEnablePeerAccess(1, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError(); else CK(e);
    }
    CK(cudaSetDevice(1));
    fill_kernel<<<528, 512>>>(reinterpret_cast<uint32_t*>(peer), bytes / 4, 1);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  } else {
    Offer offer{};
    const int fd = recv_msg(sock[0], &offer, sizeof(offer));
    CK(cudaSetDevice(0));
    if (m.legacy) {
      void* p = nullptr;
      CK(cudaIpcOpenMemHandle(&p, offer.legacy, cudaIpcMemLazyEnablePeerAccess));
      peer = static_cast<char*>(p);
    } else {
      if (fd < 0) {
        std::fprintf(stderr, "ce_overlap_probe: no file descriptor from the child\n");
        return 2;
      }
      CUmemGenericAllocationHandle h = 0;
      CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      close(fd);
      peer = vmm_map(h, offer.vmm_size, only0);
    }
  }
  const std::vector<int>& own_access = m.processes == 1 ? both : only0;
  char* src = alloc_on(0, bytes + m.extra, m.own, own_access);
  char* dst = alloc_on(0, bytes + m.extra, m.own, own_access);
  // The pipeline's two slots, landing_offset into their allocation.
  char* spare = alloc_on(0, bytes + m.landing_offset, m.landing, own_access) + m.landing_offset;
  CK(cudaSetDevice(0));
  int sms = 0, clock_khz = 0, smem = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaFuncSetAttribute(busy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  fill_kernel<<<sms * 4, 512>>>(reinterpret_cast<uint32_t*>(src), bytes / 4, 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  Runner r{reps, nullptr, nullptr, nullptr, nullptr};
  cudaStream_t side = nullptr;
  CK(cudaStreamCreateWithFlags(&r.main, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(cudaEventCreate(&r.start));
  CK(cudaEventCreate(&r.stop));
  CK(cudaMalloc(&r.counters, 2 * sizeof(unsigned long long)));
  cudaEvent_t forked, joined, landed[2], mixed[2];
  for (cudaEvent_t* e : {&forked, &joined, &landed[0], &landed[1], &mixed[0], &mixed[1]}) {
    CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  const auto fork_side = [&] {
    CK(cudaEventRecord(forked, r.main));
    CK(cudaStreamWaitEvent(side, forked, 0));
  };
  const auto join_side = [&] {
    CK(cudaEventRecord(joined, side));
    CK(cudaStreamWaitEvent(r.main, joined, 0));
  };
  int unroll = 4;  // the mix kernel's units per thread per iteration (pipe1-K: 1)
  const auto mix = [&](cudaStream_t s, const char* a, const char* b, char* out, uint64_t len) {
    const auto* x = reinterpret_cast<const uint4*>(a);
    const auto* y = reinterpret_cast<const uint4*>(b);
    auto* o = reinterpret_cast<uint4*>(out);
    if (unroll == 1) {
      mix_kernel<1><<<sms, 512, 0, s>>>(x, y, o, len, 0u);
    } else {
      mix_kernel<4><<<sms, 512, 0, s>>>(x, y, o, len, 0u);
    }
    CK(cudaGetLastError());
  };

  r.run(m.mode, "pull", bytes, dst, 1, [&] { CK(cudaMemcpyAsync(dst, peer, bytes, cudaMemcpyDefault, r.main)); });
  r.run(m.mode, "mix", bytes, dst, 0, [&] { mix(r.main, src, spare, dst, bytes); });
  for (const uint64_t chunk : {32 * kMiB, 128 * kMiB}) {
    if (2 * chunk > bytes) continue;
    for (const int variant : {0, 1, 2}) {  // pipe, serial, pipe with mix<1>
      const bool serial = variant == 1;
      unroll = variant == 2 ? 1 : 4;
      const std::string name = std::string(serial ? "serial-" : variant == 2 ? "pipe1-" : "pipe-") +
                               std::to_string(chunk / kMiB);
      r.run(m.mode, name, bytes, dst, 1, [&] {
        cudaStream_t mixer = serial ? side : r.main;
        fork_side();
        for (uint64_t off = 0, i = 0; off < bytes; off += chunk, ++i) {
          const uint64_t len = std::min(chunk, bytes - off);
          const int slot = static_cast<int>(i % 2);
          char* landing = spare + slot * chunk;
          if (i >= 2) CK(cudaStreamWaitEvent(side, mixed[slot], 0));
          CK(cudaMemcpyAsync(landing, peer + off, len, cudaMemcpyDefault, side));
          CK(cudaEventRecord(landed[slot], side));
          CK(cudaStreamWaitEvent(mixer, landed[slot], 0));
          mix(mixer, landing, src + off, dst + off, len);
          CK(cudaEventRecord(mixed[slot], mixer));
        }
        join_side();
      });
    }
  }
  unroll = 4;
  // pipe2-K: pipe-K with the pulls alternating between two side streams (two copies in
  // flight, four landing slots), so one copy's start-up and tail overlap the other's.
  cudaStream_t side2 = nullptr;
  CK(cudaStreamCreateWithFlags(&side2, cudaStreamNonBlocking));
  cudaEvent_t landed4[4], mixed4[4], joined2;
  for (cudaEvent_t* e : {&landed4[0], &landed4[1], &landed4[2], &landed4[3], &mixed4[0],
                         &mixed4[1], &mixed4[2], &mixed4[3], &joined2}) {
    CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  const auto fork_both = [&] {
    CK(cudaEventRecord(forked, r.main));
    CK(cudaStreamWaitEvent(side, forked, 0));
    CK(cudaStreamWaitEvent(side2, forked, 0));
  };
  const auto join_both = [&] {
    CK(cudaEventRecord(joined, side));
    CK(cudaEventRecord(joined2, side2));
    CK(cudaStreamWaitEvent(r.main, joined, 0));
    CK(cudaStreamWaitEvent(r.main, joined2, 0));
  };
  for (const uint64_t chunk : {16 * kMiB, 32 * kMiB, 64 * kMiB}) {
    if (4 * chunk > bytes) continue;
    r.run(m.mode, "pipe2-" + std::to_string(chunk / kMiB), bytes, dst, 1, [&] {
      fork_both();
      for (uint64_t off = 0, i = 0; off < bytes; off += chunk, ++i) {
        const uint64_t len = std::min(chunk, bytes - off);
        const int slot = static_cast<int>(i % 4);
        cudaStream_t copier = (i % 2) ? side2 : side;
        char* landing = spare + slot * chunk;
        if (i >= 4) CK(cudaStreamWaitEvent(copier, mixed4[slot], 0));
        CK(cudaMemcpyAsync(landing, peer + off, len, cudaMemcpyDefault, copier));
        CK(cudaEventRecord(landed4[slot], copier));
        CK(cudaStreamWaitEvent(r.main, landed4[slot], 0));
        mix(r.main, landing, src + off, dst + off, len);
        CK(cudaEventRecord(mixed4[slot], r.main));
      }
      join_both();
    });
    r.run(m.mode, "pulls2-" + std::to_string(chunk / kMiB), bytes, dst, 1, [&] {
      fork_both();
      for (uint64_t off = 0, i = 0; off < bytes; off += chunk, ++i) {
        cudaStream_t copier = (i % 2) ? side2 : side;
        CK(cudaMemcpyAsync(dst + off, peer + off, std::min(chunk, bytes - off), cudaMemcpyDefault, copier));
      }
      join_both();
    });
  }
  // The pulls alone, chunk by chunk, back to back on the side stream (into the destination
  // at their offsets, so the result is checked): what pipe-K's copies cost with no kernel.
  for (const uint64_t chunk : {32 * kMiB, 128 * kMiB}) {
    if (2 * chunk > bytes) continue;
    r.run(m.mode, "pulls-" + std::to_string(chunk / kMiB), bytes, dst, 1, [&] {
      fork_side();
      for (uint64_t off = 0; off < bytes; off += chunk) {
        CK(cudaMemcpyAsync(dst + off, peer + off, std::min(chunk, bytes - off), cudaMemcpyDefault, side));
      }
      join_side();
    });
  }
  const long long spin = static_cast<long long>(static_cast<double>(bytes) / 390e9 * clock_khz * 1e3);
  r.run(m.mode, "pull+busy", bytes, dst, 1, [&] {
    fork_side();
    CK(cudaMemcpyAsync(dst, peer, bytes, cudaMemcpyDefault, side));
    busy_kernel<<<sms, 1024, smem, r.main>>>(spin);
    CK(cudaGetLastError());
    join_side();
  });
  CK(cudaDeviceSynchronize());
  if (m.processes == 2) {
    const char done = 1;
    send_msg(sock[0], &done, 1, -1);
    int status = 0;
    waitpid(pid, &status, 0);
    close(sock[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ce_overlap_probe: the child (GPU 1) failed\n");
      return 2;
    }
  }
  return r.failures == 0 ? 0 : 1;
}

}  // namespace ceoverlap

int main(int argc, char** argv) {
  using namespace ceoverlap;
  const Setup setups[] = {
      {"malloc", Kind::Malloc, Kind::Malloc, Kind::Malloc, 1, false},
      {"vmm", Kind::Vmm, Kind::Vmm, Kind::Vmm, 1, false},
      {"vmm-rdma", Kind::VmmRdma, Kind::VmmRdma, Kind::VmmRdma, 1, false},
      {"ipc-vmm", Kind::VmmRdma, Kind::VmmRdma, Kind::VmmRdma, 2, false},
      {"ipc-legacy", Kind::Malloc, Kind::Malloc, Kind::Malloc, 2, true},
      {"oxccl", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true},
      {"landing-vmm", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 1, false},
      {"oxccl+4K", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 4 << 10},
      {"oxccl+64K", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 64 << 10},
      {"oxccl+1M", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 1 << 20},
      {"oxccl-perf", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 1 << 20, 64},
      {"extra-64K", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 1 << 20, 64 << 10},
      {"extra-2M", Kind::Malloc, Kind::VmmRdma, Kind::Malloc, 2, true, 1 << 20, 2 << 20},
      {"malloc+64", Kind::Malloc, Kind::Malloc, Kind::Malloc, 1, false, 0, 64},
      {"vmm+64", Kind::Vmm, Kind::Vmm, Kind::Vmm, 1, false, 0, 64},
  };
  const std::string which = argc > 1 ? argv[1] : "all";
  const long long mib = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  if (mib < 64) {
    std::fprintf(stderr, "usage: ce_overlap_probe [mode|all] [MiB >= 64] [repetitions]\n");
    return 2;
  }
  const uint64_t bytes = static_cast<uint64_t>(mib) * kMiB;
  // Each mode runs in a process of its own (forked before any CUDA call), so no mode sees
  // another's mappings, peer access or contexts.
  int worst = 0;
  bool any = false;
  for (const Setup& s : setups) {
    if (which != "all" && which != s.mode) continue;
    any = true;
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) std::_Exit(run_mode(s, bytes, reps));
    int status = 0;
    waitpid(pid, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    if (rc != 0) std::printf("# %s: exit %d\n", s.mode, rc);
    worst = std::max(worst, rc);
  }
  if (!any) {
    std::fprintf(stderr, "ce_overlap_probe: unknown mode '%s'\n", which.c_str());
    return 2;
  }
  std::printf("# %s\n", worst == 0 ? "every case checked: ok" : "failures above");
  return worst;
}
