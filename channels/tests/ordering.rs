//! Ordering of writes and updates on one connection, under proptest-generated schedules.
//!
//! The sender issues a random sequence of writes (random sizes, each into a fresh range of
//! the peer's buffer, so none overwrites another) and updates (the flag takes the values
//! 1, 2, 3, ...). An observer polls the flag while the sequence runs; whenever it sees a
//! new value `k` it checks that every write issued before update `k` is completely in
//! place. A transport that let an update overtake a write fails this check.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_backend::{AnyDevice, AnyMemory};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::connection::{Connection, Transport, TransportSet};
use oxccl_channels::registered_memory::{exchange, RegisteredMemory, RemoteMemory};
use oxccl_hal::atomics::HostFlag;
use oxccl_hal::host::HostMemory;
use oxccl_hal::{BackendKind, Device, DeviceId, HostVisible, Memory, MemoryKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::{Rng, SeedableRng};

const DST_LEN: usize = 4 << 20;
const SRC_LEN: usize = 1 << 20;
const DATA_START: usize = 64 + 3;
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Op {
    /// Write `len` bytes from source offset `src`.
    Write { src: usize, len: usize },
    /// Signal: the flag takes the next value.
    Update,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..SRC_LEN / 2, 1usize..4000).prop_map(|(src, len)| Op::Write { src, len }),
        1 => (0usize..SRC_LEN / 2, 100_000usize..SRC_LEN / 2)
            .prop_map(|(src, len)| Op::Write { src, len }),
        3 => Just(Op::Update),
    ]
}

