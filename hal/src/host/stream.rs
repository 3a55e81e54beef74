//! Host-backend streams and events: an in-order queue executed by one worker thread.
//!
//! Each stream owns a worker that runs its operations in the order they were queued, like a
//! GPU stream. An operation that fails does not stop the queue (later work still runs, so
//! events still complete); the first failure is kept and reported once, by the next
//! [`Stream::synchronize`], [`Stream::write`] or [`Stream::read`].
//!
//! Every blocking wait is bounded by [`WAIT_LIMIT`]: a host kernel that never returns, or an
//! event that is never reached, surfaces as [`Error::Timeout`] instead of hanging a CI run.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::memory::check_range;
use super::module::HostKernel;
use super::HostBackend;
use crate::api::{Event, Stream};
use crate::error::{Error, Result};
use crate::launch::{HostKernelFn, LaunchConfig};
use crate::types::{BackendKind, DevicePtr};

/// Upper bound on any wait for queued host work.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Locks a mutex whose data stays consistent even if a holder panicked (every update below
/// is a single assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum Op {
    Copy {
        dst: usize,
        src: usize,
        bytes: usize,
    },
    Fill {
        dst: usize,
        value: u8,
        bytes: usize,
    },
    Write {
        dst: usize,
        data: Vec<u8>,
        done: Sender<()>,
    },
    Read {
        src: usize,
        bytes: usize,
        done: Sender<Vec<u8>>,
    },
    Launch {
        name: &'static str,
        f: HostKernelFn,
        config: LaunchConfig,
        args: Vec<u8>,
    },
    Record {
        event: Arc<EventState>,
        generation: u64,
    },
    Wait {
        event: Arc<EventState>,
        generation: u64,
    },
    Marker(Sender<()>),
}

/// An in-order queue of host work run by its own worker thread.
#[derive(Debug)]
pub struct HostStream {
    queue: Mutex<Option<Sender<Op>>>,
    first_error: Arc<Mutex<Option<Error>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl HostStream {
    pub(crate) fn new() -> Result<HostStream> {
        let (tx, rx) = mpsc::channel();
        let first_error = Arc::new(Mutex::new(None));
        let errors = Arc::clone(&first_error);
        let worker = std::thread::Builder::new()
            .name("oxccl-host-stream".into())
            .spawn(move || run_worker(rx, errors))
            .map_err(|source| Error::Os {
                call: "spawn stream worker",
                source,
            })?;
        Ok(HostStream {
            queue: Mutex::new(Some(tx)),
            first_error,
            worker: Mutex::new(Some(worker)),
        })
    }

    fn push(&self, op: Op) -> Result<()> {
        let queue = lock(&self.queue);
        let sent = queue.as_ref().map(|q| q.send(op));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(worker_gone()),
        }
    }

