//! What the host stand-ins of the scratch-protocol algorithms share: the host backend runs
//! each algorithm's kernel as a host function (in the algorithm's file under
//! [`crate::algorithms`]) with the same name, the same argument block
//! ([`OxcclAllreduceArgs`]) and the same protocol as `kernels/src/device/allreduce.cu`
//! (LL16 packets and LL128 lines with epoch flags, per-block barriers through the INBOUND
//! counters, the epoch advanced at the end), so CI exercises the cross-process protocol
//! without a GPU. This module holds the pieces they share; it knows no algorithm.
//!
//! One host thread does the whole grid's work. Device pointers are host addresses; the
//! scratch allocations are shared memfd mappings, so peers in other processes see the same
//! bytes. Every word other ranks touch is accessed through atomics.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oxccl_hal::{AccumType, DataType, Error, LaunchConfig, ReduceOp, Result};
use oxccl_kernels::abi::{
    self, OxcclAllreduceArgs, OXCCL_ALLREDUCE_ERR_ABORTED, OXCCL_ALLREDUCE_ERR_TIMEOUT,
    OXCCL_ALLREDUCE_MAX_BLOCKS, OXCCL_ALLREDUCE_MAX_RANKS, OXCCL_ALLREDUCE_SYNC_EPOCH,
    OXCCL_ALLREDUCE_SYNC_ERROR, OXCCL_ALLREDUCE_SYNC_EXPECTED, OXCCL_ALLREDUCE_SYNC_INBOUND,
    OXCCL_ALLREDUCE_SYNC_MAILBOX_SEEN, OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ, OXCCL_HOST_WORD_FAILURE,
};
use oxccl_kernels::{formats, reduce};

/// A checked view of a scratch-protocol argument block.
pub(crate) struct Call {
    pub(crate) a: OxcclAllreduceArgs,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    /// Bytes of one rank's buffer.
    pub(crate) total: usize,
    /// Ranks.
    pub(crate) world: usize,
    /// This rank.
    pub(crate) me: usize,
    deadline: Option<Instant>,
    kernel: &'static str,
}

impl Call {
    pub(crate) fn new(bytes: &[u8], kernel: &'static str) -> Result<Call> {
        Self::from_args(abi::parse_args(bytes, kernel)?, kernel)
    }

    /// The checks of [`Call::new`] on a block already parsed (the first part of a larger
    /// block: all_to_all_v's).
    pub(crate) fn from_args(a: OxcclAllreduceArgs, kernel: &'static str) -> Result<Call> {
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
        let call = Call {
            a,
            dtype,
            op,
            accum,
            total,
            world,
            me,
            deadline,
            kernel,
        };
        // An earlier call of this communicator failed (its peers are out of step): fail
        // at once instead of waiting out the bound again, as the device kernels do.
        let earlier = call
            .word(me, u64::from(OXCCL_ALLREDUCE_SYNC_ERROR))
            .load(Ordering::Relaxed);
        if earlier & 0xffff_ffff == u64::from(OXCCL_ALLREDUCE_ERR_ABORTED) || call.aborted() {
            return Err(Error::Aborted(format!(
                "{kernel}: not run, the communicator of rank {me} was aborted"
            )));
        }
        if earlier != 0 {
            return Err(Error::Timeout {
                what: format!(
                    "{kernel}: not run, an earlier call of this communicator failed waiting \
                     for rank {} (the communicator must be dropped)",
                    earlier >> 32
                ),
                waited: Duration::ZERO,
            });
        }
        Ok(call)
    }

    /// The call's element type, op and accumulation type.
    pub(crate) fn types(&self) -> (DataType, ReduceOp, AccumType) {
        (self.dtype, self.op, self.accum)
    }

    /// Every rank's registered output as mapped here (`peer_output`, which the direct
    /// kernels store into), or why the call cannot use them: one is missing, or this rank's
    /// is not its output.
    pub(crate) fn peer_outputs(&self) -> Result<[*mut c_void; OXCCL_ALLREDUCE_MAX_RANKS as usize]> {
        let outs = self.a.peer_output;
        if outs[..self.world].iter().any(|p| p.is_null()) || outs[self.me] != self.a.output {
            return Err(Error::InvalidArgument(format!(
                "{}: missing registered peer outputs",
                self.kernel
            )));
        }
        Ok(outs)
    }

