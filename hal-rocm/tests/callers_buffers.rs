//! Callers' buffers on the ROCm backend (`find_allocation`, `export_allocation`,
//! `release_export`), driven against the fake HIP runtime of each HIP ABI generation whose
//! headers are present. The fake keeps a table of the memory it hands out, answers
//! `hipMemGetAddressRange` and the pointer attributes from it (each generation in its own
//! numbering), and opens a legacy IPC handle onto the very bytes of the block it names, at
//! the offset it was made from: an import in this process reads and writes the caller's
//! block. None of this has run on AMD hardware.
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod common;

use common::{key, open, Fake};
use oxccl_hal::{
    BackendKind, Device, DeviceId, DevicePtr, Error, IpcHandle, IpcHandleKind, Memory, MemoryKind,
    Stream,
};
use oxccl_hal_rocm::RocmDevice;

for_each_generation!(
    a_block_is_found_from_an_interior_pointer,
    a_range_past_its_block_is_refused_naming_both_ends,
    host_unknown_managed_and_other_devices_memory_are_refused,
    the_runtime_generation_decides_what_device_memory_is,
    a_freed_and_reallocated_block_gets_a_new_identity,
    an_export_imports_through_the_cache_onto_the_same_bytes,
    exports_are_cached_until_released,
    vmm_memory_is_not_exported,
);

/// A caller's `hipMalloc` block of `bytes` on `dev`, made outside oxccl (as PyTorch's
/// allocator makes one).
fn caller_block(fake: &Fake, dev: &RocmDevice, bytes: usize) -> u64 {
    dev.bind().unwrap();
    fake.hip.malloc(bytes).unwrap() as u64
}

fn free(fake: &Fake, p: u64) {
    // SAFETY: a live block of `caller_block`, not used afterwards.
    unsafe { fake.hip.free(p as *mut std::ffi::c_void) }.unwrap();
}

fn invalid(err: &Error, text: &str) {
    assert!(
        matches!(err, Error::InvalidArgument(m) if m.contains(text)),
        "expected an invalid argument saying '{text}', got: {err}"
    );
}

fn a_block_is_found_from_an_interior_pointer(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let base = caller_block(&fake, &dev, 4096);
    let other = caller_block(&fake, &dev, 4096);
    let inside = DevicePtr(base + 1000);
    let a = dev.find_allocation(inside, 200).unwrap();
    assert_eq!(a.base, DevicePtr(base));
    assert_eq!(a.len, 4096);
    assert_eq!(a.offset_of(inside), 1000);
    // The whole block, and its last byte, are the same allocation.
    assert_eq!(dev.find_allocation(DevicePtr(base), 4096).unwrap(), a);
    assert_eq!(dev.find_allocation(DevicePtr(base + 4095), 1).unwrap(), a);
    let b = dev.find_allocation(DevicePtr(other + 8), 16).unwrap();
    assert_eq!(b.base, DevicePtr(other));
    assert_ne!(a.id, b.id);
    // oxccl's own allocations are found alike.
    let mem = dev.alloc(300, MemoryKind::Plain).unwrap();
    let c = dev
        .find_allocation(mem.ptr().offset(10).unwrap(), 20)
        .unwrap();
    assert_eq!((c.base, c.len), (mem.ptr(), 300));
    assert!(c.id != a.id && c.id != b.id);
    assert_eq!(fake.calls("hipMemGetAddressRange"), 5);
    // Finding exports nothing.
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 0);
}

fn a_range_past_its_block_is_refused_naming_both_ends(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let base = caller_block(&fake, &dev, 4096);
    let err = dev
        .find_allocation(DevicePtr(base + 4000), 200)
        .unwrap_err();
    invalid(&err, "run past their allocation");
    let m = err.to_string();
    // The range's two ends and the block's.
    assert!(m.contains(&format!("{:#x}: 200 bytes", base + 4000)), "{m}");
    assert!(m.contains(&format!("to {:#x}", base + 4200)), "{m}");
    assert!(
        m.contains(&format!("4096 bytes from {base:#x} to {:#x}", base + 4096)),
        "{m}"
    );
    // One byte past is past.
    let err = dev.find_allocation(DevicePtr(base), 4097).unwrap_err();
    invalid(&err, "run past their allocation");
    let err = dev
        .find_allocation(DevicePtr(base), usize::MAX)
        .unwrap_err();
    invalid(&err, "overflow the address space");
}

