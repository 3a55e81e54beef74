//! Host-backend memory: memfd mappings that any process can import.
//!
//! Every allocation is a sealed memfd mapped `MAP_SHARED`, so every allocation can be
//! exported, and an importer maps the very same pages. The memfd keeps the pages alive for
//! as long as any process maps them, which is why memory imported from a process that has
//! since exited stays valid.
//!
//! Live mappings are also entered in a process-wide range table, so that the safe stream
//! calls ([`crate::Stream::write`], [`crate::Stream::read`]) can refuse an address that is
//! not host-backend memory instead of crashing the process. Allocations (not imports) are
//! also entered in a table of their own, so that a caller's buffer can be traced back to
//! the allocation that holds it and exported ([`find_allocation`], [`export_allocation`]),
//! as the GPU backends do with the driver's range query.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::api::{HostVisible, Memory};
use crate::error::{Error, Result};
use crate::fd_share;
use crate::ipc::{IpcHandle, IpcHandleKind};
use crate::ipc_cache::{CachedImport, IpcOpener};
use crate::span_ids::SpanIds;
use crate::types::{BackendKind, DevicePtr, ForeignAllocation};

/// Largest single allocation the host backend accepts: far beyond any test, small enough
/// that a corrupt size is refused instead of reserving the address space.
pub const MAX_ALLOCATION: usize = 1 << 40;

/// How long an import waits for the owner's descriptor server.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The system page size (the host backend's allocation granularity).
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|v| v.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Address ranges `[start, end)` of live host-backend mappings, keyed by start. A range may
/// be entered more than once (two views never share an address, but be defensive), hence
/// the count.
static LIVE_RANGES: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());

fn ranges() -> MutexGuard<'static, BTreeMap<usize, (usize, usize)>> {
    // Each update is one insert or remove: a poisoned lock still holds consistent data.
    LIVE_RANGES.lock().unwrap_or_else(|p| p.into_inner())
}

fn register_range(start: usize, len: usize) {
    let mut r = ranges();
    let entry = r.entry(start).or_insert((start + len, 0));
    entry.0 = entry.0.max(start + len);
    entry.1 += 1;
}

fn unregister_range(start: usize) {
    let mut r = ranges();
    if let Some(entry) = r.get_mut(&start) {
        entry.1 -= 1;
        if entry.1 == 0 {
            r.remove(&start);
        }
    }
}

/// Checks that `[ptr, ptr + bytes)` lies inside one live host-backend mapping.
pub(crate) fn check_range(ptr: DevicePtr, bytes: usize, what: &str) -> Result<()> {
    let start = usize::try_from(ptr.0).map_err(|_| {
        Error::InvalidArgument(format!("{what}: address {ptr} does not fit this host"))
    })?;
    let end = start.checked_add(bytes).ok_or_else(|| {
        Error::InvalidArgument(format!("{what}: {ptr} + {bytes} bytes overflows"))
    })?;
    let r = ranges();
    match r.range(..=start).next_back() {
        Some((_, &(range_end, _))) if end <= range_end => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: {bytes} bytes at {ptr} are not inside any live host-backend allocation"
        ))),
    }
}

/// One live allocation (not an import) in the allocation table.
#[derive(Debug)]
struct Owned {
    /// Bytes as requested.
    len: usize,
    /// Identity, unique for the life of the process.
    id: u64,
    /// The memfd (owned by the [`HostMemory`], which leaves the table before closing it).
    fd: RawFd,
    /// The allocation's export number once exported (shared with the [`HostMemory`]).
    export: Arc<Mutex<Option<u64>>>,
    /// One piece of [`HostChunks`]: ranges may run on into the piece mapped after it.
    side_by_side: bool,
}

/// Live allocations by address.
static OWNED: Mutex<BTreeMap<usize, Owned>> = Mutex::new(BTreeMap::new());

fn owned() -> MutexGuard<'static, BTreeMap<usize, Owned>> {
    // Each update is one insert or remove: a poisoned lock still holds consistent data.
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Identities of allocations; 0 is never used.
static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

/// Identities of ranges across several pieces of [`HostChunks`].
static SPANS: SpanIds = SpanIds::new();

