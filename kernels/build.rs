//! Build script of oxccl-kernels.
//!
//! Always: scans `src/device/*.cu` for kernel names, generates the Rust view of
//! `include/oxccl/abi.h` with bindgen, and compiles `src/abi_check.c` with the host C
//! compiler (through `cc`) so the C side's static asserts run and Rust tests can compare
//! the C compiler's sizes with Rust's.
//!
//! Feature `cuda`: nvcc compiles all device sources (one translation unit) into one fatbin
//! with SASS for sm_90 plus `OXCCL_CUDA_ARCHS`; no PTX, so nothing depends on the JIT.
//! Feature `rocm`: clang compiles the same sources as HIP into a gfx942 code object (plus
//! `OXCCL_ROCM_ARCHS`; several architectures are packed into one offload bundle).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

type BuildResult<T> = Result<T, String>;

const NVCC_MISSING: &str = "nvcc not found: install the CUDA toolkit or `pip install \
nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl` and set NVCC=... \
(ci/toolchains/cuda.sh does this and writes .toolchains/cuda/env.sh to source)";

const HIP_MISSING: &str = "no HIP toolchain found for feature `rocm`: install ROCm (ROCM_PATH, \
default /opt/rocm), or run ci/toolchains/hip.sh and source .toolchains/hip/env.sh (sets \
OXCCL_HIP_TOOLCHAIN, HIP_CLANG, HIP_PATH, ROCM_DEVICE_LIB_PATH)";

fn main() {
    if let Err(message) = run() {
        eprintln!("\nerror: oxccl-kernels build: {message}\n");
        std::process::exit(1);
    }
}

fn run() -> BuildResult<()> {
    let manifest = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(env_var("OUT_DIR")?);
    let include = manifest.join("include");
    let device_dir = manifest.join("src").join("device");

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed={}", device_dir.display());
    println!("cargo:rerun-if-changed=src/abi_check.c");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "OXCCL_CUDA_ARCHS",
        "ROCM_PATH",
        "OXCCL_HIP_TOOLCHAIN",
        "OXCCL_ROCM_ARCHS",
        "HIP_CLANG",
        "HIP_PATH",
        "ROCM_DEVICE_LIB_PATH",
        "LIBCLANG_PATH",
        "OXCCL_KERNEL_CACHE",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let sources = device_sources(&device_dir)?;
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    let mut inputs = sources.clone();
    for h in
        fs::read_dir(include.join("oxccl")).map_err(|e| format!("reading include/oxccl: {e}"))?
    {
        let h = h.map_err(|e| e.to_string())?;
        println!("cargo:rerun-if-changed={}", h.path().display());
        inputs.push(h.path());
    }
    inputs.sort();

    write_kernel_names(&sources, &out)?;
    generate_bindings(&include, &out)?;
    cc::Build::new()
        .file(manifest.join("src").join("abi_check.c"))
        .include(&include)
        .warnings(true)
        .compile("oxccl_abi_check");

    let unity = write_unity_source(&sources, &out)?;
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let rocm = env::var_os("CARGO_FEATURE_ROCM").is_some();
    // Each compiler spends most of its minutes in one single-threaded pass over the one
    // translation unit, so with both features the two images compile side by side.
    std::thread::scope(|scope| {
        let cuda_image = cuda.then(|| scope.spawn(|| build_cuda(&unity, &include, &out, &inputs)));
        if rocm {
            build_rocm(&unity, &include, &out, &manifest, &inputs)?;
        }
        match cuda_image.map(|image| image.join()) {
            Some(Ok(built)) => built,
            Some(Err(_)) => Err("the thread compiling the CUDA image panicked".to_owned()),
            None => Ok(()),
        }
    })
}

fn env_var(name: &str) -> BuildResult<String> {
    env::var(name).map_err(|_| format!("cargo did not set {name}"))
}

/// `src/device/*.cu`, sorted so the unity source (and the images) are reproducible.
fn device_sources(dir: &Path) -> BuildResult<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(format!("no device sources in {}", dir.display()));
    }
    Ok(v)
}