fn host_unknown_managed_and_other_devices_memory_are_refused(g: u32) {
    let fake = Fake::new(g);
    let dev0 = open(&fake, 0);
    let dev1 = open(&fake, 1);

    let host = dev0.alloc_host(256).unwrap();
    let err = dev0.find_allocation(host.ptr(), 16).unwrap_err();
    invalid(&err, "host memory (hipHostMalloc or registered)");

    let stack = [0u8; 64];
    let err = dev0
        .find_allocation(DevicePtr(stack.as_ptr() as u64), 16)
        .unwrap_err();
    invalid(&err, "not memory the HIP runtime knows");
    let heap: Vec<u8> = (0..64).collect();
    let err = dev0
        .find_allocation(DevicePtr(heap.as_ptr() as u64), 16)
        .unwrap_err();
    invalid(&err, "not memory the HIP runtime knows");
    let gone = caller_block(&fake, &dev0, 512);
    free(&fake, gone);
    let err = dev0.find_allocation(DevicePtr(gone), 16).unwrap_err();
    invalid(&err, "not memory the HIP runtime knows");

    let on1 = caller_block(&fake, &dev1, 4096);
    let err = dev0.find_allocation(DevicePtr(on1), 16).unwrap_err();
    invalid(&err, "memory of HIP device 1, used through device 0");
    assert_eq!(
        dev1.find_allocation(DevicePtr(on1), 16).unwrap().base,
        DevicePtr(on1)
    );

    let managed = caller_block(&fake, &dev0, 4096);
    assert!(fake.set_managed(managed));
    let err = dev0.find_allocation(DevicePtr(managed), 16).unwrap_err();
    invalid(&err, "managed memory cannot be shared");

    assert_eq!(fake.calls("hipIpcGetMemHandle"), 0);
}

/// The fake of generation `g` claiming another generation's version: oxccl then reads the
/// memory type in the other generation's numbering (`hipMemoryType` was renumbered in 6.0:
/// device memory is 1 in 5.x, 2 from 6.0), so the fake's device memory is not device memory
/// to it. The numbering really comes from the version the runtime reports.
fn the_runtime_generation_decides_what_device_memory_is(g: u32) {
    let other = if g == 5 { 6 } else { 5 };
    let (hip, _control) = common::load_prepared(g, |c| c.set_version(other * 10_000_000 + 100_000));
    let hip = hip.unwrap();
    let dev = RocmDevice::open_on(&hip, DeviceId(0)).unwrap();
    dev.bind().unwrap();
    let p = hip.malloc(4096).unwrap() as u64;
    let err = dev.find_allocation(DevicePtr(p), 16).unwrap_err();
    if g == 5 {
        // 5.x's device memory (1) is 6.x's host memory.
        invalid(&err, "host memory");
    } else {
        invalid(
            &err,
            "not device memory (HIP memory type 2 in the numbering of HIP 5.x)",
        );
    }
}

fn a_freed_and_reallocated_block_gets_a_new_identity(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let p = caller_block(&fake, &dev, 4096);
    let a = dev.find_allocation(DevicePtr(p + 8), 8).unwrap();
    free(&fake, p);
    let q = caller_block(&fake, &dev, 4096);
    assert_eq!(q, p, "the fake gives a freed block's address back");
    let b = dev.find_allocation(DevicePtr(q + 8), 8).unwrap();
    assert_eq!((b.base, b.len), (a.base, a.len));
    assert_ne!(b.id, a.id);
    // The stale allocation is not exported: its address holds another block now.
    let err = dev.export_allocation(&a).unwrap_err();
    invalid(&err, "was freed");
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 0);
    dev.export_allocation(&b).unwrap();
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 1);
}

