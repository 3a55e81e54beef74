//! The ROCm backend driven from the HAL traits down to the HIP symbols of a fake runtime
//! (`tests/fake_hip/fake_hip.c`), loaded through the same loader as libamdhip64. Every test
//! runs against the fake of each HIP ABI generation (5.x, 6.x, 7.x) whose headers are
//! present (all three on CI).
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod common;

use common::{key, open, Fake};
use oxccl_hal::{
    Device, DeviceId, Error, Event, IpcHandleKind, LaunchConfig, Memory, MemoryKind, Module,
    ModuleImage, MulticastSupport, Stream,
};
use oxccl_hal_rocm::{RocmBackend, RocmDevice};

for_each_generation!(
    device_count_and_capabilities_come_from_attributes,
    no_device_is_zero_devices,
    errors_carry_call_code_name_and_message,
    zero_size_is_rejected_before_any_call,
    memory_kinds_free_on_drop,
    ipc_import_twice_opens_once_and_closes_after_last_user,
    ipc_open_failure_is_a_backend_error_naming_the_call,
    ipc_cache_limit_is_an_error_and_frees_up,
    foreign_handles_are_refused,
    physical_memory_exports_a_descriptor_and_imports_through_fd_share,
    streams_copy_fill_and_time,
    kernels_launch_with_the_argument_block_in_extra,
    multicast_is_unsupported_whatever_the_gate_says,
    the_runtime_version_picks_the_generation,
    the_generation_decides_the_values_passed,
    a_failing_version_query_is_a_backend_error
);

fn device_count_and_capabilities_come_from_attributes(g: u32) {
    let fake = Fake::new(g);
    assert_eq!(fake.hip.device_count().unwrap(), 2);
    let dev = open(&fake, 1);
    let caps = dev.capabilities();
    assert_eq!(caps.backend, Some(oxccl_hal::BackendKind::Rocm));
    assert_eq!(caps.name, "Fake AMD Instinct MI300X");
    assert_eq!(caps.arch, "gfx942");
    assert_eq!(caps.multiprocessors, 304);
    assert_eq!(caps.total_memory, 192 << 30);
    assert!(caps.vmm && caps.posix_fd_handles && caps.legacy_ipc && caps.fine_grained_memory);
    assert_eq!(caps.allocation_granularity, 2 << 20);
    assert_eq!(caps.multicast, MulticastSupport::None);
    assert_eq!(dev.peers(), &[DeviceId(0)]);
    assert!(fake.calls("hipDeviceGetAttribute") >= 5);
    assert!(fake.calls("hipSetDevice") >= 1);

    // Another device generation: no VMM, no fine-grained memory, gfx90a-like.
    let fake = Fake::new(g);
    fake.set_device_count(1);
    fake.set_attribute("VirtualMemoryManagementSupported", 0);
    fake.set_attribute("FineGrainSupport", 0);
    fake.set_attribute("ComputeCapabilityMinor", 0);
    fake.set_attribute("MultiprocessorCount", 104);
    let dev = open(&fake, 0);
    let caps = dev.capabilities();
    assert!(!caps.vmm && !caps.posix_fd_handles && !caps.fine_grained_memory);
    assert_eq!(caps.allocation_granularity, 0);
    assert_eq!(caps.multiprocessors, 104);
    assert!(caps.arch.starts_with("gfx90"), "{}", caps.arch);
    assert!(dev.peers().is_empty());
    let err = dev.alloc(4096, MemoryKind::Physical).unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(ref m) if m.contains("virtual memory")),
        "{err}"
    );
    assert!(matches!(
        dev.enable_peer_access(DeviceId(1)),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        RocmDevice::open_on(&fake.hip, DeviceId(1)),
        Err(Error::InvalidArgument(_))
    ));
}

fn no_device_is_zero_devices(g: u32) {
    let fake = Fake::new(g);
    fake.set_device_count(0);
    assert_eq!(fake.hip.device_count().unwrap(), 0);
}

