//! The allreduce kernels as host functions, for the host backend: same names, same argument
//! block ([`OxcclAllreduceArgs`]) and the same protocol as `kernels/src/device/allreduce.cu`
//! (LL16 packets with epoch flags, per-block barriers through the INBOUND counters, the
//! epoch advanced at the end), so CI exercises the cross-process protocol without a GPU.
//!
//! One host thread does the whole grid's work. Device pointers are host addresses; the
//! scratch allocations are shared memfd mappings, so peers in other processes see the same
//! bytes. Every word other ranks touch is accessed through atomics.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oxccl_hal::{AccumType, DataType, Error, HostKernelTable, LaunchConfig, ReduceOp, Result};
use oxccl_kernels::abi::{
    OxcclAllreduceArgs, OXCCL_ALLREDUCE_ERR_TIMEOUT, OXCCL_ALLREDUCE_MAX_BLOCKS,
    OXCCL_ALLREDUCE_MAX_RANKS, OXCCL_ALLREDUCE_SYNC_EPOCH, OXCCL_ALLREDUCE_SYNC_ERROR,
    OXCCL_ALLREDUCE_SYNC_EXPECTED, OXCCL_ALLREDUCE_SYNC_INBOUND,
};
use oxccl_kernels::{formats, reduce};

/// Name of the one-shot LL kernel (device and host).
pub const ONESHOT_LL: &str = "allreduce_oneshot_ll";
/// Name of the one-shot LL128 kernel (device and host).
pub const ONESHOT_LL128: &str = "allreduce_oneshot_ll128";
/// Name of the two-shot kernel (device and host).
pub const TWOSHOT: &str = "allreduce_twoshot";
/// Name of the zero-copy two-shot kernel (device and host).
pub const TWOSHOT_ZC: &str = "allreduce_twoshot_zc";
/// Name of the push two-shot kernel (device and host).
pub const TWOSHOT_PUSH: &str = "allreduce_twoshot_push";

/// The allreduce host kernels, loaded as a module on the host backend.
pub static TABLE: HostKernelTable = HostKernelTable {
    name: "oxccl-collectives allreduce (host)",
    kernels: &[
        (ONESHOT_LL, oneshot_ll),
        (ONESHOT_LL128, oneshot_ll128),
        (TWOSHOT, twoshot),
        (TWOSHOT_ZC, twoshot_zc),
        (TWOSHOT_PUSH, twoshot_push),
    ],
};

/// The bytes of an argument block, as a launch takes them.
pub(crate) fn args_bytes(a: &OxcclAllreduceArgs) -> &[u8] {
    // SAFETY: OxcclAllreduceArgs is a repr(C) struct from abi_allreduce.h whose size (280)
    // is the sum of its fields (static-asserted in C, checked in the tests below), so every
    // byte is an initialised field; the slice borrows `a`.
    unsafe {
        std::slice::from_raw_parts(
            (a as *const OxcclAllreduceArgs).cast::<u8>(),
            size_of::<OxcclAllreduceArgs>(),
        )
    }
}

fn parse(bytes: &[u8], kernel: &str) -> Result<OxcclAllreduceArgs> {
    if bytes.len() != size_of::<OxcclAllreduceArgs>() {
        return Err(Error::InvalidArgument(format!(
            "{kernel}: argument block of {} bytes, expected {}",
            bytes.len(),
            size_of::<OxcclAllreduceArgs>()
        )));
    }
    // SAFETY: the length matches; read_unaligned has no alignment requirement; every bit
    // pattern is a valid value of this plain-integer/pointer struct.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<OxcclAllreduceArgs>()) })
}

/// A checked view of an argument block.
struct Call {
    a: OxcclAllreduceArgs,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    total: usize,
    world: usize,
    me: usize,
    deadline: Option<Instant>,
    kernel: &'static str,
}

