//! The exported functions called from Rust, in one process on the host backend: two ranks
//! on two threads (`ncclCommInitAll`), allreduces, a forwarded call, teardown from one
//! thread; then two ranks initialised and all-reduced from one thread in groups (one of
//! them with a non-blocking config, completed at `ncclGroupEnd` too); then PreMulSum
//! operators (host and device scalars, allreduce, reduce-scatter and reduce, inside a
//! group too, and their bad uses). (The C test, `ci/nccl-api-test.sh`, covers the rest
//! across processes.)

use std::ffi::{c_void, CStr};

use oxccl_nccl::exports::*;
use oxccl_nccl::types::*;

#[derive(Clone, Copy)]
struct SendPtr(Opaque);
// SAFETY: a communicator may be used from another thread (one thread at a time).
unsafe impl Send for SendPtr {}

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn two_ranks_on_threads_reduce_forward_and_tear_down() {
    // The only test in this binary: nothing has read the environment yet. Without it a
    // `--features cuda` build on a machine without a GPU has no backend.
    std::env::set_var("OXCCL_BACKEND", "host");
    let mut comms = [std::ptr::null_mut::<c_void>(); 2];
    let devs = [0, 1];
    // SAFETY: two slots and two device numbers.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, devs.as_ptr()) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    let handles: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(rank, &c)| {
            let c = SendPtr(c);
            std::thread::spawn(move || {
                let c = c;
                let mut n = -1;
                // SAFETY: a live communicator and a valid out-pointer.
                assert_eq!(unsafe { ncclCommUserRank(c.0, &mut n) }, NCCL_SUCCESS);
                assert_eq!(n, rank as i32);
                let mut x: Vec<f32> = (0..5000).map(|i| (i % 7) as f32 + rank as f32).collect();
                // SAFETY: 5000 floats of host memory (host backend), in place.
                let rc = unsafe {
                    ncclAllReduce(
                        x.as_ptr().cast(),
                        x.as_mut_ptr().cast(),
                        x.len(),
                        NCCL_FLOAT32,
                        NCCL_SUM,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                for (i, v) in x.iter().enumerate() {
                    assert_eq!(*v, 2.0 * (i % 7) as f32 + 1.0, "element {i}");
                }
                // All-gather of an 8-byte type (moved as f32 pairs), out of place.
                let mine: Vec<f64> = (0..1001).map(|i| (i * 3 + rank * 7 + 1) as f64).collect();
                let mut all = vec![-0.5f64; 2 * mine.len()];
                // SAFETY: 1001 doubles in, 2 x 1001 out, host memory (host backend).
                let rc = unsafe {
                    ncclAllGather(
                        mine.as_ptr().cast(),
                        all.as_mut_ptr().cast(),
                        mine.len(),
                        NCCL_FLOAT64,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                for (i, v) in all.iter().enumerate() {
                    let (r, j) = (i / 1001, i % 1001);
                    assert_eq!(*v, (j * 3 + r * 7 + 1) as f64, "all-gather element {i}");
                }
                // int8 is served: the sum wraps (100 + 101 = -55 on two ranks).
                let x = [100i8 + rank as i8; 8];
                let mut y = [0i8; 8];
                // SAFETY: 8 bytes in and out, host memory (host backend).
                let rc = unsafe {
                    ncclAllReduce(
                        x.as_ptr().cast(),
                        y.as_mut_ptr().cast(),
                        8,
                        NCCL_INT8,
                        NCCL_SUM,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                assert_eq!(y, [-55i8; 8]);
                // Point-to-point is forwarded, and there is no real NCCL here.
                // SAFETY: as above.
                let rc = unsafe {
                    ncclSend(
                        x.as_ptr().cast(),
                        8,
                        NCCL_INT8,
                        1 - rank as i32,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_INVALID_USAGE);
                let e = last_error();
                assert!(e.contains("real NCCL"), "{e}");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for c in comms {
        // SAFETY: live communicators, each released once.
        let rc = unsafe { ncclCommDestroy(c) };
        assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    }
    grouped_from_one_thread();
    premul_on_two_ranks();
}

/// Both ranks of a job from this thread: the inits in one group (handles written at the
/// calls, ready at ncclGroupEnd), rank 1 with a non-blocking config; then one allreduce per
/// rank in one group, queued until ncclGroupEnd.
fn grouped_from_one_thread() {
    let mut id = NcclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
    let mut comms = [std::ptr::null_mut::<c_void>(); 2];
    // SAFETY: zeroed bytes are a valid config; the fields NCCL's initializer sets follow.
    let mut config: NcclConfig = unsafe { std::mem::zeroed() };
    config.size = std::mem::size_of::<NcclConfig>();
    config.magic = 0xcafe_beef;
    config.version = 22800;
    config.blocking = 0;
    // SAFETY: group calls, valid out-pointers, an id from ncclGetUniqueId, a full config.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclCommInitRank(&mut comms[0], 2, id, 0), NCCL_SUCCESS);
        let rc = ncclCommInitRankConfig(&mut comms[1], 2, id, 1, &mut config);
        assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
        assert!(comms.iter().all(|c| !c.is_null()));
        let mut state = NCCL_SUCCESS;
        assert_eq!(ncclCommGetAsyncError(comms[0], &mut state), NCCL_SUCCESS);
        assert_eq!(state, NCCL_IN_PROGRESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS, "{}", last_error());
        for c in comms {
            assert_eq!(ncclCommGetAsyncError(c, &mut state), NCCL_SUCCESS);
            assert_eq!(state, NCCL_SUCCESS);
        }
    }
    let mut bufs: Vec<Vec<f32>> = (0..2)
        .map(|r| (0..777).map(|i| (i % 13) as f32 * (r + 1) as f32).collect())
        .collect();
    // SAFETY: 777 floats per rank, in place, host memory (host backend), live until the
    // group ends.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for (b, &c) in bufs.iter_mut().zip(&comms) {
            let p = b.as_mut_ptr().cast::<c_void>();
            let rc = ncclAllReduce(p, p, 777, NCCL_FLOAT32, NCCL_SUM, c, std::ptr::null_mut());
            assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
        }
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS, "{}", last_error());
    }
    for b in &bufs {
        for (i, v) in b.iter().enumerate() {
            assert_eq!(*v, 3.0 * (i % 13) as f32, "grouped allreduce element {i}");
        }
    }
    for c in comms {
        // SAFETY: live communicators, each released once.
        let rc = unsafe { ncclCommDestroy(c) };
        assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    }
}

fn create_premul(
    comm: Opaque,
    scalar: *mut c_void,
    dtype: NcclDataType,
    residence: NcclScalarResidence,
) -> NcclRedOp {
    let mut op: NcclRedOp = -1;
    // SAFETY: a live communicator, a valid out-pointer and a scalar of `dtype`.
    let rc = unsafe { ncclRedOpCreatePreMulSum(&mut op, scalar, dtype, residence, comm) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    assert!(op >= NCCL_NUM_OPS, "op {op}");
    op
}

/// PreMulSum on two ranks of one process: each rank scales its own input by its own
/// scalar (rank r: r + 2, on the host for f32, in memory for i32, read when the call
/// runs), allreduce, reduce-scatter and reduce, checked exactly (small integers); a
/// grouped allreduce from one thread; then what must be refused.
fn premul_on_two_ranks() {
    let mut comms = [std::ptr::null_mut::<c_void>(); 2];
    let devs = [0, 1];
    // SAFETY: two slots and two device numbers.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, devs.as_ptr()) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    let ops: Vec<(NcclRedOp, NcclRedOp)> = comms
        .iter()
        .enumerate()
        .map(|(rank, &c)| {
            let c = SendPtr(c);
            std::thread::spawn(move || {
                let c = c;
                let mut s = (rank + 2) as f32;
                let f32_op = create_premul(c.0, (&mut s as *mut f32).cast(), NCCL_FLOAT32, 1);
                s = -1.0; // read at creation: changing it now changes nothing
                std::hint::black_box(&mut s);
                let mut d = Box::new(0i32); // the "device" scalar (host backend)
                let i32_op = create_premul(c.0, (&mut *d as *mut i32).cast(), NCCL_INT32, 0);
                let p = (rank + 2) as f32;
                // Allreduce, out of place: sum of (r + 2) * x = 2x + 3x.
                let x: Vec<f32> = (0..3001).map(|i| (i % 11) as f32).collect();
                let mut y = vec![-7f32; x.len()];
                // SAFETY: host buffers of 3001 floats (host backend).
                let rc = unsafe {
                    ncclAllReduce(
                        x.as_ptr().cast(),
                        y.as_mut_ptr().cast(),
                        x.len(),
                        NCCL_FLOAT32,
                        f32_op,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                for (i, v) in y.iter().enumerate() {
                    assert_eq!(*v, 5.0 * (i % 11) as f32, "premul allreduce element {i}");
                }
                // Reduce-scatter of int32 with the scalar in memory, set after creation:
                // rank r's scalar is 10 * (r + 1), rank r's input element j is j + r.
                *d = 10 * (rank as i32 + 1);
                let n = 777;
                let x: Vec<i32> = (0..2 * n).map(|j| j as i32 + rank as i32).collect();
                let mut y = vec![0i32; n];
                // SAFETY: 2 x 777 ints in, 777 out, host memory; the scalar lives on.
                let rc = unsafe {
                    ncclReduceScatter(
                        x.as_ptr().cast(),
                        y.as_mut_ptr().cast(),
                        n,
                        NCCL_INT32,
                        i32_op,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                for (i, v) in y.iter().enumerate() {
                    let j = (rank * n + i) as i32;
                    assert_eq!(
                        *v,
                        10 * j + 20 * (j + 1),
                        "premul reduce-scatter element {i}"
                    );
                }
                // Reduce to rank 1, in place on the root; the input is left alone elsewhere.
                let mut x: Vec<f32> = (0..55).map(|i| i as f32 * 0.5).collect();
                let xp = x.as_mut_ptr().cast::<c_void>();
                // SAFETY: 55 floats, in place, host memory.
                let rc = unsafe {
                    ncclReduce(
                        xp,
                        xp,
                        55,
                        NCCL_FLOAT32,
                        f32_op,
                        1,
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
                for (i, v) in x.iter().enumerate() {
                    let want = if rank == 1 {
                        5.0 * i as f32 * 0.5
                    } else {
                        i as f32 * 0.5
                    };
                    assert_eq!(*v, want, "premul reduce element {i} (scale {p})");
                }
                // The i32 operator with an f32 call: refused, nothing runs.
                // SAFETY: as above (refused before any buffer is touched).
                let rc = unsafe {
                    ncclAllReduce(xp, xp, 55, NCCL_FLOAT32, i32_op, c.0, std::ptr::null_mut())
                };
                assert_eq!(rc, NCCL_INVALID_ARGUMENT);
                let e = last_error();
                assert!(e.contains("made for int32"), "{e}");
                (f32_op, i32_op)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    // A grouped PreMulSum allreduce of both ranks from this thread.
    let mut bufs: Vec<Vec<f32>> = (0..2).map(|_| vec![1.0f32; 100]).collect();
    // SAFETY: 100 floats per rank, in place, host memory, live until the group ends.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for ((b, &c), &(op, _)) in bufs.iter_mut().zip(&comms).zip(&ops) {
            let p = b.as_mut_ptr().cast::<c_void>();
            let rc = ncclAllReduce(p, p, 100, NCCL_FLOAT32, op, c, std::ptr::null_mut());
            assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
        }
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS, "{}", last_error());
    }
    assert!(bufs.iter().all(|b| b.iter().all(|v| *v == 5.0)));
    let mut x = [0f32; 8];
    let xp = x.as_mut_ptr().cast::<c_void>();
    // SAFETY: every call below is refused before it touches a buffer.
    unsafe {
        // Rank 0's operator on rank 1's communicator.
        let rc = ncclAllReduce(
            xp,
            xp,
            8,
            NCCL_FLOAT32,
            ops[0].0,
            comms[1],
            std::ptr::null_mut(),
        );
        assert_eq!(rc, NCCL_INVALID_ARGUMENT);
        assert!(
            last_error().contains("another communicator"),
            "{}",
            last_error()
        );
        assert_eq!(ncclRedOpDestroy(ops[0].0, comms[1]), NCCL_INVALID_ARGUMENT);
        // Destroyed: refused by the calls and by a second destroy.
        assert_eq!(ncclRedOpDestroy(ops[0].0, comms[0]), NCCL_SUCCESS);
        let rc = ncclReduce(
            xp,
            xp,
            8,
            NCCL_FLOAT32,
            ops[0].0,
            0,
            comms[0],
            std::ptr::null_mut(),
        );
        assert_eq!(rc, NCCL_INVALID_ARGUMENT);
        assert!(last_error().contains("destroyed"), "{}", last_error());
        assert_eq!(ncclRedOpDestroy(ops[0].0, comms[0]), NCCL_INVALID_ARGUMENT);
        // Built-in operators are not destroyed; a NULL op slot, a NULL scalar, a bad type
        // and a bad residence are refused.
        assert_eq!(ncclRedOpDestroy(NCCL_SUM, comms[0]), NCCL_INVALID_ARGUMENT);
        let mut s = 1.0f32;
        let sp = (&mut s as *mut f32).cast::<c_void>();
        let c = comms[0];
        let rc = ncclRedOpCreatePreMulSum(std::ptr::null_mut(), sp, NCCL_FLOAT32, 1, c);
        assert_eq!(rc, NCCL_INVALID_ARGUMENT);
        let mut op = -1;
        let rc = ncclRedOpCreatePreMulSum(&mut op, std::ptr::null_mut(), NCCL_FLOAT32, 1, c);
        assert_eq!(rc, NCCL_INVALID_ARGUMENT);
        assert_eq!(
            ncclRedOpCreatePreMulSum(&mut op, sp, 12, 1, c),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclRedOpCreatePreMulSum(&mut op, sp, NCCL_FLOAT32, 2, c),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(op, -1);
        for (c, (a, b)) in comms.iter().zip(&ops) {
            for o in [*a, *b] {
                let _ = ncclRedOpDestroy(o, *c);
            }
        }
    }
    for c in comms {
        // SAFETY: live communicators, each released once.
        let rc = unsafe { ncclCommDestroy(c) };
        assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    }
}