    /// Every rank's registered input as mapped here (`peer_input`, which the direct kernels
    /// load from), or why the call cannot use them (as [`Call::peer_outputs`]).
    pub(crate) fn peer_inputs(
        &self,
    ) -> Result<[*const c_void; OXCCL_ALLREDUCE_MAX_RANKS as usize]> {
        let ins = self.a.peer_input;
        if ins[..self.world].iter().any(|p| p.is_null()) || ins[self.me] != self.a.input {
            return Err(Error::InvalidArgument(format!(
                "{}: missing registered peer inputs",
                self.kernel
            )));
        }
        Ok(ins)
    }

    pub(crate) fn scratch(&self, rank: usize) -> *mut u8 {
        self.a.scratch[rank].cast::<u8>()
    }

    /// The sync word at `offset` of `rank`'s scratch.
    pub(crate) fn word(&self, rank: usize, offset: u64) -> &AtomicU64 {
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

    /// Whether the communicator's abort word (`abort_flag`, null: none) is set.
    pub(crate) fn aborted(&self) -> bool {
        aborted(self.a.abort_flag)
    }

    /// Whether a wait must end: its bound has passed or the communicator was aborted (the
    /// device kernels' `Deadline::expired`; [`Call::fail`] says which).
    pub(crate) fn expired(&self) -> bool {
        self.aborted() || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Records the failure of a wait for `peer` that [`Call::expired`] ended, as the device
    /// kernels do (`OXCCL_ALLREDUCE_ERR_ABORTED` or `_TIMEOUT` with the peer), and returns
    /// it as an error.
    pub(crate) fn fail(&self, peer: usize, what: &str) -> Error {
        let aborted = self.aborted();
        let err = self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_ERROR));
        let kind = if aborted {
            OXCCL_ALLREDUCE_ERR_ABORTED
        } else {
            OXCCL_ALLREDUCE_ERR_TIMEOUT
        };
        let code = u64::from(kind) | ((peer as u64) << 32);
        record_failure(err, self.a.abort_flag, code);
        if aborted {
            return Error::Aborted(format!(
                "{}: the communicator of rank {} was aborted while it waited for rank {peer} \
                 ({what})",
                self.kernel, self.me
            ));
        }
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
    pub(crate) fn load_input(&self, off: usize) -> [u8; 16] {
        // SAFETY: launch contract: the input holds `total` bytes.
        unsafe { read_unit(self.a.input, self.total, off) }
    }

    /// Stores the part of `v` that falls inside the output.
    pub(crate) fn store_output(&self, off: usize, v: &[u8; 16]) {
        // SAFETY: launch contract: the output holds `total` bytes, and only this kernel
        // writes it while it runs.
        unsafe { write_unit(self.a.output, self.total, off, v) }
    }

    /// The call's root rank (broadcast, reduce), checked against the world.
    pub(crate) fn root(&self) -> Result<usize> {
        let root = self.a.root as usize;
        if root >= self.world {
            return Err(Error::InvalidArgument(format!(
                "{}: root {root} of world {}",
                self.kernel, self.world
            )));
        }
        Ok(root)
    }

    /// Bytes [off, off + 16) of chunk `r` of an input of `world` chunks of `total` bytes
    /// (reduce-scatter, all-to-all); bytes past the chunk are zero.
    pub(crate) fn load_input_chunk(&self, r: usize, off: usize) -> [u8; 16] {
        let base = self.a.input.cast::<u8>().wrapping_add(r * self.total);
        // SAFETY: launch contract of the chunked kernels: the input holds `world * total`
        // bytes, chunk r < world is [r * total, (r + 1) * total) of it.
        unsafe { read_unit(base.cast(), self.total, off) }
    }

    /// Slot `r` of an output of `world` slots of `total` bytes (all-gather, all-to-all).
    pub(crate) fn output_slot(&self, r: usize) -> *mut c_void {
        self.a
            .output
            .cast::<u8>()
            .wrapping_add(r * self.total)
            .cast()
    }

    /// Stores the part of `v` inside slot `r` of the output at byte `off` of the slot.
    pub(crate) fn store_output_slot(&self, r: usize, off: usize, v: &[u8; 16]) {
        // SAFETY: launch contract of the slotted kernels: the output holds `world * total`
        // bytes, slot r < world is [r * total, (r + 1) * total) of it, and only this call
        // writes it while it runs.
        unsafe { write_unit(self.output_slot(r), self.total, off, v) }
    }

    /// Reduces one 16-byte unit of every rank, in rank order, bit for bit as the device.
    pub(crate) fn reduce_unit(&self, inputs: &[[u8; 16]], valid: usize) -> Result<[u8; 16]> {
        reduce_unit(self.dtype, self.op, self.accum, inputs, valid)
    }

    /// The call's flag and the byte offset of its parity half of the flag-protocol region
    /// (`packet_offset`: LL16 packets or LL128 lines), after checking that `world` slots
    /// of `slot` bytes fit one half.
    pub(crate) fn flagged_half(&self, slot: usize) -> Result<(u32, usize)> {
        self.check_half(slot)?;
        let epoch = self
            .word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_EPOCH))
            .load(Ordering::Acquire);
        let half = (self.a.packet_offset + (epoch & 1) * self.a.packet_half_bytes) as usize;
        Ok((flag_of(epoch), half))
    }

    /// Whether `world` slots of `slot` bytes fit one half of the flag-protocol region.
    fn check_half(&self, slot: usize) -> Result<()> {
        if self.world > 1 && self.world * slot > self.a.packet_half_bytes as usize {
            return Err(Error::InvalidArgument(format!(
                "{}: {} bytes x {} ranks do not fit a half of {} bytes",
                self.kernel, self.total, self.world, self.a.packet_half_bytes
            )));
        }
        Ok(())
    }

    /// Advances the epoch, as block 0 of a device kernel does (one host thread is the
    /// whole grid here, so there are no blocks to count in DONE).
    pub(crate) fn finish(&self) {
        self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_EPOCH))
            .fetch_add(1, Ordering::Release);
    }

    /// The mailbox call's number (MAILBOX_SEQ, abi_allreduce.h), its flag and the byte
    /// offset of its half of the mailbox (`packet_offset`), after checking that `world`
    /// slots of `slot` bytes fit one half.
    pub(crate) fn mailbox_half(&self, slot: usize) -> Result<(u64, u32, usize)> {
        self.check_half(slot)?;
        let seq = self
            .word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ))
            .load(Ordering::Acquire);
        let half = (self.a.packet_offset + (seq & 1) * self.a.packet_half_bytes) as usize;
        Ok((seq, flag_of(seq), half))
    }

    /// Tells every peer this rank has started mailbox call `seq` (its MAILBOX_SEEN word in
    /// each peer's scratch): it reads no earlier call's packets any more.
    pub(crate) fn publish_mailbox_start(&self, seq: u64) {
        for p in (0..self.world).filter(|p| *p != self.me) {
            self.mailbox_seen(p, self.me)
                .store(seq + 1, Ordering::Release);
        }
    }

    /// Waits until `root` has started mailbox call `seq - 1`, so it reads no packets of
    /// call `seq - 2`, which call `seq` overwrites.
    pub(crate) fn wait_mailbox_free(&self, root: usize, seq: u64) -> Result<()> {
        let seen = self.mailbox_seen(self.me, root);
        self.wait_at_least(seen, seq, root, "the root's previous one-shot reduce")
    }

    /// Polls `word` (acquire) until it holds at least `want`, or fails naming `peer` and
    /// `what` once the wait expired (the barrier's and the mailbox's waits).
    fn wait_at_least(&self, word: &AtomicU64, want: u64, peer: usize, what: &str) -> Result<()> {
        let mut polls = 0u32;
        while word.load(Ordering::Acquire) < want {
            if self.expired() {
                return Err(self.fail(peer, what));
            }
            backoff(&mut polls);
        }
        Ok(())
    }

    /// Word `of` of MAILBOX_SEEN in `rank`'s scratch.
    fn mailbox_seen(&self, rank: usize, of: usize) -> &AtomicU64 {
        self.word(
            rank,
            u64::from(OXCCL_ALLREDUCE_SYNC_MAILBOX_SEEN) + of as u64 * 8,
        )
    }

    /// Advances MAILBOX_SEQ, the mailbox calls' counter ([`Call::finish`] for the epoch).
    pub(crate) fn finish_mailbox(&self) {
        self.word(self.me, u64::from(OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ))
            .fetch_add(1, Ordering::Release);
    }
}

