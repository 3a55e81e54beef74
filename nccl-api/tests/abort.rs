//! ncclCommAbort on the host backend, in one process: two ranks (`ncclCommInitAll`), one
//! allreduce on both (its signature checked across ranks), then rank 0 calls again while
//! rank 1 never does, and another thread aborts rank 0's communicator: the waiting call
//! returns an error naming the abort long before `OXCCL_TIMEOUT_MS` (60 s here), and
//! ncclCommAbort returns promptly. Every step runs on a thread of its own with a bound, so
//! a build whose abort does not reach the kernels' waits fails in seconds.

// Helpers outside #[test] functions panic too: a failed step is a failed test.
#![allow(clippy::expect_used, clippy::panic)]

use std::ffi::{c_void, CStr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl_nccl::exports::*;
use oxccl_nccl::types::*;

#[derive(Clone, Copy)]
struct SendPtr(Opaque);
// SAFETY: a communicator may be used from another thread (one thread at a time, except
// ncclCommAbort, which is what this test exercises).
unsafe impl Send for SendPtr {}

/// When the abort comes, after rank 0's lone call started.
const ABORT_AFTER: Duration = Duration::from_millis(200);
/// How long the aborted call and ncclCommAbort may take.
const PROMPT: Duration = Duration::from_secs(2);
/// The bound of any step that would hang if the abort did nothing.
const BOUND: Duration = Duration::from_secs(15);
const COUNT: usize = 1000;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// One in-place f32 sum of COUNT elements on `c`; its code and this thread's last error.
fn all_reduce(c: SendPtr, x: &mut [f32]) -> (NcclResult, String) {
    // SAFETY: COUNT floats of host memory (host backend), in place.
    let rc = unsafe {
        ncclAllReduce(
            x.as_ptr().cast(),
            x.as_mut_ptr().cast(),
            COUNT,
            NCCL_FLOAT32,
            NCCL_SUM,
            c.0,
            std::ptr::null_mut(),
        )
    };
    (
        rc,
        if rc == NCCL_SUCCESS {
            String::new()
        } else {
            last_error()
        },
    )
}

/// Runs `f` on a thread of its own: its result, or a panic naming `what` after [`BOUND`].
fn on_thread<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(what.into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawning a thread");
    rx
}

fn bounded<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(BOUND).unwrap_or_else(|_| {
        panic!("{what} did not return within {BOUND:?}: the abort did not end the wait")
    })
}

#[test]
fn abort_ends_a_call_waiting_on_a_silent_peer() {
    // The only test in this binary: nothing has read the environment yet. The host
    // backend (no real NCCL), and a wait bound far above the test's.
    std::env::set_var("OXCCL_BACKEND", "host");
    std::env::set_var("OXCCL_TIMEOUT_MS", "60000");
    let mut comms = [std::ptr::null_mut::<c_void>(); 2];
    let devs = [0, 1];
    // SAFETY: two slots and two device numbers.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, devs.as_ptr()) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    let [c0, c1] = comms.map(SendPtr);
    // Both ranks once: the call's signature is checked across ranks now, so rank 0's next
    // call of the same shape launches at once and waits in the kernel.
    let both: Vec<_> = [c0, c1]
        .into_iter()
        .map(|c| {
            on_thread("first allreduce", move || {
                all_reduce(c, &mut vec![1.0; COUNT])
            })
        })
        .collect();
    for rx in &both {
        let (rc, e) = bounded(rx, "the first allreduce");
        assert_eq!(rc, NCCL_SUCCESS, "{e}");
    }
    // Rank 0 alone: its kernel waits for rank 1, which never calls.
    let lone = on_thread("rank 0's lone call", move || {
        let t = Instant::now();
        let r = all_reduce(c0, &mut vec![1.0; COUNT]);
        (r, t.elapsed())
    });
    std::thread::sleep(ABORT_AFTER);
    let abort0 = on_thread("ncclCommAbort", move || {
        let c0 = c0; // the whole handle (Send), not its raw field
        let t = Instant::now();
        // SAFETY: a live communicator, released once.
        let rc = unsafe { ncclCommAbort(c0.0) };
        (
            rc,
            if rc == NCCL_SUCCESS {
                String::new()
            } else {
                last_error()
            },
            t.elapsed(),
        )
    });
    let ((rc, e), waited) = bounded(&lone, "rank 0's call");
    assert_ne!(rc, NCCL_SUCCESS, "the call completed without its peer");
    assert!(e.contains("aborted"), "not an abort: {e}");
    assert!(
        waited < ABORT_AFTER + PROMPT,
        "aborted only after {waited:?}: {e}"
    );
    let (rc, e, took) = bounded(&abort0, "ncclCommAbort");
    assert_eq!(rc, NCCL_SUCCESS, "{e}");
    assert!(took < PROMPT, "ncclCommAbort took {took:?}");
    // The handle is gone.
    let mut n = -1;
    // SAFETY: a valid out-pointer; the stale handle is refused without being read.
    let rc = unsafe { ncclCommUserRank(c0.0, &mut n) };
    assert_eq!(rc, NCCL_INVALID_ARGUMENT);
    // Rank 1 never ran the call: its abort releases it without waiting for rank 0.
    let abort1 = on_thread("ncclCommAbort of rank 1", move || {
        let c1 = c1;
        // SAFETY: a live communicator, released once.
        unsafe { ncclCommAbort(c1.0) }
    });
    assert_eq!(bounded(&abort1, "ncclCommAbort of rank 1"), NCCL_SUCCESS);
}
