// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use crate::registered_memory::exchange;
use crate::semaphore::testing::{buffer, random_nonzero, read, with_ranks, write};
use oxccl_hal::atomics::HostFlag;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn acks_parse_only_when_complete() {
    let mut buf = Vec::new();
    buf.extend_from_slice(&7u64.to_le_bytes());
    buf.push(1);
    buf.extend_from_slice(&3u32.to_le_bytes());
    buf.extend_from_slice(b"ba");
    assert!(take_ack(&mut buf).unwrap().is_none());
    buf.push(b'd');
    buf.extend_from_slice(&8u64.to_le_bytes());
    buf.push(0);
    buf.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(take_ack(&mut buf).unwrap(), Some((7, Err("bad".into()))));
    assert_eq!(take_ack(&mut buf).unwrap(), Some((8, Ok(()))));
    assert!(buf.is_empty());
    let mut huge = 1u64.to_le_bytes().to_vec();
    huge.push(1);
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(take_ack(&mut huge).is_err());
}

#[test]
fn headers_are_little_endian_words() {
    let h = header(OP_WRITE, 1, 2, 0x0102_0304_0506_0708);
    assert_eq!(h[0], OP_WRITE);
    assert_eq!(h[1], 1);
    assert_eq!(h[9], 2);
    assert_eq!(&h[17..25], &[8, 7, 6, 5, 4, 3, 2, 1]);
}

#[test]
fn bounce_switch_parses_strictly() {
    assert_eq!(bounce_all(None), Ok(false));
    assert_eq!(bounce_all(Some("")), Ok(false));
    assert_eq!(bounce_all(Some("0")), Ok(false));
    assert_eq!(bounce_all(Some(" 1 ")), Ok(true));
    let e = bounce_all(Some("yes")).unwrap_err();
    assert!(e.contains(BOUNCE_VAR) && e.contains("yes"), "{e}");
}

/// Both ways of moving host-backend memory: in place, and through the bounce buffers and
/// streams that GPU memory takes.
const PATHS: [bool; 2] = [false, true];

/// One rank of a two-rank test: a zeroed buffer registered for TCP, every rank's view of
/// it, and a TCP connection to the other rank.
struct Side {
    b: Bootstrap,
    mem: Arc<oxccl_backend::AnyMemory>,
    reg: RegisteredMemory,
    remotes: Vec<RemoteMemory>,
    conn: TcpConnection,
}

fn side(b: Bootstrap, d: &AnyDevice, len: usize, bounce: bool) -> Side {
    let (mem, reg) = buffer(&b, d, len);
    let remotes = exchange(&b, d, &reg).unwrap();
    let peer = 1 - b.rank();
    let here = HostIdentity::local().unwrap();
    let conn = TcpConnection::connect_with(&b, d, peer, 77, here, bounce).unwrap();
    Side {
        b,
        mem,
        reg,
        remotes,
        conn,
    }
}

/// Sizes around the thresholds: tiny, one send, one chunk, several chunks and not a
/// multiple of the chunk.
fn sizes() -> Vec<usize> {
    vec![
        1,
        1000,
        SMALL_WRITE,
        SMALL_WRITE + 1,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        3 * CHUNK + 12_345,
    ]
}

/// Where write `i` lands: after a flag word, odd offsets, 16 bytes of poison between.
fn slots() -> Vec<usize> {
    let mut at = 64 + 5;
    sizes()
        .iter()
        .map(|n| {
            let here = at;
            at += n + 16;
            here
        })
        .collect()
}

fn region() -> usize {
    slots().last().unwrap() + sizes().last().unwrap() + 64
}

