//! Raw HIP runtime bindings for every supported HIP ABI generation, and the version-neutral
//! layer the rest of the crate is written against.
//!
//! # Generations
//!
//! AMD breaks the HIP ABI only at major releases (ROCm 6.0, 7.0), so a runtime is matched
//! by its major version alone; other minors than the headers' below (e.g. 5.0 to 5.6, 6.0 to
//! 6.3) were not compared. [`v5`], [`v6`] and [`v7`]
//! are bindgen's output for the HIP 5.7, 6.4 and 7.2 headers (Debian's `libamdhip64-dev`),
//! restricted to what oxccl calls, and checked into git: a `--features rocm` build needs no
//! HIP headers and no libclang for this crate, and one binary serves all three runtimes.
//! `tests/bindings.rs` checks that regenerating them reproduces the files (when the headers
//! are present, as on CI) and that the three function tables are identical.
//!
//! For the calls oxccl makes, the generations differ in (found by diffing the three):
//! - `hipIpcMemLazyEnablePeerAccess` is 0 in 5.x and 1 from 6.0 (the value the runtime
//!   checks in `hipIpcOpenMemHandle`'s flags);
//! - `hipMemAllocationProp::requestedHandleType` became a union with `requestedHandleTypes`
//!   in 7.x (same offset and size);
//! - `hipMemoryType` was renumbered in 6.0: host and device memory are 0 and 1 in 5.x, 1
//!   and 2 from 6.0 (0 became `hipMemoryTypeUnregistered`), which is what
//!   `hipPointerGetAttribute(HIP_POINTER_ATTRIBUTE_MEMORY_TYPE)` answers;
//! - values appended to `hipError_t`, `hipDeviceAttribute_t`, `hipMemcpyKind`,
//!   `hipMemLocationType`, `hipMemAllocationType`, and unused attributes renamed
//!   (`hipDeviceAttributeName`/`Uuid`/`Arch`/`GcnArch*` became `Unused*` in 6.x). No other
//!   value oxccl uses moved (`hipPointer_attribute` is numbered alike in all three), and no
//!   function oxccl calls changed its signature or its symbol.
//!
//! What changed elsewhere and is avoided on purpose: `hipDeviceProp_t` (6.0 renamed it
//! `hipDeviceProp_tR0600` with a new layout and redirects `hipGetDeviceProperties` and
//! `hipChooseDevice` to `...R0600` symbols by macro) and `hipPointerAttribute_t` (its
//! `memoryType` field became `type` in 6.0). oxccl reads capabilities only through
//! `hipDeviceGetAttribute` and never calls those.
//!
//! # The neutral layer
//!
//! Since the function tables are identical, one table is loaded whichever generation
//! answers: [`HipApi`] and the types of its signatures are re-exported from [`v7`], and
//! the structure layouts they pass are asserted equal across generations below. Every
//! enum value and flag that oxccl passes or compares comes from the [`Abi`] of the
//! runtime's generation ([`Abi::for_version`], chosen from `hipRuntimeGetVersion` when the
//! runtime is loaded), never from the associated constants of the re-exported types. A
//! future generation that changes a signature or a layout gets its own translation here;
//! `result.rs` stays as it is.

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_debug_implementations,
    missing_docs
)]

use std::ffi::c_uint;
use std::mem::{align_of, offset_of, size_of};

/// Bindings from the HIP 5.7 headers (ABI generation 5).
#[rustfmt::skip]
#[allow(dead_code, unsafe_op_in_unsafe_fn, clippy::all, clippy::undocumented_unsafe_blocks)]
pub mod v5;
/// Bindings from the HIP 6.4 headers (ABI generation 6).
#[rustfmt::skip]
#[allow(dead_code, unsafe_op_in_unsafe_fn, clippy::all, clippy::undocumented_unsafe_blocks)]
pub mod v6;
/// Bindings from the HIP 7.2 headers (ABI generation 7).
#[rustfmt::skip]
#[allow(dead_code, unsafe_op_in_unsafe_fn, clippy::all, clippy::undocumented_unsafe_blocks)]
pub mod v7;

/// The function table and the types of its signatures (identical in every generation).
pub use v7::{
    hipDeviceAttribute_t, hipError_t, hipEvent_t, hipFunction_t, hipIpcMemHandle_t,
    hipMemAccessDesc, hipMemAccessFlags, hipMemAllocationGranularity_flags,
    hipMemAllocationHandleType, hipMemAllocationProp, hipMemAllocationType,
    hipMemGenericAllocationHandle_t, hipMemLocation, hipMemLocationType, hipMemcpyKind,
    hipMemoryType, hipModule_t, hipPointer_attribute, hipStreamCaptureStatus, hipStream_t,
    ihipEvent_t, ihipMemGenericAllocationHandle, ihipModuleSymbol_t, ihipModule_t, ihipStream_t,
    HipApi,
};

