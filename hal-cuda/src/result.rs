//! The `result` layer: each driver call used by this crate, returning [`Result`] with the
//! call's name, the driver's code, its name and its description.
//!
//! Functions that only take plain values are safe; those that take driver handles are
//! `unsafe fn` whose "Valid usage" is that the handles are live and owned by the caller.
//! Every function here but [`init`] assumes the driver was initialized
//! ([`crate::loader::init`]) and, where the call acts on "the current context", that the
//! caller bound it.

use std::ffi::{c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use cudarc::driver::sys;
use oxccl_hal::{BackendKind, Error, Result};

use crate::loader;

/// An [`Error::Backend`] for `call` failing with `code`.
///
/// The name and description come from `cuGetErrorName` / `cuGetErrorString` when the driver
/// is loaded, else from the code's symbolic name.
pub(crate) fn error(call: &'static str, code: sys::CUresult) -> Error {
    backend_error(call, code, loader::driver_loaded())
}

/// [`error`], told whether the driver can be asked to describe `code` (cudarc panics on a
/// call into a library it could not load).
fn backend_error(call: &'static str, code: sys::CUresult, driver_loaded: bool) -> Error {
    let (name, message) = describe(code, driver_loaded);
    Error::Backend {
        backend: BackendKind::Cuda,
        call,
        code: i64::from(code as u32),
        name,
        message,
    }
}

fn describe(code: sys::CUresult, driver_loaded: bool) -> (String, String) {
    let fallback_name = format!("{code:?}");
    if !driver_loaded {
        return (
            fallback_name,
            "(no description: the CUDA driver is not loaded)".into(),
        );
    }
    let lookup = |f: unsafe fn(sys::CUresult, *mut *const std::ffi::c_char) -> sys::CUresult| {
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: both lookups only write a pointer to a static string (or fail).
        let rc = unsafe { f(code, &mut text) };
        if rc != sys::CUresult::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: the driver returned a NUL-terminated string with static lifetime.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    let name = lookup(sys::cuGetErrorName).unwrap_or(fallback_name);
    let message = lookup(sys::cuGetErrorString).unwrap_or_else(|| "(no description)".into());
    (name, message)
}

/// `Ok(())` for `CUDA_SUCCESS`, else the mapped error.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, code))
    }
}

/// Whether `err` is a CUDA error with `code`.
pub(crate) fn is_code(err: &Error, code: sys::CUresult) -> bool {
    matches!(err, Error::Backend { backend: BackendKind::Cuda, code: c, .. }
        if *c == i64::from(code as u32))
}

fn c_int(value: usize, what: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::InvalidArgument(format!("{what} {value} exceeds i32")))
}

// ---------------------------------------------------------------- devices and contexts

/// `cuInit(0)`, the first driver call; only [`crate::loader`] makes it.
///
/// cudarc resolves `libcuda` on this call and panics when it cannot; the loader runs it
/// under `catch_unwind`.
pub(crate) fn init() -> Result<()> {
    // SAFETY: cuInit has no preconditions; 0 is its only valid flags value.
    let code = unsafe { sys::cuInit(0) };
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    // cuInit returned, so the library is loaded and can describe its code, although the
    // loader does not count it as loaded until it has recorded this outcome.
    Err(backend_error("cuInit", code, true))
}

pub(crate) fn device_count() -> Result<u32> {
    let mut n = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(u32::try_from(n).unwrap_or(0))
}

pub(crate) fn device_get(ordinal: u32) -> Result<sys::CUdevice> {
    let ordinal = c_int(ordinal as usize, "device ordinal")?;
    let mut dev = 0;
    // SAFETY: writes one device handle.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    Ok(dev)
}

/// The driver's CUDA version as `1000 * major + 10 * minor` (13.0: 13000).
pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

pub(crate) fn device_attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int; an invalid device is reported as an error.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

pub(crate) fn device_name(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes including the terminator.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev)
    })?;
    // SAFETY: the buffer is NUL-terminated (the driver terminates within `len`, and the last
    // byte was zero-initialized).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

