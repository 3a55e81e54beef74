//! Times a TCP connection between two ranks (two threads of this process, loopback, host
//! backend): large writes each followed by a flush (GB/s), and a 1 KiB ping-pong of write +
//! update answered the same way (microseconds per one-way trip).
//!
//! ```text
//! cargo run --release -p oxccl-channels --example tcp_bandwidth [MiB] [reps]
//! OXCCL_TCP_BOUNCE=1 cargo run ...    # through the bounce buffers of GPU memory
//! ```
//!
//! Numbers from the host backend say how the transport's own machinery behaves (syscalls,
//! copies, pipelining); on GPUs the device copies and the NIC change them.

// A benchmark program: a failed step ends it with a message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_backend::{AnyDevice, AnyMemory};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::connection::{tcp, Connection, Transport, TransportSet};
use oxccl_channels::registered_memory::{exchange, RegisteredMemory};
use oxccl_hal::atomics::HostFlag;
use oxccl_hal::host::HostMemory;
use oxccl_hal::{BackendKind, Device, DeviceId, HostVisible, MemoryKind};

const WAIT: Duration = Duration::from_secs(120);
const PING: usize = 1024;
const PINGS: u64 = 2000;
/// The flag word, then the ping area, then the bulk area.
const BULK_AT: usize = 4096;

fn host(m: &AnyMemory) -> &HostMemory {
    match m {
        AnyMemory::Host(h) => h,
        #[allow(unreachable_patterns)]
        _ => panic!("host backend memory expected"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(256, |a| a.parse().expect("MiB"));
    let reps: usize = args.next().map_or(5, |a| a.parse().expect("reps"));
    let bytes = mib << 20;
    let bounce = std::env::var(tcp::BOUNCE_VAR).unwrap_or_default();
    println!(
        "TCP loopback, host backend, {tcp_bounce}={bounce:?}: {mib} MiB x {reps}",
        tcp_bounce = tcp::BOUNCE_VAR
    );
    let cfg = BootstrapConfig { timeout: WAIT };
    let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
    std::thread::scope(|s| {
        for rank in 0..2u32 {
            let cfg = cfg.clone();
            let id = &id;
            s.spawn(move || {
                let b = Bootstrap::new(id, rank, 2, &cfg).unwrap();
                let d = AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap();
                run(&b, &d, bytes, reps);
            });
        }
    });
}

fn run(b: &Bootstrap, d: &AnyDevice, bytes: usize, reps: usize) {
    let rank = b.rank();
    let peer = 1 - rank;
    let mem = Arc::new(d.alloc(BULK_AT + bytes, MemoryKind::Physical).unwrap());
    let base = host(&mem).host_ptr();
    // SAFETY: the whole live allocation; no transfer touches it yet.
    unsafe {
        for i in 0..BULK_AT + bytes {
            *base.add(i) = (i as u8).wrapping_mul(31).wrapping_add(7 + rank as u8);
        }
        std::ptr::write_bytes(base, 0, 8);
    }
    let set = TransportSet::of(&[Transport::Tcp]);
    let reg = RegisteredMemory::new(d, rank, Arc::clone(&mem), set).unwrap();
    let remotes = exchange(b, d, &reg).unwrap();
    let conn = Connection::connect(b, d, peer, Transport::Tcp, 1).unwrap();
    let dst = &remotes[peer as usize];
    let flag = HostFlag::new(host(&mem), 0).unwrap();

    // Ping-pong: rank 0 writes and updates, rank 1 answers when it sees the update.
    b.barrier().unwrap();
    let start = Instant::now();
    for i in 1..=PINGS {
        if rank == 0 {
            conn.write(dst, 8, &reg, 8, PING).unwrap();
            conn.update_and_sync(dst, 0, i).unwrap();
            flag.wait_at_least(i, WAIT).unwrap();
        } else {
            flag.wait_at_least(i, WAIT).unwrap();
            conn.write(dst, 8, &reg, 8, PING).unwrap();
            conn.update_and_sync(dst, 0, i).unwrap();
        }
    }
    let one_way = start.elapsed().as_secs_f64() * 1e6 / (2 * PINGS) as f64;
    if rank == 0 {
        println!("{PING} B write + update, one way: {one_way:.1} us");
    }

    // Bulk: rank 0 writes into rank 1, each write flushed.
    b.barrier().unwrap();
    if rank == 0 {
        conn.write(dst, BULK_AT, &reg, BULK_AT, bytes).unwrap();
        conn.flush(WAIT).unwrap();
        let mut rates = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            conn.write(dst, BULK_AT, &reg, BULK_AT, bytes).unwrap();
            conn.flush(WAIT).unwrap();
            rates.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "{} MiB write + flush: median {:.2} GB/s, best {:.2} GB/s",
            bytes >> 20,
            rates[rates.len() / 2],
            rates[rates.len() - 1]
        );
    }
    b.barrier().unwrap();
    if rank == 1 {
        // SAFETY: the writer flushed before the barrier; nothing writes this range now.
        let got = unsafe { std::slice::from_raw_parts(base.add(BULK_AT), bytes) };
        let bad =
            (0..bytes).find(|&i| got[i] != ((BULK_AT + i) as u8).wrapping_mul(31).wrapping_add(7));
        assert!(bad.is_none(), "byte {bad:?} of the bulk area is wrong");
    }
    b.barrier().unwrap();
}
