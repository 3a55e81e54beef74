//! The PortChannel FIFO: triggers from producers (GPU threads) to the proxy thread.
//!
//! Layout ([`OxcclFifo`]): a ring of `size` 16-byte [`OxcclProxyTrigger`] slots and the
//! `tail` counter in host-visible memory (the proxy reads and writes them at host speed;
//! GPUs write slots and read `tail` over PCIe), and the `head` counter in device memory
//! (only producers touch it). The protocol is in `fifo_device.hpp`; [`host_push`] is that
//! code in Rust for the host backend, line by line, and [`FifoConsumer`] is the proxy side:
//! 1. a producer claims slot `head++` and waits while `slot >= tail + size` (back-pressure:
//!    a full FIFO stalls the producer, a slot is never overwritten); the last tail read is
//!    cached in `head[1]`, so a producer reads `tail` (over PCIe, on a GPU) only when the
//!    cached value does not show room;
//! 2. it writes `snd`, then `fst` with release; `fst != 0` marks the slot full;
//! 3. the consumer acquires `fst`, reads `snd`, performs the trigger, zeroes `fst`, and
//!    release-stores `tail = slot + 1`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_backend::{AnyDevice, AnyHostMemory, AnyMemory};
use oxccl_hal::{Device, Error, HostVisible, Memory, MemoryKind, Result};
use oxccl_kernels::abi::{self, OxcclFifo, OxcclProxyTrigger};

use crate::backing::zeroed_device;
use crate::semaphore::host_poll;

/// Slots of a FIFO when the caller has no preference.
pub const DEFAULT_FIFO_SIZE: u32 = 512;
/// Offset of `tail` after the ring, on its own cache line.
const TAIL_PAD: usize = 64;

/// What a trigger asks the proxy to do (bits, so one trigger can do several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggerKind(pub u32);

impl TriggerKind {
    /// Copy `size` bytes from the source memory to the destination memory.
    pub const DATA: TriggerKind = TriggerKind(abi::OXCCL_TRIGGER_DATA);
    /// Signal the peer's semaphore (after the data of this and earlier triggers).
    pub const FLAG: TriggerKind = TriggerKind(abi::OXCCL_TRIGGER_FLAG);
    /// Flush the connection before the tail passes this trigger.
    pub const SYNC: TriggerKind = TriggerKind(abi::OXCCL_TRIGGER_SYNC);

    /// Whether every bit of `other` is set here.
    pub fn has(self, other: TriggerKind) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for TriggerKind {
    type Output = TriggerKind;
    fn bitor(self, rhs: TriggerKind) -> TriggerKind {
        TriggerKind(self.0 | rhs.0)
    }
}

/// A decoded trigger (the layout is in `abi_channels.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    /// What to do.
    pub kind: TriggerKind,
    /// The proxy's semaphore (and connection) id.
    pub semaphore_id: u32,
    /// The proxy's id of the destination (remote) memory.
    pub dst_memory_id: u32,
    /// The proxy's id of the source (local) memory.
    pub src_memory_id: u32,
    /// Byte offset in the destination.
    pub dst_offset: u32,
    /// Byte offset in the source.
    pub src_offset: u32,
    /// Bytes to copy.
    pub size: u32,
}

impl Trigger {
    /// Encodes the trigger as the two FIFO words (what `make_trigger` does on the device).
    ///
    /// Fails when a field does not fit its bits or the kind is empty.
    pub fn encode(&self) -> Result<OxcclProxyTrigger> {
        if self.kind.0 == 0 || self.kind.0 > 7 {
            return Err(Error::InvalidArgument(format!(
                "trigger kind {:#x}",
                self.kind.0
            )));
        }
        if self.semaphore_id >= abi::OXCCL_TRIGGER_MAX_SEMAPHORES
            || self.dst_memory_id >= abi::OXCCL_TRIGGER_MAX_MEMORIES
            || self.src_memory_id >= abi::OXCCL_TRIGGER_MAX_MEMORIES
        {
            return Err(Error::InvalidArgument(format!(
                "trigger ids out of range (semaphore {}, memories {}/{})",
                self.semaphore_id, self.dst_memory_id, self.src_memory_id
            )));
        }
        let fst = (u64::from(self.kind.0) << abi::OXCCL_TRIGGER_KIND_SHIFT)
            | (u64::from(self.semaphore_id) << abi::OXCCL_TRIGGER_SEMAPHORE_SHIFT)
            | (u64::from(self.dst_memory_id) << abi::OXCCL_TRIGGER_DST_MEMORY_SHIFT)
            | (u64::from(self.src_memory_id) << abi::OXCCL_TRIGGER_SRC_MEMORY_SHIFT)
            | u64::from(self.size);
        let snd = (u64::from(self.dst_offset) << 32) | u64::from(self.src_offset);
        Ok(OxcclProxyTrigger { fst, snd })
    }