impl Call {
    fn new(bytes: &[u8], kernel: &'static str) -> Result<Call> {
        let a = parse(bytes, kernel)?;
        let dtype = DataType::from_code(a.dtype)?;
        let op = ReduceOp::from_code(a.op)
            .map_err(|_| Error::Unsupported(format!("{kernel}: reduce op code {}", a.op)))?;
        let accum = AccumType::from_code(a.accum)
            .map_err(|_| Error::Unsupported(format!("{kernel}: accumulation code {}", a.accum)))?;
        let world = a.world_size as usize;
        let me = a.rank as usize;
        if world == 0 || world > OXCCL_ALLREDUCE_MAX_RANKS as usize || me >= world {
            return Err(Error::InvalidArgument(format!(
                "{kernel}: rank {me} of world {world}"
            )));
        }
        if a.scratch[..world].iter().any(|p| p.is_null()) || a.data_bytes % 16 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{kernel}: null scratch or staging size not a multiple of 16"
            )));
        }
        let count = usize::try_from(a.count)
            .map_err(|_| Error::InvalidArgument(format!("{kernel}: count {}", a.count)))?;
        let total = dtype.bytes(count)?;
        if total > 0 && (a.input.is_null() || a.output.is_null()) {
            return Err(Error::InvalidArgument(format!(
                "{kernel}: null input or output"
            )));
        }
        let deadline = (a.timeout_ns != 0)
            .then(|| Instant::now().checked_add(Duration::from_nanos(a.timeout_ns)))
            .flatten();
        Ok(Call {
            a,
            dtype,
            op,
            accum,
            total,
            world,
            me,
            deadline,
            kernel,
        })
    }

    fn scratch(&self, rank: usize) -> *mut u8 {
        self.a.scratch[rank].cast::<u8>()
    }

    /// The sync word at `offset` of `rank`'s scratch.
    fn word(&self, rank: usize, offset: u64) -> &AtomicU64 {
        // SAFETY: the launch contract makes every `scratch[r]` (r < world) a live mapping of
        // a scratch allocation laid out as abi_allreduce.h says: the sync area's words are
        // 8-byte aligned and only accessed atomically by every rank.
        unsafe { AtomicU64::from_ptr(self.scratch(rank).add(offset as usize).cast::<u64>()) }
    }

    fn inbound(&self, rank: usize, block: usize, from: usize) -> &AtomicU64 {
        let slot = (block * OXCCL_ALLREDUCE_MAX_RANKS as usize + from) as u64 * 8;
        self.word(rank, u64::from(OXCCL_ALLREDUCE_SYNC_INBOUND) + slot)
    }

    fn expected(&self, block: usize, from: usize) -> &AtomicU64 {
        let slot = (block * OXCCL_ALLREDUCE_MAX_RANKS as usize + from) as u64 * 8;
        self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_EXPECTED) + slot)
    }

    fn timed_out(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn fail(&self, peer: usize, what: &str) -> Error {
        let err = self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_ERROR));
        let code = u64::from(OXCCL_ALLREDUCE_ERR_TIMEOUT) | ((peer as u64) << 32);
        let _ = err.compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
        Error::Timeout {
            what: format!(
                "{}: rank {} waiting for rank {peer} ({what}); the peer is dead, slow, or \
                 made a different call",
                self.kernel, self.me
            ),
            waited: Duration::from_nanos(self.a.timeout_ns),
        }
    }

    /// Bytes [off, off + 16) of the input; bytes past the end are zero.
    fn load_input(&self, off: usize) -> [u8; 16] {
        // SAFETY: launch contract: the input holds `total` bytes.
        unsafe { read_unit(self.a.input, self.total, off) }
    }

    /// Stores the part of `v` that falls inside the output.
    fn store_output(&self, off: usize, v: &[u8; 16]) {
        // SAFETY: launch contract: the output holds `total` bytes, and only this kernel
        // writes it while it runs.
        unsafe { write_unit(self.a.output, self.total, off, v) }
    }

    /// Reduces one 16-byte unit of every rank, in rank order, bit for bit as the device.
    fn reduce_unit(&self, inputs: &[[u8; 16]], valid: usize) -> Result<[u8; 16]> {
        reduce_unit(self.dtype, self.op, self.accum, inputs, valid)
    }

    /// The call's flag and the byte offset of its parity half of the flag-protocol region
    /// (`packet_offset`: LL16 packets or LL128 lines), after checking that `world` slots
    /// of `slot` bytes fit one half.
    fn flagged_half(&self, slot: usize) -> Result<(u32, usize)> {
        if self.world > 1 && self.world * slot > self.a.packet_half_bytes as usize {
            return Err(Error::InvalidArgument(format!(
                "{}: {} bytes x {} ranks do not fit a half of {} bytes",
                self.kernel, self.total, self.world, self.a.packet_half_bytes
            )));
        }
        let epoch = self
            .word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_EPOCH))
            .load(Ordering::Acquire);
        let half = (self.a.packet_offset + (epoch & 1) * self.a.packet_half_bytes) as usize;
        Ok((flag_of(epoch), half))
    }

    /// Advances the epoch, as block 0 of a device kernel does (one host thread is the
    /// whole grid here, so there are no blocks to count in DONE).
    fn finish(&self) {
        self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_EPOCH))
            .fetch_add(1, Ordering::Release);
    }
}

