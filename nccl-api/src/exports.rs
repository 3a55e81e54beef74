//! Every function of NCCL 2.28's `nccl.h` (and the host functions of `nccl_device.h` that
//! take a communicator), with NCCL's exact names and the `pnccl*` aliases NCCL exports.
//!
//! The contract of each function is NCCL's (see `include/nccl.h`): callers pass pointers
//! NCCL's documentation allows, and that is the safety contract of every `unsafe extern
//! "C" fn` here. Each body runs inside [`guard`]: a panic becomes `ncclInternalError` and
//! every failure leaves a message for `ncclGetLastError`.

// The safety contract of every export is NCCL's documented API (stated once above).
#![allow(clippy::missing_safety_doc)]
// NCCL's names.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use oxccl_collectives::hal::{BackendKind, DataType, DevicePtr};
use oxccl_collectives::Communicator;

use crate::comm::{
    self, backend, check_real, is_nonblocking, moved_as, new_unique_id, real_comm_of, real_nccl,
    resolve, served_dtype, served_op, Comm, InitSpec, OwnedConfig, Oxccl, Ready, State, Target,
};
use crate::error::{
    error_string, guard, guard_code, guard_value, last_error_ptr, log_enabled, log_info,
    set_last_error, ApiError, ApiResult,
};
use crate::group;
use crate::ops::{self, Reduction};
use crate::real::RealNccl;
use crate::serve;
use crate::types::*;

/// Found by [`crate::real`] in a library it loads: that library is this one.
#[no_mangle]
pub static oxccl_nccl_api_marker: u8 = 1;

/// `ncclGetVersion` without a real NCCL: 2.28.0.
pub const OWN_VERSION: c_int = 22800;

macro_rules! export {
    ($(#[$m:meta])* fn $name:ident / $alias:ident ($($arg:ident : $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body

        #[doc = concat!("NCCL's profiling alias of [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the same contract as the function it calls.
            unsafe { $name($($arg),*) }
        }
    };
}

/// Runs `call` on the real NCCL with the real communicator behind `comm`.
///
/// # Safety
/// `comm` is null or a communicator of this library or of the real NCCL.
unsafe fn forward(
    name: &'static str,
    comm: Opaque,
    why: &str,
    detail: impl FnOnce() -> String,
    call: impl FnOnce(&'static RealNccl, Opaque) -> Option<NcclResult>,
) -> ApiResult<()> {
    // SAFETY: this function's contract.
    let target = unsafe { resolve(comm) }?;
    let raw = real_comm_of(target, name, why)?;
    let real = real_nccl().map_err(|e| ApiError::invalid_usage(format!("{why}: {e}")))?;
    if let Target::Ours(c) = target {
        if log_enabled() {
            if let Ok(c) = c.ready() {
                log_info!(
                    "rank {} {name}{} -> nccl (forwarded: {why})",
                    c.rank,
                    detail()
                );
            }
        }
    }
    let rc = call(real, raw).ok_or_else(|| {
        ApiError::invalid_usage(format!("the real NCCL at {} has no {name}", real.path))
    })?;
    check_real(rc, real, raw, name)
}

/// Runs `call` on the real NCCL for a function without a communicator.
fn forward_plain(
    name: &'static str,
    call: impl FnOnce(&'static RealNccl) -> Option<NcclResult>,
) -> ApiResult<()> {
    let real = real_nccl().map_err(|e| {
        ApiError::invalid_usage(format!(
            "not served by oxccl and no real NCCL to forward to: {e}"
        ))
    })?;
    let rc = call(real).ok_or_else(|| {
        ApiError::invalid_usage(format!("the real NCCL at {} has no {name}", real.path))
    })?;
    check_real(rc, real, std::ptr::null_mut(), name)
}

const NOT_SERVED: &str = "not served by oxccl";

macro_rules! forwarded {
    ($name:ident / $alias:ident, $field:ident, $comm:ident, ($($arg:ident : $ty:ty),*)) => {
        forwarded!(guard_code; $name / $alias, $field, $comm, ($($arg: $ty),*));
    };
    // `grouped`: a call that takes part in groups (a failure inside one fails the group).
    ($guard:ident; $name:ident / $alias:ident, $field:ident, $comm:ident, ($($arg:ident : $ty:ty),*)) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: not served by oxccl; forwarded to the real NCCL on its communicator (`ncclInvalidUsage` without one).")]
            fn $name / $alias ($($arg: $ty),*) -> NcclResult {
                $guard(stringify!($name), || {
                    let call = |real: &'static RealNccl, c: Opaque| {
                        let f = real.fns.$field?;
                        let $comm = c;
                        // SAFETY: the caller's arguments satisfy NCCL's contract, which the
                        // real function shares, with the real communicator substituted.
                        Some(unsafe { f($($arg),*) })
                    };
                    // SAFETY: NCCL's contract makes `comm` a communicator or null.
                    unsafe { forward(stringify!($name), $comm, NOT_SERVED, String::new, call) }
                        .map(|()| NCCL_SUCCESS)
                })
            }
        }
    };
}

fn out<T>(ptr: *mut T, what: &str) -> ApiResult<&'static mut T> {
    // SAFETY: NCCL's contract: a non-null out-pointer is valid for writes.
    unsafe { ptr.as_mut() }.ok_or_else(|| ApiError::invalid_argument(format!("{what} is NULL")))
}

// ---- Version, ids, errors -------------------------------------------------------------

export! {
    /// The real NCCL's version code when one is loaded (so version checks of programs built
    /// against it pass), else 22800 (2.28.0).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        guard("ncclGetVersion", || {
            *out(version, "version")? = real_nccl().map_or(OWN_VERSION, |r| r.version);
            Ok(())
        })
    }
}

export! {
    /// A packed id: oxccl's bootstrap id and the real NCCL's id (see [`crate::id`]).
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut NcclUniqueId) -> NcclResult {
        guard("ncclGetUniqueId", || {
            let slot = out(uniqueId, "uniqueId")?;
            *slot = new_unique_id()?;
            Ok(())
        })
    }
}

export! {
    /// NCCL's static description of a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: NcclResult) -> *const c_char {
        error_string(result).as_ptr()
    }
}

export! {
    /// This thread's last error message (the real NCCL's, for one of its communicators).
    fn ncclGetLastError / pncclGetLastError(comm: Opaque) -> *const c_char {
        guard_value("ncclGetLastError", last_error_ptr(), || {
            if !comm.is_null() {
                // SAFETY: NCCL's contract: a non-null comm is a communicator.
                if let Ok(Target::Foreign(c)) = unsafe { resolve(comm) } {
                    if let Some(f) = real_nccl().ok().and_then(|r| r.fns.get_last_error) {
                        // SAFETY: a real communicator passed to the real library.
                        return unsafe { f(c) };
                    }
                }
            }
            last_error_ptr()
        })
    }
}

