//! Semaphores: monotonically increasing 64-bit counters that one side adds to and the other
//! waits on.
//!
//! - [`DeviceSemaphore`] (device to device, the MemoryChannel's): each rank allocates a
//!   coherent counter region and registers it for IPC; the ranks exchange the registrations
//!   through the bootstrap, so `remote_inbound` of the device handle points into the peer's
//!   memory (mapped through the IPC cache). Signal = release add on the peer's counter;
//!   wait = acquire poll of the local counter, bounded by a spin limit.
//! - [`HostDeviceSemaphore`] (the PortChannel's): the counter a GPU waits on is written by
//!   the *peer's proxy* through a [`Connection`] (`update_and_sync` of the next value), so
//!   the signal is ordered after the data that connection wrote.
//! - [`HostSemaphore`] (host to host): the same wiring, waited for by a host thread. Its
//!   counter must be host-addressable: the host backend's memory always is, and so is a
//!   TCP connection's counter (pinned host memory) on every backend.
//!
//! The `host_*` functions are the device operations of `semaphore.hpp` in Rust, over the
//! same handles: the host backend's kernels use them, so the protocol is tested in CI.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oxccl_backend::AnyDevice;
use oxccl_hal::atomics::HostFlag;
use oxccl_hal::{Error, MemoryKind, Result};
use oxccl_kernels::abi::{OxcclDeviceSemaphore, OxcclHostDeviceSemaphore};

use crate::backing::Backing;
use crate::bootstrap::Bootstrap;
use crate::connection::{Connection, Transport, TransportSet};
use crate::registered_memory::{RegisteredMemory, RemoteMemory};

/// Environment variable: polls before a device (or host-kernel) wait reports a timeout.
pub const SPIN_LIMIT_VAR: &str = "OXCCL_WAIT_SPINS";
/// Polls before a wait times out when [`SPIN_LIMIT_VAR`] is not set: tens of seconds of
/// system-scope polling on a GPU, never forever.
pub const DEFAULT_SPIN_LIMIT: u64 = 200_000_000;
/// Polls a host wait makes before it starts yielding the CPU between polls.
const SPINS_BEFORE_YIELD: u64 = 1 << 10;
/// Offset of the `expected` counter in a semaphore's allocation: its own cache line.
const EXPECTED_AT: usize = 64;
/// Bytes of a semaphore's allocation: inbound and expected counters, a line each.
const SEMAPHORE_BYTES: usize = 128;
/// Bytes of a separate `expected` counter (a line).
const EXPECTED_BYTES: usize = 64;

/// The spin limit: [`SPIN_LIMIT_VAR`], else [`DEFAULT_SPIN_LIMIT`].
pub fn spin_limit() -> Result<u64> {
    match std::env::var(SPIN_LIMIT_VAR) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{SPIN_LIMIT_VAR}='{v}' is not a positive number"))
            }),
        Err(_) => Ok(DEFAULT_SPIN_LIMIT),
    }
}

/// Sends `local` to `peer` and receives the peer's registration in return (under `tag`).
/// Collective between the two ranks.
pub(crate) fn swap_registrations(
    bootstrap: &Bootstrap,
    device: &AnyDevice,
    peer: u32,
    tag: u32,
    local: &RegisteredMemory,
) -> Result<RemoteMemory> {
    let rank = bootstrap.rank();
    if peer == rank || peer >= bootstrap.world_size() {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} cannot pair with rank {peer} (world size {})",
            bootstrap.world_size()
        ))
        .at_rank(rank));
    }
    bootstrap.send(peer, tag, &local.to_bytes())?;
    let bytes = bootstrap.recv(peer, tag)?;
    let remote = RemoteMemory::from_bytes(&bytes, device, rank).map_err(|e| e.at_rank(rank))?;
    if remote.rank() != peer {
        return Err(Error::InvalidArgument(format!(
            "rank {peer} sent a registration of rank {} on tag {tag}",
            remote.rank()
        ))
        .at_rank(rank));
    }
    Ok(remote)
}

/// Device address of byte `at` of `memory`.
fn addr(memory: &Backing, at: usize) -> Result<*mut u64> {
    Ok(oxccl_kernels::abi::ptr(memory.ptr().offset(at)?))
}

/// The host address of host-addressable memory, or an error for device memory of a GPU.
fn host_base(memory: &Backing, what: &str) -> Result<*mut u8> {
    memory.host_ptr().ok_or_else(|| {
        Error::Unsupported(format!(
            "{what} needs host-addressable memory; {} device memory is not",
            memory.backend()
        ))
    })
}

/// Device-to-device semaphore between this rank and one peer (see the module docs).
#[derive(Debug)]
pub struct DeviceSemaphore {
    peer: u32,
    memory: Backing,
    local: RegisteredMemory,
    remote: RemoteMemory,
    max_spins: u64,
}

