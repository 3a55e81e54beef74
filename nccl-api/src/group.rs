//! Groups on this library's side: what `ncclGroupStart` / `ncclGroupEnd` defer.
//!
//! Inside a group (per thread, nested; the outermost `ncclGroupEnd` closes it) nothing
//! that may wait for other ranks runs at its call, so one thread can drive several ranks:
//!
//! - an init (`ncclCommInitRank[Config|Scalable]`) checks its arguments, hands the caller
//!   its handle (not ready yet) and begins the real NCCL's side inside the real library's
//!   own group; `ncclCommSplit` agrees on nothing yet and begins the real split the same
//!   way. The oxccl sides (bootstrap, communicator, the split's all-gathers) are made at
//!   `ncclGroupEnd`, one thread per pending init, while this thread ends the real group;
//! - a collective oxccl serves is queued and run at `ncclGroupEnd`: each communicator's
//!   calls in call order, several communicators concurrently (one thread each), one
//!   communicator on the calling thread itself;
//! - a call that fails inside the group fails the group: `ncclGroupEnd` runs nothing of it,
//!   marks its pending communicators failed and returns that error (the real library's
//!   group is failed too, so it drops its own part).
//!
//! When an init of the group fails at `ncclGroupEnd`, every communicator of the group is
//! released and its handle answers every later call with that failure.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;

use crate::comm::{real_nccl, InitCell, InitSpec, OxcclSide, Ready, RealInit, SplitPlan};
use crate::error::{log_info, ApiError, ApiResult};
use crate::types::*;

/// A collective queued in a group.
struct Op {
    /// The handle it was called with (a communicator of this library).
    handle: usize,
    /// The communicator it runs on (the queue it joins).
    comm: usize,
    name: &'static str,
    rank: u32,
    run: Deferred,
}

/// A queued call's work.
struct Deferred(Box<dyn FnOnce() -> ApiResult<()>>);

// SAFETY: the closure holds only `&'static` references to communicators of this library
// (`Ready` and `Communicator` are `Sync`), plain values, and the caller's buffer and stream
// pointers, which NCCL's contract keeps valid until the group's work has completed; each
// queue runs on exactly one thread, one call after the other, as it would on the caller's.
unsafe impl Send for Deferred {}

/// An init or split recorded in a group.
struct Job {
    /// What is made at `ncclGroupEnd` (on a thread of its own).
    work: Work,
    /// The handle given to the caller (none for a split's `NCCL_SPLIT_NOCOLOR`).
    handle: usize,
    cell: Option<Arc<InitCell>>,
    /// The real side, begun in the real library's group.
    real: RealInit,
}

/// The oxccl side of a recorded init or split.
enum Work {
    Init(InitSpec),
    Split {
        parent: &'static Ready,
        parent_handle: usize,
        color: c_int,
        key: c_int,
    },
}

/// What [`Work`] made.
enum Made {
    Init(OxcclSide),
    Split(Option<(SplitPlan, OxcclSide)>),
}

impl Work {
    fn run(&self) -> ApiResult<Made> {
        match self {
            Work::Init(spec) => spec.run_oxccl().map(Made::Init),
            Work::Split {
                parent, color, key, ..
            } => {
                let Some(plan) = parent.split_agree(*color, *key)? else {
                    return Ok(Made::Split(None));
                };
                let side = parent.split_oxccl(&plan)?;
                Ok(Made::Split(Some((plan, side))))
            }
        }
    }

    fn what(&self) -> String {
        match self {
            Work::Init(spec) => format!("the init of rank {}/{}", spec.rank, spec.nranks),
            Work::Split {
                parent, color, key, ..
            } => format!(
                "the split of rank {}/{} (color {color}, key {key})",
                parent.rank, parent.nranks
            ),
        }
    }
}

/// This thread's open group.
#[derive(Default)]
pub struct Group {
    depth: u32,
    error: Option<ApiError>,
    jobs: Vec<Job>,
    ops: Vec<Op>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("depth", &self.depth)
            .field("error", &self.error)
            .field("jobs", &self.jobs.len())
            .field("calls", &self.ops.len())
            .finish()
    }
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// How deeply this thread's groups are nested (0: no group is open).
pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// Opens a (nested) group on this thread.
pub fn enter() {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth = g.depth.saturating_add(1);
    });
}

/// Closes one level of this thread's group: the group's recorded work when this closed the
/// outermost one.
pub fn leave(name: &str) -> ApiResult<Option<Group>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(ApiError::invalid_usage(format!(
                "{name} without ncclGroupStart"
            ))),
            1 => Ok(Some(std::mem::take(&mut *g))),
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })
}

