//! Reduce-scatter on the host backend across ranks: every algorithm forced and the default
//! selection, every data type, op and accumulation, counts that are not powers of two, in
//! and out of place (NCCL's rule: the output is this rank's chunk of the input), registered
//! and unregistered inputs, staging rounds, bad input, and real processes (this test binary
//! re-executed). Every output is compared bit for bit with the host reference reduction of
//! that rank's chunk, in rank order, the output poisoned first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::reduce_scatter::{
    direct::REDUCESCATTER_DIRECT, one_shot::REDUCESCATTER_ONESHOT_LL, staged::REDUCESCATTER_STAGED,
};
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Memory, MemoryKind, ReduceOp, Stream,
};
use oxccl_collectives::kernels::reduce;
use oxccl_collectives::{Algorithm, Collective, CommConfig, Communicator};

mod common;
use common::{accums, all_reduce_and_read, input, same_bits, threads_with, Rank};

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

/// What rank `rank` must hold: chunk `rank` of every rank's input, reduced in rank order.
fn expected(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    world: u32,
    rank: u32,
    count: usize,
    salt: u64,
) -> Vec<u8> {
    let bytes = dtype.bytes(count).unwrap();
    let chunks: Vec<Vec<u8>> = (0..world)
        .map(|r| {
            input(dtype, r, world as usize * count, salt)[rank as usize * bytes..][..bytes].to_vec()
        })
        .collect();
    let refs: Vec<&[u8]> = chunks.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0u8; bytes];
    reduce::reduce(dtype, op, accum, &refs, &mut out, count).unwrap();
    out
}

/// One checked reduce-scatter of `count` output elements per rank. Out of place, the
/// output sits one element past 16-byte alignment (the kernels' byte paths); in place, it
/// is this rank's chunk of the input. With `register`, the input buffer is registered.
#[allow(clippy::too_many_arguments)]
fn check(
    r: &Rank,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    count: usize,
    in_place: bool,
    register: bool,
    salt: u64,
) -> Result<(), String> {
    let (rank, world) = (r.comm.rank(), r.comm.world_size());
    let bytes = dtype.bytes(count).unwrap();
    let in_mem = r
        .comm
        .device()
        .alloc(bytes * world as usize + 16, MemoryKind::Plain)
        .unwrap();
    let out_mem = r
        .comm
        .device()
        .alloc(bytes + 16, MemoryKind::Plain)
        .unwrap();
    if register {
        r.comm.register(&in_mem).unwrap();
    }
    let inp = in_mem.ptr();
    let out = if in_place {
        inp.offset(rank as usize * bytes).unwrap()
    } else {
        out_mem.ptr().offset(dtype.size()).unwrap()
    };
    r.stream
        .write(inp, &input(dtype, rank, world as usize * count, salt))
        .unwrap();
    if !in_place {
        r.stream.write(out, &vec![0x5au8; bytes]).unwrap();
    }
    // SAFETY: the input holds `world * count` elements, the output `count`; both live until
    // the synchronize below.
    let result = unsafe {
        r.comm
            .reduce_scatter(inp, out, count, dtype, op, accum, &r.stream)
    };
    r.stream.synchronize().unwrap();
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let mut got = vec![0u8; bytes];
            r.stream.read(out, &mut got).unwrap();
            let want = expected(dtype, op, accum, world, rank, count, salt);
            same_bits(dtype, &got, &want, count).map_err(|d| {
                format!(
                    "rank {rank} {dtype} {op} {accum} count {count} in_place {in_place} \
                     registered {register}: {d}"
                )
            })
        });
    if register {
        r.comm.deregister(&in_mem).unwrap();
    }
    outcome
}

const ALGOS: [Algorithm; 3] = [
    REDUCESCATTER_ONESHOT_LL,
    REDUCESCATTER_STAGED,
    REDUCESCATTER_DIRECT,
];

