//! The record each rank sends about a call in the zero-copy exchange (the module docs):
//! the call itself, for the cross-rank comparison, and where each of its buffers lives.
//! A small versioned binary form, read back field by field with every length checked.

use oxccl_hal::{DevicePtr, Error, ForeignAllocation, Result};

use crate::algorithms::Collective;

const MAGIC: &[u8; 4] = b"OXAR";
const VERSION: u8 = 2;

/// What a rank sends about one of its buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BufferRecord {
    /// The call does not reach this buffer on the peers.
    NotNeeded,
    /// It cannot be shared (not device memory, across allocations, not exportable).
    Unshareable,
    /// Inside this allocation, at `offset`; `handle` when the peers have not mapped it yet.
    Found {
        allocation: ForeignAllocation,
        offset: u64,
        pinned: bool,
        handle: Option<Vec<u8>>,
    },
}

/// What a rank sends for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// The call as this rank made it (collective, count, dtype, op, accum, root).
    pub(super) call: [u64; 6],
    pub(super) capturing: bool,
    pub(super) buffers: [BufferRecord; 2],
    /// Identities of this rank's allocations in the peers' tables that it found freed
    /// (an allocation it reports now overlaps them): every rank drops their entries.
    pub(super) retire: Vec<u64>,
}

/// The call a record describes, for the cross-rank comparison.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AutoCall {
    pub(crate) collective: Collective,
    pub(crate) count: u64,
    pub(crate) dtype: u32,
    pub(crate) op: u32,
    pub(crate) accum: u32,
    pub(crate) root: u32,
}

impl AutoCall {
    pub(super) fn words(&self) -> [u64; 6] {
        [
            self.collective as u64,
            self.count,
            u64::from(self.dtype),
            u64::from(self.op),
            u64::from(self.accum),
            u64::from(self.root),
        ]
    }
}

fn malformed() -> Error {
    Error::Ipc("a peer's zero-copy record is malformed".into())
}

/// Reads a record's fields in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).ok_or_else(malformed)?;
        let s = self.bytes.get(self.at..end).ok_or_else(malformed)?;
        self.at = end;
        Ok(s)
    }

    fn word(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

impl Record {
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        for w in self.call {
            put_u64(&mut out, w);
        }
        out.push(u8::from(self.capturing));
        for b in &self.buffers {
            match b {
                BufferRecord::NotNeeded => out.push(0),
                BufferRecord::Unshareable => out.push(1),
                BufferRecord::Found {
                    allocation,
                    offset,
                    pinned,
                    handle,
                } => {
                    out.push(2);
                    put_u64(&mut out, allocation.id);
                    put_u64(&mut out, allocation.base.0);
                    put_u64(&mut out, allocation.len as u64);
                    put_u64(&mut out, *offset);
                    out.push(u8::from(*pinned));
                    let h = handle.as_deref().unwrap_or(&[]);
                    put_u64(&mut out, h.len() as u64);
                    out.extend_from_slice(h);
                }
            }
        }
        put_u64(&mut out, self.retire.len() as u64);
        for &id in &self.retire {
            put_u64(&mut out, id);
        }
        out
    }

    pub(super) fn from_bytes(bytes: &[u8]) -> Result<Record> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC || r.take(1)?[0] != VERSION {
            return Err(malformed());
        }
        let mut call = [0u64; 6];
        for w in &mut call {
            *w = r.word()?;
        }
        let capturing = r.take(1)?[0] != 0;
        let mut buffers = [BufferRecord::NotNeeded, BufferRecord::NotNeeded];
        for b in &mut buffers {
            *b = match r.take(1)?[0] {
                0 => BufferRecord::NotNeeded,
                1 => BufferRecord::Unshareable,
                2 => {
                    let id = r.word()?;
                    let base = DevicePtr(r.word()?);
                    let len = usize::try_from(r.word()?).map_err(|_| malformed())?;
                    let offset = r.word()?;
                    let pinned = r.take(1)?[0] != 0;
                    let hlen = usize::try_from(r.word()?).map_err(|_| malformed())?;
                    let handle = r.take(hlen)?;
                    BufferRecord::Found {
                        allocation: ForeignAllocation { base, len, id },
                        offset,
                        pinned,
                        handle: (hlen > 0).then(|| handle.to_vec()),
                    }
                }
                _ => return Err(malformed()),
            };
        }
        let retired = usize::try_from(r.word()?).map_err(|_| malformed())?;
        // Each takes 8 bytes: a count past what is left is malformed, not an allocation.
        if retired > (bytes.len() - r.at) / 8 {
            return Err(malformed());
        }
        let retire = (0..retired).map(|_| r.word()).collect::<Result<Vec<_>>>()?;
        if r.at != bytes.len() {
            return Err(malformed());
        }
        Ok(Record {
            call,
            capturing,
            buffers,
            retire,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            call: [0, 20_011, 3, 0, 0, 0],
            capturing: true,
            buffers: [
                BufferRecord::Found {
                    allocation: ForeignAllocation {
                        base: DevicePtr(0x7000_0000),
                        len: 1 << 20,
                        id: 42,
                    },
                    offset: 4096,
                    pinned: true,
                    handle: Some(vec![1, 2, 3]),
                },
                BufferRecord::Unshareable,
            ],
            retire: vec![7, 1 << 63],
        }
    }

    #[test]
    fn records_round_trip_and_malformed_ones_are_refused() {
        let r = record();
        assert_eq!(Record::from_bytes(&r.to_bytes()).unwrap(), r);
        let plain = Record {
            buffers: [BufferRecord::NotNeeded, BufferRecord::NotNeeded],
            retire: Vec::new(),
            ..record()
        };
        assert_eq!(Record::from_bytes(&plain.to_bytes()).unwrap(), plain);
        let bytes = r.to_bytes();
        for cut in [0, 3, 5, bytes.len() - 1] {
            assert!(Record::from_bytes(&bytes[..cut]).is_err(), "cut {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Record::from_bytes(&long).is_err());
        let mut bad_kind = bytes.clone();
        bad_kind[4 + 1 + 48 + 1] = 7;
        assert!(Record::from_bytes(&bad_kind).is_err());
        // A retire count larger than the bytes after it.
        let mut huge = bytes;
        let at = huge.len() - 8 * 3;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Record::from_bytes(&huge).is_err());
    }
}
