//! Zero-copy on buffers nobody registered: the allocation that holds a call's buffer
//! (found through the driver's range query, [`Device::find_allocation`]) is exported once,
//! every peer maps it once, and later calls on any buffer inside it reach the peers'
//! buffers directly instead of staging through the shared scratch.
//!
//! Every call that would take a zero-copy algorithm does one all-gather (host side only;
//! fine while capturing): through the node's shared exchange region
//! ([`LocalExchange`]) when every rank mapped it, from [`DEFAULT_LOCAL_MIN_BYTES`], else
//! through the bootstrap, from [`DEFAULT_MIN_BYTES`] (`OXCCL_AUTO_REGISTER_MIN_BYTES` sets
//! the floor either way); smaller calls stage through the scratch, which costs less than
//! the rendezvous (the size is the same on every rank, so every rank makes the same
//! choice).
//! Each rank sends what its buffers are
//! (allocation identity, base, length, the buffer's offset in it) and the export of an
//! allocation its peers have not mapped yet. Every rank then holds the same records, so
//! they all reach the same decision (zero-copy or not) and keep the same table of mapped
//! allocations: a replicated cache keyed by (rank, allocation identity), with the same
//! least-recently-used eviction everywhere. A rank whose buffer cannot be exported (host
//! memory, a range across two allocations, a VMM allocation that is not shareable) makes
//! the call fall back on every rank. The all-gather also compares the calls: a mismatched
//! count, type, op or root is an error on every rank instead of a hang.
//!
//! Identity is the driver's buffer id (unique per allocation in a process; a range across
//! several VMM mappings gets one identity per sequence of them), so memory that was freed
//! and allocated again at the same address gets a new entry: it is never served from the
//! stale mapping, and the stale entry (whose range the new allocation overlaps, and where
//! its owner no longer finds it) is dropped on every rank. Entries used while any rank was capturing a graph are pinned (the graph
//! replays with those addresses); so are allocations a rank pinned with
//! [`super::Communicator::pin_allocation`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use oxccl_backend::{AnyDevice, AnyImported};
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_channels::local_exchange::LocalExchange;
use oxccl_hal::{Device, DevicePtr, Error, ForeignAllocation, IpcHandle, Memory, Result};
use oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

mod record;

pub(crate) use record::AutoCall;
use record::{BufferRecord, Record};

use super::call_record::Staged;
use super::Communicator;
use crate::algorithms::PeerBuffers;
use oxccl_backend::AnyStream;
use oxccl_hal::{BackendKind, DataType, Stream};

