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
}

/// Live allocations by address.
static OWNED: Mutex<BTreeMap<usize, Owned>> = Mutex::new(BTreeMap::new());

fn owned() -> MutexGuard<'static, BTreeMap<usize, Owned>> {
    // Each update is one insert or remove: a poisoned lock still holds consistent data.
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Identities of allocations; 0 is never used.
static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

/// The live host-backend allocation holding `[ptr, ptr + bytes)`.
pub(crate) fn find_allocation(ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
    let start = usize::try_from(ptr.0).unwrap_or(usize::MAX);
    let table = owned();
    let Some((&base, o)) = table
        .range(..=start)
        .next_back()
        .filter(|(b, o)| start < *b + o.len)
    else {
        return Err(Error::InvalidArgument(format!(
            "{ptr} is not inside any live host-backend allocation"
        )));
    };
    let end = start.saturating_add(bytes);
    if end > base + o.len {
        return Err(Error::InvalidArgument(format!(
            "{bytes} bytes at {ptr} run past the end of their allocation ({} bytes at {:#x})",
            o.len, base
        )));
    }
    Ok(ForeignAllocation {
        base: DevicePtr(base as u64),
        len: o.len,
        id: o.id,
    })
}

/// Exports an allocation found by [`find_allocation`] (the same handle as
/// [`HostMemory`]'s own export: one export per allocation).
pub(crate) fn export_allocation(allocation: &ForeignAllocation) -> Result<IpcHandle> {
    let table = owned();
    let o = usize::try_from(allocation.base.0)
        .ok()
        .and_then(|b| table.get(&b))
        .filter(|o| o.id == allocation.id)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "allocation {} at {} was freed",
                allocation.id, allocation.base
            ))
        })?;
    // SAFETY: the memfd stays open while its allocation is in the table, and the table's
    // lock is held for as long as the borrow is used.
    let fd = unsafe { BorrowedFd::borrow_raw(o.fd) };
    export_memfd(fd, &o.export, o.len)
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
        let file_len = i64::try_from(mapped).map_err(|_| {
            Error::InvalidArgument(format!("{mapped} bytes do not fit a file length"))
        })?;
        let fd = memfd_create(
            "oxccl-host",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| Error::errno("memfd_create", e))?;
        nix::unistd::ftruncate(&fd, file_len).map_err(|e| Error::errno("ftruncate", e))?;
        // Importers map the whole length; if anyone could shrink the file, their accesses
        // past the new end would raise SIGBUS. Sealing the size rules that out.
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| Error::errno("fcntl(F_ADD_SEALS)", e))?;
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
        let fd = fd_share::fetch(
            handle.owner_pid,
            handle.owner_nonce,
            handle.id,
            FETCH_TIMEOUT,
        )?;
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| Error::errno("fstat", e))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size < handle.len {
            return Err(Error::Ipc(format!(
                "export {} of process {} is {size} bytes, the handle claims {}",
                handle.id, handle.owner_pid, handle.len
            )));
        }
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
