//! The PortChannel allreduce on the host backend, ranks as threads of this process, over
//! the TCP and the IPC transports: every data type, ops and accumulations, odd counts, in
//! and out of place (unaligned), messages of many rounds, repeated calls, world sizes 1..=8,
//! and a peer that never calls (a timeout, not a hang).
//!
//! Results are compared bit for bit with the host reference reduction in rank order
//! (`oxccl_kernels::reduce`), after poisoning the output.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_collectives::algorithms::port_channel::{PortAllreduce, PortAllreduceConfig};
use oxccl_collectives::backend::{AnyDevice, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::channels::connection::Transport;
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Memory, MemoryKind, ReduceOp,
    Stream,
};

mod common;
use common::{check_buffers, expected, input, same_bits, stage};

struct Rank {
    ar: PortAllreduce,
    bootstrap: Bootstrap,
    device: AnyDevice,
    stream: AnyStream,
    world: u32,
}

impl Rank {
    fn rank(&self) -> u32 {
        self.bootstrap.rank()
    }

    /// One checked allreduce; returns the first mismatch.
    fn check(
        &self,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        count: usize,
        in_place: bool,
        salt: u64,
    ) -> Result<(), String> {
        let (_buffers, inp, out) = check_buffers(&self.device, dtype, count, in_place);
        self.check_at(inp, out, dtype, op, accum, count, salt)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_at(
        &self,
        inp: DevicePtr,
        out: DevicePtr,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        count: usize,
        salt: u64,
    ) -> Result<(), String> {
        stage(&self.stream, (inp, out), dtype, self.rank(), count, salt);
        // SAFETY: both buffers hold `count` elements and live until the synchronize below.
        unsafe {
            self.ar
                .launch(inp, out, count, dtype, op, accum, &self.stream)
                .map_err(|e| e.to_string())?;
        }
        self.stream.synchronize().map_err(|e| e.to_string())?;
        self.ar
            .check_error(&self.stream)
            .map_err(|e| e.to_string())?;
        let mut got = vec![0u8; dtype.bytes(count).unwrap()];
        self.stream.read(out, &mut got).unwrap();
        let want = expected(dtype, op, accum, self.world, count, salt);
        same_bits(dtype, &got, &want, count).map_err(|d| {
            format!(
                "rank {} {dtype} {op} {accum} count {count} in_place {}: {d}",
                self.rank(),
                inp == out
            )
        })
    }
}

fn config(transport: Transport, chunk: usize) -> PortAllreduceConfig {
    PortAllreduceConfig {
        timeout: Duration::from_secs(20),
        chunk_bytes: chunk,
        transport: Some(transport),
        fifo_size: Some(8), // small: the FIFO wraps and back-pressure is exercised
    }
}

/// Runs `body` on `world` ranks as threads of this process (each its own host device).
fn threads(world: u32, cfg: PortAllreduceConfig, body: impl Fn(&Rank) + Send + Sync + 'static) {
    let id =
        UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default()).unwrap();
    let body = Arc::new(body);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (body, cfg) = (Arc::clone(&body), cfg.clone());
            std::thread::spawn(move || {
                let bootstrap = Bootstrap::new(&id, r, world, &BootstrapConfig::default()).unwrap();
                let device = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
                let ar = PortAllreduce::new(&bootstrap, &device, cfg).unwrap();
                let stream = device.create_stream().unwrap();
                let rank = Rank {
                    ar,
                    bootstrap,
                    device,
                    stream,
                    world,
                };
                body(&rank);
                let Rank { ar, bootstrap, .. } = rank;
                ar.destroy(&bootstrap).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank thread panicked");
    }
}

fn accums(dtype: DataType) -> Vec<AccumType> {
    match dtype {
        DataType::F32 => vec![AccumType::Auto],
        DataType::F16 | DataType::Bf16 => vec![AccumType::Auto, AccumType::F32],
        _ => vec![AccumType::Auto, AccumType::Native, AccumType::F32],
    }
}

#[test]
fn every_type_op_and_accumulation_over_tcp_and_ipc() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        // 1000-byte rounds: the larger counts take several rounds.
        threads(3, config(transport, 1000), move |r| {
            assert!(r
                .ar
                .transports()
                .iter()
                .enumerate()
                .all(|(p, t)| (p == r.rank() as usize) == t.is_none()
                    && t.is_none_or(|t| t == transport)));
            let mut salt = 0;
            for dtype in DataType::ALL {
                for accum in accums(dtype) {
                    for (op, count) in [
                        (ReduceOp::Sum, 1),
                        (ReduceOp::Sum, 1001),
                        (ReduceOp::Prod, 3),
                        (ReduceOp::Min, 17),
                        (ReduceOp::Max, 33),
                        (ReduceOp::Avg, 777),
                    ] {
                        salt += 1;
                        r.check(dtype, op, accum, count, salt % 2 == 0, salt)
                            .unwrap_or_else(|e| panic!("{transport}: {e}"));
                    }
                }
            }
        });
    }
}

