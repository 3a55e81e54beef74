//! IPC handles: what one process sends another so that it can map the sender's memory.
//!
//! A handle is plain bytes (it travels through the bootstrap). Kinds that need a file
//! descriptor (memfd, VMM POSIX-FD) do not carry it: the importer fetches it from the
//! owner's descriptor server ([`crate::fd_share`]), named by `owner_pid` and `owner_nonce`.

use std::fmt;

use crate::error::{Error, Result};
use crate::types::BackendKind;

/// What kind of object a handle refers to and how it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpcHandleKind {
    /// Host backend memory: a memfd mapping.
    HostMemfd = 1,
    /// Host backend multicast emulation: the list of member handles.
    HostMulticast = 2,
    /// CUDA legacy IPC handle (`cuIpcGetMemHandle`), 64 bytes in the payload.
    CudaLegacy = 3,
    /// CUDA VMM allocation exported as a POSIX file descriptor.
    CudaPosixFd = 4,
    /// CUDA multicast object exported as a POSIX file descriptor.
    CudaMulticastFd = 5,
    /// HIP legacy IPC handle (`hipIpcGetMemHandle`), 64 bytes in the payload.
    RocmLegacy = 6,
    /// HIP VMM allocation exported as a POSIX file descriptor.
    RocmPosixFd = 7,
}

impl IpcHandleKind {
    const ALL: [IpcHandleKind; 7] = [
        IpcHandleKind::HostMemfd,
        IpcHandleKind::HostMulticast,
        IpcHandleKind::CudaLegacy,
        IpcHandleKind::CudaPosixFd,
        IpcHandleKind::CudaMulticastFd,
        IpcHandleKind::RocmLegacy,
        IpcHandleKind::RocmPosixFd,
    ];

    /// Whether the importer must fetch a file descriptor from the owner.
    pub const fn needs_fd(self) -> bool {
        matches!(
            self,
            IpcHandleKind::HostMemfd
                | IpcHandleKind::CudaPosixFd
                | IpcHandleKind::CudaMulticastFd
                | IpcHandleKind::RocmPosixFd
        )
    }

    fn from_u8(v: u8) -> Option<Self> {
        IpcHandleKind::ALL.into_iter().find(|k| *k as u8 == v)
    }
}

/// A serializable reference to memory (or a multicast object) owned by another process.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IpcHandle {
    /// Backend that exported it; importing into another backend is an error.
    pub backend: BackendKind,
    /// How to open it.
    pub kind: IpcHandleKind,
    /// Process id of the exporter.
    pub owner_pid: u32,
    /// Random number fixed per exporting process: tells a reused pid apart and names the
    /// owner's descriptor server.
    pub owner_nonce: u64,
    /// Export number, unique within the owner.
    pub id: u64,
    /// Length in bytes as allocated by the owner (not rounded).
    pub len: u64,
    /// Backend-specific bytes (a legacy IPC handle, member list of a multicast emulation).
    pub payload: Vec<u8>,
}

/// Identity of a handle: two handles with the same key refer to the same export.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpcKey {
    backend: BackendKind,
    kind: IpcHandleKind,
    owner_pid: u32,
    owner_nonce: u64,
    id: u64,
    payload: Vec<u8>,
}

const MAGIC: &[u8; 6] = b"OXIPC\0";
const VERSION: u8 = 1;
const HEADER_LEN: usize = MAGIC.len() + 1 + 1 + 1 + 4 + 8 + 8 + 8 + 4;
/// Upper bound on the payload, so a corrupt length cannot make us allocate gigabytes.
const MAX_PAYLOAD: usize = 1 << 20;

impl IpcHandle {
    /// The handle's identity, used as the IPC cache key.
    pub fn key(&self) -> IpcKey {
        IpcKey {
            backend: self.backend,
            kind: self.kind,
            owner_pid: self.owner_pid,
            owner_nonce: self.owner_nonce,
            id: self.id,
            payload: self.payload.clone(),
        }
    }

