//! The entry checks every collective call passes before anything is launched: pointers,
//! sizes and types on this rank ([`check_call`]), then, on the first call of a signature,
//! agreement across ranks ([`Signatures`]).

use std::collections::HashSet;
use std::sync::Mutex;

use oxccl_channels::bootstrap::Bootstrap;
use oxccl_hal::{AccumType, DataType, DevicePtr, Error, Result};

use crate::algorithms::Collective;

/// What the first call of a signature checks across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Signature {
    /// The collective.
    pub(crate) collective: Collective,
    pub(crate) count: u64,
    pub(crate) dtype: u32,
    pub(crate) op: u32,
    pub(crate) accum: u32,
    pub(crate) algorithm: u32,
    /// Blocks and threads (a tuned table that differs between ranks shows up here).
    pub(crate) launch: (u32, u32),
    /// Zero-copy: offsets of input and output in their registered buffers (ranks must
    /// agree); `u64::MAX` otherwise.
    pub(crate) zc_offsets: (u64, u64),
}

impl Signature {
    fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        for x in [self.count, self.zc_offsets.0, self.zc_offsets.1] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [
            self.collective as u32,
            self.dtype,
            self.op,
            self.accum,
            self.algorithm,
            self.launch.0,
            self.launch.1,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }
}

/// The signatures this rank has checked across ranks already.
#[derive(Debug, Default)]
pub(crate) struct Signatures {
    seen: Mutex<HashSet<Signature>>,
}

impl Signatures {
    /// Checks `sig` against every rank the first time this rank makes such a call (one
    /// all-gather through `bootstrap`, host side only, so also fine while capturing).
    pub(crate) fn check(&self, sig: Signature, bootstrap: &Bootstrap) -> Result<()> {
        let rank = bootstrap.rank();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&sig) {
            return Ok(());
        }
        let all = bootstrap
            .all_gather(&sig.to_bytes())
            .map_err(|e| e.at_rank(rank))?;
        let mine = sig.to_bytes();
        let differing: Vec<usize> = all
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != mine)
            .map(|(r, _)| r)
            .collect();
        if !differing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "mismatched {} calls: ranks {differing:?} called with a different \
                 (count, dtype, op, accum, algorithm, grid x block) than this rank's ({}, {}, \
                 {}, {}, {}, {} x {}); with a tuned table, every rank must use the same one",
                sig.collective,
                sig.count,
                DataType::from_code(sig.dtype).map_or("?".into(), |d| d.to_string()),
                sig.op,
                sig.accum,
                sig.algorithm,
                sig.launch.0,
                sig.launch.1
            ))
            .at_rank(rank));
        }
        seen.insert(sig);
        Ok(())
    }
}

/// The checks of every collective call on this rank: the bytes of one rank's buffer, or
/// why the call is refused.
pub(crate) fn check_call(
    collective: Collective,
    input: DevicePtr,
    output: DevicePtr,
    count: usize,
    dtype: DataType,
    accum: AccumType,
) -> Result<usize> {
    let bytes = dtype.bytes(count)?;
    check_buffers(collective, input, output, bytes, dtype)?;
    check_types(collective, dtype, accum)?;
    Ok(bytes)
}

/// Null, misaligned, overflowing or partially overlapping buffers are refused.
pub(crate) fn check_buffers(
    collective: Collective,
    input: DevicePtr,
    output: DevicePtr,
    bytes: usize,
    dtype: DataType,
) -> Result<()> {
    if input.is_null() || output.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{collective}: null input or output"
        )));
    }
    let align = dtype.size() as u64;
    if !input.is_aligned(align) || !output.is_aligned(align) {
        return Err(Error::InvalidArgument(format!(
            "{collective}: input {input} / output {output} not aligned to the {align}-byte {dtype} \
             element"
        )));
    }
    input.offset(bytes)?;
    output.offset(bytes)?;
    let (i, o, n) = (input.0, output.0, bytes as u64);
    if i != o && i < o + n && o < i + n {
        return Err(Error::InvalidArgument(format!(
            "{collective}: input {input} and output {output} overlap without being the same \
             buffer ({bytes} bytes)"
        )));
    }
    Ok(())
}

/// Type combinations the kernels serve: every data type with `Auto`, `Native`, `F32`;
/// `F16` accumulation for everything narrower than f32 (refused for f32 data, which it
/// would silently truncate).
pub(crate) fn check_types(collective: Collective, dtype: DataType, accum: AccumType) -> Result<()> {
    if dtype == DataType::F32 && accum == AccumType::F16 {
        return Err(Error::Unsupported(format!(
            "{collective}: f32 data with an f16 accumulator (narrower than the data)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Collective = Collective::AllReduce;

    #[test]
    fn buffers_and_types_are_checked() {
        let p = DevicePtr(0x1000);
        assert!(check_buffers(C, p, p, 100, DataType::F32).is_ok());
        assert!(check_buffers(C, DevicePtr::NULL, p, 4, DataType::F32).is_err());
        assert!(check_buffers(C, DevicePtr(0x1002), p, 4, DataType::F32).is_err());
        assert!(check_buffers(
            C,
            DevicePtr(0x1001),
            DevicePtr(0x2001),
            4,
            DataType::Fp8E4m3
        )
        .is_ok());
        assert!(check_buffers(C, p, DevicePtr(0x1004), 8, DataType::F32).is_err());
        assert!(check_buffers(C, DevicePtr(u64::MAX - 4), p, 8, DataType::F32).is_err());
        assert!(check_types(C, DataType::F32, AccumType::F16).is_err());
        assert!(check_types(C, DataType::Bf16, AccumType::F16).is_ok());
    }
}
