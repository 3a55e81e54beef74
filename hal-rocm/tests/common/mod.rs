//! The fake HIP runtime (`tests/fake_hip/fake_hip.c`): built once per test binary with the
//! system C compiler (`$CC`, else `cc`) against the same headers as the bindings, then
//! copied per test so that each test loads its own instance with its own state.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use oxccl_hal_rocm::Hip;

/// Where the fake library is built.
fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake_hip-{}", std::process::id()))
}

/// Compiles the fake runtime once per process and returns the library's path.
pub fn fake_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = out_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libfakehip.so");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_hip/fake_hip.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-D__HIP_PLATFORM_AMD__"])
            .arg(format!("-I{}", env!("OXCCL_HIP_INCLUDE_DIR")))
            .arg("-o")
            .arg(&lib)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("running the C compiler '{cc}' (set CC): {e}"));
        assert!(
            out.status.success(),
            "compiling the fake HIP runtime failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
}

/// A private copy of the fake runtime, loaded both as the HIP runtime and for control.
pub struct Fake {
    pub hip: Arc<Hip>,
    pub path: PathBuf,
    control: libloading::Library,
}

impl Fake {
    /// A fresh instance with the default IPC import bound.
    pub fn new() -> Fake {
        Fake::with_import_limit(oxccl_hal_rocm::DEFAULT_MAX_IPC_IMPORTS)
    }

    /// A fresh instance whose runtime allows `limit` open IPC handles.
    pub fn with_import_limit(limit: usize) -> Fake {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = out_dir().join(format!(
            "libfakehip-{}.so",
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::copy(fake_library(), &path).unwrap();
        // SAFETY: the fake runtime is a plain C library without initialisers.
        let control = unsafe { libloading::Library::new(&path) }.unwrap();
        let hip = Hip::load_with_import_limit(&path, limit).unwrap();
        Fake { hip, path, control }
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> T {
        // SAFETY: the caller names a function of fake_hip.c with type T.
        unsafe { *self.control.get::<T>(name).unwrap() }
    }

    pub fn set_device_count(&self, n: i32) {
        let f: unsafe extern "C" fn(c_int) = self.sym(b"fakehip_set_device_count");
        // SAFETY: plain value argument.
        unsafe { f(n) }
    }

    pub fn set_attribute(&self, attr: u32, value: i32) {
        let f: unsafe extern "C" fn(c_int, c_int) = self.sym(b"fakehip_set_attribute");
        // SAFETY: plain value arguments.
        unsafe { f(attr as c_int, value) }
    }

    /// The next `times` calls of `call` (negative: all) return `code`.
    pub fn fail(&self, call: &str, code: u32, times: i32) {
        let f: unsafe extern "C" fn(*const c_char, c_int, c_int) = self.sym(b"fakehip_fail");
        let c = CString::new(call).unwrap();
        // SAFETY: NUL-terminated name, copied by the callee.
        unsafe { f(c.as_ptr(), code as c_int, times) }
    }

    pub fn calls(&self, call: &str) -> i32 {
        let f: unsafe extern "C" fn(*const c_char) -> c_int = self.sym(b"fakehip_calls");
        let c = CString::new(call).unwrap();
        // SAFETY: NUL-terminated name.
        unsafe { f(c.as_ptr()) }
    }

    pub fn ipc_opens(&self, key: u64) -> i32 {
        let f: unsafe extern "C" fn(u64) -> c_int = self.sym(b"fakehip_ipc_opens");
        // SAFETY: plain value argument.
        unsafe { f(key) }
    }

    pub fn ipc_closes(&self, key: u64) -> i32 {
        let f: unsafe extern "C" fn(u64) -> c_int = self.sym(b"fakehip_ipc_closes");
        // SAFETY: plain value argument.
        unsafe { f(key) }
    }

    pub fn live_allocs(&self) -> i32 {
        let f: unsafe extern "C" fn() -> c_int = self.sym(b"fakehip_live_allocs");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// Size and bytes of the last launch's argument block.
    pub fn last_launch(&self) -> (Vec<u8>, u32) {
        let size: unsafe extern "C" fn() -> usize = self.sym(b"fakehip_last_launch_size");
        let args: unsafe extern "C" fn() -> *const u8 = self.sym(b"fakehip_last_launch_args");
        let grid: unsafe extern "C" fn() -> u32 = self.sym(b"fakehip_last_launch_grid");
        // SAFETY: the fake keeps a static buffer of at least `size` bytes.
        unsafe { (std::slice::from_raw_parts(args(), size()).to_vec(), grid()) }
    }
}

/// Loads a fresh copy whose `hipRuntimeGetVersion` answers `version`.
pub fn load_with_version(version: i32) -> oxccl_hal::Result<Arc<Hip>> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = out_dir().join(format!(
        "libfakehip-v{}.so",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::copy(fake_library(), &path).unwrap();
    // SAFETY: the fake runtime is a plain C library without initialisers.
    let control = unsafe { libloading::Library::new(&path) }.unwrap();
    // SAFETY: fakehip_set_version(int) is defined by fake_hip.c.
    unsafe {
        let f = *control
            .get::<unsafe extern "C" fn(c_int)>(b"fakehip_set_version")
            .unwrap();
        f(version);
    }
    let hip = Hip::load(&path);
    drop(control);
    hip
}
