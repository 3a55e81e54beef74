//! Registered memory: a local allocation made reachable by peers, and a peer's view of it.
//!
//! A rank registers a range of one of its allocations for a set of [`Transport`]s
//! ([`RegisteredMemory::new`]), serializes it ([`RegisteredMemory::to_bytes`]) and hands the
//! bytes to its peers through the bootstrap ([`exchange`] does that for all ranks at once).
//! A peer turns the bytes into a [`RemoteMemory`] ([`RemoteMemory::from_bytes`]):
//! - on the **same node** (same host name and boot id, see [`HostIdentity`]) and with IPC
//!   registered, it maps the owner's allocation through its device's IPC handle cache, so a
//!   copy engine (or plain memcpy on the host backend) can write it directly;
//! - otherwise it keeps what the network transports need: the registration id the owner's
//!   TCP receiver looks memory up by, and the InfiniBand address and remote key.
//!
//! The bytes carry the owner's host identity, so the decision "same node or not" is made by
//! the importer from facts, not from configuration.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use oxccl_backend::{AnyDevice, AnyImported};
use oxccl_hal::{BackendKind, Device, DevicePtr, Error, HostVisible, IpcHandle, Memory, Result};

use crate::backing::Backing;
use crate::bootstrap::Bootstrap;
use crate::connection::ib::IbRegion;
use crate::connection::{Transport, TransportSet};

const MAGIC: &[u8; 6] = b"OXREG\0";
const VERSION: u8 = 1;
/// Bound on variable-length fields, so corrupt bytes cannot make us allocate gigabytes.
const MAX_FIELD: usize = 1 << 20;

/// Environment variable: `1` makes every process of this machine count as its own node
/// (see [`HostIdentity::local`]): how the multi-node paths (PortChannel algorithms over
/// TCP, or InfiniBand where a device exists) run without a second node. `0` or unset: off.
pub const SEPARATE_HOSTS_VAR: &str = "OXCCL_SEPARATE_HOSTS";

/// Parses the value of [`SEPARATE_HOSTS_VAR`] (`None`: unset): `1` on, `0` or empty off,
/// anything else an error naming the variable.
pub fn separate_hosts(value: Option<&str>) -> std::result::Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!(
            "{SEPARATE_HOSTS_VAR}='{other}': want 1 (every process its own node) or 0"
        )),
    }
}

/// What tells two processes apart as being on one node or on two.
///
/// Two processes are on the same node when both the host name and the kernel's boot id
/// match. The boot id alone is shared by containers on one host that cannot see each
/// other's memory; the host name alone is reused across clusters. Both together are
/// conservative: a false "different node" only costs the faster transport.
/// [`SEPARATE_HOSTS_VAR`] makes that false answer on purpose, per process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostIdentity {
    /// The kernel's host name (`/proc/sys/kernel/hostname`).
    pub hostname: String,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), empty where unreadable.
    pub boot_id: String,
}

impl HostIdentity {
    /// The identity of the node this process runs on (read once). With
    /// [`SEPARATE_HOSTS_VAR`]`=1` the host name carries this process's id, so every other
    /// process (every other rank launched one per process) is on "another node": no IPC
    /// mapping, network transports only. An unreadable value of the variable is an error
    /// here, on every call, never a silent choice.
    pub fn local() -> Result<&'static HostIdentity> {
        static LOCAL: LazyLock<std::result::Result<HostIdentity, String>> = LazyLock::new(|| {
            let read = |path: &str| {
                std::fs::read_to_string(path)
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            let node = HostIdentity {
                hostname: read("/proc/sys/kernel/hostname"),
                boot_id: read("/proc/sys/kernel/random/boot_id"),
            };
            let separate = separate_hosts(std::env::var(SEPARATE_HOSTS_VAR).ok().as_deref())?;
            Ok(if separate {
                node.separated(std::process::id())
            } else {
                node
            })
        });
        LOCAL
            .as_ref()
            .map_err(|e| Error::InvalidArgument(e.clone()))
    }

