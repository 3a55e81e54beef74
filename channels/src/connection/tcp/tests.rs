// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use crate::registered_memory::exchange;
use crate::semaphore::testing::{buffer, random_nonzero, with_ranks, write};
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

/// One rank of a two-rank test: a zeroed buffer registered for TCP, every rank's view of
/// it, and a TCP connection to the other rank.
struct Side {
    b: Bootstrap,
    mem: Arc<oxccl_backend::AnyMemory>,
    reg: RegisteredMemory,
    remotes: Vec<RemoteMemory>,
    conn: TcpConnection,
}

fn side(b: Bootstrap, d: &AnyDevice, len: usize) -> Side {
    let (mem, reg) = buffer(&b, d, len);
    let remotes = exchange(&b, d, &reg).unwrap();
    let peer = 1 - b.rank();
    let here = HostIdentity::local().unwrap();
    let conn = TcpConnection::connect(&b, d, peer, 77, here).unwrap();
    Side {
        b,
        mem,
        reg,
        remotes,
        conn,
    }
}

fn host(m: &oxccl_backend::AnyMemory) -> &oxccl_hal::host::HostMemory {
    match m {
        oxccl_backend::AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

/// The peer goes away while large writes stream to it: the writer gets `PeerLost` in
/// bounded time, and every later call fails fast the same way.
#[test]
fn peer_gone_mid_write_is_an_error_not_a_hang() {
    let n = 8 * CHUNK + 99;
    {
        let bounce = false;
        let outcome = with_ranks(2, |b, d| {
            let s = side(b, &d, n + 8);
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
