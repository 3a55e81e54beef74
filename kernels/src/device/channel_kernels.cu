// Channel kernels: the MemoryChannel, PortChannel and SwitchChannel operations as
// launchable kernels, for the channel tests and the GPU channel table (ci/gpu-suite
// `channels`). The host backend has the same kernels in channels/src/host_kernels.rs.
//
// Part of the unity build: every name here starts with `channel_` or lives in a namespace.
// Declared `OXCCL_GLOBAL __launch_bounds__(...) void`: their host counterparts live in the
// channels crate, not in the kernels crate's host table, so they are (deliberately) not in
// KERNEL_NAMES, which that table is checked against.
#include "oxccl/abi.h"
#include "oxccl/memory_channel_device.hpp"
#include "oxccl/port_channel_device.hpp"
#include "oxccl/switch_channel_device.hpp"

namespace oxccl {
namespace channel_detail {

/// Nanoseconds from a clock that all SMs share.
OXCCL_DEVICE_INLINE uint64_t now_ns() {
#if defined(OXCCL_DEVICE_CUDA)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return wall_clock64() * 10;  // gfx942's wall clock runs at 100 MHz
#endif
}

OXCCL_DEVICE_INLINE void report(uint32_t* status, WaitResult r) {
  if (status != nullptr) *reinterpret_cast<volatile uint32_t*>(status) = static_cast<uint32_t>(r);
}

}  // namespace channel_detail
}  // namespace oxccl

OXCCL_GLOBAL __launch_bounds__(1024) void channel_memory_op(OxcclMemoryChannelArgs a) {
  using namespace oxccl;
  const MemoryChannelDevice ch{a.channel};
  const uint64_t tid = thread_index();
  const uint64_t n = thread_count();
  const bool leader = tid == 0;
  WaitResult r = WaitResult::Ok;
  switch (a.op) {
    case OXCCL_MEMORY_OP_PUT:
      ch.put(a.dst_offset, a.src_offset, a.bytes, tid, n);
      if (a.signal_after != 0) {
        __syncthreads();
        if (threadIdx.x == 0) ch.signal();
      }
      return;  // nothing waited: status untouched
    case OXCCL_MEMORY_OP_GET:
      ch.get(a.dst_offset, a.src_offset, a.bytes, tid, n);
      return;
    case OXCCL_MEMORY_OP_PUT_PACKETS_LL16:
      ch.put_packets_ll16(a.packet_offset, a.src_offset, a.bytes, a.flag, tid, n);
      return;
    case OXCCL_MEMORY_OP_PUT_PACKETS_LL8:
      ch.put_packets_ll8(a.packet_offset, a.src_offset, a.bytes, a.flag, tid, n);
      return;
    case OXCCL_MEMORY_OP_GET_PACKETS_LL16:
      if (!ch.get_packets_ll16(a.packet_offset, a.dst_offset, a.bytes, a.flag, tid, n)) {
        channel_detail::report(a.status, WaitResult::Timeout);
      }
      return;
    case OXCCL_MEMORY_OP_GET_PACKETS_LL8:
      if (!ch.get_packets_ll8(a.packet_offset, a.dst_offset, a.bytes, a.flag, tid, n)) {
        channel_detail::report(a.status, WaitResult::Timeout);
      }
      return;
    default:
      break;
  }
  if (!leader) return;
  switch (a.op) {
    case OXCCL_MEMORY_OP_SIGNAL:
      for (uint32_t i = 0; i < a.iterations; ++i) ch.signal();
      break;
    case OXCCL_MEMORY_OP_RELAXED_SIGNAL:
      for (uint32_t i = 0; i < a.iterations; ++i) ch.relaxed_signal();
      ch.flush();
      break;
    case OXCCL_MEMORY_OP_WAIT:
      for (uint32_t i = 0; i < a.iterations && r == WaitResult::Ok; ++i) r = ch.wait();
      break;
    case OXCCL_MEMORY_OP_PINGPONG: {
      uint64_t start = 0;
      for (uint32_t i = 0; i < a.iterations && r == WaitResult::Ok; ++i) {
        if (i == 1) start = channel_detail::now_ns();  // round 0 absorbs the launch skew
        if (a.initiator != 0) {
          ch.signal();
          r = ch.wait();
        } else {
          r = ch.wait();
          ch.signal();
        }
      }
      if (a.elapsed_ns != nullptr && a.iterations > 1) *a.elapsed_ns = channel_detail::now_ns() - start;
      break;
    }
    default:
      r = WaitResult::Timeout;
      break;
  }
  channel_detail::report(a.status, r);
}

OXCCL_GLOBAL __launch_bounds__(1024) void channel_port_op(OxcclPortChannelArgs a) {
  using namespace oxccl;
  if (thread_index() != 0) return;
  const PortChannelDevice ch{a.channel};
  WaitResult r = WaitResult::Ok;
  const auto pushed = [](uint64_t slot) OXCCL_INLINE_LAMBDA { return slot == ~uint64_t{0} ? WaitResult::Timeout : WaitResult::Ok; };
  switch (a.op) {
    case OXCCL_PORT_OP_PUT:
      r = pushed(ch.put(a.dst_offset, a.src_offset, a.bytes, a.chunk));
      break;
    case OXCCL_PORT_OP_SIGNAL:
      for (uint32_t i = 0; i < a.iterations && r == WaitResult::Ok; ++i) r = pushed(ch.signal());
      break;
    case OXCCL_PORT_OP_PUT_WITH_SIGNAL:
      r = pushed(ch.put_with_signal(a.dst_offset, a.src_offset, a.bytes, a.chunk));
      break;
    case OXCCL_PORT_OP_PUT_WITH_SIGNAL_AND_FLUSH:
      r = ch.put_with_signal_and_flush(a.dst_offset, a.src_offset, a.bytes, a.chunk);
      break;
    case OXCCL_PORT_OP_FLUSH:
      r = ch.flush();
      break;
    case OXCCL_PORT_OP_WAIT:
      for (uint32_t i = 0; i < a.iterations && r == WaitResult::Ok; ++i) r = ch.wait();
      break;
    case OXCCL_PORT_OP_PINGPONG: {
      uint64_t start = 0;
      for (uint32_t i = 0; i < a.iterations && r == WaitResult::Ok; ++i) {
        if (i == 1) start = channel_detail::now_ns();
        if (a.initiator != 0) {
          r = pushed(ch.signal());
          if (r == WaitResult::Ok) r = ch.wait();
        } else {
          r = ch.wait();
          if (r == WaitResult::Ok) r = pushed(ch.signal());
        }
      }
      if (a.elapsed_ns != nullptr && a.iterations > 1) *a.elapsed_ns = channel_detail::now_ns() - start;
      break;
    }
    default:
      r = WaitResult::Timeout;
      break;
  }
  channel_detail::report(a.status, r);
}

OXCCL_GLOBAL __launch_bounds__(1024) void channel_switch_op(OxcclSwitchChannelArgs a) {
  using namespace oxccl;
  const SwitchChannelDevice ch{a.channel};
  const uint64_t vectors = a.count / 4;
  const uint64_t stride = thread_count();
  char* out = static_cast<char*>(a.out);
  for (uint64_t i = thread_index(); i < vectors; i += stride) {
    if (a.op == OXCCL_SWITCH_OP_REDUCE) {
      store16(out + i * 16, ch.reduce_f32x4(a.offset + i * 16));
    } else if (a.op == OXCCL_SWITCH_OP_BROADCAST) {
      ch.broadcast_f32x4(a.offset + i * 16, load16(out + i * 16));
    }
  }
}