    /// This node's identity made unique to process `pid` (what [`SEPARATE_HOSTS_VAR`]
    /// does): another process of the same node no longer matches it.
    pub fn separated(&self, pid: u32) -> HostIdentity {
        let hostname = if self.hostname.is_empty() {
            // Unknown identities never match anyway; keep them unknown.
            String::new()
        } else {
            format!("{}#{SEPARATE_HOSTS_VAR}-pid{pid}", self.hostname)
        };
        HostIdentity {
            hostname,
            boot_id: self.boot_id.clone(),
        }
    }

    /// Whether `self` and `other` name the same node. Unknown identities never match.
    pub fn same_node(&self, other: &HostIdentity) -> bool {
        !self.hostname.is_empty() && self == other
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.hostname.as_bytes());
        put_bytes(out, self.boot_id.as_bytes());
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<HostIdentity> {
        Ok(HostIdentity {
            hostname: r.string()?,
            boot_id: r.string()?,
        })
    }
}

impl fmt::Display for HostIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (boot {})", self.hostname, self.boot_id)
    }
}

/// The local side of a registration: what a TCP receiver writes into.
pub(crate) struct Registration {
    pub(crate) memory: Backing,
    /// First byte of the registered range within `memory`.
    pub(crate) offset: usize,
    /// Length of the registered range.
    pub(crate) len: usize,
    pub(crate) rank: u32,
    pub(crate) id: u64,
    pub(crate) transports: TransportSet,
    pub(crate) ipc: Option<IpcHandle>,
    pub(crate) ib: Option<IbRegion>,
    /// The owner's node, as its peers are told.
    pub(crate) host: HostIdentity,
}

impl Registration {
    /// Device address of byte `at` of the range (bounds checked by the caller).
    pub(crate) fn ptr_at(&self, at: usize) -> Result<DevicePtr> {
        self.memory.ptr().offset(self.offset)?.offset(at)
    }

    /// Host address of the range's first byte, when the memory is host-addressable (pinned
    /// host memory, the host backend's memory); device memory of a GPU backend has none.
    pub(crate) fn host_base(&self) -> Option<*mut u8> {
        self.memory.host_ptr().map(|p| p.wrapping_add(self.offset))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.transports.contains(Transport::Tcp) {
            registry().remove(&self.id);
        }
    }
}

/// Registrations reachable by TCP receivers, by id. Weak: the user's handle owns them.
static REGISTRY: LazyLock<Mutex<HashMap<u64, Weak<Registration>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry() -> MutexGuard<'static, HashMap<u64, Weak<Registration>>> {
    // Every update is one insert or remove: a poisoned lock still holds consistent data.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live registration with `id`, if this process has one registered for TCP.
pub(crate) fn lookup(id: u64) -> Option<Arc<Registration>> {
    registry().get(&id).and_then(Weak::upgrade)
}

/// A range of a local allocation registered for a set of transports. Cheap to clone.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use oxccl_backend::AnyDevice;
/// # use oxccl_hal::{BackendKind, Device, DeviceId, MemoryKind};
/// # use oxccl_channels::bootstrap::Bootstrap;
/// # use oxccl_channels::connection::{Transport, TransportSet};
/// # use oxccl_channels::registered_memory::{exchange, RegisteredMemory};
/// # fn f(bootstrap: &Bootstrap) -> oxccl_hal::Result<()> {
/// let device = AnyDevice::open_with(BackendKind::Host, DeviceId(0))?;
/// let buffer = Arc::new(device.alloc(1 << 20, MemoryKind::Physical)?);
/// let transports = TransportSet::of(&[Transport::Ipc, Transport::Tcp]);
/// let local = RegisteredMemory::new(&device, bootstrap.rank(), buffer, transports)?;
/// let remotes = exchange(bootstrap, &device, &local)?; // entry r: rank r's buffer
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<Registration>,
}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("rank", &self.inner.rank)
            .field("id", &self.inner.id)
            .field("offset", &self.inner.offset)
            .field("len", &self.inner.len)
            .field("transports", &self.inner.transports)
            .finish()
    }
}