/// Bytes [off, off + 16) of a buffer of `total` bytes; bytes past the end read as zero
/// (the device kernels' `load_unit`).
///
/// # Safety
/// `base` must be valid for reads of `total` bytes.
pub(crate) unsafe fn read_unit(base: *const c_void, total: usize, off: usize) -> [u8; 16] {
    let mut v = [0u8; 16];
    let n = total.saturating_sub(off).min(16);
    if n > 0 {
        // SAFETY: [off, off + n) lies inside the `total` bytes the caller vouches for.
        unsafe { std::ptr::copy_nonoverlapping(base.cast::<u8>().add(off), v.as_mut_ptr(), n) };
    }
    v
}

/// Stores the bytes of `v` that fall inside a buffer of `total` bytes at [off, off + 16)
/// (the device kernels' `store_unit`).
///
/// # Safety
/// `base` must be valid for writes of `total` bytes that nothing else accesses meanwhile.
pub(crate) unsafe fn write_unit(base: *mut c_void, total: usize, off: usize, v: &[u8; 16]) {
    let n = total.saturating_sub(off).min(16);
    if n > 0 {
        // SAFETY: [off, off + n) lies inside the `total` bytes the caller vouches for.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), base.cast::<u8>().add(off), n) };
    }
}

/// Reduces one 16-byte unit of every rank (`inputs`, rank order) with the reference
/// reduction, lane by lane over the `valid` bytes: bit for bit what the device computes.
pub(crate) fn reduce_unit(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    inputs: &[[u8; 16]],
    valid: usize,
) -> Result<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut bits = [0u32; OXCCL_ALLREDUCE_MAX_RANKS as usize];
    for lane in 0..valid.div_ceil(dtype.size()) {
        for (slot, input) in bits.iter_mut().zip(inputs) {
            *slot = formats::read_element(dtype, input, lane).unwrap_or_default();
        }
        let r = reduce::reduce_element(dtype, op, accum, &bits[..inputs.len()])?;
        formats::write_element(dtype, &mut out, lane, r);
    }
    Ok(out)
}

fn flag_of(epoch: u64) -> u32 {
    (epoch % 0xffff_ffff) as u32 + 1
}

/// The LL16 packet at byte `off` of `base` as four atomic words.
///
/// # Safety
/// `base + off` must be a live, 16-byte aligned packet in a scratch packet region.
unsafe fn packet<'a>(base: *mut u8, off: usize) -> [&'a AtomicU32; 4] {
    // SAFETY: the caller's obligation; the four words are 4-byte aligned.
    unsafe {
        let p = base.add(off).cast::<u32>();
        [
            AtomicU32::from_ptr(p),
            AtomicU32::from_ptr(p.add(1)),
            AtomicU32::from_ptr(p.add(2)),
            AtomicU32::from_ptr(p.add(3)),
        ]
    }
}

