//! Pinned bounce buffers between device memory and a socket.
//!
//! Each side of a TCP connection that moves device memory owns a [`Staging`]: a stream and a
//! few slots of pinned, device-mapped host memory, each with the event recorded after the
//! last copy that used it. The sender queues the device-to-slot copy of chunk `i + SLOTS`
//! while the socket takes chunk `i`; the receiver queues the slot-to-device copy of a chunk
//! and reads the next one from the socket into another slot. A slot is touched by the host
//! only after its event has completed, and the stream is drained before the slots are freed.

use std::sync::Arc;

use oxccl_backend::{AnyDevice, AnyEvent, AnyHostMemory, AnyStream};
use oxccl_hal::{Device, DevicePtr, Error, Event, HostVisible, Memory, Result, Stream};

use crate::registered_memory::Registration;

/// Bytes a slot carries per chunk. On the host backend (loopback, 256 MiB writes through
/// the slots) 512 KiB and 1 MiB chunks moved 3.7-4.5 GB/s and 4 MiB ones 2.9-3.1: a chunk
/// that stays in cache between its copy and its send is worth more there than fewer
/// calls. On GPUs each chunk costs a copy launch, an event record and a wait, a few
/// microseconds against the hundreds a megabyte takes on the wire.
pub(super) const CHUNK: usize = 1 << 20;
/// Slots per side: one is on the wire while the other is being copied. A device copy
/// of a chunk is several times faster than the socket, so a third slot gained nothing
/// measurable.
pub(super) const SLOTS: usize = 2;
/// Offset of a chunk in its slot. The bytes before it hold the frame header of a write's
/// first chunk, so that header and data leave in one send; device copies start aligned.
pub(super) const DATA_AT: usize = 256;

struct Slot {
    mem: AnyHostMemory,
    /// Recorded after the last copy into or out of this slot.
    done: AnyEvent,
    /// The registration the last copy reads or writes, kept alive until the copy has run.
    keep: Option<Arc<Registration>>,
}

/// A stream and its pinned bounce slots (see the module docs).
pub(super) struct Staging {
    stream: AnyStream,
    slots: Vec<Slot>,
    /// The slot the receiver fills next (round robin across writes).
    next: usize,
    /// Copies were queued since the stream was last drained.
    pending: bool,
}

impl Staging {
    pub(super) fn new(device: &AnyDevice) -> Result<Staging> {
        let stream = device.create_stream()?;
        let slots = (0..SLOTS)
            .map(|_| {
                Ok(Slot {
                    mem: device.alloc_host(DATA_AT + CHUNK)?,
                    done: device.create_event()?,
                    keep: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Staging {
            stream,
            slots,
            next: 0,
            pending: false,
        })
    }

    /// The stream the copies run on (later device writes queued on it follow them).
    pub(super) fn stream(&self) -> &AnyStream {
        &self.stream
    }

    /// The slot the receiver fills next; advances the round robin.
    pub(super) fn take_next(&mut self) -> usize {
        let i = self.next;
        self.next = (i + 1) % SLOTS;
        i
    }

    /// Waits until slot `i`'s last copy has run and releases what it kept alive.
    pub(super) fn wait(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.slots[i % SLOTS];
        let outcome = slot.done.synchronize();
        slot.keep = None;
        outcome
    }

    /// Queues the copy of `n` bytes at byte `at` of `reg`'s range into slot `i`.
    pub(super) fn fill(
        &mut self,
        i: usize,
        reg: &Arc<Registration>,
        at: usize,
        n: usize,
    ) -> Result<()> {
        self.queue(i, reg, at, n, true)
    }

    /// Queues the copy of `n` bytes of slot `i` to byte `at` of `reg`'s range.
    pub(super) fn empty(
        &mut self,
        i: usize,
        reg: &Arc<Registration>,
        at: usize,
        n: usize,
    ) -> Result<()> {
        self.queue(i, reg, at, n, false)
    }

    /// Queues the copy between slot `i` and `n` bytes at byte `at` of `reg`'s range: into
    /// the slot when `into_slot`, else out of it; then records the slot's event.
    fn queue(
        &mut self,
        i: usize,
        reg: &Arc<Registration>,
        at: usize,
        n: usize,
        into_slot: bool,
    ) -> Result<()> {
        let range = device_range(reg, at, n)?;
        let slot = &mut self.slots[i % SLOTS];
        let data = slot.mem.ptr().offset(DATA_AT)?;
        let (to, from) = if into_slot {
            (data, range)
        } else {
            (range, data)
        };
        slot.keep = Some(Arc::clone(reg));
        self.pending = true;
        // SAFETY: `range` is `n <= CHUNK` bytes inside `reg`'s range (device_range), and
        // `reg` is held in the slot until its event has been waited for or the stream
        // drained; the slot holds DATA_AT + CHUNK bytes and lives as long as `self`, whose
        // drop drains the stream, and the host leaves it alone until its event (recorded
        // next) completes. A slot and a registration are different allocations.
        unsafe { self.stream.copy(to, from, n) }?;
        self.stream.record(&slot.done)
    }

    /// Slot `i`'s bytes from `DATA_AT - before` to `DATA_AT + n`.
    ///
    /// The caller must have waited for the slot's last copy ([`Staging::wait`]).
    pub(super) fn bytes(&mut self, i: usize, before: usize, n: usize) -> &mut [u8] {
        assert!(before <= DATA_AT && n <= CHUNK, "slot range out of bounds");
        let slot = &self.slots[i % SLOTS];
        // SAFETY: the slot is a live pinned allocation of DATA_AT + CHUNK bytes (range
        // asserted above); `&mut self` makes this the only reference to it on the host, and
        // its last copy has completed (the caller waited), so no device copy touches it.
        unsafe {
            std::slice::from_raw_parts_mut(slot.mem.host_ptr().add(DATA_AT - before), before + n)
        }
    }

    /// Waits for every queued copy, then releases what the slots kept alive.
    pub(super) fn drain(&mut self) -> Result<()> {
        if !self.pending {
            return Ok(());
        }
        let outcome = self.stream.synchronize();
        for slot in &mut self.slots {
            slot.keep = None;
        }
        self.pending = false;
        outcome
    }
}

/// Device address of `n <= CHUNK` bytes at byte `at` of `reg`'s registered range.
fn device_range(reg: &Registration, at: usize, n: usize) -> Result<DevicePtr> {
    let fits = n <= CHUNK && at.checked_add(n).is_some_and(|end| end <= reg.len);
    if !fits {
        return Err(Error::InvalidArgument(format!(
            "bounce copy of {n} bytes at offset {at} of a {}-byte registration",
            reg.len
        )));
    }
    reg.ptr_at(at)
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The slots are freed after this: no copy may still use them.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(error = %e, "TCP staging stream failed while closing");
        }
    }
}
