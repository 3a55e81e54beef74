//! The PortChannel allreduce on the host backend, through a communicator that forces it
//! (`OXCCL_ALGO=port_channel`, which also sets up the PortChannel all-gather and
//! reduce-scatter: `port_channel_multinode.rs` checks those), ranks as threads of this
//! process, over the TCP and the IPC transports: every data type, ops and accumulations, odd counts, in
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

use oxccl_collectives::algorithms::all_gather::port_channel::ALLGATHER_PORT;
use oxccl_collectives::algorithms::all_reduce::port_channel::{
    PortAllreduce, PortAllreduceConfig, PORT_CHANNEL,
};
use oxccl_collectives::algorithms::reduce_scatter::port_channel::REDUCESCATTER_PORT;
use oxccl_collectives::backend::{AnyDevice, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::channels::connection::Transport;
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Memory, MemoryKind, ReduceOp,
    Stream,
};
use oxccl_collectives::{CommConfig, Communicator};

mod common;
use common::{accums, check_buffers, expected, first_call_signature, input, same_bits, stage};

struct Rank {
    comm: Communicator,
    stream: AnyStream,
    world: u32,
}

impl Rank {
    fn rank(&self) -> u32 {
        self.comm.rank()
    }

    /// The algorithm's state in the communicator (what it reports about itself).
    fn port(&self) -> &PortAllreduce {
        port_of(&self.comm)
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
        let (_buffers, inp, out) = check_buffers(self.comm.device(), dtype, count, in_place);
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
            self.comm
                .all_reduce(inp, out, count, dtype, op, accum, &self.stream)
                .map_err(|e| e.to_string())?;
        }
        self.stream.synchronize().map_err(|e| e.to_string())?;
        self.comm
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

fn port_of(comm: &Communicator) -> &PortAllreduce {
    comm.instance(PORT_CHANNEL)
        .and_then(|i| i.as_any().downcast_ref::<PortAllreduce>())
        .expect("port_channel is set up when forced")
}

/// A communicator that forces the PortChannel allreduce (its own scratch small: unused).
fn config(transport: Transport, chunk: usize) -> CommConfig {
    CommConfig {
        forced: PORT_CHANNEL.into(),
        timeout: Duration::from_secs(20),
        staging_bytes: 64 << 10,
        oneshot_max_bytes: Some(4096),
        port: PortAllreduceConfig {
            chunk_bytes: chunk,
            transport: Some(transport),
            fifo_size: Some(8), // small: the FIFO wraps and back-pressure is exercised
        },
        ..CommConfig::default()
    }
}

/// Runs `body` on `world` ranks as threads of this process (each its own host device).
fn threads(world: u32, cfg: CommConfig, body: impl Fn(&Rank) + Send + Sync + 'static) {
    let id =
        UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default()).unwrap();
    let body = Arc::new(body);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (body, cfg) = (Arc::clone(&body), cfg.clone());
            std::thread::spawn(move || {
                let bootstrap = Bootstrap::new(&id, r, world, &BootstrapConfig::default()).unwrap();
                let device = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
                let comm = Communicator::new(bootstrap, device, cfg).unwrap();
                let stream = comm.device().create_stream().unwrap();
                let rank = Rank {
                    comm,
                    stream,
                    world,
                };
                body(&rank);
                rank.comm.destroy().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank thread panicked");
    }
}

#[test]
fn every_type_op_and_accumulation_over_tcp_and_ipc() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        // 1000-byte rounds: the larger counts take several rounds.
        threads(3, config(transport, 1000), move |r| {
            // Forcing a PortChannel algorithm says the ranks may be on several hosts: the
            // PortChannel algorithms of every collective are set up (they map no peer
            // memory through IPC), nothing else.
            assert_eq!(r.comm.peer_mappings(), 0);
            for a in oxccl_collectives::ALGORITHMS {
                let port = [PORT_CHANNEL, ALLGATHER_PORT, REDUCESCATTER_PORT].contains(a);
                assert_eq!(r.comm.instance(*a).is_some(), port, "{a}");
            }
            // All-to-all has no algorithm that reaches peers on other hosts: refused, clearly.
            let buf = r.comm.device().alloc(3 * 64, MemoryKind::Plain).unwrap();
            let half = buf.ptr().offset(3 * 32).unwrap();
            // SAFETY: refused before any launch.
            let e = unsafe {
                r.comm
                    .all_to_all(buf.ptr(), half, 4, DataType::F32, &r.stream)
            }
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("all_to_all") && e.contains("no multi-node algorithm"),
                "{e}"
            );
            assert!(r
                .port()
                .transports()
                .iter()
                .enumerate()
                .all(|(p, t)| (p == r.rank() as usize) == t.is_none()
                    && t.is_none_or(|t| t == transport)));
            assert_eq!(
                r.port().scratch_in_host_memory(),
                transport == Transport::Tcp
            );
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

/// 2^20 + 7 f32 (4 MiB) through 128 KiB rounds (a scratch of 1.5 MiB: send and receive
/// areas of 3 slots x 2 ranks), both transports, in and out of place.
#[test]
fn a_message_much_larger_than_the_scratch() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        threads(2, config(transport, 128 << 10), move |r| {
            assert!(r.port().scratch_bytes() < 2 << 20);
            let n = (1 << 20) + 7;
            r.check(DataType::F32, ReduceOp::Sum, AccumType::Auto, n, true, 99)
                .unwrap_or_else(|e| panic!("{transport}: {e}"));
            r.check(DataType::F16, ReduceOp::Max, AccumType::Auto, n, false, 98)
                .unwrap_or_else(|e| panic!("{transport}: {e}"));
        });
    }
}