/// Writes data then both flags (release): a reader that sees the flags sees the data.
fn ll16_write(p: [&AtomicU32; 4], d1: u32, d2: u32, flag: u32) {
    p[0].store(d1, Ordering::Relaxed);
    p[2].store(d2, Ordering::Relaxed);
    p[1].store(flag, Ordering::Release);
    p[3].store(flag, Ordering::Release);
}

fn ll16_try_read(p: [&AtomicU32; 4], flag: u32) -> Option<(u32, u32)> {
    if p[1].load(Ordering::Acquire) == flag && p[3].load(Ordering::Acquire) == flag {
        Some((p[0].load(Ordering::Relaxed), p[2].load(Ordering::Relaxed)))
    } else {
        None
    }
}

fn words(v: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]);
    [w(0), w(1), w(2), w(3)]
}

fn unwords(w: [u32; 4]) -> [u8; 16] {
    let mut v = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        v[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Polls with a short spin, then yields: peers are processes on the same cores.
fn backoff(polls: &mut u32) {
    *polls = polls.saturating_add(1);
    if *polls < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn oneshot_ll(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, ONESHOT_LL)?;
    let units = c.total.div_ceil(16);
    let slot = units * 32;
    let (flag, half) = c.flagged_half(slot)?;
    for u in 0..units {
        let w = words(&c.load_input(u * 16));
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            let off = half + c.me * slot + u * 32;
            // SAFETY: `off` addresses packets 2u, 2u+1 of slot `me` of the current half of
            // peer p's packet region, which fits (checked above); scratch bases are live.
            let (p0, p1) = unsafe { (packet(c.scratch(p), off), packet(c.scratch(p), off + 16)) };
            ll16_write(p0, w[0], w[1], flag);
            ll16_write(p1, w[2], w[3], flag);
        }
    }
    let mut inputs = vec![[0u8; 16]; c.world];
    for u in 0..units {
        for (r, input) in inputs.iter_mut().enumerate() {
            if r == c.me {
                *input = c.load_input(u * 16);
                continue;
            }
            let off = half + r * slot + u * 32;
            // SAFETY: as above, in this rank's own packet region.
            let (p0, p1) = unsafe {
                (
                    packet(c.scratch(c.me), off),
                    packet(c.scratch(c.me), off + 16),
                )
            };
            let mut polls = 0u32;
            let (a, b) = loop {
                if let Some(v) = ll16_try_read(p0, flag) {
                    break v;
                }
                if c.timed_out() {
                    return Err(c.fail(r, "one-shot packets"));
                }
                backoff(&mut polls);
            };
            let (d, e) = loop {
                if let Some(v) = ll16_try_read(p1, flag) {
                    break v;
                }
                if c.timed_out() {
                    return Err(c.fail(r, "one-shot packets"));
                }
                backoff(&mut polls);
            };
            *input = unwords([a, b, d, e]);
        }
        let valid = c.total.saturating_sub(u * 16).min(16);
        c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
    }
    c.finish();
    Ok(())
}

/// One-shot LL128: lines of seven 16-byte units and a 16-byte flag. On the device a warp
/// stores and loads a line in one instruction; here the flag words are stored after the
/// data (release) and loaded before it (acquire), which gives the same guarantee.
fn oneshot_ll128(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    const UNITS: usize = crate::algorithms::one_shot_ll128::UNITS_PER_LINE;
    let c = Call::new(bytes, ONESHOT_LL128)?;
    let units = c.total.div_ceil(16);
    let lines = units.div_ceil(UNITS);
    let slot = lines * 128;
    let (flag, half) = c.flagged_half(slot)?;
    for line in 0..lines {
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            let off = half + c.me * slot + line * 128;
            for t in 0..UNITS {
                let w = words(&c.load_input((line * UNITS + t) * 16));
                // SAFETY: `off + 16 t` addresses 16 bytes of line `line` in slot `me` of the
                // current half of peer p's line region, which fits (checked above).
                let d = unsafe { packet(c.scratch(p), off + t * 16) };
                for (word, x) in d.iter().zip(w) {
                    word.store(x, Ordering::Relaxed);
                }
            }
            // SAFETY: the line's flag words, as above.
            let f = unsafe { packet(c.scratch(p), off + UNITS * 16) };
            for word in f {
                word.store(flag, Ordering::Release);
            }
        }
    }
    let mut inputs = vec![[0u8; 16]; c.world];
    for line in 0..lines {
        let mut lanes = vec![[[0u8; 16]; UNITS]; c.world];
        for (r, lane) in lanes.iter_mut().enumerate().filter(|(r, _)| *r != c.me) {
            let off = half + r * slot + line * 128;
            // SAFETY: line `line` of slot r in this rank's own line region.
            let f = unsafe { packet(c.scratch(c.me), off + UNITS * 16) };
            let mut polls = 0u32;
            while !f.iter().all(|w| w.load(Ordering::Acquire) == flag) {
                if c.timed_out() {
                    return Err(c.fail(r, "one-shot LL128 lines"));
                }
                backoff(&mut polls);
            }
            for (t, unit) in lane.iter_mut().enumerate() {
                // SAFETY: as above; written before the flag this thread acquired.
                let d = unsafe { packet(c.scratch(c.me), off + t * 16) };
                *unit = unwords([0, 1, 2, 3].map(|i| d[i].load(Ordering::Relaxed)));
            }
        }
        for (t, u) in (line * UNITS..units.min((line + 1) * UNITS)).enumerate() {
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(u * 16)
                } else {
                    lanes[r][t]
                };
            }
            let valid = c.total.saturating_sub(u * 16).min(16);
            c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    c.finish();
    Ok(())
}

