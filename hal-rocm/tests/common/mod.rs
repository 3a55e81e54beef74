//! The fake HIP runtime (`tests/fake_hip/fake_hip.c`), one build per HIP ABI generation:
//! compiled with the system C compiler (`$CC`, else `cc`) against that generation's real
//! headers, so it reports that generation's `HIP_VERSION` and uses its enum numbering,
//! flag values and structure layouts. Each build is made once per test binary, then copied
//! per test so that each test loads its own instance with its own state.
//!
//! Where the headers are found, for generation `N`: `OXCCL_HIP<N>_INCLUDE_DIR` (what
//! `ci/toolchains/hip.sh` exports), else the first of `HIP_INCLUDE_DIR`, `$ROCM_PATH/include`,
//! `$HIP_PATH/include`, `/opt/rocm/include` whose `hip/hip_version.h` is of major `N`. A
//! generation without headers is skipped (said on stderr), unless
//! `OXCCL_HIP_ALL_GENERATIONS=1` (set by hip.sh's env file, so on CI), which makes it a
//! failure; no headers at all is always a failure.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use oxccl_hal::DeviceId;
use oxccl_hal_rocm::{Hip, RocmDevice};

/// One `#[test]` per function named, each running the test file's function of that name
/// against every generation's fake (`#[macro_use] mod common;` brings it in).
#[allow(unused_macros)]
macro_rules! for_each_generation {
    ($($name:ident),* $(,)?) => {
        mod each_generation {
            $(
                #[test]
                fn $name() {
                    for g in crate::common::generations() {
                        eprintln!("HIP ABI generation {g}");
                        super::$name(g);
                    }
                }
            )*
        }
    };
}

/// Device `id` of `fake`'s runtime.
pub fn open(fake: &Fake, id: u32) -> RocmDevice {
    RocmDevice::open_on(&fake.hip, DeviceId(id)).unwrap()
}

/// The fake's key of a legacy IPC handle: its first 8 bytes.
pub fn key(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[..8].try_into().unwrap())
}

/// The generations the fake can be built for (every supported one).
pub const GENERATIONS: [u32; 3] = [5, 6, 7];

/// Where the fake libraries are built.
fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake_hip-{}", std::process::id()))
}

/// `#define HIP_VERSION_MAJOR <n>` of the headers in `include`.
fn header_major(include: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(include.join("hip/hip_version.h")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("#define HIP_VERSION_MAJOR "))
        .and_then(|v| v.trim().parse().ok())
}

/// The include directory of generation `generation`'s headers, if any.
pub fn include_dir(generation: u32) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(format!("OXCCL_HIP{generation}_INCLUDE_DIR")) {
        let dir = PathBuf::from(dir);
        assert_eq!(
            header_major(&dir),
            Some(generation),
            "OXCCL_HIP{generation}_INCLUDE_DIR={} holds no HIP {generation}.x headers",
            dir.display()
        );
        return Some(dir);
    }
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("HIP_INCLUDE_DIR") {
        candidates.push(PathBuf::from(d));
    }
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            candidates.push(Path::new(&d).join("include"));
        }
    }
    candidates.push(PathBuf::from("/opt/rocm/include"));
    candidates
        .into_iter()
        .find(|d| header_major(d) == Some(generation))
}

/// The generations the tests run against: those with headers (see the module doc).
pub fn generations() -> Vec<u32> {
    static LIST: OnceLock<Vec<u32>> = OnceLock::new();
    LIST.get_or_init(|| {
        let all = std::env::var("OXCCL_HIP_ALL_GENERATIONS").is_ok_and(|v| v == "1");
        let mut found = Vec::new();
        for g in GENERATIONS {
            if include_dir(g).is_some() {
                found.push(g);
            } else if all {
                panic!(
                    "OXCCL_HIP_ALL_GENERATIONS=1 but no HIP {g}.x headers: set \
                     OXCCL_HIP{g}_INCLUDE_DIR (ci/toolchains/hip.sh, then \
                     . .toolchains/hip/env.sh)"
                );
            } else {
                eprintln!("fake HIP runtime: no HIP {g}.x headers, generation {g} not tested");
            }
        }
        assert!(
            !found.is_empty(),
            "the fake HIP runtime needs HIP headers of at least one generation: run \
             ci/toolchains/hip.sh and `. .toolchains/hip/env.sh`, or set ROCM_PATH"
        );
        found
    })
    .clone()
}

/// The newest generation with headers.
pub fn newest() -> u32 {
    *generations().last().unwrap()
}