    fn take_error(&self) -> Result<()> {
        match lock(&self.first_error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn worker_gone() -> Error {
    Error::Backend {
        backend: BackendKind::Host,
        call: "stream",
        code: -1,
        name: "HOST_STREAM_WORKER_GONE".into(),
        message: "the stream's worker thread has stopped".into(),
    }
}

fn run_worker(rx: Receiver<Op>, first_error: Arc<Mutex<Option<Error>>>) {
    for op in rx {
        if let Err(e) = execute(op) {
            tracing::debug!(error = %e, "host stream operation failed");
            let mut slot = lock(&first_error);
            if slot.is_none() {
                *slot = Some(e);
            }
        }
    }
}

fn execute(op: Op) -> Result<()> {
    match op {
        Op::Copy { dst, src, bytes } => {
            // SAFETY: `Stream::copy`'s caller promised both ranges are live and disjoint
            // until the copy has run, and both were checked to be host-backend memory.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
            Ok(())
        }
        Op::Fill { dst, value, bytes } => {
            // SAFETY: `Stream::fill`'s caller promised the range is live until the fill has
            // run, and it was checked to be host-backend memory.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
            Ok(())
        }
        Op::Write { dst, data, done } => {
            // SAFETY: the range was checked to be live host-backend memory when queued, and
            // `write` blocks until `done` fires, so nothing freed it through this stream.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
            // The writer may have given up waiting (timeout); nothing more to tell it.
            let _ = done.send(());
            Ok(())
        }
        Op::Read { src, bytes, done } => {
            let mut out = vec![0u8; bytes];
            // SAFETY: as for `Write`: a checked live range; `out` is a fresh buffer.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), bytes) };
            let _ = done.send(out);
            Ok(())
        }
        Op::Launch {
            name,
            f,
            config,
            args,
        } => {
            // A panicking host kernel must not take the worker (and every later operation
            // of the stream) down with it; it becomes the stream's error instead.
            let outcome = std::panic::catch_unwind(|| f(&config, &args));
            match outcome {
                Ok(result) => result,
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string panic".into());
                    Err(Error::Backend {
                        backend: BackendKind::Host,
                        call: name,
                        code: -1,
                        name: "HOST_KERNEL_PANIC".into(),
                        message,
                    })
                }
            }
        }
        Op::Record { event, generation } => {
            event.complete(generation);
            Ok(())
        }
        Op::Wait { event, generation } => event.wait_for(generation, WAIT_LIMIT),
        Op::Marker(done) => {
            let _ = done.send(());
            Ok(())
        }
    }
}

impl Stream<HostBackend> for HostStream {
    fn synchronize(&self) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        self.push(Op::Marker(tx))?;
        rx.recv_timeout(WAIT_LIMIT).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => Error::Timeout {
                what: "host stream to drain".into(),
                waited: WAIT_LIMIT,
            },
            mpsc::RecvTimeoutError::Disconnected => worker_gone(),
        })?;
        self.take_error()
    }

    fn record(&self, event: &HostEvent) -> Result<()> {
        let generation = event.state.issue();
        self.push(Op::Record {
            event: Arc::clone(&event.state),
            generation,
        })
    }

    fn wait_event(&self, event: &HostEvent) -> Result<()> {
        // Like CUDA: wait for the most recent record issued before this call; an event never
        // recorded is already complete.
        let generation = event.state.issued();
        if generation == 0 {
            return Ok(());
        }
        self.push(Op::Wait {
            event: Arc::clone(&event.state),
            generation,
        })
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return self.take_error();
        }
        check_range(dst, src.len(), "stream write")?;
        let (tx, rx) = mpsc::channel();
        self.push(Op::Write {
            dst: dst.0 as usize,
            data: src.to_vec(),
            done: tx,
        })?;
        wait_done(&rx, "host stream write")?;
        self.take_error()
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return self.take_error();
        }
        check_range(src, dst.len(), "stream read")?;
        let (tx, rx) = mpsc::channel();
        self.push(Op::Read {
            src: src.0 as usize,
            bytes: dst.len(),
            done: tx,
        })?;
        let data = wait_done(&rx, "host stream read")?;
        dst.copy_from_slice(&data);
        self.take_error()
    }

    unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(dst, bytes, "stream copy destination")?;
        check_range(src, bytes, "stream copy source")?;
        let (d, s) = (dst.0, src.0);
        let overlap = d < s.saturating_add(bytes as u64) && s < d.saturating_add(bytes as u64);
        if overlap {
            return Err(Error::InvalidArgument(format!(
                "copy of {bytes} bytes from {src} to {dst}: the ranges overlap"
            )));
        }
        self.push(Op::Copy {
            dst: d as usize,
            src: s as usize,
            bytes,
        })
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(dst, bytes, "stream fill")?;
        self.push(Op::Fill {
            dst: dst.0 as usize,
            value,
            bytes,
        })
    }

    unsafe fn launch(&self, kernel: &HostKernel, config: &LaunchConfig, args: &[u8]) -> Result<()> {
        if config.total_threads() == 0 {
            return Err(Error::InvalidArgument(format!(
                "launch of {} with an empty grid or block {config:?}",
                kernel.name
            )));
        }
        self.push(Op::Launch {
            name: kernel.name,
            f: kernel.f,
            config: *config,
            args: args.to_vec(),
        })
    }

    fn is_capturing(&self) -> Result<bool> {
        Ok(false)
    }
}

