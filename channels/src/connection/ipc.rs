//! Same-node connection: copies into the peer's memory mapped through IPC.
//!
//! The peer's allocation is already mapped in this process (by [`RemoteMemory::from_bytes`],
//! through the device's IPC cache); a write is one copy queued on a stream the connection
//! owns, which is the copy engine on a GPU and a memcpy worker on the host backend.
//! `update_and_sync` queues an 8-byte copy from a staging slot behind the earlier copies, so
//! stream order is what makes the signal land after the data.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use oxccl_backend::{AnyDevice, AnyEvent, AnyHostMemory, AnyImported, AnyStream};
use oxccl_hal::{Device, Error, Event, HostVisible, Memory, Result, Stream};

use super::{check_update, check_write, Transport};
use crate::registered_memory::{RegisteredMemory, Registration, RemoteMemory};

/// Staging slots for update values: an update may be queued while up to this many earlier
/// ones have not been copied yet; the next one waits for the oldest.
const STAGING_SLOTS: usize = 32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent between statements.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Something a queued copy reads or writes, kept alive until a flush has seen it complete.
enum KeepAlive {
    Source(Arc<Registration>),
    Destination(AnyImported),
}

impl KeepAlive {
    /// Whether both name the same buffer (the list stays as short as the number of distinct
    /// buffers in flight).
    fn same(&self, other: &KeepAlive) -> bool {
        match (self, other) {
            (KeepAlive::Source(a), KeepAlive::Source(b)) => Arc::ptr_eq(a, b),
            (KeepAlive::Destination(a), KeepAlive::Destination(b)) => a.ptr() == b.ptr(),
            _ => false,
        }
    }
}

struct State {
    next_slot: usize,
    recorded: [bool; STAGING_SLOTS],
    /// Operations queued so far.
    generation: u64,
    /// Buffers referenced by copies not yet known to be complete, with the generation of
    /// the latest operation that used each.
    keep: Vec<(KeepAlive, u64)>,
}

impl State {
    /// Counts one more queued operation and keeps `items` alive until a flush covers it.
    fn queue(&mut self, items: impl IntoIterator<Item = KeepAlive>) {
        self.generation += 1;
        let generation = self.generation;
        for item in items {
            match self.keep.iter_mut().rev().find(|(k, _)| k.same(&item)) {
                Some(entry) => entry.1 = generation,
                None => self.keep.push((item, generation)),
            }
        }
    }
}

/// Where a flush request wants its answer.
type FlushReply = Sender<Result<()>>;

/// Answers flush requests: synchronizes the stream on its own thread so that a flush can
/// give up after its timeout while the stream keeps running.
struct Syncer {
    requests: Option<Sender<FlushReply>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::warn!("IPC connection syncer thread panicked");
            }
        }
    }
}

/// A connection to a peer on the same node (see the module docs).
pub struct IpcConnection {
    rank: u32,
    peer: u32,
    stream: Arc<AnyStream>,
    staging: AnyHostMemory,
    events: Vec<AnyEvent>,
    state: Mutex<State>,
    syncer: Mutex<Option<Syncer>>,
}

impl std::fmt::Debug for IpcConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .finish()
    }
}