export! {
    /// Forwarded to the real NCCL when loaded; nothing to reset otherwise.
    fn ncclResetDebugInit / pncclResetDebugInit() {
        guard_value("ncclResetDebugInit", (), || {
            if let Some(f) = real_nccl().ok().and_then(|r| r.fns.reset_debug_init) {
                // SAFETY: no arguments.
                unsafe { f() }
            }
        })
    }
}

// ---- Communicator life cycle ------------------------------------------------------------

/// Stores a new communicator into the caller's slot.
fn publish(slot: &mut Opaque, comm: Box<Comm>) {
    *slot = comm::publish(comm);
}

/// Runs an exported function's body as [`guard_code`] does; a failure inside a group also
/// fails the group (`ncclGroupEnd` then runs nothing of it and returns the failure).
fn grouped(name: &'static str, body: impl FnOnce() -> ApiResult<NcclResult>) -> NcclResult {
    guard_code(name, || {
        let r = body();
        if let Err(e) = &r {
            group::note_error(name, e);
        }
        r
    })
}

/// One rank's init: inside a group it is recorded and completed at `ncclGroupEnd` (the
/// handle is written now); with a non-blocking config it runs on a thread of its own and
/// the call returns `ncclInProgress`; otherwise it completes before returning.
fn init_rank(
    slot: &mut Opaque,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> ApiResult<NcclResult> {
    let spec = InitSpec::new(nranks, id, rank, None)?;
    if group::depth() > 0 {
        let (shell, cell) = Comm::pending();
        publish(slot, shell);
        group::record_init(*slot, cell, spec, OwnedConfig::copy(config));
        return Ok(NCCL_SUCCESS);
    }
    if is_nonblocking(config) {
        let owned = OwnedConfig::copy(config);
        let (shell, cell) = Comm::pending();
        std::thread::Builder::new()
            .name(format!("oxccl-nccl-init-{}", spec.rank))
            .spawn(move || cell.complete(spec.run_background(owned)))
            .map_err(|e| ApiError {
                code: NCCL_SYSTEM_ERROR,
                message: format!("starting the thread of a non-blocking init: {e}"),
            })?;
        publish(slot, shell);
        return Ok(NCCL_IN_PROGRESS);
    }
    publish(slot, Comm::ready_now(spec.run(config)?));
    Ok(NCCL_SUCCESS)
}

export! {
    /// Creates the oxccl side and the real NCCL's communicator (when the id carries one);
    /// inside a group, at `ncclGroupEnd`.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut Opaque, nranks: c_int, commId: NcclUniqueId, rank: c_int) -> NcclResult {
        grouped("ncclCommInitRank", || {
            let slot = out(comm, "comm")?;
            init_rank(slot, nranks, &commId, rank, std::ptr::null_mut())
        })
    }
}

export! {
    /// As [`ncclCommInitRank`]; the config goes to the real NCCL, made blocking. With
    /// `blocking = 0` (outside a group) the init goes on after the call, which returns
    /// `ncclInProgress`: `ncclCommGetAsyncError` says when it is done.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut Opaque, nranks: c_int, commId: NcclUniqueId, rank: c_int, config: *mut NcclConfig) -> NcclResult {
        grouped("ncclCommInitRankConfig", || {
            let slot = out(comm, "comm")?;
            init_rank(slot, nranks, &commId, rank, config)
        })
    }
}

export! {
    /// Uses the first of the ids (every id of this library already names one root).
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut Opaque, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut NcclUniqueId, config: *mut NcclConfig) -> NcclResult {
        grouped("ncclCommInitRankScalable", || {
            let slot = out(newcomm, "newcomm")?;
            if nId < 1 {
                return Err(ApiError::invalid_argument(format!("nId {nId} is not positive")));
            }
            let id = *out(commIds, "commIds")?;
            init_rank(slot, nranks, &id, myrank, config)
        })
    }
}

export! {
    /// One process, `ndev` devices: one thread per device joins a fresh id (the oxccl
    /// bootstrap and the real NCCL's init both work across threads of one process).
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut Opaque, ndev: c_int, devlist: *const c_int) -> NcclResult {
        guard("ncclCommInitAll", || {
            if comm.is_null() {
                return Err(ApiError::invalid_argument("comm is NULL"));
            }
            if ndev < 1 {
                return Err(ApiError::invalid_argument(format!("ndev {ndev} is not positive")));
            }
            let n = ndev as usize;
            let mut devices = Vec::with_capacity(n);
            for i in 0..n {
                let d = if devlist.is_null() {
                    i as c_int
                } else {
                    // SAFETY: NCCL's contract: devlist holds ndev entries.
                    unsafe { *devlist.add(i) }
                };
                let d = u32::try_from(d).map_err(|_| {
                    ApiError::invalid_argument(format!("devlist[{i}] = {d} is negative"))
                })?;
                devices.push(d);
            }
            let id = new_unique_id()?;
            let results: Vec<ApiResult<Box<Ready>>> = std::thread::scope(|s| {
                let handles: Vec<_> = devices
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| {
                        s.spawn(move || {
                            InitSpec::new(ndev, &id, i as c_int, Some(d))?.run(std::ptr::null_mut())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(ApiError::internal("an init thread panicked"))))
                    .collect()
            });
            if let Some(e) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
                for c in results.into_iter().flatten() {
                    let _ = (*c).destroy(false);
                }
                return Err(e);
            }
            for (i, c) in results.into_iter().flatten().enumerate() {
                // SAFETY: NCCL's contract: comm holds ndev slots.
                let slot = unsafe { &mut *comm.add(i) };
                publish(slot, Comm::ready_now(c));
            }
            Ok(())
        })
    }
}

export! {
    /// Splits both sides; `NCCL_SPLIT_NOCOLOR` gives `*newcomm = NULL`. Inside a group the
    /// new handle is written now and the split completes at `ncclGroupEnd`.
    fn ncclCommSplit / pncclCommSplit(comm: Opaque, color: c_int, key: c_int, newcomm: *mut Opaque, config: *mut NcclConfig) -> NcclResult {
        grouped("ncclCommSplit", || {
            let slot = out(newcomm, "newcomm")?;
            // SAFETY: NCCL's contract on comm.
            match unsafe { resolve(comm) }? {
                Target::Ours(c) => {
                    let c = c.ready()?;
                    *slot = std::ptr::null_mut();
                    if group::depth() > 0 {
                        Ready::check_color(color)?;
                        let child = (color != NCCL_SPLIT_NOCOLOR).then(|| {
                            let (shell, cell) = Comm::pending();
                            publish(slot, shell);
                            (*slot, cell)
                        });
                        let config = OwnedConfig::copy(config);
                        group::record_split(child, c, comm, (color, key), config);
                        return Ok(NCCL_SUCCESS);
                    }
                    if let Some(child) = c.split(color, key, config)? {
                        publish(slot, Comm::ready_now(child));
                    }
                    Ok(NCCL_SUCCESS)
                }
                Target::Foreign(_) => {
                    let call = |real: &'static RealNccl, c: Opaque| {
                        let f = real.fns.comm_split?;
                        // SAFETY: a real communicator and the caller's arguments.
                        Some(unsafe { f(c, color, key, newcomm, config) })
                    };
                    // SAFETY: as above.
                    unsafe { forward("ncclCommSplit", comm, NOT_SERVED, String::new, call) }
                        .map(|()| NCCL_SUCCESS)
                }
            }
        })
    }
}