#[test]
fn odd_counts_many_rounds_and_world_sizes_one_to_four() {
    for (world, transport) in [
        (1, Transport::Tcp),
        (2, Transport::Tcp),
        (2, Transport::Ipc),
        (4, Transport::Ipc),
        (4, Transport::Tcp),
    ] {
        threads(world, config(transport, 64 << 10), move |r| {
            for (i, count) in [1usize, 3, 1000, 12345, 100_003].into_iter().enumerate() {
                for dtype in [DataType::F32, DataType::Bf16, DataType::Fp8E4m3b15] {
                    r.check(
                        dtype,
                        ReduceOp::Sum,
                        AccumType::Auto,
                        count,
                        i % 2 == 1,
                        i as u64,
                    )
                    .unwrap_or_else(|e| panic!("world {world} {transport}: {e}"));
                }
            }
        });
    }
}

/// 2^20 + 7 f32 (4 MiB) through 256 KiB rounds, both transports, in and out of place.
#[test]
fn a_message_much_larger_than_the_scratch() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        threads(2, config(transport, 256 << 10), move |r| {
            assert!(r.ar.scratch_bytes() < 2 << 20);
            let n = (1 << 20) + 7;
            r.check(DataType::F32, ReduceOp::Sum, AccumType::Auto, n, true, 99)
                .unwrap_or_else(|e| panic!("{transport}: {e}"));
            r.check(DataType::F16, ReduceOp::Max, AccumType::Auto, n, false, 98)
                .unwrap_or_else(|e| panic!("{transport}: {e}"));
        });
    }
}

/// Many calls of sizes with odd and even round counts (the round parity carries over from
/// call to call) on eight ranks over IPC, and a few over TCP.
#[test]
fn repeated_calls_on_eight_ranks() {
    threads(8, config(Transport::Ipc, 512), |r| {
        for i in 0..40u64 {
            let count = [5usize, 300, 129, 1, 64][i as usize % 5];
            r.check(
                DataType::Bf16,
                ReduceOp::Sum,
                AccumType::Auto,
                count,
                i % 3 == 0,
                i,
            )
            .unwrap();
        }
    });
    threads(8, config(Transport::Tcp, 4096), |r| {
        for i in 0..6u64 {
            r.check(
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                3001,
                i % 2 == 0,
                i,
            )
            .unwrap();
        }
    });
}

#[test]
fn bad_calls_are_refused_before_any_launch() {
    threads(2, config(Transport::Tcp, 1024), |r| {
        let m = r.device.alloc(64, MemoryKind::Plain).unwrap();
        let launch = |inp: DevicePtr, out: DevicePtr, count, dtype, accum| {
            // SAFETY: every call below is refused before a launch.
            unsafe {
                r.ar.launch(inp, out, count, dtype, ReduceOp::Sum, accum, &r.stream)
            }
        };
        let p = m.ptr();
        assert!(launch(DevicePtr::NULL, p, 4, DataType::F32, AccumType::Auto).is_err());
        assert!(launch(p.offset(2).unwrap(), p, 4, DataType::F32, AccumType::Auto).is_err());
        assert!(launch(p, p.offset(4).unwrap(), 4, DataType::F32, AccumType::Auto).is_err());
        assert!(launch(p, p, 4, DataType::F32, AccumType::F16).is_err());
        // count 0 is a no-op, and the next real call still agrees across ranks.
        assert!(launch(p, p, 0, DataType::F32, AccumType::Auto).is_ok());
        r.check(DataType::F32, ReduceOp::Sum, AccumType::Auto, 10, true, 1)
            .unwrap();
    });
}

