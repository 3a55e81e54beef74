//! The PortChannel kernels on the host backend (`allreduce_port`, `allgather_port`,
//! `reducescatter_port` of `kernels/src/device/allreduce_port.cu`): the device kernels'
//! steps on one host thread, the same argument block, scratch layout and round counter
//! (see [`super`]'s docs and `abi_allreduce.h`), the proxy and transports real.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oxccl_channels::port_channel as port;
use oxccl_hal::{AccumType, DataType, Error, ReduceOp, Result};
use oxccl_kernels::abi::{
    self, OxcclPortAllreduceArgs, OxcclPortChannel, OXCCL_ALLREDUCE_ERR_ABORTED,
    OXCCL_ALLREDUCE_ERR_ARGS, OXCCL_ALLREDUCE_ERR_TIMEOUT, OXCCL_ALLREDUCE_MAX_RANKS,
    OXCCL_PORT_ALLREDUCE_SYNC_ERROR, OXCCL_PORT_ROUND_SLOTS,
};

use crate::host_kernels::{aborted, read_unit, record_failure, reduce_unit, write_unit};

/// What a PortChannel kernel does with the chunks it exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Every rank's whole input to every peer, reduced in rank order.
    AllReduce,
    /// Every rank's input to every peer, copied into its slot of the output.
    AllGather,
    /// Chunk p of every rank's input to rank p, reduced in rank order.
    ReduceScatter,
}

/// A checked view of the argument block, for the host kernel.
struct Call {
    a: OxcclPortAllreduceArgs,
    kind: Kind,
    kernel: &'static str,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    total: usize,
    world: usize,
    me: usize,
    deadline: Option<Instant>,
}

impl Call {
    fn new(bytes: &[u8], kernel: &'static str, kind: Kind) -> Result<Call> {
        let a: OxcclPortAllreduceArgs = abi::parse_args(bytes, kernel)?;
        let world = a.world_size as usize;
        let me = a.rank as usize;
        let bad = |what: &str| Error::InvalidArgument(format!("{kernel}: {what}"));
        if a.scratch.is_null() {
            return Err(bad("null scratch"));
        }
        let call = |r: Result<Call>| {
            if r.is_err() {
                // SAFETY: scratch non-null: the caller's live scratch (launch contract).
                unsafe { report(&a, OXCCL_ALLREDUCE_ERR_ARGS, a.rank) };
            }
            r
        };
        call((|| {
            if world == 0 || world > OXCCL_ALLREDUCE_MAX_RANKS as usize || me >= world {
                return Err(bad(&format!("rank {me} of world {world}")));
            }
            if a.chunk_bytes == 0 || a.chunk_bytes % 16 != 0 {
                return Err(bad("chunk not a positive multiple of 16"));
            }
            if a.round_bytes % 16 != 0 || u64::from(a.round_bytes) > a.chunk_bytes {
                return Err(bad("round not a multiple of 16 within the chunk"));
            }
            if world > 1 && a.channels.is_null() {
                return Err(bad("null channels"));
            }
            if a.rounds.is_null() {
                return Err(bad("null round counter"));
            }
            let dtype = DataType::from_code(a.dtype)?;
            let op = ReduceOp::from_code(a.op)?;
            let accum = AccumType::from_code(a.accum)?;
            let count = usize::try_from(a.count).map_err(|_| bad("count"))?;
            let total = dtype.bytes(count)?;
            if total > 0 && (a.input.is_null() || a.output.is_null()) {
                return Err(bad("null input or output"));
            }
            let deadline = (a.timeout_ns != 0)
                .then(|| Instant::now().checked_add(Duration::from_nanos(a.timeout_ns)))
                .flatten();
            // The whole input (reduce-scatter) or output (all-gather) is world chunks.
            if kind != Kind::AllReduce && total.checked_mul(world).is_none() {
                return Err(bad("count x world size overflows"));
            }
            Ok(Call {
                a,
                kind,
                kernel,
                dtype,
                op,
                accum,
                total,
                world,
                me,
                deadline,
            })
        })())
    }

    fn scratch(&self) -> *mut u8 {
        self.a.scratch.cast()
    }

    fn round_word(&self) -> &AtomicU64 {
        // SAFETY: launch contract: `rounds` is a live, 8-byte aligned counter (checked
        // non-null in `new`) that only this rank's kernels touch, one at a time in stream
        // order, atomically here.
        unsafe { AtomicU64::from_ptr(self.a.rounds) }
    }

    fn channel(&self, p: usize) -> OxcclPortChannel {
        // SAFETY: launch contract: `channels` holds world_size handles (p < world) in
        // host-backend memory, written at setup and never changed.
        unsafe { std::ptr::read(self.a.channels.add(p)) }
    }