/// One live allocation's part of a range: its address, length and identity.
#[derive(Debug, Clone, Copy)]
struct Piece {
    base: usize,
    len: usize,
    id: u64,
    fd: RawFd,
}

/// The live host-backend allocation holding `[ptr, ptr + bytes)`: one allocation, or
/// pieces of [`HostChunks`] side by side (the host stand-in for VMM chunks), given one
/// identity per sequence of pieces.
pub(crate) fn find_allocation(ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
    Ok(find_pieces(&owned(), ptr, bytes)?.0)
}

/// [`find_allocation`] on the locked table, with the pieces it covers.
fn find_pieces(
    table: &BTreeMap<usize, Owned>,
    ptr: DevicePtr,
    bytes: usize,
) -> Result<(ForeignAllocation, Vec<Piece>)> {
    let start = usize::try_from(ptr.0).unwrap_or(usize::MAX);
    let piece_at = |at: usize| {
        table
            .range(..=at)
            .next_back()
            .filter(|(b, o)| at < *b + o.len)
            .map(|(&base, o)| Piece {
                base,
                len: o.len,
                id: o.id,
                fd: o.fd,
            })
    };
    let Some(first) = piece_at(start) else {
        return Err(Error::InvalidArgument(format!(
            "{ptr} is not inside any live host-backend allocation"
        )));
    };
    let end = start.saturating_add(bytes);
    let side_by_side = |p: &Piece| table.get(&p.base).is_some_and(|o| o.side_by_side);
    let mut pieces = vec![first];
    let mut at = first.base + first.len;
    while at < end {
        let next = piece_at(at).filter(|n| n.base == at && side_by_side(n));
        match next {
            Some(n) if side_by_side(&first) => {
                at = n.base + n.len;
                pieces.push(n);
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{bytes} bytes at {ptr} run past the end of their allocation ({} bytes \
                     at {:#x})",
                    first.len, first.base
                )))
            }
        }
    }
    let id = match pieces.as_slice() {
        [one] => one.id,
        _ => SPANS.id_of(&pieces.iter().map(|p| p.id).collect::<Vec<_>>()),
    };
    let found = ForeignAllocation {
        base: DevicePtr(first.base as u64),
        len: at - first.base,
        id,
    };
    Ok((found, pieces))
}

/// Exports an allocation found by [`find_allocation`]: one allocation under its own
/// export (as [`HostMemory`]'s: one export per allocation), a range across pieces as the
/// list of its pieces' exports, which an importer maps side by side.
pub(crate) fn export_allocation(allocation: &ForeignAllocation) -> Result<IpcHandle> {
    let table = owned();
    let freed = || {
        Error::InvalidArgument(format!(
            "allocation {} at {} was freed",
            allocation.id, allocation.base
        ))
    };
    let (now, pieces) =
        find_pieces(&table, allocation.base, allocation.len).map_err(|_| freed())?;
    if now != *allocation {
        return Err(freed());
    }
    let mut handles = Vec::with_capacity(pieces.len());
    for piece in &pieces {
        let o = table.get(&piece.base).ok_or_else(freed)?;
        // SAFETY: the memfd stays open while its allocation is in the table, and the
        // table's lock is held for as long as the borrow is used.
        let fd = unsafe { BorrowedFd::borrow_raw(piece.fd) };
        handles.push(export_memfd(fd, &o.export, o.len)?);
    }
    match handles.as_slice() {
        [one] => Ok(one.clone()),
        _ => {
            let mut payload = Vec::with_capacity(16 * handles.len());
            for h in &handles {
                payload.extend_from_slice(&h.len.to_le_bytes());
                payload.extend_from_slice(&h.id.to_le_bytes());
            }
            Ok(IpcHandle {
                backend: BackendKind::Host,
                kind: IpcHandleKind::HostMemfd,
                owner_pid: std::process::id(),
                owner_nonce: fd_share::process_nonce(),
                // Names the whole range in importers' caches; serves no descriptor itself.
                id: fd_share::next_export_id(),
                len: allocation.len as u64,
                payload,
            })
        }
    }
}

