//! All-to-all on the host backend across ranks: every algorithm forced and the default
//! selection, every data type, counts that are not powers of two, registered and
//! unregistered outputs, staging rounds, overlapping buffers refused, and real processes
//! (this test binary re-executed). Every output slot is compared bit for bit with the
//! chunk its sender's input holds for this rank, the output poisoned first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::all_to_all::{
    copy_engine::ALLTOALL_COPY, direct::ALLTOALL_DIRECT, one_shot::ALLTOALL_ONESHOT_LL,
    staged::ALLTOALL_STAGED,
};
use oxccl_collectives::hal::{DataType, Device, Memory, MemoryKind, Stream};
use oxccl_collectives::{Algorithm, Collective, CommConfig, Communicator};

mod common;
use common::{input, threads_with, Rank};

fn threads(world: u32, forced: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(
        world,
        move |_| CommConfig {
            timeout: Duration::from_secs(20),
            staging_bytes: 64 << 10, // small staging: large counts take several rounds
            forced: forced.into(),
            ..CommConfig::default()
        },
        body,
    );
}

/// One checked all-to-all of `count` elements per chunk. The input sits one element past
/// 16-byte alignment (the kernels' byte paths). With `register`, the output buffer is
/// registered first (collective).
fn check(r: &Rank, dtype: DataType, count: usize, register: bool, salt: u64) -> Result<(), String> {
    let (rank, world) = (r.comm.rank(), r.comm.world_size());
    let bytes = dtype.bytes(count).unwrap();
    let total = bytes * world as usize;
    let in_mem = r
        .comm
        .device()
        .alloc(total + 16, MemoryKind::Plain)
        .unwrap();
    let out_mem = r
        .comm
        .device()
        .alloc(total + 16, MemoryKind::Plain)
        .unwrap();
    if register {
        r.comm.register(&out_mem).unwrap();
    }
    let inp = in_mem.ptr().offset(dtype.size()).unwrap();
    let out = out_mem.ptr();
    r.stream.write(out, &vec![0x5au8; total]).unwrap();
    r.stream
        .write(inp, &input(dtype, rank, world as usize * count, salt))
        .unwrap();
    // SAFETY: both buffers hold `world * count` elements and live until the synchronize
    // below.
    let result = unsafe { r.comm.all_to_all(inp, out, count, dtype, &r.stream) };
    r.stream.synchronize().unwrap();
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let mut got = vec![0u8; total];
            r.stream.read(out, &mut got).unwrap();
            for src in 0..world as usize {
                let sent = input(dtype, src as u32, world as usize * count, salt);
                let want = &sent[rank as usize * bytes..][..bytes];
                let slot = &got[src * bytes..][..bytes];
                if let Some(i) = slot.iter().zip(want).position(|(g, w)| g != w) {
                    return Err(format!(
                        "rank {rank} {dtype} count {count} registered {register}: slot {src} \
                         byte {i} is {:#x}, want {:#x}",
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

/// Whether `algo` needs registered outputs (the direct kernel and the copy engine).
fn registers(algo: Algorithm) -> bool {
    algo == ALLTOALL_DIRECT || algo == ALLTOALL_COPY
}

#[test]
fn every_algorithm_and_type_on_three_ranks() {
    for algo in [
        ALLTOALL_ONESHOT_LL,
        ALLTOALL_STAGED,
        ALLTOALL_DIRECT,
        ALLTOALL_COPY,
    ] {
        threads(3, Some(algo), move |r| {
            let mut salt = 0;
            for dtype in DataType::ALL {
                for count in [1, 3, 1000, 4097] {
                    salt += 1;
                    check(r, dtype, count, registers(algo), salt).unwrap();
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
            Some(ALLTOALL_ONESHOT_LL),
            Some(ALLTOALL_STAGED),
            Some(ALLTOALL_DIRECT),
            Some(ALLTOALL_COPY),
        ] {
            threads(world, algo, move |r| {
                let register = algo.is_some_and(registers);
                let mut counts = vec![1usize, 7, 12_345];
                if algo != Some(ALLTOALL_ONESHOT_LL) {
                    counts.push(100_003);
                }
                for (i, count) in counts.into_iter().enumerate() {
                    check(r, DataType::Bf16, count, register, i as u64).unwrap();
                }
                for salt in 10..14 {
                    check(r, DataType::F32, 333, register, salt).unwrap();
                }
            });
        }
    }
}

#[test]
fn default_selection_and_overlap() {
    threads(2, None, |r| {
        let small = r
            .comm
            .choose_collective(Collective::AllToAll, 1000, DataType::Bf16)
            .unwrap();
        assert_eq!(small.algorithm, ALLTOALL_ONESHOT_LL, "{}", small.reason);
        let large = r
            .comm
            .choose_collective(Collective::AllToAll, 4 << 20, DataType::Bf16)
            .unwrap();
        assert_eq!(large.algorithm, ALLTOALL_STAGED, "{}", large.reason);
        check(r, DataType::Bf16, 300_001, true, 1).unwrap();
        check(r, DataType::Bf16, 300_001, false, 2).unwrap();
        let buf = r.comm.device().alloc(1024, MemoryKind::Plain).unwrap();
        // SAFETY: refused before any launch.
        let e = unsafe {
            r.comm
                .all_to_all(buf.ptr(), buf.ptr(), 8, DataType::F32, &r.stream)
        }
        .unwrap_err()
        .to_string();
        assert!(e.contains("no in-place form"), "{e}");
        check(r, DataType::F32, 100, false, 3).unwrap();
    });
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
    let register =
        std::env::var("OXCCL_ALGO").is_ok_and(|a| a == "alltoall_direct" || a == "alltoall_copy");
    for (i, count) in [1usize, 777, 50_001, 200_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F32] {
            check(&r, dtype, count, register, i as u64).unwrap();
        }
    }
    r.stream.synchronize().unwrap();
    r.comm.destroy().unwrap();
}

#[test]
fn ranks_in_separate_processes() {
    for (world, algo) in [
        (2, "auto"),
        (3, "alltoall_staged"),
        (2, "alltoall_direct"),
        (3, "alltoall_oneshot_ll"),
        (2, "alltoall_copy"),
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
    for algo in [
        ALLTOALL_ONESHOT_LL,
        ALLTOALL_STAGED,
        ALLTOALL_DIRECT,
        ALLTOALL_COPY,
    ] {
        threads(8, Some(algo), move |r| {
            for (i, count) in [1usize, 1000, 12_345].into_iter().enumerate() {
                check(r, DataType::Bf16, count, registers(algo), i as u64).unwrap();
            }
        });
    }
}