/// Kernel names: every `OXCCL_GLOBAL [launch bounds] void <name>(` in the device
/// sources (the declaration starts a line).
///
/// Each declaration must take exactly one parameter (the by-value argument struct): the
/// backends launch with one parameter pointer, and the CUDA backend cannot see a second
/// parameter on drivers without `cuFuncGetParamCount` (hal-cuda's `check_params`).
fn write_kernel_names(sources: &[PathBuf], out: &Path) -> BuildResult<()> {
    let mut names = Vec::new();
    for s in sources {
        let text = fs::read_to_string(s).map_err(|e| format!("reading {}: {e}", s.display()))?;
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("OXCCL_GLOBAL ") else {
                continue;
            };
            let Some(pos) = rest.find("void ") else {
                continue;
            };
            let decl = rest[pos + 5..].trim_start();
            let name: String = decl
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() {
                continue;
            }
            let params = decl[name.len()..]
                .trim_start()
                .strip_prefix('(')
                .and_then(|p| p.split_once(')'))
                .map(|(p, _)| p.trim());
            match params {
                Some(p) if !p.is_empty() && p != "void" && !p.contains(',') => {}
                _ => {
                    return Err(format!(
                        "{}:{}: kernel {name} must declare exactly one parameter (its argument \
                         struct) on the line of OXCCL_GLOBAL",
                        s.display(),
                        n + 1
                    ))
                }
            }
            names.push(name);
        }
    }
    let mut code = String::from(
        "/// Every kernel in the device images, by the name the backends look up.\n\
         pub const KERNEL_NAMES: &[&str] = &[\n",
    );
    for n in &names {
        let _ = writeln!(code, "    {n:?},");
    }
    code.push_str("];\n");
    write(&out.join("kernel_names.rs"), code.as_bytes())
}

fn write(path: &Path, bytes: &[u8]) -> BuildResult<()> {
    fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// One translation unit that includes every device source: one image, one compiler run.
fn write_unity_source(sources: &[PathBuf], out: &Path) -> BuildResult<PathBuf> {
    let mut text = String::from("// Generated by kernels/build.rs: every device source.\n");
    for s in sources {
        let _ = writeln!(text, "#include \"{}\"", s.display());
    }
    let path = out.join("oxccl_kernels_all.cu");
    write(&path, text.as_bytes())?;
    Ok(path)
}

fn generate_bindings(include: &Path, out: &Path) -> BuildResult<()> {
    let header = include.join("oxccl").join("abi.h");
    let header = header.to_str().ok_or("non-UTF-8 path to abi.h")?.to_owned();
    // bindgen panics (rather than erroring) when libclang cannot be loaded.
    let generated = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(header)
            .allowlist_type("Oxccl.*")
            .allowlist_var("OXCCL_.*")
            .derive_debug(true)
            .derive_default(true)
            .derive_eq(true)
            .layout_tests(true)
            .generate_comments(true)
            .generate()
    })
    .map_err(|_| {
        "bindgen could not load libclang: `apt-get install libclang-dev` (Debian) or set \
         LIBCLANG_PATH to the directory holding libclang.so"
            .to_string()
    })?
    .map_err(|e| format!("bindgen failed on abi.h: {e}"))?;
    write(&out.join("abi.rs"), generated.to_string().as_bytes())
}

/// Architecture list: the default first, then the comma-separated extras, de-duplicated.
fn arch_list(default: &str, var: &str) -> Vec<String> {
    let mut archs = vec![default.to_owned()];
    if let Ok(extra) = env::var(var) {
        for a in extra.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            if !archs.iter().any(|x| x == a) {
                archs.push(a.to_owned());
            }
        }
    }
    archs
}

fn find_nvcc() -> BuildResult<PathBuf> {
    if let Some(p) = env::var_os("NVCC") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "NVCC={} does not exist. {NVCC_MISSING}",
                p.display()
            ))
        };
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let p = PathBuf::from(home).join("bin").join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    if let Some(p) = find_in_path("nvcc") {
        return Ok(p);
    }
    let p = PathBuf::from("/usr/local/cuda/bin/nvcc");
    if p.is_file() {
        return Ok(p);
    }
    Err(NVCC_MISSING.to_owned())
}