fn host(mem: &AnyMemory) -> &HostMemory {
    match mem {
        AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

struct Sender {
    conn: Connection,
    src: RegisteredMemory,
    src_mem: Arc<AnyMemory>,
    dst: RemoteMemory,
}

struct Receiver {
    _conn: Connection,
    dst: Arc<AnyMemory>,
    _reg: RegisteredMemory,
}

/// Two ranks on threads, connected over `transport`; rank 1's connection stays alive in
/// the returned receiver so its side keeps applying.
fn pair(transport: Transport) -> (Sender, Receiver) {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(30),
    };
    let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
    let set = TransportSet::of(&[transport]);
    let run = |rank: u32| {
        let b = Bootstrap::new(&id, rank, 2, &cfg).unwrap();
        let d = AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap();
        let len = if rank == 0 { SRC_LEN } else { DST_LEN };
        let mem = Arc::new(d.alloc(len, MemoryKind::Physical).unwrap());
        let reg = RegisteredMemory::new(&d, rank, Arc::clone(&mem), set).unwrap();
        let remotes = exchange(&b, &d, &reg).unwrap();
        let conn = Connection::connect(&b, &d, 1 - rank, transport, 1).unwrap();
        b.barrier().unwrap();
        (conn, mem, reg, remotes)
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run(0));
        let b = s.spawn(|| run(1));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (conn0, src_mem, src, remotes0) = a;
    let (conn1, dst, reg1, _) = b;
    let mut src_bytes = vec![0u8; SRC_LEN];
    rand::rngs::StdRng::seed_from_u64(rand::random()).fill_bytes(&mut src_bytes);
    for b in &mut src_bytes {
        *b |= 1; // never zero, the poison
    }
    // SAFETY: the whole live source allocation; no transfer runs yet.
    unsafe {
        std::ptr::copy_nonoverlapping(src_bytes.as_ptr(), host(&src_mem).host_ptr(), SRC_LEN)
    };
    let dst_remote = remotes0[1].clone();
    (
        Sender {
            conn: conn0,
            src,
            src_mem,
            dst: dst_remote,
        },
        Receiver {
            _conn: conn1,
            dst,
            _reg: reg1,
        },
    )
}

fn read(mem: &HostMemory, at: usize, len: usize) -> Vec<u8> {
    assert!(at + len <= mem.len());
    let mut out = vec![0u8; len];
    // SAFETY: inside the live allocation (asserted). The range may be written concurrently
    // only when the transport is broken, which is what the comparison detects.
    unsafe { std::ptr::copy_nonoverlapping(mem.host_ptr().add(at), out.as_mut_ptr(), len) };
    out
}

/// Runs one schedule; returns a description of the first ordering violation seen.
fn run_case(s: &Sender, r: &Receiver, ops: &[Op]) -> Result<(), TestCaseError> {
    let dst = host(&r.dst);
    let src = host(&s.src_mem);
    // Poison the destination, reset the flag (the previous case was flushed).
    // SAFETY: the whole live allocation; nothing writes it between cases.
    unsafe { std::ptr::write_bytes(dst.host_ptr(), 0, DST_LEN) };
    // Lay out the writes and note how many precede each update.
    let mut writes = Vec::new(); // (dst offset, src offset, len)
    let mut before_update = Vec::new();
    let mut actions = Vec::new(); // Some(write index) or None for an update
    let mut at = DATA_START;
    for op in ops {
        match op {
            Op::Write { src, len } => {
                if at + len > DST_LEN {
                    continue;
                }
                actions.push(Some(writes.len()));
                writes.push((at, *src, *len));
                at += len + 1; // a poisoned byte between neighbours
            }
            Op::Update => {
                actions.push(None);
                before_update.push(writes.len());
            }
        }
    }
    let updates = before_update.len() as u64;
    std::thread::scope(|scope| {
        let observer = scope.spawn(|| -> Result<(), String> {
            let flag = HostFlag::new(dst, 0).map_err(|e| e.to_string())?;
            let start = Instant::now();
            let (mut seen, mut checked) = (0u64, 0usize);
            while seen < updates {
                let v = flag.load_acquire();
                if v < seen {
                    return Err(format!("flag went back from {seen} to {v}"));
                }
                if v > updates {
                    return Err(format!("flag {v} beyond the {updates} updates"));
                }
                if v > seen {
                    let must = before_update[(v - 1) as usize];
                    for (i, &(d, so, len)) in writes.iter().enumerate().take(must).skip(checked) {
                        if read(dst, d, len) != read(src, so, len) {
                            return Err(format!(
                                "update {v} visible before write {i} ({len} bytes at {d}) landed"
                            ));
                        }
                    }
                    checked = checked.max(must);
                    seen = v;
                }
                if start.elapsed() > WAIT {
                    return Err(format!("flag stuck at {seen} of {updates}"));
                }
                std::hint::spin_loop();
            }
            Ok(())
        });
        let mut value = 0u64;
        for action in &actions {
            match *action {
                Some(i) => {
                    let (d, so, len) = writes[i];
                    s.conn
                        .write(&s.dst, d, &s.src, so, len)
                        .map_err(|e| e.to_string())?;
                }
                None => {
                    value += 1;
                    s.conn
                        .update_and_sync(&s.dst, 0, value)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        s.conn.flush(WAIT).map_err(|e| e.to_string())?;
        observer
            .join()
            .map_err(|_| "observer panicked".to_string())??;
        // After the flush every write is in place and the gaps are still poison.
        let mut expect = vec![0u8; at.max(DATA_START)];
        for &(d, so, len) in &writes {
            expect[d..d + len].copy_from_slice(&read(src, so, len));
        }
        let got = read(dst, DATA_START, expect.len() - DATA_START);
        if got != expect[DATA_START..] {
            return Err("data after the final flush differs".to_string());
        }
        let flag = HostFlag::new(dst, 0).map_err(|e| e.to_string())?;
        if flag.load_acquire() != updates {
            return Err(format!("final flag {} != {updates}", flag.load_acquire()));
        }
        flag.store_release(0);
        Ok::<(), String>(())
    })
    .map_err(TestCaseError::fail)
}

fn ordering(transport: Transport) {
    let (s, r) = pair(transport);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        run_case(&s, &r, &ops)
    });
    if let Err(e) = result {
        panic!("{transport}: {e}");
    }
}

#[test]
fn tcp_updates_never_overtake_writes() {
    ordering(Transport::Tcp);
}

#[test]
fn ipc_updates_never_overtake_writes() {
    ordering(Transport::Ipc);
}

/// The TCP tests of this file again, through the bounce buffers of GPU memory
/// ([`common::rerun_tcp_tests_through_the_bounce_buffers`]).
#[test]
fn tcp_tests_again_through_the_bounce_buffers() {
    common::rerun_tcp_tests_through_the_bounce_buffers();
}
