//! The `result` layer: one method per HIP call, returning [`Result`].
//!
//! A non-success `hipError_t` becomes [`Error::Backend`] with the call's name, the numeric
//! code, `hipGetErrorName` and `hipGetErrorString`. Methods that take raw pointers are
//! `unsafe`; their obligations are those of the HIP function they wrap. Nothing here keeps
//! state or owns memory: that is the safe types' job.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;

use oxccl_hal::{BackendKind, Error, Result};

use crate::runtime::Hip;
use crate::sys;

/// A raw HIP handle that can move between threads. HIP objects (streams, events, modules,
/// functions, allocation handles) are process-wide and usable from any thread.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Raw<T>(pub(crate) *mut T);

impl<T> Clone for Raw<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Raw<T> {}

// SAFETY: the pointee is an opaque HIP runtime object, which the runtime allows to be used
// from any thread of the process; the wrapper never dereferences it.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above; shared use only passes the handle value to thread-safe HIP calls.
unsafe impl<T> Sync for Raw<T> {}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: HIP returns pointers to static NUL-terminated strings from these calls.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub(crate) fn error_from(api: &sys::HipApi, call: &'static str, code: sys::hipError_t) -> Error {
    // SAFETY: both calls take any code and return a static string (or null).
    let (name, message) = unsafe {
        (
            text(api.hipGetErrorName(code)),
            text(api.hipGetErrorString(code)),
        )
    };
    Error::Backend {
        backend: BackendKind::Rocm,
        call,
        code: i64::from(code.0),
        name,
        message,
    }
}

impl Hip {
    /// The [`Error::Backend`] for `code` returned by `call`.
    pub fn error(&self, call: &'static str, code: sys::hipError_t) -> Error {
        error_from(&self.api, call, code)
    }