/// Records a failure word (code | peer << 32) in `err`, a scratch's error word, unless one
/// is there already, and mirrors it into the communicator's host failure word, unless one
/// is there already (the device kernels' `report`): `host_words` is an argument block's
/// `abort_flag` (null: none). Every host stand-in records its failures through here.
pub(crate) fn record_failure(err: &AtomicU64, host_words: *const u64, word: u64) {
    let _ = err.compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed);
    if host_words.is_null() {
        return;
    }
    // SAFETY: launch contract of every block that carries `abort_flag`: non-null, it is
    // the communicator's OXCCL_HOST_WORDS host words (8-byte aligned, a page of their own)
    // that outlive the kernel and are only accessed atomically.
    let failure =
        unsafe { AtomicU64::from_ptr(host_words.add(OXCCL_HOST_WORD_FAILURE as usize).cast_mut()) };
    let _ = failure.compare_exchange(0, word, Ordering::Release, Ordering::Relaxed);
}

/// Whether the abort word at `flag` (an argument block's `abort_flag`; null: none) is set.
/// Every host stand-in with bounded waits reads it through here.
pub(crate) fn aborted(flag: *const u64) -> bool {
    if flag.is_null() {
        return false;
    }
    // SAFETY: launch contract of every block that carries `abort_flag`: non-null, it is
    // the communicator's abort word, 8 bytes of host-visible memory (8-byte aligned: a
    // page of its own) that outlive the kernel and are only accessed atomically (the
    // communicator sets it with a release store).
    unsafe { AtomicU64::from_ptr(flag.cast_mut()) }.load(Ordering::Acquire) != 0
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
    let mut bits = [0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize];
    for lane in 0..valid.div_ceil(dtype.size()) {
        for (slot, input) in bits.iter_mut().zip(inputs) {
            *slot = formats::read_element(dtype, input, lane).unwrap_or_default();
        }
        let r = reduce::reduce_element(dtype, op, accum, &bits[..inputs.len()])?;
        formats::write_element(dtype, &mut out, lane, r);
    }
    Ok(out)
}