forwarded!(ncclCommShrink / pncclCommShrink, comm_shrink, comm, (comm: Opaque, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut Opaque, config: *mut NcclConfig, shrinkFlags: c_int));
forwarded!(ncclCommRevoke / pncclCommRevoke, comm_revoke, comm, (comm: Opaque, revokeFlags: c_int));

export! {
    /// Waits for this rank's queued work, then finalizes the real communicator.
    fn ncclCommFinalize / pncclCommFinalize(comm: Opaque) -> NcclResult {
        crate::profile::report("ncclCommFinalize");
        guard("ncclCommFinalize", || {
            // SAFETY: NCCL's contract on comm.
            let target = unsafe { resolve(comm) }?;
            if let Target::Ours(c) = target {
                let c = c.ready()?;
                c.finalize()?;
                if c.real.is_none() {
                    return Ok(());
                }
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_finalize?;
                // SAFETY: a real communicator.
                Some(unsafe { f(c) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommFinalize", comm, "the real side", String::new, call) }
        })
    }
}

fn release(name: &'static str, comm: Opaque, graceful: bool) -> ApiResult<()> {
    if comm.is_null() {
        // NCCL's own behaviour for a NULL communicator here.
        return Ok(());
    }
    // SAFETY: NCCL's contract on comm.
    match unsafe { resolve(comm) }? {
        Target::Ours(_) if group::refers_to(comm) => Err(ApiError::invalid_usage(format!(
            "comm {comm:?} takes part in this thread's open group (an init, split or \
             collective recorded for ncclGroupEnd): call ncclGroupEnd first"
        ))),
        Target::Ours(c) => {
            if !graceful {
                // ncclCommAbort: end this rank's oxccl waits (and a host-backend call in
                // flight on another thread) while the handle is still in place.
                if let State::Ready(ready) = c.state() {
                    ready.abort();
                }
            }
            release_ours(comm, graceful)
        }
        Target::Foreign(_) => {
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = if graceful {
                    real.fns.comm_destroy?
                } else {
                    real.fns.comm_abort?
                };
                // SAFETY: a real communicator.
                Some(unsafe { f(c) })
            };
            // SAFETY: as above.
            unsafe { forward(name, comm, NOT_SERVED, String::new, call) }
        }
    }
}

/// Takes a live communicator of ours from its handle and releases it.
fn release_ours(comm: Opaque, graceful: bool) -> ApiResult<()> {
    comm::take(comm)
        .ok_or_else(|| {
            ApiError::invalid_argument(format!(
                "comm {comm:?} is a destroyed communicator of this library"
            ))
        })?
        .destroy(graceful)
}

export! {
    /// Waits for this rank's queued work (unless finalized already) and releases both
    /// sides. NULL is accepted, as NCCL does.
    fn ncclCommDestroy / pncclCommDestroy(comm: Opaque) -> NcclResult {
        let code = guard("ncclCommDestroy", || release("ncclCommDestroy", comm, true));
        crate::profile::report("ncclCommDestroy");
        code
    }
}

export! {
    /// Releases both sides without waiting for the peers. NULL is accepted, as NCCL does.
    /// oxccl's kernels of this rank end their waits first (a call stuck on a dead peer
    /// ends promptly, not at OXCCL_TIMEOUT_MS), then the real communicator is aborted, and
    /// the oxccl side goes once the device has finished the aborted work.
    fn ncclCommAbort / pncclCommAbort(comm: Opaque) -> NcclResult {
        let code = guard("ncclCommAbort", || release("ncclCommAbort", comm, false));
        crate::profile::report("ncclCommAbort");
        code
    }
}

export! {
    /// The sticky error of a failed operation, else the real communicator's.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: Opaque, asyncError: *mut NcclResult) -> NcclResult {
        guard("ncclCommGetAsyncError", || {
            let slot = out(asyncError, "asyncError")?;
            // SAFETY: NCCL's contract on comm.
            let target = unsafe { resolve(comm) }?;
            if let Target::Ours(c) = target {
                let c = match c.state() {
                    State::Ready(c) => c,
                    State::Pending => {
                        *slot = NCCL_IN_PROGRESS;
                        return Ok(());
                    }
                    State::Failed(e) => {
                        *slot = e.code;
                        set_last_error(&format!(
                            "ncclCommGetAsyncError: the communicator's initialisation failed: {}",
                            e.message
                        ));
                        return Ok(());
                    }
                };
                let e = c.async_error.load(std::sync::atomic::Ordering::Relaxed);
                *slot = e;
                if e != NCCL_SUCCESS {
                    return Ok(());
                }
                // What oxccl's kernels recorded (a wait that timed out or was aborted), read
                // from host memory: no synchronization, so a capture in progress goes on.
                if let Oxccl::Serving(comm) = &c.oxccl {
                    if let Err(e) = comm.async_error() {
                        let e = ApiError::from(e);
                        *slot = e.code;
                        set_last_error(&format!("ncclCommGetAsyncError: {}", e.message));
                        return Ok(());
                    }
                }
                if c.real.is_none() {
                    return Ok(());
                }
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_get_async_error?;
                // SAFETY: a real communicator and a valid out-pointer.
                Some(unsafe { f(c, asyncError) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommGetAsyncError", comm, "the real side", String::new, call) }
        })
    }
}

macro_rules! query {
    ($name:ident / $alias:ident, $field:ident, $what:literal, |$c:ident| $value:expr) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: answered from this library's communicator.")]
            fn $name / $alias(comm: Opaque, value: *mut c_int) -> NcclResult {
                guard(stringify!($name), || {
                    let slot = out(value, $what)?;
                    // SAFETY: NCCL's contract on comm.
                    match unsafe { resolve(comm) }? {
                        Target::Ours($c) => {
                            let $c = $c.ready()?;
                            *slot = $value;
                            Ok(())
                        }
                        Target::Foreign(_) => {
                            let call = |real: &'static RealNccl, c: Opaque| {
                                let f = real.fns.$field?;
                                // SAFETY: a real communicator and a valid out-pointer.
                                Some(unsafe { f(c, value) })
                            };
                            // SAFETY: as above.
                            unsafe { forward(stringify!($name), comm, NOT_SERVED, String::new, call) }
                        }
                    }
                })
            }
        }
    };
}

query!(
    ncclCommCount / pncclCommCount,
    comm_count,
    "count",
    |c| c.nranks as c_int
);
query!(
    ncclCommCuDevice / pncclCommCuDevice,
    comm_cu_device,
    "device",
    |c| c.device
);
query!(
    ncclCommUserRank / pncclCommUserRank,
    comm_user_rank,
    "rank",
    |c| c.rank as c_int
);

// ---- Memory and registration ------------------------------------------------------------

export! {
    /// Forwarded to the real NCCL (RCCL on ROCm) when loaded; else `cuMemAlloc` (CUDA
    /// backend), `hipMalloc` (ROCm backend) or zeroed host memory (host backend).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
        guard("ncclMemAlloc", || {
            let slot = out(ptr, "ptr")?;
            if let Ok(real) = real_nccl() {
                let f = real.fns.mem_alloc.ok_or_else(|| ApiError::invalid_usage("the real NCCL has no ncclMemAlloc"))?;
                // SAFETY: a valid out-pointer.
                let rc = unsafe { f(slot, size) };
                return check_real(rc, real, std::ptr::null_mut(), "ncclMemAlloc");
            }
            *slot = own_alloc(size)?;
            Ok(())
        })
    }
}

