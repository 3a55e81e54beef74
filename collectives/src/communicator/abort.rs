//! Aborting a communicator (NCCL's `ncclCommAbort`): a call waiting on a dead peer ends
//! promptly instead of at its timeout, and the communicator serves no more calls; and
//! seeing a kernel's failure without a synchronization (NCCL's `ncclCommGetAsyncError`).
//!
//! Every communicator owns two host words: 16 bytes of host memory mapped for the device
//! ([`oxccl_hal::Device::alloc_host`]: `cuMemHostAlloc` with `DEVICEMAP`, `hipHostMalloc`
//! mapped, plain shared memory on the host backend). Their device address is in the
//! argument block of every kernel with bounded waits (`abort_flag` in `abi_allreduce.h`).
//!
//! - The abort word: a wait that has lasted 1 ms reads it at each of its clock reads
//!   (every 256 polls; a call whose waits end sooner never reads it: thousands of threads
//!   reading host memory slowed the one-shots 50-100x) and ends with
//!   `OXCCL_ALLREDUCE_ERR_ABORTED` once it is non-zero. [`Communicator::abort`] sets it,
//!   from any thread, while kernels run: a release store to host memory, which the
//!   device's system-scope loads see without a kernel boundary. The word is never cleared:
//!   an aborted communicator stays aborted, and its kernels' counters no longer agree with
//!   the peers', so it must be dropped.
//! - The failure word: a kernel that records a failure in its scratch (a wait that timed
//!   out or was aborted, a bad argument block) also stores it here, so
//!   [`Communicator::async_error`] reads it from the host while the stream still runs or
//!   a graph is being captured. Only failing calls write it: the calls that succeed do
//!   nothing more than before.

use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_backend::{AnyDevice, AnyHostMemory};
use oxccl_hal::{Device, DevicePtr, Error, HostVisible, Memory, Result};
use oxccl_kernels::abi::{OXCCL_HOST_WORDS, OXCCL_HOST_WORD_ABORT, OXCCL_HOST_WORD_FAILURE};

use super::Communicator;

/// The communicator's host words (see the module docs and `OXCCL_HOST_WORDS` in
/// `abi_allreduce.h`): the abort word, which the host sets and the kernels' waits read, and
/// the failure word, where the kernels mirror the first failure they record. Freed on drop.
#[derive(Debug)]
pub(crate) struct HostWords {
    memory: AnyHostMemory,
}

impl HostWords {
    /// Allocates the words on `device`, cleared.
    pub(crate) fn new(device: &AnyDevice) -> Result<HostWords> {
        let bytes = 8 * OXCCL_HOST_WORDS as usize;
        let memory = device.alloc_host(bytes)?;
        let host = memory.host_ptr();
        if host.is_null() || (host as usize) % 8 != 0 || memory.len() < bytes {
            return Err(Error::InvalidArgument(format!(
                "the communicator's host words at {host:?} ({} bytes) are not {bytes} \
                 8-aligned bytes",
                memory.len()
            )));
        }
        let words = HostWords { memory };
        // Not every backend's pinned memory starts zeroed (hipHostMalloc).
        for index in 0..OXCCL_HOST_WORDS {
            words.cell(index).store(0, Ordering::Release);
        }
        Ok(words)
    }

    fn cell(&self, index: u32) -> &AtomicU64 {
        debug_assert!(index < OXCCL_HOST_WORDS);
        // SAFETY: OXCCL_HOST_WORDS words of host memory, 8-byte aligned (both checked in
        // `new`), mapped as long as `self.memory` lives (borrowed with `self`); the host
        // touches them only through this atomic and the device only through system-scope
        // loads and stores.
        unsafe { AtomicU64::from_ptr(self.memory.host_ptr().cast::<u64>().add(index as usize)) }
    }

    /// The words as the device sees them (what the argument blocks carry as `abort_flag`).
    pub(crate) fn device_ptr(&self) -> DevicePtr {
        self.memory.ptr()
    }

    /// Sets the abort word; true when it was set already.
    fn set(&self) -> bool {
        self.cell(OXCCL_HOST_WORD_ABORT).swap(1, Ordering::AcqRel) != 0
    }

    /// Whether the abort word is set.
    pub(crate) fn is_set(&self) -> bool {
        self.cell(OXCCL_HOST_WORD_ABORT).load(Ordering::Acquire) != 0
    }

    /// The failure word: 0, or the first failure a kernel recorded (`device_error::decode`).
    pub(crate) fn failure(&self) -> u64 {
        self.cell(OXCCL_HOST_WORD_FAILURE).load(Ordering::Acquire)
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

    /// The first failure this rank's kernels recorded, read from host memory without
    /// synchronizing anything (NCCL's `ncclCommGetAsyncError`): a wait that timed out
    /// ([`Error::Timeout`], naming the peer), one that ended because the communicator was
    /// aborted ([`Error::Aborted`]), or a rejected argument block. `Ok` while none failed,
    /// also while kernels are still running or a graph is being captured. The kernels
    /// store the word before they return, so a failure shows here no later than the
    /// stream's synchronization would show it; [`Communicator::check_error`] remains the
    /// way to wait for the outcome. Calls refused on the host (bad arguments, a call after
    /// an abort) return their error directly and do not show here.
    pub fn async_error(&self) -> Result<()> {
        crate::device_error::decode(self.abort.failure(), "the kernels", self.config.timeout)
            .map_err(|e| e.at_rank(self.rank))
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