impl RegisteredMemory {
    /// Registers all of `memory` (device memory, or pinned host memory the device maps:
    /// [`Backing`]), owned by `rank`, for `transports`.
    pub fn new(
        device: &AnyDevice,
        rank: u32,
        memory: impl Into<Backing>,
        transports: TransportSet,
    ) -> Result<RegisteredMemory> {
        let memory = memory.into();
        let len = memory.len();
        RegisteredMemory::range(device, rank, memory, 0, len, transports)
    }

    /// Registers `len` bytes of `memory` starting at `offset`, owned by `rank`.
    ///
    /// Fails with [`Error::InvalidArgument`] when the range is empty or does not fit, with
    /// [`Error::Unsupported`] when InfiniBand is asked for and cannot be had or IPC for
    /// pinned host memory, and with the device's error when IPC export fails.
    pub fn range(
        device: &AnyDevice,
        rank: u32,
        memory: impl Into<Backing>,
        offset: usize,
        len: usize,
        transports: TransportSet,
    ) -> Result<RegisteredMemory> {
        let memory = memory.into();
        let end = offset.checked_add(len).filter(|&e| e <= memory.len());
        if len == 0 || end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "cannot register {len} bytes at offset {offset} of a {}-byte allocation",
                memory.len()
            )));
        }
        if transports.is_empty() {
            return Err(Error::InvalidArgument(
                "registration needs at least one transport".into(),
            ));
        }
        if device.backend() != memory.backend() {
            return Err(Error::InvalidArgument(format!(
                "memory of the {} backend registered with a {} device",
                memory.backend(),
                device.backend()
            )));
        }
        let _span = tracing::debug_span!("register_memory", rank, len, ?transports).entered();
        let host = HostIdentity::local()?.clone();
        let ipc = if transports.contains(Transport::Ipc) {
            let exportable = memory.device_memory().ok_or_else(|| {
                Error::Unsupported(
                    "pinned host memory cannot be shared through IPC; register it for TCP or \
                     InfiniBand"
                        .into(),
                )
            })?;
            Some(device.export_memory(exportable)?)
        } else {
            None
        };
        // Pinned host memory is registered with the NIC by its host address.
        let base = match &memory {
            Backing::HostMapped(m) => DevicePtr(m.host_ptr() as u64),
            Backing::Device(m) => m.ptr(),
        }
        .offset(offset)?;
        let ib = if transports.contains(Transport::Ib) {
            Some(IbRegion::register(base, len)?)
        } else {
            None
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(Registration {
            memory,
            offset,
            len,
            rank,
            id,
            transports,
            ipc,
            ib,
            host,
        });
        if transports.contains(Transport::Tcp) {
            registry().insert(id, Arc::downgrade(&inner));
        }
        Ok(RegisteredMemory { inner })
    }

    /// The owning rank.
    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    /// Length of the registered range in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the range is empty (never true for a registration).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Device address of the first registered byte.
    pub fn ptr(&self) -> DevicePtr {
        // The sum was checked when registering.
        DevicePtr(
            self.inner
                .memory
                .ptr()
                .0
                .wrapping_add(self.inner.offset as u64),
        )
    }

    /// The transports this range is registered for.
    pub fn transports(&self) -> TransportSet {
        self.inner.transports
    }

    /// The allocation the range belongs to.
    pub fn memory(&self) -> &Backing {
        &self.inner.memory
    }

    /// Process-unique id of this registration (what a TCP peer names it by).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub(crate) fn registration(&self) -> &Arc<Registration> {
        &self.inner
    }

    /// Serializes the registration for a peer ([`RemoteMemory::from_bytes`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let r = &self.inner;
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&r.rank.to_le_bytes());
        out.push(r.memory.backend().tag());
        out.push(r.transports.bits());
        out.extend_from_slice(&r.id.to_le_bytes());
        out.extend_from_slice(&(r.offset as u64).to_le_bytes());
        out.extend_from_slice(&(r.len as u64).to_le_bytes());
        out.extend_from_slice(&(self.ptr().0 % 4096).to_le_bytes());
        r.host.encode(&mut out);
        put_bytes(
            &mut out,
            &r.ipc.as_ref().map(IpcHandle::to_bytes).unwrap_or_default(),
        );
        match &r.ib {
            Some(ib) => {
                out.push(1);
                out.extend_from_slice(&ib.addr().to_le_bytes());
                out.extend_from_slice(&ib.rkey().to_le_bytes());
            }
            None => out.push(0),
        }
        out
    }
}