/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`: the headers define it as `((void*)0x01)`, which
/// bindgen cannot translate. The same in every generation; the fake runtime of the tests
/// checks these three against each generation's macros.
pub const HIP_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// `HIP_LAUNCH_PARAM_BUFFER_SIZE` (`((void*)0x02)` in the headers).
pub const HIP_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
/// `HIP_LAUNCH_PARAM_END` (`((void*)0x03)` in the headers).
pub const HIP_LAUNCH_PARAM_END: usize = 0x03;

/// Every function in [`HipApi`] (the symbols a runtime must export; `tests/bindings.rs`
/// checks the list against the table). Used to name the one a library lacks.
pub const FUNCTIONS: &[&str] = &include!("functions.in");

/// The HIP major versions oxccl has bindings for.
pub const SUPPORTED_MAJORS: &[i32] = &[5, 6, 7];

/// A device attribute oxccl reads (`hipDeviceAttribute_t`, numbered per generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    /// `hipDeviceAttributeComputeCapabilityMajor` (the gfx major, 9 on MI300X).
    ComputeCapabilityMajor,
    /// `hipDeviceAttributeComputeCapabilityMinor`.
    ComputeCapabilityMinor,
    /// `hipDeviceAttributeMultiprocessorCount` (compute units).
    MultiprocessorCount,
    /// `hipDeviceAttributeVirtualMemoryManagementSupported`.
    VirtualMemoryManagementSupported,
    /// `hipDeviceAttributeFineGrainSupport`.
    FineGrainSupport,
}

/// A pointer attribute oxccl reads (`hipPointer_attribute`, numbered per generation).
///
/// Only those ROCm answers: `HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE` and
/// `HIP_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES` exist in the headers but the runtime answers
/// `hipErrorNotSupported` for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerAttribute {
    /// `HIP_POINTER_ATTRIBUTE_MEMORY_TYPE`: a `hipMemoryType` (32 bits).
    MemoryType,
    /// `HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the device that allocated it (an `int`).
    DeviceOrdinal,
    /// `HIP_POINTER_ATTRIBUTE_BUFFER_ID`: the allocation's identity in the process (ROCm
    /// writes 32 bits, CUDA's counterpart 64).
    BufferId,
    /// `HIP_POINTER_ATTRIBUTE_IS_MANAGED`: a `bool` (one byte).
    IsManaged,
}

/// A copy direction (`hipMemcpyKind`, numbered per generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemcpyKind {
    /// `hipMemcpyHostToDevice`.
    HostToDevice,
    /// `hipMemcpyDeviceToHost`.
    DeviceToHost,
    /// `hipMemcpyDefault`: the runtime tells the directions apart by address.
    Default,
}

/// The numbering of one HIP ABI generation: every enum value and flag oxccl passes to the
/// runtime or compares its answers with.
#[derive(Debug)]
pub struct Abi {
    /// The major version (5, 6, 7).
    pub major: i32,
    /// The headers the bindings come from, e.g. "6.4".
    pub headers: &'static str,
    pub success: hipError_t,
    pub error_no_device: hipError_t,
    pub error_peer_access_already_enabled: hipError_t,
    pub error_not_found: hipError_t,
    pub error_invalid_value: hipError_t,
    pub attr_compute_capability_major: hipDeviceAttribute_t,
    pub attr_compute_capability_minor: hipDeviceAttribute_t,
    pub attr_multiprocessor_count: hipDeviceAttribute_t,
    pub attr_virtual_memory_management_supported: hipDeviceAttribute_t,
    pub attr_fine_grain_support: hipDeviceAttribute_t,
    pub memcpy_host_to_device: hipMemcpyKind,
    pub memcpy_device_to_host: hipMemcpyKind,
    pub memcpy_default: hipMemcpyKind,
    pub pointer_memory_type: hipPointer_attribute,
    pub pointer_device_ordinal: hipPointer_attribute,
    pub pointer_buffer_id: hipPointer_attribute,
    pub pointer_is_managed: hipPointer_attribute,
    pub memory_type_host: hipMemoryType,
    pub memory_type_device: hipMemoryType,
    pub capture_status_none: hipStreamCaptureStatus,
    pub allocation_type_pinned: hipMemAllocationType,
    pub handle_type_posix_fd: hipMemAllocationHandleType,
    pub location_type_device: hipMemLocationType,
    pub access_read_write: hipMemAccessFlags,
    pub granularity_minimum: hipMemAllocationGranularity_flags,
    pub ipc_lazy_enable_peer_access: c_uint,
    pub stream_non_blocking: c_uint,
    pub event_default: c_uint,
    pub host_malloc_portable: c_uint,
    pub host_malloc_mapped: c_uint,
    pub host_malloc_coherent: c_uint,
    pub device_malloc_uncached: c_uint,
}

