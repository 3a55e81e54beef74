//! `oxccl-gpu-suite faults CASE`: one fault per run, for `ci/gpu/faults.sh` (issue #21).
//!
//! Every rank makes a communicator from the environment (torchrun's variables) and runs
//! 64 MiB f32 allreduces; the last rank is the victim and misbehaves as `CASE` says. Each
//! survivor must get an error (not hang) within the kernels' wait bound
//! (`OXCCL_TIMEOUT_MS`) plus 2 s of the fault, print `FAULT-OK <case> rank <r> after <ms>
//! ms: <error>` and exit 0; a survivor that sees no error, or sees it late, exits 1.
//!
//! Cases:
//! - `kill`: the victim SIGKILLs itself in the middle of the loop (work queued behind it);
//! - `skip`: the victim skips the last call, then exits normally; a survivor sees the
//!   timeout through [`Communicator::async_error`] before it synchronizes anything (with
//!   `small-` in front the call is a one-shot, so the wait is in the survivor's kernel; the
//!   large call's wait is in the host exchange of unregistered buffers on GPUs);
//! - `count`, `dtype`, `op`: the victim's last call differs in count, type or op (one-shot
//!   size with `small-` in front, e.g. `small-count`);
//! - `exit`: the victim returns without destroying its communicator after a call;
//! - `abort`: the victim skips the last call; each survivor's kernel waits for it and
//!   another thread of the survivor aborts its communicator ([`Communicator::abort`], what
//!   `ncclCommAbort` does) after 200 ms: the call must end with `Error::Aborted` within 2 s
//!   of the abort, not at the timeout, and the communicator must then be destroyed
//!   (without waiting for the victim); the next job on the GPUs shows they are usable.

use std::time::{Duration, Instant};

use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Error, Memory, MemoryKind, ReduceOp, Result, Stream,
};
use oxccl_collectives::Communicator;

/// Elements of the large calls: 64 MiB of f32, or `OXCCL_FAULT_ELEMS` (the host backend's
/// debug build wants fewer).
fn large() -> usize {
    std::env::var("OXCCL_FAULT_ELEMS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(16 << 20)
}
/// Elements of the one-shot calls.
const SMALL: usize = 4099;
/// Calls before the fault.
const BEFORE: usize = 12;

/// What the victim does differently in its last call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Skip,
    Count,
    Dtype,
    Op,
    Exit,
    Abort,
}

/// When a survivor of `abort` aborts its communicator, after its call started.
const ABORT_AFTER: Duration = Duration::from_millis(200);
/// How long after the abort the aborted call may take.
const ABORT_PROMPT: Duration = Duration::from_secs(2);

fn parse(case: &str) -> Result<(Fault, bool)> {
    let (small, name) = match case.strip_prefix("small-") {
        Some(n) => (true, n),
        None => (false, case),
    };
    let fault = match name {
        "kill" => Fault::Kill,
        "skip" => Fault::Skip,
        "count" => Fault::Count,
        "dtype" => Fault::Dtype,
        "op" => Fault::Op,
        "exit" => Fault::Exit,
        "abort" => Fault::Abort,
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown fault case {other} (kill, skip, count, dtype, op, exit, abort; small- \
                 in front for one-shot sizes)"
            )))
        }
    };
    Ok((fault, small))
}

/// One allreduce on `buf` and its completion, with the kernels' failure word read.
fn call(
    comm: &Communicator,
    stream: &oxccl_collectives::backend::AnyStream,
    buf: DevicePtr,
    (count, dtype, op): (usize, DataType, ReduceOp),
    wait: bool,
) -> Result<()> {
    // SAFETY: `buf` holds `large()` f32 (as many bytes as any call here touches) and
    // lives until the stream is synchronized below or the process ends.
    unsafe { comm.all_reduce(buf, buf, count, dtype, op, AccumType::Auto, stream) }?;
    if wait {
        comm.check_error(stream)?;
    }
    Ok(())
}

