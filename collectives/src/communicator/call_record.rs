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

/// Why a call went through oxccl's scratch instead of the caller's buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staged {
    /// The algorithm chosen for the call works through the scratch (a one-shot's
    /// packets, a staged kernel's rounds) whatever the buffers.
    Algorithm,
    /// Zero-copy on unregistered buffers is switched off (`OXCCL_AUTO_REGISTER=0`) or not
    /// built for this backend.
    AutoRegisterOff,
    /// The call's bytes per rank are below the floor of zero-copy on unregistered buffers
    /// (`OXCCL_AUTO_REGISTER_MIN_BYTES`): the exchange of buffer records would cost more
    /// than it saves. Checked first, so a one-shot size below it says this too.
    BelowFloor { floor: usize },
    /// This rank's buffer cannot be reached by the peers, and why (e.g. a range across
    /// two allocations: PyTorch's expandable segments map a large tensor in several).
    Unshareable(String),
    /// That rank's buffer cannot be reached by the peers (its own record says why).
    PeerUnshareable(u32),
    /// A rank failed to map a peer's allocation (this rank's error, when it was this one).
    MappingFailed(Option<String>),
}

impl fmt::Display for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Staged::Algorithm => write!(f, "the algorithm works through the scratch"),
            Staged::AutoRegisterOff => {
                write!(
                    f,
                    "zero-copy on unregistered buffers is off (OXCCL_AUTO_REGISTER=0, or the \
                     ROCm backend, where it is not built)"
                )
            }
            Staged::BelowFloor { floor } => {
                write!(f, "below the zero-copy floor of {floor} bytes per rank")
            }
            Staged::Unshareable(why) => write!(f, "this rank's buffer cannot be shared: {why}"),
            Staged::PeerUnshareable(r) => write!(f, "rank {r}'s buffer cannot be shared"),
            Staged::MappingFailed(None) => write!(f, "a rank failed to map a peer's allocation"),
            Staged::MappingFailed(Some(e)) => {
                write!(f, "mapping a peer's allocation failed here: {e}")
            }
        }
    }
}

/// The most recent call of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub path: BufferPath,
    /// Why the call went through the scratch ([`BufferPath::Scratch`] only).
    pub staged: Option<Staged>,
}

impl fmt::Display for CallRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match self.path {
            BufferPath::Registered => "zero-copy on registered buffers",
            BufferPath::Mapped => "zero-copy on the callers' allocations",
            BufferPath::Scratch => "through oxccl's scratch",
        };
        write!(f, "{}, {path}", self.algorithm.name())?;
        match &self.staged {
            Some(why) => write!(f, ": {why}"),
            None => Ok(()),
        }
    }
}

impl Communicator {
    /// Keeps what a call that launched did: `path` when the algorithm reached the peers'
    /// buffers (`direct`), else through the scratch, because of `refused` (why the peers'
    /// buffers were not reachable) or, when they were, because of the algorithm.
    pub(crate) fn note_call(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        path: BufferPath,
        direct: bool,
        refused: Option<Staged>,
    ) {
        let (path, staged) = if direct {
            (path, None)
        } else {
            (
                BufferPath::Scratch,
                Some(refused.unwrap_or(Staged::Algorithm)),
            )
        };
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(CallRecord {
            collective,
            algorithm,
            path,
            staged,
        });
    }

    /// What the most recent call on this communicator (from any thread) did: the
    /// algorithm that ran, whether it reached the caller's buffers directly, and if not,
    /// why. `None` before the first call that launched anything.
    pub fn last_call(&self) -> Option<CallRecord> {
        self.last_call
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