export! {
    /// Frees memory from [`ncclMemAlloc`] (the same way it was allocated).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> NcclResult {
        guard("ncclMemFree", || {
            if let Ok(real) = real_nccl() {
                let f = real.fns.mem_free.ok_or_else(|| ApiError::invalid_usage("the real NCCL has no ncclMemFree"))?;
                // SAFETY: the caller's pointer came from ncclMemAlloc, which forwarded too.
                let rc = unsafe { f(ptr) };
                return check_real(rc, real, std::ptr::null_mut(), "ncclMemFree");
            }
            own_free(ptr)
        })
    }
}

fn own_alloc(size: usize) -> ApiResult<*mut c_void> {
    match backend()? {
        BackendKind::Host => {
            // SAFETY: calloc with any size; a null result is handled.
            let p = unsafe { libc::calloc(1, size.max(1)) };
            if p.is_null() {
                return Err(ApiError {
                    code: NCCL_SYSTEM_ERROR,
                    message: format!("calloc of {size} bytes failed"),
                });
            }
            Ok(p)
        }
        BackendKind::Cuda => cuda_alloc(size),
        BackendKind::Rocm => hip_alloc(size),
    }
}

fn own_free(ptr: *mut c_void) -> ApiResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    match backend()? {
        BackendKind::Host => {
            // SAFETY: NCCL's contract: `ptr` came from ncclMemAlloc, which used calloc here.
            unsafe { libc::free(ptr) };
            Ok(())
        }
        BackendKind::Cuda => cuda_free(ptr),
        BackendKind::Rocm => hip_free(ptr),
    }
}

#[cfg(feature = "rocm")]
fn hip_alloc(size: usize) -> ApiResult<*mut c_void> {
    let hip = oxccl_collectives::backend::hal_rocm::Hip::global()?;
    hip.malloc(size.max(1)).map_err(|e| ApiError {
        code: NCCL_UNHANDLED_CUDA_ERROR,
        message: format!("ncclMemAlloc of {size} bytes: {e}"),
    })
}

#[cfg(feature = "rocm")]
fn hip_free(ptr: *mut c_void) -> ApiResult<()> {
    let hip = oxccl_collectives::backend::hal_rocm::Hip::global()?;
    // SAFETY: NCCL's contract: `ptr` came from ncclMemAlloc (hipMalloc here), is freed
    // once, and no queued work uses it any more.
    unsafe { hip.free(ptr) }.map_err(|e| ApiError {
        code: NCCL_UNHANDLED_CUDA_ERROR,
        message: format!("ncclMemFree: {e}"),
    })
}

#[cfg(not(feature = "rocm"))]
fn hip_alloc(_size: usize) -> ApiResult<*mut c_void> {
    Err(ApiError::invalid_usage(
        "no ROCm backend in this build and no real RCCL",
    ))
}

#[cfg(not(feature = "rocm"))]
fn hip_free(_ptr: *mut c_void) -> ApiResult<()> {
    Err(ApiError::invalid_usage(
        "no ROCm backend in this build and no real RCCL",
    ))
}

#[cfg(feature = "cuda")]
fn cuda_alloc(size: usize) -> ApiResult<*mut c_void> {
    oxccl_collectives::backend::hal_cuda::alloc_unowned(size)
        .map(|p| p.0 as usize as *mut c_void)
        .map_err(|e| ApiError {
            code: NCCL_UNHANDLED_CUDA_ERROR,
            message: format!("ncclMemAlloc of {size} bytes: {e}"),
        })
}

