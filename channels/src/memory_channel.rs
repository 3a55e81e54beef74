//! MemoryChannel: GPU threads read and write the peer's buffer directly.
//!
//! [`MemoryChannel::connect`] exchanges the registrations of this rank's buffer (and
//! optionally its packet buffer) with the peer, maps the peer's through IPC and builds the
//! device-to-device semaphore; [`MemoryChannel::handle`] is the `OxcclMemoryChannel`
//! device handle that `memory_channel_device.hpp` operates on.
//!
//! [`host_ops`] holds the same operations in Rust over the same handle, with the same
//! packet layout: the host backend's kernels ([`crate::host_kernels`]) run them, so the
//! protocol (not only the setup) is tested in CI.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use oxccl_backend::AnyDevice;
//! # use oxccl_hal::{Device, MemoryKind};
//! # use oxccl_channels::{bootstrap::Bootstrap, memory_channel::MemoryChannel};
//! # use oxccl_channels::connection::{Transport, TransportSet};
//! # use oxccl_channels::registered_memory::RegisteredMemory;
//! # fn f(bootstrap: &Bootstrap, device: &AnyDevice) -> oxccl_hal::Result<()> {
//! let ipc = TransportSet::of(&[Transport::Ipc]);
//! let buf = Arc::new(device.alloc(1 << 20, MemoryKind::Physical)?);
//! let local = RegisteredMemory::new(device, bootstrap.rank(), buf, ipc)?;
//! let peer = 1 - bootstrap.rank();
//! let channel = MemoryChannel::connect(bootstrap, device, peer, &local, None, 7)?;
//! let handle = channel.handle()?; // pass it to a kernel in its argument block
//! # Ok(()) }
//! ```

use oxccl_backend::AnyDevice;
use oxccl_hal::{Error, Result};
use oxccl_kernels::abi::{self, OxcclMemoryChannel};

use crate::bootstrap::Bootstrap;
use crate::registered_memory::{RegisteredMemory, RemoteMemory};
use crate::semaphore::{swap_registrations, DeviceSemaphore};

/// A MemoryChannel to one peer: the registrations it uses and its semaphore.
#[derive(Debug)]
pub struct MemoryChannel {
    peer: u32,
    semaphore: DeviceSemaphore,
    local: RegisteredMemory,
    remote: RemoteMemory,
    packets: Option<(RegisteredMemory, RemoteMemory)>,
}

fn mapped(remote: &RemoteMemory, what: &str) -> Result<RemoteMemory> {
    if remote.ptr().is_none() {
        return Err(Error::Unsupported(format!(
            "rank {}'s {what} is not mapped here (another node or backend, or not registered \
             for IPC): a MemoryChannel needs same-node IPC",
            remote.rank()
        )));
    }
    Ok(remote.clone())
}

impl MemoryChannel {
    /// Connects this rank's `local` buffer (and `packets`, its packet buffer, if any) with
    /// the peer's buffers of the same call. Collective between the two ranks; uses the
    /// bootstrap tags `tag`, `tag + 1` and `tag + 2`.
    pub fn connect(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        peer: u32,
        local: &RegisteredMemory,
        packets: Option<&RegisteredMemory>,
        tag: u32,
    ) -> Result<MemoryChannel> {
        let rank = bootstrap.rank();
        let _span = tracing::debug_span!("memory_channel", rank, peer).entered();
        let remote = swap_registrations(bootstrap, device, peer, tag, local)?;
        let remote = mapped(&remote, "buffer").map_err(|e| e.at_rank(rank))?;
        // Both ranks say whether they have a packet buffer, so a mismatch is an error on
        // both sides rather than a hang on one.
        let mine = u8::from(packets.is_some());
        bootstrap.send(peer, tag.wrapping_add(1), &[mine])?;
        let theirs = bootstrap.recv(peer, tag.wrapping_add(1))?;
        if theirs.as_slice() != [mine] {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} {} a packet buffer for its MemoryChannel with rank {peer}, which \
                 does not",
                if packets.is_some() { "has" } else { "has no" }
            ))
            .at_rank(rank));
        }
        let packets = match packets {
            Some(p) => {
                if p.ptr().0 % 16 != 0 {
                    return Err(Error::InvalidArgument(
                        "the packet buffer must be 16-byte aligned".into(),
                    ));
                }
                let r = swap_registrations(bootstrap, device, peer, tag.wrapping_add(1), p)?;
                Some((
                    p.clone(),
                    mapped(&r, "packet buffer").map_err(|e| e.at_rank(rank))?,
                ))
            }
            None => None,
        };
        let semaphore = DeviceSemaphore::connect(bootstrap, device, peer, tag.wrapping_add(2))?;
        Ok(MemoryChannel {
            peer,
            semaphore,
            local: local.clone(),
            remote,
            packets,
        })
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The channel's semaphore (e.g. to change its spin limit).
    pub fn semaphore_mut(&mut self) -> &mut DeviceSemaphore {
        &mut self.semaphore
    }

    /// Length of the peer's buffer.
    pub fn remote_len(&self) -> usize {
        self.remote.len()
    }

    /// The device handle (valid while `self` lives).
    pub fn handle(&self) -> Result<OxcclMemoryChannel> {
        let remote = self
            .remote
            .ptr()
            .ok_or_else(|| Error::Unsupported("peer buffer not mapped".into()))?;
        let (local_packets, remote_packets) = match &self.packets {
            Some((l, r)) => (
                abi::ptr(l.ptr()),
                abi::ptr(
                    r.ptr()
                        .ok_or_else(|| Error::Unsupported("peer packets not mapped".into()))?,
                ),
            ),
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        Ok(OxcclMemoryChannel {
            semaphore: self.semaphore.handle()?,
            remote: abi::ptr(remote),
            local: abi::ptr(self.local.ptr()),
            remote_packets,
            local_packets,
        })
    }
}