fn errors_carry_call_code_name_and_message(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    fake.fail("hipMalloc", "hipErrorOutOfMemory", 1);
    let err = dev.alloc(64, MemoryKind::Plain).unwrap_err();
    match &err {
        Error::Backend {
            backend,
            call,
            code,
            name,
            message,
        } => {
            assert_eq!(*backend, oxccl_hal::BackendKind::Rocm);
            assert_eq!(*call, "hipMalloc");
            assert_eq!(*code, 2);
            assert_eq!(name, "hipErrorOutOfMemory");
            assert_eq!(message, "fake: out of memory");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "ROCm call hipMalloc failed with hipErrorOutOfMemory (2): fake: out of memory"
    );
    // The failure was one-shot.
    dev.alloc(64, MemoryKind::Plain).unwrap();
}

fn zero_size_is_rejected_before_any_call(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    for kind in [
        MemoryKind::Plain,
        MemoryKind::Coherent,
        MemoryKind::Physical,
    ] {
        assert!(matches!(dev.alloc(0, kind), Err(Error::InvalidArgument(_))));
    }
    assert!(matches!(dev.alloc_host(0), Err(Error::InvalidArgument(_))));
    for call in [
        "hipMalloc",
        "hipExtMallocWithFlags",
        "hipMemCreate",
        "hipHostMalloc",
    ] {
        assert_eq!(fake.calls(call), 0, "{call}");
    }
}

fn memory_kinds_free_on_drop(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    {
        let plain = dev.alloc(100, MemoryKind::Plain).unwrap();
        let coherent = dev.alloc(100, MemoryKind::Coherent).unwrap();
        let physical = dev.alloc(1000, MemoryKind::Physical).unwrap();
        let host = dev.alloc_host(256).unwrap();
        assert_eq!(physical.len(), 1000);
        assert!(!plain.ptr().is_null() && !coherent.ptr().is_null() && !physical.ptr().is_null());
        assert_eq!(
            oxccl_hal::HostVisible::host_ptr(&host) as u64,
            host.ptr().0,
            "the fake maps host memory at its own address"
        );
        assert_eq!(fake.calls("hipExtMallocWithFlags"), 1);
        assert_eq!(fake.calls("hipMemSetAccess"), 1);
        assert_eq!(fake.live_allocs(), 4);
    }
    assert_eq!(fake.live_allocs(), 0);
    assert_eq!(fake.calls("hipMemUnmap"), 1);
    assert_eq!(fake.calls("hipMemAddressFree"), 1);
    assert_eq!(fake.calls("hipMemRelease"), 1);
}

fn ipc_import_twice_opens_once_and_closes_after_last_user(g: u32) {
    let fake = Fake::new(g);
    let dev0 = open(&fake, 0);
    let dev1 = open(&fake, 1);
    let mem = dev0.alloc(4096, MemoryKind::Plain).unwrap();
    let handle = dev0.export_memory(&mem).unwrap();
    assert_eq!(handle.kind, IpcHandleKind::RocmLegacy);
    assert_eq!(handle.payload.len(), 64);
    assert_eq!(handle.len, 4096);
    // Through the wire format, as a peer would receive it.
    let handle = oxccl_hal::IpcHandle::from_bytes(&handle.to_bytes()).unwrap();
    let k = key(&handle.payload);

    let a = dev1.import_memory(&handle).unwrap();
    let b = dev1.import_memory(&handle).unwrap();
    // A second device of the same process shares the runtime-wide cache.
    let c = dev0.import_memory(&handle).unwrap();
    let d = c.clone();
    assert_eq!(a.ptr(), b.ptr());
    assert_eq!(a.ptr(), d.ptr());
    assert_eq!(a.len(), 4096);
    assert_eq!(fake.ipc_opens(k), 1);
    assert_eq!(fake.hip.ipc_cache().live(), 1);
    drop(a);
    drop(c);
    drop(b);
    assert_eq!(fake.ipc_closes(k), 0);
    drop(d);
    assert_eq!(fake.ipc_closes(k), 1);
    assert_eq!(fake.hip.ipc_cache().live(), 0);
    // Reopening after the close is a fresh open.
    let e = dev1.import_memory(&handle).unwrap();
    assert_eq!(fake.ipc_opens(k), 2);
    drop(e);
    assert_eq!(fake.ipc_closes(k), 2);
}

fn ipc_open_failure_is_a_backend_error_naming_the_call(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let mem = dev.alloc(64, MemoryKind::Coherent).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    fake.fail("hipIpcOpenMemHandle", "hipErrorInvalidHandle", 1);
    let err = dev.import_memory(&handle).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                call: "hipIpcOpenMemHandle",
                code: 400,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(fake.hip.ipc_cache().live(), 0);
    assert_eq!(fake.calls("hipIpcCloseMemHandle"), 0);
    let ok = dev.import_memory(&handle).unwrap();
    assert_eq!(fake.ipc_opens(key(&handle.payload)), 1);
    drop(ok);
    assert_eq!(fake.ipc_closes(key(&handle.payload)), 1);
}

fn ipc_cache_limit_is_an_error_and_frees_up(g: u32) {
    let fake = Fake::with_import_limit(g, 2);
    let dev = open(&fake, 0);
    let mems: Vec<_> = (0..3)
        .map(|_| dev.alloc(64, MemoryKind::Plain).unwrap())
        .collect();
    let handles: Vec<_> = mems.iter().map(|m| dev.export_memory(m).unwrap()).collect();
    let a = dev.import_memory(&handles[0]).unwrap();
    let b = dev.import_memory(&handles[1]).unwrap();
    let err = dev.import_memory(&handles[2]).unwrap_err();
    assert!(
        matches!(err, Error::IpcCacheFull { live: 2, limit: 2 }),
        "{err}"
    );
    assert_eq!(fake.ipc_opens(key(&handles[2].payload)), 0);
    // A handle that is open is still served.
    let a2 = dev.import_memory(&handles[0]).unwrap();
    drop(a);
    drop(a2);
    let c = dev.import_memory(&handles[2]).unwrap();
    assert_eq!(fake.hip.ipc_cache().live(), 2);
    drop((b, c));
}

fn foreign_handles_are_refused(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let mem = dev.alloc(64, MemoryKind::Plain).unwrap();
    let mut handle = dev.export_memory(&mem).unwrap();
    handle.backend = oxccl_hal::BackendKind::Cuda;
    assert!(matches!(dev.import_memory(&handle), Err(Error::Ipc(_))));
    handle.backend = oxccl_hal::BackendKind::Rocm;
    handle.kind = IpcHandleKind::HostMemfd;
    assert!(matches!(dev.import_memory(&handle), Err(Error::Ipc(_))));
    assert_eq!(fake.calls("hipIpcOpenMemHandle"), 0);
}

fn physical_memory_exports_a_descriptor_and_imports_through_fd_share(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let mem = dev.alloc(1000, MemoryKind::Physical).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    assert_eq!(handle.kind, IpcHandleKind::RocmPosixFd);
    assert_eq!(handle.len, 1000);
    assert_eq!(handle.payload, (2u64 << 20).to_le_bytes().to_vec());
    let a = dev.import_memory(&handle).unwrap();
    let b = dev.import_memory(&handle).unwrap();
    assert_eq!(a.ptr(), b.ptr());
    assert_eq!(fake.calls("hipMemImportFromShareableHandle"), 1);
    drop((a, b));
    // Owner mapping + imported mapping were each set up and, for the import, torn down.
    assert_eq!(fake.calls("hipMemMap"), 2);
    assert_eq!(fake.calls("hipMemUnmap"), 1);
}

fn streams_copy_fill_and_time(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let s = dev.create_stream().unwrap();
    let a = dev.alloc(16, MemoryKind::Plain).unwrap();
    let b = dev.alloc(16, MemoryKind::Plain).unwrap();
    let data: Vec<u8> = (1..=16).collect();
    s.write(a.ptr(), &data).unwrap();
    // SAFETY: both are live 16-byte allocations.
    unsafe { s.copy(b.ptr(), a.ptr(), 16) }.unwrap();
    let mut back = [0u8; 16];
    s.read(b.ptr(), &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
    // SAFETY: live allocation of 16 bytes.
    unsafe { s.fill(b.ptr().offset(8).unwrap(), 0xab, 8) }.unwrap();
    s.read(b.ptr(), &mut back).unwrap();
    assert_eq!(&back[8..], &[0xab; 8]);
    assert!(!s.is_capturing().unwrap());
    fake.set_capturing(s.as_raw().cast(), true);
    assert!(s.is_capturing().unwrap());
    fake.set_capturing(s.as_raw().cast(), false);

    let start = dev.create_event().unwrap();
    let stop = dev.create_event().unwrap();
    s.record(&start).unwrap();
    s.record(&stop).unwrap();
    stop.synchronize().unwrap();
    assert_eq!(stop.elapsed_ms_since(&start).unwrap(), 1.5);
    s.wait_event(&stop).unwrap();
    s.synchronize().unwrap();
    dev.synchronize().unwrap();
}

fn kernels_launch_with_the_argument_block_in_extra(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let image = b"\x7fELF\0\0oxccl_allreduce.kd\0oxccl_allreduce\0oxccl_signal.kd\0".to_vec();
    let module = dev.load_module(&ModuleImage::Rocm(&image)).unwrap();
    let k = module.kernel("oxccl_allreduce").unwrap();
    assert_eq!(k.name(), "oxccl_allreduce");
    let err = module.kernel("nope").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("oxccl_allreduce, oxccl_signal"), "{text}");

    let s = dev.create_stream().unwrap();
    let args: Vec<u8> = (0..40).collect();
    // SAFETY: the fake kernel does nothing with the block.
    unsafe { s.launch(&k, &LaunchConfig::linear(7, 256), &args) }.unwrap();
    assert_eq!(fake.last_launch(), (args, 7));

    assert!(matches!(
        dev.load_module(&ModuleImage::Rocm(b"garbage")),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        dev.load_module(&ModuleImage::Cuda(&image)),
        Err(Error::InvalidArgument(_))
    ));
    drop(module);
    // The kernel keeps its module loaded.
    assert_eq!(fake.calls("hipModuleUnload"), 0);
    drop(k);
    assert_eq!(fake.calls("hipModuleUnload"), 1);
}

fn multicast_is_unsupported_whatever_the_gate_says(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let err = dev.create_multicast(1 << 20, 2).unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(ref m) if m.contains("MI300X has no multicast")),
        "{err}"
    );
    let handle = oxccl_hal::IpcHandle {
        backend: oxccl_hal::BackendKind::Rocm,
        kind: IpcHandleKind::RocmPosixFd,
        owner_pid: 1,
        owner_nonce: 1,
        id: 1,
        len: 1,
        payload: vec![],
    };
    assert!(matches!(
        dev.import_multicast(&handle),
        Err(Error::Unsupported(_))
    ));
}