/// InfiniBand coordinates of a peer's registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbRemote {
    /// Address of the first registered byte, as the peer registered it.
    pub addr: u64,
    /// The remote key of the peer's memory region.
    pub rkey: u32,
}

/// A peer's registered range, as seen by this process.
#[derive(Clone)]
pub struct RemoteMemory {
    rank: u32,
    id: u64,
    backend: BackendKind,
    transports: TransportSet,
    offset: usize,
    len: usize,
    /// The range start's address modulo 4096 in the owner's address space (for alignment
    /// checks of updates).
    page_offset: u64,
    host: HostIdentity,
    ipc: Option<IpcHandle>,
    imported: Option<AnyImported>,
    ib: Option<IbRemote>,
}

impl fmt::Debug for RemoteMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteMemory")
            .field("rank", &self.rank)
            .field("id", &self.id)
            .field("len", &self.len)
            .field("transports", &self.transports)
            .field("host", &self.host.hostname)
            .field("imported", &self.imported.is_some())
            .field("ib", &self.ib)
            .finish()
    }
}

impl RemoteMemory {
    /// Parses a peer's [`RegisteredMemory::to_bytes`] and, when the owner is on this node
    /// and registered the range for IPC, maps it through `device` (and its IPC cache).
    ///
    /// `local_rank` is the rank of the calling process: its own registration is parsed but
    /// never imported (a GPU cannot open its own IPC handle).
    pub fn from_bytes(bytes: &[u8], device: &AnyDevice, local_rank: u32) -> Result<RemoteMemory> {
        let mut remote = RemoteMemory::parse(bytes)?;
        let same_node = HostIdentity::local()?.same_node(&remote.host);
        if remote.rank != local_rank && same_node && remote.backend == device.backend() {
            if let Some(handle) = &remote.ipc {
                let _span = tracing::debug_span!("import_remote", owner = remote.rank).entered();
                let imported = device.import_memory(handle)?;
                let end = remote.offset.checked_add(remote.len);
                if end.is_none_or(|e| e > imported.len()) {
                    return Err(Error::Ipc(format!(
                        "rank {}'s registration of {} bytes at {} does not fit its {}-byte export",
                        remote.rank,
                        remote.len,
                        remote.offset,
                        imported.len()
                    )));
                }
                remote.imported = Some(imported);
            }
        }
        Ok(remote)
    }

