//! Finding and loading libamdhip64 at run time.
//!
//! [`Hip`] owns the loaded library and its function table ([`crate::sys::HipApi`]). The
//! process-wide instance ([`Hip::global`]) is what [`crate::RocmBackend`] uses; tests and
//! tools can load a specific file with [`Hip::load`] and open devices on it.

use std::ffi::{c_int, OsStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

use oxccl_hal::{CachePolicy, Error, IpcCache, Result};

use crate::memory::RocmIpcOpener;
use crate::sys;

/// Environment variable naming the HIP runtime library to load instead of searching.
pub const LIBRARY_VAR: &str = "OXCCL_HIP_LIBRARY";

/// Environment variable bounding the number of distinct IPC handles open at once.
pub const MAX_IPC_IMPORTS_VAR: &str = "OXCCL_ROCM_MAX_IPC_IMPORTS";

/// The bound on open IPC handles when [`MAX_IPC_IMPORTS_VAR`] is not set. The runtime
/// keeps a mapping (and KFD resources) per open handle; a collective needs a few per
/// peer and buffer, so this leaves ample room while turning a leak into an error.
pub const DEFAULT_MAX_IPC_IMPORTS: usize = 1024;

fn max_ipc_imports_from_env() -> usize {
    std::env::var(MAX_IPC_IMPORTS_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_IPC_IMPORTS)
}

/// A loaded HIP runtime.
pub struct Hip {
    pub(crate) api: sys::HipApi,
    /// The numbering of the runtime's ABI generation, chosen from its version.
    pub(crate) abi: &'static sys::Abi,
    path: String,
    version: i32,
    /// Every import of this runtime goes through this one cache, whichever device asks:
    /// opening a handle that is already open in the process fails (or leaks) on ROCm.
    ipc: IpcCache<RocmIpcOpener>,
}

impl fmt::Debug for Hip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hip")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("generation", &self.abi.major)
            .finish()
    }
}

/// The names tried when [`LIBRARY_VAR`] is not set, in order.
fn default_candidates() -> Vec<String> {
    let mut names = vec![
        "libamdhip64.so".to_string(),
        "libamdhip64.so.7".to_string(),
        "libamdhip64.so.6".to_string(),
        "libamdhip64.so.5".to_string(),
    ];
    // ROCm does not always put its lib directory on the loader path.
    let rocm = std::env::var("ROCM_PATH").unwrap_or_else(|_| "/opt/rocm".to_string());
    names.push(format!("{rocm}/lib/libamdhip64.so"));
    names
}

static GLOBAL: OnceLock<std::result::Result<Arc<Hip>, String>> = OnceLock::new();

impl Hip {
    /// Loads the HIP runtime from `path` (a file name searched by the dynamic loader, or a
    /// path), picks the ABI generation its `hipRuntimeGetVersion` reports, and resolves
    /// every function oxccl uses.
    ///
    /// Fails with [`Error::RuntimeMissing`] when the file cannot be loaded or lacks a
    /// symbol, and with [`Error::Unsupported`] when the runtime's major version is not one
    /// of [`sys::SUPPORTED_MAJORS`] (the message names the version found and the supported
    /// ones).
    ///
    /// The IPC cache bound comes from `OXCCL_ROCM_MAX_IPC_IMPORTS` (default
    /// [`DEFAULT_MAX_IPC_IMPORTS`]).
    pub fn load(path: impl AsRef<OsStr>) -> Result<Arc<Hip>> {
        Hip::load_with_import_limit(path, max_ipc_imports_from_env())
    }

