//! The proxy: one thread per device that turns PortChannel triggers into transfers.
//!
//! Build a [`ProxyBuilder`] on a device, register memories (local sources, remote
//! destinations) and semaphores (each bound to its [`Connection`]); take PortChannel
//! handles from it ([`ProxyBuilder::port_channel`]); then [`ProxyBuilder::start`] the
//! thread. It pops triggers in FIFO order and, for each:
//! - DATA: `connection.write(dst, dst_offset, src, src_offset, size)`;
//! - FLAG: the semaphore's `signal` (`update_and_sync` of the next count into the peer's
//!   counter, after every earlier write of the connection);
//! - SYNC: `connection.flush` before the tail passes the trigger (what a device flush
//!   waits for).
//!
//! An operation that fails poisons the proxy: the error is kept ([`Proxy::error`]), later
//! triggers are retired without being performed (so producers never stall on a dead
//! proxy; the peer's waits time out), and dropping the [`Proxy`] stops the thread.
//!
//! Placement: the thread pins itself to the CPUs in `OXCCL_PROXY_CPUS` (a list such as
//! `0-7,64-71`; on a GPU node, the cores of the GPU's NUMA node), else runs where the
//! scheduler puts it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use oxccl_backend::AnyDevice;
use oxccl_hal::{Error, Result};
use oxccl_kernels::abi::{self, OxcclPortChannel};

use crate::connection::Connection;
use crate::fifo::{Fifo, FifoConsumer, Trigger, TriggerKind, DEFAULT_FIFO_SIZE};
use crate::registered_memory::{RegisteredMemory, RemoteMemory};
use crate::semaphore::HostDeviceSemaphore;
use crate::timeline::{self, Event};

/// Environment variable with the CPUs the proxy thread is pinned to.
pub const PROXY_CPUS_VAR: &str = "OXCCL_PROXY_CPUS";
/// How long a SYNC trigger's flush may take before the proxy reports a timeout.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);
/// Empty polls before the idle proxy yields its core between polls.
const IDLE_SPINS: u32 = 1 << 12;

/// A memory the proxy knows by id.
#[derive(Debug)]
enum MemoryEntry {
    Local(RegisteredMemory),
    Remote(Box<RemoteMemory>),
}

#[derive(Debug)]
struct SemaphoreEntry {
    connection: Arc<Connection>,
    semaphore: Arc<HostDeviceSemaphore>,
}

#[derive(Debug, Default)]
struct Tables {
    memories: Vec<MemoryEntry>,
    semaphores: Vec<SemaphoreEntry>,
}

/// Collects what a proxy serves, before its thread starts.
#[derive(Debug)]
pub struct ProxyBuilder {
    fifo: Fifo,
    tables: Tables,
    device: u32,
}

impl ProxyBuilder {
    /// A proxy for `device` with a FIFO of `fifo_size` slots (a power of two; `None`:
    /// [`DEFAULT_FIFO_SIZE`]).
    pub fn new(device: &AnyDevice, fifo_size: Option<u32>) -> Result<ProxyBuilder> {
        use oxccl_hal::Device;
        Ok(ProxyBuilder {
            fifo: Fifo::new(device, fifo_size.unwrap_or(DEFAULT_FIFO_SIZE))?,
            tables: Tables::default(),
            device: device.id().0,
        })
    }

    fn add_memory(&mut self, entry: MemoryEntry) -> Result<u32> {
        let id = self.tables.memories.len() as u32;
        if id >= abi::OXCCL_TRIGGER_MAX_MEMORIES {
            return Err(Error::InvalidArgument(format!(
                "a proxy serves at most {} memories",
                abi::OXCCL_TRIGGER_MAX_MEMORIES
            )));
        }
        self.tables.memories.push(entry);
        Ok(id)
    }

    /// Registers a local source memory; returns its id.
    pub fn add_local_memory(&mut self, memory: RegisteredMemory) -> Result<u32> {
        Self::check_len(memory.len())?;
        self.add_memory(MemoryEntry::Local(memory))
    }