    fn parse(bytes: &[u8]) -> Result<RemoteMemory> {
        let mut r = Reader::new(bytes, "registered memory");
        if r.take(MAGIC.len())? != MAGIC {
            return Err(Error::InvalidArgument(
                "not an oxccl registered-memory record (bad magic)".into(),
            ));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(Error::InvalidArgument(format!(
                "registered-memory record version {version}, this build reads {VERSION}"
            )));
        }
        let rank = r.u32()?;
        let backend = BackendKind::from_tag(r.u8()?).ok_or_else(|| {
            Error::InvalidArgument("unknown backend tag in a registered-memory record".into())
        })?;
        let transports = TransportSet::from_bits(r.u8()?)?;
        let id = r.u64()?;
        let offset = r.usize()?;
        let len = r.usize()?;
        let page_offset = r.u64()?;
        let host = HostIdentity::decode(&mut r)?;
        let ipc_bytes = r.bytes()?;
        let ipc = if ipc_bytes.is_empty() {
            None
        } else {
            Some(IpcHandle::from_bytes(ipc_bytes)?)
        };
        let ib = match r.u8()? {
            0 => None,
            _ => Some(IbRemote {
                addr: r.u64()?,
                rkey: r.u32()?,
            }),
        };
        r.finish()?;
        if len == 0 || offset.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "registered-memory record of rank {rank} has a bad range ({len} bytes at {offset})"
            )));
        }
        if transports.contains(Transport::Ipc) != ipc.is_some()
            || transports.contains(Transport::Ib) != ib.is_some()
        {
            return Err(Error::InvalidArgument(format!(
                "registered-memory record of rank {rank} lists {transports:?} but carries \
                 other transport data"
            )));
        }
        Ok(RemoteMemory {
            rank,
            id,
            backend,
            transports,
            offset,
            len,
            page_offset,
            host,
            ipc,
            imported: None,
            ib,
        })
    }

    /// The owning rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Length of the range in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never true for a parsed record).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The transports the owner registered the range for.
    pub fn transports(&self) -> TransportSet {
        self.transports
    }

    /// The owner's backend.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// The owner's node.
    pub fn host(&self) -> &HostIdentity {
        &self.host
    }

    /// The owner's registration id (what its TCP receiver looks the range up by).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the range is mapped into this process (same node, IPC registered).
    pub fn is_imported(&self) -> bool {
        self.imported.is_some()
    }

    /// Address of the range's first byte in this process's mapping, when imported.
    pub fn ptr(&self) -> Option<DevicePtr> {
        // The range was checked against the mapping when importing.
        self.imported
            .as_ref()
            .map(|m| DevicePtr(m.ptr().0.wrapping_add(self.offset as u64)))
    }

    /// The mapping of the owner's whole allocation, when imported.
    pub fn imported(&self) -> Option<&AnyImported> {
        self.imported.as_ref()
    }

    /// The InfiniBand address and key, when the owner registered the range with IB.
    pub fn ib(&self) -> Option<IbRemote> {
        self.ib
    }

    /// Whether byte `offset` of the range sits at an 8-byte aligned address.
    pub(crate) fn is_aligned8(&self, offset: usize) -> bool {
        (self.page_offset.wrapping_add(offset as u64)) % 8 == 0
    }
}

