//! all_to_all_v on the host backend across ranks: every algorithm forced (the SM kernels'
//! host stand-ins run their device protocol) and the default selection, every data type, world sizes 1 to 4 and 8, random per-pair counts (zeros
//! included, up to several staging rounds) at shuffled displacements with gaps, registered
//! and unregistered outputs, real processes, and the errors: layouts that disagree across
//! ranks, bad arrays, overlapping buffers. Every receive range is compared bit for bit
//! with what its sender's input holds there; the output is poisoned first and the gaps
//! must keep the poison. The input starts one element past 16-byte alignment, so u8 calls
//! put chunks at odd byte offsets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::all_to_all_v::{
    copy::ALLTOALLV_COPY, direct::ALLTOALLV_DIRECT, one_shot::ALLTOALLV_ONESHOT_LL,
    staged::ALLTOALLV_STAGED,
};
use oxccl_collectives::backend::AnyMemory;
use oxccl_collectives::hal::{DataType, Device, DevicePtr, Memory, MemoryKind, Stream};
use oxccl_collectives::{Algorithm, Collective, CommConfig, Communicator};

mod common;
use common::{input, threads_with, Rank};

const POISON: u8 = 0x5a;

/// Every all_to_all_v algorithm.
const ALL: [Algorithm; 4] = [
    ALLTOALLV_ONESHOT_LL,
    ALLTOALLV_DIRECT,
    ALLTOALLV_COPY,
    ALLTOALLV_STAGED,
];

/// Whether a forced `algo` needs the output registered (it stores into the peers' outputs).
fn registers(algo: Option<Algorithm>) -> bool {
    algo.is_some_and(|a| a == ALLTOALLV_DIRECT || a == ALLTOALLV_COPY)
}

fn threads(world: u32, forced: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(
        world,
        move |_| CommConfig {
            timeout: Duration::from_secs(20),
            staging_bytes: 64 << 10, // small staging: large chunks take several rounds
            forced: forced.into(),
            ..CommConfig::default()
        },
        body,
    );
}

/// A small deterministic generator (the same sequence on every rank for a seed).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Every rank's call: `counts[r][p]` elements from r to p; displacements in a shuffled
/// order of the peers with a gap of 0..3 elements before each range.
struct Plan {
    counts: Vec<Vec<usize>>,
    send_displs: Vec<Vec<usize>>,
    recv_displs: Vec<Vec<usize>>,
}

/// Displacements of `sizes` packed in a shuffled order with gaps; and the extent.
fn place(sizes: &[usize], g: &mut Gen) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, g.below(i as u64 + 1) as usize);
    }
    let mut displs = vec![0; sizes.len()];
    let mut at = 0;
    for p in order {
        at += g.below(4) as usize;
        displs[p] = at;
        at += sizes[p];
    }
    (displs, at)
}

impl Plan {
    fn new(world: usize, max_count: usize, seed: u64) -> Plan {
        let mut g = Gen(seed);
        let counts: Vec<Vec<usize>> = (0..world)
            .map(|_| {
                (0..world)
                    .map(|_| match g.below(5) {
                        0 => 0,
                        1 => 1,
                        _ => g.below(max_count as u64 + 1) as usize,
                    })
                    .collect()
            })
            .collect();
        let send_displs = (0..world).map(|r| place(&counts[r], &mut g).0).collect();
        let recv_displs = (0..world)
            .map(|p| {
                let from: Vec<usize> = (0..world).map(|r| counts[r][p]).collect();
                place(&from, &mut g).0
            })
            .collect();
        Plan {
            counts,
            send_displs,
            recv_displs,
        }
    }

    fn extent(counts: &[usize], displs: &[usize]) -> usize {
        counts
            .iter()
            .zip(displs)
            .map(|(c, d)| if *c > 0 { c + d } else { 0 })
            .max()
            .unwrap_or(0)
    }

