//! The exported functions on the ROCm backend, driven against the fake HIP runtime of
//! `oxccl-hal-rocm` (`hal-rocm/tests/fake_hip/fake_hip.c`, compiled here and loaded through
//! `OXCCL_HIP_LIBRARY`): which calls oxccl serves on the caller's `hipStream_t`, and which
//! go to RCCL with their reason. The fake runs no kernel, so results are not checked here
//! (that needs an MI300X: `ci/gpu/run-rocm.sh`); the dispatch is.
#![cfg(feature = "rocm")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use oxccl_nccl::exports::*;
use oxccl_nccl::types::*;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Kernel lookup and launch for a whole communicator: the fake's own
/// `hipModuleGetFunction` knows only `oxccl_*` names and its launch keeps argument blocks
/// of at most 256 bytes (enough for hal-rocm's tests), while a communicator looks up every
/// algorithm's kernel and passes larger blocks. The launch checks the `extra` layout as the
/// fake's does and counts launches (`anykernel_launches`).
const ANY_KERNEL: &str = r#"
#include <hip/hip_runtime_api.h>
#include <stdlib.h>
#include <string.h>
static int launches;
int anykernel_launches(void) { return __atomic_load_n(&launches, __ATOMIC_SEQ_CST); }
hipError_t hipModuleGetFunction(hipFunction_t *f, hipModule_t m, const char *name) {
    (void)m;
    char *copy = strdup(name); /* one per lookup, kept for the process */
    if (copy == NULL) return hipErrorOutOfMemory;
    *f = (hipFunction_t)copy;
    return hipSuccess;
}
hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy,
                                 unsigned int gz, unsigned int bx, unsigned int by,
                                 unsigned int bz, unsigned int shared, hipStream_t s,
                                 void **params, void **extra) {
    (void)f; (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)s;
    if (params != NULL || extra == NULL || gx == 0 || bx == 0) return hipErrorInvalidValue;
    if (extra[0] != HIP_LAUNCH_PARAM_BUFFER_POINTER || extra[2] != HIP_LAUNCH_PARAM_BUFFER_SIZE ||
        extra[4] != HIP_LAUNCH_PARAM_END || *(size_t *)extra[3] == 0)
        return hipErrorInvalidValue;
    __atomic_add_fetch(&launches, 1, __ATOMIC_SEQ_CST);
    return hipSuccess;
}
"#;

/// Compiles the fake runtime against the HIP headers the bindings came from, its kernel
/// lookup replaced by [`ANY_KERNEL`].
fn fake_hip() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nccl-fake-hip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libfakehip.so");
    let shim = dir.join("any_kernel.c");
    std::fs::write(&shim, ANY_KERNEL).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hal-rocm/tests/fake_hip/fake_hip.c");
    let include = std::env::var("HIP_INCLUDE_DIR")
        .or_else(|_| std::env::var("ROCM_PATH").map(|r| format!("{r}/include")))
        .unwrap_or_else(|_| "/opt/rocm/include".into());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let compile = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(&cc)
            .args(["-fPIC", "-O1", "-D__HIP_PLATFORM_AMD__"])
            .arg(format!("-I{include}"))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running the C compiler '{cc}': {e}"));
        assert!(
            out.status.success(),
            "compiling the fake HIP runtime:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let fake_o = dir.join("fake_hip.o");
    let shim_o = dir.join("any_kernel.o");
    // The fake's own lookup and launch are renamed out of the way.
    compile(&[
        "-c".as_ref(),
        "-DhipModuleGetFunction=fakehip_oxccl_only_get_function".as_ref(),
        "-DhipModuleLaunchKernel=fakehip_small_block_launch".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        fake_o.as_os_str(),
    ]);
    compile(&[
        "-c".as_ref(),
        shim.as_os_str(),
        "-o".as_ref(),
        shim_o.as_os_str(),
    ]);
    compile(&[
        "-shared".as_ref(),
        fake_o.as_os_str(),
        shim_o.as_os_str(),
        "-o".as_ref(),
        lib.as_os_str(),
        "-lpthread".as_ref(),
    ]);
    lib
}

/// Set in the child process that runs [`dispatch_on_the_fake`].
const CHILD_VAR: &str = "OXCCL_NCCL_ROCM_FAKE_CHILD";

/// Runs the calls in a child process of this test binary with `OXCCL_NCCL_LOG=info`, and
/// checks the decisions in its log: served calls name their algorithm, forwarded ones
/// their reason.
#[test]
fn rocm_communicator_serves_on_the_callers_stream_and_forwards_the_rest() {
    if std::env::var_os(CHILD_VAR).is_some() {
        dispatch_on_the_fake();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rocm_communicator_serves_on_the_callers_stream_and_forwards_the_rest",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env("OXCCL_NCCL_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed:\n{}\n{log}",
        String::from_utf8_lossy(&out.stdout)
    );
    for line in [
        "device 0 (ROCm): oxccl serving allreduce",
        "ncclAllReduce count=1000 dtype=fp32 op=sum -> oxccl (",
        "ncclAllReduce count=1000 dtype=bf16 op=sum -> oxccl (",
        "ncclAllGather sendcount=1000 dtype=fp8e4m3 -> oxccl (",
        "ncclAllReduce: dtype fp8e4m3 on ROCm: RCCL reduces it",
        "ncclSend: not served by oxccl, so it must be forwarded",
    ] {
        assert!(log.contains(line), "no '{line}' in the log:\n{log}");
    }
}

