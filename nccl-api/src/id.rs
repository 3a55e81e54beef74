//! The 128-byte `ncclUniqueId` of this library: one oxccl bootstrap id and, when a real
//! NCCL is loaded, the real NCCL's id, side by side.
//!
//! | bytes    | content                                                          |
//! |----------|------------------------------------------------------------------|
//! | 0..4     | magic `OXNI`                                                     |
//! | 4        | format version (1)                                               |
//! | 5        | flags: bit 0 = a real NCCL id is present                         |
//! | 6..8     | zero                                                             |
//! | 8..48    | the oxccl bootstrap id (`UniqueId::to_bytes`, which uses 35 bytes) |
//! | 48..128  | the real NCCL id's first 80 bytes (NCCL 2.28 uses 36: magic + socket address) |
//!
//! Packing refuses ids whose bytes beyond those windows are not zero, so a future NCCL or
//! oxccl with a longer id fails with a clear error instead of a truncated id.

use oxccl_collectives::channels::bootstrap::UniqueId;

use crate::error::{ApiError, ApiResult};
use crate::types::NCCL_UNIQUE_ID_BYTES;

const MAGIC: [u8; 4] = *b"OXNI";
const VERSION: u8 = 1;
const FLAG_REAL: u8 = 1;
const OXCCL_AT: usize = 8;
const OXCCL_LEN: usize = 40;
const REAL_AT: usize = OXCCL_AT + OXCCL_LEN;
const REAL_LEN: usize = NCCL_UNIQUE_ID_BYTES - REAL_AT;

/// What an id carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedId {
    /// The oxccl bootstrap id.
    pub oxccl: UniqueId,
    /// The real NCCL's id, when one was made.
    pub real: Option<[u8; NCCL_UNIQUE_ID_BYTES]>,
}

/// Packs both ids into one `ncclUniqueId`'s bytes.
pub fn pack(id: &PackedId) -> ApiResult<[u8; NCCL_UNIQUE_ID_BYTES]> {
    let mut out = [0u8; NCCL_UNIQUE_ID_BYTES];
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    let ox = id.oxccl.to_bytes();
    if ox[OXCCL_LEN..].iter().any(|&b| b != 0) {
        return Err(ApiError::internal(
            "the oxccl bootstrap id uses more than 40 bytes: it does not fit beside the real \
             NCCL id",
        ));
    }
    out[OXCCL_AT..REAL_AT].copy_from_slice(&ox[..OXCCL_LEN]);
    if let Some(real) = &id.real {
        if real[REAL_LEN..].iter().any(|&b| b != 0) {
            return Err(ApiError::internal(format!(
                "the real NCCL's unique id uses more than {REAL_LEN} bytes: it does not fit \
                 beside the oxccl id (a newer NCCL?)"
            )));
        }
        out[5] = FLAG_REAL;
        out[REAL_AT..].copy_from_slice(&real[..REAL_LEN]);
    }
    Ok(out)
}

/// Unpacks an id made by [`pack`].
pub fn unpack(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> ApiResult<PackedId> {
    if bytes[0..4] != MAGIC {
        return Err(ApiError::invalid_argument(
            "the unique id was not made by liboxccl_nccl's ncclGetUniqueId (bad magic): every \
             rank must use the same library",
        ));
    }
    if bytes[4] != VERSION {
        return Err(ApiError::invalid_argument(format!(
            "unique id format version {} (this library reads version {VERSION})",
            bytes[4]
        )));
    }
    let mut ox = [0u8; NCCL_UNIQUE_ID_BYTES];
    ox[..OXCCL_LEN].copy_from_slice(&bytes[OXCCL_AT..REAL_AT]);
    let oxccl = UniqueId::from_bytes(&ox).map_err(ApiError::from)?;
    let real = (bytes[5] & FLAG_REAL != 0).then(|| {
        let mut r = [0u8; NCCL_UNIQUE_ID_BYTES];
        r[..REAL_LEN].copy_from_slice(&bytes[REAL_AT..]);
        r
    });
    Ok(PackedId { oxccl, real })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv6Addr, SocketAddr};

    #[test]
    fn round_trip_with_and_without_a_real_id() {
        let oxccl = UniqueId {
            root: SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 4242),
            nonce: 0x1234_5678_9abc_def0,
        };
        let mut real = [0u8; 128];
        real[..36].copy_from_slice(&[7u8; 36]);
        for r in [None, Some(real)] {
            let id = PackedId { oxccl, real: r };
            assert_eq!(unpack(&pack(&id).unwrap()).unwrap(), id);
        }
        let mut long = real;
        long[100] = 1;
        let e = pack(&PackedId {
            oxccl,
            real: Some(long),
        })
        .unwrap_err();
        assert!(e.message.contains("does not fit"), "{e:?}");
        assert!(unpack(&[0u8; 128]).is_err());
    }
}