    /// Registers a peer's destination memory; returns its id.
    pub fn add_remote_memory(&mut self, memory: RemoteMemory) -> Result<u32> {
        Self::check_len(memory.len())?;
        self.add_memory(MemoryEntry::Remote(Box::new(memory)))
    }

    fn check_len(len: usize) -> Result<()> {
        // Trigger offsets are 32 bits: a larger registration would be partly unreachable.
        if len > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a PortChannel memory of {len} bytes: register ranges of at most 4 GiB"
            )));
        }
        Ok(())
    }

    /// Registers a semaphore and the connection its signals (and the data of the channels
    /// using it) travel on; returns its id.
    pub fn add_semaphore(
        &mut self,
        connection: Arc<Connection>,
        semaphore: Arc<HostDeviceSemaphore>,
    ) -> Result<u32> {
        let id = self.tables.semaphores.len() as u32;
        if id >= abi::OXCCL_TRIGGER_MAX_SEMAPHORES {
            return Err(Error::InvalidArgument(format!(
                "a proxy serves at most {} semaphores",
                abi::OXCCL_TRIGGER_MAX_SEMAPHORES
            )));
        }
        if connection.peer() != semaphore.peer() {
            return Err(Error::InvalidArgument(format!(
                "semaphore with rank {} on a connection to rank {}",
                semaphore.peer(),
                connection.peer()
            )));
        }
        self.tables.semaphores.push(SemaphoreEntry {
            connection,
            semaphore,
        });
        Ok(id)
    }

    /// The device handle of a PortChannel through this proxy: puts copy from local memory
    /// `src_memory_id` to remote memory `dst_memory_id` over semaphore `semaphore_id`'s
    /// connection. Valid while the proxy (and this builder's FIFO) lives.
    pub fn port_channel(
        &self,
        semaphore_id: u32,
        dst_memory_id: u32,
        src_memory_id: u32,
    ) -> Result<OxcclPortChannel> {
        let sem = self
            .tables
            .semaphores
            .get(semaphore_id as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("no semaphore {semaphore_id}")))?;
        match self.tables.memories.get(dst_memory_id as usize) {
            Some(MemoryEntry::Remote(r)) if r.rank() == sem.semaphore.peer() => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "memory {dst_memory_id} is not a remote memory of rank {}",
                    sem.semaphore.peer()
                )))
            }
        }
        if !matches!(
            self.tables.memories.get(src_memory_id as usize),
            Some(MemoryEntry::Local(_))
        ) {
            return Err(Error::InvalidArgument(format!(
                "memory {src_memory_id} is not a local memory"
            )));
        }
        Ok(OxcclPortChannel {
            fifo: self.fifo.handle()?,
            semaphore: sem.semaphore.handle()?,
            semaphore_id,
            dst_memory_id,
            src_memory_id,
            _pad0: 0,
        })
    }

    /// Starts the proxy thread.
    pub fn start(self) -> Result<Proxy> {
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let consumer = self.fifo.consumer();
        let tables = Arc::new(self.tables);
        let worker = Worker {
            consumer,
            tables: Arc::clone(&tables),
            stop: Arc::clone(&stop),
            error: Arc::clone(&error),
        };
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-proxy-{}", self.device))
            .spawn(move || worker.run())
            .map_err(|e| Error::Os {
                call: "spawn (proxy thread)",
                source: e,
            })?;
        Ok(Proxy {
            thread: Some(thread),
            stop,
            error,
            _tables: tables,
            fifo: self.fifo,
        })
    }
}

/// A running proxy; stops its thread when dropped.
#[derive(Debug)]
pub struct Proxy {
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
    _tables: Arc<Tables>,
    // Declared last: dropped after the thread has been joined (it reads the ring).
    fifo: Fifo,
}