    /// Decodes the two FIFO words.
    pub fn decode(t: OxcclProxyTrigger) -> Trigger {
        let field = |shift: u32, bits: u32| ((t.fst >> shift) & ((1u64 << bits) - 1)) as u32;
        Trigger {
            kind: TriggerKind(field(abi::OXCCL_TRIGGER_KIND_SHIFT, 3)),
            semaphore_id: field(abi::OXCCL_TRIGGER_SEMAPHORE_SHIFT, 9),
            dst_memory_id: field(abi::OXCCL_TRIGGER_DST_MEMORY_SHIFT, 10),
            src_memory_id: field(abi::OXCCL_TRIGGER_SRC_MEMORY_SHIFT, 10),
            size: t.fst as u32,
            dst_offset: (t.snd >> 32) as u32,
            src_offset: t.snd as u32,
        }
    }
}

/// A FIFO's memory: the ring and tail (host-visible) and the head (device memory).
pub struct Fifo {
    ring: AnyHostMemory,
    head: std::sync::Arc<AnyMemory>,
    size: u32,
}

impl fmt::Debug for Fifo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fifo").field("size", &self.size).finish()
    }
}

impl Fifo {
    /// Allocates a FIFO of `size` slots (a power of two) on `device`.
    pub fn new(device: &AnyDevice, size: u32) -> Result<Fifo> {
        if !size.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "FIFO size {size} is not a power of two"
            )));
        }
        let ring_bytes = size as usize * size_of::<OxcclProxyTrigger>();
        let ring = device.alloc_host(ring_bytes + TAIL_PAD)?;
        // SAFETY: the allocation is fresh and `ring_bytes + TAIL_PAD` long; nobody else
        // knows it yet. Pinned host memory is not guaranteed zeroed on every backend.
        unsafe { std::ptr::write_bytes(ring.host_ptr(), 0, ring_bytes + TAIL_PAD) };
        // head[0]: the next slot; head[1]: the cached tail.
        let head = zeroed_device(device, 16, MemoryKind::Plain)?;
        Ok(Fifo { ring, head, size })
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.size
    }

    fn tail_offset(&self) -> usize {
        self.size as usize * size_of::<OxcclProxyTrigger>()
    }

    /// The device handle (valid while `self` lives).
    pub fn handle(&self) -> Result<OxcclFifo> {
        Ok(OxcclFifo {
            triggers: abi::ptr(self.ring.ptr()),
            head: abi::ptr(self.head.ptr()),
            tail: abi::ptr(self.ring.ptr().offset(self.tail_offset())?),
            size: self.size,
            _pad0: 0,
        })
    }

    /// The consumer (proxy) side. Exactly one consumer may exist per FIFO.
    pub(crate) fn consumer(&self) -> FifoConsumer {
        let base = self.ring.host_ptr();
        FifoConsumer {
            ring: base.cast::<OxcclProxyTrigger>(),
            tail: base.wrapping_add(self.tail_offset()).cast::<u64>(),
            size: self.size,
            next: 0,
        }
    }
}

/// The proxy's end of a FIFO. Holds raw host addresses: the owner of the [`Fifo`] keeps it
/// alive for as long as the consumer is used.
#[derive(Debug)]
pub(crate) struct FifoConsumer {
    ring: *mut OxcclProxyTrigger,
    tail: *mut u64,
    size: u32,
    next: u64,
}

// SAFETY: the pointers name host memory shared by design with other agents; the consumer
// only touches it atomically, from one thread at a time (it is moved, not shared).
unsafe impl Send for FifoConsumer {}

impl FifoConsumer {
    fn slot(&self) -> (&AtomicU64, &AtomicU64) {
        let p = self
            .ring
            .wrapping_add((self.next & u64::from(self.size - 1)) as usize);
        // SAFETY: `p` is a slot of the live ring (index masked by size - 1); both words
        // are 8-byte aligned and accessed only atomically by every agent.
        unsafe {
            (
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*p).fst)),
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*p).snd)),
            )
        }
    }

    /// The next trigger, if a producer has written it.
    pub(crate) fn peek(&self) -> Option<OxcclProxyTrigger> {
        let (fst, snd) = self.slot();
        let f = fst.load(Ordering::Acquire);
        (f != 0).then(|| OxcclProxyTrigger {
            fst: f,
            snd: snd.load(Ordering::Relaxed),
        })
    }

    /// Retires the trigger returned by `peek`: empties its slot and advances the tail,
    /// which releases the slot to producers (and completes a flush waiting on it).
    pub(crate) fn pop(&mut self) {
        let (fst, _) = self.slot();
        fst.store(0, Ordering::Relaxed);
        self.next += 1;
        // SAFETY: `tail` is the FIFO's live, aligned tail counter, accessed atomically.
        unsafe { AtomicU64::from_ptr(self.tail) }.store(self.next, Ordering::Release);
    }
}

