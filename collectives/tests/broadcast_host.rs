//! Broadcast on the host backend across ranks: both algorithms forced and the default
//! selection, every root, every data type, counts that are not powers of two, in and out of
//! place, registered and unregistered outputs, staging rounds, null inputs on the other
//! ranks (NCCL ignores them), bad roots, and real processes (this test binary re-executed).
//! Every output is compared bit for bit with the root's input, the output poisoned first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::broadcast::{
    copy_engine::BROADCAST_COPY, direct::BROADCAST_DIRECT, one_shot::BROADCAST_ONESHOT_LL,
    relay::BROADCAST_RELAY, staged::BROADCAST_STAGED,
};
use oxccl_collectives::hal::{DataType, Device, DevicePtr, Memory, MemoryKind, Stream};
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

/// Whether an algorithm needs the outputs registered.
fn registers(algo: Algorithm) -> bool {
    [BROADCAST_DIRECT, BROADCAST_RELAY, BROADCAST_COPY].contains(&algo)
}

/// One checked broadcast from `root`. Out of place, the input sits one element past 16-byte
/// alignment, and the ranks other than the root pass a null input; in place one buffer.
fn check(
    r: &Rank,
    dtype: DataType,
    count: usize,
    root: u32,
    in_place: bool,
    register: bool,
    salt: u64,
) -> Result<(), String> {
    let rank = r.comm.rank();
    let bytes = dtype.bytes(count).unwrap();
    let out_mem = r
        .comm
        .device()
        .alloc(bytes + 16, MemoryKind::Plain)
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
        out
    } else if rank == root {
        in_mem.ptr().offset(dtype.size()).unwrap()
    } else {
        DevicePtr::NULL
    };
    r.stream.write(out, &vec![0x5au8; bytes]).unwrap();
    if rank == root {
        r.stream
            .write(inp, &input(dtype, root, count, salt))
            .unwrap();
    }
    // SAFETY: the root's input and every output hold `count` elements and live until the
    // synchronize below.
    let result = unsafe { r.comm.broadcast(inp, out, count, dtype, root, &r.stream) };
    r.stream.synchronize().unwrap();
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let mut got = vec![0u8; bytes];
            r.stream.read(out, &mut got).unwrap();
            let want = input(dtype, root, count, salt);
            match got.iter().zip(&want).position(|(g, w)| g != w) {
                None => Ok(()),
                Some(i) => Err(format!(
                    "rank {rank} root {root} {dtype} count {count} in_place {in_place} \
                     registered {register}: byte {i} is {:#x}, want {:#x}",
                    got[i], want[i]
                )),
            }
        });
    if register {
        r.comm.deregister(&out_mem).unwrap();
    }
    outcome
}

