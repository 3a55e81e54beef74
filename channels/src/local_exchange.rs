//! Small all-gathers between the ranks of one node through shared host memory.
//!
//! The bootstrap's all-gather is a round trip over TCP: a send, a reader thread the kernel
//! wakes, a condition variable; about 6 us per exchange between two processes of one H100
//! machine. An exchange made on every call (zero-copy on unregistered buffers sends a few
//! hundred bytes per call) goes through a region of host memory every rank of the node
//! maps instead: each rank writes its record and waits on its peers' sequence words, with
//! no system call while the peers are on time.
//!
//! Layout: one region per rank, a sequence word on its own cache line and two slots taken
//! in turn by call parity. Rank r writes call s into its slot s % 2, then publishes s + 1
//! in its sequence word (release); a peer reads the slot once it sees at least s + 1
//! (acquire). Rank r writes slot s % 2 again only in call s + 2, which it starts after
//! every peer published s + 2, that is after every peer finished reading call s. A record
//! larger than a slot is marked as such: every rank sees the mark, and the whole exchange
//! goes through the bootstrap, so the ranks never take different paths.
//!
//! Waits spin for 50 us, then yield, then sleep in 20 us steps past 1 ms; they end on the
//! call's bound, when the bootstrap is aborted ([`Bootstrap::abort`]) or when a peer's
//! connection closes (it died).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use oxccl_hal::host::{HostBackend, HostDevice, HostImport, HostMemory};
use oxccl_hal::{Backend, Device, DeviceId, Error, HostVisible, IpcHandle, MemoryKind, Result};

use crate::bootstrap::Bootstrap;

/// A sequence word's cache line (two lines: the adjacent-line prefetcher pairs them).
const LINE: usize = 128;
/// One slot: a length word and the record.
const SLOT: usize = 2048;
const LEN_BYTES: usize = 8;
/// The largest record carried in shared memory; larger ones go through the bootstrap.
pub const MAX_LOCAL_RECORD: usize = SLOT - LEN_BYTES;
/// One rank's region: its sequence word, then its two slots.
const STRIDE: usize = LINE + 2 * SLOT;
/// A slot's length word when its record did not fit.
const OVERSIZE: u64 = u64::MAX;
/// Spinning, then yielding, then sleeping: the thresholds of a wait.
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_millis(1);
const NAP: Duration = Duration::from_micros(20);

/// The region, owned by the rank that made it (rank 0) or mapped from it.
#[derive(Debug)]
enum Region {
    Owner(HostMemory),
    Peer(HostImport),
}

/// The node's shared exchange region, mapped by every rank (see the module docs).
#[derive(Debug)]
pub struct LocalExchange {
    /// The mapping `base` points into.
    _region: Region,
    base: *mut u8,
    rank: u32,
    world: u32,
    /// Exchanges made so far; held for the whole exchange (one at a time per rank).
    calls: Mutex<u64>,
    /// Keeps the import's IPC cache alive as long as the mapping.
    _device: HostDevice,
}

// SAFETY: `base` points into the mapping `region` keeps alive for the struct's lifetime;
// every access through it is to atomics or is ordered by the sequence-word protocol, and
// a rank's own writes are serialized by `calls`.
unsafe impl Send for LocalExchange {}
// SAFETY: as for Send.
unsafe impl Sync for LocalExchange {}