fn find_in_path(tool: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn run_tool(mut cmd: Command, what: &str) -> BuildResult<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {what} ({shown}): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status}): {shown}"))
    }
}

/// Device images take minutes to compile (ptxas dominates) and depend only on the device
/// sources, the headers, the compiler and its flags: not on the crate's other features nor
/// on the cargo profile. So images are cached by a hash of exactly those in
/// `<target dir>/oxccl-kernel-cache` (or `OXCCL_KERNEL_CACHE`; empty disables it), and the
/// `cuda`, `cuda,rocm`, test and release builds of one tree compile each image once.
fn run_cached(
    cmd: Command,
    what: &str,
    output: &Path,
    unity: &Path,
    inputs: &[PathBuf],
) -> BuildResult<()> {
    let Some(dir) = image_cache_dir() else {
        return run_tool(cmd, what);
    };
    let mut key = Fnv64::new();
    let program = PathBuf::from(cmd.get_program());
    key.write(program.as_os_str().as_encoded_bytes());
    // The compiler's size and modification time stand in for its version.
    if let Ok(meta) = fs::metadata(&program) {
        key.write(&meta.len().to_le_bytes());
        if let Ok(Ok(t)) = meta
            .modified()
            .map(|t| t.duration_since(std::time::UNIX_EPOCH))
        {
            key.write(&t.as_nanos().to_le_bytes());
        }
    }
    for arg in cmd.get_args() {
        // The unity file and the output live in each build's OUT_DIR: hash contents, not paths.
        let arg_path = Path::new(arg);
        if arg_path == output || arg_path == unity {
            key.write(b"<path>");
        } else {
            key.write(arg.as_encoded_bytes());
        }
        key.write(&[0]);
    }
    for input in std::iter::once(&unity.to_path_buf()).chain(inputs) {
        let bytes = fs::read(input).map_err(|e| format!("reading {}: {e}", input.display()))?;
        key.write(&(bytes.len() as u64).to_le_bytes());
        key.write(&bytes);
    }
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".to_owned());
    let cached = dir.join(format!("{:016x}-{name}", key.finish()));
    if cached.is_file() && fs::copy(&cached, output).is_ok() {
        return Ok(());
    }
    run_tool(cmd, what)?;
    // Store through a temporary name so a concurrent build never reads half a file; a cache
    // that cannot be written only costs the next build a compile.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    if fs::copy(output, &tmp).is_ok() && fs::rename(&tmp, &cached).is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok(())
}

