//! The opaque unique id a program hands to its other processes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use oxccl_hal::{Error, Result};

/// Size of a serialized id: the same as NCCL's `ncclUniqueId`, so the NCCL-API layer can
/// carry one inside its own id.
pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: u64 = u64::from_le_bytes(*b"OXCCLBS1");

/// Where the root listens, plus a random nonce that keeps two jobs on one address apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    /// The root's rendezvous address.
    pub root: SocketAddr,
    /// Random per job; every connection presents it.
    pub nonce: u64,
}

impl UniqueId {
    /// Serializes to [`UNIQUE_ID_BYTES`] bytes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut out = [0u8; UNIQUE_ID_BYTES];
        out[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        out[16..18].copy_from_slice(&self.root.port().to_le_bytes());
        match self.root.ip() {
            IpAddr::V4(v4) => {
                out[18] = 4;
                out[19..23].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out[18] = 6;
                out[19..35].copy_from_slice(&v6.octets());
            }
        }
        out
    }

    /// Parses bytes made by [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        if bytes.len() != UNIQUE_ID_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(a)
        };
        if u64_at(0) != MAGIC {
            return Err(Error::InvalidArgument(
                "not an oxccl unique id (bad magic)".into(),
            ));
        }
        let port = u16::from_le_bytes([bytes[16], bytes[17]]);
        let ip = match bytes[18] {
            4 => IpAddr::V4(Ipv4Addr::new(bytes[19], bytes[20], bytes[21], bytes[22])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&bytes[19..35]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unique id has unknown address family {other}"
                )))
            }
        };
        Ok(UniqueId {
            root: SocketAddr::new(ip, port),
            nonce: u64_at(8),
        })
    }
}

/// A random 64-bit number from the OS.
pub(crate) fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut buf).is_ok() {
            return u64::from_le_bytes(buf);
        }
    }
    // No /dev/urandom: time and pid still separate concurrent jobs in practice.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6_and_rejects_garbage() {
        for root in ["127.0.0.1:29500", "[::1]:1234"] {
            let id = UniqueId {
                root: root.parse().unwrap(),
                nonce: random_u64(),
            };
            assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        }
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
    }
}
