//! The multi-node paths on one machine: ranks as processes (this test binary re-executed)
//! with `OXCCL_SEPARATE_HOSTS=1`, so every rank is its own node. Nothing is forced: the
//! communicator must see several nodes, map no peer memory, set up exactly the PortChannel
//! algorithms (TCP to every peer, no InfiniBand here) and choose them by itself.
//! Allreduce, all-gather and reduce-scatter on 2, 3 and 4 ranks, counts 1, 3, 1000, 12345
//! and one above 1 MiB, in and out of place (unaligned), the output poisoned first, every
//! result compared bit for bit with the host reference; the inputs come from a seed the
//! parent draws per run (printed, and taken from `OXCCL_TEST_SEED` when set). The
//! collectives with no multi-node algorithm are refused with a clear error, and a bad value
//! of the switch is refused at creation. In-process tests (forced PortChannel algorithms,
//! IPC and TCP) are in `port_channel_allreduce.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use oxccl_collectives::algorithms::all_gather::port_channel::ALLGATHER_PORT;
use std::time::Duration;

use oxccl_collectives::algorithms::all_reduce::port_channel::{
    PortAlgorithm, PortConfig, PORT_CHANNEL,
};
use oxccl_collectives::algorithms::reduce_scatter::port_channel::REDUCESCATTER_PORT;
use oxccl_collectives::backend::AnyStream;
use oxccl_collectives::channels::connection::Transport;
use oxccl_collectives::hal::{AccumType, DataType, Device, Memory, MemoryKind, ReduceOp, Stream};
use oxccl_collectives::kernels::reduce;
use oxccl_collectives::{Collective, CommConfig, Communicator};

mod common;
use common::{input, same_bits};

/// Counts per rank: not powers of two, the last above 1 MiB of f32 (several 256 KiB rounds).
const COUNTS: [usize; 5] = [1, 3, 1000, 12345, (1 << 18) + 3];

/// The reference result of rank `rank`: allreduce the reduction of every input, all-gather
/// every input in rank order, reduce-scatter the reduction of chunk `rank` of every input.
fn expected(
    collective: Collective,
    (dtype, op): (DataType, ReduceOp),
    (world, rank): (u32, u32),
    count: usize,
    salt: u64,
) -> Vec<u8> {
    let bytes = dtype.bytes(count).unwrap();
    let (in_count, _) = sizes(collective, world, count);
    let inputs: Vec<Vec<u8>> = (0..world)
        .map(|r| input(dtype, r, in_count, salt))
        .collect();
    let reduced = |chunks: Vec<&[u8]>| {
        let mut out = vec![0u8; bytes];
        reduce::reduce(dtype, op, AccumType::Auto, &chunks, &mut out, count).unwrap();
        out
    };
    match collective {
        Collective::AllReduce => reduced(inputs.iter().map(|v| v.as_slice()).collect()),
        Collective::AllGather => inputs.concat(),
        Collective::ReduceScatter => reduced(
            inputs
                .iter()
                .map(|v| &v[rank as usize * bytes..][..bytes])
                .collect(),
        ),
        other => panic!("{other} has no multi-node algorithm"),
    }
}

/// Elements of one rank's input and output.
fn sizes(collective: Collective, world: u32, count: usize) -> (usize, usize) {
    let all = world as usize * count;
    match collective {
        Collective::AllGather => (count, all),
        Collective::ReduceScatter => (all, count),
        _ => (count, count),
    }
}