impl Proxy {
    /// The first operation that failed, if any (the proxy is poisoned from then on).
    pub fn error(&self) -> Option<Error> {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|m| Error::PeerLost(m.clone()))
    }

    /// The FIFO's size.
    pub fn fifo_size(&self) -> u32 {
        self.fifo.size()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::warn!("the proxy thread panicked");
            }
        }
    }
}

struct Worker {
    consumer: FifoConsumer,
    tables: Arc<Tables>,
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
}

impl Worker {
    fn run(mut self) {
        pin_from_env();
        let mut idle = 0u32;
        let mut poisoned = false;
        while !self.stop.load(Ordering::Acquire) {
            let Some(raw) = self.consumer.peek() else {
                idle = idle.saturating_add(1);
                if idle < IDLE_SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            };
            idle = 0;
            if !poisoned {
                if let Err(e) = self.perform(Trigger::decode(raw)) {
                    tracing::error!(error = %e, "proxy operation failed; the proxy is poisoned");
                    *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    poisoned = true;
                }
            }
            self.consumer.pop();
        }
    }

    fn perform(&self, t: Trigger) -> Result<()> {
        let sem = self
            .tables
            .semaphores
            .get(t.semaphore_id as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("trigger names no semaphore {t:?}")))?;
        let peer = sem.connection.peer();
        timeline::record(Event::Picked, u32::MAX, peer);
        if t.kind.has(TriggerKind::DATA) && t.size > 0 {
            let src = match self.tables.memories.get(t.src_memory_id as usize) {
                Some(MemoryEntry::Local(m)) => m,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "bad source memory in {t:?}"
                    )))
                }
            };
            let dst = match self.tables.memories.get(t.dst_memory_id as usize) {
                Some(MemoryEntry::Remote(m)) => m,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "bad destination memory in {t:?}"
                    )))
                }
            };
            let (dst, src) = (
                (&**dst, t.dst_offset as usize),
                (src, t.src_offset as usize),
            );
            if t.kind.has(TriggerKind::FLAG) {
                // Data and signal as one operation (one send on TCP for a small put).
                sem.semaphore
                    .write_and_signal(&sem.connection, dst, src, t.size as usize)?;
            } else {
                sem.connection
                    .write(dst.0, dst.1, src.0, src.1, t.size as usize)?;
            }
        } else if t.kind.has(TriggerKind::FLAG) {
            sem.semaphore.signal(&sem.connection)?;
        }
        if t.kind.has(TriggerKind::SYNC) {
            sem.connection.flush(FLUSH_TIMEOUT)?;
        }
        timeline::record(Event::Sent, u32::MAX, peer);
        Ok(())
    }
}

/// Parses a CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    let bad = || Error::InvalidArgument(format!("{PROXY_CPUS_VAR}='{s}' is not a CPU list"));
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: usize = a.trim().parse().map_err(|_| bad())?;
        let b: usize = b.trim().parse().map_err(|_| bad())?;
        if a > b || b >= 4096 {
            return Err(bad());
        }
        cpus.extend(a..=b);
    }
    if cpus.is_empty() {
        return Err(bad());
    }
    Ok(cpus)
}

fn pin_from_env() {
    let Ok(list) = std::env::var(PROXY_CPUS_VAR) else {
        return;
    };
    let pinned = parse_cpu_list(&list).and_then(|cpus| {
        let mut set = nix::sched::CpuSet::new();
        for c in cpus {
            set.set(c).map_err(|e| Error::errno("CpuSet::set", e))?;
        }
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .map_err(|e| Error::errno("sched_setaffinity", e))
    });
    match pinned {
        Ok(()) => tracing::debug!(cpus = %list, "proxy thread pinned"),
        Err(e) => tracing::warn!(error = %e, "proxy thread not pinned"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_cpu_list("0-3,8").ok(), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpu_list(" 5 ").ok(), Some(vec![5]));
        for bad in ["", "3-1", "x", "1-", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }
}
