//! The ROCm backend driven from the HAL traits down to the HIP symbols of a fake runtime
//! (`tests/fake_hip/fake_hip.c`), loaded through the same loader as libamdhip64.
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Fake;
use oxccl_hal::{
    Device, DeviceId, Error, Event, IpcHandleKind, LaunchConfig, Memory, MemoryKind, Module,
    ModuleImage, MulticastSupport, Stream,
};
use oxccl_hal_rocm::sys::{hipDeviceAttribute_t as A, hipError_t as E};
use oxccl_hal_rocm::{RocmBackend, RocmDevice};

fn open(fake: &Fake, id: u32) -> RocmDevice {
    RocmDevice::open_on(&fake.hip, DeviceId(id)).unwrap()
}

/// The fake's key of a legacy handle: its first 8 bytes.
fn key(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[..8].try_into().unwrap())
}

#[test]
fn device_count_and_capabilities_come_from_attributes() {
    let fake = Fake::new();
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
    let fake = Fake::new();
    fake.set_device_count(1);
    fake.set_attribute(A::hipDeviceAttributeVirtualMemoryManagementSupported.0, 0);
    fake.set_attribute(A::hipDeviceAttributeFineGrainSupport.0, 0);
    fake.set_attribute(A::hipDeviceAttributeComputeCapabilityMinor.0, 0);
    fake.set_attribute(A::hipDeviceAttributeMultiprocessorCount.0, 104);
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

#[test]
fn no_device_is_zero_devices() {
    let fake = Fake::new();
    fake.set_device_count(0);
    assert_eq!(fake.hip.device_count().unwrap(), 0);
}

#[test]
fn errors_carry_call_code_name_and_message() {
    let fake = Fake::new();
    let dev = open(&fake, 0);
    fake.fail("hipMalloc", E::hipErrorOutOfMemory.0, 1);
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

#[test]
fn zero_size_is_rejected_before_any_call() {
    let fake = Fake::new();
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

#[test]
fn memory_kinds_free_on_drop() {
    let fake = Fake::new();
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

#[test]
fn ipc_import_twice_opens_once_and_closes_after_last_user() {
    let fake = Fake::new();
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

#[test]
fn ipc_open_failure_is_a_backend_error_naming_the_call() {
    let fake = Fake::new();
    let dev = open(&fake, 0);
    let mem = dev.alloc(64, MemoryKind::Coherent).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    fake.fail("hipIpcOpenMemHandle", E::hipErrorInvalidHandle.0, 1);
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

#[test]
fn ipc_cache_limit_is_an_error_and_frees_up() {
    let fake = Fake::with_import_limit(2);
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

#[test]
fn foreign_handles_are_refused() {
    let fake = Fake::new();
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

#[test]
fn physical_memory_exports_a_descriptor_and_imports_through_fd_share() {
    let fake = Fake::new();
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

#[test]
fn streams_copy_fill_and_time() {
    let fake = Fake::new();
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

#[test]
fn kernels_launch_with_the_argument_block_in_extra() {
    let fake = Fake::new();
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

#[test]
fn multicast_is_unsupported_whatever_the_gate_says() {
    let fake = Fake::new();
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

#[test]
fn a_runtime_of_another_major_version_is_refused() {
    // HIP_VERSION of 6.2 against the 5.x (or 7.x) headers: a different major either way.
    let other = if oxccl_hal_rocm::sys::HIP_VERSION_MAJOR == 6 {
        50_700_000
    } else {
        60_200_000
    };
    let err = common::load_with_version(other).unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(ref m) if m.contains("rebuild")),
        "{err}"
    );
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