    fn recv_counts(&self, p: usize) -> Vec<usize> {
        self.counts.iter().map(|row| row[p]).collect()
    }
}

/// One rank's buffers of a call of `plan`: the input (one element past 16-byte
/// alignment: the kernels take any element address) holding this rank's data, the output
/// (of the largest receive extent, the same size everywhere) poisoned.
struct Buffers {
    in_mem: AnyMemory,
    out_mem: AnyMemory,
    out_elems: usize,
}

impl Buffers {
    fn new(r: &Rank, dtype: DataType, plan: &Plan, salt: u64) -> Buffers {
        let (rank, world) = (r.comm.rank() as usize, r.comm.world_size() as usize);
        let es = dtype.size();
        let send_extent = Plan::extent(&plan.counts[rank], &plan.send_displs[rank]);
        let out_elems = (0..world)
            .map(|p| Plan::extent(&plan.recv_counts(p), &plan.recv_displs[p]))
            .max()
            .unwrap()
            + 1;
        let dev = r.comm.device();
        let in_mem = dev
            .alloc((send_extent + 1) * es + 16, MemoryKind::Plain)
            .unwrap();
        let out_mem = dev.alloc(out_elems * es, MemoryKind::Plain).unwrap();
        let b = Buffers {
            in_mem,
            out_mem,
            out_elems,
        };
        r.stream
            .write(b.out_mem.ptr(), &vec![POISON; out_elems * es])
            .unwrap();
        let mine = sender_input(plan, dtype, rank, salt);
        r.stream
            .write(b.input(dtype), &mine[..send_extent * es])
            .unwrap();
        b
    }

    fn input(&self, dtype: DataType) -> DevicePtr {
        self.in_mem.ptr().offset(dtype.size()).unwrap()
    }

    /// Queues this rank's call.
    fn call(&self, r: &Rank, dtype: DataType, plan: &Plan) -> oxccl_collectives::hal::Result<()> {
        let rank = r.comm.rank() as usize;
        // SAFETY: the input holds the send extent and the output every receive range; both
        // live until the caller synchronizes.
        unsafe {
            r.comm.all_to_all_v(
                self.input(dtype),
                &plan.counts[rank],
                &plan.send_displs[rank],
                self.out_mem.ptr(),
                &plan.recv_counts(rank),
                &plan.recv_displs[rank],
                dtype,
                &r.stream,
            )
        }
    }

    /// Compares every receive range with its sender's input, and the gaps with the poison.
    fn verify(&self, r: &Rank, dtype: DataType, plan: &Plan, salt: u64) -> Result<(), String> {
        let rank = r.comm.rank() as usize;
        let es = dtype.size();
        let mut got = vec![0u8; self.out_elems * es];
        r.stream.read(self.out_mem.ptr(), &mut got).unwrap();
        let mut covered = vec![false; self.out_elems];
        for (s, &count) in plan.recv_counts(rank).iter().enumerate() {
            if count == 0 {
                continue;
            }
            let from = plan.send_displs[s][rank] * es;
            let at = plan.recv_displs[rank][s] * es;
            let want = &sender_input(plan, dtype, s, salt)[from..][..count * es];
            let slot = &got[at..][..count * es];
            if let Some(i) = slot.iter().zip(want).position(|(g, w)| g != w) {
                return Err(format!(
                    "rank {rank} {dtype} seed {salt}: byte {i} from rank {s} is {:#x}, want {:#x}",
                    slot[i], want[i]
                ));
            }
            covered[plan.recv_displs[rank][s]..][..count].fill(true);
        }
        for (e, c) in covered.iter().enumerate() {
            if !c && got[e * es..][..es].iter().any(|b| *b != POISON) {
                return Err(format!(
                    "rank {rank} {dtype}: element {e} of the output (no range) was written"
                ));
            }
        }
        Ok(())
    }
}