fn dispatch_on_the_fake() {
    // Only the child runs this: nothing has read the environment yet.
    let lib = fake_hip();
    std::env::set_var("OXCCL_HIP_LIBRARY", &lib);
    std::env::set_var("OXCCL_BACKEND", "rocm");
    std::env::set_var("OXCCL_NCCL_LIB_PATH", "/nonexistent/librccl.so.1");
    // The same instance the backend loaded (dlopen of one path gives one handle).
    // SAFETY: the fake is a plain C library without initialisers.
    let fake = unsafe { libloading::Library::new(&lib) }.unwrap();
    let launches = || -> c_int {
        // SAFETY: anykernel_launches() -> int is defined by ANY_KERNEL.
        let f =
            unsafe { fake.get::<unsafe extern "C" fn() -> c_int>(b"anykernel_launches") }.unwrap();
        // SAFETY: no arguments.
        unsafe { f() }
    };
    let calls = |name: &str| -> c_int {
        // SAFETY: fakehip_calls(const char*) -> int is defined by fake_hip.c.
        let f =
            unsafe { fake.get::<unsafe extern "C" fn(*const c_char) -> c_int>(b"fakehip_calls") }
                .unwrap();
        let c = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name.
        unsafe { f(c.as_ptr()) }
    };

    let mut id = NcclUniqueId::from_bytes(&[0; 128]);
    // SAFETY: a valid out-pointer.
    let rc = unsafe { ncclGetUniqueId(&mut id) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    let mut comm: Opaque = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and id; one rank.
    let rc = unsafe { ncclCommInitRank(&mut comm, 1, id, 0) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());

    let count = 1000usize;
    let mut send: *mut c_void = std::ptr::null_mut();
    let mut recv: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers (no RCCL: hipMalloc of the fake).
    unsafe {
        assert_eq!(
            ncclMemAlloc(&mut send, count * 4),
            NCCL_SUCCESS,
            "{}",
            last_error()
        );
        assert_eq!(
            ncclMemAlloc(&mut recv, count * 4),
            NCCL_SUCCESS,
            "{}",
            last_error()
        );
    }
    // The caller's stream, made outside oxccl.
    // SAFETY: hipStreamCreateWithFlags(hipStream_t*, unsigned) is defined by fake_hip.c.
    let stream_create = unsafe {
        fake.get::<unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int>(
            b"hipStreamCreateWithFlags",
        )
    }
    .unwrap();
    let mut stream: *mut c_void = std::ptr::null_mut();
    // hipStreamNonBlocking (1 in every HIP generation): the only flag the fake accepts.
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { stream_create(&mut stream, 1) }, 0);
    let destroys = calls("hipStreamDestroy");

    // Served: bf16 and f32 sums run on the caller's stream.
    let before = launches();
    for dtype in [NCCL_FLOAT32, NCCL_BFLOAT16] {
        // SAFETY: buffers of `count` elements of the fake's memory, a live stream.
        let rc = unsafe { ncclAllReduce(send, recv, count, dtype, NCCL_SUM, comm, stream) };
        assert_eq!(rc, NCCL_SUCCESS, "dtype {dtype}: {}", last_error());
    }
    assert!(
        launches() >= before + 2,
        "no work was queued for the served calls"
    );
    // The caller's stream was wrapped, never destroyed.
    assert_eq!(calls("hipStreamDestroy"), destroys);

    // fp8 reductions are RCCL's on ROCm: forwarded, with the reason (no RCCL here).
    // SAFETY: as above.
    let rc = unsafe { ncclAllReduce(send, recv, count, NCCL_FLOAT8_E4M3, NCCL_SUM, comm, stream) };
    assert_eq!(rc, NCCL_INVALID_USAGE);
    let e = last_error();
    assert!(
        e.contains("fp8e4m3 on ROCm") && e.contains("FNUZ") && e.contains("forwarded"),
        "{e}"
    );
    // Moving fp8 bytes is served.
    // SAFETY: recv holds count elements (one rank: count per rank).
    let rc = unsafe { ncclAllGather(send, recv, count, NCCL_FLOAT8_E4M3, comm, stream) };
    assert_eq!(rc, NCCL_SUCCESS, "{}", last_error());
    // Not served by oxccl at all: forwarded, with the reason.
    // SAFETY: as above.
    let rc = unsafe { ncclSend(send, count, NCCL_FLOAT32, 0, comm, stream) };
    assert_eq!(rc, NCCL_INVALID_USAGE);
    let e = last_error();
    assert!(
        e.contains("not served by oxccl") && e.contains("librccl.so.1"),
        "{e}"
    );

    // SAFETY: live allocations of ncclMemAlloc and a live communicator, used no more.
    unsafe {
        assert_eq!(ncclMemFree(send), NCCL_SUCCESS);
        assert_eq!(ncclMemFree(recv), NCCL_SUCCESS);
        assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS, "{}", last_error());
    }
}