/// Exports a memfd under its allocation's export number (made on the first export).
fn export_memfd(fd: BorrowedFd<'_>, export: &Mutex<Option<u64>>, len: usize) -> Result<IpcHandle> {
    let mut export = export.lock().unwrap_or_else(|p| p.into_inner());
    let id = match *export {
        Some(id) => id,
        None => {
            let id = fd_share::next_export_id();
            fd_share::publish(id, fd)?;
            *export = Some(id);
            id
        }
    };
    Ok(IpcHandle {
        backend: BackendKind::Host,
        kind: IpcHandleKind::HostMemfd,
        owner_pid: std::process::id(),
        owner_nonce: fd_share::process_nonce(),
        id,
        len: len as u64,
        payload: Vec::new(),
    })
}

/// A memfd of `len` bytes whose size is sealed: importers map the whole length, and if
/// anyone could shrink the file their accesses past the new end would raise SIGBUS.
fn sealed_memfd(len: usize) -> Result<OwnedFd> {
    let file_len = i64::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("{len} bytes do not fit a file length")))?;
    let fd = memfd_create(
        "oxccl-host",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|e| Error::errno("memfd_create", e))?;
    nix::unistd::ftruncate(&fd, file_len).map_err(|e| Error::errno("ftruncate", e))?;
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| Error::errno("fcntl(F_ADD_SEALS)", e))?;
    Ok(fd)
}

/// An inaccessible reservation of `len` bytes of address space, for pieces mapped side by
/// side into it ([`map_shared_at`]); returns its address.
fn reserve(len: usize) -> Result<usize> {
    let len = NonZeroUsize::new(len)
        .ok_or_else(|| Error::InvalidArgument("cannot reserve zero bytes".into()))?;
    // SAFETY: a fresh anonymous mapping chosen by the kernel replaces no memory; the
    // caller owns it and unmaps it exactly once.
    let ptr = unsafe {
        nix::sys::mman::mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_NONE,
            MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
        )
    }
    .map_err(|e| Error::errno("mmap", e))?;
    Ok(ptr.as_ptr() as usize)
}

/// Maps `len` bytes of `fd` `MAP_SHARED` read-write at `at`, replacing what is there.
///
/// # Safety
/// `[at, at + len)` must lie in a reservation of the caller's ([`reserve`]) that nothing
/// else uses.
unsafe fn map_shared_at(fd: BorrowedFd<'_>, len: usize, at: usize) -> Result<()> {
    let (Some(len), Some(addr)) = (NonZeroUsize::new(len), NonZeroUsize::new(at)) else {
        return Err(Error::InvalidArgument(format!(
            "cannot map {len} bytes at {at:#x}"
        )));
    };
    // SAFETY: MAP_FIXED replaces only the caller's reservation (the caller's obligation).
    unsafe {
        mmap(
            Some(addr),
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
            fd,
            0,
        )
    }
    .map_err(|e| Error::errno("mmap(MAP_FIXED)", e))?;
    Ok(())
}

/// A `MAP_SHARED` read-write mapping of `len` bytes of `fd`; returns its address.
fn map_shared(fd: &OwnedFd, len: usize) -> Result<usize> {
    let len = NonZeroUsize::new(len)
        .ok_or_else(|| Error::InvalidArgument("cannot map zero bytes".into()))?;
    // SAFETY: a fresh mapping chosen by the kernel (no fixed address), so no existing
    // memory is replaced; the caller owns the result and unmaps it exactly once.
    let ptr = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd.as_fd(),
            0,
        )
    }
    .map_err(|e| Error::errno("mmap", e))?;
    Ok(ptr.as_ptr() as usize)
}

fn unmap(addr: usize, len: usize) -> Result<()> {
    let Some(ptr) = NonNull::new(addr as *mut std::ffi::c_void) else {
        return Ok(());
    };
    // SAFETY: `addr`/`len` describe a mapping made by `map_shared` whose owner is being
    // dropped (or closed by the IPC cache, exactly once); nothing uses it afterwards.
    unsafe { munmap(ptr, len) }.map_err(|e| Error::errno("munmap", e))
}

/// An allocation of the host backend: a sealed memfd mapped into this process.
///
/// Used for device memory and for "pinned" host memory alike: on the host they are the same
/// thing. Freed on drop (the export is withdrawn, the mapping removed, the memfd closed).
#[derive(Debug)]
pub struct HostMemory {
    fd: OwnedFd,
    addr: usize,
    len: usize,
    mapped: usize,
    export_id: Arc<Mutex<Option<u64>>>,
}