#[test]
fn a_peer_that_never_calls_is_a_timeout_not_a_hang() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        let id = UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default())
            .unwrap();
        let make = move |r: u32| {
            let bootstrap = Bootstrap::new(&id, r, 2, &BootstrapConfig::default()).unwrap();
            let device = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
            let mut cfg = config(transport, 1024);
            cfg.timeout = Duration::from_millis(400);
            let ar = PortAllreduce::new(&bootstrap, &device, cfg).unwrap();
            (bootstrap, device, ar)
        };
        let peer = std::thread::spawn(move || {
            let (bootstrap, _device, ar) = make(1);
            // Never calls; stays alive until rank 0 saw its timeout.
            bootstrap.barrier().unwrap();
            drop(ar);
        });
        let (bootstrap, device, ar) = make(0);
        let stream = device.create_stream().unwrap();
        let m = device.alloc(4096, MemoryKind::Plain).unwrap();
        stream
            .write(m.ptr(), &input(DataType::F32, 0, 1000, 1))
            .unwrap();
        let start = Instant::now();
        // SAFETY: 4096 bytes hold 1000 f32 and live past the synchronize.
        unsafe {
            ar.launch(
                m.ptr(),
                m.ptr(),
                1000,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                &stream,
            )
        }
        .unwrap();
        let e = stream.synchronize().unwrap_err();
        assert!(e.to_string().contains("timed out"), "{transport}: {e}");
        let e = ar.check_error(&stream).unwrap_err().to_string();
        assert!(e.contains("rank 1"), "{transport}: {e}");
        assert!(start.elapsed() < Duration::from_secs(15), "{transport}");
        bootstrap.barrier().unwrap();
        peer.join().unwrap();
        drop(ar);
    }
}

/// Child side of `across_processes`: one rank of a job started by it.
#[test]
#[ignore = "run by across_processes as a child process"]
fn child_rank() {
    if std::env::var("OXCCL_TEST_CHILD").is_err() {
        return;
    }
    let cfg = BootstrapConfig::from_env().unwrap();
    let (bootstrap, info) = Bootstrap::from_env(&cfg).unwrap();
    let device = AnyDevice::open_with(BackendKind::Host, DeviceId(info.local_rank)).unwrap();
    let ar = PortAllreduce::new(
        &bootstrap,
        &device,
        PortAllreduceConfig::from_env().unwrap(),
    )
    .unwrap();
    let stream = device.create_stream().unwrap();
    let world = bootstrap.world_size();
    let r = Rank {
        ar,
        bootstrap,
        device,
        stream,
        world,
    };
    for (i, count) in [1usize, 777, 50_001, 100_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::F32, DataType::Fp8E4m3] {
            r.check(
                dtype,
                ReduceOp::Sum,
                AccumType::Auto,
                count,
                i % 2 == 0,
                i as u64,
            )
            .unwrap();
        }
    }
    r.check(
        DataType::F16,
        ReduceOp::Min,
        AccumType::Auto,
        4097,
        false,
        7,
    )
    .unwrap();
    let Rank { ar, bootstrap, .. } = r;
    ar.destroy(&bootstrap).unwrap();
}

/// The same protocol across real processes (this test binary re-executed), over TCP and
/// over IPC (memfd mappings between processes).
#[test]
fn across_processes() {
    for (world, transport) in [(3u32, "tcp"), (3, "ipc")] {
        common::run_child_ranks(
            world,
            &[
                ("OXCCL_PORT_TRANSPORT", transport),
                ("OXCCL_PORT_CHUNK_KB", "64"),
            ],
            &format!("world {world} {transport}"),
        );
    }
}