/// The [`Abi`] of generation module `$m`, its values carried into the neutral types. A
/// value whose representation differs between generations fails to compile here.
macro_rules! abi_of {
    ($m:ident, $headers:expr) => {
        Abi {
            major: $m::HIP_VERSION_MAJOR as i32,
            headers: $headers,
            success: hipError_t($m::hipError_t::hipSuccess.0),
            error_no_device: hipError_t($m::hipError_t::hipErrorNoDevice.0),
            error_peer_access_already_enabled: hipError_t(
                $m::hipError_t::hipErrorPeerAccessAlreadyEnabled.0,
            ),
            error_not_found: hipError_t($m::hipError_t::hipErrorNotFound.0),
            error_invalid_value: hipError_t($m::hipError_t::hipErrorInvalidValue.0),
            attr_compute_capability_major: hipDeviceAttribute_t(
                $m::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMajor.0,
            ),
            attr_compute_capability_minor: hipDeviceAttribute_t(
                $m::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMinor.0,
            ),
            attr_multiprocessor_count: hipDeviceAttribute_t(
                $m::hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount.0,
            ),
            attr_virtual_memory_management_supported: hipDeviceAttribute_t(
                $m::hipDeviceAttribute_t::hipDeviceAttributeVirtualMemoryManagementSupported.0,
            ),
            attr_fine_grain_support: hipDeviceAttribute_t(
                $m::hipDeviceAttribute_t::hipDeviceAttributeFineGrainSupport.0,
            ),
            memcpy_host_to_device: hipMemcpyKind($m::hipMemcpyKind::hipMemcpyHostToDevice.0),
            memcpy_device_to_host: hipMemcpyKind($m::hipMemcpyKind::hipMemcpyDeviceToHost.0),
            memcpy_default: hipMemcpyKind($m::hipMemcpyKind::hipMemcpyDefault.0),
            pointer_memory_type: hipPointer_attribute(
                $m::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_MEMORY_TYPE.0,
            ),
            pointer_device_ordinal: hipPointer_attribute(
                $m::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL.0,
            ),
            pointer_buffer_id: hipPointer_attribute(
                $m::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_BUFFER_ID.0,
            ),
            pointer_is_managed: hipPointer_attribute(
                $m::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_IS_MANAGED.0,
            ),
            memory_type_host: hipMemoryType($m::hipMemoryType::hipMemoryTypeHost.0),
            memory_type_device: hipMemoryType($m::hipMemoryType::hipMemoryTypeDevice.0),
            capture_status_none: hipStreamCaptureStatus(
                $m::hipStreamCaptureStatus::hipStreamCaptureStatusNone.0,
            ),
            allocation_type_pinned: hipMemAllocationType(
                $m::hipMemAllocationType::hipMemAllocationTypePinned.0,
            ),
            handle_type_posix_fd: hipMemAllocationHandleType(
                $m::hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor.0,
            ),
            location_type_device: hipMemLocationType(
                $m::hipMemLocationType::hipMemLocationTypeDevice.0,
            ),
            access_read_write: hipMemAccessFlags(
                $m::hipMemAccessFlags::hipMemAccessFlagsProtReadWrite.0,
            ),
            granularity_minimum: hipMemAllocationGranularity_flags(
                $m::hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum.0,
            ),
            ipc_lazy_enable_peer_access: $m::hipIpcMemLazyEnablePeerAccess,
            stream_non_blocking: $m::hipStreamNonBlocking,
            event_default: $m::hipEventDefault,
            host_malloc_portable: $m::hipHostMallocPortable,
            host_malloc_mapped: $m::hipHostMallocMapped,
            host_malloc_coherent: $m::hipHostMallocCoherent,
            device_malloc_uncached: $m::hipDeviceMallocUncached,
        }
    };
}

static V5: Abi = abi_of!(v5, "5.7");
static V6: Abi = abi_of!(v6, "6.4");
static V7: Abi = abi_of!(v7, "7.2");

