//! The process-wide loader, pointed at the fake runtime with `OXCCL_HIP_LIBRARY`: the path
//! a real program takes (`RocmBackend::device_count`, `open_device`).
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use oxccl_hal::{Backend, Device, DeviceId, MemoryKind};
use oxccl_hal_rocm::{RocmBackend, LIBRARY_VAR};

#[test]
fn backend_entry_points_use_the_library_override() {
    // The only test in this process, so nothing reads the environment concurrently.
    let generation = common::newest();
    std::env::set_var(LIBRARY_VAR, common::fake_library(generation));
    assert_eq!(RocmBackend::device_count().unwrap(), 2);
    let dev = RocmBackend::open_device(DeviceId(1)).unwrap();
    assert_eq!(dev.id(), DeviceId(1));
    assert_eq!(dev.backend(), oxccl_hal::BackendKind::Rocm);
    assert_eq!(dev.capabilities().arch, "gfx942");
    let mem = dev.alloc(128, MemoryKind::Plain).unwrap();
    let handle = dev.export_memory(&mem).unwrap();
    let a = dev.import_memory(&handle).unwrap();
    let b = RocmBackend::open_device(DeviceId(0))
        .unwrap()
        .import_memory(&handle)
        .unwrap();
    assert_eq!(oxccl_hal::Memory::ptr(&a), oxccl_hal::Memory::ptr(&b));
    assert_eq!(dev.hip().ipc_cache().live(), 1);
    assert!(dev
        .hip()
        .path()
        .ends_with(&format!("libfakehip-v{generation}.so")));
    assert_eq!(dev.hip().abi().major, generation as i32);
}