    /// Records a failed wait for `peer` (an abort once the communicator's abort word is
    /// set, else a timeout) and returns it as an error.
    fn fail(&self, peer: usize, what: &str) -> Error {
        if aborted(self.a.abort_flag) {
            // SAFETY: the live scratch (launch contract).
            unsafe { report(&self.a, OXCCL_ALLREDUCE_ERR_ABORTED, peer as u32) };
            return Error::Aborted(format!(
                "{}: the communicator of rank {} was aborted while it waited for rank {peer} \
                 ({what})",
                self.kernel, self.me
            ));
        }
        // SAFETY: the live scratch (launch contract).
        unsafe { report(&self.a, OXCCL_ALLREDUCE_ERR_TIMEOUT, peer as u32) };
        Error::Timeout {
            what: format!(
                "{}: rank {} waiting for rank {peer} ({what}); the peer is dead, \
                 slow, or made a different call",
                self.kernel, self.me
            ),
            waited: Duration::from_nanos(self.a.timeout_ns),
        }
    }

    /// Waits for the next signal of `h`'s semaphore, bounded by the deadline, the
    /// communicator's abort word and the semaphore's spin limit (the device's
    /// `wait_signal`).
    fn wait_signal(&self, h: &OxcclPortChannel, peer: usize) -> Result<()> {
        let s = &h.semaphore;
        // SAFETY: launch contract: the handle's counters are live host-backend memory,
        // accessed atomically by the peer's proxy and by this waiter alone.
        let (inbound, expected) = unsafe {
            (
                AtomicU64::from_ptr(s.inbound),
                AtomicU64::from_ptr(s.expected_inbound),
            )
        };
        let want = expected.load(Ordering::Relaxed) + 1;
        let mut polls = 0u64;
        while inbound.load(Ordering::Acquire) < want {
            polls += 1;
            if (s.max_spins != 0 && polls >= s.max_spins)
                || (polls % 64 == 0
                    && (aborted(self.a.abort_flag)
                        || self.deadline.is_some_and(|d| Instant::now() >= d)))
            {
                return Err(self.fail(peer, "its data signal"));
            }
            if polls < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        expected.store(want, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes [off, off + 16) of chunk `p` of the input (the whole input unless
    /// reduce-scatter); bytes past the chunk's end are zero.
    fn load_input(&self, p: usize, off: usize) -> [u8; 16] {
        let chunk = if self.kind == Kind::ReduceScatter {
            p * self.total
        } else {
            0
        };
        // SAFETY: launch contract: the input holds `total` bytes, `world * total` for a
        // reduce-scatter (p < world; the product was checked).
        unsafe { read_unit(self.a.input.cast::<u8>().add(chunk).cast(), self.total, off) }
    }

    /// Stores into slot `r` of the output (the whole output unless all-gather).
    fn store_output(&self, r: usize, off: usize, v: &[u8; 16]) {
        let slot = if self.kind == Kind::AllGather {
            r * self.total
        } else {
            0
        };
        // SAFETY: launch contract: the output holds `total` bytes, `world * total` for an
        // all-gather (r < world; the product was checked), written only here.
        unsafe {
            write_unit(
                self.a.output.cast::<u8>().add(slot).cast(),
                self.total,
                off,
                v,
            )
        }
    }

    /// Reduces one 16-byte unit of every rank in rank order with the reference reduction.
    fn reduce_unit(&self, inputs: &[[u8; 16]], valid: usize) -> Result<[u8; 16]> {
        reduce_unit(self.dtype, self.op, self.accum, inputs, valid)
    }
}

/// Records the first failure (code | peer << 32) in the scratch's error word of `a`, and
/// mirrors it into the communicator's host failure word.
///
/// # Safety
/// `a.scratch` must be a live port-allreduce scratch, and `a.abort_flag` null or the
/// communicator's live host words.
unsafe fn report(a: &OxcclPortAllreduceArgs, code: u32, peer: u32) {
    let word = u64::from(code) | (u64::from(peer) << 32);
    // SAFETY: the caller's obligation; the word is 8-byte aligned.
    let w = unsafe {
        AtomicU64::from_ptr(
            a.scratch
                .cast::<u8>()
                .add(OXCCL_PORT_ALLREDUCE_SYNC_ERROR as usize)
                .cast(),
        )
    };
    record_failure(w, a.abort_flag, word);
}

/// A PortChannel kernel on the host backend: the device kernel's steps on one thread.
pub(crate) fn run(bytes: &[u8], kernel: &'static str, kind: Kind) -> Result<()> {
    let c = Call::new(bytes, kernel, kind)?;
    // Slots are `chunk` bytes apart; a round moves `step` of them.
    let chunk = c.a.chunk_bytes as usize;
    let step = match c.a.round_bytes {
        0 => chunk,
        r => r as usize,
    };
    let (send_off, recv_off) = (c.a.send_offset as usize, c.a.recv_offset as usize);
    let round0 = c.round_word().load(Ordering::Acquire);
    let rounds = c.total.div_ceil(step);
    let channels: Vec<OxcclPortChannel> = (0..c.world)
        .map(|p| {
            if p == c.me {
                OxcclPortChannel::default()
            } else {
                c.channel(p)
            }
        })
        .collect();
    let scatter = kind == Kind::ReduceScatter;
    // In place (NCCL's rules), this rank's own chunk is already where it belongs.
    let in_place = match kind {
        Kind::AllGather => {
            c.a.input.cast::<u8>() == c.a.output.cast::<u8>().wrapping_add(c.me * c.total)
        }
        _ => false,
    };
    // Round k's slot, first byte, length, 16-byte units and send[slot][0].
    let round = |k: usize| {
        let slot = ((round0 + k as u64) % u64::from(OXCCL_PORT_ROUND_SLOTS)) as usize;
        let base = k * step;
        let len = c.total.saturating_sub(base).min(step);
        (
            slot,
            base,
            len,
            len.div_ceil(16),
            send_off + slot * c.world * chunk,
        )
    };
    // send[slot][s]: s = p holds chunk p for a reduce-scatter, s = 0 the input otherwise.
    let slots: Vec<usize> = if scatter {
        (0..c.world).filter(|&p| p != c.me).collect()
    } else {
        vec![0]
    };
    let stage = |k: usize| {
        let (_, base, _, units, group) = round(k);
        for &s in &slots {
            for u in 0..units {
                let v = c.load_input(s, base + u * 16);
                // SAFETY: send[slot][s] holds `chunk` >= 16 * units bytes of the live
                // scratch; the transports finished reading it (see abi_allreduce.h).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        v.as_ptr(),
                        c.scratch().add(group + s * chunk + u * 16),
                        16,
                    )
                };
            }
        }
    };
    let push = |k: usize, p: usize| -> Result<()> {
        let (slot, _, _, units, group) = round(k);
        let dst = recv_off + (slot * c.world + c.me) * chunk;
        let src = group + if scatter { p * chunk } else { 0 };
        // SAFETY: launch contract: a live channel of the host backend; both ranges lie
        // inside the registered scratches (same layout on every rank).
        unsafe {
            port::host_put_with_signal(&channels[p], dst as u64, src as u64, (units * 16) as u64, 0)
        }
        .inspect_err(|_| {
            // Recorded for check_error; the FIFO's own error is returned.
            let _ = c.fail(p, "a FIFO slot");
        })
    };
    let peers: Vec<usize> = (1..c.world).map(|k| (c.me + k) % c.world).collect();
    // The kernels' pipeline (abi_allreduce.h): round 0 staged and pushed first; then per
    // round k, stage k + 1, wait for every peer's round k, push k + 1, reduce k.
    if c.world > 1 && rounds > 0 {
        stage(0);
        for &p in &peers {
            push(0, p)?;
        }
    }
    let mut inputs = vec![[0u8; 16]; c.world];
    for k in 0..rounds {
        let (slot, base, len, units, _) = round(k);
        if c.world > 1 {
            let more = k + 1 < rounds;
            if more {
                stage(k + 1);
            }
            for &p in &peers {
                c.wait_signal(&channels[p], p)?;
            }
            if more {
                for &p in &peers {
                    push(k + 1, p)?;
                }
            }
        }
        let recv = recv_off + slot * c.world * chunk;
        for u in 0..units {
            for (r, input) in inputs.iter_mut().enumerate() {
                if r == c.me {
                    *input = c.load_input(c.me, base + u * 16);
                } else {
                    // SAFETY: recv[slot][r] of the live scratch: rank r's chunk, landed
                    // before its signal, which this rank acquired.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            c.scratch().add(recv + r * chunk + u * 16),
                            input.as_mut_ptr(),
                            16,
                        )
                    };
                }
            }
            if kind == Kind::AllGather {
                for (r, v) in inputs.iter().enumerate() {
                    if !(r == c.me && in_place) {
                        c.store_output(r, base + u * 16, v);
                    }
                }
            } else {
                let valid = len.saturating_sub(u * 16).min(16);
                c.store_output(0, base + u * 16, &c.reduce_unit(&inputs, valid)?);
            }
        }
    }
    c.round_word()
        .store(round0 + rounds as u64, Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_kernels::abi::KernelArgs;

    #[test]
    fn argument_block_has_the_header_layout() {
        assert_eq!(size_of::<OxcclPortAllreduceArgs>(), 112);
        assert_eq!(size_of::<OxcclPortChannel>(), 80);
        let a = OxcclPortAllreduceArgs::default();
        assert_eq!(a.as_bytes().len(), 112);
        for kind in [Kind::AllReduce, Kind::AllGather, Kind::ReduceScatter] {
            assert!(Call::new(&[0u8; 111], "k", kind).is_err());
            // A null scratch is refused before anything is read through it.
            assert!(Call::new(a.as_bytes(), "k", kind).is_err());
        }
    }
}
