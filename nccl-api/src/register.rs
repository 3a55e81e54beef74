//! `ncclCommRegister` / `ncclCommDeregister` and `ncclCommWindowRegister` /
//! `ncclCommWindowDeregister` on this library's communicators.
//!
//! A registered buffer pins the allocation that holds it in oxccl's zero-copy cache
//! (local, as NCCL's registration: the peers map it at the first call that uses it); a
//! window is registered collectively with oxccl ([`Communicator::register_window`]), so
//! calls inside windows at the same offset on every rank are zero-copy with no exchange per
//! call. Either is also registered with the real NCCL when the communicator has a real
//! side, so forwarded calls on the same buffers benefit too. On the host backend the
//! caller's buffers are host memory copied through staging: registration is recorded (the
//! handle is checked at deregistration) and nothing is mapped.
//!
//! Handles are numbers from one counter of this library, never pointers: a handle that is
//! not live for the communicator it is given with is refused without being read.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use oxccl_collectives::hal::{DevicePtr, ForeignAllocation};
use oxccl_collectives::Communicator;

use crate::comm::{check_real, real_nccl, Comm, Ready};
use crate::error::{ApiError, ApiResult};
use crate::serve;
use crate::types::Opaque;

/// What a handle stands for.
#[derive(Debug)]
enum Kind {
    /// `ncclCommRegister`: the pinned allocation, when oxccl serves the communicator.
    Buffer(Option<ForeignAllocation>),
    /// `ncclCommWindowRegister`: the window's start, when registered with oxccl.
    Window(Option<DevicePtr>),
}

#[derive(Debug)]
struct Registration {
    /// The communicator's handle (address of its `Comm`).
    comm: usize,
    kind: Kind,
    /// The real NCCL's handle (buffer) or window, when registered there too.
    real: Option<usize>,
}

static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);
static LIVE: Mutex<Option<HashMap<usize, Registration>>> = Mutex::new(None);

fn with_live<T>(f: impl FnOnce(&mut HashMap<usize, Registration>) -> T) -> T {
    // Each update is one insert or remove: a poisoned lock still holds consistent data.
    let mut g = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn new_handle() -> usize {
    // Multiples of 16, so a handle never looks like a small integer a caller made up.
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) << 4
}

/// The oxccl communicator that maps callers' GPU memory (none on the host backend,
/// whose calls stage the caller's host memory, nor on ROCm: [`serve::maps_callers_memory`]).
fn mapping_side(ready: &Ready) -> Option<&Communicator> {
    ready
        .serving()
        .filter(|_| serve::maps_callers_memory(ready.kind))
}

/// Registers `[buff, buff + size)` on `comm` (ours); returns the handle.
///
/// # Safety
/// NCCL's contract for `ncclCommRegister`: `buff` is the caller's memory of `size` bytes
/// (handed to the real NCCL as is).
pub unsafe fn register(
    comm: &'static Comm,
    buff: *mut c_void,
    size: usize,
) -> ApiResult<*mut c_void> {
    let ready = comm.ready()?;
    let pin = match mapping_side(ready) {
        Some(c) => Some(c.pin_allocation(DevicePtr(buff as usize as u64), size)?),
        None => None,
    };
    let unpin = |ready: &Ready| {
        if let (Some(c), Some(a)) = (mapping_side(ready), &pin) {
            c.unpin_allocation(a);
        }
    };
    let mut real_handle = None;
    if let Some(raw) = ready.real.map(|r| r.0) {
        let outcome = real_nccl()
            .map_err(ApiError::invalid_usage)
            .and_then(|real| {
                let f = real.fns.comm_register.ok_or_else(|| {
                    ApiError::invalid_usage(format!(
                        "the real NCCL at {} has no ncclCommRegister",
                        real.path
                    ))
                })?;
                let mut h: *mut c_void = std::ptr::null_mut();
                // SAFETY: a real communicator, the caller's buffer, a valid out-pointer.
                let rc = unsafe { f(raw, buff, size, &mut h) };
                check_real(rc, real, raw, "ncclCommRegister").map(|()| h as usize)
            });
        match outcome {
            Ok(h) => real_handle = Some(h),
            Err(e) => {
                unpin(ready);
                return Err(e);
            }
        }
    }
    let handle = new_handle();
    with_live(|m| {
        m.insert(
            handle,
            Registration {
                comm: comm as *const Comm as usize,
                kind: Kind::Buffer(pin),
                real: real_handle,
            },
        )
    });
    Ok(handle as *mut c_void)
}

/// Takes `handle` of kind `window` (or buffer) off `comm`, refusing one it does not own.
fn take(comm: &'static Comm, handle: usize, window: bool, name: &str) -> ApiResult<Registration> {
    let addr = comm as *const Comm as usize;
    with_live(|m| {
        let ok = m
            .get(&handle)
            .is_some_and(|r| r.comm == addr && matches!(r.kind, Kind::Window(_)) == window);
        if ok {
            m.remove(&handle)
        } else {
            None
        }
    })
    .ok_or_else(|| {
        ApiError::invalid_argument(format!(
            "{name}: {handle:#x} is not a live {} of this communicator (never made by it, \
             or deregistered already)",
            if window {
                "window"
            } else {
                "registration handle"
            }
        ))
    })
}

