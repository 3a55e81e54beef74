//! Aborting a communicator (NCCL's `ncclCommAbort`): a call waiting on a dead peer ends
//! promptly instead of at its timeout, and the communicator serves no more calls.
//!
//! Every communicator owns one abort word: 8 bytes of host memory mapped for the device
//! ([`oxccl_hal::Device::alloc_host`]: `cuMemHostAlloc` with `DEVICEMAP`, `hipHostMalloc`
//! mapped, plain shared memory on the host backend). Its device address is in the argument
//! block of every kernel with bounded waits (`abort_flag` in `abi_allreduce.h`); a wait
//! that has lasted 1 ms reads it at each of its clock reads (every 256 polls; a call whose
//! waits end sooner never reads it: thousands of threads reading host memory slowed the
//! one-shots 50-100x) and ends with `OXCCL_ALLREDUCE_ERR_ABORTED` once it is non-zero. [`Communicator::abort`] sets it, from any thread, while kernels run: a
//! release store to host memory, which the device's system-scope loads see without a
//! kernel boundary. The word is never cleared: an aborted communicator stays aborted, and
//! its kernels' counters no longer agree with the peers', so it must be dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_backend::{AnyDevice, AnyHostMemory};
use oxccl_hal::{Device, DevicePtr, Error, HostVisible, Memory, Result};

use super::Communicator;

/// The communicator's abort word (see the module docs). Freed on drop.
#[derive(Debug)]
pub(crate) struct AbortWord {
    memory: AnyHostMemory,
}

impl AbortWord {
    /// Allocates the word on `device`, cleared.
    pub(crate) fn new(device: &AnyDevice) -> Result<AbortWord> {
        let memory = device.alloc_host(8)?;
        let host = memory.host_ptr();
        if host.is_null() || (host as usize) % 8 != 0 || memory.len() < 8 {
            return Err(Error::InvalidArgument(format!(
                "the abort word's host memory at {host:?} ({} bytes) is not 8 aligned bytes",
                memory.len()
            )));
        }
        let word = AbortWord { memory };
        // Not every backend's pinned memory starts zeroed (hipHostMalloc).
        word.cell().store(0, Ordering::Release);
        Ok(word)
    }

    fn cell(&self) -> &AtomicU64 {
        // SAFETY: 8 bytes of host memory, 8-byte aligned (both checked in `new`), mapped as
        // long as `self.memory` lives (borrowed with `self`); the host touches them only
        // through this atomic and the device only through system-scope atomic loads.
        unsafe { AtomicU64::from_ptr(self.memory.host_ptr().cast::<u64>()) }
    }

    /// The word as the device sees it (what the argument blocks carry).
    pub(crate) fn device_ptr(&self) -> DevicePtr {
        self.memory.ptr()
    }

    /// Sets the word; true when it was set already.
    fn set(&self) -> bool {
        self.cell().swap(1, Ordering::AcqRel) != 0
    }

    /// Whether the word is set.
    pub(crate) fn is_set(&self) -> bool {
        self.cell().load(Ordering::Acquire) != 0
    }
}

impl Communicator {
    /// Aborts the communicator (NCCL's `ncclCommAbort`, the signalling half): every wait of
    /// this rank's kernels that is under way or starts later ends promptly, about a
    /// millisecond into the wait on GPUs (a wait reads the abort word once it has lasted
    /// 1 ms) instead of at the timeout, and reports [`Error::Aborted`] ([`Communicator::check_error`], or the
    /// host backend's stream); every later call on this communicator is refused with
    /// [`Error::Aborted`] before it launches anything. Local: no peer is told, and each
    /// rank aborts its own communicator (a peer waiting on this rank still ends at its
    /// timeout, unless it is aborted too).
    ///
    /// Callable from any thread while calls are in flight. Idempotent. The work already
    /// queued still runs and fails fast; synchronize the streams that ran this
    /// communicator's work before dropping it, then drop it or [`Communicator::destroy`] it
    /// (which, once aborted, does not wait for the peers). An aborted communicator cannot
    /// be used again: its kernels' counters no longer agree with the peers'.
    ///
    /// ```no_run
    /// # use oxccl_collectives::Communicator;
    /// # fn main() -> oxccl_collectives::hal::Result<()> {
    /// let comm = Communicator::from_env()?;
    /// let (done, finished) = std::sync::mpsc::channel::<()>();
    /// std::thread::scope(|s| {
    ///     // A watchdog: unless the work below is done within a minute, end whatever this
    ///     // rank is waiting for.
    ///     let watched = &comm;
    ///     s.spawn(move || {
    ///         if finished.recv_timeout(std::time::Duration::from_secs(60)).is_err() {
    ///             watched.abort();
    ///         }
    ///     });
    ///     // ... collectives on `comm` and `check_error`: one stuck on a dead peer ends with
    ///     // Error::Aborted once the watchdog fires ...
    ///     let _ = done.send(());
    /// });
    /// comm.destroy()
    /// # }
    /// ```
    pub fn abort(&self) {
        if !self.abort.set() {
            tracing::warn!(rank = self.rank, "communicator aborted");
        }
        // A call may wait on the host, not in a kernel: the exchange of unregistered
        // buffers, or a first call's signature check, both through the bootstrap.
        self.bootstrap.abort(
            "the communicator was aborted (Communicator::abort, ncclCommAbort); it serves no \
             more calls",
        );
    }

    /// Whether [`Communicator::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.abort.is_set()
    }

    /// [`Error::Aborted`] once the communicator was aborted (the check before every call).
    pub(crate) fn check_not_aborted(&self) -> Result<()> {
        if self.abort.is_set() {
            return Err(self.aborted_error());
        }
        Ok(())
    }

    /// The error of a call on an aborted communicator.
    pub(crate) fn aborted_error(&self) -> Error {
        Error::Aborted(format!(
            "the communicator of rank {} was aborted (Communicator::abort, ncclCommAbort): it \
             serves no more calls; drop or destroy it",
            self.rank
        ))
        .at_rank(self.rank)
    }
}