pub(crate) fn flag_of(epoch: u64) -> u32 {
    (epoch % 0xffff_ffff) as u32 + 1
}

/// The LL16 packet at byte `off` of `base` as four atomic words.
///
/// # Safety
/// `base + off` must be a live, 16-byte aligned packet in a scratch packet region.
pub(crate) unsafe fn packet<'a>(base: *mut u8, off: usize) -> [&'a AtomicU32; 4] {
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
pub(crate) fn ll16_write(p: [&AtomicU32; 4], d1: u32, d2: u32, flag: u32) {
    p[0].store(d1, Ordering::Relaxed);
    p[2].store(d2, Ordering::Relaxed);
    p[1].store(flag, Ordering::Release);
    p[3].store(flag, Ordering::Release);
}

pub(crate) fn ll16_try_read(p: [&AtomicU32; 4], flag: u32) -> Option<(u32, u32)> {
    if p[1].load(Ordering::Acquire) == flag && p[3].load(Ordering::Acquire) == flag {
        Some((p[0].load(Ordering::Relaxed), p[2].load(Ordering::Relaxed)))
    } else {
        None
    }
}

/// Writes unit `v` as its two LL16 packets at byte `off` of `to`'s scratch.
///
/// # Safety
/// `off` must address two packets of `to`'s flag-protocol region, inside its scratch.
pub(crate) unsafe fn ll16_write_unit(c: &Call, to: usize, off: usize, v: &[u8; 16], flag: u32) {
    let w = words(v);
    // SAFETY: the caller's obligation; scratch bases are live for the call.
    let (p0, p1) = unsafe { (packet(c.scratch(to), off), packet(c.scratch(to), off + 16)) };
    ll16_write(p0, w[0], w[1], flag);
    ll16_write(p1, w[2], w[3], flag);
}

/// The unit rank `from` wrote as two LL16 packets at byte `off` of this rank's scratch,
/// once both carry the call's flag; a timeout (or an abort) names `from`.
///
/// # Safety
/// `off` must address two packets of this rank's flag-protocol region.
pub(crate) unsafe fn ll16_read_unit(
    c: &Call,
    off: usize,
    from: usize,
    flag: u32,
) -> Result<[u8; 16]> {
    // SAFETY: the caller's obligation.
    let (p0, p1) = unsafe {
        (
            packet(c.scratch(c.me), off),
            packet(c.scratch(c.me), off + 16),
        )
    };
    let mut polls = 0u32;
    let (a, b) = ll16_wait(c, p0, from, flag, "one-shot packets", &mut polls)?;
    let (d, e) = ll16_wait(c, p1, from, flag, "one-shot packets", &mut polls)?;
    Ok(unwords([a, b, d, e]))
}

/// Polls packet `p` until it carries `flag` and returns its data, or fails naming `from`
/// and `what` once the wait expired; `polls` carries the backoff across waits.
fn ll16_wait(
    c: &Call,
    p: [&AtomicU32; 4],
    from: usize,
    flag: u32,
    what: &str,
    polls: &mut u32,
) -> Result<(u32, u32)> {
    loop {
        if let Some(v) = ll16_try_read(p, flag) {
            return Ok(v);
        }
        if c.expired() {
            return Err(c.fail(from, what));
        }
        backoff(polls);
    }
}

/// The epoch one-shots' acknowledgement (`ll16_ack` in allreduce_device.hpp): the first
/// packet of unit 0 of this rank's slot (`slot` bytes per rank) in `to`'s current half,
/// written to a peer this call sends no data.
///
/// # Safety
/// `half + world * slot` must lie inside `to`'s flag-protocol region.
pub(crate) unsafe fn ll16_ack(c: &Call, to: usize, half: usize, slot: usize, flag: u32) {
    // SAFETY: the caller's obligation; scratch bases are live for the call.
    let p = unsafe { packet(c.scratch(to), half + c.me * slot) };
    ll16_write(p, 0, 0, flag);
}

/// Waits for the acknowledgement (`ll16_ack`) of rank `from` in this rank's half.
///
/// # Safety
/// As [`ll16_ack`], for this rank's own region.
pub(crate) unsafe fn ll16_wait_ack(
    c: &Call,
    from: usize,
    half: usize,
    slot: usize,
    flag: u32,
) -> Result<()> {
    // SAFETY: the caller's obligation.
    let p = unsafe { packet(c.scratch(c.me), half + from * slot) };
    ll16_wait(c, p, from, flag, "one-shot acknowledgement", &mut 0).map(|_| ())
}

pub(crate) fn words(v: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]);
    [w(0), w(1), w(2), w(3)]
}