/// Registers nothing new: gathers every rank's `local` registration through `bootstrap`
/// and returns them indexed by rank (entry `bootstrap.rank()` is this rank's own, parsed but
/// not imported). Collective: every rank must call it.
pub fn exchange(
    bootstrap: &Bootstrap,
    device: &AnyDevice,
    local: &RegisteredMemory,
) -> Result<Vec<RemoteMemory>> {
    let rank = bootstrap.rank();
    if local.rank() != rank {
        return Err(Error::InvalidArgument(format!(
            "exchanging memory registered by rank {} on rank {rank}",
            local.rank()
        ))
        .at_rank(rank));
    }
    let _span = tracing::debug_span!("exchange_memory", rank).entered();
    let all = bootstrap.all_gather(&local.to_bytes())?;
    all.iter()
        .enumerate()
        .map(|(peer, bytes)| {
            let remote =
                RemoteMemory::from_bytes(bytes, device, rank).map_err(|e| e.at_rank(rank))?;
            if remote.rank as usize != peer {
                return Err(Error::InvalidArgument(format!(
                    "rank {peer} sent memory registered by rank {}",
                    remote.rank
                ))
                .at_rank(rank));
            }
            Ok(remote)
        })
        .collect()
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Fields are bounded by MAX_FIELD when written by this crate; saturate defensively.
    let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A bounds-checked little-endian reader over a received record.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{} record truncated ({} bytes)",
                    self.what,
                    self.bytes.len()
                ))
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn usize(&mut self) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| {
            Error::InvalidArgument(format!("{} record: {v} does not fit usize", self.what))
        })
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > MAX_FIELD {
            return Err(Error::InvalidArgument(format!(
                "{} record: field of {n} bytes",
                self.what
            )));
        }
        self.take(n)
    }

    pub(crate) fn string(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            Error::InvalidArgument(format!("{} record: a string is not UTF-8", self.what))
        })
    }

    pub(crate) fn finish(&self) -> Result<()> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{} record: {} trailing bytes",
                self.what,
                self.bytes.len() - self.at
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_hal::{DeviceId, MemoryKind};

    fn device() -> AnyDevice {
        AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap()
    }

    #[test]
    fn pinned_host_memory_registers_for_tcp_not_ipc() {
        let dev = device();
        let pinned = Arc::new(oxccl_hal::Device::alloc_host(&dev, 4096).unwrap());
        let tcp = TransportSet::of(&[Transport::Tcp]);
        let reg = RegisteredMemory::range(&dev, 0, Arc::clone(&pinned), 64, 1024, tcp).unwrap();
        let base = HostVisible::host_ptr(pinned.as_ref());
        assert_eq!(reg.registration().host_base(), Some(base.wrapping_add(64)));
        assert!(lookup(reg.id()).is_some());
        let ipc = TransportSet::of(&[Transport::Ipc, Transport::Tcp]);
        let e = RegisteredMemory::new(&dev, 0, pinned, ipc)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pinned host memory cannot be shared through IPC"),
            "{e}"
        );
    }

    #[test]
    fn round_trip_keeps_fields_and_own_entry_is_not_imported() {
        let dev = device();
        let mem = Arc::new(dev.alloc(10_000, MemoryKind::Physical).unwrap());
        let set = TransportSet::of(&[Transport::Ipc, Transport::Tcp]);
        let reg = RegisteredMemory::range(&dev, 3, Arc::clone(&mem), 16, 5000, set).unwrap();
        let bytes = reg.to_bytes();
        let own = RemoteMemory::from_bytes(&bytes, &dev, 3).unwrap();
        assert!(!own.is_imported());
        let peer = RemoteMemory::from_bytes(&bytes, &dev, 0).unwrap();
        assert!(peer.is_imported());
        assert_eq!((peer.rank(), peer.len(), peer.id()), (3, 5000, reg.id()));
        assert_eq!(peer.transports(), set);
        assert_eq!(peer.host(), HostIdentity::local().unwrap());
        assert!(peer.is_aligned8(0) && peer.is_aligned8(8) && !peer.is_aligned8(4));
        // The import maps the same pages: a byte written through it is seen locally.
        let stream = oxccl_hal::Device::create_stream(&dev).unwrap();
        oxccl_hal::Stream::write(&stream, peer.ptr().unwrap(), &[0xa5]).unwrap();
        let mut back = [0u8];
        oxccl_hal::Stream::read(&stream, reg.ptr(), &mut back).unwrap();
        assert_eq!(back, [0xa5]);
    }

    #[test]
    fn tcp_registry_follows_the_registration() {
        let dev = device();
        let mem = Arc::new(dev.alloc(64, MemoryKind::Plain).unwrap());
        let reg = RegisteredMemory::new(&dev, 0, mem, TransportSet::of(&[Transport::Tcp])).unwrap();
        let id = reg.id();
        assert!(lookup(id).is_some());
        let clone = reg.clone();
        drop(reg);
        assert!(lookup(id).is_some());
        drop(clone);
        assert!(lookup(id).is_none());
    }

    #[test]
    fn bad_ranges_and_records_are_refused() {
        let dev = device();
        let mem = Arc::new(dev.alloc(100, MemoryKind::Plain).unwrap());
        let tcp = TransportSet::of(&[Transport::Tcp]);
        for (off, len) in [(0, 0), (0, 101), (100, 1), (usize::MAX, 2)] {
            let e = RegisteredMemory::range(&dev, 0, Arc::clone(&mem), off, len, tcp).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{off}+{len}: {e}");
        }
        let e = RegisteredMemory::new(&dev, 0, Arc::clone(&mem), TransportSet::EMPTY).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let bytes = RegisteredMemory::new(&dev, 0, mem, tcp).unwrap().to_bytes();
        for cut in [0, 5, 7, bytes.len() - 1] {
            assert!(
                RemoteMemory::from_bytes(&bytes[..cut], &dev, 1).is_err(),
                "{cut}"
            );
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(RemoteMemory::from_bytes(&padded, &dev, 1).is_err());
        let mut bad = bytes;
        bad[0] ^= 0xff;
        assert!(RemoteMemory::from_bytes(&bad, &dev, 1).is_err());
    }
}