/// Both ranks at once write every size into the other back to back (no flush between),
/// then signal and flush; every byte, poison included, is checked at the receiver.
#[test]
fn writes_of_every_size_arrive_intact_both_ways() {
    for bounce in PATHS {
        with_ranks(2, |b, d| {
            let s = side(b, &d, 2 * region(), bounce);
            let (me, peer) = (s.b.rank(), 1 - s.b.rank());
            let seed = |from: u32, i: usize| 0x7c9_0000 ^ (u64::from(from) << 32) ^ i as u64;
            // The source half starts at `region()` and shifts every payload by 3 bytes.
            for (i, (&n, &at)) in sizes().iter().zip(&slots()).enumerate() {
                write(&s.mem, region() + at + 3, &random_nonzero(seed(me, i), n));
            }
            for (&n, &at) in sizes().iter().zip(&slots()) {
                let dst = &s.remotes[peer as usize];
                s.conn.write(dst, at, &s.reg, region() + at + 3, n).unwrap();
            }
            s.conn
                .update_and_sync(&s.remotes[peer as usize], 0, 1)
                .unwrap();
            s.conn.flush(WAIT).unwrap();
            HostFlag::new(host(&s.mem), 0)
                .unwrap()
                .wait_at_least(1, WAIT)
                .unwrap();
            let got = read(&s.mem, 0, region());
            let mut want = vec![0u8; region()];
            want[..8].copy_from_slice(&1u64.to_le_bytes());
            for (i, (&n, &at)) in sizes().iter().zip(&slots()).enumerate() {
                want[at..at + n].copy_from_slice(&random_nonzero(seed(peer, i), n));
            }
            if let Some(bad) = got.iter().zip(&want).position(|(g, w)| g != w) {
                panic!(
                    "bounce {bounce}, rank {me}: byte {bad} is {:#x}, expected {:#x}",
                    got[bad], want[bad]
                );
            }
            s.b.barrier().unwrap();
        });
    }
}

