//! Reduce (to a root) on the host backend across ranks: both algorithms forced and the
//! default selection, every root, every data type, op and accumulation, counts that are not
//! powers of two, in and out of place, registered and unregistered inputs, staging rounds,
//! null outputs on the other ranks (NCCL ignores them), bad roots and bad buffers, and real
//! processes (this test binary re-executed). The root's output is compared bit for bit with
//! the host reference reduction of every rank's input in rank order, the output poisoned
//! first; every other rank's output must stay as it was, and every input untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::reduce::{
    copy::REDUCE_COPY, direct::REDUCE_DIRECT, one_shot::REDUCE_ONESHOT_LL, relay::REDUCE_RELAY,
    staged::REDUCE_STAGED,
};
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Memory, MemoryKind, ReduceOp, Stream,
};
use oxccl_collectives::{Algorithm, Collective, CommConfig, Communicator};

mod common;
use common::{accums, all_reduce_and_read, expected, input, same_bits, threads_with, Rank};

fn threads(world: u32, forced: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(
        world,
        move |_| CommConfig {
            timeout: Duration::from_secs(20),
            staging_bytes: 64 << 10, // small staging: large counts take several rounds
            // reduce_copy out of place: 12_345 bf16 in six chunks shrinking from 8 to 1 KiB
            reduce_copy_tail_bytes: 1 << 10,
            forced: forced.into(),
            ..CommConfig::default()
        },
        body,
    );
}

/// The poison of an output before a call.
const POISON: u8 = 0x5a;

/// One checked reduce of `count` elements to `root`. The input is 16-byte aligned (and
/// registered with `register`); out of place, the output sits one element past 16-byte
/// alignment (the kernels' byte paths), and on every third salt the ranks other than the
/// root pass a null output; in place one buffer.
#[allow(clippy::too_many_arguments)]
fn check(
    r: &Rank,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    count: usize,
    root: u32,
    in_place: bool,
    register: bool,
    salt: u64,
) -> Result<(), String> {
    let (rank, world) = (r.comm.rank(), r.comm.world_size());
    let bytes = dtype.bytes(count).unwrap();
    let in_mem = r
        .comm
        .device()
        .alloc(bytes + 16, MemoryKind::Plain)
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
    let null_output = rank != root && !in_place && salt % 3 == 0;
    let out = if in_place {
        inp
    } else if null_output {
        DevicePtr::NULL
    } else {
        out_mem.ptr().offset(dtype.size()).unwrap()
    };
    let mine = input(dtype, rank, count, salt);
    r.stream.write(inp, &mine).unwrap();
    if !in_place && !null_output {
        r.stream.write(out, &vec![POISON; bytes]).unwrap();
    }
    // SAFETY: the input and (on the root, or where not null) the output hold `count`
    // elements and live until the synchronize below.
    let result = unsafe {
        r.comm
            .reduce(inp, out, count, dtype, op, accum, root, &r.stream)
    };
    r.stream.synchronize().unwrap();
    let what = format!(
        "rank {rank} root {root} {dtype} {op} {accum} count {count} in_place {in_place} \
         registered {register}"
    );
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let mut got = vec![0u8; bytes];
            if rank == root {
                r.stream.read(out, &mut got).unwrap();
                let want = expected(dtype, op, accum, world, count, salt);
                same_bits(dtype, &got, &want, count).map_err(|d| format!("{what}: {d}"))?;
            } else if !in_place && !null_output {
                r.stream.read(out, &mut got).unwrap();
                if let Some(i) = got.iter().position(|b| *b != POISON) {
                    return Err(format!(
                        "{what}: output byte {i} written on a non-root rank"
                    ));
                }
            }
            if rank != root || !in_place {
                r.stream.read(inp, &mut got).unwrap();
                if got != mine {
                    return Err(format!("{what}: the input changed"));
                }
            }
            Ok(())
        });
    if register {
        r.comm.deregister(&in_mem).unwrap();
    }
    outcome
}

/// Every algorithm and the world size it is checked on (`reduce_copy` serves 1-2 ranks).
const ALGOS: [(Algorithm, u32); 5] = [
    (REDUCE_ONESHOT_LL, 3),
    (REDUCE_STAGED, 3),
    (REDUCE_DIRECT, 3),
    (REDUCE_RELAY, 3),
    (REDUCE_COPY, 2),
];