#[cfg(feature = "cuda")]
fn cuda_free(ptr: *mut c_void) -> ApiResult<()> {
    let p = oxccl_collectives::hal::DevicePtr(ptr as usize as u64);
    // SAFETY: NCCL's contract: `ptr` came from ncclMemAlloc (alloc_unowned here), is freed
    // once, and no queued work uses it any more.
    unsafe { oxccl_collectives::backend::hal_cuda::free_unowned(p) }.map_err(|e| ApiError {
        code: NCCL_UNHANDLED_CUDA_ERROR,
        message: format!("ncclMemFree: {e}"),
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_alloc(_size: usize) -> ApiResult<*mut c_void> {
    Err(ApiError::invalid_usage(
        "no GPU backend in this build and no real NCCL",
    ))
}

#[cfg(not(feature = "cuda"))]
fn cuda_free(_ptr: *mut c_void) -> ApiResult<()> {
    Err(ApiError::invalid_usage(
        "no GPU backend in this build and no real NCCL",
    ))
}

export! {
    /// Served on this library's communicators ([`crate::register`]): pins the allocation
    /// holding the buffer for oxccl's zero-copy and registers it with the real NCCL too;
    /// passed through for the real library's own communicators.
    fn ncclCommRegister / pncclCommRegister(comm: Opaque, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> NcclResult {
        guard("ncclCommRegister", || {
            let slot = out(handle, "handle")?;
            if buff.is_null() {
                return Err(ApiError::invalid_argument("buff is NULL"));
            }
            // SAFETY: NCCL's contract on comm.
            if let Target::Ours(c) = unsafe { resolve(comm) }? {
                // SAFETY: NCCL's contract on buff and size.
                *slot = unsafe { crate::register::register(c, buff, size) }?;
                return Ok(());
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_register?;
                // SAFETY: a real communicator, the caller's buffer, a valid out-pointer.
                Some(unsafe { f(c, buff, size, handle) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommRegister", comm, "a real NCCL communicator", String::new, call) }
        })
    }
}

export! {
    /// Undoes [`ncclCommRegister`]; a handle this communicator did not make (or already
    /// deregistered) is `ncclInvalidArgument`.
    fn ncclCommDeregister / pncclCommDeregister(comm: Opaque, handle: *mut c_void) -> NcclResult {
        guard("ncclCommDeregister", || {
            // SAFETY: NCCL's contract on comm.
            if let Target::Ours(c) = unsafe { resolve(comm) }? {
                return crate::register::deregister(c, handle);
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_deregister?;
                // SAFETY: a real communicator and its handle.
                Some(unsafe { f(c, handle) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommDeregister", comm, "a real NCCL communicator", String::new, call) }
        })
    }
}

export! {
    /// Served on this library's communicators ([`crate::register`]): a window registered
    /// collectively with oxccl (zero-copy with no exchange per call) and with the real
    /// NCCL too; lengths that differ between ranks are `ncclInvalidArgument` on every rank.
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: Opaque, buff: *mut c_void, size: usize, win: *mut Opaque, winFlags: c_int) -> NcclResult {
        guard("ncclCommWindowRegister", || {
            let slot = out(win, "win")?;
            // SAFETY: NCCL's contract on comm.
            if let Target::Ours(c) = unsafe { resolve(comm) }? {
                // SAFETY: NCCL's contract on buff and size.
                *slot = unsafe { crate::register::register_window(c, buff, size, winFlags) }?;
                return Ok(());
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_window_register?;
                // SAFETY: a real communicator, the caller's buffer, a valid out-pointer.
                Some(unsafe { f(c, buff, size, win, winFlags) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommWindowRegister", comm, "a real NCCL communicator", String::new, call) }
        })
    }
}

export! {
    /// Undoes [`ncclCommWindowRegister`] (collective).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: Opaque, win: Opaque) -> NcclResult {
        guard("ncclCommWindowDeregister", || {
            // SAFETY: NCCL's contract on comm.
            if let Target::Ours(c) = unsafe { resolve(comm) }? {
                return crate::register::deregister_window(c, win);
            }
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.comm_window_deregister?;
                // SAFETY: a real communicator and its window.
                Some(unsafe { f(c, win) })
            };
            // SAFETY: as above.
            unsafe { forward("ncclCommWindowDeregister", comm, "a real NCCL communicator", String::new, call) }
        })
    }
}

// ---- PreMulSum operators ---------------------------------------------------------------

export! {
    /// Served: the operator is kept in the communicator (see [`crate::ops`]) and the real
    /// NCCL makes its own beside it when the communicator has a real side; a communicator
    /// of the real NCCL's gets the real call.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut NcclRedOp, scalar: *mut c_void, datatype: NcclDataType, residence: NcclScalarResidence, comm: Opaque) -> NcclResult {
        guard("ncclRedOpCreatePreMulSum", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { red_op_create(op, scalar, datatype, residence, comm) }
        })
    }
}

/// # Safety
/// NCCL's contract for ncclRedOpCreatePreMulSum.
unsafe fn red_op_create(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    datatype: NcclDataType,
    residence: NcclScalarResidence,
    comm: Opaque,
) -> ApiResult<()> {
    const NAME: &str = "ncclRedOpCreatePreMulSum";
    // SAFETY: NCCL's contract on comm.
    let c = match unsafe { resolve(comm) }? {
        Target::Foreign(_) => {
            let call = |real: &'static RealNccl, c: Opaque| {
                let f = real.fns.red_op_create_pre_mul_sum?;
                // SAFETY: the caller's arguments, for the real library's communicator.
                Some(unsafe { f(op, scalar, datatype, residence, c) })
            };
            // SAFETY: as above.
            return unsafe { forward(NAME, comm, NOT_SERVED, String::new, call) };
        }
        Target::Ours(c) => c.ready()?,
    };
    let slot = out(op, "op")?;
    // SAFETY: NCCL's contract on scalar (one element of datatype).
    let mut user = unsafe { ops::UserOp::new(scalar, datatype, residence) }?;
    if let Some(rc) = c.real {
        let real = real_nccl().map_err(ApiError::internal)?;
        let f = real.fns.red_op_create_pre_mul_sum.ok_or_else(|| {
            ApiError::invalid_usage(format!("the real NCCL at {} has no {NAME}", real.path))
        })?;
        let mut real_op: NcclRedOp = 0;
        // SAFETY: the caller's scalar, type and residence, the real communicator, and a
        // valid out-pointer.
        let rc_code = unsafe { f(&mut real_op, scalar, datatype, residence, rc.0) };
        check_real(rc_code, real, rc.0, NAME)?;
        user.real = Some(real_op);
    }
    let id = match c.ops.insert(user) {
        Ok(id) => id,
        Err(e) => {
            // No id for ours: the real twin goes too.
            if let (Some(real_op), Some(rc), Ok(real)) = (user.real, c.real, real_nccl()) {
                if let Some(f) = real.fns.red_op_destroy {
                    // SAFETY: the operator the real library made just now on `rc`.
                    let _ = unsafe { f(real_op, rc.0) };
                }
            }
            return Err(e);
        }
    };
    *slot = id;
    log_info!(
        "rank {} {NAME} dtype={} residence={residence} -> op {id}{}",
        c.rank,
        type_name(datatype),
        user.real
            .map(|r| format!(" (real NCCL op {r})"))
            .unwrap_or_default()
    );
    Ok(())
}

export! {
    /// Served: removes the operator from the communicator (and the real NCCL's beside it);
    /// a communicator of the real NCCL's gets the real call.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: NcclRedOp, comm: Opaque) -> NcclResult {
        guard("ncclRedOpDestroy", || {
            // SAFETY: NCCL's contract on comm.
            let c = match unsafe { resolve(comm) }? {
                Target::Foreign(_) => {
                    let call = |real: &'static RealNccl, c: Opaque| {
                        let f = real.fns.red_op_destroy?;
                        // SAFETY: the caller's operator, for the real library's communicator.
                        Some(unsafe { f(op, c) })
                    };
                    // SAFETY: as above.
                    return unsafe { forward("ncclRedOpDestroy", comm, NOT_SERVED, String::new, call) };
                }
                Target::Ours(c) => c.ready()?,
            };
            if (0..NCCL_NUM_OPS).contains(&op) {
                return Err(ApiError::invalid_argument(format!(
                    "op {op} is a built-in operator: only ncclRedOpCreatePreMulSum's can be \
                     destroyed"
                )));
            }
            let user = c.ops.remove(op)?;
            if let (Some(real_op), Some(rc)) = (user.real, c.real) {
                let real = real_nccl().map_err(ApiError::internal)?;
                if let Some(f) = real.fns.red_op_destroy {
                    // SAFETY: an operator the real library made on this real communicator,
                    // destroyed once.
                    let r = unsafe { f(real_op, rc.0) };
                    check_real(r, real, rc.0, "ncclRedOpDestroy")?;
                }
            }
            Ok(())
        })
    }
}

// ---- Collectives ------------------------------------------------------------------------

export! {
    /// Served by oxccl for fp32/fp16/bf16/fp8 e4m3/e5m2 with sum/prod/min/max/avg on a
    /// communicator oxccl serves (one node, up to 8 ranks), on the caller's stream; every
    /// other call is forwarded to the real NCCL.
    fn ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclAllReduce", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// Checks a data type and count: the element size, or `ncclInvalidArgument`.
pub fn check_count(count: usize, datatype: NcclDataType) -> ApiResult<usize> {
    let size = type_size(datatype).ok_or_else(|| {
        ApiError::invalid_argument(format!(
            "datatype {datatype} is not an ncclDataType_t (0..{NCCL_NUM_TYPES})"
        ))
    })?;
    count
        .checked_mul(size)
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| {
            ApiError::invalid_argument(format!(
                "count {count} of {} overflows the address space",
                type_name(datatype)
            ))
        })
}

/// What a reducing call's operator means on `c` for `datatype`: the reduction oxccl runs
/// (`None` for an operator it does not serve) and the operator a forwarded call hands the
/// real NCCL (a PreMulSum operator's real twin). Negative values are no `ncclRedOp_t`;
/// values past the built-in ones must be PreMulSum operators of this communicator made
/// for `datatype`: anything else is `ncclInvalidArgument`, as NCCL answers.
fn check_op(
    c: &Ready,
    op: NcclRedOp,
    datatype: NcclDataType,
) -> ApiResult<(Option<Reduction>, NcclRedOp)> {
    if op < 0 {
        return Err(ApiError::invalid_argument(format!(
            "op {op} is not an ncclRedOp_t"
        )));
    }
    if op < NCCL_NUM_OPS {
        return Ok((served_op(op).map(Reduction::BuiltIn), op));
    }
    let user = c.ops.get(op, datatype)?;
    Ok((
        Some(Reduction::PreMul(user.scalar)),
        user.real.unwrap_or(op),
    ))
}

/// # Safety
/// NCCL's contract for ncclAllReduce.
unsafe fn all_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || {
        format!(
            " count={count} dtype={} op={}",
            type_name(datatype),
            op_name(op)
        )
    };
    let forward_why = |why: String, op: NcclRedOp| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.all_reduce?;
            // SAFETY: the caller's arguments with the real communicator (and its operator).
            Some(unsafe { f(sendbuff, recvbuff, count, datatype, op, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward("ncclAllReduce", comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into(), op),
        Target::Ours(c) => c.ready()?,
    };
    check_count(count, datatype)?;
    let (reduction, real_op) = check_op(c, op, datatype)?;
    if count > 0 && (sendbuff.is_null() || recvbuff.is_null()) {
        return Err(ApiError::invalid_argument(format!(
            "sendbuff {sendbuff:?} or recvbuff {recvbuff:?} is NULL with count {count}"
        )));
    }
    let (ox, dtype, rop) = match served_reduction(c, datatype, reduction) {
        Ok(served) => served,
        Err(why) => return forward_why(why, real_op),
    };
    if count == 0 {
        return Ok(());
    }
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.all_reduce(ox, send, recv, count, dtype, rop, stream) }?;
        log_info!(
            "rank {} ncclAllReduce{} -> oxccl ({algo})",
            c.rank,
            detail()
        );
        Ok(())
    };
    group::run_or_queue("ncclAllReduce", comm, c, call)
}

/// The oxccl communicator, type and reduction that serve a reducing call on `c` (its
/// operator resolved by [`check_op`]), or why the call must be forwarded.
fn served_reduction(
    c: &Ready,
    datatype: NcclDataType,
    reduction: Option<Reduction>,
) -> Result<(&Communicator, DataType, Reduction), String> {
    let dtype = served_dtype(datatype)
        .ok_or_else(|| format!("dtype {} is not served by oxccl", type_name(datatype)))?;
    if let Some(why) = serve::dtype_refusal(c.kind, datatype) {
        return Err(why);
    }
    let rop = reduction.ok_or_else(|| "the operator is not served by oxccl".to_string())?;
    let ox = c.serving().ok_or_else(|| not_serving(c))?;
    Ok((ox, dtype, rop))
}

/// Why oxccl does not serve a communicator of ours.
fn not_serving(c: &Ready) -> String {
    serve::refusal(c).unwrap_or_else(|| "oxccl does not serve this communicator".into())
}

export! {
    /// Served by oxccl for every data type (data only moves) on a communicator oxccl serves
    /// (one node, up to 8 ranks), on the caller's stream, in place when `sendbuff` is this
    /// rank's slot of `recvbuff`; every other call is forwarded to the real NCCL.
    fn ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: NcclDataType, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclAllGather", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// # Safety
/// NCCL's contract for ncclAllGather.
unsafe fn all_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: NcclDataType,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || format!(" sendcount={sendcount} dtype={}", type_name(datatype));
    let forward_why = |why: String| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.all_gather?;
            // SAFETY: the caller's arguments with the real communicator.
            Some(unsafe { f(sendbuff, recvbuff, sendcount, datatype, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward("ncclAllGather", comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into()),
        Target::Ours(c) => c.ready()?,
    };
    check_count(sendcount, datatype)?;
    if sendcount > 0 && (sendbuff.is_null() || recvbuff.is_null()) {
        return Err(ApiError::invalid_argument(format!(
            "sendbuff {sendbuff:?} or recvbuff {recvbuff:?} is NULL with sendcount {sendcount}"
        )));
    }
    let Some(ox) = c.serving() else {
        return forward_why(not_serving(c));
    };
    if sendcount == 0 {
        return Ok(());
    }
    let (dtype, count) = moved_as(datatype, sendcount)
        .ok_or_else(|| ApiError::invalid_argument(format!("sendcount {sendcount} overflows")))?;
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.all_gather(ox, send, recv, count, dtype, stream) }?;
        log_info!(
            "rank {} ncclAllGather{} -> oxccl ({algo})",
            c.rank,
            detail()
        );
        Ok(())
    };
    group::run_or_queue("ncclAllGather", comm, c, call)
}

export! {
    /// Served by oxccl for the types and operators of ncclAllReduce on a communicator oxccl
    /// serves, on the caller's stream, in place when `recvbuff` is this rank's chunk of
    /// `sendbuff`; every other call is forwarded to the real NCCL.
    fn ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: NcclDataType, op: NcclRedOp, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclReduceScatter", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// # Safety
/// NCCL's contract for ncclReduceScatter.
unsafe fn reduce_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || {
        format!(
            " recvcount={recvcount} dtype={} op={}",
            type_name(datatype),
            op_name(op)
        )
    };
    let forward_why = |why: String, op: NcclRedOp| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.reduce_scatter?;
            // SAFETY: the caller's arguments with the real communicator (and its operator).
            Some(unsafe { f(sendbuff, recvbuff, recvcount, datatype, op, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward("ncclReduceScatter", comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into(), op),
        Target::Ours(c) => c.ready()?,
    };
    check_count(recvcount, datatype)?;
    let (reduction, real_op) = check_op(c, op, datatype)?;
    if recvcount > 0 && (sendbuff.is_null() || recvbuff.is_null()) {
        return Err(ApiError::invalid_argument(format!(
            "sendbuff {sendbuff:?} or recvbuff {recvbuff:?} is NULL with recvcount {recvcount}"
        )));
    }
    let (ox, dtype, rop) = match served_reduction(c, datatype, reduction) {
        Ok(served) => served,
        Err(why) => return forward_why(why, real_op),
    };
    if recvcount == 0 {
        return Ok(());
    }
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.reduce_scatter(ox, send, recv, recvcount, dtype, rop, stream) }?;
        log_info!(
            "rank {} ncclReduceScatter{} -> oxccl ({algo})",
            c.rank,
            detail()
        );
        Ok(())
    };
    group::run_or_queue("ncclReduceScatter", comm, c, call)
}

export! {
    /// Served by oxccl for every data type (data only moves) on a communicator oxccl serves,
    /// on the caller's stream (send and receive buffers must not overlap); every other call
    /// is forwarded to the real NCCL.
    fn ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclAlltoAll", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { all_to_all(sendbuff, recvbuff, count, datatype, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// # Safety
/// NCCL's contract for ncclAlltoAll.
unsafe fn all_to_all(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || format!(" count={count} dtype={}", type_name(datatype));
    let forward_why = |why: String| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.all_to_all?;
            // SAFETY: the caller's arguments with the real communicator.
            Some(unsafe { f(sendbuff, recvbuff, count, datatype, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward("ncclAlltoAll", comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into()),
        Target::Ours(c) => c.ready()?,
    };
    check_count(count, datatype)?;
    if count > 0 && (sendbuff.is_null() || recvbuff.is_null()) {
        return Err(ApiError::invalid_argument(format!(
            "sendbuff {sendbuff:?} or recvbuff {recvbuff:?} is NULL with count {count}"
        )));
    }
    let Some(ox) = c.serving() else {
        return forward_why(not_serving(c));
    };
    if count == 0 {
        return Ok(());
    }
    let (dtype, n) = moved_as(datatype, count)
        .ok_or_else(|| ApiError::invalid_argument(format!("count {count} overflows")))?;
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.all_to_all(ox, send, recv, n, dtype, stream) }?;
        log_info!("rank {} ncclAlltoAll{} -> oxccl ({algo})", c.rank, detail());
        Ok(())
    };
    group::run_or_queue("ncclAlltoAll", comm, c, call)
}

export! {
    /// Served by oxccl for the types and operators of ncclAllReduce on a communicator oxccl
    /// serves, on the caller's stream, in place when `sendbuff == recvbuff` on the root
    /// (`recvbuff` is written on the root only, and may be NULL elsewhere); every other call
    /// is forwarded to the real NCCL.
    fn ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, root: c_int, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclReduce", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// # Safety
/// NCCL's contract for ncclReduce.
#[allow(clippy::too_many_arguments)]
unsafe fn reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || {
        format!(
            " count={count} dtype={} op={} root={root}",
            type_name(datatype),
            op_name(op)
        )
    };
    let forward_why = |why: String, op: NcclRedOp| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.reduce?;
            // SAFETY: the caller's arguments with the real communicator (and its operator).
            Some(unsafe { f(sendbuff, recvbuff, count, datatype, op, root, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward("ncclReduce", comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into(), op),
        Target::Ours(c) => c.ready()?,
    };
    check_count(count, datatype)?;
    let (reduction, real_op) = check_op(c, op, datatype)?;
    let root = u32::try_from(root)
        .ok()
        .filter(|r| *r < c.nranks)
        .ok_or_else(|| {
            ApiError::invalid_argument(format!("root {root} is not a rank of {} ranks", c.nranks))
        })?;
    let is_root = root == c.rank;
    if count > 0 && (sendbuff.is_null() || (is_root && recvbuff.is_null())) {
        return Err(ApiError::invalid_argument(format!(
            "sendbuff {sendbuff:?} (or the root's recvbuff {recvbuff:?}) is NULL with count \
             {count}"
        )));
    }
    let (ox, dtype, rop) = match served_reduction(c, datatype, reduction) {
        Ok(served) => served,
        Err(why) => return forward_why(why, real_op),
    };
    if count == 0 {
        return Ok(());
    }
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.reduce(ox, send, recv, count, dtype, rop, root, stream) }?;
        log_info!("rank {} ncclReduce{} -> oxccl ({algo})", c.rank, detail());
        Ok(())
    };
    group::run_or_queue("ncclReduce", comm, c, call)
}

export! {
    /// Served by oxccl for every data type (data only moves) on a communicator oxccl
    /// serves, on the caller's stream (`sendbuff` is read on the root only); every other
    /// call is forwarded to the real NCCL.
    fn ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclBroadcast", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { broadcast("ncclBroadcast", sendbuff, recvbuff, count, datatype, root, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

export! {
    /// In-place broadcast: ncclBroadcast with `sendbuff == recvbuff == buff`.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Opaque, stream: CudaStreamT) -> NcclResult {
        grouped("ncclBcast", || {
            // SAFETY: NCCL's contract on every argument.
            unsafe { broadcast("ncclBcast", buff.cast_const(), buff, count, datatype, root, comm, stream) }.map(|()| NCCL_SUCCESS)
        })
    }
}

/// # Safety
/// NCCL's contract for ncclBroadcast (`name` is the entry point, for messages).
#[allow(clippy::too_many_arguments)]
unsafe fn broadcast(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: Opaque,
    stream: CudaStreamT,
) -> ApiResult<()> {
    // SAFETY: NCCL's contract on comm.
    let target = unsafe { resolve(comm) }?;
    let detail = move || format!(" count={count} dtype={} root={root}", type_name(datatype));
    let forward_why = |why: String| {
        let call = |real: &'static RealNccl, c: Opaque| {
            let f = real.fns.broadcast?;
            // SAFETY: the caller's arguments with the real communicator (ncclBcast is
            // ncclBroadcast in place).
            Some(unsafe { f(sendbuff, recvbuff, count, datatype, root, c, stream) })
        };
        // SAFETY: NCCL's contract on comm.
        unsafe { forward(name, comm, &why, detail, call) }
    };
    let c = match target {
        Target::Foreign(_) => return forward_why(NOT_SERVED.into()),
        Target::Ours(c) => c.ready()?,
    };
    check_count(count, datatype)?;
    let root = u32::try_from(root)
        .ok()
        .filter(|r| *r < c.nranks)
        .ok_or_else(|| {
            ApiError::invalid_argument(format!("root {root} is not a rank of {} ranks", c.nranks))
        })?;
    let is_root = root == c.rank;
    if count > 0 && (recvbuff.is_null() || (is_root && sendbuff.is_null())) {
        return Err(ApiError::invalid_argument(format!(
            "recvbuff {recvbuff:?} (or the root's sendbuff {sendbuff:?}) is NULL with count \
             {count}"
        )));
    }
    let Some(ox) = c.serving() else {
        return forward_why(not_serving(c));
    };
    if count == 0 {
        return Ok(());
    }
    let (dtype, n) = moved_as(datatype, count)
        .ok_or_else(|| ApiError::invalid_argument(format!("count {count} overflows")))?;
    let send = DevicePtr(sendbuff as usize as u64);
    let recv = DevicePtr(recvbuff as usize as u64);
    let call = move || {
        // SAFETY: NCCL's contract on buffers and stream is oxccl's (in a group: until the
        // group's work has completed).
        let algo = unsafe { c.broadcast(ox, send, recv, n, dtype, root, stream) }?;
        log_info!("rank {} {name}{} -> oxccl ({algo})", c.rank, detail());
        Ok(())
    };
    group::run_or_queue(name, comm, c, call)
}
forwarded!(grouped; ncclGather / pncclGather, gather, comm, (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Opaque, stream: CudaStreamT));
forwarded!(grouped; ncclScatter / pncclScatter, scatter, comm, (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Opaque, stream: CudaStreamT));
forwarded!(grouped; ncclSend / pncclSend, send, comm, (sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Opaque, stream: CudaStreamT));
forwarded!(grouped; ncclRecv / pncclRecv, recv, comm, (recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Opaque, stream: CudaStreamT));

// ---- Groups -----------------------------------------------------------------------------

export! {
    /// Opens a group on this thread (and on the real NCCL, when loaded). Until the
    /// outermost ncclGroupEnd, inits, splits and the collectives oxccl serves are recorded,
    /// not run (see [`crate::group`]).
    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        guard("ncclGroupStart", || {
            if let Ok(real) = real_nccl() {
                if let Some(f) = real.fns.group_start {
                    // SAFETY: no arguments.
                    check_real(unsafe { f() }, real, std::ptr::null_mut(), "ncclGroupStart")?;
                }
            }
            group::enter();
            Ok(())
        })
    }
}

/// Ends one level of the real NCCL's group (when loaded).
fn end_real_group() -> ApiResult<()> {
    if let Ok(real) = real_nccl() {
        if let Some(f) = real.fns.group_end {
            // SAFETY: no arguments.
            return check_real(unsafe { f() }, real, std::ptr::null_mut(), "ncclGroupEnd");
        }
    }
    Ok(())
}

export! {
    /// Closes a group (and the real NCCL's). The outermost one completes what the group
    /// recorded: its collectives, then its inits and splits (all of them, or none: when one
    /// fails, every communicator of the group is released and holds the failure).
    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        guard("ncclGroupEnd", || match group::leave("ncclGroupEnd")? {
            None => end_real_group(),
            Some(closed) => closed.complete(end_real_group),
        })
    }
}

export! {
    /// Forwarded to the real NCCL (`ncclInvalidUsage` without one); closes the group. What
    /// this library recorded in it is not run (its pending communicators fail).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut c_void) -> NcclResult {
        guard("ncclGroupSimulateEnd", || {
            let closed = group::leave("ncclGroupSimulateEnd")?;
            let r = forward_plain("ncclGroupSimulateEnd", |real| {
                let f = real.fns.group_simulate_end?;
                // SAFETY: the caller's sim info.
                Some(unsafe { f(simInfo) })
            });
            if let Some(closed) = closed {
                closed.discard(
                    "the group was closed by ncclGroupSimulateEnd, which runs nothing of it",
                );
            }
            r
        })
    }
}

/// The current group depth of this thread (for tests).
pub fn group_depth() -> u32 {
    group::depth()
}

// ---- Device-API host functions that take a communicator ------------------------------

forwarded!(ncclDevCommCreate / pncclDevCommCreate, dev_comm_create, comm, (comm: Opaque, reqs: *const c_void, outDevComm: *mut c_void));
forwarded!(ncclDevCommDestroy / pncclDevCommDestroy, dev_comm_destroy, comm, (comm: Opaque, devComm: *const c_void));
forwarded!(ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement, gin_barrier_create_requirement, comm, (comm: Opaque, team: NcclTeam, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void));

macro_rules! team_fn {
    ($name:ident / $alias:ident, $field:ident) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: forwarded to the real NCCL; a zero team (and a last error) without one.")]
            fn $name / $alias(comm: Opaque) -> NcclTeam {
                let mut team = NcclTeam::default();
                let rc = guard(stringify!($name), || {
                    let call = |real: &'static RealNccl, c: Opaque| {
                        let f = real.fns.$field?;
                        // SAFETY: a real communicator.
                        team = unsafe { f(c) };
                        Some(NCCL_SUCCESS)
                    };
                    // SAFETY: NCCL's contract on comm.
                    unsafe { forward(stringify!($name), comm, NOT_SERVED, String::new, call) }
                });
                if rc != NCCL_SUCCESS {
                    set_last_error(&format!("{}: failed with {rc}", stringify!($name)));
                }
                team
            }
        }
    };
}

team_fn!(ncclTeamWorld / pncclTeamWorld, team_world);
team_fn!(ncclTeamLsa / pncclTeamLsa, team_lsa);
team_fn!(ncclTeamRail / pncclTeamRail, team_rail);

macro_rules! team_rank_fn {
    ($name:ident / $alias:ident, $field:ident) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: forwarded to the real NCCL; -1 without one.")]
            fn $name / $alias(comm: Opaque, team: NcclTeam, rank: c_int) -> c_int {
                let mut answer = -1;
                let _ = guard(stringify!($name), || {
                    let call = |real: &'static RealNccl, c: Opaque| {
                        let f = real.fns.$field?;
                        // SAFETY: a real communicator and the caller's team.
                        answer = unsafe { f(c, team, rank) };
                        Some(NCCL_SUCCESS)
                    };
                    // SAFETY: NCCL's contract on comm.
                    unsafe { forward(stringify!($name), comm, NOT_SERVED, String::new, call) }
                });
                answer
            }
        }
    };
}

team_rank_fn!(
    ncclTeamRankToWorld / pncclTeamRankToWorld,
    team_rank_to_world
);
team_rank_fn!(ncclTeamRankToLsa / pncclTeamRankToLsa, team_rank_to_lsa);