fn the_runtime_version_picks_the_generation(g: u32) {
    let fake = Fake::new(g);
    assert_eq!(fake.hip.version(), fake.header_version());
    assert_eq!(fake.hip.version() / 10_000_000, g as i32);
    assert_eq!(fake.hip.abi().major, g as i32);
    // Any minor and patch of the major is the same generation.
    let version = g as i32 * 10_000_000 + 99 * 100_000 + 12_345;
    let (hip, _control) = common::load_prepared(g, |c| c.set_version(version));
    let hip = hip.unwrap();
    assert_eq!(hip.version(), version);
    assert_eq!(hip.abi().major, g as i32);
}

/// The fake of generation `g` claiming another generation's version: oxccl then passes the
/// other generation's values, and the fake (which takes only its own headers' values)
/// refuses the one that differs: `hipIpcMemLazyEnablePeerAccess`, 0 in 5.x and 1 from 6.0.
/// So the values really come from the version the runtime reports.
fn the_generation_decides_the_values_passed(g: u32) {
    let other = if g == 5 { 6 } else { 5 };
    let (hip, control) = common::load_prepared(g, |c| c.set_version(other * 10_000_000 + 100_000));
    let hip = hip.unwrap();
    assert_eq!(hip.abi().major, other);
    let dev = RocmDevice::open_on(&hip, DeviceId(0)).unwrap();
    let mem = dev.alloc(64, MemoryKind::Plain).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    let err = dev.import_memory(&handle).unwrap_err();
    assert!(
        matches!(&err, Error::Backend { call: "hipIpcOpenMemHandle", code, .. }
            if *code == i64::from(control.error_code("hipErrorInvalidValue"))),
        "{err}"
    );
    drop((dev, mem, hip));

    // Its own version: the same import goes through.
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let mem = dev.alloc(64, MemoryKind::Plain).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    dev.import_memory(&handle).unwrap();
}