/// Undoes [`register`].
pub fn deregister(comm: &'static Comm, handle: *mut c_void) -> ApiResult<()> {
    let ready = comm.ready()?;
    let r = take(comm, handle as usize, false, "ncclCommDeregister")?;
    if let (Some(c), Kind::Buffer(Some(a))) = (mapping_side(ready), &r.kind) {
        c.unpin_allocation(a);
    }
    if let (Some(raw), Some(h)) = (ready.real.map(|x| x.0), r.real) {
        let real = real_nccl().map_err(ApiError::invalid_usage)?;
        let f = real.fns.comm_deregister.ok_or_else(|| {
            ApiError::invalid_usage(format!(
                "the real NCCL at {} has no ncclCommDeregister",
                real.path
            ))
        })?;
        // SAFETY: a real communicator and the handle it returned for this registration.
        let rc = unsafe { f(raw, h as *mut c_void) };
        check_real(rc, real, raw, "ncclCommDeregister")?;
    }
    Ok(())
}

/// Registers a window (collective over `comm`'s ranks); returns the window handle.
///
/// # Safety
/// NCCL's contract for `ncclCommWindowRegister`: `buff` is the caller's memory of `size`
/// bytes (handed to the real NCCL as is).
pub unsafe fn register_window(
    comm: &'static Comm,
    buff: *mut c_void,
    size: usize,
    flags: c_int,
) -> ApiResult<Opaque> {
    let ready = comm.ready()?;
    if buff.is_null() || size == 0 {
        return Err(ApiError::invalid_argument(format!(
            "a window of {size} bytes at {buff:?}"
        )));
    }
    let ptr = DevicePtr(buff as usize as u64);
    let ours = match (mapping_side(ready), ready.serving()) {
        (Some(c), _) => {
            c.register_window(ptr, size)?;
            Some(ptr)
        }
        // The host backend stages every call: nothing to map, but the ranks still agree
        // on the window's length, as they must on a GPU.
        (None, Some(c)) => {
            let all = c.bootstrap().all_gather(&(size as u64).to_le_bytes())?;
            if all.iter().any(|b| b[..] != (size as u64).to_le_bytes()[..]) {
                return Err(ApiError::invalid_argument(format!(
                    "ncclCommWindowRegister with different lengths across ranks (this rank: \
                     {size} bytes)"
                )));
            }
            None
        }
        (None, None) => None,
    };
    let mut real_win = None;
    if let Some(raw) = ready.real.map(|r| r.0) {
        let outcome = real_nccl()
            .map_err(ApiError::invalid_usage)
            .and_then(|real| {
                let f = real.fns.comm_window_register.ok_or_else(|| {
                    ApiError::invalid_usage(format!(
                        "the real NCCL at {} has no ncclCommWindowRegister",
                        real.path
                    ))
                })?;
                let mut w: Opaque = std::ptr::null_mut();
                // SAFETY: a real communicator, the caller's buffer, a valid out-pointer.
                let rc = unsafe { f(raw, buff, size, &mut w, flags) };
                check_real(rc, real, raw, "ncclCommWindowRegister").map(|()| w as usize)
            });
        match outcome {
            Ok(w) => real_win = Some(w),
            Err(e) => {
                if let (Some(c), Some(p)) = (mapping_side(ready), ours) {
                    let _ = c.deregister_window(p);
                }
                return Err(e);
            }
        }
    }
    let handle = new_handle();
    with_live(|m| {
        m.insert(
            handle,
            Registration {
                comm: comm as *const Comm as usize,
                kind: Kind::Window(ours),
                real: real_win,
            },
        )
    });
    Ok(handle as Opaque)
}

/// Undoes [`register_window`] (collective).
pub fn deregister_window(comm: &'static Comm, win: Opaque) -> ApiResult<()> {
    let ready = comm.ready()?;
    let r = take(comm, win as usize, true, "ncclCommWindowDeregister")?;
    if let (Some(c), Kind::Window(Some(p))) = (mapping_side(ready), &r.kind) {
        c.deregister_window(*p)?;
    }
    if let (Some(raw), Some(w)) = (ready.real.map(|x| x.0), r.real) {
        let real = real_nccl().map_err(ApiError::invalid_usage)?;
        let f = real.fns.comm_window_deregister.ok_or_else(|| {
            ApiError::invalid_usage(format!(
                "the real NCCL at {} has no ncclCommWindowDeregister",
                real.path
            ))
        })?;
        // SAFETY: a real communicator and the window it returned for this registration.
        let rc = unsafe { f(raw, w as Opaque) };
        check_real(rc, real, raw, "ncclCommWindowDeregister")?;
    }
    Ok(())
}