/// Environment variable: `0` turns zero-copy on unregistered buffers off.
pub const AUTO_REGISTER_VAR: &str = "OXCCL_AUTO_REGISTER";
/// Environment variable: most allocations (all ranks together) kept mapped per communicator.
pub const AUTO_REGISTER_MAX_VAR: &str = "OXCCL_AUTO_REGISTER_MAX";
/// Default of [`AUTO_REGISTER_MAX_VAR`].
pub const DEFAULT_MAX_ENTRIES: usize = 512;
/// Environment variable: the smallest call (bytes per rank) that goes through the
/// all-gather above; smaller calls on unregistered buffers take oxccl's scratch.
pub const AUTO_REGISTER_MIN_VAR: &str = "OXCCL_AUTO_REGISTER_MIN_BYTES";
/// Default of [`AUTO_REGISTER_MIN_VAR`] where the all-gather goes through the bootstrap (no
/// shared exchange region): a round trip over TCP on every call, where the scratch costs
/// one more local copy of the message. 2 H100s, eager bf16 allreduce on unregistered buffers (`session.sh autoreg`):
/// at 4 MiB the exchange took 34.5 us against the scratch's 28.5, at 8 and 16 MiB they were
/// level, from 32 MiB the exchange led by 8-10% (109 against 119 us at 32 MiB). PyTorch
/// through the preloaded library went from 0.66-0.70x NCCL at 2-4 MB (an exchange per call)
/// to 1.47-1.67x with the scratch there.
pub const DEFAULT_MIN_BYTES: usize = 16 << 20;
/// Default of [`AUTO_REGISTER_MIN_VAR`] where the ranks of one node share the exchange
/// region: 1 MiB. Calls the one-shots serve (on 2 ranks allreduce up to 2 MiB, on 4 up to
/// 512 KiB) never exchange, as they work through the scratch by design, so on 2 ranks every
/// larger call on PyTorch's buffers is zero-copy (on 4, calls from 512 KiB to 1 MiB still
/// stage: on 4 H200s zero-copy led staging from 1 MiB to 512 MiB, 15.4 against 16.3 us at
/// 1 MiB; at 768 KiB zero-copy 14.22 us against staging's 14.76 in one call, but the
/// floor is every collective's and the others were not timed there). The exchange is a rendezvous of the ranks' host threads on every call, which
/// an eager loop pays in host time. It was 8 MiB from 2026-11-26, when 20 eager 2 MB
/// all_reduces through PyTorch took 35.5 us each zero-copy against 28.4 staged (NCCL 28.5).
/// On 2 H200s on 2026-11-28, with the shared region and buffers looked up in two driver
/// calls: oxccl-perf's eager unregistered calls were faster zero-copy than staged at every
/// size from 3 to 24 MiB (18.3 against 19.3 us at 3 MiB, 32.9 against 34.8 at 8 MiB), and
/// PyTorch with a 1 MiB floor served every 2 MB and 128 MB call zero-copy at 1.17-1.49x
/// NCCL (eager burst, host time and one call alone), every size faster than NCCL.
pub const DEFAULT_LOCAL_MIN_BYTES: usize = 1 << 20;

/// Offsets reported in the [`PeerBuffers`] of a call served through this cache: each rank's
/// buffers sit at their own offsets in their own allocations, so there is no common one
/// (the views hold every rank's address already).
pub(crate) const AUTO_OFFSETS: (u64, u64) = (u64::MAX - 1, u64::MAX - 1);

/// One allocation of one rank, known on every rank.
#[derive(Debug)]
struct Entry {
    /// The owner's allocation (base and length in the owner's address space).
    allocation: ForeignAllocation,
    /// Where it is reached from here: this rank's own base, or the peer's as mapped here.
    mapped: DevicePtr,
    /// The peer's mapping, kept while the entry lives (`None`: this rank's own).
    import: Option<AnyImported>,
    /// Clock of the last call that used it.
    last_used: u64,
    /// Used while some rank was capturing: a graph may replay with it.
    graph_pinned: bool,
    /// Its owner pinned it ([`AutoRegistry::pin`]), as of the owner's last record.
    owner_pinned: bool,
}

/// The replicated table: the same keys on every rank.
#[derive(Debug, Default)]
struct Table {
    entries: HashMap<(u32, u64), Entry>,
    /// Allocations some rank failed to map: never offered again.
    unmappable: BTreeSet<(u32, u64)>,
    /// Entries taken out (freed by their owner, or evicted), dropped at the next call
    /// that no rank captures, after the device finished the work that may use them.
    retired: Vec<((u32, u64), Entry)>,
    clock: u64,
}

/// What a call needs from the communicator.
pub(crate) struct Ctx<'a> {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) device: &'a AnyDevice,
    pub(crate) bootstrap: &'a Bootstrap,
    /// The node's shared-memory exchange, where every rank mapped it.
    pub(crate) local: Option<&'a LocalExchange>,
    /// Bound of the exchanges (the communicator's wait bound; `None`: the bootstrap's).
    pub(crate) timeout: Option<std::time::Duration>,
}

impl Ctx<'_> {
    /// One all-gather within the call's bound: a peer that skipped the call, or died, is
    /// an error as fast as a kernel's wait would be.
    pub(crate) fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        match (self.local, self.timeout) {
            (Some(local), t) => {
                local.all_gather(self.bootstrap, data, t.unwrap_or(self.bootstrap.timeout()))
            }
            (None, Some(t)) => self.bootstrap.all_gather_within(data, t),
            (None, None) => self.bootstrap.all_gather(data),
        }
    }
}