pub(crate) fn device_total_mem(dev: sys::CUdevice) -> Result<u64> {
    let mut bytes = 0usize;
    // SAFETY: writes one size_t.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut bytes, dev)
    })?;
    Ok(bytes as u64)
}

pub(crate) fn device_can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: writes one int.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, dev, peer)
    })?;
    Ok(can != 0)
}

/// Whether `dev` and `peer` support native atomics on each other's memory (NVLink).
pub(crate) fn device_p2p_native_atomics(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut value = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetP2PAttribute", unsafe {
        sys::cuDeviceGetP2PAttribute(
            &mut value,
            sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
            dev,
            peer,
        )
    })?;
    Ok(value != 0)
}

pub(crate) fn primary_ctx_retain(dev: sys::CUdevice) -> Result<sys::CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one context handle; balanced by `primary_ctx_release`.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    Ok(ctx)
}

pub(crate) fn primary_ctx_release(dev: sys::CUdevice) -> Result<()> {
    // SAFETY: called once per successful retain of the same device.
    check("cuDevicePrimaryCtxRelease", unsafe {
        sys::cuDevicePrimaryCtxRelease_v2(dev)
    })
}

pub(crate) fn ctx_get_current() -> Result<sys::CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one context handle (null when none is current).
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// # Safety
/// `ctx` must be a live context (a retained primary context).
pub(crate) unsafe fn ctx_set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller guarantees `ctx` is live.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

pub(crate) fn ctx_synchronize() -> Result<()> {
    // SAFETY: acts on the current context, bound by the caller.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// # Safety
/// `peer` must be a live context of another device.
pub(crate) unsafe fn ctx_enable_peer_access(peer: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller guarantees `peer` is live.
    check("cuCtxEnablePeerAccess", unsafe {
        sys::cuCtxEnablePeerAccess(peer, 0)
    })
}

/// The device of the current context; `None` when no context is current.
pub(crate) fn ctx_get_device() -> Result<Option<sys::CUdevice>> {
    if ctx_get_current()?.is_null() {
        return Ok(None);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device ordinal of the current context (checked non-null above).
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    Ok(Some(dev))
}

// ---------------------------------------------------------------- plain and host memory

pub(crate) fn mem_alloc(bytes: usize) -> Result<sys::CUdeviceptr> {
    let mut p = 0;
    // SAFETY: writes one device pointer.
    check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
    Ok(p)
}

/// # Safety
/// `ptr` must come from `mem_alloc` and not have been freed.
pub(crate) unsafe fn mem_free(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller guarantees `ptr` is a live cuMemAlloc allocation.
    check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
}

pub(crate) fn mem_host_alloc(bytes: usize) -> Result<*mut c_void> {
    let mut p = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: writes one host pointer.
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(&mut p, bytes, flags)
    })?;
    Ok(p)
}

/// # Safety
/// `p` must come from `mem_host_alloc` and not have been freed.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<()> {
    // SAFETY: the caller guarantees `p` is a live cuMemHostAlloc allocation.
    check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p) })
}

/// # Safety
/// `p` must be live mapped pinned host memory.
pub(crate) unsafe fn mem_host_device_pointer(p: *mut c_void) -> Result<sys::CUdeviceptr> {
    let mut d = 0;
    // SAFETY: the caller guarantees `p` is live mapped host memory.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
    })?;
    Ok(d)
}

// ---------------------------------------------------------------- legacy IPC

/// # Safety
/// `ptr` must be a live cuMemAlloc allocation.
pub(crate) unsafe fn ipc_get_mem_handle(ptr: sys::CUdeviceptr) -> Result<[u8; 64]> {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: the caller guarantees `ptr` is live; the driver writes the 64-byte handle.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, ptr)
    })?;
    Ok(h.reserved.map(|c| c as u8))
}