/// `FifoDevice::push` of fifo_device.hpp on the host: claims a slot, waits for room
/// (back-pressure, at most `max_spins` polls), writes the trigger. Returns the slot.
///
/// # Safety
/// `fifo` must be the handle of a live [`Fifo`] of the host backend (host-addressable
/// head, ring and tail).
pub unsafe fn host_push(fifo: &OxcclFifo, t: OxcclProxyTrigger, max_spins: u64) -> Result<u64> {
    // SAFETY: the caller's obligations: head is a live aligned counter, accessed atomically.
    let slot = unsafe { AtomicU64::from_ptr(fifo.head) }.fetch_add(1, Ordering::Relaxed);
    let size = u64::from(fifo.size);
    if slot >= size {
        let need = slot - size + 1;
        // SAFETY: head[1], the live FIFO's cached tail, accessed atomically.
        let cached = unsafe { AtomicU64::from_ptr(fifo.head.add(1)) };
        if cached.load(Ordering::Acquire) < need {
            // SAFETY: the tail counter of the live FIFO.
            let seen = unsafe { host_poll(fifo.tail, need, max_spins, "FIFO tail (full FIFO)") }?;
            cached.store(seen, Ordering::Release);
        }
    }
    let p = fifo.triggers.wrapping_add((slot & (size - 1)) as usize);
    // SAFETY: a slot of the live ring, claimed by this producer alone (head) and released
    // by the consumer (tail acquired above); both words accessed atomically.
    unsafe {
        AtomicU64::from_ptr(std::ptr::addr_of_mut!((*p).snd)).store(t.snd, Ordering::Relaxed);
        AtomicU64::from_ptr(std::ptr::addr_of_mut!((*p).fst)).store(t.fst, Ordering::Release);
    }
    Ok(slot)
}