/// Records the first failing call of this thread's open group (nothing when no group is
/// open), and fails the real library's group with it so its part is dropped too.
pub fn note_error(name: &str, e: &ApiError) {
    let first = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 || g.error.is_some() {
            return false;
        }
        g.error = Some(ApiError {
            code: e.code,
            message: format!("{name} inside the group failed: {}", e.message),
        });
        true
    });
    if first {
        fail_real_group();
    }
}

/// Makes the real library's open group fail at its `ncclGroupEnd` (so it runs none of the
/// inits and calls queued in it, as it does when a call inside its group fails): one call
/// it refuses, an init of zero ranks.
fn fail_real_group() {
    let Ok(real) = real_nccl() else {
        return;
    };
    let Some(f) = real.fns.comm_init_rank else {
        return;
    };
    let mut out: Opaque = std::ptr::null_mut();
    let id = NcclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: a valid out-pointer; zero ranks is refused before anything is made.
    let rc = unsafe { f(&mut out, 0, id, 0) };
    log_info!("failing the real NCCL's group (its refusal of a zero-rank init: {rc})");
}

/// Whether this thread's open group refers to the communicator behind `handle` (it must
/// not be released before `ncclGroupEnd`).
pub fn refers_to(handle: Opaque) -> bool {
    let h = handle as usize;
    GROUP.with(|g| {
        let g = g.borrow();
        g.ops.iter().any(|op| op.handle == h)
            || g.jobs.iter().any(|j| {
                j.handle == h
                    || matches!(j.work, Work::Split { parent_handle, .. } if parent_handle == h)
            })
    })
}

/// Runs `call` now, or queues it for `ncclGroupEnd` when a group is open on this thread.
pub fn run_or_queue(
    name: &'static str,
    handle: Opaque,
    comm: &'static Ready,
    call: impl FnOnce() -> ApiResult<()> + 'static,
) -> ApiResult<()> {
    if depth() == 0 {
        return call();
    }
    let op = Op {
        handle: handle as usize,
        comm: comm as *const Ready as usize,
        name,
        rank: comm.rank,
        run: Deferred(Box::new(call)),
    };
    GROUP.with(|g| g.borrow_mut().ops.push(op));
    Ok(())
}

/// Records an init whose handle the caller got (made at `ncclGroupEnd`).
pub fn record_init(handle: Opaque, cell: Arc<InitCell>, spec: InitSpec, real: RealInit) {
    let job = Job {
        work: Work::Init(spec),
        handle: handle as usize,
        cell: Some(cell),
        real,
    };
    GROUP.with(|g| g.borrow_mut().jobs.push(job));
}

/// Records a split (its handle, when this rank gets one; made at `ncclGroupEnd`).
#[allow(clippy::too_many_arguments)]
pub fn record_split(
    child: Option<(Opaque, Arc<InitCell>)>,
    parent: &'static Ready,
    parent_handle: Opaque,
    color: c_int,
    key: c_int,
    real: RealInit,
) {
    let (handle, cell) = match child {
        Some((h, c)) => (h as usize, Some(c)),
        None => (0, None),
    };
    let job = Job {
        work: Work::Split {
            parent,
            parent_handle: parent_handle as usize,
            color,
            key,
        },
        handle,
        cell,
        real,
    };
    GROUP.with(|g| g.borrow_mut().jobs.push(job));
}

impl Group {
    /// Completes a closed group: its queued calls, then its inits (their oxccl sides on
    /// threads of their own while `end_real` ends the real library's group here). The
    /// first failure is returned; when an init failed, every communicator of the group is
    /// released and its handle holds the failure.
    pub fn complete(self, end_real: impl FnOnce() -> ApiResult<()>) -> ApiResult<()> {
        let Group {
            error, jobs, ops, ..
        } = self;
        if let Some(e) = error {
            let real_end = end_real();
            let e = ApiError {
                code: e.code,
                message: format!("nothing of the group was run: {}", e.message),
            };
            for job in jobs {
                job.fail(None, &e);
            }
            drop(ops);
            if let Err(r) = real_end {
                log_info!(
                    "the real NCCL's ncclGroupEnd of a failed group: {}",
                    r.message
                );
            }
            return Err(e);
        }
        let ops_result = run_queued(ops);
        let (made, real_end) = make_all(&jobs, end_real);
        let first_failure = made
            .iter()
            .zip(&jobs)
            .find_map(|(m, j)| {
                m.as_ref().err().map(|e| ApiError {
                    code: e.code,
                    message: format!("{} failed: {}", j.work.what(), e.message),
                })
            })
            .or_else(|| real_end.clone().err());
        match first_failure {
            None => {
                for (job, m) in jobs.into_iter().zip(made) {
                    job.publish(m);
                }
                ops_result
            }
            Some(e) => {
                for (job, m) in jobs.into_iter().zip(made) {
                    job.fail(Some(m), &e);
                }
                ops_result.and(Err(e))
            }
        }
    }

