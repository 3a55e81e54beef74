//! Allreduce on the host backend across ranks: every algorithm x data type x op x
//! accumulation x in/out-of-place, odd counts, repeated calls, world sizes 1..=4, bad
//! input, and the same protocol across real processes (this test binary re-executed).
//!
//! Results are compared bit for bit with the host reference reduction in rank order
//! (`oxccl_kernels::reduce`), which is what every rank's kernel must produce.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use oxccl_collectives::algorithms::all_reduce::nvls::NVLS;
use oxccl_collectives::algorithms::all_reduce::one_shot::ONESHOT_LL;
use oxccl_collectives::algorithms::all_reduce::one_shot_ll128::ONESHOT_LL128;
use oxccl_collectives::algorithms::all_reduce::port_channel::PORT_CHANNEL;
use oxccl_collectives::algorithms::all_reduce::two_shot::TWOSHOT;
use oxccl_collectives::algorithms::all_reduce::two_shot_push::TWOSHOT_PUSH;
use oxccl_collectives::algorithms::all_reduce::two_shot_zc::TWOSHOT_ZC;
use oxccl_collectives::backend::{AnyDevice, AnyMemory};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Memory, MemoryKind, ReduceOp,
    Stream,
};
use oxccl_collectives::tuner::{TuneSource, TuneTable};
use oxccl_collectives::{Algorithm, BufferPath, Collective, CommConfig, Communicator, Staged};

mod common;
use common::{accums, check_buffers, expected, same_bits, stage, threads_with, Rank};

impl Rank {
    /// Runs one checked allreduce; returns a description of the first mismatch.
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

    /// Runs one checked allreduce on the given buffers (`inp == out`: in place).
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
        stage(
            &self.stream,
            (inp, out),
            dtype,
            self.comm.rank(),
            count,
            salt,
        );
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
        let want = expected(dtype, op, accum, self.comm.world_size(), count, salt);
        same_bits(dtype, &got, &want, count).map_err(|d| {
            format!(
                "rank {} {dtype} {op} {accum} count {count} in_place {}: {d}",
                self.comm.rank(),
                inp == out
            )
        })
    }
}

fn config(algo: Option<Algorithm>) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        staging_bytes: 64 << 10, // small staging: large counts take several rounds
        forced: algo.into(),
        ..CommConfig::default()
    }
}

/// Runs `body` on `world` ranks as threads of this process (each its own host device).
fn threads(world: u32, algo: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(world, move |_| config(algo), body);
}

const ALGOS: [Algorithm; 4] = [ONESHOT_LL, ONESHOT_LL128, TWOSHOT, TWOSHOT_PUSH];