/// Whether `algo` needs its inputs registered.
fn registers(algo: Option<Algorithm>) -> bool {
    algo == Some(REDUCE_DIRECT) || algo == Some(REDUCE_RELAY) || algo == Some(REDUCE_COPY)
}

#[test]
fn every_algorithm_root_type_op_and_accumulation_on_three_ranks() {
    for (algo, world) in ALGOS {
        threads(world, Some(algo), move |r| {
            let register = registers(Some(algo));
            let mut salt = 0;
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    for accum in accums(dtype) {
                        for root in 0..world {
                            for (count, in_place) in [(1, false), (3, true), (1000, false)] {
                                salt += 1;
                                check(r, dtype, op, accum, count, root, in_place, register, salt)
                                    .unwrap();
                            }
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn odd_and_large_counts_on_one_to_four_and_eight_ranks() {
    for world in [1, 2, 3, 4, 8] {
        for algo in [
            None,
            Some(REDUCE_ONESHOT_LL),
            Some(REDUCE_STAGED),
            Some(REDUCE_DIRECT),
            Some(REDUCE_RELAY),
            Some(REDUCE_COPY),
        ] {
            if algo == Some(REDUCE_COPY) && world > 2 {
                continue;
            }
            threads(world, algo, move |r| {
                let register = registers(algo);
                // 64 KiB staging: 12_345 and 100_003 bf16 per rank take several rounds of
                // the staged one (one slot per rank) and of the relay (half the staging
                // over the chunks per round), and several chunks of reduce_copy's
                // pipeline (in place two 32 KiB slots, each reused; out of place chunks
                // shrinking to a 1 KiB tail).
                for (i, count) in [1usize, 3, 1000, 12_345, 100_003].into_iter().enumerate() {
                    // The one-shot's packets of 200 KB per rank do not fit 8 ranks' halves.
                    if algo == Some(REDUCE_ONESHOT_LL) && count > 50_000 {
                        continue;
                    }
                    for in_place in [false, true] {
                        check(
                            r,
                            DataType::Bf16,
                            ReduceOp::Sum,
                            AccumType::F32,
                            count,
                            world - 1,
                            in_place,
                            register,
                            i as u64,
                        )
                        .unwrap();
                    }
                }
                // Repeated calls to changing roots on fresh data: every call's result, not
                // a stale one.
                for salt in 10..16 {
                    check(
                        r,
                        DataType::F32,
                        ReduceOp::Max,
                        AccumType::Auto,
                        333,
                        salt as u32 % world,
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
        let unregistered = r
            .comm
            .choose_collective(Collective::Reduce, 1000, DataType::Bf16)
            .unwrap();
        assert_eq!(
            unregistered.algorithm, REDUCE_ONESHOT_LL,
            "{}",
            unregistered.reason
        );
        let large = r
            .comm
            .choose_collective(Collective::Reduce, 2 << 20, DataType::Bf16)
            .unwrap();
        assert_eq!(large.algorithm, REDUCE_STAGED, "{}", large.reason);
        let buf = r.comm.device().alloc(4 << 20, MemoryKind::Plain).unwrap();
        r.comm.register(&buf).unwrap();
        let registered = r
            .comm
            .choose_collective_for(
                Collective::Reduce,
                buf.ptr(),
                DevicePtr::NULL,
                2 << 20,
                DataType::Bf16,
            )
            .unwrap();
        assert_eq!(registered.algorithm, REDUCE_DIRECT, "{}", registered.reason);
        r.comm.deregister(&buf).unwrap();
        for salt in 0..4 {
            let root = salt as u32 % 2;
            check(
                r,
                DataType::Bf16,
                ReduceOp::Sum,
                AccumType::F32,
                300_001,
                root,
                salt % 2 == 0,
                salt == 1,
                salt,
            )
            .unwrap();
            // A reduce to the root and a broadcast from it: the allreduce's bits on every
            // rank, on the same stream and scratch as the allreduce that checks it.
            let (count, dtype) = (1000, DataType::F32);
            let a = r.comm.device().alloc(4000, MemoryKind::Plain).unwrap();
            let b = r.comm.device().alloc(4000, MemoryKind::Plain).unwrap();
            let mine = input(dtype, r.comm.rank(), count, salt);
            r.stream.write(a.ptr(), &mine).unwrap();
            r.stream.write(b.ptr(), &mine).unwrap();
            // SAFETY: `a` and `b` hold `count` f32 each; synchronized below.
            unsafe {
                r.comm
                    .reduce(
                        a.ptr(),
                        a.ptr(),
                        count,
                        dtype,
                        ReduceOp::Prod,
                        AccumType::Auto,
                        root,
                        &r.stream,
                    )
                    .unwrap();
                r.comm
                    .broadcast(a.ptr(), a.ptr(), count, dtype, root, &r.stream)
                    .unwrap();
                r.comm
                    .all_reduce(
                        b.ptr(),
                        b.ptr(),
                        count,
                        dtype,
                        ReduceOp::Prod,
                        AccumType::Auto,
                        &r.stream,
                    )
                    .unwrap();
            }
            r.stream.synchronize().unwrap();
            r.comm.check_error(&r.stream).unwrap();
            let (mut got_a, mut got_b) = (vec![0u8; 4000], vec![0u8; 4000]);
            r.stream.read(a.ptr(), &mut got_a).unwrap();
            r.stream.read(b.ptr(), &mut got_b).unwrap();
            let want = expected(dtype, ReduceOp::Prod, AccumType::Auto, 2, count, salt);
            same_bits(dtype, &got_b, &want, count).unwrap();
            same_bits(dtype, &got_a, &want, count).unwrap();
        }
    });
}

#[test]
fn bad_roots_and_buffers_are_refused_before_any_launch() {
    threads(2, None, |r| {
        let dev = r.comm.device();
        let inp = dev.alloc(1024, MemoryKind::Plain).unwrap();
        let out = dev.alloc(1024, MemoryKind::Plain).unwrap();
        let call = |i: DevicePtr, o: DevicePtr, count: usize, accum: AccumType, root: u32| {
            // SAFETY: every call here is refused before a launch (the checks under test).
            unsafe {
                r.comm.reduce(
                    i,
                    o,
                    count,
                    DataType::F32,
                    ReduceOp::Sum,
                    accum,
                    root,
                    &r.stream,
                )
            }
            .unwrap_err()
            .to_string()
        };
        for root in [2, 7, u32::MAX] {
            let e = call(inp.ptr(), out.ptr(), 100, AccumType::Auto, root);
            assert!(
                e.contains(&format!("reduce: root {root} is not a rank of 2")),
                "{e}"
            );
            // Also with nothing to reduce: the root is checked first.
            assert!(call(inp.ptr(), out.ptr(), 0, AccumType::Auto, root).contains("root"));
        }
        // On the root: overlapping, not in place; null and misaligned buffers; f16
        // accumulation of f32; an overflowing count.
        let root = r.comm.rank();
        let e = call(
            inp.ptr(),
            inp.ptr().offset(4).unwrap(),
            100,
            AccumType::Auto,
            root,
        );
        assert!(e.contains("not in place"), "{e}");
        assert!(call(inp.ptr(), DevicePtr::NULL, 100, AccumType::Auto, root).contains("null"));
        assert!(call(DevicePtr::NULL, out.ptr(), 100, AccumType::Auto, root).contains("null"));
        let odd = out.ptr().offset(2).unwrap();
        assert!(call(inp.ptr(), odd, 100, AccumType::Auto, root).contains("aligned"));
        assert!(call(inp.ptr(), out.ptr(), 100, AccumType::F16, root).contains("f16"));
        assert!(!call(inp.ptr(), out.ptr(), usize::MAX / 2, AccumType::Auto, root).is_empty());
        // Nothing was launched: the communicator still works.
        check(
            r,
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            100,
            1,
            false,
            false,
            9,
        )
        .unwrap();
    });
}

/// The ranks other than the root of a one-shot reduce wait for nothing but acknowledgements:
/// they run many calls ahead of a slow root, each into the packet half of its epoch's
/// parity. Every call's result must be that call's reduction, never mixed with a later
/// call's packets.
#[test]
fn one_shot_ranks_running_ahead_of_a_slow_root() {
    threads(3, Some(REDUCE_ONESHOT_LL), |r| {
        let rank = r.comm.rank();
        let (count, dtype, calls) = (1001usize, DataType::F32, 24u64);
        let (op, accum) = (ReduceOp::Sum, AccumType::Auto);
        let bytes = dtype.bytes(count).unwrap();
        let bufs: Vec<_> = (0..calls)
            .map(|_| r.comm.device().alloc(bytes, MemoryKind::Plain).unwrap())
            .collect();
        for (salt, buf) in (0..calls).zip(&bufs) {
            let root = (salt / 8) as u32 % 3; // eight calls to each root in turn
            r.stream
                .write(buf.ptr(), &input(dtype, rank, count, salt))
                .unwrap();
            if rank == root {
                std::thread::sleep(Duration::from_millis(2)); // the slow root
            }
            // SAFETY: every buffer holds `count` elements until the synchronize below.
            unsafe {
                r.comm
                    .reduce(
                        buf.ptr(),
                        buf.ptr(),
                        count,
                        dtype,
                        op,
                        accum,
                        root,
                        &r.stream,
                    )
                    .unwrap();
            }
        }
        r.stream.synchronize().unwrap();
        r.comm.check_error(&r.stream).unwrap();
        for (salt, buf) in (0..calls).zip(&bufs) {
            let root = (salt / 8) as u32 % 3;
            let mut got = vec![0u8; bytes];
            r.stream.read(buf.ptr(), &mut got).unwrap();
            let want = if rank == root {
                expected(dtype, op, accum, 3, count, salt)
            } else {
                input(dtype, rank, count, salt) // in place: a non-root keeps its input
            };
            same_bits(dtype, &got, &want, count)
                .map_err(|e| format!("rank {rank}: call {salt} to root {root}: {e}"))
                .unwrap();
        }
    });
}

/// The one-shot reduce keeps out of the epoch's packet halves (its senders do not wait for
/// the root; MAILBOX_SEQ in abi_allreduce.h): one-shot reduces to changing roots,
/// interleaved with the epoch one-shots (allreduce, broadcast) on one stream with no
/// synchronization between calls and a different rank slow at each step, must each give
/// their own call's result. Each step starts with three reduces to its slow rank, so a
/// sender that did not wait for the root's previous call would overwrite the first one's
/// packets in the mailbox half the third reuses.
#[test]
fn one_shot_reduces_interleaved_with_epoch_one_shots() {
    threads(3, None, |r| {
        let rank = r.comm.rank();
        let (count, dtype, steps) = (777usize, DataType::F32, 12u64);
        let (op, accum) = (ReduceOp::Sum, AccumType::Auto);
        let bytes = dtype.bytes(count).unwrap();
        for (collective, name) in [
            (Collective::Reduce, "reduce_oneshot_ll"),
            (Collective::AllReduce, "oneshot"),
            (Collective::Broadcast, "oneshot"),
        ] {
            let choice = r.comm.choose_collective(collective, count, dtype).unwrap();
            assert!(
                choice.algorithm.to_string().contains(name),
                "{collective:?}: {} ({})",
                choice.algorithm,
                choice.reason
            );
        }
        // Per step: three reduces to root s (the slow rank), one to s + 1, an allreduce, a
        // broadcast (root s + 2).
        const REDUCES: usize = 4;
        let roots = |step: u64| {
            let s = step % 3;
            [s, s, s, (s + 1) % 3, 0, (s + 2) % 3].map(|x| x as u32)
        };
        let bufs: Vec<Vec<_>> = (0..steps)
            .map(|_| {
                (0..REDUCES + 2)
                    .map(|_| r.comm.device().alloc(bytes, MemoryKind::Plain).unwrap())
                    .collect()
            })
            .collect();
        for (step, b) in (0..steps).zip(&bufs) {
            for (k, buf) in b.iter().enumerate() {
                let data = input(dtype, rank, count, step * 8 + k as u64);
                r.stream.write(buf.ptr(), &data).unwrap();
            }
            if rank == (step % 3) as u32 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let root = roots(step);
            // SAFETY: every buffer holds `count` elements until the synchronize below.
            unsafe {
                for (k, buf) in b.iter().take(REDUCES).enumerate() {
                    let p = buf.ptr();
                    r.comm
                        .reduce(p, p, count, dtype, op, accum, root[k], &r.stream)
                        .unwrap();
                }
                let p = b[REDUCES].ptr();
                r.comm
                    .all_reduce(p, p, count, dtype, op, accum, &r.stream)
                    .unwrap();
                let p = b[REDUCES + 1].ptr();
                r.comm
                    .broadcast(p, p, count, dtype, root[REDUCES + 1], &r.stream)
                    .unwrap();
            }
        }
        r.stream.synchronize().unwrap();
        r.comm.check_error(&r.stream).unwrap();
        for (step, b) in (0..steps).zip(&bufs) {
            let root = roots(step);
            for (k, buf) in b.iter().enumerate() {
                let salt = step * 8 + k as u64;
                let want = match k {
                    k if k < REDUCES && rank == root[k] => {
                        expected(dtype, op, accum, 3, count, salt)
                    }
                    k if k < REDUCES => input(dtype, rank, count, salt), // a sender keeps its input
                    REDUCES => expected(dtype, op, accum, 3, count, salt),
                    _ => input(dtype, root[k], count, salt),
                };
                let mut got = vec![0u8; bytes];
                r.stream.read(buf.ptr(), &mut got).unwrap();
                same_bits(dtype, &got, &want, count)
                    .map_err(|e| format!("rank {rank}: step {step} call {k}: {e}"))
                    .unwrap();
            }
        }
    });
}

#[test]
fn mismatched_roots_are_detected_on_first_call() {
    threads(2, None, |r| {
        let buf = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
        // Each rank names itself the root: the first call's signature check refuses it.
        let root = r.comm.rank();
        // SAFETY: refused before any launch (the signatures differ).
        let e = unsafe {
            r.comm.reduce(
                buf.ptr(),
                buf.ptr(),
                4,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                root,
                &r.stream,
            )
        }
        .unwrap_err()
        .to_string();
        assert!(e.contains("mismatched reduce calls"), "{e}");
    });
}

/// `reduce_copy`'s local reduces run on the root alone: they must leave the epoch (the
/// one-shots' flags) as the other rank's, so a one-shot allreduce after each pipelined
/// reduce (several chunks, slots reused) gets its own call's result on both ranks.
#[test]
fn copy_pipeline_leaves_the_ranks_in_step_for_the_one_shots() {
    threads(2, Some(REDUCE_COPY), |r| {
        let (count, dtype) = (1001usize, DataType::F32);
        let b = r.comm.device().alloc(4004, MemoryKind::Plain).unwrap();
        for salt in 0..6u64 {
            check(
                r,
                DataType::Bf16,
                ReduceOp::Sum,
                AccumType::F32,
                100_003,
                salt as u32 % 2,
                salt % 3 == 0,
                true,
                salt,
            )
            .unwrap();
            r.stream
                .write(b.ptr(), &input(dtype, r.comm.rank(), count, salt))
                .unwrap();
            // SAFETY: `b` holds `count` f32 and outlives the call.
            let got =
                unsafe { all_reduce_and_read(r, (b.ptr(), b.ptr()), count, dtype, ReduceOp::Sum) };
            let want = expected(dtype, ReduceOp::Sum, AccumType::Auto, 2, count, salt);
            same_bits(dtype, &got, &want, count).unwrap();
        }
    });
}

/// `reduce_copy` forced where it cannot serve: more than 2 ranks, or inputs nobody
/// registered. Each is a clear error before any launch, and the communicator still works.
#[test]
fn copy_refuses_three_ranks_and_unregistered_inputs() {
    for world in [3, 2] {
        threads(world, Some(REDUCE_COPY), move |r| {
            let e = check(
                r,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                100,
                0,
                false,
                world == 3,
                1,
            )
            .unwrap_err();
            let want = if world == 3 {
                "reduce_copy: serves 1 or 2 ranks, not 3"
            } else {
                "reduce_copy: the input must lie 16-byte aligned inside buffers registered"
            };
            assert!(e.contains(want), "{e}");
            if world == 2 {
                check(
                    r,
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    100,
                    1,
                    false,
                    true,
                    2,
                )
                .unwrap();
            }
        });
    }
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
        std::env::var("OXCCL_ALGO").is_ok_and(|a| a == "reduce_direct" || a == "reduce_copy");
    let world = r.comm.world_size();
    for (i, count) in [1usize, 777, 50_001, 200_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F32] {
            check(
                &r,
                dtype,
                ReduceOp::Sum,
                AccumType::Auto,
                count,
                i as u32 % world,
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
        (3, "reduce_staged"),
        (3, "reduce_direct"),
        (3, "reduce_oneshot_ll"),
        (2, "reduce_copy"),
    ] {
        common::run_child_ranks(
            world,
            &[
                ("OXCCL_ALGO", algo),
                ("OXCCL_STAGING_MB", "1"),
                // Room for the one-shot's packets of the largest count (800 KB of f32).
                ("OXCCL_ONESHOT_MAX_BYTES", "1048576"),
            ],
            &format!("world {world} algo {algo}"),
        );
    }
}