    /// Drops a group closed without running it (`ncclGroupSimulateEnd`): its pending
    /// communicators fail.
    pub fn discard(self, why: &str) {
        let e = ApiError::invalid_usage(why);
        for job in self.jobs {
            job.fail(None, &e);
        }
    }
}

/// Makes every job's oxccl side, one thread each, while `end_real` runs here.
fn make_all(
    jobs: &[Job],
    end_real: impl FnOnce() -> ApiResult<()>,
) -> (Vec<ApiResult<Made>>, ApiResult<()>) {
    if jobs.is_empty() {
        return (Vec::new(), end_real());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|job| {
                let work = &job.work;
                std::thread::Builder::new()
                    .name("oxccl-nccl-group-init".into())
                    .spawn_scoped(s, move || work.run())
            })
            .collect();
        let real_end = end_real();
        let made = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(ApiError::internal("a group init thread panicked"))),
                Err(e) => Err(ApiError {
                    code: NCCL_SYSTEM_ERROR,
                    message: format!("starting a thread for a grouped init: {e}"),
                }),
            })
            .collect();
        (made, real_end)
    })
}

impl Job {
    /// Hands the made communicator to its handle.
    fn publish(self, made: ApiResult<Made>) {
        let Job {
            work, cell, real, ..
        } = self;
        let (real_comm, no_real_reason) = real.finish();
        let result = match (work, made) {
            (Work::Init(spec), Ok(Made::Init(side))) => {
                Ok(spec.assemble(side, real_comm, no_real_reason))
            }
            (
                Work::Split {
                    parent, color, key, ..
                },
                Ok(Made::Split(Some((plan, side)))),
            ) => Ok(parent.split_assemble(&plan, side, real_comm, color, key)),
            (Work::Split { .. }, Ok(Made::Split(None))) => {
                if cell.is_none() {
                    return; // NCCL_SPLIT_NOCOLOR: no communicator here
                }
                Err(ApiError::internal(
                    "the split gave this rank no communicator although its color is one",
                ))
            }
            (_, Ok(_)) => Err(ApiError::internal("a grouped init made the wrong kind")),
            (_, Err(e)) => Err(e),
        };
        if let Some(cell) = cell {
            cell.complete(result);
        } else if let Ok(ready) = result {
            // No handle to give it to (cannot happen: a split with a color has one).
            let _ = ready.destroy(false);
        }
    }

    /// Releases what was made and leaves `e` in the handle.
    fn fail(self, made: Option<ApiResult<Made>>, e: &ApiError) {
        drop(made); // the oxccl sides made, released without waiting (as an abort)
        let Job {
            work, cell, real, ..
        } = self;
        real.abort();
        if let Some(cell) = cell {
            let own = ApiError {
                code: e.code,
                message: format!("{} was not completed: {}", work.what(), e.message),
            };
            cell.complete(Err(own));
        }
    }
}

/// Runs queued calls: each communicator's in call order, several communicators at once
/// (the first on this thread, the others on a thread each). A communicator's calls after
/// one that fails are not run.
fn run_queued(ops: Vec<Op>) -> ApiResult<()> {
    let mut queues: Vec<(usize, Vec<Op>)> = Vec::new();
    for op in ops {
        match queues.iter_mut().find(|q| q.0 == op.comm) {
            Some(q) => q.1.push(op),
            None => queues.push((op.comm, vec![op])),
        }
    }
    let mut queues = queues.into_iter().map(|q| q.1);
    let Some(first) = queues.next() else {
        return Ok(());
    };
    std::thread::scope(|s| {
        let others: Vec<_> = queues
            .map(|q| {
                std::thread::Builder::new()
                    .name("oxccl-nccl-group-call".into())
                    .spawn_scoped(s, move || run_queue(q))
            })
            .collect();
        let mut result = run_queue(first);
        for h in others {
            let r = match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(ApiError::internal("a group call thread panicked"))),
                Err(e) => Err(ApiError {
                    code: NCCL_SYSTEM_ERROR,
                    message: format!("starting a thread for a communicator's queued calls: {e}"),
                }),
            };
            result = result.and(r);
        }
        result
    })
}

fn run_queue(queue: Vec<Op>) -> ApiResult<()> {
    for op in queue {
        (op.run.0)().map_err(|e| ApiError {
            code: e.code,
            message: format!(
                "{} on rank {} (queued in the group, run at ncclGroupEnd): {}",
                op.name, op.rank, e.message
            ),
        })?;
    }
    Ok(())
}
