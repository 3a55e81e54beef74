//! Finding and loading libamdhip64 at run time.
//!
//! [`Hip`] owns the loaded library and its function table ([`crate::sys::HipApi`]). The
//! process-wide instance ([`Hip::global`]) is what [`crate::RocmBackend`] uses; tests and
//! tools can load a specific file with [`Hip::load`] and open devices on it.

use std::ffi::OsStr;
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
            .finish()
    }
}

/// The names tried when [`LIBRARY_VAR`] is not set, in order.
fn default_candidates() -> Vec<String> {
    let mut names = vec![
        "libamdhip64.so".to_string(),
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
    /// path) and resolves every function oxccl uses.
    ///
    /// Fails with [`Error::RuntimeMissing`] when the file cannot be loaded or lacks a
    /// symbol, and with [`Error::Unsupported`] when the runtime's major version differs
    /// from the headers the bindings were generated from (ROCm 6 changed structure
    /// layouts and enum values; rebuild against the installed ROCm).
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
        // SAFETY: loading a shared library runs its initialisers; libamdhip64 (or the test
        // runtime) is a well-behaved C library. Every symbol is resolved with the
        // signature bindgen generated from the HIP headers.
        let api = unsafe { sys::HipApi::new(path) }.map_err(|e| {
            Error::RuntimeMissing(format!(
                "no ROCm runtime found (libamdhip64 could not be loaded): {}: {e}",
                path.to_string_lossy()
            ))
        })?;
        let path = path.to_string_lossy().into_owned();
        let version = crate::result::runtime_version(&api)?;
        let hip = Arc::new_cyclic(|weak| Hip {
            api,
            path,
            version,
            ipc: IpcCache::new(
                RocmIpcOpener { hip: weak.clone() },
                CachePolicy::Shared {
                    max_live: Some(max_ipc_imports),
                },
            ),
        });
        let major = hip.version / 10_000_000;
        if u32::try_from(major).ok() != Some(sys::HIP_VERSION_MAJOR) {
            return Err(Error::Unsupported(format!(
                "the HIP runtime {} is version {}.{}, but oxccl was built against HIP {}.{} \
                 headers; the two major versions differ in structure layouts and enum values, \
                 so rebuild with ROCM_PATH pointing at the installed ROCm",
                hip.path,
                major,
                (hip.version / 100_000) % 100,
                sys::HIP_VERSION_MAJOR,
                sys::HIP_VERSION_MINOR
            )));
        }
        tracing::debug!(path = %hip.path, version = hip.version, "HIP runtime loaded");
        Ok(hip)
    }

    /// The process-wide runtime: the file named by `OXCCL_HIP_LIBRARY` if set, else the
    /// first of `libamdhip64.so`, `.so.6`, `.so.5`, `$ROCM_PATH/lib/libamdhip64.so` that
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
}