/// Rank `s`'s input data for `plan` (its send extent, at least one element).
fn sender_input(plan: &Plan, dtype: DataType, s: usize, salt: u64) -> Vec<u8> {
    let n = Plan::extent(&plan.counts[s], &plan.send_displs[s]);
    input(dtype, s as u32, n.max(1), salt)
}

/// One checked call of `plan` on this rank; with `register`, the output buffer is
/// registered first (collective).
fn check(r: &Rank, dtype: DataType, plan: &Plan, register: bool, salt: u64) -> Result<(), String> {
    let b = Buffers::new(r, dtype, plan, salt);
    if register {
        r.comm.register(&b.out_mem).unwrap();
    }
    let result = b.call(r, dtype, plan);
    r.stream.synchronize().unwrap();
    let outcome = result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| e.to_string())
        .and_then(|()| b.verify(r, dtype, plan, salt));
    if register {
        r.comm.deregister(&b.out_mem).unwrap();
    }
    outcome
}

#[test]
fn every_algorithm_every_type_on_three_ranks() {
    for algo in ALL {
        threads(3, Some(algo), move |r| {
            for (i, dtype) in DataType::ALL.into_iter().enumerate() {
                let plan = Plan::new(3, 3000, i as u64);
                check(r, dtype, &plan, registers(Some(algo)), i as u64).unwrap();
                assert_eq!(r.comm.last_call().unwrap().algorithm, algo);
            }
        });
    }
}

#[test]
fn random_layouts_on_world_sizes_one_to_four() {
    for world in 1..=4u32 {
        for algo in [None].into_iter().chain(ALL.map(Some)) {
            threads(world, algo, move |r| {
                let register = registers(algo);
                // Up to 100,003 bf16 elements per pair: several rounds of 64 KiB slots.
                for (seed, max) in [(1u64, 7usize), (2, 12_345), (3, 100_003), (4, 1)] {
                    let plan = Plan::new(world as usize, max, seed * 31 + u64::from(world));
                    check(r, DataType::Bf16, &plan, register, seed).unwrap();
                }
                let plan = Plan::new(world as usize, 333, 99);
                check(r, DataType::F32, &plan, register, 7).unwrap();
            });
        }
    }
}

/// The counts of the matrix (1, 3, 1000, 12345, 2^20 + 7 per pair), every pair the
/// same count but at shuffled displacements with gaps; every type at the small counts.
#[test]
fn matrix_counts_on_two_and_three_ranks() {
    for world in [2u32, 3] {
        for algo in ALL {
            threads(world, Some(algo), move |r| {
                let register = registers(Some(algo));
                for (i, count) in [1usize, 3, 17, 1000, 12_345, (1 << 20) + 7]
                    .into_iter()
                    .enumerate()
                {
                    let mut plan = Plan::new(world as usize, 1, 40 + i as u64);
                    for row in &mut plan.counts {
                        row.fill(count);
                    }
                    // Re-place the ranges for the new sizes (gaps of 0..3 elements).
                    let mut g = Gen(77 + i as u64);
                    plan.send_displs = (0..world as usize)
                        .map(|q| place(&plan.counts[q], &mut g).0)
                        .collect();
                    plan.recv_displs = (0..world as usize)
                        .map(|p| place(&plan.recv_counts(p), &mut g).0)
                        .collect();
                    if algo == ALLTOALLV_ONESHOT_LL && count > 12_345 {
                        // Too large for its packet slots: refused alike on every rank.
                        let e = check(r, DataType::Bf16, &plan, register, 0).unwrap_err();
                        assert!(e.contains("alltoallv_oneshot_ll"), "{e}");
                        continue;
                    }
                    let types: &[DataType] = if count <= 1000 {
                        &DataType::ALL
                    } else {
                        &[DataType::Bf16]
                    };
                    for (k, dtype) in types.iter().enumerate() {
                        check(r, *dtype, &plan, register, (i * 100 + k) as u64).unwrap();
                    }
                }
            });
        }
    }
}

