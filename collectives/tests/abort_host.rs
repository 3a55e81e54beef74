//! Aborting a communicator on the host backend (`Communicator::abort`, NCCL's
//! `ncclCommAbort`): a call waiting on a peer that never makes it ends with
//! `Error::Aborted` soon after another thread aborts, long before its 60 s timeout, for a
//! flag-protocol one-shot (`oneshot_ll`: packet waits), a barrier kernel (`twoshot`: the
//! per-block barrier) and a PortChannel kernel (`port_channel`: the signal wait); then the
//! communicator refuses calls, reports the abort, and is destroyed without waiting for its
//! peer.
//!
//! `Communicator::async_error` (NCCL's `ncclCommGetAsyncError`) reports the abort, and,
//! without any synchronization, a call that timed out.
//!
//! Each case runs rank 0 on a thread of its own and waits for it with a bound of its own,
//! so a build in which abort does nothing fails in seconds instead of waiting out the
//! timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl_collectives::algorithms::all_reduce::one_shot::ONESHOT_LL;
use oxccl_collectives::algorithms::all_reduce::port_channel::PORT_CHANNEL;
use oxccl_collectives::algorithms::all_reduce::two_shot::TWOSHOT;
use oxccl_collectives::backend::{AnyDevice, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, Error, Memory, MemoryKind, ReduceOp, Stream,
};
use oxccl_collectives::{Algorithm, CommConfig, Communicator};

mod common;

/// The kernels' wait bound: what a call would wait without the abort.
const TIMEOUT: Duration = Duration::from_secs(60);
/// When the other thread aborts.
const ABORT_AFTER: Duration = Duration::from_millis(200);
/// How long the aborted call may take after the abort.
const PROMPT: Duration = Duration::from_secs(2);
/// The bound of the whole case (setup included): well below `TIMEOUT`.
const CASE_BOUND: Duration = Duration::from_secs(20);
/// Elements of the call (the launch `common::first_call_signature` describes on the host
/// backend: one block of 32 threads for each algorithm here).
const COUNT: usize = 4;

fn make(rank: u32, id: UniqueId, algorithm: Algorithm, timeout: Duration) -> Communicator {
    let bs = Bootstrap::new(&id, rank, 2, &BootstrapConfig::default()).unwrap();
    let dev = AnyDevice::open_with(BackendKind::Host, DeviceId(rank)).unwrap();
    let config = CommConfig {
        timeout,
        forced: Some(algorithm).into(),
        ..CommConfig::default()
    };
    Communicator::new(bs, dev, config).unwrap()
}

/// The call every case makes: an in-place f32 allreduce of COUNT elements in `m`.
fn call(
    comm: &Communicator,
    m: &impl Memory,
    stream: &AnyStream,
) -> oxccl_collectives::hal::Result<()> {
    // SAFETY: `m` holds 64 bytes, COUNT f32, and outlives the stream's work (every case
    // synchronizes, or nothing is launched).
    unsafe {
        comm.all_reduce(
            m.ptr(),
            m.ptr(),
            COUNT,
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            stream,
        )
    }
}

