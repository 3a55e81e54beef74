// A local copy for the copy-engine algorithms (collectives/src/algorithms/copy_lane.rs):
// this rank's own data, moved by the SMs on the caller's stream while the copy engine
// moves the peers' on a second stream. Two copy-engine copies at once slowed each other
// (2 H200s: an out-of-place 1 GiB broadcast_copy took 3.66 ms with both on the copy
// engine, 2.76 ms with the peer copy alone). Any alignment: aligned whole 16-byte units as
// one load and one store, the rest byte by byte (load_unit / store_unit).
#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"

OXCCL_GLOBAL OXCCL_LAUNCH_BOUNDS(512) void oxccl_copy(const OXCCL_GRID_CONSTANT OxcclCopyArgs param) {
  const OxcclCopyArgs& a = oxccl::kernel_args(param);
  using namespace oxccl::allreduce;
  const uint64_t units = (a.bytes + 15) / 16;
  for (uint64_t u = oxccl::thread_index(); u < units; u += oxccl::thread_count()) {
    store_unit(a.dst, u * 16, load_unit(a.src, u * 16, a.bytes), a.bytes);
  }
}