fn a_failing_version_query_is_a_backend_error(g: u32) {
    let (hip, _control) = common::load_prepared(g, |c| {
        c.fail("hipRuntimeGetVersion", "hipErrorNotSupported", 1)
    });
    let err = hip.unwrap_err();
    assert!(
        matches!(&err, Error::Backend { call: "hipRuntimeGetVersion", name, .. }
            if name == "hipErrorNotSupported"),
        "{err}"
    );
}

#[test]
fn runtimes_of_unsupported_majors_are_refused_naming_both_versions() {
    for (version, text) in [
        (40_500_000, "4.5.0"),
        (80_000_000, "8.0.0"),
        (80_100_003, "8.1.3"),
        (0, "0.0.0"),
    ] {
        let (hip, _control) = common::load_prepared(common::newest(), |c| c.set_version(version));
        let err = hip.unwrap_err();
        let m = err.to_string();
        assert!(matches!(err, Error::Unsupported(_)), "{m}");
        assert!(m.contains(&format!("is version {text} ")), "{m}");
        assert!(
            m.contains("supports the HIP ABI generations 5.x, 6.x, 7.x"),
            "{m}"
        );
        assert!(m.contains("HIP 5.7, 6.4, 7.2 headers"), "{m}");
    }
}

/// A library with `hipRuntimeGetVersion` and nothing else: the version is read before the
/// function table, so an unsupported major is named as such even though symbols are
/// missing, while a supported major that lacks them is no usable runtime.
#[test]
fn the_version_is_checked_before_the_symbols() {
    for (version, unsupported) in [(80_000_000, true), (60_200_000, false)] {
        let lib = common::build_c_library(
            &format!("version_only_{version}"),
            &format!("int hipRuntimeGetVersion(int *v) {{ *v = {version}; return 0; }}\n"),
        );
        let err = oxccl_hal_rocm::Hip::load(&lib).unwrap_err();
        let m = err.to_string();
        if unsupported {
            assert!(matches!(err, Error::Unsupported(_)), "{m}");
            assert!(m.contains("is version 8.0.0 "), "{m}");
        } else {
            assert!(matches!(err, Error::RuntimeMissing(_)), "{m}");
            assert!(
                m.contains("hipGetErrorName") || m.contains("undefined symbol"),
                "{m}"
            );
        }
    }
}

#[test]
fn a_library_without_hip_symbols_is_no_runtime() {
    let err = oxccl_hal_rocm::Hip::load("libc.so.6").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::RuntimeMissing(_)), "{text}");
    assert!(
        text.starts_with("no ROCm runtime found (libamdhip64 could not be loaded)"),
        "{text}"
    );
}

#[test]
fn backend_kind_is_rocm() {
    assert_eq!(
        <RocmBackend as oxccl_hal::Backend>::KIND,
        oxccl_hal::BackendKind::Rocm
    );
}