/// The device operations of `memory_channel_device.hpp` on the host (host backend).
///
/// Every function is `unsafe`: the handle must be one of a live [`MemoryChannel`] of the
/// host backend, the ranges must lie inside the buffers, and the protocol (signals,
/// packet flags) must keep the two sides from touching the same bytes at once. Data calls
/// take the caller's share `(tid, nthreads)` like the device's cooperative calls.
pub mod host_ops {
    use std::sync::atomic::{AtomicU64, Ordering};

    use oxccl_hal::{Error, Result};
    use oxccl_kernels::abi::OxcclMemoryChannel;

    use crate::semaphore::{host_relaxed_signal, host_signal, host_wait};

    /// Bytes of data in one LL16 packet.
    pub const LL16_DATA: usize = 8;
    /// Bytes of data in one LL8 packet.
    pub const LL8_DATA: usize = 4;

    fn spins_exceeded(what: &str, index: usize) -> Error {
        Error::Timeout {
            what: format!("{what} packet {index}"),
            waited: std::time::Duration::ZERO,
        }
    }

    /// Copies this thread's share of `bytes` bytes (the device splits by 16-byte vectors;
    /// the host by contiguous ranges, which moves the same bytes).
    ///
    /// # Safety
    /// Both ranges must be live for `bytes` bytes and must not overlap.
    unsafe fn copy_share(dst: *mut u8, src: *const u8, bytes: usize, tid: usize, n: usize) {
        let n = n.max(1);
        let per = bytes.div_ceil(n);
        let start = (tid * per).min(bytes);
        let end = (start + per).min(bytes);
        if end > start {
            // SAFETY: the caller's obligations; [start, end) is inside [0, bytes).
            unsafe { std::ptr::copy_nonoverlapping(src.add(start), dst.add(start), end - start) };
        }
    }

    /// `put`: local[src..+bytes] to the peer's remote[dst..].
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn put(
        h: &OxcclMemoryChannel,
        dst: u64,
        src: u64,
        bytes: u64,
        tid: usize,
        n: usize,
    ) {
        // SAFETY: the caller's obligations.
        unsafe {
            copy_share(
                h.remote.cast::<u8>().add(dst as usize),
                h.local.cast::<u8>().add(src as usize),
                bytes as usize,
                tid,
                n,
            )
        }
    }

    /// `get`: the peer's remote[src..+bytes] to local[dst..].
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn get(
        h: &OxcclMemoryChannel,
        dst: u64,
        src: u64,
        bytes: u64,
        tid: usize,
        n: usize,
    ) {
        // SAFETY: the caller's obligations.
        unsafe {
            copy_share(
                h.local.cast::<u8>().add(dst as usize),
                h.remote.cast::<u8>().add(src as usize),
                bytes as usize,
                tid,
                n,
            )
        }
    }