pub(crate) fn ipc_open_mem_handle(bytes: &[u8; 64]) -> Result<sys::CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: bytes.map(|b| b as std::ffi::c_char),
    };
    let mut p = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: the handle is plain bytes; the driver validates it and reports bad ones.
    check("cuIpcOpenMemHandle", unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut p, h, flags)
    })?;
    Ok(p)
}

/// # Safety
/// `ptr` must come from `ipc_open_mem_handle` and not have been closed.
pub(crate) unsafe fn ipc_close_mem_handle(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller guarantees `ptr` is an open IPC mapping.
    check("cuIpcCloseMemHandle", unsafe {
        sys::cuIpcCloseMemHandle(ptr)
    })
}

// ---------------------------------------------------------------- pointer queries

/// One pointer attribute of `ptr`, read as a value of type `T` (the attribute's C type:
/// `u32` for enums, `i32` for ordinals and flags, `u64` for ids and handle-type masks).
/// An address the driver does not know is an error (`CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn pointer_attribute<T: Copy + Default>(
    attr: sys::CUpointer_attribute,
    ptr: sys::CUdeviceptr,
) -> Result<T> {
    let mut value = T::default();
    // SAFETY: the driver writes one value of the attribute's type, which the caller names
    // as `T`; `ptr` is only looked up, never accessed.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute((&mut value as *mut T).cast(), attr, ptr)
    })?;
    Ok(value)
}

/// What the driver knows of one address, from one `cuPointerGetAttributes` call (a
/// caller's buffer is looked up on every zero-copy call: one driver call instead of five).
/// An address the driver does not know reads as memory type 0, not as an error.
///
/// The range comes from [`mem_get_address_range`], not from the RANGE_START_ADDR /
/// RANGE_SIZE attributes: for VMM memory those give the whole reservation (2 H200s,
/// 2026-11-28: three 2 MiB chunks mapped side by side read as one 6 MiB range with the
/// first chunk's buffer id), where the range query gives the one mapping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PointerFacts {
    /// `CUmemorytype` (0: not memory the driver knows).
    pub(crate) memory_type: u32,
    pub(crate) managed: bool,
    pub(crate) device_ordinal: i32,
    /// Unique per allocation in the process.
    pub(crate) buffer_id: u64,
    /// A `cuMemAlloc` block (legacy IPC works); VMM mappings are not.
    pub(crate) legacy_ipc: bool,
}

pub(crate) fn pointer_facts(ptr: sys::CUdeviceptr) -> Result<PointerFacts> {
    use sys::CUpointer_attribute as A;
    let (mut memory_type, mut managed, mut ordinal) = (0u32, 0i32, 0i32);
    let (mut buffer_id, mut legacy) = (0u64, 0i32);
    // Booleans are written as one byte into zeroed 4-byte slots, as cuPointerGetAttribute
    // callers read them.
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    ];
    let mut data: [*mut c_void; 5] = [
        (&mut memory_type as *mut u32).cast(),
        (&mut managed as *mut i32).cast(),
        (&mut ordinal as *mut i32).cast(),
        (&mut buffer_id as *mut u64).cast(),
        (&mut legacy as *mut i32).cast(),
    ];
    // SAFETY: each data pointer names a live local of the attribute's C type (or a wider
    // zeroed one for booleans); `ptr` is only looked up, never accessed.
    check("cuPointerGetAttributes", unsafe {
        sys::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr,
        )
    })?;
    Ok(PointerFacts {
        memory_type,
        managed: managed != 0,
        device_ordinal: ordinal,
        buffer_id,
        legacy_ipc: legacy != 0,
    })
}

/// Base and size of the allocation (or VMM mapping) holding `ptr`.
pub(crate) fn mem_get_address_range(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize)> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: the driver writes two values; `ptr` is only looked up.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size))
}

/// The VMM allocation handle mapped at `ptr`, retained: the caller releases it with
/// [`mem_release`].
pub(crate) fn mem_retain_allocation_handle(
    ptr: sys::CUdeviceptr,
) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut h = 0;
    // SAFETY: the driver writes one handle; the address is only looked up.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut h, ptr as *mut c_void)
    })?;
    Ok(h)
}