/// Zero-copy views of callers' buffers (the module docs).
#[derive(Debug)]
pub(crate) struct AutoRegistry {
    table: Mutex<Table>,
    /// This rank's pinned allocations, by identity.
    pinned: Mutex<HashMap<u64, ForeignAllocation>>,
    max_entries: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update leaves the maps consistent between statements.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn overlaps(a: &ForeignAllocation, b: &ForeignAllocation) -> bool {
    let end = |x: &ForeignAllocation| x.base.0.saturating_add(x.len as u64);
    a.base.0 < end(b) && b.base.0 < end(a)
}

/// This rank's entries that an allocation it reports now overlaps and that were freed
/// since: live allocations never overlap, so the driver finds something else (or nothing)
/// in an overlapped entry's range. Several ranges across VMM mappings may share mappings
/// and stay live (two tensors of one expandable segment that each cross chunks), so an
/// overlap alone does not retire an entry; the owner asks the driver, and tells the peers.
fn freed_entries(ctx: &Ctx<'_>, table: &Table, buffers: &[BufferRecord; 2]) -> Vec<u64> {
    let mut freed = Vec::new();
    for b in buffers {
        let BufferRecord::Found { allocation, .. } = b else {
            continue;
        };
        for ((owner, id), e) in &table.entries {
            if *owner != ctx.rank
                || *id == allocation.id
                || freed.contains(id)
                || !overlaps(&e.allocation, allocation)
            {
                continue;
            }
            let live = ctx
                .device
                .find_allocation(e.allocation.base, e.allocation.len)
                .is_ok_and(|now| now == e.allocation);
            if !live {
                freed.push(*id);
            }
        }
    }
    freed
}

impl AutoRegistry {
    /// A cache keeping at most `max_entries` allocations (all ranks') mapped.
    pub(crate) fn new(max_entries: usize) -> AutoRegistry {
        AutoRegistry {
            table: Mutex::new(Table::default()),
            pinned: Mutex::new(HashMap::new()),
            max_entries: max_entries.max(2),
        }
    }