pub(crate) fn unwords(w: [u32; 4]) -> [u8; 16] {
    let mut v = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        v[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Polls with a short spin, then yields: peers are processes on the same cores.
pub(crate) fn backoff(polls: &mut u32) {
    *polls = polls.saturating_add(1);
    if *polls < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Barrier with every peer for blocks `0..blocks` (one host thread plays every block).
pub(crate) fn barrier(c: &Call, blocks: usize) -> Result<()> {
    for b in 0..blocks {
        for p in (0..c.world).filter(|p| *p != c.me) {
            c.inbound(p, b, c.me).fetch_add(1, Ordering::AcqRel);
        }
    }
    for b in 0..blocks {
        for p in (0..c.world).filter(|p| *p != c.me) {
            let expected = c.expected(b, p);
            let want = expected.load(Ordering::Relaxed) + 1;
            c.wait_at_least(c.inbound(c.me, b, p), want, p, "two-shot barrier")?;
            expected.store(want, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The staging geometry of both staging kernels (`Rounds` in allreduce.cu): a message
/// that fits takes one round; a larger one equal rounds of `world` slots of `cap` units,
/// the shorter last round using the same slot positions. Returns (cap, round bytes).
pub(crate) fn rounds(c: &Call, kernel: &str) -> Result<(usize, usize)> {
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

/// Units of each rank's slot per round of the staged kernels of all-gather and
/// reduce-scatter (`Rounds` in allgather.cu and reducescatter.cu): `world` slots of at most
/// the staging, in equal rounds over `units`.
pub(crate) fn equal_rounds(c: &Call, units: usize, kernel: &str) -> Result<usize> {
    let cap_max = c.a.data_bytes as usize / (16 * c.world);
    if cap_max == 0 {
        return Err(Error::InvalidArgument(format!(
            "{kernel}: staging of {} bytes holds no unit per rank",
            c.a.data_bytes
        )));
    }
    let rounds = units.div_ceil(cap_max);
    Ok(units.div_ceil(rounds.max(1)))
}

/// The relay kernels' geometry (`RelayRounds` in allreduce_device.hpp): one chunk per rank
/// other than the root, each in equal rounds of at most half the staging over the chunks.
/// One host thread plays every block, so a round's part is the whole round.
pub(crate) struct RelayRounds {
    /// One per rank but the root (one on a single rank).
    pub(crate) chunks: usize,
    units: usize,
    chunk: usize,
    pub(crate) rounds: usize,
    pub(crate) per_round: usize,
}

impl RelayRounds {
    pub(crate) fn new(c: &Call, kernel: &str) -> Result<RelayRounds> {
        let chunks = c.world.saturating_sub(1).max(1);
        let cap = c.a.data_bytes as usize / (32 * chunks);
        if cap == 0 {
            return Err(Error::InvalidArgument(format!(
                "{kernel}: staging of {} bytes holds no unit per chunk",
                c.a.data_bytes
            )));
        }
        let units = c.total.div_ceil(16);
        let chunk = units.div_ceil(chunks);
        let rounds = chunk.div_ceil(cap).max(1);
        Ok(RelayRounds {
            chunks,
            units,
            chunk,
            rounds,
            per_round: chunk.div_ceil(rounds),
        })
    }

    /// Units of chunk `i`'s round `r`.
    pub(crate) fn round(&self, i: usize, r: usize) -> std::ops::Range<usize> {
        let c_lo = (i * self.chunk).min(self.units);
        let c_hi = (c_lo + self.chunk).min(self.units);
        let lo = (c_lo + r * self.per_round).min(c_hi);
        lo..(lo + self.per_round).min(c_hi)
    }
}

/// The relay kernels' chunk of `me`: the k-th rank after the root relays chunk k - 1.
pub(crate) fn relay_chunk(me: usize, root: usize, world: usize) -> usize {
    (me + world - root - 1) % world
}

/// The rank that relays chunk `i`.
pub(crate) fn relay_rank(i: usize, root: usize, world: usize) -> usize {
    (root + 1 + i) % world
}

/// The blocks of a launch whose blocks each barrier with their peers (the two-shots).
pub(crate) fn barrier_blocks(config: &LaunchConfig) -> usize {
    (config.grid[0] as usize).clamp(1, OXCCL_ALLREDUCE_MAX_BLOCKS as usize)
}

/// Copies 16 bytes from `src` to `dst`.
///
/// # Safety
/// Both must be valid for 16 bytes.
pub(crate) unsafe fn copy16(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller's obligations.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, 16) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_never_zero() {
        assert_eq!(flag_of(0), 1);
        assert_eq!(flag_of(0xffff_fffe), 0xffff_ffff);
        assert_eq!(flag_of(0xffff_ffff), 1);
    }
}