// ---------------------------------------------------------------- virtual memory management

/// Allocation properties for device-resident memory on `dev`, exportable as a POSIX fd.
pub(crate) fn device_alloc_prop(dev: sys::CUdevice, rdma: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: u8::from(rdma),
            usage: 0,
            reserved: [0; 4],
        },
    }
}

pub(crate) fn mem_granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    let mut g = 0usize;
    let opt = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: reads the property struct, writes one size_t.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, prop, opt)
    })?;
    Ok(g)
}

pub(crate) fn mem_create(
    bytes: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut h = 0;
    // SAFETY: reads the property struct, writes one handle.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut h, bytes, prop, 0)
    })?;
    Ok(h)
}

/// # Safety
/// `h` must be a live allocation handle owned by the caller; it is consumed.
pub(crate) unsafe fn mem_release(h: sys::CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: the caller owns `h`.
    check("cuMemRelease", unsafe { sys::cuMemRelease(h) })
}

pub(crate) fn mem_address_reserve(bytes: usize, align: usize) -> Result<sys::CUdeviceptr> {
    let mut p = 0;
    // SAFETY: writes one address; no fixed address is requested.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut p, bytes, align, 0, 0)
    })?;
    Ok(p)
}

/// # Safety
/// `ptr`/`bytes` must be a range reserved by `mem_address_reserve` with nothing mapped.
pub(crate) unsafe fn mem_address_free(ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range is an unmapped reservation.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(ptr, bytes)
    })
}

/// # Safety
/// `ptr`/`bytes` must be an unmapped reserved range and `h` a live handle of at least `bytes`.
pub(crate) unsafe fn mem_map(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    h: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: the caller guarantees range and handle.
    check("cuMemMap", unsafe { sys::cuMemMap(ptr, bytes, 0, h, 0) })
}

/// # Safety
/// `ptr`/`bytes` must be a mapped range with no work in flight on it.
pub(crate) unsafe fn mem_unmap(ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range is mapped and idle.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, bytes) })
}

/// Grants read/write access to `ptr`/`bytes` for every device in `devices`.
///
/// # Safety
/// `ptr`/`bytes` must be a mapped range.
pub(crate) unsafe fn mem_set_access(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    devices: &[sys::CUdevice],
) -> Result<()> {
    let descs: Vec<sys::CUmemAccessDesc> = devices
        .iter()
        .map(|&d| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: d,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    // SAFETY: the caller guarantees the range is mapped; `descs` outlives the call.
    check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len())
    })
}

/// Exports an allocation (or multicast) handle as a POSIX file descriptor.
///
/// # Safety
/// `h` must be a live handle created with the POSIX-FD handle type.
pub(crate) unsafe fn export_fd(h: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let mut fd: RawFd = -1;
    let ty = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: for the POSIX-FD type the driver writes an int through the pointer.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle((&mut fd as *mut RawFd).cast(), h, ty, 0)
    })?;
    if fd < 0 {
        return Err(Error::Backend {
            backend: BackendKind::Cuda,
            call: "cuMemExportToShareableHandle",
            code: 0,
            name: "CUDA_SUCCESS".into(),
            message: format!("returned an invalid file descriptor {fd}"),
        });
    }
    // SAFETY: the driver handed us a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Imports an allocation (or multicast) handle from a POSIX file descriptor. The descriptor
/// stays owned by the caller (the driver keeps its own reference).
pub(crate) fn import_fd(fd: &OwnedFd) -> Result<sys::CUmemGenericAllocationHandle> {
    use std::os::fd::AsRawFd;
    let mut h = 0;
    let ty = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // For POSIX-FD handles the "pointer" argument carries the descriptor's value.
    let os_handle = fd.as_raw_fd() as isize as *mut c_void;
    // SAFETY: `fd` is open for the duration of the call; the driver writes one handle.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(&mut h, os_handle, ty)
    })?;
    Ok(h)
}