#[test]
fn eight_ranks() {
    for algo in ALL {
        threads(8, Some(algo), move |r| {
            for seed in 0..3u64 {
                let plan = Plan::new(8, 5000, seed);
                check(r, DataType::Bf16, &plan, registers(Some(algo)), seed).unwrap();
            }
        });
    }
}

#[test]
fn default_selection_follows_registration() {
    threads(2, None, |r| {
        let plan = large_plan();
        check(r, DataType::F32, &plan, true, 1).unwrap();
        let rec = r.comm.last_call().unwrap();
        assert_eq!(
            (rec.collective, rec.algorithm),
            (Collective::AllToAllV, ALLTOALLV_DIRECT),
            "{rec}"
        );
        assert!(rec.to_string().contains("registered"), "{rec}");
        check(r, DataType::F32, &plan, false, 2).unwrap();
        let rec = r.comm.last_call().unwrap();
        // Unregistered outputs: straight in when auto-registration maps them, else staged.
        assert!(
            (rec.algorithm == ALLTOALLV_DIRECT && rec.to_string().contains("callers' allocations"))
                || (rec.algorithm == ALLTOALLV_STAGED && rec.to_string().contains("scratch")),
            "{rec}"
        );
    });
}

#[test]
fn nothing_to_move_and_one_sided_ranks() {
    threads(3, None, |r| {
        // Nobody sends anything: nothing is queued, null buffers are fine.
        let zeros = [0usize; 3];
        let null = DevicePtr::NULL;
        // SAFETY: no range reaches either buffer.
        unsafe {
            r.comm.all_to_all_v(
                null,
                &zeros,
                &zeros,
                null,
                &zeros,
                &zeros,
                DataType::F32,
                &r.stream,
            )
        }
        .unwrap();
        // Only rank 0 sends (to everyone, itself included): the others send nothing.
        let plan = Plan {
            counts: vec![vec![5, 1000, 70_000], vec![0; 3], vec![0; 3]],
            send_displs: vec![vec![0, 5, 1005], vec![0; 3], vec![0; 3]],
            recv_displs: vec![vec![0, 0, 0], vec![0, 0, 0], vec![3, 0, 0]],
        };
        check(r, DataType::Bf16, &plan, false, 3).unwrap();
    });
}

/// The one-shot's parity halves: many calls back to back without a synchronize, one rank
/// slower than the others, layouts with empty chunks (acknowledgements instead of data)
/// and u8 chunks at odd byte offsets. A rank that ran two calls ahead would overwrite a
/// half its peer still reads.
#[test]
fn one_shot_calls_back_to_back_with_a_slow_rank() {
    threads(3, Some(ALLTOALLV_ONESHOT_LL), |r| {
        let calls: Vec<(DataType, Plan, Buffers)> = (0..24u64)
            .map(|salt| {
                let dtype = if salt % 2 == 0 {
                    DataType::U8
                } else {
                    DataType::F32
                };
                let mut plan = Plan::new(3, 40, 1000 + salt);
                if salt % 3 == 0 {
                    // Rank (salt / 3) % 3 sends nothing and receives nothing at all.
                    let quiet = (salt / 3 % 3) as usize;
                    for p in 0..3 {
                        plan.counts[quiet][p] = 0;
                        plan.counts[p][quiet] = 0;
                    }
                }
                let b = Buffers::new(r, dtype, &plan, salt);
                (dtype, plan, b)
            })
            .collect();
        for (dtype, plan, b) in &calls {
            if r.comm.rank() == 2 {
                std::thread::sleep(Duration::from_millis(2)); // the slow peer
            }
            b.call(r, *dtype, plan).unwrap();
            assert_eq!(r.comm.last_call().unwrap().algorithm, ALLTOALLV_ONESHOT_LL);
        }
        r.stream.synchronize().unwrap();
        r.comm.check_error(&r.stream).unwrap();
        for (salt, (dtype, plan, b)) in calls.iter().enumerate() {
            b.verify(r, *dtype, plan, salt as u64).unwrap();
        }
    });
}

