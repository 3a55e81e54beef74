//! Framing on bootstrap sockets: `[tag: u64][len: u64][payload]`, little-endian.

use std::io::{Read, Write};
use std::net::TcpStream;

use oxccl_hal::{Error, Result};

/// Upper bound on one frame, so a corrupt length cannot make us allocate without limit.
pub const MAX_FRAME: u64 = 1 << 32;

/// Writes one frame.
pub fn write_frame(stream: &mut TcpStream, tag: u64, payload: &[u8]) -> std::io::Result<()> {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&tag.to_le_bytes());
    header[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    stream.write_all(&header)?;
    stream.write_all(payload)?;
    stream.flush()
}

/// Reads one frame.
pub fn read_frame(stream: &mut TcpStream) -> std::io::Result<(u64, Vec<u8>)> {
    let mut header = [0u8; 16];
    stream.read_exact(&mut header)?;
    let mut t = [0u8; 8];
    t.copy_from_slice(&header[..8]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&header[8..]);
    let (tag, len) = (u64::from_le_bytes(t), u64::from_le_bytes(l));
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload)?;
    Ok((tag, payload))
}

/// A little cursor for decoding payloads with clear errors.
pub struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `bytes`, naming `what` in errors.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(Error::PeerLost(format!("malformed {} message", self.what)));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    /// A u32-length-prefixed UTF-8 string.
    pub fn string(&mut self) -> Result<String> {
        let n = self.u32()? as usize;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec())
            .map_err(|_| Error::PeerLost(format!("malformed {} message (utf-8)", self.what)))
    }
}

/// Appends a u32-length-prefixed string.
pub fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}
