//! Result codes, the last-error string, and the guard every exported function runs in.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use oxccl_collectives::hal::Error;

use crate::types::*;

/// A failure of one API call: the NCCL code it returns and the message
/// `ncclGetLastError` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The `ncclResult_t` returned.
    pub code: NcclResult,
    /// What went wrong, in words.
    pub message: String,
}

/// Result of an API call's body.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// `ncclInvalidArgument` with a message.
    pub fn invalid_argument(message: impl Into<String>) -> ApiError {
        ApiError {
            code: NCCL_INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    /// `ncclInvalidUsage` with a message.
    pub fn invalid_usage(message: impl Into<String>) -> ApiError {
        ApiError {
            code: NCCL_INVALID_USAGE,
            message: message.into(),
        }
    }

    /// `ncclInternalError` with a message.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            code: NCCL_INTERNAL_ERROR,
            message: message.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let mut inner = &e;
        while let Error::AtRank { source, .. } = inner {
            inner = source;
        }
        let code = match inner {
            Error::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
            Error::Unsupported(_) | Error::Capturing(_) | Error::MulticastGated(_) => {
                NCCL_INVALID_USAGE
            }
            Error::Backend { .. } | Error::RuntimeMissing(_) => NCCL_UNHANDLED_CUDA_ERROR,
            Error::Os { .. } => NCCL_SYSTEM_ERROR,
            Error::Timeout { .. } | Error::PeerLost(_) => NCCL_REMOTE_ERROR,
            // A call cut short, or refused, because the caller aborted the communicator.
            Error::Aborted(_) => NCCL_INVALID_USAGE,
            _ => NCCL_INTERNAL_ERROR,
        };
        ApiError {
            code,
            message: format!("oxccl: {e}"),
        }
    }
}

/// NCCL's static description of a result code.
pub fn error_string(code: NcclResult) -> &'static std::ffi::CStr {
    match code {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (NUL bytes become spaces).
pub fn set_last_error(message: &str) {
    let clean = message.replace('\0', " ");
    let c = CString::new(clean).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error; valid until the thread's next failing call.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Whether `OXCCL_NCCL_LOG=info` (or `debug`) is set; read once.
pub fn log_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        matches!(
            std::env::var("OXCCL_NCCL_LOG")
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str(),
            "info" | "debug" | "trace" | "1"
        )
    })
}

/// Writes one log line to stderr when logging is on, in one `write` (stderr is unbuffered:
/// a formatted `eprintln!` goes out piece by piece, and ranks sharing a pipe interleave).
macro_rules! log_info {
    ($($arg:tt)*) => {
        if $crate::error::log_enabled() {
            $crate::error::write_log_line(&format!("oxccl-nccl: {}\n", format_args!($($arg)*)));
        }
    };
}

/// One log line to stderr in a single write (atomic on pipes below `PIPE_BUF`).
pub fn write_log_line(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
pub(crate) use log_info;

/// Runs an exported function's body: a panic becomes `ncclInternalError`, an error sets the
/// last-error string (prefixed with the function's name) and returns its code.
pub fn guard(name: &'static str, body: impl FnOnce() -> ApiResult<()>) -> NcclResult {
    guard_code(name, || body().map(|()| NCCL_SUCCESS))
}

/// Like [`guard`] for a body that chooses its success code (`ncclInProgress` for an
/// operation that goes on after the call).
pub fn guard_code(name: &'static str, body: impl FnOnce() -> ApiResult<NcclResult>) -> NcclResult {
    match crate::profile::timed(name, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let message = format!("{name}: {}", e.message);
            log_info!("error {}: {message}", e.code);
            set_last_error(&message);
            e.code
        }
        Err(_) => {
            let message = format!("{name}: internal error (a panic was caught in oxccl)");
            log_info!("{message}");
            set_last_error(&message);
            NCCL_INTERNAL_ERROR
        }
    }
}

/// Like [`guard`] for functions that return a value rather than a result code.
pub fn guard_value<T>(name: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    match crate::profile::timed(name, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(v) => v,
        Err(_) => {
            set_last_error(&format!(
                "{name}: internal error (a panic was caught in oxccl)"
            ));
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_sets_the_last_error_and_catches_panics() {
        let r = guard("ncclTest", || Err(ApiError::invalid_argument("bad thing")));
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        // SAFETY: the pointer is this thread's live last-error string.
        let s = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(s.to_str().unwrap(), "ncclTest: bad thing");
        #[allow(clippy::panic)]
        let r = guard("ncclBoom", || panic!("boom"));
        assert_eq!(r, NCCL_INTERNAL_ERROR);
    }

    #[test]
    fn every_code_has_a_string() {
        for c in 0..=NCCL_NUM_RESULTS {
            assert!(!error_string(c).to_bytes().is_empty());
        }
    }
}