/// Rounds smaller than a slot: 1 MiB slots, 2^20 + 7 f32 go in 512 KiB rounds (an eighth of
/// the call) with a short last one, between calls of one round; both transports.
#[test]
fn rounds_smaller_than_a_slot() {
    for transport in [Transport::Tcp, Transport::Ipc] {
        threads(2, config(transport, 1 << 20), move |r| {
            let n = (1 << 20) + 7;
            for (i, count) in [n, 1000, n + 4096, 3].into_iter().enumerate() {
                r.check(
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    count,
                    i % 2 == 0,
                    50 + i as u64,
                )
                .unwrap_or_else(|e| panic!("{transport} count {count}: {e}"));
            }
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
        let m = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
        let launch = |inp: DevicePtr, out: DevicePtr, count, dtype, accum| {
            // SAFETY: every call below is refused before a launch.
            unsafe {
                r.comm
                    .all_reduce(inp, out, count, dtype, ReduceOp::Sum, accum, &r.stream)
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
            Communicator::new(bootstrap, device, cfg).unwrap()
        };
        let peer = std::thread::spawn(move || {
            let comm = make(1);
            // Takes part in the signature check of rank 0's first call, never launches,
            // and stays alive until rank 0 saw its timeout.
            comm.bootstrap()
                .all_gather(&first_call_signature(
                    1000,
                    DataType::F32,
                    PORT_CHANNEL.code(),
                ))
                .unwrap();
            comm.bootstrap().barrier().unwrap();
            drop(comm);
        });
        let comm = make(0);
        let stream = comm.device().create_stream().unwrap();
        let m = comm.device().alloc(4096, MemoryKind::Plain).unwrap();
        stream
            .write(m.ptr(), &input(DataType::F32, 0, 1000, 1))
            .unwrap();
        let start = Instant::now();
        // SAFETY: 4096 bytes hold 1000 f32 and live past the synchronize.
        unsafe {
            comm.all_reduce(
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
        let e = comm.check_error(&stream).unwrap_err().to_string();
        assert!(e.contains("rank 1"), "{transport}: {e}");
        assert!(start.elapsed() < Duration::from_secs(15), "{transport}");
        comm.bootstrap().barrier().unwrap();
        peer.join().unwrap();
        drop(comm);
    }
}

/// Child side of `across_processes`: one rank of a job started by it.
#[test]
#[ignore = "run by across_processes as a child process"]
fn child_rank() {
    if std::env::var("OXCCL_TEST_CHILD").is_err() {
        return;
    }
    // OXCCL_ALGO=port_channel and the PortChannel settings come from the environment.
    let comm = Communicator::from_env().unwrap();
    assert!(comm.instance(PORT_CHANNEL).is_some());
    let stream = comm.device().create_stream().unwrap();
    let world = comm.world_size();
    let r = Rank {
        comm,
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
    r.comm.destroy().unwrap();
}

/// The same protocol across real processes (this test binary re-executed), over TCP and
/// over IPC (memfd mappings between processes).
#[test]
fn across_processes() {
    for (world, transport) in [(3u32, "tcp"), (3, "ipc")] {
        common::run_child_ranks(
            world,
            &[
                ("OXCCL_ALGO", "port_channel"),
                ("OXCCL_STAGING_MB", "1"),
                ("OXCCL_PORT_TRANSPORT", transport),
                ("OXCCL_PORT_CHUNK_KB", "64"),
            ],
            &format!("world {world} {transport}"),
        );
    }
}