/// `FifoDevice::sync`: waits until the consumer has retired `slot`.
///
/// # Safety
/// As [`host_push`].
pub unsafe fn host_sync(fifo: &OxcclFifo, slot: u64, max_spins: u64) -> Result<()> {
    // SAFETY: the caller's obligations.
    unsafe { host_poll(fifo.tail, slot + 1, max_spins, "FIFO tail (flush)") }.map(|_| ())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::semaphore::testing::device;

    /// The FIFO handle shared by producer threads (its pointers are host memory that every
    /// producer only touches through the FIFO protocol's atomics).
    struct Handle(OxcclFifo);
    // SAFETY: see above; the FIFO outlives the scoped threads.
    unsafe impl Sync for Handle {}

    #[test]
    fn triggers_round_trip_and_bad_fields_are_refused() {
        let t = Trigger {
            kind: TriggerKind::DATA | TriggerKind::FLAG,
            semaphore_id: 511,
            dst_memory_id: 1023,
            src_memory_id: 5,
            dst_offset: u32::MAX,
            src_offset: 7,
            size: 0xffff_fff0,
        };
        let e = t.encode().unwrap();
        assert_ne!(e.fst, 0);
        assert_eq!(Trigger::decode(e), t);
        assert!(Trigger {
            semaphore_id: 512,
            ..t
        }
        .encode()
        .is_err());
        assert!(Trigger {
            kind: TriggerKind(0),
            ..t
        }
        .encode()
        .is_err());
        assert!(Fifo::new(&device(), 6).is_err());
    }

    /// A 4-slot FIFO, three producers pushing 3000 triggers each, a consumer that stalls
    /// now and then: every trigger arrives exactly once, in each producer's order, and the
    /// producers never ran more than 4 slots ahead of the consumer (no overwrite).
    #[test]
    fn small_fifo_wraps_under_back_pressure_without_loss() {
        const PRODUCERS: u32 = 3;
        const EACH: u32 = 3000;
        let fifo = Fifo::new(&device(), 4).unwrap();
        let h = fifo.handle().unwrap();
        let mut consumer = fifo.consumer();
        let shared = Handle(h);
        let seen = std::thread::scope(|s| {
            for p in 0..PRODUCERS {
                let shared = &shared;
                s.spawn(move || {
                    let h = shared.0;
                    for i in 0..EACH {
                        let t = Trigger {
                            kind: TriggerKind::DATA,
                            semaphore_id: p,
                            dst_memory_id: 0,
                            src_memory_id: 0,
                            dst_offset: i,
                            src_offset: !i,
                            size: i ^ 0x5a5a,
                        };
                        // SAFETY: the handle of a live host-backend FIFO.
                        unsafe { host_push(&h, t.encode().unwrap(), 1 << 40) }.unwrap();
                    }
                });
            }
            let mut seen = Vec::new();
            let mut polls = 0u64;
            while seen.len() < (PRODUCERS * EACH) as usize {
                // SAFETY: the head counter of the live FIFO, read atomically.
                let head = unsafe { AtomicU64::from_ptr(h.head) }.load(Ordering::Acquire);
                assert!(
                    head <= seen.len() as u64 + 4 + u64::from(PRODUCERS),
                    "head ran ahead"
                );
                match consumer.peek() {
                    Some(raw) => {
                        seen.push(Trigger::decode(raw));
                        consumer.pop();
                        if seen.len() % 97 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                    None => {
                        polls += 1;
                        assert!(polls < 1 << 32, "consumer starved");
                        std::thread::yield_now();
                    }
                }
            }
            seen
        });
        for p in 0..PRODUCERS {
            let mine: Vec<u32> = seen
                .iter()
                .filter(|t| t.semaphore_id == p)
                .map(|t| t.dst_offset)
                .collect();
            assert_eq!(mine, (0..EACH).collect::<Vec<_>>(), "producer {p}");
            assert!(seen
                .iter()
                .filter(|t| t.semaphore_id == p)
                .all(|t| t.src_offset == !t.dst_offset && t.size == t.dst_offset ^ 0x5a5a));
        }
        assert!(consumer.peek().is_none());
    }

    #[test]
    fn full_fifo_without_consumer_is_a_timeout_not_an_overwrite() {
        let fifo = Fifo::new(&device(), 2).unwrap();
        let h = fifo.handle().unwrap();
        let t = Trigger {
            kind: TriggerKind::SYNC,
            semaphore_id: 0,
            dst_memory_id: 0,
            src_memory_id: 0,
            dst_offset: 0,
            src_offset: 0,
            size: 0,
        }
        .encode()
        .unwrap();
        // SAFETY: the handle of a live host-backend FIFO.
        unsafe {
            host_push(&h, t, 100).unwrap();
            host_push(&h, t, 100).unwrap();
            let e = host_push(&h, OxcclProxyTrigger { fst: 1, snd: 2 }, 100).unwrap_err();
            assert!(e.to_string().contains("full FIFO"), "{e}");
        }
        let c = fifo.consumer();
        assert_eq!(c.peek(), Some(t), "slot 0 kept its trigger");
    }

    /// A producer reads `tail` only when the cached tail (head[1]) does not show room: with
    /// the real tail hidden (set back to 0), a push the cache clears still goes in, and the
    /// first one it does not clear reads the tail and times out.
    #[test]
    fn the_cached_tail_spares_tail_reads_until_the_ring_may_be_full() {
        let fifo = Fifo::new(&device(), 2).unwrap();
        let h = fifo.handle().unwrap();
        let mut c = fifo.consumer();
        let t = OxcclProxyTrigger { fst: 1, snd: 2 };
        // SAFETY: the handle of a live host-backend FIFO; its counters are accessed
        // atomically.
        unsafe {
            let cached = AtomicU64::from_ptr(h.head.add(1));
            let tail = AtomicU64::from_ptr(h.tail);
            for slot in 0..2 {
                assert_eq!(host_push(&h, t, 100).unwrap(), slot);
            }
            assert_eq!(
                cached.load(Ordering::Relaxed),
                0,
                "no tail read within the ring"
            );
            c.pop();
            c.pop();
            // Slot 2 needs tail >= 1: the cache (0) does not show it, the tail (2) does.
            assert_eq!(host_push(&h, t, 100).unwrap(), 2);
            assert_eq!(cached.load(Ordering::Relaxed), 2);
            c.pop();
            tail.store(0, Ordering::Release);
            // Slot 3 needs tail >= 2: the cache shows it, the hidden tail is not read.
            assert_eq!(host_push(&h, t, 100).unwrap(), 3);
            // Slot 4 needs tail >= 3: only the tail could show it, and it reads 0.
            let e = host_push(&h, t, 100).unwrap_err();
            assert!(e.to_string().contains("full FIFO"), "{e}");
        }
    }
}