/// Chunks of 1, 3 and 17 bytes (u8) at odd offsets, from every pair, through every
/// algorithm; and a peer that sends this rank nothing at all.
#[test]
fn odd_byte_chunks_and_silent_peers() {
    for algo in ALL {
        threads(4, Some(algo), move |r| {
            for (i, count) in [1usize, 3, 17].into_iter().enumerate() {
                let mut plan = Plan::new(4, 1, 500 + i as u64);
                for (q, row) in plan.counts.iter_mut().enumerate() {
                    row.fill(count);
                    row[(q + 1) % 4] = 0; // q sends its successor nothing
                }
                let mut g = Gen(600 + i as u64);
                plan.send_displs = (0..4).map(|q| place(&plan.counts[q], &mut g).0).collect();
                plan.recv_displs = (0..4)
                    .map(|p| place(&plan.recv_counts(p), &mut g).0)
                    .collect();
                check(r, DataType::U8, &plan, registers(Some(algo)), i as u64).unwrap();
                assert_eq!(r.comm.last_call().unwrap().algorithm, algo);
            }
        });
    }
}

/// Two ranks, one chunk of 4 MiB of f32 (above every one-shot threshold), the others small;
/// the ranks' own extents differ.
fn large_plan() -> Plan {
    Plan {
        counts: vec![vec![10, 1 << 20], vec![5, 1]],
        send_displs: vec![vec![1 << 20, 0], vec![0, 5]],
        recv_displs: vec![vec![0, 10], vec![0, 1 << 20]],
    }
}

/// The default choice: the one-shot for small calls (whatever the registration), the direct
/// kernel for large ones on reachable outputs, the staged one otherwise; every rank alike
/// although their own extents differ.
#[test]
fn default_selection_by_largest_chunk_and_reachability() {
    threads_with(
        2,
        |_| CommConfig {
            timeout: Duration::from_secs(20),
            auto_register: false,
            ..CommConfig::default()
        },
        |r| {
            let mut small = Plan::new(2, 1, 3);
            small.counts = vec![vec![1000, 10], vec![3, 0]];
            small.send_displs = vec![vec![0, 1000], vec![0, 0]];
            small.recv_displs = vec![vec![0, 1000], vec![0, 0]];
            let large = large_plan();
            for (plan, register, want) in [
                (&small, false, ALLTOALLV_ONESHOT_LL),
                (&small, true, ALLTOALLV_ONESHOT_LL),
                (&large, true, ALLTOALLV_DIRECT),
                (&large, false, ALLTOALLV_STAGED),
            ] {
                check(r, DataType::F32, plan, register, 1).unwrap();
                let rec = r.comm.last_call().unwrap();
                assert_eq!(rec.algorithm, want, "register {register}: {rec}");
            }
        },
    );
}

/// A call every rank makes with `send_counts`/`recv_counts` as given per rank; returns this
/// rank's error text.
fn bad_call(r: &Rank, send: &[usize], recv: &[usize], overlap: bool) -> String {
    let world = r.comm.world_size() as usize;
    let buf = r.comm.device().alloc(1 << 16, MemoryKind::Plain).unwrap();
    let other = r.comm.device().alloc(1 << 16, MemoryKind::Plain).unwrap();
    let displs: Vec<usize> = (0..send.len()).map(|p| p * 100).collect();
    let rdispls: Vec<usize> = (0..recv.len()).map(|p| p * 100).collect();
    let out = if overlap {
        buf.ptr().offset(4 * 50).unwrap()
    } else {
        other.ptr()
    };
    assert!(send.len() <= world + 1);
    // SAFETY: each buffer holds 16,384 f32, beyond every range; refused or completed
    // before the synchronize.
    let e = unsafe {
        r.comm.all_to_all_v(
            buf.ptr(),
            send,
            &displs,
            out,
            recv,
            &rdispls,
            DataType::F32,
            &r.stream,
        )
    };
    r.stream.synchronize().unwrap();
    e.unwrap_err().to_string()
}