fn wait_done<T>(rx: &Receiver<T>, what: &str) -> Result<T> {
    rx.recv_timeout(WAIT_LIMIT).map_err(|e| match e {
        mpsc::RecvTimeoutError::Timeout => Error::Timeout {
            what: what.into(),
            waited: WAIT_LIMIT,
        },
        mpsc::RecvTimeoutError::Disconnected => worker_gone(),
    })
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // Closing the queue lets the worker finish what is queued and then stop.
        lock(&self.queue).take();
        if let Some(worker) = lock(&self.worker).take() {
            if worker.join().is_err() {
                tracing::warn!("host stream worker panicked");
            }
        }
        if let Some(e) = lock(&self.first_error).take() {
            tracing::warn!(error = %e, "host stream dropped with an unreported error");
        }
    }
}

#[derive(Debug, Default)]
struct EventProgress {
    /// Records issued so far (the generation of the latest).
    issued: u64,
    /// Highest generation the worker has reached.
    completed: u64,
    /// When the worker reached `completed`.
    at: Option<Instant>,
}

#[derive(Debug, Default)]
struct EventState {
    progress: Mutex<EventProgress>,
    reached: Condvar,
}

impl EventState {
    fn issue(&self) -> u64 {
        let mut p = lock(&self.progress);
        p.issued += 1;
        p.issued
    }

    fn issued(&self) -> u64 {
        lock(&self.progress).issued
    }

    fn complete(&self, generation: u64) {
        let mut p = lock(&self.progress);
        if generation > p.completed {
            p.completed = generation;
            p.at = Some(Instant::now());
        }
        self.reached.notify_all();
    }

    fn wait_for(&self, generation: u64, limit: Duration) -> Result<()> {
        let p = lock(&self.progress);
        let (p, timeout) = self
            .reached
            .wait_timeout_while(p, limit, |p| p.completed < generation)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if timeout.timed_out() && p.completed < generation {
            return Err(Error::Timeout {
                what: format!("host event record {generation} (reached {})", p.completed),
                waited: limit,
            });
        }
        Ok(())
    }
}

/// A marker in a host stream, with the time the worker reached it.
#[derive(Debug, Default)]
pub struct HostEvent {
    state: Arc<EventState>,
}

impl HostEvent {
    pub(crate) fn new() -> HostEvent {
        HostEvent::default()
    }

    fn completed_at(&self, which: &str) -> Result<Instant> {
        let p = lock(&self.state.progress);
        if p.issued == 0 {
            return Err(Error::InvalidArgument(format!(
                "{which} event was never recorded"
            )));
        }
        match p.at {
            Some(at) if p.completed == p.issued => Ok(at),
            _ => Err(Error::InvalidArgument(format!(
                "{which} event has not completed yet; synchronize it first"
            ))),
        }
    }
}

impl Event<HostBackend> for HostEvent {
    fn synchronize(&self) -> Result<()> {
        let generation = self.state.issued();
        if generation == 0 {
            return Ok(());
        }
        self.state.wait_for(generation, WAIT_LIMIT)
    }

    fn elapsed_ms_since(&self, start: &Self) -> Result<f32> {
        let begin = start.completed_at("start")?;
        let end = self.completed_at("end")?;
        let ms = match end.checked_duration_since(begin) {
            Some(d) => d.as_secs_f64() * 1e3,
            None => -(begin.duration_since(end).as_secs_f64() * 1e3),
        };
        Ok(ms as f32)
    }
}