    /// Serializes the handle for the bootstrap.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.backend.tag());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.owner_pid.to_le_bytes());
        out.extend_from_slice(&self.owner_nonce.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        // The payload is bounded by MAX_PAYLOAD when built by a backend; saturate defensively.
        let plen = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&plen.to_le_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses bytes made by [`IpcHandle::to_bytes`]; anything else is an [`Error::Ipc`].
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcHandle> {
        if bytes.len() < HEADER_LEN || &bytes[..MAGIC.len()] != MAGIC {
            return Err(Error::Ipc(
                "not an oxccl IPC handle (bad magic or too short)".into(),
            ));
        }
        let mut at = MAGIC.len();
        let mut take = |n: usize| -> &[u8] {
            let s = &bytes[at..at + n];
            at += n;
            s
        };
        let version = take(1)[0];
        if version != VERSION {
            return Err(Error::Ipc(format!(
                "IPC handle version {version}, this build reads version {VERSION}"
            )));
        }
        let backend = BackendKind::from_tag(take(1)[0])
            .ok_or_else(|| Error::Ipc("unknown backend tag in IPC handle".into()))?;
        let kind = IpcHandleKind::from_u8(take(1)[0])
            .ok_or_else(|| Error::Ipc("unknown handle kind in IPC handle".into()))?;
        let u32_at = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let u64_at = |s: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_le_bytes(a)
        };
        let owner_pid = u32_at(take(4));
        let owner_nonce = u64_at(take(8));
        let id = u64_at(take(8));
        let len = u64_at(take(8));
        let plen = u32_at(take(4)) as usize;
        if plen > MAX_PAYLOAD || bytes.len() != HEADER_LEN + plen {
            return Err(Error::Ipc(format!(
                "IPC handle payload length {plen} does not match the {} bytes received",
                bytes.len()
            )));
        }
        Ok(IpcHandle {
            backend,
            kind,
            owner_pid,
            owner_nonce,
            id,
            len,
            payload: bytes[HEADER_LEN..].to_vec(),
        })
    }

    /// Checks that this handle was made by `backend`, naming both when it was not.
    pub fn expect_backend(&self, backend: BackendKind) -> Result<()> {
        if self.backend == backend {
            Ok(())
        } else {
            Err(Error::Ipc(format!(
                "handle was exported by the {} backend, cannot import it into {backend}",
                self.backend
            )))
        }
    }
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("backend", &self.backend)
            .field("kind", &self.kind)
            .field("owner_pid", &self.owner_pid)
            .field("id", &self.id)
            .field("len", &self.len)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcHandle {
        IpcHandle {
            backend: BackendKind::Cuda,
            kind: IpcHandleKind::CudaLegacy,
            owner_pid: 4242,
            owner_nonce: 0xdead_beef_1234,
            id: 7,
            len: 12345,
            payload: (0..64).collect(),
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let h = sample();
        let back = IpcHandle::from_bytes(&h.to_bytes()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.key(), h.key());
    }

    #[test]
    fn foreign_truncated_and_padded_bytes_are_rejected() {
        assert!(matches!(
            IpcHandle::from_bytes(b"hello"),
            Err(Error::Ipc(_))
        ));
        let bytes = sample().to_bytes();
        let mut wrong_magic = bytes.clone();
        wrong_magic[0] = b'X';
        assert!(IpcHandle::from_bytes(&wrong_magic).is_err());
        assert!(IpcHandle::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(IpcHandle::from_bytes(&padded).is_err());
        let mut bad_kind = bytes;
        bad_kind[8] = 99;
        assert!(IpcHandle::from_bytes(&bad_kind).is_err());
    }

    #[test]
    fn wrong_backend_is_named() {
        let err = sample().expect_backend(BackendKind::Rocm).unwrap_err();
        assert!(err.to_string().contains("CUDA backend"), "{err}");
    }
}