fn an_export_imports_through_the_cache_onto_the_same_bytes(g: u32) {
    let fake = Fake::new(g);
    let dev0 = open(&fake, 0);
    let dev1 = open(&fake, 1);
    let p = caller_block(&fake, &dev0, 4096);
    let s0 = dev0.create_stream().unwrap();
    // No two 16-byte windows alike: a mapping at the wrong offset cannot pass.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 256) as u8).collect();
    s0.write(DevicePtr(p), &data).unwrap();

    // Found through a pointer inside the block; exported from the block's base.
    let inside = DevicePtr(p + 1000);
    let found = dev0.find_allocation(inside, 100).unwrap();
    let handle = dev0.export_allocation(&found).unwrap();
    assert_eq!(handle.backend, BackendKind::Rocm);
    assert_eq!(handle.kind, IpcHandleKind::RocmLegacy);
    assert_eq!(handle.len, 4096);
    assert_eq!(handle.payload.len(), 64);
    assert_eq!(handle.owner_pid, std::process::id());
    // Through the wire format, as a peer receives it.
    let handle = IpcHandle::from_bytes(&handle.to_bytes()).unwrap();

    let a = dev1.import_memory(&handle).unwrap();
    let b = dev1.import_memory(&handle).unwrap();
    assert_eq!(a.ptr(), b.ptr());
    assert_eq!(a.len(), 4096);
    let k = key(&handle.payload);
    assert_eq!(fake.ipc_opens(k), 1, "the second import is the cache's");
    assert_eq!(fake.hip.ipc_cache().live(), 1);

    // The import is the whole block from its base: the buffer sits at the offset found.
    let s1 = dev1.create_stream().unwrap();
    let mut back = vec![0u8; 4096];
    s1.read(a.ptr(), &mut back).unwrap();
    assert!(
        back == data,
        "the import does not map the block from its base"
    );
    let mut window = vec![0u8; 100];
    let at = a.ptr().offset(found.offset_of(inside) as usize).unwrap();
    s1.read(at, &mut window).unwrap();
    assert_eq!(window, &data[1000..1100]);
    // What a peer writes through it lands in the caller's block.
    s1.write(a.ptr().offset(4000).unwrap(), &[0xee; 8]).unwrap();
    let mut mine = [0u8; 8];
    s0.read(DevicePtr(p + 4000), &mut mine).unwrap();
    assert_eq!(mine, [0xee; 8]);

    drop(a);
    assert_eq!(fake.ipc_closes(k), 0);
    drop(b);
    assert_eq!(fake.ipc_closes(k), 1);
    assert_eq!(fake.hip.ipc_cache().live(), 0);
}

fn exports_are_cached_until_released(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let p = caller_block(&fake, &dev, 8192);
    let q = caller_block(&fake, &dev, 8192);
    let a = dev.find_allocation(DevicePtr(p + 64), 64).unwrap();
    let first = dev.export_allocation(&a).unwrap();
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 1);
    // Found again through another pointer: the same allocation, the same handle, no call.
    let again = dev.find_allocation(DevicePtr(p + 4096), 64).unwrap();
    assert_eq!(again, a);
    assert!(dev.export_allocation(&again).unwrap() == first);
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 1);
    // Another block is another export.
    let other = dev
        .export_allocation(&dev.find_allocation(DevicePtr(q), 64).unwrap())
        .unwrap();
    assert!(other.id != first.id && key(&other.payload) != key(&first.payload));
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 2);
    // Released: the next export is a new handle.
    dev.release_export(&a);
    let fresh = dev.export_allocation(&a).unwrap();
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 3);
    assert!(fresh.id != first.id && key(&fresh.payload) != key(&first.payload));
    // Releasing one allocation leaves the other's export cached.
    let other_again = dev
        .export_allocation(&dev.find_allocation(DevicePtr(q), 64).unwrap())
        .unwrap();
    assert!(other_again == other);
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 3);
    // Each device keeps its own exports.
    let dev_b = open(&fake, 0);
    dev_b.export_allocation(&a).unwrap();
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 4);
}

/// VMM memory (here oxccl's own `MemoryKind::Physical`, mapped with `hipMemMap`) is found
/// as the mapping the runtime answers for, but not exported: the fake's
/// `hipIpcGetMemHandle` refuses it, which the backend reports as unsupported, naming VMM.
fn vmm_memory_is_not_exported(g: u32) {
    let fake = Fake::new(g);
    let dev = open(&fake, 0);
    let mem = dev.alloc(1000, MemoryKind::Physical).unwrap();
    let found = dev.find_allocation(mem.ptr(), 1000).unwrap();
    assert_eq!(found.base, mem.ptr());
    assert_eq!(
        found.len,
        2 << 20,
        "the mapping, rounded to the granularity"
    );
    let err = dev.export_allocation(&found).unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported(m)
            if m.contains("hipMalloc blocks only") && m.contains("VMM memory")
                && m.contains("hipIpcGetMemHandle")),
        "{err}"
    );
    // Nothing was cached: asking again asks the runtime again.
    assert!(dev.export_allocation(&found).is_err());
    assert_eq!(fake.calls("hipIpcGetMemHandle"), 2);
    // Another failure of the call is not dressed up as unsupported.
    let p = caller_block(&fake, &dev, 4096);
    let block = dev.find_allocation(DevicePtr(p), 16).unwrap();
    fake.fail("hipIpcGetMemHandle", "hipErrorOutOfMemory", 1);
    let err = dev.export_allocation(&block).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                call: "hipIpcGetMemHandle",
                ..
            }
        ),
        "{err}"
    );
    dev.export_allocation(&block).unwrap();
}
