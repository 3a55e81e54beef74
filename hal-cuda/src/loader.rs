//! Finding and initializing the CUDA driver at run time.
//!
//! cudarc's `dynamic-loading` resolves `libcuda` lazily and panics when it is absent. Before
//! the first cudarc call this module probes the same library names cudarc searches, with
//! `libloading`, and checks that the library exports `cuInit`; a machine without a driver gets
//! [`Error::RuntimeMissing`] instead of a panic. The first cudarc call (`cuInit`) also runs
//! under `catch_unwind` as a backstop, in case cudarc resolves a different library than the
//! probe did.

use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::sys;
use oxccl_hal::{Error, Result};

use crate::result;

/// The library name users know; named in the error.
const PRIMARY_NAME: &str = "libcuda.so.1";

/// What the first initialization found; kept for the life of the process.
enum Init {
    /// The driver is loaded and `cuInit` succeeded.
    Ready,
    /// The driver is loaded but reports no device (`CUDA_ERROR_NO_DEVICE`).
    NoDevice,
    /// The driver library could not be loaded (message for [`Error::RuntimeMissing`]).
    Missing(String),
    /// `cuInit` returned an error other than "no device" (always an [`Error::Backend`]).
    Failed(Error),
}

static PROBED: OnceLock<std::result::Result<libloading::Library, String>> = OnceLock::new();
static INIT: OnceLock<Init> = OnceLock::new();

/// The library names to try, in cudarc's order (so the probe finds what cudarc will load).
fn candidates() -> Vec<String> {
    let mut names = cudarc::get_lib_name_candidates("cuda");
    names.extend(cudarc::get_lib_name_candidates("nvcuda"));
    names
}

/// Loads the first of `names` that exists and exports `cuInit`.
///
/// Returns [`Error::RuntimeMissing`] naming `libcuda.so.1` (and why it could not be used)
/// when none does.
pub(crate) fn probe(names: &[String]) -> Result<libloading::Library> {
    let mut primary_error = None;
    let mut last_error = None;
    for name in names {
        // SAFETY: loading the CUDA driver runs its initializers; that is exactly what cudarc
        // does on its first call, and the library is kept loaded for the process lifetime.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                // SAFETY: only the symbol's presence is checked; it is never called here.
                let has_init =
                    unsafe { lib.get::<unsafe extern "C" fn(u32) -> i32>(b"cuInit\0") }.is_ok();
                if has_init {
                    return Ok(lib);
                }
                last_error = Some(format!("{name} loaded but does not export cuInit"));
            }
            Err(e) => {
                let text = error_chain(&e);
                if name == PRIMARY_NAME {
                    primary_error = Some(text.clone());
                }
                last_error = Some(text);
            }
        }
    }
    let why = primary_error
        .or(last_error)
        .unwrap_or_else(|| "no candidate library names".to_string());
    Err(Error::RuntimeMissing(format!(
        "no CUDA driver found ({PRIMARY_NAME} could not be loaded): {why}; tried {} names",
        names.len()
    )))
}