impl LocalExchange {
    /// Maps one region made by rank 0 on every rank (collective: two all-gathers through
    /// `bootstrap`). `Ok(None)` on every rank when any rank could not (no memfd, no fd
    /// passing between the processes): the callers keep to the bootstrap. Only for ranks
    /// of one node (the caller checks, e.g. [`crate::hosts::Hosts::single_node`]).
    pub fn new(bootstrap: &Bootstrap) -> Result<Option<LocalExchange>> {
        let (rank, world) = (bootstrap.rank(), bootstrap.world_size());
        let bytes = STRIDE * world as usize;
        let device = HostBackend::open_device(DeviceId(0));
        // Rank 0 makes and offers the region; the others offer nothing.
        let made = match (&device, rank) {
            (Ok(d), 0) => d
                .alloc(bytes, MemoryKind::Plain)
                .and_then(|m| d.export_memory(&m).map(|h| Some((m, h)))),
            _ => Ok(None),
        };
        let offer = match &made {
            Ok(Some((_, handle))) => [vec![1u8], handle.to_bytes()].concat(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::debug!(rank, error = %e, "no local exchange region");
                vec![0u8]
            }
        };
        let offers = bootstrap.all_gather(&offer)?;
        let Some((&1, handle)) = offers[0].split_first() else {
            return Ok(None); // rank 0 could not make it, and every rank knows
        };
        let region = match (device, made) {
            (Ok(d), Ok(Some((m, _)))) => Ok((d, Region::Owner(m))),
            (Ok(d), Ok(None)) => IpcHandle::from_bytes(handle)
                .and_then(|h| d.import_memory(&h))
                .map(|i| (d, Region::Peer(i))),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let mapped = match &region {
            Ok(_) => 1u8,
            Err(e) => {
                tracing::debug!(rank, error = %e, "local exchange region not mapped");
                0
            }
        };
        let every = bootstrap.all_gather(&[mapped])?;
        if every.iter().any(|m| m.as_slice() != [1]) {
            return Ok(None);
        }
        let (device, region) = region?;
        let base = match &region {
            Region::Owner(m) => m.host_ptr(),
            Region::Peer(i) => i.host_ptr(),
        };
        Ok(Some(LocalExchange {
            _region: region,
            base,
            rank,
            world,
            calls: Mutex::new(0),
            _device: device,
        }))
    }

    /// Gathers every rank's `data` (lengths may differ); entry `r` is rank `r`'s. Every
    /// rank of the node must make the same sequence of exchanges. Waits at most
    /// `timeout` for each peer.
    pub fn all_gather(
        &self,
        bootstrap: &Bootstrap,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let s = *calls;
        *calls += 1;
        let parity = (s % 2) as usize;
        let fits = data.len() <= MAX_LOCAL_RECORD;
        let mine = self.slot(self.rank, parity);
        // SAFETY: this rank's slot `parity` (SLOT bytes inside the mapping) is read by
        // no peer now: they finished reading call s - 2 before publishing s - 1, which
        // this rank waited for in its last exchange (module docs).
        unsafe {
            if fits {
                std::ptr::copy_nonoverlapping(data.as_ptr(), mine.add(LEN_BYTES), data.len());
                mine.cast::<u64>().write(data.len() as u64);
            } else {
                mine.cast::<u64>().write(OVERSIZE);
            }
        }
        self.sequence(self.rank).store(s + 1, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut out = vec![Vec::new(); self.world as usize];
        let mut oversize = !fits;
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            self.wait(bootstrap, peer, s + 1, deadline, timeout)?;
            let theirs = self.slot(peer, parity);
            // SAFETY: the peer published call s (acquire above), so its slot `parity`
            // holds call s's record and is not written again before this rank publishes
            // call s + 1.
            let len = unsafe { theirs.cast::<u64>().read() };
            if len == OVERSIZE {
                oversize = true;
                continue;
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= MAX_LOCAL_RECORD)
                .ok_or_else(|| {
                    Error::Ipc(format!("rank {peer}'s local exchange slot is malformed"))
                })?;
            // SAFETY: as for the length; `len` bytes lie inside the slot (checked).
            out[peer as usize] =
                unsafe { std::slice::from_raw_parts(theirs.add(LEN_BYTES), len) }.to_vec();
        }
        if oversize {
            return bootstrap.all_gather_within(data, timeout);
        }
        out[self.rank as usize] = data.to_vec();
        Ok(out)
    }

    /// Waits until `peer`'s sequence word reaches `want`.
    fn wait(
        &self,
        bootstrap: &Bootstrap,
        peer: u32,
        want: u64,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let word = self.sequence(peer);
        let start = Instant::now();
        loop {
            if word.load(Ordering::Acquire) >= want {
                return Ok(());
            }
            let now = Instant::now();
            let waited = now.duration_since(start);
            if waited < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if let Some(e) = bootstrap.peer_failure(peer) {
                return Err(e);
            }
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("rank {peer} (local exchange)"),
                    waited: timeout,
                });
            }
            if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }

    fn region_of(&self, rank: u32) -> *mut u8 {
        // SAFETY: rank < world, so the offset lies inside the STRIDE * world bytes mapped.
        unsafe { self.base.add(rank as usize * STRIDE) }
    }

    fn sequence(&self, rank: u32) -> &AtomicU64 {
        // SAFETY: the word is 8-byte aligned (page-aligned base, STRIDE a multiple of 8),
        // lives as long as `self` (the mapping), and is only accessed atomically.
        unsafe { &*self.region_of(rank).cast::<AtomicU64>() }
    }

    fn slot(&self, rank: u32, parity: usize) -> *mut u8 {
        // SAFETY: inside rank's region (LINE + 2 * SLOT bytes).
        unsafe { self.region_of(rank).add(LINE + parity * SLOT) }
    }
}