    /// [`Hip::load`] with an explicit bound on open IPC handles.
    pub fn load_with_import_limit(
        path: impl AsRef<OsStr>,
        max_ipc_imports: usize,
    ) -> Result<Arc<Hip>> {
        let path = path.as_ref();
        let missing = |e: libloading::Error| {
            Error::RuntimeMissing(format!(
                "no ROCm runtime found (libamdhip64 could not be loaded): {}: {e}",
                path.to_string_lossy()
            ))
        };
        // SAFETY: loading a shared library runs its initialisers; libamdhip64 (or the test
        // runtime) is a well-behaved C library.
        let lib = unsafe { libloading::Library::new(path) }.map_err(missing)?;
        // The version comes first, through the one symbol every HIP release has with the
        // same signature, so a runtime of another generation is named as such even when
        // it lacks a symbol the bindings need.
        let (rc, version) = {
            // SAFETY: `hipError_t hipRuntimeGetVersion(int*)` in every HIP release.
            let get = unsafe {
                lib.get::<unsafe extern "C" fn(*mut c_int) -> sys::hipError_t>(
                    b"hipRuntimeGetVersion\0",
                )
            }
            .map_err(missing)?;
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-pointer.
            let rc = unsafe { get(&mut v) };
            (rc, v)
        };
        let path = path.to_string_lossy().into_owned();
        let abi = if rc.0 == 0 {
            Some(sys::Abi::for_version(version).ok_or_else(|| {
                Error::Unsupported(format!(
                    "the HIP runtime {path} is version {} (HIP {}.x); oxccl supports the HIP ABI \
                     generations {} (bindings from the HIP {} headers)",
                    version_text(version),
                    version / 10_000_000,
                    sys::SUPPORTED_MAJORS
                        .iter()
                        .map(|m| format!("{m}.x"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    sys::Abi::all().map(|a| a.headers).join(", ")
                ))
            })?)
        } else {
            None
        };
        // Name the first function the library lacks (the table's own error does not).
        for name in sys::FUNCTIONS {
            // SAFETY: only looks the symbol up; the pointer is not used.
            if let Err(e) = unsafe { lib.get::<*const ()>(name.as_bytes()) } {
                return Err(Error::RuntimeMissing(format!(
                    "no ROCm runtime found (libamdhip64 could not be loaded): {path} lacks \
                     {name}: {e}"
                )));
            }
        }
        // SAFETY: every symbol is resolved with the signature bindgen generated from the
        // HIP headers, identical in every supported generation (see `sys`).
        let api = unsafe { sys::HipApi::from_library(lib) }.map_err(|e| {
            Error::RuntimeMissing(format!(
                "no ROCm runtime found (libamdhip64 could not be loaded): {path}: {e}"
            ))
        })?;
        let Some(abi) = abi else {
            return Err(crate::result::error_from(&api, "hipRuntimeGetVersion", rc));
        };
        let hip = Arc::new_cyclic(|weak| Hip {
            api,
            abi,
            path,
            version,
            ipc: IpcCache::new(
                RocmIpcOpener { hip: weak.clone() },
                CachePolicy::Shared {
                    max_live: Some(max_ipc_imports),
                },
            ),
        });
        tracing::debug!(
            path = %hip.path,
            version = hip.version,
            generation = abi.major,
            "HIP runtime loaded"
        );
        Ok(hip)
    }

    /// The process-wide runtime: the file named by `OXCCL_HIP_LIBRARY` if set, else the
    /// first of `libamdhip64.so`, `.so.7`, `.so.6`, `.so.5`, `$ROCM_PATH/lib/libamdhip64.so` that
    /// loads. Loaded once; a failure is remembered and reported on every call.
    pub fn global() -> Result<Arc<Hip>> {
        let slot = GLOBAL.get_or_init(|| {
            let candidates = match std::env::var_os(LIBRARY_VAR) {
                Some(p) => vec![p.to_string_lossy().into_owned()],
                None => default_candidates(),
            };
            let mut failures = Vec::new();
            for c in &candidates {
                match Hip::load(c) {
                    Ok(hip) => return Ok(hip),
                    // A runtime that loads but cannot be used is the answer, not a miss.
                    Err(Error::RuntimeMissing(m)) => failures.push(m),
                    Err(other) => return Err(other.to_string()),
                }
            }
            Err(format!(
                "no ROCm runtime found (libamdhip64 could not be loaded): tried {}; {}",
                candidates.join(", "),
                failures.last().map(String::as_str).unwrap_or("")
            ))
        });
        match slot {
            Ok(hip) => Ok(Arc::clone(hip)),
            Err(m) if m.starts_with("no ROCm runtime found") => {
                Err(Error::RuntimeMissing(m.clone()))
            }
            Err(m) => Err(Error::Unsupported(m.clone())),
        }
    }

    /// The file this runtime was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The IPC handle cache shared by every device of this runtime.
    pub fn ipc_cache(&self) -> &IpcCache<RocmIpcOpener> {
        &self.ipc
    }

    /// `hipRuntimeGetVersion`: major * 10,000,000 + minor * 100,000 + patch.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The numbering of this runtime's HIP ABI generation.
    pub fn abi(&self) -> &'static sys::Abi {
        self.abi
    }
}

/// "major.minor.patch" of a `hipRuntimeGetVersion` number.
fn version_text(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}