    /// Pins the allocation holding `[ptr, ptr + bytes)` (local: the peers learn it from
    /// this rank's next record): never evicted until [`AutoRegistry::unpin`].
    pub(crate) fn pin(
        &self,
        device: &AnyDevice,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<ForeignAllocation> {
        let a = device.find_allocation(ptr, bytes)?;
        lock(&self.pinned).insert(a.id, a);
        Ok(a)
    }

    /// Unpins an allocation pinned by [`AutoRegistry::pin`]; `false` when it was not.
    pub(crate) fn unpin(&self, allocation: &ForeignAllocation) -> bool {
        lock(&self.pinned).remove(&allocation.id).is_some()
    }

    /// Number of allocations mapped or known (all ranks').
    pub(crate) fn len(&self) -> usize {
        lock(&self.table).entries.len()
    }

    /// What this rank sends about one buffer, or why the peers cannot reach it (sent as
    /// [`BufferRecord::Unshareable`]).
    fn describe(
        &self,
        ctx: &Ctx<'_>,
        table: &Table,
        buffer: Option<(DevicePtr, usize)>,
    ) -> std::result::Result<BufferRecord, String> {
        let Some((ptr, bytes)) = buffer else {
            return Ok(BufferRecord::NotNeeded);
        };
        if !ptr.is_aligned(16) {
            return Err(format!("{ptr} is not 16-byte aligned"));
        }
        let allocation = ctx.device.find_allocation(ptr, bytes).map_err(|e| {
            tracing::debug!(rank = ctx.rank, %ptr, bytes, error = %e, "buffer not shareable");
            e.to_string()
        })?;
        let key = (ctx.rank, allocation.id);
        if table.unmappable.contains(&key) {
            return Err(format!(
                "a peer failed to map its allocation ({} bytes at {}) before",
                allocation.len, allocation.base
            ));
        }
        let handle = if table.entries.contains_key(&key) {
            None
        } else {
            let h = ctx.device.export_allocation(&allocation).map_err(|e| {
                tracing::debug!(rank = ctx.rank, %ptr, error = %e, "allocation not exportable");
                e.to_string()
            })?;
            Some(h.to_bytes())
        };
        Ok(BufferRecord::Found {
            allocation,
            offset: allocation.offset_of(ptr),
            pinned: lock(&self.pinned).contains_key(&allocation.id),
            handle,
        })
    }

    /// Every rank's view of this call's buffers (`input`/`output`: this rank's, each when
    /// the call reaches it on the peers), or why not when some rank's cannot be shared.
    /// Collective: every rank calls it for the same call.
    pub(crate) fn peer_buffers(
        &self,
        ctx: &Ctx<'_>,
        call: AutoCall,
        input: Option<(DevicePtr, usize)>,
        output: Option<(DevicePtr, usize)>,
        capturing: bool,
    ) -> Result<std::result::Result<PeerBuffers, Staged>> {
        let at = |e: Error| e.at_rank(ctx.rank);
        let mut table = lock(&self.table);
        let first = self.describe(ctx, &table, input);
        // In place (PyTorch's all_reduce is): one lookup describes both buffers, two
        // driver queries fewer on a path an eager loop pays on every call.
        let second = if output.is_some() && output == input {
            first.clone()
        } else {
            self.describe(ctx, &table, output)
        };
        let described = [first, second];
        let why_not = described.iter().find_map(|d| d.as_ref().err().cloned());
        let buffers = described.map(|d| d.unwrap_or(BufferRecord::Unshareable));
        let mine = Record {
            call: call.words(),
            capturing,
            retire: freed_entries(ctx, &table, &buffers),
            buffers,
        };
        let all = ctx.all_gather(&mine.to_bytes()).map_err(at)?;
        let records = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                Record::from_bytes(b).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "mismatched {} calls: rank {r} did not make this call (its message \
                         is not a zero-copy record: a different count, type, op or size \
                         class, or a skipped call)",
                        call.collective
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map_err(at)?;
        if records.len() != ctx.world as usize {
            return Err(at(Error::Ipc(format!(
                "zero-copy records from {} ranks, expected {}",
                records.len(),
                ctx.world
            ))));
        }
        let differing: Vec<usize> = (0..records.len())
            .filter(|&r| records[r].call != mine.call)
            .collect();
        if !differing.is_empty() {
            return Err(at(Error::InvalidArgument(format!(
                "mismatched {} calls: ranks {differing:?} called with a different (count, \
                 dtype, op, accum, root) than this rank's ({}, {}, {}, {}, {})",
                call.collective, call.count, call.dtype, call.op, call.accum, call.root
            ))));
        }
        let any_capturing = records.iter().any(|r| r.capturing);
        let unusable = records.iter().position(|r| {
            r.buffers
                .iter()
                .any(|b| matches!(b, BufferRecord::Unshareable))
        });
        if let Some(first) = unusable {
            // Exports made for this call only are not kept.
            for b in &mine.buffers {
                if let BufferRecord::Found {
                    allocation,
                    handle: Some(_),
                    ..
                } = b
                {
                    ctx.device.release_export(allocation);
                }
            }
            self.drop_retired(ctx, &mut table, any_capturing)?;
            return Ok(Err(match why_not {
                Some(why) => Staged::Unshareable(why),
                None => Staged::PeerUnshareable(first as u32),
            }));
        }
        // Allocations their owners found freed (see `freed_entries`) go, on every rank.
        for (r, rec) in records.iter().enumerate() {
            for &id in &rec.retire {
                if let Some(e) = table.entries.remove(&(r as u32, id)) {
                    table.retired.push(((r as u32, id), e));
                }
            }
        }
        // New allocations: every rank enters them; peers map them.
        let mut added = Vec::new();
        let mut failure = None;
        for (r, rec) in records.iter().enumerate() {
            let r = r as u32;
            for b in &rec.buffers {
                let BufferRecord::Found {
                    allocation, handle, ..
                } = b
                else {
                    continue;
                };
                let key = (r, allocation.id);
                match handle {
                    None if table.entries.contains_key(&key) => continue,
                    None => {
                        return Err(at(Error::Ipc(format!(
                            "zero-copy tables diverged: rank {r} assumes allocation {} is \
                             mapped here, and it is not",
                            allocation.id
                        ))))
                    }
                    Some(_) if table.entries.contains_key(&key) => continue,
                    Some(h) => {
                        let (mapped, import) = if r == ctx.rank {
                            (allocation.base, None)
                        } else {
                            match IpcHandle::from_bytes(h)
                                .and_then(|h| ctx.device.import_memory(&h))
                            {
                                Ok(m) => (m.ptr(), Some(m)),
                                Err(e) => {
                                    failure.get_or_insert(e);
                                    (DevicePtr::NULL, None)
                                }
                            }
                        };
                        table.entries.insert(
                            key,
                            Entry {
                                allocation: *allocation,
                                mapped,
                                import,
                                last_used: 0,
                                graph_pinned: false,
                                owner_pinned: false,
                            },
                        );
                        added.push(key);
                    }
                }
            }
        }
        if !added.is_empty() {
            // Mapping may fail on one rank only: agree before anyone uses the new entries.
            let ok = [u8::from(failure.is_none())];
            let oks = ctx.all_gather(&ok).map_err(at)?;
            if oks.iter().any(|o| o.first() != Some(&1)) {
                if let Some(e) = &failure {
                    tracing::warn!(rank = ctx.rank, error = %e, "mapping a peer's buffer failed; copying through scratch instead");
                }
                for k in added {
                    if let Some(e) = table.entries.remove(&k) {
                        table.retired.push((k, e));
                    }
                    table.unmappable.insert(k);
                }
                self.drop_retired(ctx, &mut table, any_capturing)?;
                return Ok(Err(Staged::MappingFailed(failure.map(|e| e.to_string()))));
            }
        }
        table.clock += 1;
        let clock = table.clock;
        let mut views = PeerBuffers {
            inputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            outputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            offsets: AUTO_OFFSETS,
        };
        for (r, rec) in records.iter().enumerate() {
            for (which, b) in rec.buffers.iter().enumerate() {
                let BufferRecord::Found {
                    allocation,
                    offset,
                    pinned,
                    ..
                } = b
                else {
                    continue;
                };
                let e = table
                    .entries
                    .get_mut(&(r as u32, allocation.id))
                    .ok_or_else(|| at(Error::Ipc("zero-copy entry vanished".into())))?;
                e.last_used = clock;
                e.graph_pinned |= any_capturing;
                e.owner_pinned = *pinned;
                let p = e.mapped.0.checked_add(*offset).ok_or_else(|| {
                    at(Error::InvalidArgument(format!(
                        "rank {r}'s buffer offset {offset} overflows its mapping"
                    )))
                })?;
                if r < OXCCL_ALLREDUCE_MAX_RANKS as usize {
                    let slot = if which == 0 {
                        &mut views.inputs[r]
                    } else {
                        &mut views.outputs[r]
                    };
                    *slot = DevicePtr(p);
                }
            }
        }
        self.evict(&mut table, clock);
        self.drop_retired(ctx, &mut table, any_capturing)?;
        Ok(Ok(views))
    }

    /// Takes least-recently-used entries out beyond the bound (the same on every rank:
    /// the order is by clock, then key).
    fn evict(&self, table: &mut Table, clock: u64) {
        let excess = table.entries.len().saturating_sub(self.max_entries);
        if excess == 0 {
            return;
        }
        let mut candidates: Vec<(u64, (u32, u64))> = table
            .entries
            .iter()
            .filter(|(_, e)| e.last_used < clock && !e.graph_pinned && !e.owner_pinned)
            .map(|(k, e)| (e.last_used, *k))
            .collect();
        candidates.sort_unstable();
        for (_, k) in candidates.into_iter().take(excess) {
            if let Some(e) = table.entries.remove(&k) {
                table.retired.push((k, e));
            }
        }
    }

    /// Drops retired entries once no rank captures: the device finishes the work queued
    /// so far (which may read through their mappings) first.
    fn drop_retired(&self, ctx: &Ctx<'_>, table: &mut Table, any_capturing: bool) -> Result<()> {
        if table.retired.is_empty() || any_capturing {
            return Ok(());
        }
        if table.retired.iter().any(|(_, e)| e.import.is_some()) {
            ctx.device.synchronize().map_err(|e| e.at_rank(ctx.rank))?;
        }
        for ((owner, _), e) in table.retired.drain(..) {
            if owner == ctx.rank {
                ctx.device.release_export(&e.allocation);
            }
            drop(e.import);
        }
        Ok(())
    }
}

impl Communicator {
    /// The smallest call that exchanges its buffers (`CommConfig::auto_register_min_bytes`).
    pub fn auto_register_min_bytes(&self) -> usize {
        match (self.config.auto_register_min_bytes, &self.local) {
            (Some(n), _) => n,
            (None, Some(_)) => DEFAULT_LOCAL_MIN_BYTES,
            (None, None) => DEFAULT_MIN_BYTES,
        }
    }