impl DeviceSemaphore {
    /// Builds the semaphore with `peer`. Collective between the two ranks (same `tag`).
    ///
    /// Fails with [`Error::Unsupported`] when the peer's counter cannot be mapped here (it
    /// is on another node, or of another backend): device-to-device semaphores need IPC.
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        tag: u32,
    ) -> Result<DeviceSemaphore> {
        let rank = bootstrap.rank();
        let _span = tracing::debug_span!("device_semaphore", rank, peer).entered();
        let memory = Backing::zeroed(device, SEMAPHORE_BYTES, MemoryKind::Coherent, false)?;
        let local = RegisteredMemory::range(
            device,
            rank,
            memory.clone(),
            0,
            8,
            TransportSet::of(&[Transport::Ipc]),
        )?;
        let remote = swap_registrations(bootstrap, device, peer, tag, &local)?;
        if remote.ptr().is_none() {
            return Err(Error::Unsupported(format!(
                "rank {peer}'s semaphore is not mapped into rank {rank} (another node or \
                 backend): device-to-device semaphores need same-node IPC; use a PortChannel"
            ))
            .at_rank(rank));
        }
        Ok(DeviceSemaphore {
            peer,
            memory,
            local,
            remote,
            max_spins: spin_limit()?,
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// Overrides the spin limit of the handle's waits (0 = wait forever: avoid).
    pub fn set_max_spins(&mut self, max_spins: u64) {
        self.max_spins = max_spins;
    }

    /// The registration of this rank's inbound counter.
    pub fn local(&self) -> &RegisteredMemory {
        &self.local
    }

    /// The device handle (valid while `self` lives).
    pub fn handle(&self) -> Result<OxcclDeviceSemaphore> {
        let remote = self.remote.ptr().ok_or_else(|| {
            Error::Unsupported(format!("rank {}'s semaphore is not mapped", self.peer))
        })?;
        Ok(OxcclDeviceSemaphore {
            inbound: addr(&self.memory, 0)?,
            remote_inbound: oxccl_kernels::abi::ptr(remote),
            expected_inbound: addr(&self.memory, EXPECTED_AT)?,
            max_spins: self.max_spins,
        })
    }
}

/// The counter a GPU waits on, written by the peer's proxy through a [`Connection`]; this
/// side's proxy signals the peer through the same connection.
#[derive(Debug)]
pub struct HostDeviceSemaphore {
    peer: u32,
    memory: Backing,
    /// The waiter's `expected` counter when `memory` is pinned host memory: device memory,
    /// so a GPU wait does not cross PCIe to read and write it (only the GPU touches it).
    expected: Option<Backing>,
    local: RegisteredMemory,
    remote: RemoteMemory,
    /// Signals sent so far (the proxy stores `outbound + 1` into the peer's counter).
    outbound: AtomicU64,
    max_spins: u64,
}

impl HostDeviceSemaphore {
    /// Builds the semaphore over `connection` (to its peer). Collective between the two
    /// ranks (same `tag`); the counter is registered for the connection's transport. Over
    /// TCP it lives in pinned host memory: the peer's receiver thread then signals with one
    /// atomic store instead of a stream write it has to wait for, and the GPU polls it
    /// through its mapping; the waiter's own count of signals stays in device memory.
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        connection: &Connection,
        tag: u32,
    ) -> Result<HostDeviceSemaphore> {
        let rank = bootstrap.rank();
        let peer = connection.peer();
        let _span = tracing::debug_span!("host_device_semaphore", rank, peer).entered();
        let host_mapped = connection.transport() == Transport::Tcp;
        let memory = Backing::zeroed(device, SEMAPHORE_BYTES, MemoryKind::Coherent, host_mapped)?;
        let expected = host_mapped
            .then(|| Backing::zeroed(device, EXPECTED_BYTES, MemoryKind::Coherent, false))
            .transpose()?;
        let local = RegisteredMemory::range(
            device,
            rank,
            memory.clone(),
            0,
            8,
            TransportSet::of(&[connection.transport()]),
        )?;
        let remote = swap_registrations(bootstrap, device, peer, tag, &local)?;
        Ok(HostDeviceSemaphore {
            peer,
            memory,
            expected,
            local,
            remote,
            outbound: AtomicU64::new(0),
            max_spins: spin_limit()?,
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The registration of this rank's inbound counter (what the peer's proxy writes).
    pub fn local(&self) -> &RegisteredMemory {
        &self.local
    }

    /// Overrides the spin limit of the handle's waits.
    pub fn set_max_spins(&mut self, max_spins: u64) {
        self.max_spins = max_spins;
    }

    /// The device handle for waiting (valid while `self` lives).
    pub fn handle(&self) -> Result<OxcclHostDeviceSemaphore> {
        Ok(OxcclHostDeviceSemaphore {
            inbound: addr(&self.memory, 0)?,
            expected_inbound: match &self.expected {
                Some(e) => addr(e, 0)?,
                None => addr(&self.memory, EXPECTED_AT)?,
            },
            max_spins: self.max_spins,
            _pad0: 0,
        })
    }

    /// Signals the peer through `connection`: its counter becomes the number of signals
    /// sent, after every earlier write of the connection has landed. The proxy's operation.
    pub fn signal(&self, connection: &Connection) -> Result<()> {
        connection.update_and_sync(&self.remote, 0, self.next_signal())
    }

    /// Writes `bytes` from `src` into the peer's `dst`, then signals the peer, as one
    /// connection operation ([`Connection::write_and_update`]). The proxy's put-with-signal.
    pub fn write_and_signal(
        &self,
        connection: &Connection,
        (dst, dst_offset): (&RemoteMemory, usize),
        (src, src_offset): (&RegisteredMemory, usize),
        bytes: usize,
    ) -> Result<()> {
        let flag = (&self.remote, 0, self.next_signal());
        connection.write_and_update(dst, dst_offset, src, src_offset, bytes, flag)
    }

    /// The count the peer's counter takes with the next signal.
    fn next_signal(&self) -> u64 {
        self.outbound.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Host-to-host semaphore: a host thread signals the peer through a connection, and a host
/// thread of the peer waits. Its counter must be host-addressable (the host backend).
#[derive(Debug)]
pub struct HostSemaphore {
    inner: HostDeviceSemaphore,
    expected: AtomicU64,
}

impl HostSemaphore {
    /// Builds the semaphore over `connection`. Collective between the two ranks.
    ///
    /// Fails with [`Error::Unsupported`] when `device` allocates memory the host cannot
    /// address (GPU device memory).
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        connection: &Connection,
        tag: u32,
    ) -> Result<HostSemaphore> {
        let inner = HostDeviceSemaphore::connect(bootstrap, device, connection, tag)?;
        host_base(&inner.memory, "a host-to-host semaphore")?;
        Ok(HostSemaphore {
            inner,
            expected: AtomicU64::new(0),
        })
    }

    /// Signals the peer (after every earlier write of `connection` landed).
    pub fn signal(&self, connection: &Connection) -> Result<()> {
        self.inner.signal(connection)
    }

    /// Waits for the peer's next signal, or [`Error::Timeout`] after `timeout`.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let base = host_base(&self.inner.memory, "a host-to-host semaphore")?;
        // SAFETY: the counter is the first 8 bytes of `self.inner.memory`, which lives as
        // long as `self`; every agent (peer proxies, this thread) accesses it atomically.
        let flag = unsafe { HostFlag::from_ptr(base) }?
            .with_name(format!("signal from rank {}", self.inner.peer));
        let want = self.expected.load(Ordering::Relaxed) + 1;
        flag.wait_at_least(want, timeout)?;
        self.expected.store(want, Ordering::Relaxed);
        Ok(())
    }
}

/// The result of a host-side wait.
fn timeout(what: &str, polls: u64, seen: u64, want: u64) -> Error {
    Error::Timeout {
        what: format!("{what} to reach {want} (last seen {seen}) within {polls} polls"),
        waited: Duration::ZERO,
    }
}

/// Polls `counter` until it is at least `want`, at most `max_spins` polls (0 = unbounded);
/// yields the CPU after the first polls; returns the value that reached `want`. The host
/// version of `poll_until_at_least`.
///
/// # Safety
/// `counter` must point to a live, 8-byte aligned counter accessed only atomically.
pub unsafe fn host_poll(counter: *const u64, want: u64, max_spins: u64, what: &str) -> Result<u64> {
    // SAFETY: the caller's obligations.
    let c = unsafe { AtomicU64::from_ptr(counter.cast_mut()) };
    let mut polls = 0u64;
    loop {
        let seen = c.load(Ordering::Acquire);
        if seen >= want {
            return Ok(seen);
        }
        polls += 1;
        if max_spins != 0 && polls >= max_spins {
            return Err(timeout(what, polls, seen, want));
        }
        if polls < SPINS_BEFORE_YIELD {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// `DeviceSemaphore::signal` of semaphore.hpp on the host: a release add on the peer's
/// counter.
///
/// # Safety
/// The handle's pointers must be live host-addressable counters (host backend), accessed
/// only atomically.
pub unsafe fn host_signal(h: &OxcclDeviceSemaphore) {
    // SAFETY: the caller's obligations.
    unsafe { AtomicU64::from_ptr(h.remote_inbound) }.fetch_add(1, Ordering::Release);
}

/// Relaxed signal: counts without ordering earlier writes.
///
/// # Safety
/// As [`host_signal`].
pub unsafe fn host_relaxed_signal(h: &OxcclDeviceSemaphore) {
    // SAFETY: the caller's obligations.
    unsafe { AtomicU64::from_ptr(h.remote_inbound) }.fetch_add(1, Ordering::Relaxed);
}

/// Waits for the next signal (`DeviceSemaphore::wait` of semaphore.hpp). On timeout the
/// expected count is unchanged, so a retry waits for the same signal.
///
/// # Safety
/// As [`host_signal`]; only one thread waits on a semaphore at a time.
pub unsafe fn host_wait(inbound: *mut u64, expected: *mut u64, max_spins: u64) -> Result<()> {
    // SAFETY: the caller's obligations: `expected` is a live counter of this waiter.
    let e = unsafe { AtomicU64::from_ptr(expected) };
    let want = e.load(Ordering::Relaxed) + 1;
    // SAFETY: the caller's obligations.
    unsafe { host_poll(inbound, want, max_spins, "semaphore") }?;
    e.store(want, Ordering::Relaxed);
    Ok(())
}

/// Helpers for the channel tests: threads as ranks over the loopback bootstrap.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
pub(crate) mod testing {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;
    use std::time::Duration;

    use oxccl_backend::{AnyDevice, AnyMemory, AnyStream};
    use oxccl_hal::{
        BackendKind, Device, DeviceId, HostVisible, LaunchConfig, Memory, MemoryKind, Module,
        Stream,
    };
    use rand::{Rng, SeedableRng};

    use crate::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
    use crate::connection::{Transport, TransportSet};
    use crate::host_kernels::module_image;
    use crate::registered_memory::RegisteredMemory;
    use oxccl_kernels::abi::KernelArgs;

    pub(crate) fn device() -> AnyDevice {
        AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap()
    }

    /// Runs `f(bootstrap, device)` on `world` threads joined to one loopback job.
    pub(crate) fn with_ranks<T: Send>(
        world: u32,
        f: impl Fn(Bootstrap, AnyDevice) -> T + Sync,
    ) -> Vec<T> {
        let cfg = BootstrapConfig {
            timeout: Duration::from_secs(20),
        };
        let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .map(|rank| {
                    let (cfg, f) = (cfg.clone(), &f);
                    s.spawn(move || f(Bootstrap::new(&id, rank, world, &cfg).unwrap(), device()))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// `n` random non-zero bytes (zero is the poison).
    pub(crate) fn random_nonzero(seed: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
        v.iter_mut().filter(|b| **b == 0).for_each(|b| *b = 0xa5);
        v
    }

    pub(crate) fn base(m: &AnyMemory) -> *mut u8 {
        match m {
            AnyMemory::Host(h) => h.host_ptr(),
            #[allow(unreachable_patterns)]
            _ => panic!("host memory expected"),
        }
    }

    pub(crate) fn write(m: &AnyMemory, at: usize, data: &[u8]) {
        assert!(at + data.len() <= m.len());
        // SAFETY: inside the live allocation (asserted); the protocol keeps peers off it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base(m).add(at), data.len()) };
    }

    pub(crate) fn read(m: &AnyMemory, at: usize, len: usize) -> Vec<u8> {
        assert!(at + len <= m.len());
        let mut out = vec![0u8; len];
        // SAFETY: inside the live allocation (asserted); writers have signalled.
        unsafe { std::ptr::copy_nonoverlapping(base(m).add(at), out.as_mut_ptr(), len) };
        out
    }

    /// A zero-filled allocation registered for IPC and TCP.
    pub(crate) fn buffer(
        b: &Bootstrap,
        d: &AnyDevice,
        len: usize,
    ) -> (Arc<AnyMemory>, RegisteredMemory) {
        let m = Arc::new(d.alloc(len, MemoryKind::Physical).unwrap());
        let reg = RegisteredMemory::new(
            d,
            b.rank(),
            Arc::clone(&m),
            TransportSet::of(&[Transport::Ipc, Transport::Tcp]),
        )
        .unwrap();
        (m, reg)
    }

    /// Launches a channel kernel on the host backend and waits for it.
    pub(crate) fn launch<A: KernelArgs>(
        d: &AnyDevice,
        stream: &AnyStream,
        name: &str,
        blocks: u32,
        a: &A,
    ) -> oxccl_hal::Result<()> {
        let module = d.load_module(&module_image(BackendKind::Host)?)?;
        let k = module.kernel(name)?;
        // SAFETY: the argument block names live host-backend channel memory (the callers
        // keep the channels alive until the synchronize below).
        unsafe { stream.launch(&k, &LaunchConfig::linear(blocks, 64), a.as_bytes())? };
        stream.synchronize()
    }
}