fn image_cache_dir() -> Option<PathBuf> {
    let dir = match env::var_os("OXCCL_KERNEL_CACHE") {
        Some(d) if d.is_empty() => return None,
        Some(d) => PathBuf::from(d),
        None => {
            let out = PathBuf::from(env::var_os("OUT_DIR")?);
            target_dir(&out, env::var_os("TARGET").as_deref())?.join("oxccl-kernel-cache")
        }
    };
    fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// The target directory that holds `out_dir`, a build script's OUT_DIR, which cargo lays out
/// as `<target>/[<triple>/]<profile>/build/<crate>-<hash>/out` (`<triple>` with `--target`).
///
/// Read from that layout rather than found by the CACHEDIR.TAG cargo puts in the target
/// directory: cargo writes the tag only when it creates the directory, and on a fresh clone
/// ci/install.sh creates `target/python-venv` first, so no build found a cache directory and
/// each `cuda` build of CI (clippy, then test, of each feature row) ran nvcc again. The tag
/// remains the way to the target directory of any other layout.
fn target_dir(out_dir: &Path, triple: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let mut up = out_dir.ancestors().skip(2);
    if let (Some(build), Some(_profile), Some(above)) = (up.next(), up.next(), up.next()) {
        if build.file_name() == Some("build".as_ref()) {
            let target = match above.parent() {
                Some(parent) if triple.is_some() && above.file_name() == triple => parent,
                _ => above,
            };
            return Some(target.to_path_buf());
        }
    }
    out_dir
        .ancestors()
        .find(|p| p.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// FNV-1a, 64-bit: stable across Rust versions, unlike `DefaultHasher`.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn build_cuda(unity: &Path, include: &Path, out: &Path, inputs: &[PathBuf]) -> BuildResult<()> {
    let nvcc = find_nvcc()?;
    let fatbin = out.join("oxccl_kernels.fatbin");
    let mut cmd = Command::new(&nvcc);
    // ptxas is the slow step (minutes for the self-test's many reduction variants);
    // --split-compile=0 lets it optimise functions on every core.
    cmd.arg("--fatbin")
        .arg("-std=c++20")
        .arg("-O3")
        .arg("--split-compile=0")
        .arg("-I")
        .arg(include);
    for arch in arch_list("90", "OXCCL_CUDA_ARCHS") {
        let arch = arch.trim_start_matches("sm_").to_owned();
        if arch.is_empty() || !arch.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!(
                "OXCCL_CUDA_ARCHS: bad architecture {arch:?} (want e.g. 90,100)"
            ));
        }
        // SASS only: code=sm_XX and no compute_XX in `code`, so no PTX is embedded.
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{arch},code=sm_{arch}"));
    }
    cmd.arg("-o").arg(&fatbin).arg(unity);
    run_cached(cmd, "nvcc", &fatbin, unity, inputs)
}

/// The HIP compiler and the paths it needs.
struct HipToolchain {
    clang: PathBuf,
    rocm_path: Option<PathBuf>,
    hip_path: Option<PathBuf>,
    device_libs: Option<PathBuf>,
}