    /// What a per-call exchange needs: the node's shared region where every rank mapped
    /// it (else the bootstrap), within the communicator's wait bound.
    pub(crate) fn exchange_ctx(&self) -> Ctx<'_> {
        Ctx {
            rank: self.rank,
            world: self.world,
            device: &self.device,
            bootstrap: &self.bootstrap,
            local: self.local.as_ref(),
            timeout: Some(self.config.timeout).filter(|t| !t.is_zero()),
        }
    }

    /// Why calls of `bytes` (the same on every rank) on unregistered buffers are not
    /// served zero-copy through this module, or `None` when they may be.
    pub(crate) fn auto_register_refusal(&self, bytes: usize) -> Option<Staged> {
        if !self.config.auto_register || Device::backend(&self.device) == BackendKind::Rocm {
            return Some(Staged::AutoRegisterOff);
        }
        let floor = self.auto_register_min_bytes();
        (bytes < floor).then_some(Staged::BelowFloor { floor })
    }

    /// Every rank's view of this call's buffers through this module, when the call
    /// would take a zero-copy algorithm on them, auto-registration is on and the call is
    /// large enough to repay it (collective: one all-gather, every rank decides alike);
    /// else why not.
    pub(super) fn auto_view(
        &self,
        call: AutoCall,
        (count, dtype): (usize, DataType),
        input: DevicePtr,
        output: DevicePtr,
        bytes: usize,
        stream: &AnyStream,
    ) -> Result<std::result::Result<PeerBuffers, Staged>> {
        let at = |e: Error| e.at_rank(self.rank);
        let collective = call.collective;
        if let Some(why) = self.auto_register_refusal(bytes) {
            return Ok(Err(why));
        }
        let zc = self
            .select(&self.shape(collective, count, dtype, bytes, true))
            .map_err(at)?;
        if !zc.algorithm.uses_registered() {
            return Ok(Err(Staged::Algorithm));
        }
        let (in_bytes, out_bytes) = collective.buffer_bytes(bytes, self.world).map_err(at)?;
        let (inputs, outputs) = collective.peer_views();
        let capturing = stream.is_capturing().map_err(at)?;
        self.auto.peer_buffers(
            &self.exchange_ctx(),
            call,
            inputs.then_some((input, in_bytes)),
            outputs.then_some((output, out_bytes)),
            capturing,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_by_range() {
        let a = |base: u64, len: usize| ForeignAllocation {
            base: DevicePtr(base),
            len,
            id: base,
        };
        assert!(overlaps(&a(100, 50), &a(149, 10)));
        assert!(!overlaps(&a(100, 50), &a(150, 10)));
        assert!(overlaps(&a(100, 50), &a(50, 100)));
    }
}