    /// `Ok` for `hipSuccess`, else [`Hip::error`].
    pub fn check(&self, call: &'static str, code: sys::hipError_t) -> Result<()> {
        if code == self.abi.success {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// `hipGetDeviceCount`. A runtime without devices answers `hipErrorNoDevice`, which is
    /// zero devices here.
    pub fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let rc = unsafe { self.api.hipGetDeviceCount(&mut n) };
        if rc == self.abi.error_no_device {
            return Ok(0);
        }
        self.check("hipGetDeviceCount", rc)?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// `hipSetDevice` for the calling thread.
    pub fn set_device(&self, device: c_int) -> Result<()> {
        // SAFETY: plain value argument.
        let rc = unsafe { self.api.hipSetDevice(device) };
        self.check("hipSetDevice", rc)
    }

    /// `hipGetDevice`: the calling thread's current device.
    pub fn current_device(&self) -> Result<c_int> {
        let mut d: c_int = 0;
        // SAFETY: `d` is a valid out-pointer.
        let rc = unsafe { self.api.hipGetDevice(&mut d) };
        self.check("hipGetDevice", rc)?;
        Ok(d)
    }

    /// `hipDeviceGetAttribute`, numbered as the runtime's generation numbers it.
    pub fn attribute(&self, attr: sys::Attribute, device: c_int) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let rc = unsafe {
            self.api
                .hipDeviceGetAttribute(&mut v, self.abi.attribute(attr), device)
        };
        self.check("hipDeviceGetAttribute", rc)?;
        Ok(v)
    }

    /// `hipDeviceGetName`.
    pub fn device_name(&self, device: c_int) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; HIP NUL-terminates within it.
        let rc = unsafe {
            self.api
                .hipDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, device)
        };
        self.check("hipDeviceGetName", rc)?;
        buf[buf.len() - 1] = 0;
        Ok(text(buf.as_ptr()))
    }

    /// `hipDeviceTotalMem`.
    pub fn total_mem(&self, device: c_int) -> Result<u64> {
        let mut bytes: usize = 0;
        // SAFETY: `bytes` is a valid out-pointer.
        let rc = unsafe { self.api.hipDeviceTotalMem(&mut bytes, device) };
        self.check("hipDeviceTotalMem", rc)?;
        Ok(bytes as u64)
    }

    /// `hipDeviceCanAccessPeer`.
    pub fn can_access_peer(&self, device: c_int, peer: c_int) -> Result<bool> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let rc = unsafe { self.api.hipDeviceCanAccessPeer(&mut v, device, peer) };
        self.check("hipDeviceCanAccessPeer", rc)?;
        Ok(v != 0)
    }

    /// `hipDeviceEnablePeerAccess` from the current device; already enabled is success.
    pub fn enable_peer_access(&self, peer: c_int) -> Result<()> {
        // SAFETY: plain value arguments.
        let rc = unsafe { self.api.hipDeviceEnablePeerAccess(peer, 0) };
        if rc == self.abi.error_peer_access_already_enabled {
            return Ok(());
        }
        self.check("hipDeviceEnablePeerAccess", rc)
    }

    /// `hipDeviceSynchronize` on the current device.
    pub fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        let rc = unsafe { self.api.hipDeviceSynchronize() };
        self.check("hipDeviceSynchronize", rc)
    }

    /// `hipMalloc` on the current device.
    pub fn malloc(&self, bytes: usize) -> Result<*mut c_void> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let rc = unsafe { self.api.hipMalloc(&mut p, bytes) };
        self.check("hipMalloc", rc)?;
        Ok(p)
    }

    /// `hipExtMallocWithFlags` on the current device.
    pub fn ext_malloc_with_flags(&self, bytes: usize, flags: u32) -> Result<*mut c_void> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let rc = unsafe { self.api.hipExtMallocWithFlags(&mut p, bytes, flags) };
        self.check("hipExtMallocWithFlags", rc)?;
        Ok(p)
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `p` must come from `hipMalloc`/`hipExtMallocWithFlags` and not be used afterwards.
    pub unsafe fn free(&self, p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipFree(p) };
        self.check("hipFree", rc)
    }

    /// `hipHostMalloc`.
    pub fn host_malloc(&self, bytes: usize, flags: u32) -> Result<*mut c_void> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let rc = unsafe { self.api.hipHostMalloc(&mut p, bytes, flags) };
        self.check("hipHostMalloc", rc)?;
        Ok(p)
    }

    /// `hipHostFree`.
    ///
    /// # Safety
    /// `p` must come from `hipHostMalloc` and not be used afterwards.
    pub unsafe fn host_free(&self, p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipHostFree(p) };
        self.check("hipHostFree", rc)
    }

    /// `hipHostGetDevicePointer`.
    ///
    /// # Safety
    /// `host` must be live memory from `hipHostMalloc` with the mapped flag.
    pub unsafe fn host_device_pointer(&self, host: *mut c_void) -> Result<*mut c_void> {
        let mut d = ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer; `host` per the caller.
        let rc = unsafe { self.api.hipHostGetDevicePointer(&mut d, host, 0) };
        self.check("hipHostGetDevicePointer", rc)?;
        Ok(d)
    }

    /// `hipMemGetAddressRange`: the base and length of the allocation that holds `ptr`, or
    /// `None` when the runtime knows no allocation there (`hipErrorNotFound`).
    pub fn mem_get_address_range(&self, ptr: u64) -> Result<Option<(u64, usize)>> {
        let mut base = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: valid out-pointers; the runtime looks the address up in its table of
        // allocations and never dereferences it.
        let rc = unsafe {
            self.api
                .hipMemGetAddressRange(&mut base, &mut len, ptr as *mut c_void)
        };
        if rc == self.abi.error_not_found {
            return Ok(None);
        }
        self.check("hipMemGetAddressRange", rc)?;
        Ok(Some((base as u64, len)))
    }

    /// `hipPointerGetAttribute` of `attr` at `ptr`, widened to 64 bits, or `None` when the
    /// runtime knows no allocation there (`hipErrorInvalidValue`: ROCm's answer for memory
    /// it did not allocate, such as `malloc`'s or the stack).
    ///
    /// ROCm writes each attribute at its own width (a `bool` for `IsManaged`, 32 bits for
    /// the memory type, the ordinal and the buffer id), so the value is read from a zeroed
    /// 8-byte buffer as a little-endian number (every ROCm host is little-endian).
    pub fn pointer_attribute(&self, attr: sys::PointerAttribute, ptr: u64) -> Result<Option<u64>> {
        let mut data = [0u8; 8];
        // SAFETY: `data` holds 8 bytes, the widest value any of these attributes has; the
        // runtime looks `ptr` up in its table of allocations and never dereferences it.
        let rc = unsafe {
            self.api.hipPointerGetAttribute(
                data.as_mut_ptr().cast(),
                self.abi.pointer_attribute(attr),
                ptr as *mut c_void,
            )
        };
        if rc == self.abi.error_invalid_value {
            return Ok(None);
        }
        self.check("hipPointerGetAttribute", rc)?;
        Ok(Some(u64::from_le_bytes(data)))
    }

    /// `hipMemGetAllocationGranularity` (minimum granularity).
    pub fn allocation_granularity(&self, prop: &sys::hipMemAllocationProp) -> Result<usize> {
        let mut g: usize = 0;
        // SAFETY: `g` is a valid out-pointer and `prop` a valid structure.
        let rc = unsafe {
            self.api
                .hipMemGetAllocationGranularity(&mut g, prop, self.abi.granularity_minimum)
        };
        self.check("hipMemGetAllocationGranularity", rc)?;
        Ok(g)
    }

    /// `hipMemCreate`.
    pub fn mem_create(
        &self,
        bytes: usize,
        prop: &sys::hipMemAllocationProp,
    ) -> Result<sys::hipMemGenericAllocationHandle_t> {
        let mut h = ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer and `prop` a valid structure.
        let rc = unsafe { self.api.hipMemCreate(&mut h, bytes, prop, 0) };
        self.check("hipMemCreate", rc)?;
        Ok(h)
    }

    /// `hipMemRelease`.
    ///
    /// # Safety
    /// `h` must be a live handle, not used afterwards.
    pub unsafe fn mem_release(&self, h: sys::hipMemGenericAllocationHandle_t) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemRelease(h) };
        self.check("hipMemRelease", rc)
    }

    /// `hipMemAddressReserve` of `bytes` aligned to `align`, anywhere.
    pub fn address_reserve(&self, bytes: usize, align: usize) -> Result<*mut c_void> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; a null hint address lets HIP choose.
        let rc = unsafe {
            self.api
                .hipMemAddressReserve(&mut p, bytes, align, ptr::null_mut(), 0)
        };
        self.check("hipMemAddressReserve", rc)?;
        Ok(p)
    }

    /// `hipMemAddressFree`.
    ///
    /// # Safety
    /// `p`/`bytes` must be a reservation with nothing mapped in it, not used afterwards.
    pub unsafe fn address_free(&self, p: *mut c_void, bytes: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemAddressFree(p, bytes) };
        self.check("hipMemAddressFree", rc)
    }

    /// `hipMemMap` of the whole handle at `p`.
    ///
    /// # Safety
    /// `p`/`bytes` must lie in a reservation; `h` must be a live handle of `bytes`.
    pub unsafe fn mem_map(
        &self,
        p: *mut c_void,
        bytes: usize,
        h: sys::hipMemGenericAllocationHandle_t,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemMap(p, bytes, 0, h, 0) };
        self.check("hipMemMap", rc)
    }

    /// `hipMemUnmap`.
    ///
    /// # Safety
    /// `p`/`bytes` must be a mapping made by [`Hip::mem_map`] that nothing uses any more.
    pub unsafe fn mem_unmap(&self, p: *mut c_void, bytes: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemUnmap(p, bytes) };
        self.check("hipMemUnmap", rc)
    }

    /// `hipMemSetAccess`: read/write for `device` on `p`/`bytes`.
    ///
    /// # Safety
    /// `p`/`bytes` must be mapped.
    pub unsafe fn mem_set_access(&self, p: *mut c_void, bytes: usize, device: c_int) -> Result<()> {
        let desc = self.abi.read_write_access(device);
        // SAFETY: `desc` is one valid descriptor; the range per the caller.
        let rc = unsafe { self.api.hipMemSetAccess(p, bytes, &desc, 1) };
        self.check("hipMemSetAccess", rc)
    }

    /// `hipMemExportToShareableHandle` as a POSIX file descriptor (owned by the caller).
    ///
    /// # Safety
    /// `h` must be a live allocation handle created for POSIX-FD export.
    pub unsafe fn export_posix_fd(&self, h: sys::hipMemGenericAllocationHandle_t) -> Result<c_int> {
        let mut fd: c_int = -1;
        // SAFETY: for the POSIX-FD type the shareable handle is written as an int.
        let rc = unsafe {
            self.api.hipMemExportToShareableHandle(
                (&mut fd as *mut c_int).cast(),
                h,
                self.abi.handle_type_posix_fd,
                0,
            )
        };
        self.check("hipMemExportToShareableHandle", rc)?;
        Ok(fd)
    }

    /// `hipMemImportFromShareableHandle` from a POSIX file descriptor (not consumed).
    pub fn import_posix_fd(&self, fd: c_int) -> Result<sys::hipMemGenericAllocationHandle_t> {
        let mut h = ptr::null_mut();
        // SAFETY: for the POSIX-FD type the OS handle is the descriptor's value in the
        // pointer argument (as in CUDA's cuMemImportFromShareableHandle).
        let rc = unsafe {
            self.api.hipMemImportFromShareableHandle(
                &mut h,
                fd as isize as *mut c_void,
                self.abi.handle_type_posix_fd,
            )
        };
        self.check("hipMemImportFromShareableHandle", rc)?;
        Ok(h)
    }

    /// `hipIpcGetMemHandle`: the 64 bytes of the handle.
    ///
    /// # Safety
    /// `p` must be the base of a live `hipMalloc`/`hipExtMallocWithFlags` allocation.
    pub unsafe fn ipc_get_mem_handle(&self, p: *mut c_void) -> Result<Vec<u8>> {
        let mut h = sys::hipIpcMemHandle_t::default();
        // SAFETY: `h` is a valid out-structure; `p` per the caller.
        let rc = unsafe { self.api.hipIpcGetMemHandle(&mut h, p) };
        self.check("hipIpcGetMemHandle", rc)?;
        Ok(h.reserved.iter().map(|&c| c as u8).collect())
    }

    /// `hipIpcOpenMemHandle` (lazy peer access: 0 in 5.x, 1 from 6.0) of a handle's 64
    /// bytes.
    pub fn ipc_open_mem_handle(&self, bytes: &[u8]) -> Result<*mut c_void> {
        let mut h = sys::hipIpcMemHandle_t::default();
        if bytes.len() != h.reserved.len() {
            return Err(Error::Ipc(format!(
                "a HIP IPC handle has {} bytes, this one {}",
                h.reserved.len(),
                bytes.len()
            )));
        }
        for (d, s) in h.reserved.iter_mut().zip(bytes) {
            *d = *s as c_char;
        }
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the handle is passed by value.
        let rc = unsafe {
            self.api
                .hipIpcOpenMemHandle(&mut p, h, self.abi.ipc_lazy_enable_peer_access)
        };
        self.check("hipIpcOpenMemHandle", rc)?;
        Ok(p)
    }

    /// `hipIpcCloseMemHandle`.
    ///
    /// # Safety
    /// `p` must come from [`Hip::ipc_open_mem_handle`], closed once, unused afterwards.
    pub unsafe fn ipc_close_mem_handle(&self, p: *mut c_void) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipIpcCloseMemHandle(p) };
        self.check("hipIpcCloseMemHandle", rc)
    }

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)` on the current device.
    pub fn stream_create(&self) -> Result<sys::hipStream_t> {
        let mut s = ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        let rc = unsafe {
            self.api
                .hipStreamCreateWithFlags(&mut s, self.abi.stream_non_blocking)
        };
        self.check("hipStreamCreateWithFlags", rc)?;
        Ok(s)
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `s` must be a live stream, unused afterwards.
    pub unsafe fn stream_destroy(&self, s: sys::hipStream_t) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipStreamDestroy(s) };
        self.check("hipStreamDestroy", rc)
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// `s` must be a live stream.
    pub unsafe fn stream_synchronize(&self, s: sys::hipStream_t) -> Result<()> {
        // SAFETY: live stream per the caller.
        let rc = unsafe { self.api.hipStreamSynchronize(s) };
        self.check("hipStreamSynchronize", rc)
    }

    /// `hipStreamWaitEvent`.
    ///
    /// # Safety
    /// `s` and `e` must be a live stream and event.
    pub unsafe fn stream_wait_event(&self, s: sys::hipStream_t, e: sys::hipEvent_t) -> Result<()> {
        // SAFETY: live stream and event per the caller.
        let rc = unsafe { self.api.hipStreamWaitEvent(s, e, 0) };
        self.check("hipStreamWaitEvent", rc)
    }

    /// `hipStreamIsCapturing`.
    ///
    /// # Safety
    /// `s` must be a live stream.
    pub unsafe fn stream_is_capturing(&self, s: sys::hipStream_t) -> Result<bool> {
        let mut status = self.abi.capture_status_none;
        // SAFETY: `status` is a valid out-pointer; live stream.
        let rc = unsafe { self.api.hipStreamIsCapturing(s, &mut status) };
        self.check("hipStreamIsCapturing", rc)?;
        Ok(status != self.abi.capture_status_none)
    }

    /// `hipEventCreateWithFlags(hipEventDefault)`: a timing event.
    pub fn event_create(&self) -> Result<sys::hipEvent_t> {
        let mut e = ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer.
        let rc = unsafe {
            self.api
                .hipEventCreateWithFlags(&mut e, self.abi.event_default)
        };
        self.check("hipEventCreateWithFlags", rc)?;
        Ok(e)
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `e` must be a live event, unused afterwards.
    pub unsafe fn event_destroy(&self, e: sys::hipEvent_t) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipEventDestroy(e) };
        self.check("hipEventDestroy", rc)
    }

    /// `hipEventRecord`.
    ///
    /// # Safety
    /// `e` and `s` must be a live event and stream.
    pub unsafe fn event_record(&self, e: sys::hipEvent_t, s: sys::hipStream_t) -> Result<()> {
        // SAFETY: live event and stream per the caller.
        let rc = unsafe { self.api.hipEventRecord(e, s) };
        self.check("hipEventRecord", rc)
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// `e` must be a live event.
    pub unsafe fn event_synchronize(&self, e: sys::hipEvent_t) -> Result<()> {
        // SAFETY: live event per the caller.
        let rc = unsafe { self.api.hipEventSynchronize(e) };
        self.check("hipEventSynchronize", rc)
    }

    /// `hipEventElapsedTime(start, stop)` in milliseconds.
    ///
    /// # Safety
    /// `start` and `stop` must be live events.
    pub unsafe fn event_elapsed(
        &self,
        start: sys::hipEvent_t,
        stop: sys::hipEvent_t,
    ) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; live events.
        let rc = unsafe { self.api.hipEventElapsedTime(&mut ms, start, stop) };
        self.check("hipEventElapsedTime", rc)?;
        Ok(ms)
    }

    /// `hipMemcpyAsync`.
    ///
    /// # Safety
    /// Both ranges must be valid for `bytes` of the kind's direction until the copy ends.
    pub unsafe fn memcpy_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: sys::MemcpyKind,
        s: sys::hipStream_t,
    ) -> Result<()> {
        let kind = self.abi.memcpy_kind(kind);
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemcpyAsync(dst, src, bytes, kind, s) };
        self.check("hipMemcpyAsync", rc)
    }

    /// `hipMemsetD8Async`.
    ///
    /// # Safety
    /// `dst` must be device memory valid for `bytes` until the fill ends.
    pub unsafe fn memset_d8_async(
        &self,
        dst: *mut c_void,
        value: u8,
        bytes: usize,
        s: sys::hipStream_t,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipMemsetD8Async(dst, value, bytes, s) };
        self.check("hipMemsetD8Async", rc)
    }

    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `image` must be a complete code object or offload bundle; HIP reads it without a
    /// length.
    pub unsafe fn module_load_data(&self, image: &[u8]) -> Result<sys::hipModule_t> {
        let mut m = ptr::null_mut();
        // SAFETY: `m` is a valid out-pointer; the image per the caller.
        let rc = unsafe { self.api.hipModuleLoadData(&mut m, image.as_ptr().cast()) };
        self.check("hipModuleLoadData", rc)?;
        Ok(m)
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `m` must be a live module whose functions are no longer launched.
    pub unsafe fn module_unload(&self, m: sys::hipModule_t) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let rc = unsafe { self.api.hipModuleUnload(m) };
        self.check("hipModuleUnload", rc)
    }

    /// `hipModuleGetFunction`; `Ok(None)` when the module has no such function
    /// (`hipErrorNotFound`).
    ///
    /// # Safety
    /// `m` must be a live module.
    pub unsafe fn module_get_function(
        &self,
        m: sys::hipModule_t,
        name: &CStr,
    ) -> Result<Option<sys::hipFunction_t>> {
        let mut f = ptr::null_mut();
        // SAFETY: `f` is a valid out-pointer; live module; NUL-terminated name.
        let rc = unsafe { self.api.hipModuleGetFunction(&mut f, m, name.as_ptr()) };
        if rc == self.abi.error_not_found {
            return Ok(None);
        }
        self.check("hipModuleGetFunction", rc)?;
        Ok(Some(f))
    }

    /// `hipModuleLaunchKernel` with the argument block passed through `extra`.
    ///
    /// # Safety
    /// `args` must be the argument block `f` expects, with every pointer in it valid for
    /// the kernel's whole run; `s` a live stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_kernel(
        &self,
        f: sys::hipFunction_t,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        s: sys::hipStream_t,
        args: &[u8],
    ) -> Result<()> {
        let mut size: usize = args.len();
        let mut extra: [*mut c_void; 5] = [
            sys::HIP_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            args.as_ptr() as *mut c_void,
            sys::HIP_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            sys::HIP_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: `extra` is a well-formed, END-terminated list pointing at `args` and its
        // length, both alive for the call (HIP copies the block before returning); the
        // kernel-level obligations are the caller's.
        let rc = unsafe {
            self.api.hipModuleLaunchKernel(
                f,
                grid[0] as c_uint,
                grid[1] as c_uint,
                grid[2] as c_uint,
                block[0] as c_uint,
                block[1] as c_uint,
                block[2] as c_uint,
                shared_mem_bytes as c_uint,
                s,
                ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        self.check("hipModuleLaunchKernel", rc)
    }
}