/// One checked call. In place by NCCL's rules (all-gather: the input is this rank's slot
/// of the output; reduce-scatter: the output is this rank's chunk of the input); out of
/// place, the input sits one element past 16-byte alignment (the kernels' byte paths).
fn check(
    comm: &Communicator,
    stream: &AnyStream,
    collective: Collective,
    (dtype, op): (DataType, ReduceOp),
    count: usize,
    in_place: bool,
    salt: u64,
) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let size = dtype.size();
    let (in_count, out_count) = sizes(collective, world, count);
    let (in_bytes, out_bytes) = (in_count * size, out_count * size);
    let slot = rank as usize * dtype.bytes(count).unwrap();
    let a = comm
        .device()
        .alloc(in_bytes.max(out_bytes) + 16, MemoryKind::Plain)
        .unwrap();
    let b = comm
        .device()
        .alloc(out_bytes + 16, MemoryKind::Plain)
        .unwrap();
    let (inp, out) = match (in_place, collective) {
        (false, _) => (a.ptr().offset(size).unwrap(), b.ptr()),
        (true, Collective::AllGather) => (a.ptr().offset(slot).unwrap(), a.ptr()),
        (true, Collective::ReduceScatter) => (a.ptr(), a.ptr().offset(slot).unwrap()),
        (true, _) => (a.ptr(), a.ptr()),
    };
    // Poison the whole output, then write the input (in place, inside the output).
    stream.write(out, &vec![0xa5u8; out_bytes]).unwrap();
    stream
        .write(inp, &input(dtype, rank, in_count, salt))
        .unwrap();
    // SAFETY: the input holds `in_count` elements and the output `out_count`, both live
    // until the synchronize below.
    let launched = unsafe {
        match collective {
            Collective::AllReduce => {
                comm.all_reduce(inp, out, count, dtype, op, AccumType::Auto, stream)
            }
            Collective::AllGather => comm.all_gather(inp, out, count, dtype, stream),
            Collective::ReduceScatter => {
                comm.reduce_scatter(inp, out, count, dtype, op, AccumType::Auto, stream)
            }
            other => panic!("{other}"),
        }
    };
    let what = format!(
        "rank {rank}/{world} {collective} {dtype} {op} count {count} in_place {in_place} salt \
         {salt}"
    );
    launched.map_err(|e| format!("{what}: {e}"))?;
    stream.synchronize().map_err(|e| format!("{what}: {e}"))?;
    comm.check_error(stream)
        .map_err(|e| format!("{what}: {e}"))?;
    let mut got = vec![0u8; out_bytes];
    stream.read(out, &mut got).unwrap();
    let want = expected(collective, (dtype, op), (world, rank), count, salt);
    same_bits(dtype, &got, &want, out_count).map_err(|d| format!("{what}: {d}"))
}

/// The refusal of a collective that has no multi-node algorithm, before any launch.
fn refused(comm: &Communicator, stream: &AnyStream, collective: Collective) {
    let world = comm.world_size() as usize;
    let buf = comm
        .device()
        .alloc(2 * world * 64, MemoryKind::Plain)
        .unwrap();
    let (a, b) = (buf.ptr(), buf.ptr().offset(world * 64).unwrap());
    // SAFETY: refused before any launch (the buffers would hold the call anyway).
    let e = unsafe {
        match collective {
            Collective::AllToAll => comm.all_to_all(a, b, 4, DataType::F32, stream),
            Collective::Broadcast => comm.broadcast(a, b, 4, DataType::F32, 0, stream),
            Collective::Reduce => comm.reduce(
                a,
                b,
                4,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                0,
                stream,
            ),
            other => panic!("{other}"),
        }
    }
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&collective.to_string())
            && e.contains("several nodes")
            && e.contains("no multi-node algorithm"),
        "{e}"
    );
}

/// Child side of the tests below: one rank of a job they started.
#[test]
#[ignore = "run by the tests below as a child process"]
fn child_rank() {
    let Ok(mode) = std::env::var("OXCCL_TEST_CHILD_MODE") else {
        return;
    };
    if mode == "bad-switch" {
        let e = Communicator::from_env().unwrap_err().to_string();
        assert!(
            e.contains("OXCCL_SEPARATE_HOSTS") && e.contains("yes"),
            "{e}"
        );
        return;
    }
    let seed: u64 = std::env::var("OXCCL_TEST_SEED").unwrap().parse().unwrap();
    let comm = Communicator::from_env().unwrap();
    let stream = comm.device().create_stream().unwrap();
    let (rank, world) = (comm.rank(), comm.world_size());
    // Every rank its own node: no peer memory mapped, only the PortChannel algorithms.
    assert!(comm.multi_node() && !comm.nvlink());
    assert_eq!(comm.peer_mappings(), 0);
    let ports = [PORT_CHANNEL, ALLGATHER_PORT, REDUCESCATTER_PORT];
    for a in oxccl_collectives::ALGORITHMS {
        assert_eq!(comm.instance(*a).is_some(), ports.contains(a), "{a}");
    }
    let port = comm
        .instance(PORT_CHANNEL)
        .and_then(|i| i.as_any().downcast_ref::<PortAlgorithm>())
        .unwrap();
    for (p, t) in port.transports().iter().enumerate() {
        assert_eq!(*t, (p as u32 != rank).then_some(Transport::Tcp), "peer {p}");
    }
    // Only TCP peers: the scratch is pinned host memory the sockets move in place.
    assert!(port.scratch_in_host_memory());
    // Chosen without OXCCL_ALGO.
    for (c, a) in [
        (Collective::AllReduce, PORT_CHANNEL),
        (Collective::AllGather, ALLGATHER_PORT),
        (Collective::ReduceScatter, REDUCESCATTER_PORT),
    ] {
        assert_eq!(
            comm.choose_collective(c, 1000, DataType::F32)
                .unwrap()
                .algorithm,
            a
        );
    }
    // Registration maps nothing across nodes.
    let reg = comm.device().alloc(4096, MemoryKind::Plain).unwrap();
    comm.register(&reg).unwrap();
    assert_eq!(comm.registered_buffers(), 0);
    let mut i = 0u64;
    for collective in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        for count in COUNTS {
            // The large count in f32 only (runtime); the others in two formats.
            let dtypes: &[DataType] = if count > 1 << 16 {
                &[DataType::F32]
            } else {
                &[DataType::Bf16, DataType::F32]
            };
            for &dtype in dtypes {
                i += 1;
                let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg][i as usize % 3];
                check(
                    &comm,
                    &stream,
                    collective,
                    (dtype, op),
                    count,
                    i % 2 == 0,
                    seed.wrapping_add(i),
                )
                .unwrap();
            }
        }
    }
    // Integers and fp8 through the reducing kernels, once each (world-size independent).
    for (dtype, op) in [
        (DataType::I32, ReduceOp::Min),
        (DataType::Fp8E4m3b15, ReduceOp::Sum),
    ] {
        for collective in [Collective::AllReduce, Collective::ReduceScatter] {
            i += 1;
            check(
                &comm,
                &stream,
                collective,
                (dtype, op),
                777,
                i % 2 == 0,
                seed ^ i,
            )
            .unwrap();
        }
    }
    for collective in [
        Collective::AllToAll,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        refused(&comm, &stream, collective);
    }
    comm.destroy().unwrap();
    eprintln!("rank {rank}/{world}: PASS");
}