impl HostMemory {
    /// Allocates `bytes` (rounded up to whole pages in the memfd), zero-filled.
    pub(crate) fn allocate(bytes: usize) -> Result<HostMemory> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        if bytes > MAX_ALLOCATION {
            return Err(Error::InvalidArgument(format!(
                "{bytes} bytes exceeds the host backend's limit of {MAX_ALLOCATION} bytes"
            )));
        }
        let mapped = bytes.checked_next_multiple_of(page_size()).ok_or_else(|| {
            Error::InvalidArgument(format!("{bytes} bytes overflow when rounded to pages"))
        })?;
        let fd = sealed_memfd(mapped)?;
        let addr = map_shared(&fd, mapped)?;
        register_range(addr, mapped);
        let export_id = Arc::new(Mutex::new(None));
        owned().insert(
            addr,
            Owned {
                len: bytes,
                id: NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed),
                fd: fd.as_raw_fd(),
                export: Arc::clone(&export_id),
                side_by_side: false,
            },
        );
        Ok(HostMemory {
            fd,
            addr,
            len: bytes,
            mapped,
            export_id,
        })
    }

    /// Exports the allocation; exporting it again returns the same handle.
    pub(crate) fn export(&self) -> Result<IpcHandle> {
        export_memfd(self.fd.as_fd(), &self.export_id, self.len)
    }
}

impl Memory for HostMemory {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.addr as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl HostVisible for HostMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // Out of the allocation table first: nobody exports the memfd once it closes.
        owned().remove(&self.addr);
        let mut export = self.export_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = export.take() {
            fd_share::withdraw(id);
        }
        unregister_range(self.addr);
        if let Err(e) = unmap(self.addr, self.mapped) {
            tracing::warn!(error = %e, "unmapping host-backend memory failed");
        }
        // The memfd closes with `self.fd`.
    }
}

/// Host-backend memory mapped piece by piece: `count` allocations of `piece` bytes each
/// (whole pages), side by side in one address range, each with its own identity and
/// memfd. The host stand-in for CUDA VMM chunks (PyTorch's expandable segments map a
/// segment chunk by chunk): a buffer may run across pieces, and is found, exported and
/// mapped as one range ([`crate::Device::find_allocation`]). Freed on drop.
#[derive(Debug)]
pub struct HostChunks {
    addr: usize,
    piece: usize,
    /// Pieces reserved (all mapped, unless allocating failed part way).
    count: usize,
    pieces: Vec<(OwnedFd, Arc<Mutex<Option<u64>>>)>,
}

impl HostChunks {
    /// Allocates `count` pieces of `piece` bytes (a positive multiple of [`page_size`]),
    /// zero-filled, side by side.
    pub fn allocate(piece: usize, count: usize) -> Result<HostChunks> {
        let total = piece
            .checked_mul(count)
            .filter(|&t| t > 0 && t <= MAX_ALLOCATION && piece % page_size() == 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{count} pieces of {piece} bytes: pieces must be whole pages, at most \
                     {MAX_ALLOCATION} bytes in all"
                ))
            })?;
        let addr = reserve(total)?;
        let mut chunks = HostChunks {
            addr,
            piece,
            count,
            pieces: Vec::with_capacity(count),
        };
        register_range(addr, total);
        for i in 0..count {
            // SAFETY: piece `i` of the reservation made above, which only `chunks` uses.
            let new = unsafe { chunks.map_piece(i) }?;
            chunks.pieces.push(new);
        }
        Ok(chunks)
    }

    /// Maps a new zero-filled allocation as piece `index` (replacing what is there) and
    /// enters it in the allocation table under a new identity; returns its memfd and export
    /// number, for `self.pieces`.
    ///
    /// # Safety
    /// Nothing may read or write piece `index` meanwhile (it is unmapped, or `self` is
    /// borrowed mutably).
    unsafe fn map_piece(&self, index: usize) -> Result<(OwnedFd, Arc<Mutex<Option<u64>>>)> {
        let at = self.addr + index * self.piece;
        let fd = sealed_memfd(self.piece)?;
        // The table is held across the mapping: no lookup sees the new pages under the old
        // piece's entry.
        let mut table = owned();
        // SAFETY: piece `index` of this object's reservation, which only it uses; the
        // caller guarantees nothing uses the piece meanwhile.
        unsafe { map_shared_at(fd.as_fd(), self.piece, at) }?;
        let export = Arc::new(Mutex::new(None));
        table.insert(
            at,
            Owned {
                len: self.piece,
                id: NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed),
                fd: fd.as_raw_fd(),
                export: Arc::clone(&export),
                side_by_side: true,
            },
        );
        Ok((fd, export))
    }

    /// Bytes of one piece.
    pub fn piece_len(&self) -> usize {
        self.piece
    }

    /// Replaces piece `index` with new zero-filled memory at the same address, a new
    /// allocation with a new identity (as PyTorch unmaps a chunk of an expandable segment
    /// and maps another there). Ranges across it then have new identities too. Peers that
    /// mapped the old piece keep its pages.
    pub fn remap(&mut self, index: usize) -> Result<()> {
        if index >= self.pieces.len() {
            return Err(Error::InvalidArgument(format!(
                "piece {index} of {} pieces",
                self.pieces.len()
            )));
        }
        // SAFETY: the old piece's mapping is replaced in place, and nothing of this process
        // reads it meanwhile (`&mut self`).
        let new = unsafe { self.map_piece(index) }?;
        let (_old_fd, old_export) = std::mem::replace(&mut self.pieces[index], new);
        if let Some(id) = old_export.lock().unwrap_or_else(|p| p.into_inner()).take() {
            fd_share::withdraw(id);
        }
        Ok(())
    }
}