// ---------------------------------------------------------------- multicast

pub(crate) fn multicast_prop(members: u32, bytes: usize) -> sys::CUmulticastObjectProp {
    sys::CUmulticastObjectProp {
        numDevices: members,
        size: bytes,
        handleTypes: u64::from(
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0,
        ),
        flags: 0,
    }
}

pub(crate) fn multicast_granularity(prop: &sys::CUmulticastObjectProp) -> Result<usize> {
    loader::require_symbol("cuMulticastGetGranularity")?;
    let mut g = 0usize;
    let opt = sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED;
    // SAFETY: reads the property struct, writes one size_t.
    check("cuMulticastGetGranularity", unsafe {
        sys::cuMulticastGetGranularity(&mut g, prop, opt)
    })?;
    Ok(g)
}

/// Creates a multicast object. Callers pass the multicast gate first.
pub(crate) fn multicast_create(
    prop: &sys::CUmulticastObjectProp,
) -> Result<sys::CUmemGenericAllocationHandle> {
    loader::require_symbol("cuMulticastCreate")?;
    let mut h = 0;
    // SAFETY: reads the property struct, writes one handle.
    check("cuMulticastCreate", unsafe {
        sys::cuMulticastCreate(&mut h, prop)
    })?;
    Ok(h)
}

/// # Safety
/// `mc` must be a live multicast handle.
pub(crate) unsafe fn multicast_add_device(
    mc: sys::CUmemGenericAllocationHandle,
    dev: sys::CUdevice,
) -> Result<()> {
    // SAFETY: the caller guarantees `mc` is live.
    check("cuMulticastAddDevice", unsafe {
        sys::cuMulticastAddDevice(mc, dev)
    })
}

/// # Safety
/// `mc` and `mem` must be live handles; `mem` at least `bytes` long.
pub(crate) unsafe fn multicast_bind_mem(
    mc: sys::CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: sys::CUmemGenericAllocationHandle,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller guarantees both handles.
    check("cuMulticastBindMem", unsafe {
        sys::cuMulticastBindMem(mc, mc_offset, mem, 0, bytes, 0)
    })
}

/// # Safety
/// `mc` must be a live multicast handle with memory of `dev` bound at `offset`.
pub(crate) unsafe fn multicast_unbind(
    mc: sys::CUmemGenericAllocationHandle,
    dev: sys::CUdevice,
    offset: usize,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller guarantees the binding exists.
    check("cuMulticastUnbind", unsafe {
        sys::cuMulticastUnbind(mc, dev, offset, bytes)
    })
}

// ---------------------------------------------------------------- streams and events

pub(crate) fn stream_create() -> Result<sys::CUstream> {
    let mut s = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: writes one stream handle in the current context.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, flags)
    })?;
    Ok(s)
}

/// # Safety
/// `s` must be a live stream owned by the caller; it is consumed.
pub(crate) unsafe fn stream_destroy(s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller owns `s`.
    check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) })
}

/// # Safety
/// `s` must be a live stream.
pub(crate) unsafe fn stream_synchronize(s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees `s` is live.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(s)
    })
}

/// # Safety
/// `s` must be a live stream.
pub(crate) unsafe fn stream_is_capturing(s: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller guarantees `s` is live; writes one status.
    check("cuStreamIsCapturing", unsafe {
        sys::cuStreamIsCapturing(s, &mut status)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// # Safety
/// `s` and `e` must be live.
pub(crate) unsafe fn stream_wait_event(s: sys::CUstream, e: sys::CUevent) -> Result<()> {
    // SAFETY: the caller guarantees both handles.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, 0)
    })
}

pub(crate) fn event_create(timed: bool) -> Result<sys::CUevent> {
    let mut e = std::ptr::null_mut();
    let flags = if timed {
        sys::CUevent_flags::CU_EVENT_DEFAULT
    } else {
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
    } as u32;
    // SAFETY: writes one event handle in the current context.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags)
    })?;
    Ok(e)
}

