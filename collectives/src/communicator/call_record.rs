//! What a call did: the algorithm that ran and how it reached the buffers. Kept per
//! communicator for the most recent call ([`super::Communicator::last_call`]), so that a log
//! (liboxccl_nccl.so's `OXCCL_NCCL_LOG=info`) and tests can say which path served a
//! caller's buffers instead of predicting it before the call.

use std::fmt;

use super::Communicator;
use crate::algorithms::{Algorithm, Collective};

/// How an algorithm reached the call's buffers on the peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferPath {
    /// Directly: buffers the caller registered ([`super::Communicator::register`] or a
    /// window).
    Registered,
    /// Directly: the allocations holding the caller's unregistered buffers, mapped by
    /// oxccl on first use ([`super::auto_register`]).
    Mapped,
    /// Through oxccl's own scratch (one-shot packets, staging), not the peers' buffers.
    Scratch,
}

/// The most recent call of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecord {
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub path: BufferPath,
}

impl fmt::Display for CallRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match self.path {
            BufferPath::Registered => "zero-copy on registered buffers",
            BufferPath::Mapped => "zero-copy on the callers' allocations",
            BufferPath::Scratch => "through oxccl's scratch",
        };
        write!(f, "{}, {path}", self.algorithm.name())
    }
}

impl Communicator {
    /// Keeps what a call that launched did: `path` when the algorithm reached the peers'
    /// buffers (`direct`), else through the scratch.
    pub(crate) fn note_call(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        path: BufferPath,
        direct: bool,
    ) {
        let path = if direct { path } else { BufferPath::Scratch };
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(CallRecord {
            collective,
            algorithm,
            path,
        });
    }

    /// What the most recent call on this communicator (from any thread) did: the
    /// algorithm that ran and whether it reached the caller's buffers directly. `None`
    /// before the first call that launched anything.
    pub fn last_call(&self) -> Option<CallRecord> {
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner())
    }
}
