//! The real library, loaded at run time: `OXCCL_NCCL_LIB_PATH`, else NCCL
//! (`libnccl.so.2`), or on the ROCm backend RCCL (`librccl.so.1`), whose C ABI is NCCL's:
//! the same function names, enums and unique id (the names tried are
//! `oxccl_backend::vendor`'s). Every symbol is resolved from that library's own handle
//! (never through the global scope, which would find this library's exports first).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;
use oxccl_collectives::backend::vendor;
use oxccl_collectives::hal::BackendKind;

use crate::types::*;

/// Environment variable: path of the real NCCL (or RCCL) library.
pub const LIB_PATH_VAR: &str = vendor::LIBRARY_VAR;
/// A symbol only this library exports: finding it in the loaded library means the path
/// leads back to us.
pub const MARKER_SYMBOL: &str = "oxccl_nccl_api_marker";

macro_rules! real_fns {
    ($($field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The real library's entry points (`None`: this version of NCCL lacks it).
        #[derive(Debug, Clone, Copy)]
        #[allow(missing_docs)]
        pub struct RealFns {
            $(pub $field: Option<unsafe extern "C" fn($($arg),*) $(-> $ret)?>,)*
        }

        impl RealFns {
            fn resolve(lib: &Library) -> RealFns {
                RealFns {
                    $($field: {
                        // SAFETY: the type is the one `nccl.h` declares for this symbol.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>($sym)
                        };
                        s.ok().map(|s| *s)
                    },)*
                }
            }
        }
    };
}