/// # Safety
/// `e` must be a live event owned by the caller; it is consumed.
pub(crate) unsafe fn event_destroy(e: sys::CUevent) -> Result<()> {
    // SAFETY: the caller owns `e`.
    check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(e) })
}

/// # Safety
/// `e` and `s` must be live.
pub(crate) unsafe fn event_record(e: sys::CUevent, s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees both handles.
    check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })
}

/// # Safety
/// `e` must be live.
pub(crate) unsafe fn event_synchronize(e: sys::CUevent) -> Result<()> {
    // SAFETY: the caller guarantees `e`.
    check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
}

/// # Safety
/// `start` and `end` must be live events.
pub(crate) unsafe fn event_elapsed_ms(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    loader::require_symbol("cuEventElapsedTime_v2")?;
    let mut ms = 0f32;
    // SAFETY: the caller guarantees both events; writes one float.
    check("cuEventElapsedTime", unsafe {
        sys::cuEventElapsedTime_v2(&mut ms, start, end)
    })?;
    Ok(ms)
}

// ---------------------------------------------------------------- copies

/// # Safety
/// `dst` must be device memory of at least `src.len()` bytes and `s` a live stream.
pub(crate) unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: &[u8],
    s: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees `dst` and `s`; `src` is valid for its length and the
    // caller synchronizes before `src` is released.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), s)
    })
}

/// # Safety
/// `src` must be device memory of at least `dst.len()` bytes and `s` a live stream.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: &mut [u8],
    src: sys::CUdeviceptr,
    s: sys::CUstream,
) -> Result<()> {
    // SAFETY: as above; the caller synchronizes before `dst` is read or released.
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), s)
    })
}

/// # Safety
/// Both ranges must be live device memory of `bytes` and `s` a live stream.
pub(crate) unsafe fn memcpy_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the ranges and the stream.
    check("cuMemcpyAsync", unsafe {
        sys::cuMemcpyAsync(dst, src, bytes, s)
    })
}

/// # Safety
/// `dst` must be live device memory of `bytes` and `s` a live stream.
pub(crate) unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the range and the stream.
    check("cuMemsetD8Async", unsafe {
        sys::cuMemsetD8Async(dst, value, bytes, s)
    })
}

// ---------------------------------------------------------------- modules and launches

/// # Safety
/// `image` must point to a complete fatbin/cubin, suitably aligned, for the whole call.
pub(crate) unsafe fn module_load_data(image: *const c_void) -> Result<sys::CUmodule> {
    let mut m = std::ptr::null_mut();
    // SAFETY: the caller guarantees the image.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, image)
    })?;
    Ok(m)
}

/// # Safety
/// `m` must be a live module owned by the caller; it is consumed.
pub(crate) unsafe fn module_unload(m: sys::CUmodule) -> Result<()> {
    // SAFETY: the caller owns `m`.
    check("cuModuleUnload", unsafe { sys::cuModuleUnload(m) })
}