impl Abi {
    /// The generation of a runtime reporting `version` (`hipRuntimeGetVersion`:
    /// major * 10,000,000 + minor * 100,000 + patch), or `None` outside
    /// [`SUPPORTED_MAJORS`].
    pub fn for_version(version: i32) -> Option<&'static Abi> {
        match version / 10_000_000 {
            5 => Some(&V5),
            6 => Some(&V6),
            7 => Some(&V7),
            _ => None,
        }
    }

    /// Every supported generation, oldest first.
    pub fn all() -> [&'static Abi; 3] {
        [&V5, &V6, &V7]
    }

    /// The generation's number for `a`.
    pub fn attribute(&self, a: Attribute) -> hipDeviceAttribute_t {
        match a {
            Attribute::ComputeCapabilityMajor => self.attr_compute_capability_major,
            Attribute::ComputeCapabilityMinor => self.attr_compute_capability_minor,
            Attribute::MultiprocessorCount => self.attr_multiprocessor_count,
            Attribute::VirtualMemoryManagementSupported => {
                self.attr_virtual_memory_management_supported
            }
            Attribute::FineGrainSupport => self.attr_fine_grain_support,
        }
    }

    /// The generation's number for `a`.
    pub fn pointer_attribute(&self, a: PointerAttribute) -> hipPointer_attribute {
        match a {
            PointerAttribute::MemoryType => self.pointer_memory_type,
            PointerAttribute::DeviceOrdinal => self.pointer_device_ordinal,
            PointerAttribute::BufferId => self.pointer_buffer_id,
            PointerAttribute::IsManaged => self.pointer_is_managed,
        }
    }

    /// The generation's number for `k`.
    pub fn memcpy_kind(&self, k: MemcpyKind) -> hipMemcpyKind {
        match k {
            MemcpyKind::HostToDevice => self.memcpy_host_to_device,
            MemcpyKind::DeviceToHost => self.memcpy_device_to_host,
            MemcpyKind::Default => self.memcpy_default,
        }
    }

    /// The properties of a pinned VMM allocation on `device`, exportable as a POSIX file
    /// descriptor, in this generation's numbering.
    pub fn vmm_allocation_prop(&self, device: i32) -> hipMemAllocationProp {
        let mut prop = hipMemAllocationProp {
            type_: self.allocation_type_pinned,
            location: hipMemLocation {
                type_: self.location_type_device,
                id: device,
            },
            ..Default::default()
        };
        // 7.x made the field a union of the one-type and the many-types view; both are the
        // same 32-bit value at the offset 5.x and 6.x call `requestedHandleType`.
        prop.__bindgen_anon_1.requestedHandleType = self.handle_type_posix_fd;
        prop
    }

    /// `hipMemAccessDesc` giving `device` read/write access.
    pub fn read_write_access(&self, device: i32) -> hipMemAccessDesc {
        hipMemAccessDesc {
            location: hipMemLocation {
                type_: self.location_type_device,
                id: device,
            },
            flags: self.access_read_write,
        }
    }
}

/// Asserts at compile time that `$t` has the neutral type's size and alignment in every
/// generation, and the same offsets for the listed fields.
macro_rules! same_layout {
    ($t:ident { $($field:ident),* }) => {
        const _: () = {
            assert!(size_of::<v5::$t>() == size_of::<$t>() && align_of::<v5::$t>() == align_of::<$t>());
            assert!(size_of::<v6::$t>() == size_of::<$t>() && align_of::<v6::$t>() == align_of::<$t>());
            $(
                assert!(offset_of!(v5::$t, $field) == offset_of!($t, $field));
                assert!(offset_of!(v6::$t, $field) == offset_of!($t, $field));
            )*
        };
    };
}

same_layout!(hipIpcMemHandle_t { reserved });
same_layout!(hipMemLocation { type_, id });
same_layout!(hipMemAccessDesc { location, flags });
same_layout!(hipMemAllocationProp {
    type_,
    location,
    win32HandleMetaData,
    allocFlags
});
// `requestedHandleType`: a plain field in 5.x/6.x, a union member in 7.x, at one offset.
const _: () = {
    let neutral = offset_of!(hipMemAllocationProp, __bindgen_anon_1);
    assert!(offset_of!(v5::hipMemAllocationProp, requestedHandleType) == neutral);
    assert!(offset_of!(v6::hipMemAllocationProp, requestedHandleType) == neutral);
    assert!(size_of::<hipMemAllocationHandleType>() == size_of::<v5::hipMemAllocationHandleType>());
};