#[test]
fn every_algorithm_root_and_type_on_three_ranks() {
    for algo in [
        BROADCAST_ONESHOT_LL,
        BROADCAST_STAGED,
        BROADCAST_DIRECT,
        BROADCAST_RELAY,
        BROADCAST_COPY,
    ] {
        threads(3, Some(algo), move |r| {
            let mut salt = 0;
            for dtype in DataType::ALL {
                for root in 0..3 {
                    for (count, in_place) in [(1, false), (3, true), (1000, false), (4097, true)] {
                        salt += 1;
                        check(r, dtype, count, root, in_place, registers(algo), salt).unwrap();
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
            Some(BROADCAST_ONESHOT_LL),
            Some(BROADCAST_STAGED),
            Some(BROADCAST_DIRECT),
            Some(BROADCAST_RELAY),
            Some(BROADCAST_COPY),
        ] {
            threads(world, algo, move |r| {
                let register = algo.is_some_and(registers);
                let root = world - 1;
                for (i, count) in [1usize, 7, 12_345, 100_003].into_iter().enumerate() {
                    // The one-shot's packets of 200 KB per rank do not fit 8 ranks' halves.
                    if algo == Some(BROADCAST_ONESHOT_LL) && count > 50_000 {
                        continue;
                    }
                    check(
                        r,
                        DataType::Bf16,
                        count,
                        root,
                        i % 2 == 0,
                        register,
                        i as u64,
                    )
                    .unwrap();
                }
                // Repeated calls from changing roots: every call's data, not a stale one.
                for salt in 10..14 {
                    check(
                        r,
                        DataType::F32,
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
fn default_selection_and_bad_roots() {
    threads(2, None, |r| {
        let c = r
            .comm
            .choose_collective(Collective::Broadcast, 1000, DataType::Bf16)
            .unwrap();
        assert_eq!(c.algorithm, BROADCAST_ONESHOT_LL, "{}", c.reason);
        let c = r
            .comm
            .choose_collective(Collective::Broadcast, 2 << 20, DataType::Bf16)
            .unwrap();
        assert_eq!(c.algorithm, BROADCAST_STAGED, "{}", c.reason);
        check(r, DataType::Bf16, 300_001, 1, false, true, 1).unwrap();
        check(r, DataType::Bf16, 300_001, 0, true, false, 2).unwrap();
        let buf = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
        // SAFETY: refused before any launch.
        let e = unsafe {
            r.comm
                .broadcast(buf.ptr(), buf.ptr(), 4, DataType::F32, 2, &r.stream)
        }
        .unwrap_err()
        .to_string();
        assert!(e.contains("root 2"), "{e}");
        check(r, DataType::F32, 100, 0, false, false, 3).unwrap();
    });
}

/// Above the one-shot sizes on registered outputs, 2 ranks store straight from the root and
/// more ranks relay through the peers (the root's link carries each byte once).
#[test]
fn registered_outputs_relay_on_more_than_two_ranks() {
    for (world, want) in [
        (2, BROADCAST_DIRECT),
        (3, BROADCAST_RELAY),
        (4, BROADCAST_RELAY),
    ] {
        threads(world, None, move |r| {
            let buf = r.comm.device().alloc(8 << 20, MemoryKind::Plain).unwrap();
            r.comm.register(&buf).unwrap();
            let c = r
                .comm
                .choose_collective_for(
                    Collective::Broadcast,
                    buf.ptr(),
                    buf.ptr(),
                    2 << 20,
                    DataType::Bf16,
                )
                .unwrap();
            assert_eq!(c.algorithm, want, "world {world}: {}", c.reason);
            r.comm.deregister(&buf).unwrap();
            check(r, DataType::Bf16, 200_003, world - 1, true, true, 7).unwrap();
        });
    }
}

/// The root of a one-shot broadcast waits for nothing but its peers' acknowledgements: it
/// runs many calls ahead of a slow peer, each into the packet half of its epoch's parity.
/// Every call's output must hold that call's data, never a later call's packets.
#[test]
fn one_shot_root_running_ahead_of_a_slow_peer() {
    threads(3, Some(BROADCAST_ONESHOT_LL), |r| {
        let rank = r.comm.rank();
        let (count, dtype, calls) = (1001usize, DataType::F32, 24u64);
        let bytes = dtype.bytes(count).unwrap();
        let bufs: Vec<_> = (0..calls)
            .map(|_| r.comm.device().alloc(bytes, MemoryKind::Plain).unwrap())
            .collect();
        for (salt, buf) in (0..calls).zip(&bufs) {
            let root = (salt / 8) as u32 % 3; // eight calls from each root in turn
            let data = if rank == root {
                input(dtype, root, count, salt)
            } else {
                vec![0x5au8; bytes]
            };
            r.stream.write(buf.ptr(), &data).unwrap();
            if rank == 2 {
                std::thread::sleep(Duration::from_millis(2)); // the slow peer
            }
            // SAFETY: every buffer holds `count` elements until the synchronize below.
            unsafe {
                r.comm
                    .broadcast(buf.ptr(), buf.ptr(), count, dtype, root, &r.stream)
                    .unwrap();
            }
        }
        r.stream.synchronize().unwrap();
        r.comm.check_error(&r.stream).unwrap();
        for (salt, buf) in (0..calls).zip(&bufs) {
            let mut got = vec![0u8; bytes];
            r.stream.read(buf.ptr(), &mut got).unwrap();
            let root = (salt / 8) as u32 % 3;
            assert!(
                got == input(dtype, root, count, salt),
                "rank {rank}: call {salt} from root {root} does not hold its data"
            );
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
            r.comm
                .broadcast(buf.ptr(), buf.ptr(), 4, DataType::F32, root, &r.stream)
        }
        .unwrap_err()
        .to_string();
        assert!(e.contains("mismatched broadcast calls"), "{e}");
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
        std::env::var("OXCCL_ALGO").is_ok_and(|a| a.parse::<Algorithm>().is_ok_and(registers));
    let world = r.comm.world_size();
    for (i, count) in [1usize, 777, 50_001, 200_003].into_iter().enumerate() {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F32] {
            check(
                &r,
                dtype,
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
        (3, "broadcast_staged"),
        (3, "broadcast_direct"),
        (3, "broadcast_oneshot_ll"),
        (3, "broadcast_copy"),
        (4, "broadcast_relay"),
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