impl Memory for HostChunks {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.addr as u64)
    }
    fn len(&self) -> usize {
        self.piece * self.pieces.len()
    }
}

impl HostVisible for HostChunks {
    fn host_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Drop for HostChunks {
    fn drop(&mut self) {
        let mut table = owned();
        for (i, (_, export)) in self.pieces.iter().enumerate() {
            table.remove(&(self.addr + i * self.piece));
            if let Some(id) = export.lock().unwrap_or_else(|p| p.into_inner()).take() {
                fd_share::withdraw(id);
            }
        }
        drop(table);
        unregister_range(self.addr);
        // The whole reservation, mapped pieces and any left unmapped after a failure.
        if let Err(e) = unmap(self.addr, self.piece * self.count) {
            tracing::warn!(error = %e, "unmapping host-backend chunks failed");
        }
    }
}

/// What an open host-backend import is: an address range of this process.
#[derive(Debug, PartialEq, Eq)]
pub struct HostMapping {
    /// First byte of the mapping.
    pub addr: usize,
    /// Length as exported (not rounded).
    pub len: usize,
}

/// Opens host-backend handles for the IPC cache: fetches the memfd and maps it.
#[derive(Debug, Default)]
pub struct HostOpener;

impl IpcOpener for HostOpener {
    type Mapping = HostMapping;

    fn open(&self, handle: &IpcHandle) -> Result<HostMapping> {
        handle.expect_backend(BackendKind::Host)?;
        if handle.kind != IpcHandleKind::HostMemfd {
            return Err(Error::Ipc(format!(
                "host backend imports memory handles (HostMemfd), not {:?}",
                handle.kind
            )));
        }
        let len = usize::try_from(handle.len)
            .ok()
            .filter(|&l| l > 0 && l <= MAX_ALLOCATION)
            .ok_or_else(|| {
                Error::Ipc(format!(
                    "handle length {} is not a valid allocation size",
                    handle.len
                ))
            })?;
        if !handle.payload.is_empty() {
            return open_pieces(handle, len);
        }
        let fd = fetch_at_least(handle.owner_pid, handle.owner_nonce, handle.id, handle.len)?;
        let addr = map_shared(&fd, len)?;
        register_range(addr, len);
        // The mapping holds the memfd's pages; the descriptor itself is no longer needed.
        Ok(HostMapping { addr, len })
    }

