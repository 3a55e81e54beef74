//! All-gather on the host backend across ranks: every algorithm forced and the default
//! selection, every data type, counts that are not powers of two, in and out of place
//! (NCCL's rule: the input is this rank's slot of the output), registered and unregistered
//! outputs, staging rounds, bad input, mixed with allreduce on one communicator, and real
//! processes (this test binary re-executed). Every output slot is compared bit for bit with
//! the rank's input, the output poisoned first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::all_gather::{
    direct::ALLGATHER_DIRECT, one_shot::ALLGATHER_ONESHOT_LL, staged::ALLGATHER_STAGED,
};
use oxccl_collectives::algorithms::all_reduce::two_shot::TWOSHOT;
use oxccl_collectives::algorithms::Forced;
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Memory, MemoryKind, ReduceOp, Stream,
};
use oxccl_collectives::{Algorithm, Collective, CommConfig, Communicator};

mod common;
use common::{input, threads_with, Rank};

fn config(forced: Forced) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        staging_bytes: 64 << 10, // small staging: large counts take several rounds
        forced,
        ..CommConfig::default()
    }
}

fn threads(world: u32, forced: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(world, move |_| config(forced.into()), body);
}

/// Output bytes poisoned before every call.
const POISON: u8 = 0x5a;

/// One checked all-gather of `count` elements per rank. Out of place, the input sits one
/// element past 16-byte alignment (the kernels' byte paths); in place, it is this rank's
/// slot of the output. With `register`, the output buffer is registered first (collective).
fn check(
    r: &Rank,
    dtype: DataType,
    count: usize,
    in_place: bool,
    register: bool,
    salt: u64,
) -> Result<(), String> {
    let (rank, world) = (r.comm.rank(), r.comm.world_size());
    let bytes = dtype.bytes(count).unwrap();
    let total = bytes * world as usize;
    let out_mem = r
        .comm
        .device()
        .alloc(total + 16, MemoryKind::Plain)
        .unwrap();
    let in_mem = r
        .comm
        .device()
        .alloc(bytes + 16, MemoryKind::Plain)
        .unwrap();
    if register {
        r.comm.register(&out_mem).unwrap();
    }
    let out = out_mem.ptr();
    let inp = if in_place {
        out.offset(rank as usize * bytes).unwrap()
    } else {
        in_mem.ptr().offset(dtype.size()).unwrap()
    };
    r.stream.write(out, &vec![POISON; total]).unwrap();
    r.stream
        .write(inp, &input(dtype, rank, count, salt))
        .unwrap();
    // SAFETY: the input holds `count` elements, the output `world * count`; both live until
    // the synchronize below.
    let result = unsafe { r.comm.all_gather(inp, out, count, dtype, &r.stream) };
    r.stream.synchronize().unwrap();
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let mut got = vec![0u8; total];
            r.stream.read(out, &mut got).unwrap();
            for src in 0..world {
                let want = input(dtype, src, count, salt);
                let slot = &got[src as usize * bytes..][..bytes];
                if let Some(i) = slot.iter().zip(&want).position(|(g, w)| g != w) {
                    return Err(format!(
                        "rank {rank} {dtype} count {count} in_place {in_place} registered \
                         {register}: slot {src} byte {i} is {:#x}, want {:#x}",
                        slot[i], want[i]
                    ));
                }
            }
            Ok(())
        });
    if register {
        r.comm.deregister(&out_mem).unwrap();
    }
    outcome
}

#[test]
fn every_algorithm_type_and_placement_on_three_ranks() {
    for algo in [ALLGATHER_ONESHOT_LL, ALLGATHER_STAGED, ALLGATHER_DIRECT] {
        threads(3, Some(algo), move |r| {
            let register = algo == ALLGATHER_DIRECT;
            let mut salt = 0;
            for dtype in DataType::ALL {
                for (count, in_place) in [(1, false), (3, true), (1000, false), (4097, true)] {
                    salt += 1;
                    check(r, dtype, count, in_place, register, salt).unwrap();
                }
            }
        });
    }
}

#[test]
fn odd_and_large_counts_on_world_sizes_one_to_four() {
    for world in 1..=4 {
        for algo in [
            None,
            Some(ALLGATHER_ONESHOT_LL),
            Some(ALLGATHER_STAGED),
            Some(ALLGATHER_DIRECT),
        ] {
            threads(world, algo, move |r| {
                let register = algo == Some(ALLGATHER_DIRECT);
                // 64 KiB staging: 100_003 bf16 per rank take several rounds of the staged one.
                let mut counts = vec![1usize, 7, 12_345];
                if algo != Some(ALLGATHER_ONESHOT_LL) {
                    counts.push(100_003);
                }
                for (i, count) in counts.into_iter().enumerate() {
                    for in_place in [false, true] {
                        check(r, DataType::Bf16, count, in_place, register, i as u64).unwrap();
                    }
                }
                // Repeated calls on the same buffers: every call's data, not a stale one.
                for salt in 10..14 {
                    check(r, DataType::F32, 333, false, register, salt).unwrap();
                }
            });
        }
    }
}

#[test]
fn default_selection_by_size_and_registration() {
    threads(2, None, |r| {
        let small = r
            .comm
            .choose_collective(Collective::AllGather, 1000, DataType::Bf16)
            .unwrap();
        assert_eq!(small.algorithm, ALLGATHER_ONESHOT_LL, "{}", small.reason);
        let large = r
            .comm
            .choose_collective(Collective::AllGather, 4 << 20, DataType::Bf16)
            .unwrap();
        assert_eq!(large.algorithm, ALLGATHER_STAGED, "{}", large.reason);
        // Registered outputs above the one-shot size go direct; the default path serves them.
        check(r, DataType::Bf16, 300_001, false, true, 1).unwrap();
        check(r, DataType::Bf16, 300_001, true, true, 2).unwrap();
        check(r, DataType::Bf16, 300_001, false, false, 3).unwrap();
    });
}