/// An error and its sources, joined ("dlopen failed: libcuda.so.1: cannot open ...").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn probed() -> std::result::Result<&'static libloading::Library, String> {
    match PROBED.get_or_init(|| probe(&candidates()).map_err(|e| e.to_string())) {
        Ok(lib) => Ok(lib),
        Err(msg) => Err(msg.clone()),
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

fn first_init() -> Init {
    let _span = tracing::info_span!("cuda.init").entered();
    if let Err(msg) = probed() {
        return Init::Missing(msg);
    }
    match panic::catch_unwind(AssertUnwindSafe(result::init)) {
        Ok(Ok(())) => Init::Ready,
        Ok(Err(e)) if result::is_code(&e, sys::CUresult::CUDA_ERROR_NO_DEVICE) => Init::NoDevice,
        Ok(Err(e)) => Init::Failed(e),
        Err(payload) => Init::Missing(format!(
            "no CUDA driver found ({PRIMARY_NAME} could not be loaded by cudarc): {}",
            panic_text(payload.as_ref())
        )),
    }
}

/// Initializes the driver once. `Ok(true)` when devices may be present, `Ok(false)` when the
/// driver reports none.
pub(crate) fn init() -> Result<bool> {
    match INIT.get_or_init(first_init) {
        Init::Ready => Ok(true),
        Init::NoDevice => Ok(false),
        Init::Missing(msg) => Err(Error::RuntimeMissing(msg.clone())),
        Init::Failed(e) => Err(replay(e)),
    }
}

/// A copy of the remembered `cuInit` failure for each caller ([`Error`] is not `Clone`).
fn replay(e: &Error) -> Error {
    match e {
        Error::Backend {
            backend,
            call,
            code,
            name,
            message,
        } => Error::Backend {
            backend: *backend,
            call,
            code: *code,
            name: name.clone(),
            message: message.clone(),
        },
        // `result::init` only makes `Backend` errors; anything else keeps its text.
        other => Error::RuntimeMissing(other.to_string()),
    }
}

/// Whether the driver library has been loaded (without trying to load it).
pub(crate) fn driver_loaded() -> bool {
    matches!(
        INIT.get(),
        Some(Init::Ready | Init::NoDevice | Init::Failed(_))
    )
}

/// Whether the loaded driver exports `symbol`. cudarc panics when a missing symbol is
/// called, so calls that need a recent driver check this first.
pub(crate) fn has_symbol(symbol: &str) -> bool {
    let Ok(lib) = probed() else {
        return false;
    };
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: only the symbol's presence is checked; it is never called through this handle.
    unsafe { lib.get::<unsafe extern "C" fn()>(name.as_slice()) }.is_ok()
}

/// The driver's entry point `symbol` as a function pointer, or `None` when the driver does
/// not export it. For entry points newer than the CUDA version cudarc's bindings are built
/// for (CUDA 13.0): those bindings do not declare them at all.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type with the C signature the driver gives
/// `symbol`.
pub(crate) unsafe fn driver_fn<F: Copy>(symbol: &str) -> Option<F> {
    let lib = probed().ok()?;
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: the caller guarantees `F` is the symbol's signature; the library stays loaded
    // for the life of the process (`PROBED` is never dropped), so the pointer never dangles.
    unsafe { lib.get::<F>(name.as_slice()) }.ok().map(|s| *s)
}

/// Fails with [`Error::Unsupported`] when the driver lacks `symbol`.
pub(crate) fn require_symbol(symbol: &'static str) -> Result<()> {
    if has_symbol(symbol) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "the installed CUDA driver does not export {symbol}; a newer driver is needed"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_runtime_missing_naming_libcuda() {
        let names = vec![
            "liboxccl-no-such-library.so".to_string(),
            PRIMARY_NAME.replace("cuda", "cuda-oxccl-absent"),
        ];
        let err = probe(&names).err();
        match err {
            Some(Error::RuntimeMissing(msg)) => {
                assert!(msg.starts_with("no CUDA driver found (libcuda.so.1 could not be loaded)"));
                assert!(msg.contains("tried 2 names"), "{msg}");
            }
            other => panic!("expected RuntimeMissing, got {other:?}"),
        }
    }

    #[test]
    fn library_without_cuinit_is_not_accepted() {
        // libc is always loadable and has no cuInit.
        let err = probe(&["libc.so.6".to_string()]).err();
        match err {
            Some(Error::RuntimeMissing(msg)) => assert!(msg.contains("cuInit"), "{msg}"),
            other => panic!("expected RuntimeMissing, got {other:?}"),
        }
    }

    #[test]
    fn replayed_failure_keeps_the_drivers_code_and_text() {
        let first = result::error("cuInit", sys::CUresult::CUDA_ERROR_INVALID_DEVICE);
        let again = replay(&first);
        assert_eq!(again.to_string(), first.to_string());
        assert!(result::is_code(
            &again,
            sys::CUresult::CUDA_ERROR_INVALID_DEVICE
        ));
    }

    #[test]
    fn driver_fn_finds_exported_entry_points_only() {
        type NoArgs = unsafe extern "C" fn() -> i32;
        // SAFETY: the pointers are never called; the type only has to be a fn pointer.
        let (init, absent) = unsafe {
            (
                driver_fn::<NoArgs>("cuInit"),
                driver_fn::<NoArgs>("cuOxcclNoSuchEntryPoint"),
            )
        };
        assert!(absent.is_none());
        // Without a driver nothing is found; with one, cuInit always is.
        assert_eq!(init.is_some(), probed().is_ok());
    }

    #[test]
    fn candidates_include_the_soname() {
        assert!(candidates().iter().any(|n| n == PRIMARY_NAME));
    }
}
