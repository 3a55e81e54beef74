//! Connections on the host backend, threads as ranks over the loopback bootstrap.
//!
//! The host backend's memory is real shared memory (memfd), so IPC works between the
//! threads of this process exactly as between processes. Every destination is poisoned
//! with zeros first and every payload byte is random and non-zero, so a byte that did not
//! arrive, arrived twice or landed in the wrong place is seen.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_backend::{AnyDevice, AnyMemory};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::connection::{ib, Connection, Transport, TransportSet};
use oxccl_channels::registered_memory::{exchange, RegisteredMemory, RemoteMemory};
use oxccl_hal::atomics::HostFlag;
use oxccl_hal::host::HostMemory;
use oxccl_hal::{BackendKind, Device, DeviceId, Error, HostVisible, MemoryKind};
use rand::{Rng, SeedableRng};

const WAIT: Duration = Duration::from_secs(30);
/// Sizes each rank writes into every peer, at odd offsets.
const SIZES: [usize; 5] = [1, 3, 1000, 12345, (1 << 20) + 7];
/// Flag words at the start of every destination buffer: one per source rank.
const FLAGS: usize = 64;

fn config() -> BootstrapConfig {
    BootstrapConfig {
        timeout: Duration::from_secs(30),
    }
}

fn device() -> AnyDevice {
    AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap()
}