#[test]
fn allgather_and_allreduce_share_one_communicator() {
    // Forcing an allreduce algorithm leaves all-gather's choice alone, and calls of both
    // collectives interleave on one stream (one epoch, one shared scratch).
    threads_with(
        2,
        |_| config("twoshot".parse().unwrap()),
        |r| {
            assert!(r.comm.instance(TWOSHOT).is_some());
            assert!(r.comm.instance(ALLGATHER_STAGED).is_some());
            let dev = r.comm.device();
            let count = 5001;
            let buf = dev.alloc(count * 4, MemoryKind::Plain).unwrap();
            for salt in 0..3 {
                check(r, DataType::Bf16, 2049, salt % 2 == 0, false, salt).unwrap();
                let data = input(DataType::F32, r.comm.rank(), count, salt);
                r.stream.write(buf.ptr(), &data).unwrap();
                // SAFETY: `buf` holds `count` f32 and lives until the synchronize below.
                unsafe {
                    r.comm
                        .all_reduce(
                            buf.ptr(),
                            buf.ptr(),
                            count,
                            DataType::F32,
                            ReduceOp::Sum,
                            AccumType::Auto,
                            &r.stream,
                        )
                        .unwrap();
                }
                r.stream.synchronize().unwrap();
                let mut got = vec![0u8; count * 4];
                r.stream.read(buf.ptr(), &mut got).unwrap();
                let want = common::expected(
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    2,
                    count,
                    salt,
                );
                common::same_bits(DataType::F32, &got, &want, count).unwrap();
            }
        },
    );
}

#[test]
fn bad_input_is_refused_before_any_launch() {
    threads(2, None, |r| {
        let rank = r.comm.rank() as usize;
        let dev = r.comm.device();
        let out = dev.alloc(4096, MemoryKind::Plain).unwrap();
        let inp = dev.alloc(1024, MemoryKind::Plain).unwrap();
        let call = |i: DevicePtr, o: DevicePtr, count: usize, dtype: DataType| {
            // SAFETY: every call here is refused before a launch (the checks under test).
            unsafe { r.comm.all_gather(i, o, count, dtype, &r.stream) }
                .unwrap_err()
                .to_string()
        };
        // Another rank's slot as the input: overlapping, not in place.
        let other = out.ptr().offset((1 - rank) * 400).unwrap();
        assert!(call(other, out.ptr(), 100, DataType::F32).contains("not in place"));
        assert!(call(DevicePtr::NULL, out.ptr(), 100, DataType::F32).contains("null"));
        let odd = inp.ptr().offset(2).unwrap();
        assert!(call(odd, out.ptr(), 100, DataType::F32).contains("aligned"));
        assert!(!call(inp.ptr(), out.ptr(), usize::MAX / 2, DataType::F32).is_empty());
        // The direct kernel needs outputs its peers can reach: forcing it on one that
        // cannot be shared (a mapping, not an allocation) is an error.
        let e = threads_forced_direct_error();
        assert!(e.contains("registered"), "{e}");
        // Nothing was launched: the communicator still works.
        check(r, DataType::F32, 100, false, false, 9).unwrap();
    });
}

/// What a communicator with `allgather_direct` forced says about an unregistered call.
fn threads_forced_direct_error() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    threads(1, Some(ALLGATHER_DIRECT), move |r| {
        let dev = r.comm.device();
        let out = dev.alloc(64, MemoryKind::Plain).unwrap();
        let view = dev
            .import_memory(&dev.export_memory(&out).unwrap())
            .unwrap();
        let inp = dev.alloc(64, MemoryKind::Plain).unwrap();
        // SAFETY: refused before a launch.
        let e = unsafe {
            r.comm
                .all_gather(inp.ptr(), view.ptr(), 4, DataType::F32, &r.stream)
        }
        .unwrap_err()
        .to_string();
        tx.lock().unwrap().send(e).unwrap();
    });
    rx.recv().unwrap()
}

#[test]
#[ignore = "a rank process of ranks_in_separate_processes"]
fn child_rank() {
    if std::env::var("OXCCL_TEST_CHILD").is_err() {
        return;
    }
    let comm = Communicator::from_env().unwrap();
    let stream = comm.device().create_stream().unwrap();
    let r = Rank { comm, stream };
    let register = std::env::var("OXCCL_ALGO").is_ok_and(|a| a == "allgather_direct");
    for (i, count) in [1usize, 777, 50_001, 200_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F32] {
            check(&r, dtype, count, i % 2 == 0, register, i as u64).unwrap();
        }
    }
    r.stream.synchronize().unwrap();
    r.comm.destroy().unwrap();
}

#[test]
fn ranks_in_separate_processes() {
    for (world, algo) in [
        (2, "auto"),
        (3, "allgather_staged"),
        (2, "allgather_direct"),
        (3, "allgather_oneshot_ll"),
    ] {
        common::run_child_ranks(
            world,
            &[("OXCCL_ALGO", algo), ("OXCCL_STAGING_MB", "1")],
            &format!("world {world} algo {algo}"),
        );
    }
}

#[test]
fn eight_ranks() {
    for algo in [ALLGATHER_ONESHOT_LL, ALLGATHER_STAGED, ALLGATHER_DIRECT] {
        threads(8, Some(algo), move |r| {
            for (i, count) in [1usize, 1000, 12_345].into_iter().enumerate() {
                check(
                    r,
                    DataType::Bf16,
                    count,
                    i % 2 == 1,
                    algo == ALLGATHER_DIRECT,
                    i as u64,
                )
                .unwrap();
            }
        });
    }
}
