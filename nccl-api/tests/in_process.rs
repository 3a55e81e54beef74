//! The exported functions called from Rust, in one process on the host backend: two ranks
//! on two threads (`ncclCommInitAll`), allreduces, a forwarded call, teardown from one
//! thread; then two ranks initialised and all-reduced from one thread in groups (one of
//! them with a non-blocking config, completed at `ncclGroupEnd` too). (PreMulSum is in
//! `premul.rs`; the C test, `ci/nccl-api-test.sh`, covers the rest across processes.)

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