/// Runs `f(bootstrap, device)` on `world` threads joined to one loopback job.
fn with_ranks<T: Send>(world: u32, f: impl Fn(Bootstrap, AnyDevice) -> T + Sync) -> Vec<T> {
    let cfg = config();
    let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (cfg, f) = (cfg.clone(), &f);
                s.spawn(move || f(Bootstrap::new(&id, rank, world, &cfg).unwrap(), device()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn host(mem: &AnyMemory) -> &HostMemory {
    match mem {
        AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

/// `n` random bytes, none of them zero (zero is the poison).
fn random_nonzero(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    for b in &mut v {
        if *b == 0 {
            *b = 0x5a;
        }
    }
    v
}

/// A copy of `len` bytes at `offset` of host memory (other agents may write elsewhere in it).
fn snapshot(mem: &HostMemory, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= oxccl_hal::Memory::len(mem));
    let mut out = vec![0u8; len];
    // SAFETY: the range is inside the live allocation (asserted); writers of this range
    // have finished (the caller waited for their signal or flush).
    unsafe { std::ptr::copy_nonoverlapping(mem.host_ptr().add(offset), out.as_mut_ptr(), len) };
    out
}

fn fill(mem: &HostMemory, value: u8) {
    // SAFETY: the whole live allocation; no transfer targets it yet.
    unsafe { std::ptr::write_bytes(mem.host_ptr(), value, oxccl_hal::Memory::len(mem)) };
}

fn store(mem: &HostMemory, offset: usize, data: &[u8]) {
    assert!(offset + data.len() <= oxccl_hal::Memory::len(mem));
    // SAFETY: inside the live allocation (asserted); nothing reads it concurrently yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mem.host_ptr().add(offset), data.len()) };
}

/// Where source rank `src` puts size number `i` in a destination: odd offsets, gaps between.
fn slot(world: u32, src: u32, i: usize) -> usize {
    let per_source: usize = SIZES.iter().map(|s| s + 16).sum::<usize>() + 64;
    let _ = world;
    FLAGS * 8 + src as usize * per_source + SIZES[..i].iter().map(|s| s + 16).sum::<usize>() + 5
}

fn dst_len(world: u32) -> usize {
    slot(world, world, 0) + 64
}

/// Source offset of size number `i` (odd, distinct per peer so a misrouted copy shows).
fn src_offset(peer: u32, i: usize) -> usize {
    1 + 2 * peer as usize + 7 * i
}

fn payload_seed(base: u64, src: u32, dst: u32) -> u64 {
    base ^ (u64::from(src) << 40) ^ (u64::from(dst) << 20) ^ 0x00c0_ffee
}

struct Rank {
    bootstrap: Bootstrap,
    device: AnyDevice,
    dst: Arc<AnyMemory>,
    dst_reg: RegisteredMemory,
    src: Arc<AnyMemory>,
    src_reg: RegisteredMemory,
    remotes: Vec<RemoteMemory>,
}

/// Registers a poisoned destination and a source buffer for `transports` and exchanges
/// the destinations.
fn setup(bootstrap: Bootstrap, device: AnyDevice, transports: TransportSet) -> Rank {
    let world = bootstrap.world_size();
    let rank = bootstrap.rank();
    let dst = Arc::new(device.alloc(dst_len(world), MemoryKind::Physical).unwrap());
    fill(host(&dst), 0);
    let src_len = SIZES[SIZES.len() - 1] + 64 + 2 * world as usize + 7 * SIZES.len();
    let src = Arc::new(device.alloc(src_len, MemoryKind::Physical).unwrap());
    let dst_reg = RegisteredMemory::new(&device, rank, Arc::clone(&dst), transports).unwrap();
    let src_reg = RegisteredMemory::new(&device, rank, Arc::clone(&src), transports).unwrap();
    let remotes = exchange(&bootstrap, &device, &dst_reg).unwrap();
    Rank {
        bootstrap,
        device,
        dst,
        dst_reg,
        src,
        src_reg,
        remotes,
    }
}

/// Every rank writes every size into every peer over `transport`, signals each peer's flag
/// word, flushes; then every rank waits for all flags and checks every byte.
fn all_pairs(world: u32, transport: Transport, base: u64) {
    let transports = TransportSet::of(&[transport]);
    with_ranks(world, |b, d| {
        let r = setup(b, d, transports);
        let rank = r.bootstrap.rank();
        let conns: Vec<Option<Connection>> = (0..world)
            .map(|peer| {
                (peer != rank).then(|| {
                    Connection::connect(&r.bootstrap, &r.device, peer, transport, 1).unwrap()
                })
            })
            .collect();
        for (peer, conn) in conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            let peer = peer as u32;
            assert_eq!(conn.transport(), transport);
            assert_eq!(conn.peer(), peer);
            // The source holds this peer's payload; it is written before any transfer.
            for (i, &n) in SIZES.iter().enumerate() {
                let data = random_nonzero(payload_seed(base, rank, peer) + i as u64, n);
                store(host(&r.src), src_offset(peer, i), &data);
                let dst = &r.remotes[peer as usize];
                conn.write(
                    dst,
                    slot(world, rank, i),
                    &r.src_reg,
                    src_offset(peer, i),
                    n,
                )
                .unwrap();
                // The source buffer is reused for the next size: wait until this one is out.
                conn.flush(WAIT).unwrap();
            }
            conn.update_and_sync(
                &r.remotes[peer as usize],
                8 * rank as usize,
                0x0123_4567_89ab_cde0 | u64::from(rank),
            )
            .unwrap();
        }
        for conn in conns.iter().flatten() {
            conn.flush(WAIT).unwrap();
        }
        for peer in (0..world).filter(|p| *p != rank) {
            let flag = HostFlag::new(host(&r.dst), 8 * peer as usize)
                .unwrap()
                .with_name(format!("signal from rank {peer} to rank {rank}"));
            let v = flag.wait_at_least(1, WAIT).unwrap();
            assert_eq!(
                v,
                0x0123_4567_89ab_cde0 | u64::from(peer),
                "flag from {peer}"
            );
        }
        let all = snapshot(host(&r.dst), 0, dst_len(world));
        let mut expect = vec![0u8; all.len()];
        for peer in (0..world).filter(|p| *p != rank) {
            expect[8 * peer as usize..8 * peer as usize + 8]
                .copy_from_slice(&(0x0123_4567_89ab_cde0 | u64::from(peer)).to_le_bytes());
            for (i, &n) in SIZES.iter().enumerate() {
                let data = random_nonzero(payload_seed(base, peer, rank) + i as u64, n);
                let at = slot(world, peer, i);
                expect[at..at + n].copy_from_slice(&data);
            }
        }
        if let Some(bad) = all.iter().zip(&expect).position(|(a, e)| a != e) {
            panic!(
                "rank {rank} ({transport}, seed {base:#x}): byte {bad} is {:#x}, expected {:#x}",
                all[bad], expect[bad]
            );
        }
        r.bootstrap.barrier().unwrap();
    });
}

fn seed() -> u64 {
    let s = rand::random::<u64>();
    eprintln!("payload seed {s:#x}");
    s
}

#[test]
fn ipc_all_pairs_two_ranks() {
    all_pairs(2, Transport::Ipc, seed());
}

#[test]
fn ipc_all_pairs_four_ranks() {
    all_pairs(4, Transport::Ipc, seed());
}

#[test]
fn tcp_all_pairs_two_ranks() {
    all_pairs(2, Transport::Tcp, seed());
}

#[test]
fn tcp_all_pairs_three_ranks() {
    all_pairs(3, Transport::Tcp, seed());
}

/// After `flush` returns the data is in the peer's memory: the peer checks it on an
/// out-of-band bootstrap message, with no flag involved.
fn flush_means_landed(transport: Transport) {
    let base = seed();
    with_ranks(2, |b, d| {
        let r = setup(b, d, TransportSet::of(&[transport]));
        let rank = r.bootstrap.rank();
        let peer = 1 - rank;
        let conn = Connection::connect(&r.bootstrap, &r.device, peer, transport, 3).unwrap();
        for round in 0..3u64 {
            let n = 50_000 + 1000 * round as usize;
            if rank == 0 {
                let data = random_nonzero(base + round, n);
                store(host(&r.src), 1, &data);
                conn.write(&r.remotes[1], 333, &r.src_reg, 1, n).unwrap();
                conn.flush(WAIT).unwrap();
                r.bootstrap.send(1, 9, &round.to_le_bytes()).unwrap();
                r.bootstrap.recv(1, 9).unwrap();
            } else {
                assert_eq!(r.bootstrap.recv(0, 9).unwrap(), round.to_le_bytes());
                let got = snapshot(host(&r.dst), 333, n);
                assert!(
                    got == random_nonzero(base + round, n),
                    "round {round} incomplete"
                );
                fill(host(&r.dst), 0);
                r.bootstrap.send(0, 9, b"ok").unwrap();
            }
        }
        // A flush with nothing outstanding returns at once.
        let t = Instant::now();
        conn.flush(WAIT).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        r.bootstrap.barrier().unwrap();
        let _ = &r.dst_reg;
    });
}

#[test]
fn ipc_flush_means_landed() {
    flush_means_landed(Transport::Ipc);
}

#[test]
fn tcp_flush_means_landed() {
    flush_means_landed(Transport::Tcp);
}

fn root_of(e: &Error) -> &Error {
    e.root()
}

/// Offsets and sizes past the end, misaligned updates and foreign destinations are refused
/// before anything is sent.
fn bad_arguments(transport: Transport) {
    with_ranks(2, |b, d| {
        let r = setup(b, d, TransportSet::of(&[transport]));
        let rank = r.bootstrap.rank();
        let peer = 1 - rank;
        let conn = Connection::connect(&r.bootstrap, &r.device, peer, transport, 4).unwrap();
        let dst = &r.remotes[peer as usize];
        let (dl, sl) = (dst.len(), r.src_reg.len());
        let invalid = |res: oxccl_hal::Result<()>, what: &str| match res {
            Err(e) => assert!(
                matches!(root_of(&e), Error::InvalidArgument(_)),
                "{transport} {what}: {e}"
            ),
            Ok(()) => panic!("{transport} {what}: accepted"),
        };
        invalid(
            conn.write(dst, dl - 3, &r.src_reg, 0, 4),
            "write past the destination",
        );
        invalid(
            conn.write(dst, dl, &r.src_reg, 0, 1),
            "write at the destination's end",
        );
        invalid(
            conn.write(dst, 0, &r.src_reg, sl - 1, 2),
            "write past the source",
        );
        invalid(
            conn.write(dst, usize::MAX, &r.src_reg, 0, 2),
            "overflowing offset",
        );
        invalid(
            conn.write(dst, 0, &r.src_reg, 0, usize::MAX),
            "overflowing size",
        );
        invalid(conn.update_and_sync(dst, 4, 1), "misaligned update");
        invalid(conn.update_and_sync(dst, 13, 1), "odd update");
        invalid(
            conn.update_and_sync(dst, dl - dl % 8, 1),
            "update past the end",
        );
        invalid(
            conn.update_and_sync(dst, usize::MAX - 7, 1),
            "overflowing update",
        );
        let own = &r.remotes[rank as usize];
        invalid(
            conn.write(own, 0, &r.src_reg, 0, 1),
            "write to another rank's memory",
        );
        invalid(
            conn.update_and_sync(own, 0, 1),
            "update of another rank's memory",
        );
        // Nothing was sent: the destination is still all poison after a flush and barrier.
        // The second barrier keeps the peer's in-range update below out of this rank's
        // destination until the snapshot is taken (the peer passes the first barrier as
        // early as this rank does).
        conn.flush(WAIT).unwrap();
        r.bootstrap.barrier().unwrap();
        assert!(snapshot(host(&r.dst), 0, dl).iter().all(|b| *b == 0));
        r.bootstrap.barrier().unwrap();
        // In range is fine, including zero bytes at the very end.
        conn.write(dst, dl, &r.src_reg, sl, 0).unwrap();
        conn.update_and_sync(dst, 8 * rank as usize, 7).unwrap();
        conn.flush(WAIT).unwrap();
        r.bootstrap.barrier().unwrap();
        let flag = HostFlag::new(host(&r.dst), 8 * peer as usize).unwrap();
        assert_eq!(flag.wait_at_least(7, WAIT).unwrap(), 7);
        r.bootstrap.barrier().unwrap();
    });
}

#[test]
fn ipc_bad_arguments_are_invalid() {
    bad_arguments(Transport::Ipc);
}

#[test]
fn tcp_bad_arguments_are_invalid() {
    bad_arguments(Transport::Tcp);
}

#[test]
fn memory_not_registered_for_the_transport_is_refused() {
    with_ranks(2, |b, d| {
        // Registered for IPC only, written over TCP.
        let r = setup(b, d, TransportSet::of(&[Transport::Ipc]));
        let rank = r.bootstrap.rank();
        let peer = 1 - rank;
        assert!(r.remotes[peer as usize].is_imported());
        assert!(
            !r.remotes[rank as usize].is_imported(),
            "own entry is never imported"
        );
        let conn = Connection::connect(&r.bootstrap, &r.device, peer, Transport::Tcp, 5).unwrap();
        let e = conn
            .write(&r.remotes[peer as usize], 0, &r.src_reg, 0, 8)
            .unwrap_err();
        assert!(e.to_string().contains("did not register"), "{e}");
        r.bootstrap.barrier().unwrap();
    });
}

#[test]
fn mismatched_transports_are_named_on_both_sides() {
    let errors = with_ranks(2, |b, d| {
        let t = if b.rank() == 0 {
            Transport::Tcp
        } else {
            Transport::Ipc
        };
        Connection::connect(&b, &d, 1 - b.rank(), t, 6)
            .unwrap_err()
            .to_string()
    });
    assert!(
        errors[0].contains("rank 1 connects with IPC"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("rank 0 connects with TCP"),
        "{}",
        errors[1]
    );
}

#[test]
fn auto_choice_is_ipc_on_one_node_and_connecting_to_oneself_is_refused() {
    with_ranks(2, |b, d| {
        let peer = 1 - b.rank();
        let conn = Connection::connect_auto(&b, &d, peer, 7).unwrap();
        assert_eq!(conn.transport(), Transport::Ipc);
        let e = Connection::connect(&b, &d, b.rank(), Transport::Tcp, 8).unwrap_err();
        assert!(matches!(e.root(), Error::InvalidArgument(_)), "{e}");
        b.barrier().unwrap();
    });
}

/// A rank that goes away mid-transfer: the other one gets `PeerLost` from a write or a
/// flush, in bounded time, never a hang.
#[test]
fn tcp_peer_that_dies_mid_transfer_is_peer_lost() {
    let outcome = with_ranks(2, |b, d| {
        let r = setup(b, d, TransportSet::of(&[Transport::Tcp]));
        let rank = r.bootstrap.rank();
        let conn =
            Connection::connect(&r.bootstrap, &r.device, 1 - rank, Transport::Tcp, 10).unwrap();
        if rank == 1 {
            // Take the first signal, then die: every socket of this rank closes.
            let flag = HostFlag::new(host(&r.dst), 0).unwrap();
            flag.wait_at_least(1, WAIT).unwrap();
            drop(conn);
            drop(r);
            return None;
        }
        store(host(&r.src), 0, &random_nonzero(1, 1 << 16));
        conn.update_and_sync(&r.remotes[1], 0, 1).unwrap();
        let start = Instant::now();
        let err = loop {
            assert!(
                start.elapsed() < WAIT,
                "no error after {WAIT:?} of writes to a dead peer"
            );
            let step = conn
                .write(&r.remotes[1], 4096, &r.src_reg, 0, 1 << 16)
                .and_then(|()| conn.flush(WAIT));
            if let Err(e) = step {
                break e;
            }
        };
        // Later calls keep failing the same way, fast.
        let again = conn.flush(WAIT).unwrap_err();
        Some((
            err.to_string(),
            matches!(err.root(), Error::PeerLost(_)),
            again.to_string(),
        ))
    });
    let (text, lost, again) = outcome[0].clone().unwrap();
    assert!(lost, "expected PeerLost, got {text}");
    assert!(again.contains("rank 1"), "{again}");
}

/// A flush that cannot complete in time reports a timeout naming the peer, and its late
/// acknowledgement does not confuse the next flush.
#[test]
fn tcp_flush_timeout_is_reported_and_the_late_ack_skipped() {
    with_ranks(2, |b, d| {
        let r = setup(b, d, TransportSet::of(&[Transport::Tcp]));
        let rank = r.bootstrap.rank();
        let conn =
            Connection::connect(&r.bootstrap, &r.device, 1 - rank, Transport::Tcp, 11).unwrap();
        if rank == 0 {
            let big = r.src_reg.len();
            for _ in 0..8 {
                conn.write(&r.remotes[1], FLAGS * 8, &r.src_reg, 0, big)
                    .unwrap();
            }
            // A receiver faster than a microsecond leaves nothing to assert.
            if let Err(e) = conn.flush(Duration::from_micros(1)) {
                assert!(matches!(e.root(), Error::Timeout { .. }), "{e}");
                assert!(e.to_string().contains("rank 1"), "{e}");
            }
            // The late acknowledgement is skipped by the next flush.
            conn.flush(WAIT).unwrap();
        }
        r.bootstrap.barrier().unwrap();
    });
}

/// A write into a registration the receiver has freed is reported by the next flush.
#[test]
fn tcp_write_into_a_freed_registration_is_reported_by_flush() {
    with_ranks(2, |b, d| {
        let r = setup(b, d, TransportSet::of(&[Transport::Tcp]));
        let rank = r.bootstrap.rank();
        let conn =
            Connection::connect(&r.bootstrap, &r.device, 1 - rank, Transport::Tcp, 12).unwrap();
        let Rank {
            bootstrap,
            dst_reg,
            src_reg,
            remotes,
            ..
        } = r;
        if rank == 1 {
            drop(dst_reg);
        }
        bootstrap.barrier().unwrap();
        if rank == 0 {
            conn.write(&remotes[1], 0, &src_reg, 0, 100).unwrap();
            let e = conn.flush(WAIT).unwrap_err();
            assert!(e.to_string().contains("no live TCP registration"), "{e}");
            // The stream stays in step: the next flush is clean.
            conn.flush(WAIT).unwrap();
        }
        bootstrap.barrier().unwrap();
    });
}

#[test]
fn infiniband_reports_why_it_cannot_run() {
    let want = if cfg!(feature = "ib") {
        ib::NO_DEVICE
    } else {
        ib::NOT_BUILT
    };
    if cfg!(feature = "ib") && ib::available() {
        eprintln!("an RDMA device is present: the no-device path cannot be checked here");
        return;
    }
    assert!(!ib::available());
    let d = device();
    let mem = Arc::new(d.alloc(4096, MemoryKind::Physical).unwrap());
    let e = RegisteredMemory::new(&d, 0, mem, TransportSet::of(&[Transport::Ib])).unwrap_err();
    eprintln!("registering for InfiniBand: {e}");
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains(want), "{e}");
    let errors = with_ranks(2, |b, d| {
        Connection::connect(&b, &d, 1 - b.rank(), Transport::Ib, 13)
            .unwrap_err()
            .to_string()
    });
    for e in errors {
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn tcp_only_registrations_are_not_imported_and_carry_no_ib() {
    with_ranks(3, |b, d| {
        let r = setup(b, d, TransportSet::of(&[Transport::Tcp]));
        for (peer, m) in r.remotes.iter().enumerate() {
            assert_eq!(m.rank() as usize, peer);
            assert!(!m.is_imported() && m.ib().is_none());
            assert_eq!(m.len(), dst_len(3));
        }
        r.bootstrap.barrier().unwrap();
    });
}

/// The TCP tests of this file again, through the bounce buffers of GPU memory
/// ([`common::rerun_tcp_tests_through_the_bounce_buffers`]).
#[test]
fn tcp_tests_again_through_the_bounce_buffers() {
    common::rerun_tcp_tests_through_the_bounce_buffers();
}