/// Compiles the fake runtime for `generation` once per process; returns the library.
pub fn fake_library(generation: u32) -> PathBuf {
    static LIBS: OnceLock<Mutex<HashMap<u32, PathBuf>>> = OnceLock::new();
    let mut libs = LIBS.get_or_init(Default::default).lock().unwrap();
    if let Some(lib) = libs.get(&generation) {
        return lib.clone();
    }
    let include = include_dir(generation)
        .unwrap_or_else(|| panic!("no HIP {generation}.x headers for the fake runtime"));
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join(format!("libfakehip-v{generation}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_hip/fake_hip.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-D__HIP_PLATFORM_AMD__",
        ])
        .arg(format!("-I{}", include.display()))
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler '{cc}' (set CC): {e}"));
    assert!(
        out.status.success(),
        "compiling the fake HIP runtime against {} failed:\n{}",
        include.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    libs.insert(generation, lib.clone());
    lib
}

/// Compiles the C `source` into the shared library `name` (in the fake's build directory).
pub fn build_c_library(name: &str, source: &str) -> PathBuf {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let lib = dir.join(format!("{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler '{cc}' (set CC): {e}"));
    assert!(
        out.status.success(),
        "compiling {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// A private copy of generation `generation`'s fake library.
fn private_copy(generation: u32) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = out_dir().join(format!(
        "libfakehip-v{generation}-{}.so",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::copy(fake_library(generation), &path).unwrap();
    path
}

/// The fake's control interface (the `fakehip_*` functions) on a loaded copy.
pub struct Control {
    lib: libloading::Library,
}

impl Control {
    fn open(path: &Path) -> Control {
        // SAFETY: the fake runtime is a plain C library without initialisers.
        let lib = unsafe { libloading::Library::new(path) }.unwrap();
        Control { lib }
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> T {
        // SAFETY: the caller names a function of fake_hip.c with type T.
        unsafe { *self.lib.get::<T>(name).unwrap() }
    }

    /// What the fake's `hipRuntimeGetVersion` answers from now on.
    pub fn set_version(&self, v: i32) {
        let f: unsafe extern "C" fn(c_int) = self.sym(b"fakehip_set_version");
        // SAFETY: plain value argument.
        unsafe { f(v) }
    }

    /// `HIP_VERSION` of the headers this copy was compiled against.
    pub fn header_version(&self) -> i32 {
        let f: unsafe extern "C" fn() -> c_int = self.sym(b"fakehip_header_version");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// The headers' value of the `hipError_t` named `name` (panics for names the fake does
    /// not know).
    pub fn error_code(&self, name: &str) -> u32 {
        let f: unsafe extern "C" fn(*const c_char) -> c_int = self.sym(b"fakehip_error_code");
        let c = CString::new(name).unwrap();
        // SAFETY: NUL-terminated name.
        let code = unsafe { f(c.as_ptr()) };
        assert!(code >= 0, "the fake knows no error {name}");
        code as u32
    }

    /// The next `times` calls of `call` (negative: all) return the error named `error`.
    pub fn fail(&self, call: &str, error: &str, times: i32) {
        let code = self.error_code(error);
        let f: unsafe extern "C" fn(*const c_char, c_int, c_int) = self.sym(b"fakehip_fail");
        let c = CString::new(call).unwrap();
        // SAFETY: NUL-terminated name, copied by the callee.
        unsafe { f(c.as_ptr(), code as c_int, times) }
    }
}

/// A private copy of the fake runtime, loaded both as the HIP runtime and for control.
pub struct Fake {
    pub hip: Arc<Hip>,
    pub path: PathBuf,
    pub generation: u32,
    control: Control,
}

impl std::ops::Deref for Fake {
    type Target = Control;
    fn deref(&self) -> &Control {
        &self.control
    }
}

impl Fake {
    /// A fresh instance of `generation` with the default IPC import bound.
    pub fn new(generation: u32) -> Fake {
        Fake::with_import_limit(generation, oxccl_hal_rocm::DEFAULT_MAX_IPC_IMPORTS)
    }

    /// A fresh instance of `generation` whose runtime allows `limit` open IPC handles.
    pub fn with_import_limit(generation: u32, limit: usize) -> Fake {
        let path = private_copy(generation);
        let control = Control::open(&path);
        let hip = Hip::load_with_import_limit(&path, limit).unwrap();
        Fake {
            hip,
            path,
            generation,
            control,
        }
    }

    pub fn set_device_count(&self, n: i32) {
        let f: unsafe extern "C" fn(c_int) = self.sym(b"fakehip_set_device_count");
        // SAFETY: plain value argument.
        unsafe { f(n) }
    }

    /// Sets the attribute `hipDeviceAttribute<name>` (numbered by the fake's headers).
    pub fn set_attribute(&self, name: &str, value: i32) {
        let f: unsafe extern "C" fn(*const c_char, c_int) -> c_int =
            self.sym(b"fakehip_set_attribute");
        let c = CString::new(name).unwrap();
        // SAFETY: NUL-terminated name, plain value.
        let known = unsafe { f(c.as_ptr(), value) };
        assert_eq!(known, 1, "the fake knows no attribute {name}");
    }

    /// Makes the block of the fake's memory holding `p` report itself as managed device
    /// memory; false when no block holds `p`.
    pub fn set_managed(&self, p: u64) -> bool {
        let f: unsafe extern "C" fn(*mut std::ffi::c_void) -> c_int =
            self.sym(b"fakehip_set_managed");
        // SAFETY: the fake only looks the address up in its table.
        unsafe { f(p as *mut std::ffi::c_void) != 0 }
    }

    /// Makes the fake's stream `s` report an active capture (or none).
    pub fn set_capturing(&self, s: *mut std::ffi::c_void, on: bool) {
        let f: unsafe extern "C" fn(*mut std::ffi::c_void, c_int) =
            self.sym(b"fakehip_set_capturing");
        // SAFETY: `s` is a live stream of this fake.
        unsafe { f(s, c_int::from(on)) }
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

/// Loads a fresh copy of `generation`'s fake after `prepare` has set it up through its
/// control interface (e.g. another reported version, or a failing call).
pub fn load_prepared(
    generation: u32,
    prepare: impl FnOnce(&Control),
) -> (oxccl_hal::Result<Arc<Hip>>, Control) {
    let path = private_copy(generation);
    let control = Control::open(&path);
    prepare(&control);
    (Hip::load(&path), control)
}