fn find_hip(manifest: &Path) -> BuildResult<HipToolchain> {
    // 1. A real ROCm installation.
    let rocm = env::var_os("ROCM_PATH").map_or_else(|| PathBuf::from("/opt/rocm"), PathBuf::from);
    if env::var_os("OXCCL_HIP_TOOLCHAIN").is_none() && rocm.is_dir() {
        let clang = ["llvm/bin/clang++", "lib/llvm/bin/clang++", "llvm/bin/clang"]
            .iter()
            .map(|c| rocm.join(c))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("{} has no llvm/bin/clang++. {HIP_MISSING}", rocm.display()))?;
        return Ok(HipToolchain {
            clang,
            rocm_path: Some(rocm.clone()),
            hip_path: Some(rocm),
            device_libs: None,
        });
    }
    // 2. The packaged toolchain of ci/toolchains/hip.sh (env, or the repo-local default).
    let prefix = env::var_os("OXCCL_HIP_TOOLCHAIN")
        .map(PathBuf::from)
        .or_else(|| {
            let p = manifest.parent()?.join(".toolchains").join("hip");
            p.join("env.sh").is_file().then_some(p)
        });
    let Some(prefix) = prefix else {
        return Err(HIP_MISSING.to_owned());
    };
    let clang = env::var_os("HIP_CLANG")
        .map(PathBuf::from)
        .or_else(|| find_in_path("clang-19"))
        .or_else(|| find_in_path("clang"))
        .ok_or_else(|| {
            format!("clang-19 not found (apt-get install clang-19 lld-19). {HIP_MISSING}")
        })?;
    let hip_path = env::var_os("HIP_PATH").map_or_else(|| prefix.join("hip-path"), PathBuf::from);
    let device_libs = match env::var_os("ROCM_DEVICE_LIB_PATH") {
        Some(p) => PathBuf::from(p),
        None => find_file(&prefix.join("root"), "oclc_isa_version_942.bc")
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .ok_or_else(|| {
                format!(
                    "no oclc_isa_version_942.bc under {}. {HIP_MISSING}",
                    prefix.display()
                )
            })?,
    };
    if !hip_path
        .join("include")
        .join("hip")
        .join("hip_runtime.h")
        .is_file()
    {
        return Err(format!(
            "{} has no include/hip/hip_runtime.h. {HIP_MISSING}",
            hip_path.display()
        ));
    }
    Ok(HipToolchain {
        clang,
        rocm_path: Some(hip_path.clone()),
        hip_path: Some(hip_path),
        device_libs: Some(device_libs),
    })
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.is_dir() {
            if let Some(found) = find_file(&p, name) {
                return Some(found);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

fn build_rocm(
    unity: &Path,
    include: &Path,
    out: &Path,
    manifest: &Path,
    inputs: &[PathBuf],
) -> BuildResult<()> {
    let tc = find_hip(manifest)?;
    let archs = arch_list("gfx942", "OXCCL_ROCM_ARCHS");
    let mut objects = Vec::new();
    for arch in &archs {
        if !arch.starts_with("gfx")
            || !arch
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '+' || c == '-')
        {
            return Err(format!(
                "OXCCL_ROCM_ARCHS: bad architecture {arch:?} (want e.g. gfx942,gfx950)"
            ));
        }
        let object = out.join(format!(
            "oxccl_kernels.{}.co",
            arch.replace([':', '+', '-'], "_")
        ));
        let mut cmd = Command::new(&tc.clang);
        cmd.args(["-x", "hip", "-std=c++20", "-O3"])
            .arg(format!("--offload-arch={arch}"))
            .args(["--offload-device-only", "--no-gpu-bundle-output"])
            .arg("-I")
            .arg(include);
        if let Some(p) = &tc.rocm_path {
            cmd.arg(format!("--rocm-path={}", p.display()));
        }
        if let Some(p) = &tc.hip_path {
            cmd.arg(format!("--hip-path={}", p.display()));
        }
        if let Some(p) = &tc.device_libs {
            cmd.arg(format!("--rocm-device-lib-path={}", p.display()));
        }
        cmd.arg("-o").arg(&object).arg(unity);
        run_cached(cmd, "clang (HIP)", &object, unity, inputs)?;
        let bytes = fs::read(&object).map_err(|e| format!("reading {}: {e}", object.display()))?;
        objects.push((arch.clone(), bytes));
    }
    let image = if let [(_, only)] = objects.as_slice() {
        only.clone()
    } else {
        offload_bundle(&objects)
    };
    write(&out.join("oxccl_kernels.hsaco"), &image)
}

/// Packs per-architecture code objects into a clang offload bundle, which
/// hipModuleLoadData accepts and searches for the device's architecture.
///
/// Layout: magic, entry count, then per entry (offset, size, id length, id), all integers
/// little-endian u64, then the objects (4096-aligned, as clang-offload-bundler does).
fn offload_bundle(objects: &[(String, Vec<u8>)]) -> Vec<u8> {
    const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    let ids: Vec<String> = std::iter::once("host-x86_64-unknown-linux-gnu-".to_owned())
        .chain(
            objects
                .iter()
                .map(|(arch, _)| format!("hipv4-amdgcn-amd-amdhsa--{arch}")),
        )
        .collect();
    let header_len = MAGIC.len() + 8 + ids.iter().map(|id| 24 + id.len()).sum::<usize>();
    let align = |x: usize| x.div_ceil(4096) * 4096;
    let mut offsets = Vec::new();
    let mut cursor = align(header_len);
    // The host entry is empty, as in device-only bundles.
    offsets.push((cursor, 0usize));
    for (_, obj) in objects {
        offsets.push((cursor, obj.len()));
        cursor = align(cursor + obj.len());
    }
    let mut b = Vec::with_capacity(cursor);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for (id, (off, size)) in ids.iter().zip(&offsets) {
        b.extend_from_slice(&(*off as u64).to_le_bytes());
        b.extend_from_slice(&(*size as u64).to_le_bytes());
        b.extend_from_slice(&(id.len() as u64).to_le_bytes());
        b.extend_from_slice(id.as_bytes());
    }
    for ((_, obj), (off, _)) in objects.iter().zip(offsets.iter().skip(1)) {
        b.resize(*off, 0);
        b.extend_from_slice(obj);
    }
    b
}
