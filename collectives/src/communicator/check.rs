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
    /// The root rank (broadcast, reduce; 0 otherwise).
    pub(crate) root: u32,
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
            self.root,
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
                 (count, dtype, op, accum, algorithm, grid x block, root) than this rank's ({}, \
                 {}, {}, {}, {}, {} x {}, {}); with a tuned table, every rank must use the same \
                 one",
                sig.collective,
                sig.count,
                DataType::from_code(sig.dtype).map_or("?".into(), |d| d.to_string()),
                sig.op,
                sig.accum,
                sig.algorithm,
                sig.launch.0,
                sig.launch.1,
                sig.root
            ))
            .at_rank(rank));
        }
        seen.insert(sig);
        Ok(())
    }
}

/// Where a call runs: its collective and this rank's place in the world (the buffer
/// sizes and NCCL's in-place rules depend on them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallSite {
    pub(crate) collective: Collective,
    pub(crate) rank: u32,
    pub(crate) world: u32,
}

/// The checks of every collective call on this rank: the bytes of one rank's input, or
/// why the call is refused.
pub(crate) fn check_call(
    site: CallSite,
    input: DevicePtr,
    output: DevicePtr,
    count: usize,
    dtype: DataType,
    accum: AccumType,
) -> Result<usize> {
    let bytes = dtype.bytes(count)?;
    check_buffers(site, input, output, bytes, dtype)?;
    check_types(site.collective, dtype, accum)?;
    Ok(bytes)
}

/// Null, misaligned, overflowing or partially overlapping buffers are refused. The input
/// holds `bytes`, the output what the collective makes of them
/// ([`Collective::buffer_bytes`]); they may overlap only as NCCL's in-place rule says
/// ([`Collective::in_place_input`]).
pub(crate) fn check_buffers(
    site: CallSite,
    input: DevicePtr,
    output: DevicePtr,
    bytes: usize,
    dtype: DataType,
) -> Result<()> {
    let collective = site.collective;
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
    let (in_bytes, out_bytes) = collective.buffer_bytes(bytes, site.world)?;
    input.offset(in_bytes)?;
    output.offset(out_bytes)?;
    let in_place = collective.in_place_input(output, bytes, site.rank);
    let (i, o) = (input.0, output.0);
    if in_place != Some(input) && i < o + out_bytes as u64 && o < i + in_bytes as u64 {
        let rule = match in_place {
            Some(p) => format!("in place on rank {} means input == {p}", site.rank),
            None => format!("{collective} has no in-place form"),
        };
        return Err(Error::InvalidArgument(format!(
            "{collective}: input {input} ({in_bytes} bytes) and output {output} ({out_bytes} \
             bytes) overlap, and the call is not in place ({rule})"
        )));
    }
    Ok(())
}

/// Type combinations the kernels serve ([`AccumType::refusal`]).
pub(crate) fn check_types(collective: Collective, dtype: DataType, accum: AccumType) -> Result<()> {
    match accum.refusal(dtype) {
        Some(why) => Err(Error::Unsupported(format!("{collective}: {why}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Collective = Collective::AllReduce;

    fn site(collective: Collective, rank: u32) -> CallSite {
        CallSite {
            collective,
            rank,
            world: 3,
        }
    }

    #[test]
    fn buffers_and_types_are_checked() {
        let p = DevicePtr(0x1000);
        let s = site(C, 0);
        assert!(check_buffers(s, p, p, 100, DataType::F32).is_ok());
        assert!(check_buffers(s, DevicePtr::NULL, p, 4, DataType::F32).is_err());
        assert!(check_buffers(s, DevicePtr(0x1002), p, 4, DataType::F32).is_err());
        assert!(check_buffers(
            s,
            DevicePtr(0x1001),
            DevicePtr(0x2001),
            4,
            DataType::Fp8E4m3
        )
        .is_ok());
        assert!(check_buffers(s, p, DevicePtr(0x1004), 8, DataType::F32).is_err());
        assert!(check_buffers(s, DevicePtr(u64::MAX - 4), p, 8, DataType::F32).is_err());
        assert!(check_types(C, DataType::F32, AccumType::F16).is_err());
        assert!(check_types(C, DataType::Bf16, AccumType::F16).is_ok());
    }

    #[test]
    fn all_gather_buffers_follow_nccl_in_place_rules() {
        let out = DevicePtr(0x10000);
        let g = |rank| site(Collective::AllGather, rank);
        // In place: the input is this rank's slot of the output (100 bytes per rank).
        assert!(check_buffers(g(0), out, out, 100, DataType::F32).is_ok());
        assert!(check_buffers(g(2), DevicePtr(0x10000 + 200), out, 100, DataType::F32).is_ok());
        // Another rank's slot, or an input straddling slots, overlaps without being in place.
        let e = check_buffers(g(1), out, out, 100, DataType::F32).unwrap_err();
        assert!(e.to_string().contains("not in place"), "{e}");
        assert!(check_buffers(g(1), DevicePtr(0x10000 + 104), out, 100, DataType::F32).is_err());
        // The output is world * bytes: an input right after 100 bytes still overlaps it.
        assert!(check_buffers(g(0), DevicePtr(0x10000 + 100), out, 100, DataType::F32).is_err());
        assert!(check_buffers(g(0), DevicePtr(0x10000 + 300), out, 100, DataType::F32).is_ok());
        // The output's end must not overflow.
        assert!(check_buffers(g(0), out, DevicePtr(u64::MAX - 200), 100, DataType::F32).is_err());
    }
}