fn host(m: &oxccl_backend::AnyMemory) -> &oxccl_hal::host::HostMemory {
    match m {
        oxccl_backend::AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

/// Rounds of the ordering tests below. A missing wait shows in a good share of them, not
/// in all; each round writes into fresh (never touched) pages of the peer, whose first
/// touch makes a copy into them slow.
const ROUNDS: usize = 16;

/// Where round `round` (from 0) of the ordering tests writes in the peer's buffer of
/// [`round_buffer`] bytes, and where the sender's source is: after a flag word, odd offsets.
fn round_at(n: usize, round: usize) -> usize {
    8 + round * (n + 64) + 5
}

fn round_buffer(n: usize) -> usize {
    round_at(n, ROUNDS + 1)
}

/// An update sent right after a large write (no flush) is seen only once every byte of the
/// write is in place.
#[test]
fn update_after_a_large_write_is_seen_after_the_data() {
    // The last chunk is nearly full: its copy is the longest to land.
    let n = 3 * CHUNK - 333;
    for bounce in PATHS {
        let payloads = [random_nonzero(0x5eed, n), random_nonzero(0x5eee, n)];
        with_ranks(2, |b, d| {
            let s = side(b, &d, round_buffer(n), bounce);
            let src = round_at(n, ROUNDS);
            for round in 0..ROUNDS {
                let (data, at) = (&payloads[round % 2], round_at(n, round));
                let value = round as u64 + 1;
                if s.b.rank() == 0 {
                    write(&s.mem, src, data);
                    s.conn.write(&s.remotes[1], at, &s.reg, src, n).unwrap();
                    s.conn.update_and_sync(&s.remotes[1], 0, value).unwrap();
                    // The peer has checked before the source changes (a blocking wait: the
                    // copies need the cores).
                    s.b.recv(1, 5).unwrap();
                } else {
                    let flag = HostFlag::new(host(&s.mem), 0).unwrap();
                    assert_eq!(flag.wait_at_least(value, WAIT).unwrap(), value);
                    let when = format!("bounce {bounce}, round {round}, when the flag was set");
                    assert_landed(&s.mem, at, data, &when);
                    s.b.send(0, 5, b"checked").unwrap();
                }
            }
            s.b.barrier().unwrap();
        });
    }
}

/// After `flush` returns, a large write is in the peer's memory: the peer checks the
/// moment the writer's `flush` has returned (the ranks are threads: a shared counter tells
/// it, faster than any copy), with no flag in the peer's memory involved.
#[test]
fn flush_after_a_large_write_means_landed() {
    // The last chunk is nearly full: its copy is the longest to land.
    let n = 3 * CHUNK - 5;
    for bounce in PATHS {
        let flushed = AtomicU64::new(0);
        let payloads = [random_nonzero(0xf1, n), random_nonzero(0xf2, n)];
        with_ranks(2, |b, d| {
            let s = side(b, &d, round_buffer(n), bounce);
            let src = round_at(n, ROUNDS);
            for round in 0..ROUNDS {
                let (data, at) = (&payloads[round % 2], round_at(n, round));
                let value = round as u64 + 1;
                if s.b.rank() == 0 {
                    write(&s.mem, src, data);
                    s.conn.write(&s.remotes[1], at, &s.reg, src, n).unwrap();
                    s.conn.flush(WAIT).unwrap();
                    flushed.store(value, Ordering::Release);
                    // A blocking wait: the copies need the cores.
                    s.b.recv(1, 6).unwrap();
                } else {
                    wait_for(&flushed, value);
                    let when = format!("bounce {bounce}, round {round}, after the flush");
                    assert_landed(&s.mem, at, data, &when);
                    s.b.send(0, 6, b"checked").unwrap();
                }
            }
            s.b.barrier().unwrap();
        });
    }
}

/// Asserts that `data` is in `mem` at `at`, the last bytes checked first: they are the last
/// to land.
fn assert_landed(mem: &oxccl_backend::AnyMemory, at: usize, data: &[u8], when: &str) {
    let n = data.len();
    assert!(
        read(mem, at + n - 64, 64) == data[n - 64..],
        "{when}: last chunk missing"
    );
    assert!(read(mem, at, n) == *data, "{when}: data incomplete");
}

/// Spins (yielding) until `counter` reaches `value`; panics after [`WAIT`].
fn wait_for(counter: &AtomicU64, value: u64) {
    let start = Instant::now();
    while counter.load(Ordering::Acquire) < value {
        assert!(
            start.elapsed() < WAIT,
            "the other rank never reached {value}"
        );
        std::thread::yield_now();
    }
}

/// The peer goes away while large writes stream to it: the writer gets `PeerLost` in
/// bounded time, and every later call fails fast the same way.
#[test]
fn peer_gone_mid_write_is_an_error_not_a_hang() {
    let n = 8 * CHUNK + 99;
    for bounce in PATHS {
        let outcome = with_ranks(2, |b, d| {
            let s = side(b, &d, n + 8, bounce);
            if s.b.rank() == 1 {
                HostFlag::new(host(&s.mem), 0)
                    .unwrap()
                    .wait_at_least(1, WAIT)
                    .unwrap();
                // Its sockets close with the writer's data unread.
                drop(s);
                return None;
            }
            write(&s.mem, 8, &random_nonzero(3, n));
            s.conn.update_and_sync(&s.remotes[1], 0, 1).unwrap();
            let start = Instant::now();
            let err = loop {
                assert!(
                    start.elapsed() < WAIT,
                    "bounce {bounce}: no error in {WAIT:?}"
                );
                if let Err(e) = s.conn.write(&s.remotes[1], 8, &s.reg, 8, n) {
                    break e;
                }
            };
            let t = Instant::now();
            let again = s.conn.write(&s.remotes[1], 8, &s.reg, 8, n).unwrap_err();
            let flush = s.conn.flush(WAIT).unwrap_err();
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "later calls were slow"
            );
            Some((err, again, flush))
        });
        let (err, again, flush) = outcome.into_iter().flatten().next().unwrap();
        assert!(
            matches!(err.root(), Error::PeerLost(_)),
            "bounce {bounce}: expected PeerLost, got {err}"
        );
        for e in [again, flush] {
            assert!(matches!(e.root(), Error::PeerLost(_)), "{e}");
            assert!(e.to_string().contains("rank 1"), "{e}");
        }
    }
}

/// A multi-chunk write into a registration the receiver has freed is reported by the next
/// flush; the byte stream stays in step, so a write after it lands.
#[test]
fn large_write_into_a_freed_registration_is_reported_and_the_stream_stays_in_step() {
    let n = 2 * CHUNK + 17;
    for bounce in PATHS {
        with_ranks(2, |b, d| {
            let s = side(b, &d, n + 8, bounce);
            let (_gone_mem, gone) = buffer(&s.b, &d, n);
            let gone_remotes = exchange(&s.b, &d, &gone).unwrap();
            if s.b.rank() == 1 {
                drop(gone);
            }
            s.b.barrier().unwrap();
            if s.b.rank() == 0 {
                let data = random_nonzero(11, n);
                write(&s.mem, 8, &data);
                s.conn.write(&gone_remotes[1], 0, &s.reg, 8, n).unwrap();
                let e = s.conn.flush(WAIT).unwrap_err();
                assert!(e.to_string().contains("no live TCP registration"), "{e}");
                s.conn.write(&s.remotes[1], 8, &s.reg, 8, n).unwrap();
                s.conn.flush(WAIT).unwrap();
                s.b.send(1, 7, b"written").unwrap();
            } else {
                s.b.recv(0, 7).unwrap();
                let data = random_nonzero(11, n);
                assert!(
                    read(&s.mem, 8, n) == data,
                    "bounce {bounce}: write after the error"
                );
            }
            s.b.barrier().unwrap();
        });
    }
}
