//! Groups on this library's side: what `ncclGroupStart` / `ncclGroupEnd` defer.
//!
//! Inside a group (per thread, nested; the outermost `ncclGroupEnd` closes it) nothing
//! that may wait for other ranks runs at its call, so one thread can drive several ranks:
//!
//! - an init (`ncclCommInitRank[Config|Scalable]`) checks its arguments, reads the device,
//!   copies the config and hands the caller its handle (not ready yet); `ncclCommSplit`
//!   does the same for the new communicator. At `ncclGroupEnd` the oxccl sides
//!   (bootstrap, communicator, the split's all-gathers) are made first, one thread per
//!   pending init; once all of them are made, this thread begins each real NCCL side
//!   inside the real library's own group (with that init's device current) and ends the
//!   real group, which completes them. An oxccl side that fails (bounded by the bootstrap's
//!   timeouts) so keeps the real library from waiting for a rank that never comes, as in a
//!   blocking init, which also makes the oxccl side first;
//! - a collective oxccl serves is queued and run at `ncclGroupEnd`: each communicator's
//!   calls in call order, several communicators concurrently (one thread each), one
//!   communicator on the calling thread itself;
//! - a call that fails inside the group fails the group: `ncclGroupEnd` runs nothing of
//!   this library's part of it, marks its pending communicators failed and returns that
//!   error (the calls forwarded in the group are the real library's, which runs them).
//!
//! When an init of the group fails at `ncclGroupEnd`, every communicator of the group is
//! released and its handle answers every later call with that failure.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;

use crate::comm::{
    with_device_current, InitCell, InitSpec, OwnedConfig, OxcclSide, Ready, RealInit, SplitPlan,
};
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
    /// The caller's config, copied at the call (for the real side).
    config: Option<OwnedConfig>,
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
/// open).
pub fn note_error(name: &str, e: &ApiError) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 || g.error.is_some() {
            return;
        }
        g.error = Some(ApiError {
            code: e.code,
            message: format!("{name} inside the group failed: {}", e.message),
        });
    });
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
pub fn record_init(
    handle: Opaque,
    cell: Arc<InitCell>,
    spec: InitSpec,
    config: Option<OwnedConfig>,
) {
    let job = Job {
        work: Work::Init(spec),
        handle: handle as usize,
        cell: Some(cell),
        config,
    };
    GROUP.with(|g| g.borrow_mut().jobs.push(job));
}

/// Records a split (its handle, when this rank gets one; made at `ncclGroupEnd`).
pub fn record_split(
    child: Option<(Opaque, Arc<InitCell>)>,
    parent: &'static Ready,
    parent_handle: Opaque,
    (color, key): (c_int, c_int),
    config: Option<OwnedConfig>,
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
        config,
    };
    GROUP.with(|g| g.borrow_mut().jobs.push(job));
}

impl Group {
    /// Completes a closed group: its queued calls; then its inits' oxccl sides (a thread
    /// each); then, when all of those were made, their real sides, begun here inside the
    /// real library's group before `end_real` ends it. The first failure is returned; when
    /// an init failed, every communicator of the group is released and its handle holds
    /// the failure.
    pub fn complete(self, end_real: impl FnOnce() -> ApiResult<()>) -> ApiResult<()> {
        let Group {
            error,
            mut jobs,
            ops,
            ..
        } = self;
        if let Some(e) = error {
            drop(ops);
            let real_end = end_real();
            let e = ApiError {
                code: e.code,
                message: format!("nothing of the group was run: {}", e.message),
            };
            for job in jobs {
                job.fail(None, None, &e);
            }
            if let Err(r) = real_end {
                log_info!(
                    "the real NCCL's ncclGroupEnd of a failed group: {}",
                    r.message
                );
            }
            return Err(e);
        }
        let ops_result = run_queued(ops);
        let made = make_all(&jobs);
        let mut failure = made.iter().zip(&jobs).find_map(|(m, j)| {
            m.as_ref().err().map(|e| ApiError {
                code: e.code,
                message: format!("{} failed: {}", j.work.what(), e.message),
            })
        });
        let mut reals = Vec::with_capacity(jobs.len());
        if failure.is_none() {
            // Every job's real side, even after one fails to begin: the others may be
            // ranks of the same job, which the real library completes only together.
            for job in &mut jobs {
                match job.begin_real() {
                    Ok(r) => reals.push(Some(r)),
                    Err(e) => {
                        let e = ApiError {
                            code: e.code,
                            message: format!(
                                "{} (its real NCCL side) failed: {}",
                                job.work.what(),
                                e.message
                            ),
                        };
                        failure.get_or_insert(e);
                        reals.push(None);
                    }
                }
            }
        }
        reals.resize_with(jobs.len(), || None);
        if let Err(e) = end_real() {
            failure.get_or_insert(e);
        }
        let jobs = jobs.into_iter().zip(made).zip(reals);
        match failure {
            None => {
                for ((job, m), real) in jobs {
                    job.publish(m, real);
                }
                ops_result
            }
            Some(e) => {
                for ((job, m), real) in jobs {
                    job.fail(Some(m), real, &e);
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
            job.fail(None, None, &e);
        }
    }
}

/// Makes every job's oxccl side, one thread each (joined before returning).
fn make_all(jobs: &[Job]) -> Vec<ApiResult<Made>> {
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
        handles
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
            .collect()
    })
}

impl Job {
    /// Begins the real side inside the real library's open group, with the device of the
    /// communicator current (the real library reads it at the call).
    fn begin_real(&mut self) -> ApiResult<RealInit> {
        let cfg = self
            .config
            .as_mut()
            .map_or(std::ptr::null_mut(), OwnedConfig::as_ptr);
        match &self.work {
            Work::Init(spec) => {
                with_device_current(spec.kind, spec.device, || spec.begin_real(cfg))
            }
            Work::Split {
                parent, color, key, ..
            } => with_device_current(parent.kind, parent.device as u32, || {
                parent.split_begin_real(*color, *key, cfg)
            }),
        }
    }

    /// Hands the made communicator to its handle.
    fn publish(self, made: ApiResult<Made>, real: Option<RealInit>) {
        let Job { work, cell, .. } = self;
        let (real_comm, no_real_reason) = match real {
            Some(r) => r.finish(),
            None => (None, String::new()),
        };
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
    fn fail(self, made: Option<ApiResult<Made>>, real: Option<RealInit>, e: &ApiError) {
        drop(made); // the oxccl sides made, released without waiting (as an abort)
        if let Some(real) = real {
            real.abort();
        }
        let Job { work, cell, .. } = self;
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