#[test]
fn every_type_op_and_accumulation_on_three_ranks() {
    for algo in ALGOS {
        threads(3, Some(algo), |r| {
            let mut salt = 1;
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    for accum in accums(dtype) {
                        for (count, in_place) in [(1, true), (3, false), (1000, true)] {
                            salt += 1;
                            r.check(dtype, op, accum, count, in_place, salt).unwrap();
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
        for algo in ALGOS {
            threads(world, Some(algo), move |r| {
                let mut counts = vec![1usize, 3, 1000, 12345];
                // One-shot packet capacity is sized for 1 MiB per rank.
                if algo == TWOSHOT && world <= 2 {
                    counts.push((1 << 20) + 7);
                }
                for (i, count) in counts.into_iter().enumerate() {
                    for in_place in [false, true] {
                        r.check(
                            DataType::Bf16,
                            ReduceOp::Sum,
                            AccumType::Auto,
                            count,
                            in_place,
                            i as u64,
                        )
                        .unwrap();
                    }
                }
                r.check(
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    250_007,
                    false,
                    99,
                )
                .unwrap();
                r.check(
                    DataType::Fp8E4m3b15,
                    ReduceOp::Sum,
                    AccumType::F32,
                    12345,
                    true,
                    98,
                )
                .unwrap();
            });
        }
    }
}

#[test]
fn zero_copy_on_registered_buffers() {
    for world in 1..=4u32 {
        for algo in [Some(TWOSHOT_ZC), Some(TWOSHOT_PUSH), None] {
            threads(world, algo, move |r| {
                let dev = r.comm.device();
                let a: AnyMemory = dev.alloc(600_000, MemoryKind::Plain).unwrap();
                let b: AnyMemory = dev.alloc(600_000, MemoryKind::Plain).unwrap();
                r.comm.register(&a).unwrap();
                r.comm.register(&b).unwrap();
                r.comm.register(&a).unwrap(); // cached: no second exchange
                assert_eq!(r.comm.registered_buffers(), 2);
                let mut salt = 500;
                for count in [1usize, 3, 1000, 12345, 150_001] {
                    for dtype in [DataType::Bf16, DataType::F32, DataType::Fp8E4m3b15] {
                        if dtype.bytes(count).unwrap() + 32 > 600_000 {
                            continue;
                        }
                        for (inp, out) in [
                            (a.ptr(), b.ptr()),
                            (b.ptr(), b.ptr()),
                            (a.ptr().offset(32).unwrap(), b.ptr().offset(16).unwrap()),
                        ] {
                            salt += 1;
                            let c = r.comm.choose_for(inp, out, count, dtype).unwrap();
                            if let Some(a) = algo {
                                assert_eq!(c.algorithm, a, "{}", c.reason);
                            } else if world > 1
                                && dtype.bytes(count).unwrap()
                                    > oxccl_collectives::selector::default_zc_threshold(world)
                            {
                                let want = oxccl_collectives::selector::registered_two_shot(
                                    world,
                                    dtype.bytes(count).unwrap(),
                                );
                                assert_eq!(c.algorithm, want, "{}", c.reason);
                            }
                            r.check_at(
                                inp,
                                out,
                                dtype,
                                ReduceOp::Sum,
                                AccumType::Auto,
                                count,
                                salt,
                            )
                            .unwrap();
                            let last = r.comm.last_call().unwrap();
                            let want = if last.algorithm.uses_registered() {
                                BufferPath::Registered
                            } else {
                                BufferPath::Scratch
                            };
                            assert_eq!(last.path, want, "{last}");
                            if algo.is_some() && world > 1 {
                                assert_eq!(last.path, BufferPath::Registered, "{last}");
                            }
                        }
                    }
                }
                r.check_at(
                    a.ptr(),
                    b.ptr(),
                    DataType::Bf16,
                    ReduceOp::Avg,
                    AccumType::F32,
                    4097,
                    7,
                )
                .unwrap();
                // Not 16-byte aligned: zero-copy cannot serve it (push can, through staging).
                let odd = a.ptr().offset(2).unwrap();
                let c = r.comm.choose_for(odd, b.ptr(), 100_000, DataType::Bf16);
                if algo == Some(TWOSHOT_ZC) {
                    assert!(c.is_err());
                } else {
                    assert_ne!(c.unwrap().algorithm, TWOSHOT_ZC);
                    r.check_at(
                        odd,
                        b.ptr(),
                        DataType::Bf16,
                        ReduceOp::Sum,
                        AccumType::Auto,
                        100_000,
                        3,
                    )
                    .unwrap();
                }
                r.comm.deregister(&a).unwrap();
                r.comm.deregister(&b).unwrap();
                assert_eq!(r.comm.registered_buffers(), 0);
            });
        }
    }
}

/// Below `auto_register_min_bytes` a call on unregistered buffers never exchanges them (a
/// bootstrap round trip per call): it stages through the scratch, and nothing is mapped;
/// at the minimum the same call maps the allocation.
#[test]
fn small_calls_on_unregistered_buffers_stage_without_an_exchange() {
    let cfg = |_| CommConfig {
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        auto_register_min_bytes: Some(64 << 10),
        ..config(None)
    };
    threads_with(2, cfg, |r| {
        let pool: AnyMemory = r.comm.device().alloc(1 << 20, MemoryKind::Plain).unwrap();
        let (dtype, op, accum) = (DataType::F32, ReduceOp::Sum, AccumType::Auto);
        for (salt, count) in [(1, 5_003usize), (2, 16_383)] {
            // 20 KB and 64 KB - 4 B: above the zero-copy threshold, below the minimum.
            r.check_at(pool.ptr(), pool.ptr(), dtype, op, accum, count, salt)
                .unwrap();
            let last = r.comm.last_call().unwrap();
            assert_eq!(last.path, BufferPath::Scratch, "{last}");
            assert_eq!(
                last.staged,
                Some(Staged::BelowFloor { floor: 64 << 10 }),
                "{last}"
            );
            assert_eq!(r.comm.auto_registered(), 0, "{last}");
        }
        r.check_at(pool.ptr(), pool.ptr(), dtype, op, accum, 16_384, 3)
            .unwrap();
        let last = r.comm.last_call().unwrap();
        assert_eq!(last.path, BufferPath::Mapped, "{last}");
        assert_eq!(last.staged, None, "{last}");
        assert!(r.comm.auto_registered() > 0);
    });
}

/// With the default floor, ranks of one node exchange their records through the shared
/// region from `DEFAULT_LOCAL_MIN_BYTES` (1 MiB) on: smaller calls on unregistered buffers
/// stage through the scratch (the exchange would cost an eager loop more host time than
/// it saves), larger ones are zero-copy.
#[test]
fn by_default_calls_from_1_mib_on_one_node_are_zero_copy() {
    let cfg = |_| CommConfig {
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        ..config(None)
    };
    threads_with(2, cfg, |r| {
        assert_eq!(
            r.comm.auto_register_min_bytes(),
            oxccl_collectives::communicator::auto_register::DEFAULT_LOCAL_MIN_BYTES
        );
        let pool: AnyMemory = r.comm.device().alloc(2 << 20, MemoryKind::Plain).unwrap();
        let (dtype, op, accum) = (DataType::F32, ReduceOp::Sum, AccumType::Auto);
        let floor = (1 << 20) / 4;
        // 4 KB: the one-shot; 4 KB + 4 up to 1 MiB - 4: the staged two-shot, both through
        // the scratch; 1 MiB and more: zero-copy.
        for (salt, count, path) in [
            (1, 1_024usize, BufferPath::Scratch),
            (2, 1_025, BufferPath::Scratch),
            (3, floor - 1, BufferPath::Scratch),
            (4, floor, BufferPath::Mapped),
            (5, floor + 3, BufferPath::Mapped),
        ] {
            r.check_at(pool.ptr(), pool.ptr(), dtype, op, accum, count, salt)
                .unwrap();
            let last = r.comm.last_call().unwrap();
            assert_eq!(last.path, path, "{count} elements: {last}");
            // Below the floor the exchange is not tried, whatever the algorithm.
            let why =
                (path == BufferPath::Scratch).then_some(Staged::BelowFloor { floor: 1 << 20 });
            assert_eq!(last.staged, why, "{count} elements: {last}");
        }
    });
}

/// Zero-copy without registration: the allocations holding the callers' buffers are
/// mapped at the first call that would take a zero-copy algorithm, at each rank's own
/// offset, kept in a bounded cache, never served stale after a free, and any rank whose
/// buffer cannot be shared makes every rank fall back.
#[test]
fn zero_copy_on_unregistered_buffers() {
    for world in [2u32, 3] {
        let cfg = move |_| CommConfig {
            zc_threshold_bytes: Some(4096),
            oneshot_max_bytes: Some(4096),
            auto_register_max: 2 * world as usize,
            auto_register_min_bytes: Some(4096),
            ..config(None)
        };
        threads_with(world, cfg, move |r| {
            let dev = r.comm.device();
            let rank = r.comm.rank();
            let count = 20_011usize; // above the zero-copy threshold in every type tried
            let pool: AnyMemory = dev.alloc(1 << 20, MemoryKind::Plain).unwrap();
            let mut salt = 900;
            // Each rank's buffers at its own offsets inside one allocation.
            for (k, dtype) in [DataType::F32, DataType::Bf16, DataType::I32]
                .into_iter()
                .enumerate()
            {
                let bytes = dtype.bytes(count).unwrap();
                let inp = pool
                    .ptr()
                    .offset(16 * (rank as usize + 1) * (k + 1))
                    .unwrap();
                let out = pool
                    .ptr()
                    .offset(bytes + 4096 * (rank as usize + 1))
                    .unwrap();
                for (i, o) in [(inp, out), (inp, inp)] {
                    salt += 1;
                    r.check_at(i, o, dtype, ReduceOp::Sum, AccumType::Auto, count, salt)
                        .unwrap();
                    // In place the buffer is 16-byte aligned and the call reaches the
                    // peers' buffers through the mapped allocation; the out-of-place outputs
                    // here are only element-aligned, which zero-copy does not take (staged).
                    let last = r.comm.last_call().unwrap();
                    if o.is_aligned(16) && i.is_aligned(16) {
                        assert_eq!(last.path, BufferPath::Mapped, "{last}");
                        assert!(last.algorithm.uses_registered(), "{last}");
                    } else {
                        assert_eq!(last.path, BufferPath::Scratch, "{last}");
                        assert!(
                            matches!(&last.staged, Some(Staged::Unshareable(w)) if w.contains("16-byte aligned")),
                            "{last}"
                        );
                    }
                }
            }
            // A one-shot size goes through the scratch.
            salt += 1;
            r.check_at(
                pool.ptr(),
                pool.ptr(),
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                100,
                salt,
            )
            .unwrap();
            let last = r.comm.last_call().unwrap();
            assert_eq!(last.path, BufferPath::Scratch, "{last}");
            assert_eq!(
                last.staged,
                Some(Staged::BelowFloor { floor: 4096 }),
                "{last}"
            );
            assert_eq!(r.comm.registered_buffers(), 0);
            assert_eq!(
                r.comm.auto_registered(),
                world as usize,
                "one allocation per rank"
            );
            // Freed and allocated again (possibly at the same address): a new identity,
            // never the stale mapping; the bound holds with more allocations than it.
            drop(pool);
            let mut keep = Vec::new();
            for round in 0..5u64 {
                let m: AnyMemory = dev
                    .alloc(200_000 + 4096 * round as usize, MemoryKind::Plain)
                    .unwrap();
                salt += 1;
                r.check_at(
                    m.ptr(),
                    m.ptr(),
                    DataType::F32,
                    ReduceOp::Max,
                    AccumType::Auto,
                    30_001,
                    salt,
                )
                .unwrap();
                assert!(
                    r.comm.auto_registered() <= 2 * world as usize,
                    "{}",
                    r.comm.auto_registered()
                );
                keep.push(m);
            }
            // An evicted allocation comes back through a fresh export.
            salt += 1;
            r.check_at(
                keep[0].ptr(),
                keep[1].ptr(),
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                30_001,
                salt,
            )
            .unwrap();
            // One rank's buffer cannot be shared (a mapping, not an allocation): every
            // rank falls back, and the result is still exact.
            let own = dev.alloc(200_000, MemoryKind::Plain).unwrap();
            let view = dev
                .import_memory(&dev.export_memory(&own).unwrap())
                .unwrap();
            let p = if rank == 1 { view.ptr() } else { own.ptr() };
            let before = r.comm.auto_registered();
            salt += 1;
            r.check_at(
                p,
                p,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                30_001,
                salt,
            )
            .unwrap();
            assert!(r.comm.auto_registered() <= before);
            // Rank 1 says why its buffer cannot be shared; the others name rank 1.
            let last = r.comm.last_call().unwrap();
            assert_eq!(last.path, BufferPath::Scratch, "{last}");
            match (rank, &last.staged) {
                (1, Some(Staged::Unshareable(why))) => assert!(!why.is_empty(), "{last}"),
                (r, Some(Staged::PeerUnshareable(1))) if r != 1 => {}
                _ => panic!("rank {rank}: {last}"),
            }
            // Pinning: a range across the end of its allocation and a host pointer are refused.
            let e = r
                .comm
                .pin_allocation(own.ptr(), 200_001)
                .unwrap_err()
                .to_string();
            assert!(e.contains("past the end"), "{e}");
            let host = [0u8; 64];
            let e = r
                .comm
                .pin_allocation(DevicePtr(host.as_ptr() as u64), 64)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not inside any live"), "{e}");
            let pinned = r.comm.pin_allocation(own.ptr(), 1000).unwrap();
            assert!(r.comm.unpin_allocation(&pinned));
            assert!(!r.comm.unpin_allocation(&pinned));
            // Mismatched counts on a zero-copy call: an error on every rank, not a hang.
            let n = 30_001 + 16 * rank as usize;
            // SAFETY: 200000 bytes hold 30049 f32; the call is refused before a launch.
            let e = unsafe {
                r.comm.all_reduce(
                    own.ptr(),
                    own.ptr(),
                    n,
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    &r.stream,
                )
            }
            .unwrap_err();
            assert!(e.to_string().contains("mismatched all_reduce"), "{e}");
        });
    }
}

/// Windows (NCCL's `ncclCommWindowRegister`): any range of a caller's allocation, the same
/// length on every rank, registered collectively; calls inside them are zero-copy with no
/// exchange per call (auto-registration is off here, so only the window can serve them).
#[test]
fn windows_of_callers_allocations() {
    let cfg = |_| CommConfig {
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        auto_register: false,
        ..config(Some(TWOSHOT_ZC))
    };
    threads_with(2, cfg, |r| {
        let dev = r.comm.device();
        let rank = r.comm.rank() as usize;
        let pool = dev.alloc(1 << 20, MemoryKind::Plain).unwrap();
        // The window starts at a different offset of each rank's allocation.
        let win = pool.ptr().offset(4096 * (rank + 1)).unwrap();
        r.comm.register_window(win, 400_000).unwrap();
        assert_eq!(r.comm.registered_buffers(), 1);
        let (inp, out) = (win, win.offset(200_000).unwrap());
        r.check_at(
            inp,
            out,
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            30_001,
            11,
        )
        .unwrap();
        r.check_at(
            out,
            out,
            DataType::Bf16,
            ReduceOp::Min,
            AccumType::Auto,
            50_001,
            12,
        )
        .unwrap();
        // Outside the window: the forced zero-copy algorithm cannot serve it.
        let outside = pool.ptr().offset(600_000).unwrap();
        // SAFETY: refused before a launch.
        let e = unsafe {
            r.comm.all_reduce(
                outside,
                outside,
                30_001,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                &r.stream,
            )
        };
        assert!(e.is_err());
        r.comm.deregister_window(win).unwrap();
        assert_eq!(r.comm.registered_buffers(), 0);
        assert!(r.comm.deregister_window(win).is_err(), "twice");
        // Different lengths on different ranks: an error on every rank.
        let e = r
            .comm
            .register_window(win, 1000 + rank)
            .unwrap_err()
            .to_string();
        assert!(e.contains("different lengths"), "{e}");
        // One rank's window cannot be shared: an error on every rank.
        let view = dev
            .import_memory(&dev.export_memory(&pool).unwrap())
            .unwrap();
        let w = if rank == 0 { view.ptr() } else { win };
        let e = r.comm.register_window(w, 1000).unwrap_err().to_string();
        assert!(e.contains("cannot be shared"), "{e}");
        assert_eq!(r.comm.registered_buffers(), 0);
    });
}

/// With `OXCCL_AUTO_REGISTER=0` (here: the config), unregistered calls stage as before.
#[test]
fn auto_registration_can_be_turned_off() {
    let cfg = |_| CommConfig {
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        auto_register: false,
        ..config(None)
    };
    threads_with(2, cfg, |r| {
        let m = r.comm.device().alloc(200_000, MemoryKind::Plain).unwrap();
        r.check_at(
            m.ptr(),
            m.ptr(),
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            30_001,
            5,
        )
        .unwrap();
        assert_eq!(r.comm.auto_registered(), 0);
        let last = r.comm.last_call().unwrap();
        assert_eq!(last.path, BufferPath::Scratch, "{last}");
        assert_eq!(last.staged, Some(Staged::AutoRegisterOff), "{last}");
        assert!(
            last.to_string()
                .contains("through oxccl's scratch: zero-copy on unregistered buffers is off"),
            "{last}"
        );
    });
}

/// Tunes bf16 and f32 on `world` ranks with the given cache directory per rank; returns
/// every rank's tables and where they came from, after checking calls stay exact.
fn tune_on(
    world: u32,
    dir_of: impl Fn(u32) -> std::path::PathBuf + Send + Sync + 'static,
) -> Vec<Vec<(TuneTable, TuneSource)>> {
    let out = Arc::new(std::sync::Mutex::new(vec![Vec::new(); world as usize]));
    let sink = Arc::clone(&out);
    threads_with(
        world,
        move |r| CommConfig {
            tune_dir: Some(dir_of(r)),
            ..config(None)
        },
        move |r| {
            let got = r
                .comm
                .tune(&[DataType::Bf16, DataType::F32], 8 << 10, false)
                .unwrap();
            // The tuned choices serve every size exactly, registered or not.
            let dev = r.comm.device();
            let a: AnyMemory = dev.alloc(300_000, MemoryKind::Plain).unwrap();
            let b: AnyMemory = dev.alloc(300_000, MemoryKind::Plain).unwrap();
            r.comm.register(&a).unwrap();
            r.comm.register(&b).unwrap();
            for (i, count) in [1usize, 1000, 5000, 40_000, 70_001].into_iter().enumerate() {
                let c = r
                    .comm
                    .choose_for(a.ptr(), b.ptr(), count, DataType::F32)
                    .unwrap();
                assert!(c.reason.starts_with("tuned"), "{}", c.reason);
                r.check_at(
                    a.ptr(),
                    b.ptr(),
                    DataType::F32,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    count,
                    i as u64,
                )
                .unwrap();
                r.check(
                    DataType::Bf16,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    count,
                    i % 2 == 0,
                    9 + i as u64,
                )
                .unwrap();
            }
            r.comm.deregister(&a).unwrap();
            r.comm.deregister(&b).unwrap();
            let mut all = sink.lock().unwrap();
            all[r.comm.rank() as usize] = got.into_iter().map(|(t, s)| ((*t).clone(), s)).collect();
        },
    );
    Arc::try_unwrap(out).unwrap().into_inner().unwrap()
}

#[test]
fn tuner_agrees_across_ranks_and_caches_on_disk() {
    let base = std::env::temp_dir().join(format!("oxccl-tune-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let shared = base.join("shared");
    let dir = shared.clone();
    let first = tune_on(2, move |_| dir.clone());
    for rank in &first {
        assert_eq!(rank.len(), 2);
        for (t, s) in rank {
            assert_eq!(*s, TuneSource::Measured);
            // Sizes 1K..8K, unregistered and registered rows.
            assert_eq!(t.entries.len(), 2 * 4, "{t:?}");
        }
    }
    // Every rank chose the same (the slowest rank's times decide).
    assert_eq!(first[0], first[1]);
    assert!(shared.join(first[0][0].0.key.file_name()).is_file());
    // Again: loaded from the cache, the same table.
    let dir = shared.clone();
    let second = tune_on(2, move |_| dir.clone());
    for (rank, earlier) in second.iter().zip(&first) {
        for ((t, s), (e, _)) in rank.iter().zip(earlier) {
            assert_eq!(*s, TuneSource::Cache);
            assert_eq!(t, e);
        }
    }
    // A rank without the cache: both measure again (never half cached, half measured).
    let dir = shared.clone();
    let lonely = base.join("empty");
    let third = tune_on(
        2,
        move |r| if r == 0 { dir.clone() } else { lonely.clone() },
    );
    assert!(third
        .iter()
        .flatten()
        .all(|(_, s)| *s == TuneSource::Measured));
    // A corrupted cache file is ignored (measured again), not an error.
    std::fs::write(
        shared.join(first[0][0].0.key.file_name()),
        "oxccl-tune v1\ndevice",
    )
    .unwrap();
    let dir = shared.clone();
    let fourth = tune_on(2, move |_| dir.clone());
    assert_eq!(fourth[0][0].1, TuneSource::Measured);
    assert_eq!(fourth[0][1].1, TuneSource::Cache);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn port_channel_through_the_communicator() {
    for world in [2u32, 3] {
        threads(world, Some(PORT_CHANNEL), |r| {
            for (i, count) in [1usize, 3, 1000, 12345, 70_001].into_iter().enumerate() {
                let c = r.comm.choose(count, DataType::Bf16).unwrap();
                assert_eq!(c.algorithm, PORT_CHANNEL);
                r.check(
                    DataType::Bf16,
                    ReduceOp::Sum,
                    AccumType::Auto,
                    count,
                    i % 2 == 0,
                    i as u64,
                )
                .unwrap();
                r.check(
                    DataType::F32,
                    ReduceOp::Max,
                    AccumType::Auto,
                    count,
                    i % 2 == 1,
                    i as u64,
                )
                .unwrap();
            }
        });
    }
}

#[test]
fn repeated_calls_advance_the_epoch_and_mix_algorithms() {
    // The selector alternates one-shot (small) and two-shot (large) with the same epochs.
    threads(4, None, |r| {
        for i in 0..40u64 {
            let count = if i % 3 == 0 {
                200_000
            } else {
                1 + (i as usize * 37) % 3000
            };
            r.check(
                DataType::F16,
                ReduceOp::Sum,
                AccumType::Auto,
                count,
                i % 2 == 0,
                i,
            )
            .unwrap();
        }
    });
}

#[test]
fn bad_input_is_refused_before_any_launch() {
    threads(2, None, |r| {
        let dev = r.comm.device();
        let m = dev.alloc(64, MemoryKind::Plain).unwrap();
        let p = m.ptr();
        let call = |i, o, n, d, a| {
            // SAFETY: every call below is refused before a launch (or is a no-op).
            unsafe { r.comm.all_reduce(i, o, n, d, ReduceOp::Sum, a, &r.stream) }
        };
        assert!(
            call(p, p, 0, DataType::F32, AccumType::Auto).is_ok(),
            "count 0 is a no-op"
        );
        let e = call(p, p, usize::MAX, DataType::F32, AccumType::Auto).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = call(p.offset(2).unwrap(), p, 4, DataType::F32, AccumType::Auto).unwrap_err();
        assert!(e.to_string().contains("aligned"), "{e}");
        let e = call(p, p, 4, DataType::F32, AccumType::F16).unwrap_err();
        assert!(e.to_string().contains("f16 accumulator"), "{e}");
        for d in [DataType::I32, DataType::U8, DataType::F64] {
            let e = call(p, p, 4, d, AccumType::F32).unwrap_err();
            assert!(e.to_string().contains("reduce in their own type"), "{e}");
        }
        let e = call(p, p.offset(4).unwrap(), 4, DataType::F32, AccumType::Auto).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        let e = call(
            oxccl_collectives::hal::DevicePtr::NULL,
            p,
            4,
            DataType::F32,
            AccumType::Auto,
        )
        .unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
    });
}

#[test]
fn mismatched_counts_are_detected_on_first_call() {
    threads(2, None, |r| {
        let count = 10 + r.comm.rank() as usize;
        let m = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
        // SAFETY: 64 bytes hold 11 f32; the call is refused before a launch.
        let e = unsafe {
            r.comm.all_reduce(
                m.ptr(),
                m.ptr(),
                count,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                &r.stream,
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("mismatched all_reduce"), "{e}");
    });
}

#[test]
fn forced_algorithms_that_cannot_serve_are_errors() {
    threads(2, Some(NVLS), |r| {
        let m = r.comm.device().alloc(64, MemoryKind::Plain).unwrap();
        // SAFETY: refused before a launch.
        let e = unsafe {
            r.comm.all_reduce(
                m.ptr(),
                m.ptr(),
                4,
                DataType::F32,
                ReduceOp::Sum,
                AccumType::Auto,
                &r.stream,
            )
        }
        .unwrap_err();
        let t = e.to_string();
        assert!(t.contains("unsupported") || t.contains("refused"), "{t}");
    });
}

#[test]
fn a_dead_peer_is_a_timeout_not_a_hang() {
    let id =
        UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default()).unwrap();
    let make = |r: u32, id: UniqueId| {
        let bs = Bootstrap::new(&id, r, 2, &BootstrapConfig::default()).unwrap();
        let dev = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
        let mut c = config(Some(ONESHOT_LL));
        c.timeout = Duration::from_millis(300);
        Communicator::new(bs, dev, c).unwrap()
    };
    let id1 = id;
    let peer = std::thread::spawn(move || {
        let comm = make(1, id1);
        // Take part in the signature check of the first call, then never launch.
        comm.bootstrap()
            .all_gather(&common::first_call_signature(
                4,
                DataType::F32,
                ONESHOT_LL.code(),
            ))
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(comm);
    });
    let comm = make(0, id);
    let stream = comm.device().create_stream().unwrap();
    let m = comm.device().alloc(64, MemoryKind::Plain).unwrap();
    // SAFETY: 64 bytes hold 4 f32 and live past the synchronize.
    unsafe {
        comm.all_reduce(
            m.ptr(),
            m.ptr(),
            4,
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            &stream,
        )
    }
    .unwrap();
    let e = stream.synchronize().unwrap_err();
    assert!(e.to_string().contains("timed out"), "{e}");
    let e = comm.check_error(&stream).unwrap_err();
    assert!(e.to_string().contains("rank 1"), "{e}");
    peer.join().unwrap();
}

/// Child side of the multi-process test: a rank started by `across_processes`.
#[test]
#[ignore = "run by across_processes as a child process"]
fn child_rank() {
    if std::env::var("OXCCL_TEST_CHILD").is_err() {
        return;
    }
    let comm = Communicator::from_env().unwrap();
    let stream = comm.device().create_stream().unwrap();
    let r = Rank { comm, stream };
    for algo_count in [(1usize, 0u64), (777, 1), (50_000, 2), (200_001, 3)] {
        for dtype in [
            DataType::Bf16,
            DataType::F32,
            DataType::Fp8E4m3,
            DataType::Fp8E4m3b15,
        ] {
            r.check(
                dtype,
                ReduceOp::Sum,
                AccumType::Auto,
                algo_count.0,
                algo_count.1 % 2 == 0,
                algo_count.1,
            )
            .unwrap();
        }
    }
    r.check(
        DataType::Bf16,
        ReduceOp::Max,
        AccumType::Auto,
        4097,
        false,
        7,
    )
    .unwrap();
    r.comm.destroy().unwrap();
}

#[test]
fn across_processes() {
    for (world, algo) in [(2u32, "auto"), (3, "oneshot_ll"), (4, "twoshot")] {
        common::run_child_ranks(
            world,
            &[("OXCCL_ALGO", algo), ("OXCCL_STAGING_MB", "1")],
            &format!("world {world} algo {algo}"),
        );
    }
}

#[test]
fn setup_makes_what_the_algorithms_need() {
    // Nothing forced: every scratch-protocol algorithm, one shared scratch mapped from
    // every peer, no PortChannel state.
    threads(3, None, |r| {
        assert_eq!(r.comm.peer_mappings(), 2);
        for a in [ONESHOT_LL, ONESHOT_LL128, TWOSHOT, TWOSHOT_ZC, TWOSHOT_PUSH] {
            assert!(r.comm.instance(a).is_some(), "{a}");
        }
        assert!(r.comm.instance(PORT_CHANNEL).is_none());
        assert!(r.comm.instance(NVLS).is_none());
        // One node, nothing forced: no PortChannel algorithm of any collective.
        assert!(oxccl_collectives::ALGORITHMS
            .iter()
            .all(|a| a.descriptor().maps_peers || r.comm.instance(*a).is_none()));
        assert!(!r.comm.multi_node());
    });
    // Forced: only that one.
    threads(2, Some(TWOSHOT), |r| {
        // Forced for allreduce: the other allreduce algorithms are not set up, the other
        // collectives' are (nothing forces theirs), but not their PortChannel ones (one
        // node, none forced).
        let set_up: Vec<Algorithm> = oxccl_collectives::ALGORITHMS
            .iter()
            .copied()
            .filter(|a| r.comm.instance(*a).is_some())
            .collect();
        let others: Vec<Algorithm> = oxccl_collectives::ALGORITHMS
            .iter()
            .copied()
            .filter(|a| a.collective() != Collective::AllReduce && a.descriptor().maps_peers)
            .collect();
        assert_eq!(set_up, [&[TWOSHOT][..], &others].concat());
        assert_eq!(r.comm.peer_mappings(), 1);
        r.check(
            DataType::F32,
            ReduceOp::Sum,
            AccumType::Auto,
            1001,
            false,
            3,
        )
        .unwrap();
    });
}