/// # Safety
/// `m` must be a live module.
pub(crate) unsafe fn module_get_function(m: sys::CUmodule, name: &CStr) -> Result<sys::CUfunction> {
    let mut f = std::ptr::null_mut();
    // SAFETY: the caller guarantees `m`; `name` is NUL-terminated.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// Names of every kernel in `m` (empty when the driver cannot enumerate them).
///
/// # Safety
/// `m` must be a live module.
pub(crate) unsafe fn module_function_names(m: sys::CUmodule) -> Result<Vec<String>> {
    if !loader::has_symbol("cuModuleGetFunctionCount")
        || !loader::has_symbol("cuModuleEnumerateFunctions")
        || !loader::has_symbol("cuFuncGetName")
    {
        return Ok(Vec::new());
    }
    let mut count = 0u32;
    // SAFETY: the caller guarantees `m`; writes one count.
    check("cuModuleGetFunctionCount", unsafe {
        sys::cuModuleGetFunctionCount(&mut count, m)
    })?;
    let mut funcs = vec![std::ptr::null_mut(); count as usize];
    // SAFETY: `funcs` holds `count` slots.
    check("cuModuleEnumerateFunctions", unsafe {
        sys::cuModuleEnumerateFunctions(funcs.as_mut_ptr(), count, m)
    })?;
    let mut names = Vec::with_capacity(funcs.len());
    for f in funcs {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `f` came from the enumeration of a live module.
        check("cuFuncGetName", unsafe { sys::cuFuncGetName(&mut name, f) })?;
        if !name.is_null() {
            // SAFETY: the driver returns a NUL-terminated name owned by the module.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    names.sort();
    Ok(names)
}

/// Where one kernel parameter sits in the device-side parameter layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParamSlot {
    /// Byte offset from the start of the parameter layout.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Offset and size of the kernel's parameter `index` (`cuFuncGetParamInfo`, CUDA 12.4+
/// drivers); `None` when the driver does not export it.
///
/// An index past the last parameter is an error of the driver's (`CUDA_ERROR_INVALID_VALUE`),
/// which compute-sanitizer reports as an API error: callers only ask for indices they know
/// exist or must exist.
///
/// # Safety
/// `f` must be a function of a live module.
pub(crate) unsafe fn func_param_info(
    f: sys::CUfunction,
    index: usize,
) -> Option<Result<ParamSlot>> {
    if !loader::has_symbol("cuFuncGetParamInfo") {
        return None;
    }
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: the caller guarantees `f`; writes two size_t values.
    let rc = unsafe { sys::cuFuncGetParamInfo(f, index, &mut offset, &mut size) };
    Some(check("cuFuncGetParamInfo", rc).map(|()| ParamSlot { offset, size }))
}

/// `CUresult cuFuncGetParamCount(CUfunction func, size_t *paramCount)`, CUDA 13.2+.
type FuncGetParamCount = unsafe extern "C" fn(sys::CUfunction, *mut usize) -> sys::CUresult;

/// Number of the kernel's parameters (`cuFuncGetParamCount`, CUDA 13.2+ drivers); `None`
/// when the driver does not export it. Resolved here rather than through cudarc, whose
/// bindings are those of CUDA 13.0.
///
/// # Safety
/// `f` must be a function of a live module.
pub(crate) unsafe fn func_param_count(f: sys::CUfunction) -> Option<Result<usize>> {
    static COUNT_FN: std::sync::OnceLock<Option<FuncGetParamCount>> = std::sync::OnceLock::new();
    // SAFETY: `FuncGetParamCount` is the driver's C signature of cuFuncGetParamCount.
    let call = (*COUNT_FN.get_or_init(|| unsafe { loader::driver_fn("cuFuncGetParamCount") }))?;
    let mut count = 0usize;
    // SAFETY: the caller guarantees `f`; writes one size_t.
    let rc = unsafe { call(f, &mut count) };
    Some(check("cuFuncGetParamCount", rc).map(|()| count))
}

/// Launch dimensions in the driver's order, and whether the kernel may start before the
/// previous kernel on the stream has finished (programmatic dependent launch).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub early_launch: bool,
}

/// # Safety
/// `f` must be a live function, `s` a live stream, and `params` the kernel's parameter
/// pointer array (or null for a kernel without parameters), valid for the call.
pub(crate) unsafe fn launch_kernel(
    f: sys::CUfunction,
    dims: Dims,
    s: sys::CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let [gx, gy, gz] = dims.grid;
    let [bx, by, bz] = dims.block;
    if dims.early_launch {
        // One attribute: the kernel may be scheduled once the previous kernel on the stream
        // has triggered (or finished its blocks); it waits for that kernel's completion
        // and memory itself (griddepcontrol.wait).
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: gz,
            blockDimX: bx,
            blockDimY: by,
            blockDimZ: bz,
            sharedMemBytes: dims.shared_mem_bytes,
            hStream: s,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the caller guarantees function, stream and parameters; `config` and its
        // attribute live for the call (the driver copies them).
        return check("cuLaunchKernelEx", unsafe {
            sys::cuLaunchKernelEx(&config, f, params, std::ptr::null_mut())
        });
    }
    // SAFETY: the caller guarantees function, stream and parameters.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            dims.shared_mem_bytes,
            s,
            params,
            std::ptr::null_mut(),
        )
    })
}