/// Rank 0 calls `algorithm` while rank 1 never does; another thread aborts rank 0 after
/// [`ABORT_AFTER`]. Returns what rank 0 saw, as text (a failure is the test's message).
fn rank0(comm: &Communicator) -> Result<(), String> {
    let stream = comm.device().create_stream().unwrap();
    let m = comm.device().alloc(64, MemoryKind::Plain).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(ABORT_AFTER);
            comm.abort();
        });
        let t = Instant::now();
        call(comm, &m, &stream).map_err(|e| format!("the call failed before it waited: {e}"))?;
        let e = match stream.synchronize() {
            Ok(()) => return Err("the call completed without its peer".into()),
            Err(e) => e,
        };
        let waited = t.elapsed();
        if !matches!(e.root(), Error::Aborted(_)) {
            return Err(format!("not an abort after {waited:?}: {e}"));
        }
        if waited > ABORT_AFTER + PROMPT {
            return Err(format!("aborted only after {waited:?}: {e}"));
        }
        if !e.to_string().contains("rank 1") {
            return Err(format!("the error does not name the peer waited for: {e}"));
        }
        Ok(())
    })?;
    let e = comm
        .check_error(&stream)
        .err()
        .ok_or("check_error saw no failure")?;
    if !matches!(e.root(), Error::Aborted(_)) {
        return Err(format!("check_error: {e}"));
    }
    // The kernel mirrored what it recorded into the host failure word.
    match comm.async_error() {
        Err(e) if matches!(e.root(), Error::Aborted(_)) && e.to_string().contains("rank 1") => {}
        other => return Err(format!("async_error after the abort: {other:?}")),
    }
    // Later calls are refused before anything is launched.
    let t = Instant::now();
    match call(comm, &m, &stream) {
        Err(e) if matches!(e.root(), Error::Aborted(_)) && t.elapsed() < PROMPT => {}
        other => return Err(format!("a call after the abort: {other:?}")),
    }
    if !comm.is_aborted() {
        return Err("is_aborted is false".into());
    }
    Ok(())
}

fn abort_ends_the_wait_of(algorithm: Algorithm) {
    two_ranks(algorithm, true, rank0);
}

/// Rank 1 (joining the first call's signature check when `peer_checks_signature`, then
/// silent) and rank 0 running `rank0` then destroy, each on a thread of its own; fails
/// unless rank 0 is done within [`CASE_BOUND`].
fn two_ranks(
    algorithm: Algorithm,
    peer_checks_signature: bool,
    rank0: fn(&Communicator) -> Result<(), String>,
) {
    two_ranks_bounded(algorithm, peer_checks_signature, TIMEOUT, rank0);
}

/// [`two_ranks`] with the kernels' wait bound `timeout`.
fn two_ranks_bounded(
    algorithm: Algorithm,
    peer_checks_signature: bool,
    timeout: Duration,
    rank0: fn(&Communicator) -> Result<(), String>,
) {
    let id =
        UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default()).unwrap();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let comm = make(1, id, algorithm, timeout);
        if peer_checks_signature {
            // Take part in the signature check of the first call, then never launch.
            comm.bootstrap()
                .all_gather(&common::first_call_signature(
                    COUNT as u64,
                    DataType::F32,
                    algorithm.code(),
                ))
                .unwrap();
        }
        // Until rank 0 is done (or gave up); then this rank aborts its own communicator,
        // which lets destroy go without a barrier.
        let _ = done_rx.recv_timeout(CASE_BOUND);
        comm.abort();
        comm.destroy().unwrap();
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let comm = make(0, id, algorithm, timeout);
        let seen = rank0(&comm);
        // Destroy works after the abort (and does not wait for the peer).
        let destroyed = comm.destroy().map_err(|e| format!("destroy: {e}"));
        let _ = tx.send(seen.and(destroyed));
    });
    let outcome = rx.recv_timeout(CASE_BOUND);
    let _ = done_tx.send(());
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(why)) => panic!("{algorithm}: {why}"),
        Err(_) => panic!(
            "{algorithm}: rank 0 did not finish within {CASE_BOUND:?}: the abort did not end \
             its wait"
        ),
    }
    peer.join().expect("rank 1 panicked");
}

#[test]
fn abort_ends_a_one_shot_waiting_for_packets() {
    abort_ends_the_wait_of(ONESHOT_LL);
}

#[test]
fn abort_ends_a_two_shot_waiting_at_its_barrier() {
    abort_ends_the_wait_of(TWOSHOT);
}

#[test]
fn abort_ends_a_port_channel_kernel_waiting_for_a_signal() {
    abort_ends_the_wait_of(PORT_CHANNEL);
}

