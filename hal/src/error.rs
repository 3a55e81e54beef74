//! The one error type of oxccl's lower layers.
//!
//! A backend failure carries the call that failed, the backend's numeric code and its name;
//! layers that know the rank attach it with [`Error::at_rank`].

use std::time::Duration;

use crate::types::BackendKind;

/// Result alias used throughout the HAL.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the collectives.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver or runtime call returned an error code.
    #[error("{backend} call {call} failed with {name} ({code}): {message}")]
    Backend {
        /// Which backend made the call.
        backend: BackendKind,
        /// The API function, e.g. `cuMemCreate`.
        call: &'static str,
        /// The backend's numeric error code.
        code: i64,
        /// The backend's name for that code, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// The backend's description of that code.
        message: String,
    },
    /// The GPU runtime library or driver is not installed on this machine.
    #[error("{0}")]
    RuntimeMissing(String),
    /// An operating-system call failed.
    #[error("system call {call} failed: {source}")]
    Os {
        /// The call, e.g. `memfd_create`.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The caller passed something the API does not accept (size, alignment, pointer).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The request is valid but this backend, device or build cannot serve it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An IPC handle could not be used: foreign, malformed, stale, or its owner is gone.
    #[error("IPC handle rejected: {0}")]
    Ipc(String),
    /// The IPC handle cache is at its bound of live imports.
    #[error("IPC handle cache is full: {live} live imports, limit {limit}")]
    IpcCacheFull {
        /// Imports open now.
        live: usize,
        /// The configured bound.
        limit: usize,
    },
    /// Multicast was asked for while the safety gate is closed.
    #[error("multicast refused: {0}")]
    MulticastGated(String),
    /// A wait did not finish in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was waited for (names the ranks where known).
        what: String,
        /// How long.
        waited: Duration,
    },
    /// A peer process or rank went away.
    #[error("peer lost: {0}")]
    PeerLost(String),
    /// The communicator was aborted (NCCL's `ncclCommAbort`): a wait that was under way
    /// ended early, and every later call on it is refused.
    #[error("aborted: {0}")]
    Aborted(String),
    /// The operation is not allowed while the stream is being captured into a graph.
    #[error("{0} is not allowed while the stream is capturing a graph")]
    Capturing(&'static str),
    /// An error that happened on a known rank.
    #[error("rank {rank}: {source}")]
    AtRank {
        /// The rank that saw the error.
        rank: u32,
        /// The error itself.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The same error, tagged with the rank that saw it (idempotent).
    pub fn at_rank(self, rank: u32) -> Error {
        match self {
            e @ Error::AtRank { .. } => e,
            other => Error::AtRank {
                rank,
                source: Box::new(other),
            },
        }
    }

    /// The error beneath any rank tag.
    pub fn root(&self) -> &Error {
        match self {
            Error::AtRank { source, .. } => source.root(),
            other => other,
        }
    }

    /// An [`Error::Os`] from the last OS error.
    pub fn last_os(call: &'static str) -> Error {
        Error::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// An [`Error::Os`] from a `nix` errno.
    pub fn errno(call: &'static str, errno: nix::errno::Errno) -> Error {
        Error::Os {
            call,
            source: std::io::Error::from_raw_os_error(errno as i32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_error_names_call_code_and_rank() {
        let e = Error::Backend {
            backend: BackendKind::Cuda,
            call: "cuMemCreate",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            message: "invalid argument".into(),
        }
        .at_rank(3)
        .at_rank(5);
        let text = e.to_string();
        assert!(
            text.starts_with("rank 3: CUDA call cuMemCreate failed"),
            "{text}"
        );
        assert!(text.contains("CUDA_ERROR_INVALID_VALUE (1)"), "{text}");
        assert!(matches!(e.root(), Error::Backend { code: 1, .. }));
    }
}
