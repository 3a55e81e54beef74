// oxccl/port_channel_device.hpp: device side of a PortChannel (OxcclPortChannel in abi.h).
//
// The GPU never touches the peer's memory: it pushes triggers into the FIFO and the proxy
// thread of its process performs them through the connection (copy engine, RDMA, TCP).
// put = DATA trigger; signal = FLAG trigger (the proxy stores ++outbound into the peer's
// inbound counter after every earlier write of the connection landed); flush = SYNC trigger
// and a wait until the proxy consumed it. The peer waits on its own inbound counter, which
// is a host-to-device semaphore from its point of view.
//
// All calls are made by ONE thread (the caller elects it); sizes above
// OXCCL_TRIGGER_MAX_SIZE are split into several DATA triggers.
#ifndef OXCCL_PORT_CHANNEL_DEVICE_HPP_
#define OXCCL_PORT_CHANNEL_DEVICE_HPP_

#include "abi.h"
#include "fifo_device.hpp"
#include "semaphore.hpp"

namespace oxccl {

struct PortChannelDevice {
  OxcclPortChannel h;

  OXCCL_DEVICE_INLINE FifoDevice fifo() const { return FifoDevice{h.fifo}; }

  /// Pushes DATA triggers for `bytes` bytes, at most `chunk` (<= MAX_SIZE) each; `kind_last`
  /// is OR-ed into the last one (FLAG and/or SYNC). Returns the last slot or ~0 on timeout.
  OXCCL_DEVICE_INLINE uint64_t put_kinds(uint64_t dst_offset, uint64_t src_offset,
                                         uint64_t bytes, uint64_t chunk, uint32_t kind_last) const {
    if (bytes == 0 && kind_last == 0) return 0;  // nothing to do; not a timeout
    if (chunk == 0 || chunk > OXCCL_TRIGGER_MAX_SIZE) chunk = OXCCL_TRIGGER_MAX_SIZE;
    uint64_t slot = ~uint64_t{0};
    uint64_t done = 0;
    do {
      const uint64_t n = bytes - done < chunk ? bytes - done : chunk;
      const bool last = done + n >= bytes;
      const uint32_t kind = (n != 0 ? OXCCL_TRIGGER_DATA : 0u) | (last ? kind_last : 0u);
      if (kind != 0) {
        slot = fifo().push(make_trigger(kind, h.semaphore_id, h.dst_memory_id, h.src_memory_id,
                                        dst_offset + done, src_offset + done,
                                        static_cast<uint32_t>(n)),
                           h.semaphore.max_spins);
        if (slot == ~uint64_t{0}) return slot;
      }
      done += n;
    } while (done < bytes);
    return slot;
  }

  /// Asks the proxy to copy `bytes` from the source memory to the destination memory.
  OXCCL_DEVICE_INLINE uint64_t put(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                                   uint64_t chunk = 0) const {
    return put_kinds(dst_offset, src_offset, bytes, chunk, 0);
  }

  /// Signals the peer after every earlier put of this channel has landed.
  OXCCL_DEVICE_INLINE uint64_t signal() const {
    return fifo().push(make_trigger(OXCCL_TRIGGER_FLAG, h.semaphore_id, h.dst_memory_id,
                                    h.src_memory_id, 0, 0, 0),
                       h.semaphore.max_spins);
  }

  /// put() then signal(), in as few triggers as possible.
  OXCCL_DEVICE_INLINE uint64_t put_with_signal(uint64_t dst_offset, uint64_t src_offset,
                                               uint64_t bytes, uint64_t chunk = 0) const {
    return put_kinds(dst_offset, src_offset, bytes, chunk, OXCCL_TRIGGER_FLAG);
  }

  /// put_with_signal() then flush().
  OXCCL_DEVICE_INLINE WaitResult put_with_signal_and_flush(uint64_t dst_offset,
                                                           uint64_t src_offset, uint64_t bytes,
                                                           uint64_t chunk = 0) const {
    const uint64_t slot = put_kinds(dst_offset, src_offset, bytes, chunk,
                                    OXCCL_TRIGGER_FLAG | OXCCL_TRIGGER_SYNC);
    if (slot == ~uint64_t{0}) return WaitResult::Timeout;
    return fifo().sync(slot, h.semaphore.max_spins);
  }

  /// Waits until the proxy has performed (and the connection completed) every trigger
  /// pushed before.
  OXCCL_DEVICE_INLINE WaitResult flush() const {
    const uint64_t slot = fifo().push(make_trigger(OXCCL_TRIGGER_SYNC, h.semaphore_id,
                                                   h.dst_memory_id, h.src_memory_id, 0, 0, 0),
                                      h.semaphore.max_spins);
    if (slot == ~uint64_t{0}) return WaitResult::Timeout;
    return fifo().sync(slot, h.semaphore.max_spins);
  }

  /// Waits for the peer's next signal.
  OXCCL_DEVICE_INLINE WaitResult wait() const { return HostDeviceSemaphore{h.semaphore}.wait(); }
};

}  // namespace oxccl

#endif  // OXCCL_PORT_CHANNEL_DEVICE_HPP_