/// # Safety
/// `f` must be a function of a live module.
pub(crate) unsafe fn occupancy_max_active_blocks(
    f: sys::CUfunction,
    block_size: u32,
    dynamic_smem: usize,
) -> Result<u32> {
    let block = c_int(block_size as usize, "block size")?;
    let mut n = 0;
    // SAFETY: the caller guarantees `f`; writes one int.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block, dynamic_smem)
    })?;
    Ok(u32::try_from(n).unwrap_or(0))
}

// ---------------------------------------------------------------- graphs

/// # Safety
/// `s` must be a live stream of the current context.
pub(crate) unsafe fn stream_begin_capture(s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees `s` is live; the mode is a valid enum value (relaxed:
    // other threads may keep using the driver during the capture).
    check("cuStreamBeginCapture", unsafe {
        sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
    })
}

/// # Safety
/// `s` must be a live stream that is capturing.
pub(crate) unsafe fn stream_end_capture(s: sys::CUstream) -> Result<sys::CUgraph> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the caller guarantees `s` is live; writes one graph handle.
    check("cuStreamEndCapture", unsafe {
        sys::cuStreamEndCapture(s, &mut graph)
    })?;
    Ok(graph)
}

/// # Safety
/// `graph` must be a live graph.
pub(crate) unsafe fn graph_instantiate(graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: the caller guarantees `graph` is live; writes one executable-graph handle.
    check("cuGraphInstantiateWithFlags", unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
    })?;
    Ok(exec)
}

/// # Safety
/// `graph` must be a live graph that nothing uses afterwards.
pub(crate) unsafe fn graph_destroy(graph: sys::CUgraph) -> Result<()> {
    // SAFETY: the caller's obligation.
    check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) })
}

/// # Safety
/// `exec` and `s` must be live, of the current context.
pub(crate) unsafe fn graph_launch(exec: sys::CUgraphExec, s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's obligation.
    check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec, s) })
}

/// # Safety
/// `exec` must be a live executable graph that nothing uses afterwards.
pub(crate) unsafe fn graph_exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller's obligation.
    check("cuGraphExecDestroy", unsafe {
        sys::cuGraphExecDestroy(exec)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_carries_call_code_and_symbolic_name() {
        let e = error("cuMemCreate", sys::CUresult::CUDA_ERROR_INVALID_VALUE);
        match &e {
            Error::Backend {
                backend,
                call,
                code,
                name,
                message,
            } => {
                assert_eq!(*backend, BackendKind::Cuda);
                assert_eq!(*call, "cuMemCreate");
                assert_eq!(*code, 1);
                assert_eq!(name, "CUDA_ERROR_INVALID_VALUE");
                assert!(!message.is_empty());
            }
            other => panic!("not a backend error: {other:?}"),
        }
        let text = e.to_string();
        assert!(text.starts_with("CUDA call cuMemCreate failed with CUDA_ERROR_INVALID_VALUE (1)"));
        assert!(is_code(&e, sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(!is_code(&e, sys::CUresult::CUDA_ERROR_NOT_FOUND));
    }

    #[test]
    fn success_is_ok_and_codes_map_to_their_numbers() {
        assert!(check("cuInit", sys::CUresult::CUDA_SUCCESS).is_ok());
        let e = check(
            "cuCtxEnablePeerAccess",
            sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        );
        assert!(matches!(e, Err(Error::Backend { code: 704, .. })), "{e:?}");
        let e = check("cuInit", sys::CUresult::CUDA_ERROR_NO_DEVICE);
        assert!(matches!(e, Err(Error::Backend { code: 100, .. })), "{e:?}");
    }
}