/// A seed per run, the same for every rank of the run.
fn seed() -> String {
    std::env::var("OXCCL_TEST_SEED").unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        (t.as_nanos() as u64).to_string()
    })
}

#[test]
fn separate_hosts_on_two_three_and_four_ranks() {
    let seed = seed();
    eprintln!("OXCCL_TEST_SEED={seed}");
    for world in [2u32, 3, 4] {
        common::run_child_ranks(
            world,
            &[
                ("OXCCL_TEST_CHILD_MODE", "run"),
                ("OXCCL_TEST_SEED", &seed),
                ("OXCCL_SEPARATE_HOSTS", "1"),
                ("OXCCL_STAGING_MB", "1"),
                ("OXCCL_PORT_CHUNK_KB", "256"),
            ],
            &format!("world {world}, seed {seed}"),
        );
    }
}

#[test]
fn a_bad_switch_value_is_refused() {
    common::run_child_ranks(
        2,
        &[
            ("OXCCL_TEST_CHILD_MODE", "bad-switch"),
            ("OXCCL_SEPARATE_HOSTS", "yes"),
        ],
        "OXCCL_SEPARATE_HOSTS=yes",
    );
}

/// The PortChannel all-gather and reduce-scatter through the IPC transport as well (ranks
/// as threads of this process, `port_channel` forced: they may be on several hosts, so the
/// other collectives take their PortChannel algorithms), small rounds and a small FIFO
/// (many rounds per call, the FIFO wraps), calls of the three collectives interleaved (one
/// round counter).
#[test]
fn forced_in_process_over_ipc_and_tcp() {
    for transport in [Transport::Ipc, Transport::Tcp] {
        common::threads_with(
            3,
            move |_| CommConfig {
                forced: PORT_CHANNEL.into(),
                timeout: Duration::from_secs(20),
                staging_bytes: 64 << 10,
                port: PortConfig {
                    chunk_bytes: 4096,
                    transport: Some(transport),
                    fifo_size: Some(8),
                },
                ..CommConfig::default()
            },
            move |r| {
                assert!(!r.comm.multi_node());
                let mut i = 0u64;
                for count in [1usize, 3, 1000, 12345] {
                    for collective in [
                        Collective::AllGather,
                        Collective::ReduceScatter,
                        Collective::AllReduce,
                    ] {
                        i += 1;
                        let dtype = [DataType::F16, DataType::F32, DataType::U8][i as usize % 3];
                        check(
                            &r.comm,
                            &r.stream,
                            collective,
                            (dtype, ReduceOp::Sum),
                            count,
                            i % 2 == 1,
                            i,
                        )
                        .unwrap_or_else(|e| panic!("{transport}: {e}"));
                    }
                }
            },
        );
    }
}