/// Runs `case` on this rank; `Ok(true)` when the rank did what the case expects of it.
pub fn run(case: &str) -> Result<bool> {
    let (fault, small) = parse(case)?;
    let comm = Communicator::from_env()?;
    let timeout = comm.config().timeout;
    let (rank, world) = (comm.rank(), comm.world_size());
    let victim = world - 1;
    let stream = comm.device().create_stream()?;
    let large = large().max(SMALL);
    let buf = comm.device().alloc(large * 4, MemoryKind::Plain)?;
    stream.write(buf.ptr(), &vec![0x3cu8; SMALL * 4])?;
    let n = if small { SMALL } else { large };
    let normal = (n, DataType::F32, ReduceOp::Sum);
    for _ in 0..BEFORE {
        call(&comm, &stream, buf.ptr(), normal, false)?;
    }
    comm.check_error(&stream)?;
    if rank == victim {
        match fault {
            Fault::Kill => {
                // Work queued behind the kill: the peers' kernels are mid-loop when it lands.
                for _ in 0..4 {
                    call(&comm, &stream, buf.ptr(), normal, false)?;
                }
                let me = nix::unistd::Pid::this();
                nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGKILL)
                    .map_err(|e| Error::errno("kill", e))?;
                return Ok(false);
            }
            Fault::Skip | Fault::Exit => {
                if fault == Fault::Exit {
                    // Leaves at once: the communicator is never destroyed.
                    std::mem::forget(comm);
                } else {
                    // Alive but silent past the peers' bound.
                    std::thread::sleep(timeout + Duration::from_secs(3));
                }
                println!("victim rank {rank}: done ({case})");
                return Ok(true);
            }
            Fault::Abort => {
                // Silent until every survivor has aborted, then aborts its own
                // communicator (it never ran the call) and destroys it without a barrier.
                std::thread::sleep(ABORT_AFTER + ABORT_PROMPT + Duration::from_secs(1));
                comm.abort();
                comm.destroy()?;
                println!("victim rank {rank}: done ({case})");
                return Ok(true);
            }
            Fault::Count | Fault::Dtype | Fault::Op => {
                let odd = match fault {
                    Fault::Count => (n - 64, DataType::F32, ReduceOp::Sum),
                    Fault::Dtype => (n, DataType::Bf16, ReduceOp::Sum),
                    _ => (n, DataType::F32, ReduceOp::Max),
                };
                let t = Instant::now();
                let outcome = call(&comm, &stream, buf.ptr(), odd, true);
                let ok = report(case, rank, t, outcome, timeout + Duration::from_secs(2));
                drain(&stream);
                return Ok(ok);
            }
        }
    }
    if fault == Fault::Abort {
        let t = Instant::now();
        let outcome = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(ABORT_AFTER);
                comm.abort();
            });
            call(&comm, &stream, buf.ptr(), normal, true)
        });
        let ok = match outcome {
            Err(e) if !matches!(e.root(), Error::Aborted(_)) => {
                println!("FAULT-WRONG {case} rank {rank}: not an abort: {e}");
                false
            }
            other => report(case, rank, t, other, ABORT_AFTER + ABORT_PROMPT),
        };
        drain(&stream);
        // Destroy works after the abort, without the victim.
        let destroyed = comm.destroy();
        println!("destroyed after the abort: {destroyed:?}");
        return Ok(ok && destroyed.is_ok());
    }
    let t = Instant::now();
    let outcome = match fault {
        // The peers keep calling while the victim dies.
        Fault::Kill => (0..8)
            .try_for_each(|_| call(&comm, &stream, buf.ptr(), normal, false))
            .and_then(|()| comm.check_error(&stream)),
        // Seen first from the host failure word, with nothing synchronized (what
        // ncclCommGetAsyncError reads); the stream's own outcome must agree.
        Fault::Skip => call(&comm, &stream, buf.ptr(), normal, false).and_then(|()| {
            let seen = watch_async_error(&comm, timeout + Duration::from_secs(2));
            match (seen, comm.check_error(&stream)) {
                (Some(e), Err(_)) => Err(e),
                (Some(e), Ok(())) => {
                    println!("FAULT-WRONG {case} rank {rank}: async_error said {e}, the stream completed");
                    Ok(())
                }
                (None, settled) => {
                    println!("async_error saw nothing; the stream: {settled:?}");
                    Ok(())
                }
            }
        }),
        _ => call(&comm, &stream, buf.ptr(), normal, true),
    };
    let ok = report(case, rank, t, outcome, timeout + Duration::from_secs(2));
    drain(&stream);
    Ok(ok)
}

/// Polls [`Communicator::async_error`] (host memory, no synchronization) every
/// millisecond until it reports a failure, or `bound` passes.
fn watch_async_error(comm: &Communicator, bound: Duration) -> Option<Error> {
    let t = Instant::now();
    loop {
        if let Err(e) = comm.async_error() {
            println!("async_error after {} ms: {e}", t.elapsed().as_millis());
            return Some(e);
        }
        if t.elapsed() > bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lets the work still queued finish (it fails fast once the failure word is set) before
/// the communicator and its buffers are dropped under it.
fn drain(stream: &oxccl_collectives::backend::AnyStream) {
    let t = Instant::now();
    if let Err(e) = stream.synchronize() {
        println!("queued work after the fault: {e}");
    }
    println!("drained the stream in {} ms", t.elapsed().as_millis());
}

/// Prints the survivor's verdict: an error within `bound` of `t` is what the case expects.
fn report(case: &str, rank: u32, t: Instant, outcome: Result<()>, bound: Duration) -> bool {
    let ms = t.elapsed().as_millis();
    match outcome {
        Err(e) if t.elapsed() <= bound => {
            println!("FAULT-OK {case} rank {rank} after {ms} ms: {e}");
            true
        }
        Err(e) => {
            println!(
                "FAULT-LATE {case} rank {rank} after {ms} ms (bound {} ms): {e}",
                bound.as_millis()
            );
            false
        }
        Ok(()) => {
            println!("FAULT-MISSED {case} rank {rank}: no error after {ms} ms");
            false
        }
    }
}