impl IpcConnection {
    /// A connection from `rank` to `peer` on `device` (no communication: the handshake is
    /// done by [`super::Connection::connect`]).
    pub fn new(device: &AnyDevice, rank: u32, peer: u32) -> Result<IpcConnection> {
        let stream = Arc::new(device.create_stream()?);
        let staging = device.alloc_host(STAGING_SLOTS * 8)?;
        let events = (0..STAGING_SLOTS)
            .map(|_| device.create_event())
            .collect::<Result<Vec<_>>>()?;
        Ok(IpcConnection {
            rank,
            peer,
            stream,
            staging,
            events,
            state: Mutex::new(State {
                next_slot: 0,
                recorded: [false; STAGING_SLOTS],
                generation: 0,
                keep: Vec::new(),
            }),
            syncer: Mutex::new(None),
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    fn imported<'a>(&self, dst: &'a RemoteMemory) -> Result<&'a AnyImported> {
        dst.imported().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "rank {}'s memory is not mapped in this process (not on this node, or \
                 registered without IPC)",
                dst.rank()
            ))
        })
    }

    /// Queues a copy into the peer's memory (see [`super::Connection::write`]).
    pub fn write(
        &self,
        dst: &RemoteMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_write(
            Transport::Ipc,
            self.peer,
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
        )?;
        let imported = self.imported(dst)?;
        if bytes == 0 {
            return Ok(());
        }
        let to = dst
            .ptr()
            .ok_or_else(|| Error::InvalidArgument("not imported".into()))?;
        let to = to.offset(dst_offset)?;
        let from = src.ptr().offset(src_offset)?;
        let mut state = lock(&self.state);
        state.queue([
            KeepAlive::Source(Arc::clone(src.registration())),
            KeepAlive::Destination(imported.clone()),
        ]);
        // SAFETY: both ranges were bounds-checked against their registrations (check_write),
        // and both allocations stay alive until a flush has seen the copy complete: the
        // source registration and the destination mapping are held in `state.keep`, and
        // dropping the connection synchronizes the stream first. The ranges are in different
        // allocations (a peer's and ours), so they do not overlap.
        unsafe { self.stream.copy(to, from, bytes) }
    }

    /// Queues the 8-byte store of `value` behind the earlier copies (see
    /// [`super::Connection::update_and_sync`]).
    pub fn update_and_sync(&self, dst: &RemoteMemory, dst_offset: usize, value: u64) -> Result<()> {
        check_update(Transport::Ipc, self.peer, dst, dst_offset)?;
        let imported = self.imported(dst)?;
        let to = dst
            .ptr()
            .ok_or_else(|| Error::InvalidArgument("not imported".into()))?;
        let to = to.offset(dst_offset)?;
        let mut state = lock(&self.state);
        let slot = state.next_slot;
        state.next_slot = (slot + 1) % STAGING_SLOTS;
        if state.recorded[slot] {
            // The slot's previous value may still be waiting to be copied.
            self.events[slot].synchronize()?;
        }
        let at = slot * 8;
        // SAFETY: `at + 8 <= STAGING_SLOTS * 8`, the staging buffer's length, and the host
        // pointer of pinned memory is valid while `self.staging` lives. No copy reads this
        // slot now: its previous copy completed (event synchronized above) and the state
        // lock keeps other callers off the slot.
        unsafe {
            let p = self.staging.host_ptr().add(at).cast::<u64>();
            std::ptr::write_volatile(p, value);
        }
        let from = self.staging.ptr().offset(at)?;
        state.queue([KeepAlive::Destination(imported.clone())]);
        // SAFETY: the destination's 8 bytes were bounds-checked (check_update) and its mapping
        // is held in `state.keep` until a flush; the staging slot lives as long as `self`,
        // and dropping the connection synchronizes the stream first. Different allocations.
        unsafe { self.stream.copy(to, from, 8) }?;
        self.stream.record(&self.events[slot])?;
        state.recorded[slot] = true;
        Ok(())
    }

    /// Waits for every queued copy (see [`super::Connection::flush`]).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let (reply, answer) = mpsc::channel();
        let pending = {
            let state = lock(&self.state);
            let mut syncer = lock(&self.syncer);
            let requests = match &*syncer {
                Some(s) => s.requests.clone(),
                None => {
                    let s = self.start_syncer()?;
                    let r = s.requests.clone();
                    *syncer = Some(s);
                    r
                }
            };
            let sent = requests.map(|r| r.send(reply).is_ok()).unwrap_or(false);
            if !sent {
                return Err(Error::PeerLost(format!(
                    "IPC connection to rank {}: its stream syncer stopped",
                    self.peer
                )));
            }
            // Copies queued after this point are not covered by this flush.
            state.generation
        };
        match answer.recv_timeout(timeout) {
            Ok(result) => {
                result?;
                lock(&self.state).keep.retain(|(_, used)| *used > pending);
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout {
                what: format!(
                    "IPC copies from rank {} to rank {} to complete",
                    self.rank, self.peer
                ),
                waited: timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(Error::PeerLost(format!(
                "IPC connection to rank {}: its stream syncer stopped",
                self.peer
            ))),
        }
    }

    fn start_syncer(&self) -> Result<Syncer> {
        let (tx, rx): (Sender<FlushReply>, Receiver<FlushReply>) = mpsc::channel();
        let stream = Arc::clone(&self.stream);
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-ipc-sync-{}-{}", self.rank, self.peer))
            .spawn(move || {
                for reply in rx {
                    // The flush may have timed out and gone; nothing more to tell it.
                    let _ = reply.send(stream.synchronize());
                }
            })
            .map_err(|source| Error::Os {
                call: "spawn (IPC syncer)",
                source,
            })?;
        Ok(Syncer {
            requests: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for IpcConnection {
    fn drop(&mut self) {
        // Queued copies read and write buffers this connection keeps alive: let them finish
        // before the keep-alive list (and the staging buffer) go.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(error = %e, peer = self.peer, "IPC connection dropped with failed copies");
        }
        lock(&self.syncer).take();
    }
}
