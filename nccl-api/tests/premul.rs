//! PreMulSum operators through the exported functions, in one process on the host backend:
//! two ranks on two threads (`ncclCommInitAll`), host and device scalars, allreduce,
//! reduce-scatter and reduce checked exactly, a grouped allreduce of both ranks from one
//! thread, and what must be refused (wrong datatype, another communicator's operator, a
//! destroyed one, a built-in one, NULL pointers, bad types and residences).

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
#[test]
fn premul_on_two_ranks() {
    // The only test in this binary: nothing has read the environment yet.
    std::env::set_var("OXCCL_BACKEND", "host");
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