/// Barrier with every peer for blocks `0..blocks` (one host thread plays every block).
fn barrier(c: &Call, blocks: usize) -> Result<()> {
    for b in 0..blocks {
        for p in (0..c.world).filter(|p| *p != c.me) {
            c.inbound(p, b, c.me).fetch_add(1, Ordering::AcqRel);
        }
    }
    for b in 0..blocks {
        for p in (0..c.world).filter(|p| *p != c.me) {
            let expected = c.expected(b, p);
            let want = expected.load(Ordering::Relaxed) + 1;
            let inbound = c.inbound(c.me, b, p);
            let mut polls = 0u32;
            while inbound.load(Ordering::Acquire) < want {
                if c.timed_out() {
                    return Err(c.fail(p, "two-shot barrier"));
                }
                backoff(&mut polls);
            }
            expected.store(want, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The staging geometry of both staging kernels (`Rounds` in allreduce.cu): a message
/// that fits takes one round; a larger one equal rounds of `world` slots of `cap` units,
/// the shorter last round using the same slot positions. Returns (cap, round bytes).
fn rounds(c: &Call, kernel: &str) -> Result<(usize, usize)> {
    let cap_max = c.a.data_bytes as usize / (16 * c.world);
    if cap_max == 0 {
        return Err(Error::InvalidArgument(format!(
            "{kernel}: staging of {} bytes holds no unit per rank",
            c.a.data_bytes
        )));
    }
    let units = c.total.div_ceil(16);
    let rounds = units.div_ceil(c.world * cap_max).max(1);
    let cap = units.div_ceil(rounds * c.world).max(1);
    Ok((cap, cap * 16 * c.world))
}

/// Copies 16 bytes from `src` to `dst`.
///
/// # Safety
/// Both must be valid for 16 bytes.
unsafe fn copy16(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller's obligations.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, 16) }
}

fn twoshot(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, TWOSHOT)?;
    let blocks = (config.grid[0] as usize).clamp(1, OXCCL_ALLREDUCE_MAX_BLOCKS as usize);
    let (cap, round) = rounds(&c, TWOSHOT)?;
    let in_off = c.a.data_offset as usize;
    let out_off = in_off + c.a.data_bytes as usize;
    let mut inputs = vec![[0u8; 16]; c.world];
    let mut base = 0usize;
    while base < c.total {
        let len = (c.total - base).min(round);
        let units = len.div_ceil(16);
        let chunk = units.div_ceil(c.world);
        let range = |r: usize| (0..chunk).filter(move |j| r * chunk + j < units);
        for r in (0..c.world).filter(|r| *r != c.me) {
            for j in range(r) {
                let v = c.load_input(base + (r * chunk + j) * 16);
                // SAFETY: staging "in" of this rank holds world * cap units; r < world, j < cap.
                unsafe { copy16(v.as_ptr(), c.scratch(c.me).add(in_off + (r * cap + j) * 16)) };
            }
        }
        barrier(&c, blocks)?;
        for j in range(c.me) {
            let u = c.me * chunk + j;
            let pos = (c.me * cap + j) * 16;
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(base + u * 16)
                } else {
                    let mut v = [0u8; 16];
                    // SAFETY: rank r's staging "in", written before its barrier signal,
                    // which this rank acquired.
                    unsafe { copy16(c.scratch(r).add(in_off + pos), v.as_mut_ptr()) };
                    v
                };
            }
            let valid = (c.total - base).saturating_sub(u * 16).min(16);
            let v = c.reduce_unit(&inputs, valid)?;
            // SAFETY: this rank's staging "out", inside the allocation.
            unsafe { copy16(v.as_ptr(), c.scratch(c.me).add(out_off + pos)) };
            c.store_output(base + u * 16, &v);
        }
        barrier(&c, blocks)?;
        for k in 1..c.world {
            let r = (c.me + k) % c.world;
            for j in range(r) {
                let mut v = [0u8; 16];
                // SAFETY: rank r's staging "out", written before its second barrier signal.
                unsafe {
                    copy16(
                        c.scratch(r).add(out_off + (r * cap + j) * 16),
                        v.as_mut_ptr(),
                    )
                };
                c.store_output(base + (r * chunk + j) * 16, &v);
            }
        }
        base += len;
    }
    c.finish();
    Ok(())
}

/// Push two-shot: every transfer between ranks is a store into the peer. Push my chunk c
/// into slot `me` of rank c's "in" staging; barrier; reduce my chunk from my staging and
/// store it into every peer's registered output (direct) or "out" staging; barrier;
/// without registration, copy the peers' chunks from my "out" staging.
fn twoshot_push(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, TWOSHOT_PUSH)?;
    let blocks = (config.grid[0] as usize).clamp(1, OXCCL_ALLREDUCE_MAX_BLOCKS as usize);
    let (cap, round) = rounds(&c, TWOSHOT_PUSH)?;
    let outs = c.a.peer_output;
    let direct = !c.a.output.is_null()
        && outs[c.me] == c.a.output
        && outs[..c.world].iter().all(|p| !p.is_null());
    let in_off = c.a.data_offset as usize;
    let out_off = in_off + c.a.data_bytes as usize;
    let mut inputs = vec![[0u8; 16]; c.world];
    let mut base = 0usize;
    while base < c.total {
        let len = (c.total - base).min(round);
        let units = len.div_ceil(16);
        let chunk = units.div_ceil(c.world);
        let range = |r: usize| (0..chunk).filter(move |j| r * chunk + j < units);
        for k in 1..c.world {
            let r = (c.me + k) % c.world;
            for j in range(r) {
                let v = c.load_input(base + (r * chunk + j) * 16);
                // SAFETY: rank r's staging "in" holds world * cap units; slot `me`, j < cap.
                // Rank r reads it only after this rank's barrier signal.
                unsafe { copy16(v.as_ptr(), c.scratch(r).add(in_off + (c.me * cap + j) * 16)) };
            }
        }
        barrier(&c, blocks)?;
        for j in range(c.me) {
            let u = c.me * chunk + j;
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(base + u * 16)
                } else {
                    let mut v = [0u8; 16];
                    // SAFETY: this rank's staging "in", slot r, written by rank r before
                    // its barrier signal, which this rank acquired.
                    unsafe {
                        copy16(
                            c.scratch(c.me).add(in_off + (r * cap + j) * 16),
                            v.as_mut_ptr(),
                        )
                    };
                    v
                };
            }
            let off = base + u * 16;
            let valid = c.total.saturating_sub(off).min(16);
            let v = c.reduce_unit(&inputs, valid)?;
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                if direct {
                    // SAFETY: every rank's registered output holds `total` bytes at
                    // `outs[p]`; only this rank writes chunk `me` of it during the call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            v.as_ptr(),
                            outs[p].cast::<u8>().add(off),
                            valid,
                        )
                    };
                } else {
                    // SAFETY: rank p's staging "out" holds world * cap units.
                    unsafe {
                        copy16(
                            v.as_ptr(),
                            c.scratch(p).add(out_off + (c.me * cap + j) * 16),
                        )
                    };
                }
            }
            c.store_output(off, &v);
        }
        barrier(&c, blocks)?;
        if !direct {
            for k in 1..c.world {
                let r = (c.me + k) % c.world;
                for j in range(r) {
                    let mut v = [0u8; 16];
                    // SAFETY: this rank's staging "out", slot r, written by rank r before
                    // its second barrier signal.
                    unsafe {
                        copy16(
                            c.scratch(c.me).add(out_off + (r * cap + j) * 16),
                            v.as_mut_ptr(),
                        )
                    };
                    c.store_output(base + (r * chunk + j) * 16, &v);
                }
            }
        }
        base += len;
    }
    c.finish();
    Ok(())
}