real_fns! {
    get_version = "ncclGetVersion": fn(*mut c_int) -> NcclResult;
    get_unique_id = "ncclGetUniqueId": fn(*mut NcclUniqueId) -> NcclResult;
    comm_init_rank_config = "ncclCommInitRankConfig": fn(*mut Opaque, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> NcclResult;
    comm_init_rank = "ncclCommInitRank": fn(*mut Opaque, c_int, NcclUniqueId, c_int) -> NcclResult;
    comm_finalize = "ncclCommFinalize": fn(Opaque) -> NcclResult;
    comm_destroy = "ncclCommDestroy": fn(Opaque) -> NcclResult;
    comm_abort = "ncclCommAbort": fn(Opaque) -> NcclResult;
    comm_revoke = "ncclCommRevoke": fn(Opaque, c_int) -> NcclResult;
    comm_split = "ncclCommSplit": fn(Opaque, c_int, c_int, *mut Opaque, *mut NcclConfig) -> NcclResult;
    comm_shrink = "ncclCommShrink": fn(Opaque, *mut c_int, c_int, *mut Opaque, *mut NcclConfig, c_int) -> NcclResult;
    get_last_error = "ncclGetLastError": fn(Opaque) -> *const c_char;
    reset_debug_init = "ncclResetDebugInit": fn();
    comm_get_async_error = "ncclCommGetAsyncError": fn(Opaque, *mut NcclResult) -> NcclResult;
    comm_count = "ncclCommCount": fn(Opaque, *mut c_int) -> NcclResult;
    comm_cu_device = "ncclCommCuDevice": fn(Opaque, *mut c_int) -> NcclResult;
    comm_user_rank = "ncclCommUserRank": fn(Opaque, *mut c_int) -> NcclResult;
    comm_register = "ncclCommRegister": fn(Opaque, *mut c_void, usize, *mut *mut c_void) -> NcclResult;
    comm_deregister = "ncclCommDeregister": fn(Opaque, *mut c_void) -> NcclResult;
    comm_window_register = "ncclCommWindowRegister": fn(Opaque, *mut c_void, usize, *mut Opaque, c_int) -> NcclResult;
    comm_window_deregister = "ncclCommWindowDeregister": fn(Opaque, Opaque) -> NcclResult;
    red_op_create_pre_mul_sum = "ncclRedOpCreatePreMulSum": fn(*mut NcclRedOp, *mut c_void, NcclDataType, NcclScalarResidence, Opaque) -> NcclResult;
    red_op_destroy = "ncclRedOpDestroy": fn(NcclRedOp, Opaque) -> NcclResult;
    reduce = "ncclReduce": fn(*const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, c_int, Opaque, CudaStreamT) -> NcclResult;
    bcast = "ncclBcast": fn(*mut c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    broadcast = "ncclBroadcast": fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    all_reduce = "ncclAllReduce": fn(*const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, Opaque, CudaStreamT) -> NcclResult;
    reduce_scatter = "ncclReduceScatter": fn(*const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, Opaque, CudaStreamT) -> NcclResult;
    all_gather = "ncclAllGather": fn(*const c_void, *mut c_void, usize, NcclDataType, Opaque, CudaStreamT) -> NcclResult;
    all_to_all = "ncclAlltoAll": fn(*const c_void, *mut c_void, usize, NcclDataType, Opaque, CudaStreamT) -> NcclResult;
    gather = "ncclGather": fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    scatter = "ncclScatter": fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    send = "ncclSend": fn(*const c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    recv = "ncclRecv": fn(*mut c_void, usize, NcclDataType, c_int, Opaque, CudaStreamT) -> NcclResult;
    group_start = "ncclGroupStart": fn() -> NcclResult;
    group_end = "ncclGroupEnd": fn() -> NcclResult;
    group_simulate_end = "ncclGroupSimulateEnd": fn(*mut c_void) -> NcclResult;
    mem_alloc = "ncclMemAlloc": fn(*mut *mut c_void, usize) -> NcclResult;
    mem_free = "ncclMemFree": fn(*mut c_void) -> NcclResult;
    dev_comm_create = "ncclDevCommCreate": fn(Opaque, *const c_void, *mut c_void) -> NcclResult;
    dev_comm_destroy = "ncclDevCommDestroy": fn(Opaque, *const c_void) -> NcclResult;
    team_world = "ncclTeamWorld": fn(Opaque) -> NcclTeam;
    team_lsa = "ncclTeamLsa": fn(Opaque) -> NcclTeam;
    team_rail = "ncclTeamRail": fn(Opaque) -> NcclTeam;
    team_rank_to_world = "ncclTeamRankToWorld": fn(Opaque, NcclTeam, c_int) -> c_int;
    team_rank_to_lsa = "ncclTeamRankToLsa": fn(Opaque, NcclTeam, c_int) -> c_int;
    gin_barrier_create_requirement = "ncclGinBarrierCreateRequirement": fn(Opaque, NcclTeam, c_int, *mut c_void, *mut c_void) -> NcclResult;
}

/// The loaded real NCCL.
#[derive(Debug)]
pub struct RealNccl {
    /// Its entry points.
    pub fns: RealFns,
    /// Its version code (`ncclGetVersion`).
    pub version: c_int,
    /// Where it was loaded from.
    pub path: String,
    _lib: Library,
}

/// Loads the real NCCL (RCCL on the ROCm backend) once per process. `Err` says why there
/// is none.
pub fn real() -> Result<&'static RealNccl, String> {
    static REAL: OnceLock<Result<RealNccl, String>> = OnceLock::new();
    REAL.get_or_init(|| {
        // Without a backend (none found) the real library is never called; NCCL's name
        // keeps the message familiar.
        let kind = crate::comm::backend().unwrap_or(BackendKind::Cuda);
        let r = load(&vendor::library_candidates_from_env(kind));
        if let Err(e) = &r {
            crate::error::log_info!("{e}");
        }
        r
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Opens the first of `names` that loads; the error names every one tried.
fn open_first(names: &[String]) -> Result<(Library, String), String> {
    let mut failures = Vec::new();
    for name in names {
        // SAFETY: loading NCCL/RCCL runs its initializers, which only set up its own state.
        match unsafe { Library::new(name.as_str()) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => failures.push(format!("'{name}' ({e})")),
        }
    }
    Err(format!(
        "no real NCCL: loading {} failed; set {LIB_PATH_VAR}",
        failures.join(", ")
    ))
}

fn load(names: &[String]) -> Result<RealNccl, String> {
    let (lib, path) = open_first(names)?;
    // SAFETY: only looks the symbol up; it is never called or read.
    if unsafe { lib.get::<*const u8>(MARKER_SYMBOL) }.is_ok() {
        return Err(format!(
            "no real NCCL: '{path}' is liboxccl_nccl itself; set {LIB_PATH_VAR} to the real \
             libnccl.so.2 (librccl.so.1 on ROCm)"
        ));
    }
    let fns = RealFns::resolve(&lib);
    let get_version = fns
        .get_version
        .ok_or_else(|| format!("no real NCCL: '{path}' has no ncclGetVersion"))?;
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer for the call.
    let rc = unsafe { get_version(&mut version) };
    if rc != NCCL_SUCCESS {
        return Err(format!(
            "no real NCCL: ncclGetVersion of '{path}' returned {rc}"
        ));
    }
    crate::error::log_info!("real NCCL {version} loaded from {path}");
    Ok(RealNccl {
        fns,
        version,
        path,
        _lib: lib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_every_path_tried() {
        let names = [
            "/nonexistent/librccl.so.1".to_string(),
            "/nonexistent/b.so".into(),
        ];
        let err = load(&names).unwrap_err();
        assert!(
            err.contains("/nonexistent/librccl.so.1") && err.contains("/nonexistent/b.so"),
            "{err}"
        );
        assert!(err.contains(LIB_PATH_VAR), "{err}");
    }
}