#[test]
fn an_aborted_communicator_refuses_calls_and_reports_the_abort() {
    common::threads_with(
        2,
        |_| CommConfig {
            timeout: TIMEOUT,
            ..CommConfig::default()
        },
        |r| {
            assert!(!r.comm.is_aborted());
            r.comm.check_error(&r.stream).unwrap();
            r.comm.abort();
            r.comm.abort(); // idempotent
            let e = r.comm.check_error(&r.stream).unwrap_err();
            assert!(matches!(e.root(), Error::Aborted(_)), "{e}");
            assert!(e.to_string().contains("aborted"), "{e}");
            let m = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
            // SAFETY: nothing is launched on an aborted communicator.
            let e = unsafe {
                r.comm
                    .all_gather(m.ptr(), m.ptr(), 2, DataType::F32, &r.stream)
            }
            .unwrap_err();
            assert!(matches!(e.root(), Error::Aborted(_)), "{e}");
            // threads_with destroys it: without a barrier, as it is aborted.
        },
    );
}

/// A call can also wait on the host: a first call's signature check, and the exchange of
/// buffers nobody registered, go through the bootstrap. Abort ends that wait too (rank 1
/// here never makes the call, so rank 0 waits in the signature check, whose own bound is
/// the bootstrap's 120 s).
#[test]
fn abort_ends_a_host_side_wait_in_the_bootstrap() {
    two_ranks(ONESHOT_LL, false, |comm| {
        let stream = comm.device().create_stream().unwrap();
        let m = comm.device().alloc(64, MemoryKind::Plain).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(ABORT_AFTER);
                comm.abort();
            });
            let t = Instant::now();
            match call(comm, &m, &stream) {
                Err(e) if matches!(e.root(), Error::Aborted(_)) => {
                    if t.elapsed() > ABORT_AFTER + PROMPT {
                        Err(format!("aborted only after {:?}: {e}", t.elapsed()))
                    } else {
                        Ok(())
                    }
                }
                other => Err(format!("not an abort after {:?}: {other:?}", t.elapsed())),
            }
        })
    });
}

/// The kernels' wait bound of the async-error cases: long enough that the check right after
/// the launch comes well before it.
const SHORT_TIMEOUT: Duration = Duration::from_secs(1);

/// Rank 0 calls while rank 1 never does, and watches `async_error` without synchronizing
/// the stream (ncclCommGetAsyncError's contract): no failure right after the launch, then,
/// once the kernel's wait passed its bound, the timeout naming rank 1, while the stream
/// has still not been synchronized; its synchronization then reports the same.
fn async_error_of_a_timed_out_call(comm: &Communicator) -> Result<(), String> {
    let stream = comm.device().create_stream().unwrap();
    let m = comm.device().alloc(64, MemoryKind::Plain).unwrap();
    call(comm, &m, &stream).map_err(|e| format!("the call failed before it waited: {e}"))?;
    let t = Instant::now();
    if let Err(e) = comm.async_error() {
        return Err(format!("a failure right after the launch: {e}"));
    }
    let seen = loop {
        match comm.async_error() {
            Err(e) => break e,
            Ok(()) if t.elapsed() < SHORT_TIMEOUT + PROMPT => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Ok(()) => {
                return Err(format!(
                    "async_error saw nothing {:?} after the launch",
                    t.elapsed()
                ))
            }
        }
    };
    if !matches!(seen.root(), Error::Timeout { .. }) || !seen.to_string().contains("rank 1") {
        return Err(format!(
            "async_error: not the timeout of the wait for rank 1: {seen}"
        ));
    }
    match stream.synchronize() {
        Err(e) if matches!(e.root(), Error::Timeout { .. }) => {}
        other => return Err(format!("the stream after the timeout: {other:?}")),
    }
    // The word keeps the first failure: the next check still reports it.
    if comm.async_error().is_ok() {
        return Err("async_error forgot the failure".into());
    }
    // Nothing waits on the peer any more; destroy needs no barrier once aborted.
    comm.abort();
    Ok(())
}

#[test]
fn async_error_reports_a_one_shot_that_timed_out_without_a_synchronization() {
    two_ranks_bounded(
        ONESHOT_LL,
        true,
        SHORT_TIMEOUT,
        async_error_of_a_timed_out_call,
    );
}

#[test]
fn async_error_reports_a_port_channel_kernel_that_timed_out_without_a_synchronization() {
    two_ranks_bounded(
        PORT_CHANNEL,
        true,
        SHORT_TIMEOUT,
        async_error_of_a_timed_out_call,
    );
}