/// Zero-copy two-shot: barrier; reduce my chunk straight from every rank's registered
/// input and store it into every rank's registered output; barrier.
fn twoshot_zc(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, TWOSHOT_ZC)?;
    let blocks = (config.grid[0] as usize).clamp(1, OXCCL_ALLREDUCE_MAX_BLOCKS as usize);
    let (ins, outs) = (c.a.peer_input, c.a.peer_output);
    if ins[..c.world].iter().any(|p| p.is_null())
        || outs[..c.world].iter().any(|p| p.is_null())
        || ins[c.me] != c.a.input
        || outs[c.me] != c.a.output
    {
        return Err(Error::InvalidArgument(format!(
            "{TWOSHOT_ZC}: missing registered peer buffers"
        )));
    }
    barrier(&c, blocks)?;
    let units = c.total.div_ceil(16);
    let chunk = units.div_ceil(c.world);
    let mut inputs = vec![[0u8; 16]; c.world];
    for u in (c.me * chunk).min(units)..((c.me + 1) * chunk).min(units) {
        let off = u * 16;
        let valid = c.total.saturating_sub(off).min(16);
        for (r, input) in inputs.iter_mut().enumerate() {
            *input = [0u8; 16];
            // SAFETY: launch contract: every rank's registered input holds `total` bytes,
            // mapped at `ins[r]`; [off, off + valid) is inside. The peers' inputs are not
            // written during the call (their kernels passed the first barrier).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ins[r].cast::<u8>().add(off),
                    input.as_mut_ptr(),
                    valid,
                )
            };
        }
        let v = c.reduce_unit(&inputs, valid)?;
        for k in 1..=c.world {
            let q = (c.me + k) % c.world;
            // SAFETY: every rank's registered output holds `total` bytes at `outs[q]`; only
            // this rank writes chunk `me` of it during the call.
            unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), outs[q].cast::<u8>().add(off), valid)
            };
        }
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}

/// Raw pointer of a scratch base, for building argument blocks.
pub(crate) fn void_ptr(p: oxccl_hal::DevicePtr) -> *mut c_void {
    p.0 as usize as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_block_has_no_padding() {
        assert_eq!(size_of::<OxcclAllreduceArgs>(), 280);
        let a = OxcclAllreduceArgs::default();
        assert_eq!(args_bytes(&a).len(), 280);
        assert!(parse(&[0u8; 279], "k").is_err());
    }

    #[test]
    fn flags_are_never_zero() {
        assert_eq!(flag_of(0), 1);
        assert_eq!(flag_of(0xffff_fffe), 0xffff_ffff);
        assert_eq!(flag_of(0xffff_ffff), 1);
    }
}