    /// Little-endian value of up to 8 bytes at `p` (the rest zero).
    ///
    /// # Safety
    /// `p` must be readable for `len <= 8` bytes.
    unsafe fn load_partial(p: *const u8, len: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: the caller's obligations.
        unsafe { std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), len.min(8)) };
        u64::from_le_bytes(b)
    }

    /// Writes the low `len <= 8` bytes of `v` at `p`.
    ///
    /// # Safety
    /// `p` must be writable for `len` bytes.
    unsafe fn store_partial(p: *mut u8, v: u64, len: usize) {
        let b = v.to_le_bytes();
        // SAFETY: the caller's obligations.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, len.min(8)) };
    }

    /// One 8-byte packet word: `data` in the low half, `flag` in the high half (the
    /// little-endian image of `{data, flag}`, as the device writes it).
    fn word(data: u32, flag: u32) -> u64 {
        u64::from(data) | (u64::from(flag) << 32)
    }

    /// `put_packets_ll16`: every 8 data bytes become one LL16 packet `{d1, flag, d2, flag}`
    /// at byte `packet_offset` of the peer's packet buffer. Each half carries its own flag,
    /// so two atomic 8-byte stores are as good as the device's one 16-byte store.
    ///
    /// # Safety
    /// See the module documentation; `packet_offset` must be 16-byte aligned.
    pub unsafe fn put_packets_ll16(
        h: &OxcclMemoryChannel,
        packet_offset: u64,
        src: u64,
        bytes: u64,
        flag: u32,
        tid: usize,
        n: usize,
    ) {
        let bytes = bytes as usize;
        let count = bytes.div_ceil(LL16_DATA);
        // SAFETY: the caller's obligations.
        let (base, data) = unsafe {
            (
                h.remote_packets.cast::<u8>().add(packet_offset as usize),
                h.local.cast::<u8>().add(src as usize),
            )
        };
        for i in (tid..count).step_by(n.max(1)) {
            let len = (bytes - i * LL16_DATA).min(LL16_DATA);
            // SAFETY: inside the source range.
            let v = unsafe { load_partial(data.add(i * LL16_DATA), len) };
            // SAFETY: packet i of the peer's live packet buffer, 16-byte aligned; packet
            // words are only ever accessed atomically by the protocol.
            unsafe {
                let p = base.add(i * 16).cast::<u64>();
                AtomicU64::from_ptr(p).store(word(v as u32, flag), Ordering::Release);
                AtomicU64::from_ptr(p.add(1))
                    .store(word((v >> 32) as u32, flag), Ordering::Release);
            }
        }
    }

    /// `get_packets_ll16`: waits for each packet of this thread's share to carry `flag`
    /// (at most the semaphore's spin limit of polls per packet) and writes its data to
    /// local[dst..].
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn get_packets_ll16(
        h: &OxcclMemoryChannel,
        packet_offset: u64,
        dst: u64,
        bytes: u64,
        flag: u32,
        tid: usize,
        n: usize,
    ) -> Result<()> {
        let bytes = bytes as usize;
        let count = bytes.div_ceil(LL16_DATA);
        // SAFETY: the caller's obligations.
        let (base, out) = unsafe {
            (
                h.local_packets.cast::<u8>().add(packet_offset as usize),
                h.local.cast::<u8>().add(dst as usize),
            )
        };
        for i in (tid..count).step_by(n.max(1)) {
            // SAFETY: packet i of this rank's live packet buffer, accessed atomically.
            let (lo, hi) = unsafe {
                let p = base.add(i * 16).cast::<u64>();
                (AtomicU64::from_ptr(p), AtomicU64::from_ptr(p.add(1)))
            };
            let mut polls = 0u64;
            let (a, b) = loop {
                let (a, b) = (lo.load(Ordering::Acquire), hi.load(Ordering::Acquire));
                if (a >> 32) as u32 == flag && (b >> 32) as u32 == flag {
                    break (a, b);
                }
                polls += 1;
                if h.semaphore.max_spins != 0 && polls >= h.semaphore.max_spins {
                    return Err(spins_exceeded("LL16", i));
                }
                if polls > 1024 {
                    std::thread::yield_now();
                }
            };
            let v = (a & 0xffff_ffff) | (b << 32);
            let len = (bytes - i * LL16_DATA).min(LL16_DATA);
            // SAFETY: inside the destination range.
            unsafe { store_partial(out.add(i * LL16_DATA), v, len) };
        }
        Ok(())
    }

    /// `put_packets_ll8`: every 4 data bytes become one LL8 packet `{data, flag}`.
    ///
    /// # Safety
    /// See the module documentation; `packet_offset` must be 8-byte aligned.
    pub unsafe fn put_packets_ll8(
        h: &OxcclMemoryChannel,
        packet_offset: u64,
        src: u64,
        bytes: u64,
        flag: u32,
        tid: usize,
        n: usize,
    ) {
        let bytes = bytes as usize;
        let count = bytes.div_ceil(LL8_DATA);
        // SAFETY: the caller's obligations.
        let (base, data) = unsafe {
            (
                h.remote_packets.cast::<u8>().add(packet_offset as usize),
                h.local.cast::<u8>().add(src as usize),
            )
        };
        for i in (tid..count).step_by(n.max(1)) {
            let len = (bytes - i * LL8_DATA).min(LL8_DATA);
            // SAFETY: inside the source range.
            let v = unsafe { load_partial(data.add(i * LL8_DATA), len) };
            // SAFETY: packet i of the peer's live packet buffer, accessed atomically.
            unsafe { AtomicU64::from_ptr(base.add(i * 8).cast::<u64>()) }
                .store(word(v as u32, flag), Ordering::Release);
        }
    }

    /// `get_packets_ll8`.
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn get_packets_ll8(
        h: &OxcclMemoryChannel,
        packet_offset: u64,
        dst: u64,
        bytes: u64,
        flag: u32,
        tid: usize,
        n: usize,
    ) -> Result<()> {
        let bytes = bytes as usize;
        let count = bytes.div_ceil(LL8_DATA);
        // SAFETY: the caller's obligations.
        let (base, out) = unsafe {
            (
                h.local_packets.cast::<u8>().add(packet_offset as usize),
                h.local.cast::<u8>().add(dst as usize),
            )
        };
        for i in (tid..count).step_by(n.max(1)) {
            // SAFETY: packet i of this rank's live packet buffer, accessed atomically.
            let cell = unsafe { AtomicU64::from_ptr(base.add(i * 8).cast::<u64>()) };
            let mut polls = 0u64;
            let v = loop {
                let v = cell.load(Ordering::Acquire);
                if (v >> 32) as u32 == flag {
                    break v;
                }
                polls += 1;
                if h.semaphore.max_spins != 0 && polls >= h.semaphore.max_spins {
                    return Err(spins_exceeded("LL8", i));
                }
                if polls > 1024 {
                    std::thread::yield_now();
                }
            };
            let len = (bytes - i * LL8_DATA).min(LL8_DATA);
            // SAFETY: inside the destination range.
            unsafe { store_partial(out.add(i * LL8_DATA), v & 0xffff_ffff, len) };
        }
        Ok(())
    }

    /// `signal`: release add on the peer's counter.
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn signal(h: &OxcclMemoryChannel) {
        // SAFETY: the caller's obligations.
        unsafe { host_signal(&h.semaphore) }
    }

    /// `relaxed_signal`.
    ///
    /// # Safety
    /// See the module documentation.
    pub unsafe fn relaxed_signal(h: &OxcclMemoryChannel) {
        // SAFETY: the caller's obligations.
        unsafe { host_relaxed_signal(&h.semaphore) }
    }

    /// `wait`: the peer's next signal, bounded by the spin limit.
    ///
    /// # Safety
    /// See the module documentation; one waiter per channel at a time.
    pub unsafe fn wait(h: &OxcclMemoryChannel) -> Result<()> {
        let s = &h.semaphore;
        // SAFETY: the caller's obligations.
        unsafe { host_wait(s.inbound, s.expected_inbound, s.max_spins) }
    }

    /// `flush`: a full fence (the host's stores are the transfer).
    pub fn flush() {
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::host_kernels::MEMORY_OP;
    use crate::semaphore::testing::*;
    use oxccl_hal::{Device, Error};
    use oxccl_kernels::abi::{OxcclMemoryChannelArgs, OXCCL_WAIT_OK, OXCCL_WAIT_TIMEOUT};
    use proptest::prelude::*;

    /// Odd sizes and offsets, each round in its own region.
    const SIZES: [usize; 5] = [1, 7, 1000, 4097, 65_539];
    const REGION: usize = 70_000;

    fn tag(a: u32, b: u32) -> u32 {
        1000 + 16 * (a.min(b) * 8 + a.max(b))
    }

    fn args(ch: OxcclMemoryChannel, op: u32) -> OxcclMemoryChannelArgs {
        OxcclMemoryChannelArgs {
            channel: ch,
            op,
            iterations: 1,
            ..Default::default()
        }
    }

    /// Every pair of ranks: put, get and LL16/LL8 packets of random bytes at odd sizes and
    /// offsets, through the host kernels; receivers check byte for byte against poison.
    #[test]
    fn put_get_and_packets_between_all_pairs() {
        for world in [2u32, 3, 4] {
            with_ranks(world, |b, d| {
                let me = b.rank();
                let stream = d.create_stream().unwrap();
                for p in (0..world).filter(|&p| p != me) {
                    let (buf, reg) = buffer(&b, &d, 2 * REGION * SIZES.len());
                    let (_pk, pkreg) = buffer(&b, &d, 16 * (REGION / 4));
                    let ch =
                        MemoryChannel::connect(&b, &d, p, &reg, Some(&pkreg), tag(me, p)).unwrap();
                    let h = ch.handle().unwrap();
                    let (lo, hi) = (me.min(p), me.max(p));
                    for (i, &n) in SIZES.iter().enumerate() {
                        let seed = u64::from(world) << 40
                            | u64::from(lo) << 32
                            | u64::from(hi) << 24
                            | i as u64;
                        let src_off = i * REGION + 3;
                        let dst_off = SIZES.len() * REGION + i * REGION + 5;
                        // lo puts to hi; hi gets from lo's source; then packets hi -> lo.
                        if me == lo {
                            write(&buf, src_off, &random_nonzero(seed, n));
                            let mut a = args(h, abi::OXCCL_MEMORY_OP_PUT);
                            (a.dst_offset, a.src_offset, a.bytes, a.signal_after) =
                                (dst_off as u64, src_off as u64, n as u64, 1);
                            launch(&d, &stream, MEMORY_OP, 3, &a).unwrap();
                        } else {
                            let mut a = args(h, abi::OXCCL_MEMORY_OP_WAIT);
                            a.iterations = 3; // one signal per block
                            launch(&d, &stream, MEMORY_OP, 1, &a).unwrap();
                            assert_eq!(
                                read(&buf, dst_off, n),
                                random_nonzero(seed, n),
                                "put of {n} bytes"
                            );
                            assert_eq!(read(&buf, dst_off + n, 1), [0], "byte after the put");
                            let mut g = args(h, abi::OXCCL_MEMORY_OP_GET);
                            (g.dst_offset, g.src_offset, g.bytes) =
                                (src_off as u64 + 1, src_off as u64, n as u64);
                            launch(&d, &stream, MEMORY_OP, 1, &g).unwrap();
                            assert_eq!(
                                read(&buf, src_off + 1, n),
                                random_nonzero(seed, n),
                                "get of {n} bytes"
                            );
                        }
                        for (put, get, flag) in [
                            (
                                abi::OXCCL_MEMORY_OP_PUT_PACKETS_LL16,
                                abi::OXCCL_MEMORY_OP_GET_PACKETS_LL16,
                                2 * i as u32 + 1,
                            ),
                            (
                                abi::OXCCL_MEMORY_OP_PUT_PACKETS_LL8,
                                abi::OXCCL_MEMORY_OP_GET_PACKETS_LL8,
                                2 * i as u32 + 2,
                            ),
                        ] {
                            let data = random_nonzero(seed ^ u64::from(flag) << 50, n);
                            let off = (SIZES.len() + i) * REGION + 9;
                            if me == hi {
                                write(&buf, off, &data);
                                let mut a = args(h, put);
                                (a.src_offset, a.bytes, a.flag) = (off as u64, n as u64, flag);
                                launch(&d, &stream, MEMORY_OP, 2, &a).unwrap();
                            } else {
                                let mut status = 0u32;
                                let mut a = args(h, get);
                                (a.dst_offset, a.bytes, a.flag, a.status) =
                                    (off as u64, n as u64, flag, &mut status);
                                launch(&d, &stream, MEMORY_OP, 2, &a).unwrap();
                                assert_eq!(status, OXCCL_WAIT_OK);
                                assert_eq!(
                                    read(&buf, off, n),
                                    data,
                                    "packets of {n} bytes, flag {flag}"
                                );
                                assert_eq!(read(&buf, off + n, 1), [0], "byte after the packets");
                            }
                            pair_sync(&b, p); // the packet buffer is reused next round
                        }
                    }
                    pair_sync(&b, p);
                }
            });
        }
    }

    /// Both ranks of a pair pass this point before either goes on (a world barrier would
    /// deadlock: the other ranks are busy with their own pairs).
    fn pair_sync(b: &crate::bootstrap::Bootstrap, peer: u32) {
        b.send(peer, 999, &[]).unwrap();
        b.recv(peer, 999).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, .. ProptestConfig::default() })]
        /// A random schedule of (size, signals) rounds: the sender puts, then signals several
        /// times (some relaxed, the last with release); the receiver waits for all of them
        /// and must see that round's bytes, then acks. Data never overtakes its signal.
        #[test]
        fn signal_wait_ordering_under_random_schedules(
            rounds in proptest::collection::vec((1usize..5000, 1u32..4, any::<bool>()), 1..12)
        ) {
            let rounds = &rounds;
            with_ranks(2, |b, d| {
                let me = b.rank();
                let (buf, reg) = buffer(&b, &d, 16_384);
                let ch = MemoryChannel::connect(&b, &d, 1 - me, &reg, None, 7).unwrap();
                let h = ch.handle().unwrap();
                for (i, &(n, signals, relaxed_first)) in rounds.iter().enumerate() {
                    let data = random_nonzero(i as u64 * 7919 + n as u64, n);
                    // SAFETY (all host_ops calls): live host-backend channel, ranges inside
                    // the 16 KiB buffers, and the signal/ack protocol keeps the sides apart.
                    if me == 0 {
                        write(&buf, 0, &data);
                        // SAFETY: see the comment at the top of the round.
                        unsafe { host_ops::put(&h, 8000, 0, n as u64, 0, 1) };
                        for s in 0..signals {
                            if relaxed_first && s + 1 < signals {
                                // SAFETY: see the comment at the top of the round.
                                unsafe { host_ops::relaxed_signal(&h) };
                            } else {
                                // SAFETY: see the comment at the top of the round.
                                unsafe { host_ops::signal(&h) };
                            }
                        }
                        // SAFETY: see the comment at the top of the round.
                        unsafe { host_ops::wait(&h) }.unwrap();
                    } else {
                        for _ in 0..signals {
                            // SAFETY: see the comment at the top of the round.
                            unsafe { host_ops::wait(&h) }.unwrap();
                        }
                        assert_eq!(read(&buf, 8000, n), data, "round {i}");
                        // SAFETY: see the comment at the top of the round.
                        unsafe { host_ops::signal(&h) };
                    }
                }
            });
        }
    }

    /// A peer that never signals: the wait reports a timeout (status and error), no hang;
    /// a peer that left: setting up with it fails instead of hanging.
    #[test]
    fn missing_signal_times_out_and_dead_peer_is_an_error() {
        let results = with_ranks(2, |b, d| {
            let me = b.rank();
            let (_buf, reg) = buffer(&b, &d, 4096);
            let mut ch = MemoryChannel::connect(&b, &d, 1 - me, &reg, None, 3).unwrap();
            b.barrier().unwrap(); // both sides mapped everything before rank 1 leaves
            if me == 1 {
                drop(b); // rank 1 dies: never signals, leaves the job
                return None;
            }
            ch.semaphore_mut().set_max_spins(20_000);
            let mut status = 0u32;
            let mut a = args(ch.handle().unwrap(), abi::OXCCL_MEMORY_OP_WAIT);
            a.status = &mut status;
            let stream = d.create_stream().unwrap();
            let e = launch(&d, &stream, MEMORY_OP, 1, &a).unwrap_err();
            assert_eq!(status, OXCCL_WAIT_TIMEOUT);
            std::thread::sleep(std::time::Duration::from_millis(200));
            let again = MemoryChannel::connect(&b, &d, 1, &reg, None, 4).unwrap_err();
            Some((e, again))
        });
        let (e, again) = results.into_iter().flatten().next().unwrap();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(
            matches!(again, Error::PeerLost(_) | Error::Timeout { .. })
                || again.to_string().contains("rank 1"),
            "{again}"
        );
    }
}