#[test]
fn layouts_that_disagree_and_bad_arrays_are_errors_on_every_rank() {
    threads(2, None, |r| {
        let me = r.comm.rank();
        // Rank 1 expects 9 elements from rank 0, which sends 4.
        let (send, recv) = if me == 0 {
            ([2, 4], [2, 3])
        } else {
            ([3, 1], [9, 1])
        };
        let e = bad_call(r, &send, &recv, false);
        assert!(
            e.contains("mismatched all_to_all_v calls")
                && e.contains("rank 0 sends 4 elements to rank 1, which expects 9"),
            "{e}"
        );
        // Arrays of the wrong length (every rank: a local error, nothing exchanged).
        let e = bad_call(r, &[1, 1, 1], &[1, 1], false);
        assert!(
            e.contains("3 send counts and 3 send displacements for 2 ranks"),
            "{e}"
        );
        // Input and output overlap.
        let e = bad_call(r, &[1, 1], &[1, 1], true);
        assert!(e.contains("no in-place form"), "{e}");
        // Overlapping receive ranges: 150 elements from rank 0 at 0, rank 1's at 100.
        let buf = r.comm.device().alloc(4096, MemoryKind::Plain).unwrap();
        let out = r.comm.device().alloc(4096, MemoryKind::Plain).unwrap();
        // SAFETY: refused before anything is queued.
        let e = unsafe {
            r.comm.all_to_all_v(
                buf.ptr(),
                &[150, 150],
                &[0, 150],
                out.ptr(),
                &[150, 150],
                &[0, 100],
                DataType::F32,
                &r.stream,
            )
        }
        .unwrap_err()
        .to_string();
        assert!(e.contains("receive ranges of ranks 0 and 1 overlap"), "{e}");
        // The communicator still serves calls afterwards.
        let plan = Plan::new(2, 100, 8);
        check(r, DataType::F32, &plan, false, 9).unwrap();
    });
}

#[test]
fn a_peer_that_skips_the_call_is_a_timeout() {
    threads_with(
        2,
        |_| CommConfig {
            timeout: Duration::from_millis(500),
            ..CommConfig::default()
        },
        |r| {
            if r.comm.rank() == 1 {
                // Outlive rank 0's wait before the teardown's collective.
                std::thread::sleep(Duration::from_millis(1500));
                return;
            }
            let plan = Plan::new(2, 10, 1);
            let e = check(r, DataType::F32, &plan, false, 1).unwrap_err();
            assert!(e.contains("rank 1") && e.contains("timed out"), "{e}");
        },
    );
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
    let world = r.comm.world_size() as usize;
    let register =
        std::env::var("OXCCL_ALGO").is_ok_and(|a| a == "alltoallv_copy" || a == "alltoallv_direct");
    for (seed, max) in [(1u64, 1usize), (2, 777), (3, 200_003)] {
        for dtype in [DataType::Bf16, DataType::Fp8E4m3, DataType::F64] {
            let plan = Plan::new(world, max, seed);
            check(&r, dtype, &plan, register, seed).unwrap();
        }
    }
    r.stream.synchronize().unwrap();
    r.comm.destroy().unwrap();
}

#[test]
fn ranks_in_separate_processes() {
    for (world, algo) in [
        (2, "auto"),
        (3, "alltoallv_staged"),
        (2, "alltoallv_copy"),
        (3, "alltoallv_direct"),
    ] {
        common::run_child_ranks(
            world,
            &[("OXCCL_ALGO", algo), ("OXCCL_STAGING_MB", "1")],
            &format!("world {world} algo {algo}"),
        );
    }
}