#[test]
fn every_algorithm_type_op_and_accumulation_on_three_ranks() {
    for algo in ALGOS {
        threads(3, Some(algo), move |r| {
            let register = algo == REDUCESCATTER_DIRECT;
            let mut salt = 0;
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    for accum in accums(dtype) {
                        for (count, in_place) in [(1, false), (3, true), (1001, false)] {
                            salt += 1;
                            check(r, dtype, op, accum, count, in_place, register, salt).unwrap();
                        }
                    }
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
            Some(REDUCESCATTER_ONESHOT_LL),
            Some(REDUCESCATTER_STAGED),
            Some(REDUCESCATTER_DIRECT),
        ] {
            threads(world, algo, move |r| {
                let register = algo == Some(REDUCESCATTER_DIRECT);
                // 64 KiB staging: 100_003 bf16 per rank take several rounds of the staged one.
                let mut counts = vec![1usize, 7, 12_345];
                if algo != Some(REDUCESCATTER_ONESHOT_LL) {
                    counts.push(100_003);
                }
                for (i, count) in counts.into_iter().enumerate() {
                    for in_place in [false, true] {
                        check(
                            r,
                            DataType::Bf16,
                            ReduceOp::Sum,
                            AccumType::Auto,
                            count,
                            in_place,
                            register,
                            i as u64,
                        )
                        .unwrap();
                    }
                }
                // Repeated calls on fresh data: every call's result, not a stale one.
                for salt in 10..14 {
                    check(
                        r,
                        DataType::F32,
                        ReduceOp::Max,
                        AccumType::Auto,
                        333,
                        false,
                        register,
                        salt,
                    )
                    .unwrap();
                }
            });
        }
    }
}

#[test]
fn default_selection_and_the_other_collectives_on_one_communicator() {
    threads(2, None, |r| {
        let small = r
            .comm
            .choose_collective(Collective::ReduceScatter, 1000, DataType::Bf16)
            .unwrap();
        assert_eq!(
            small.algorithm, REDUCESCATTER_ONESHOT_LL,
            "{}",
            small.reason
        );
        let large = r
            .comm
            .choose_collective(Collective::ReduceScatter, 4 << 20, DataType::Bf16)
            .unwrap();
        assert_eq!(large.algorithm, REDUCESCATTER_STAGED, "{}", large.reason);
        for salt in 0..3 {
            check(
                r,
                DataType::Bf16,
                ReduceOp::Sum,
                AccumType::F32,
                300_001,
                salt % 2 == 0,
                salt == 1,
                salt,
            )
            .unwrap();
            // An all-gather and an allreduce in between, on the same stream and scratch.
            let buf = r
                .comm
                .device()
                .alloc(4 * 2 * 100, MemoryKind::Plain)
                .unwrap();
            let own = buf.ptr().offset(r.comm.rank() as usize * 400).unwrap();
            r.stream
                .write(own, &input(DataType::F32, r.comm.rank(), 100, salt))
                .unwrap();
            // SAFETY: `buf` holds 2 x 100 f32, in place, and outlives both calls (the
            // second synchronizes).
            let got = unsafe {
                r.comm
                    .all_gather(own, buf.ptr(), 100, DataType::F32, &r.stream)
                    .unwrap();
                all_reduce_and_read(r, (buf.ptr(), buf.ptr()), 200, DataType::F32, ReduceOp::Sum)
            };
            // Every rank gathered the same 200 values and summed two copies of them.
            let mut gathered = input(DataType::F32, 0, 100, salt);
            gathered.extend(input(DataType::F32, 1, 100, salt));
            let g: &[u8] = &gathered;
            let want = {
                let mut out = vec![0u8; 800];
                reduce::reduce(
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    &[g, g],
                    &mut out,
                    200,
                )
                .unwrap();
                out
            };
            same_bits(DataType::F32, &got, &want, 200).unwrap();
        }
    });
}

#[test]
fn bad_input_is_refused_before_any_launch() {
    threads(2, None, |r| {
        let rank = r.comm.rank() as usize;
        let dev = r.comm.device();
        let inp = dev.alloc(4096, MemoryKind::Plain).unwrap();
        let out = dev.alloc(1024, MemoryKind::Plain).unwrap();
        let call = |i: DevicePtr, o: DevicePtr, count: usize, op: ReduceOp, accum: AccumType| {
            // SAFETY: every call here is refused before a launch (the checks under test).
            unsafe {
                r.comm
                    .reduce_scatter(i, o, count, DataType::F32, op, accum, &r.stream)
            }
            .unwrap_err()
            .to_string()
        };
        // The output at another rank's chunk of the input: overlapping, not in place.
        let other = inp.ptr().offset((1 - rank) * 400).unwrap();
        let e = call(inp.ptr(), other, 100, ReduceOp::Sum, AccumType::Auto);
        assert!(e.contains("not in place"), "{e}");
        assert!(call(
            inp.ptr(),
            DevicePtr::NULL,
            100,
            ReduceOp::Sum,
            AccumType::Auto
        )
        .contains("null"));
        let odd = out.ptr().offset(2).unwrap();
        assert!(call(inp.ptr(), odd, 100, ReduceOp::Sum, AccumType::Auto).contains("aligned"));
        assert!(call(inp.ptr(), out.ptr(), 100, ReduceOp::Sum, AccumType::F16).contains("f16"));
        assert!(!call(
            inp.ptr(),
            out.ptr(),
            usize::MAX / 4,
            ReduceOp::Sum,
            AccumType::Auto
        )
        .is_empty());
        // Nothing was launched: the communicator still works.
        check(
            r,
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            100,
            false,
            false,
            9,
        )
        .unwrap();
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
    let register = std::env::var("OXCCL_ALGO").is_ok_and(|a| a == "reducescatter_direct");
    for (i, count) in [1usize, 777, 50_001, 200_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F32] {
            check(
                &r,
                dtype,
                ReduceOp::Sum,
                AccumType::Auto,
                count,
                i % 2 == 0,
                register,
                i as u64,
            )
            .unwrap();
        }
    }
    r.stream.synchronize().unwrap();
    r.comm.destroy().unwrap();
}

#[test]
fn ranks_in_separate_processes() {
    for (world, algo) in [
        (2, "auto"),
        (3, "reducescatter_staged"),
        (2, "reducescatter_direct"),
        (3, "reducescatter_oneshot_ll"),
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
    for algo in ALGOS {
        threads(8, Some(algo), move |r| {
            for (i, count) in [1usize, 1000, 12_345].into_iter().enumerate() {
                let register = algo == REDUCESCATTER_DIRECT;
                check(
                    r,
                    DataType::Bf16,
                    ReduceOp::Sum,
                    AccumType::F32,
                    count,
                    i % 2 == 1,
                    register,
                    i as u64,
                )
                .unwrap();
            }
        });
    }
}