    fn close(&self, mapping: &HostMapping) -> Result<()> {
        unregister_range(mapping.addr);
        unmap(mapping.addr, mapping.len)
    }
}

/// The descriptor of export `id` of a process, checked to hold at least `len` bytes.
fn fetch_at_least(pid: u32, nonce: u64, id: u64, len: u64) -> Result<OwnedFd> {
    let fd = fd_share::fetch(pid, nonce, id, FETCH_TIMEOUT)?;
    let stat = nix::sys::stat::fstat(&fd).map_err(|e| Error::errno("fstat", e))?;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size < len {
        return Err(Error::Ipc(format!(
            "export {id} of process {pid} is {size} bytes, the handle claims {len}"
        )));
    }
    Ok(fd)
}

/// Maps a range exported as pieces ([`HostChunks`]): each piece's memfd side by side in
/// one reservation of `len` bytes, so the range reads as one buffer at the same offsets.
fn open_pieces(handle: &IpcHandle, len: usize) -> Result<HostMapping> {
    let malformed = |why: &str| Error::Ipc(format!("host range of {len} bytes: {why}"));
    if handle.payload.len() % 16 != 0 || handle.payload.len() < 32 {
        return Err(malformed("its list of pieces is malformed"));
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&handle.payload[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let pieces: Vec<(usize, u64)> = (0..handle.payload.len() / 16)
        .map(|i| (usize::try_from(word(16 * i)).unwrap_or(0), word(16 * i + 8)))
        .collect();
    let mut total = 0usize;
    for &(piece, _) in &pieces {
        if piece == 0 || piece % page_size() != 0 {
            return Err(malformed("a piece is not a positive number of whole pages"));
        }
        total = total.saturating_add(piece);
    }
    if total != len {
        return Err(malformed(&format!("its pieces add up to {total} bytes")));
    }
    let addr = reserve(len)?;
    let mut at = addr;
    for &(piece, id) in &pieces {
        let mapped = fetch_at_least(handle.owner_pid, handle.owner_nonce, id, piece as u64)
            // SAFETY: `[at, at + piece)` lies in the reservation above, past the pieces
            // mapped so far; nothing else uses it.
            .and_then(|fd| unsafe { map_shared_at(fd.as_fd(), piece, at) });
        if let Err(e) = mapped {
            let _ = unmap(addr, len);
            return Err(e);
        }
        at += piece;
    }
    register_range(addr, len);
    Ok(HostMapping { addr, len })
}

/// Memory of another process (or another view of this one's) mapped through the IPC cache.
/// Clones share the mapping; it is unmapped when the last clone drops.
#[derive(Debug, Clone)]
pub struct HostImport(pub CachedImport<HostOpener>);

impl Memory for HostImport {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.0.mapping().addr as u64)
    }
    fn len(&self) -> usize {
        self.0.mapping().len
    }
}

impl HostVisible for HostImport {
    fn host_ptr(&self) -> *mut u8 {
        self.0.mapping().addr as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sizes_are_refused_not_crashed() {
        for bytes in [0, MAX_ALLOCATION + 1, usize::MAX, usize::MAX - 1] {
            let e = HostMemory::allocate(bytes).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bytes}: {e}");
        }
    }

    #[test]
    fn range_table_follows_allocations() {
        let m = HostMemory::allocate(100).unwrap();
        assert!(check_range(m.ptr(), 100, "t").is_ok());
        // Page rounding makes the tail of the page part of the mapping.
        assert!(check_range(m.ptr(), page_size(), "t").is_ok());
        assert!(check_range(m.ptr(), page_size() + 1, "t").is_err());
        assert!(check_range(DevicePtr(8), 8, "t").is_err());
        assert!(check_range(DevicePtr(u64::MAX), 8, "t").is_err());
        drop(m);
        // Unregistering is checked on an address no user-space mapping can have (x86-64
        // kernel half): after a real free, a test running in parallel may map that very
        // address again, so a freed allocation's address proves nothing.
        let fake = 0xffff_9000_0000_0000_usize;
        register_range(fake, 4096);
        register_range(fake, 4096);
        assert!(check_range(DevicePtr(fake as u64), 8, "t").is_ok());
        unregister_range(fake);
        assert!(
            check_range(DevicePtr(fake as u64), 8, "t").is_ok(),
            "still one view"
        );
        unregister_range(fake);
        let e = check_range(DevicePtr(fake as u64), 8, "write").unwrap_err();
        assert!(e.to_string().contains("not inside any live"), "{e}");
    }
}
