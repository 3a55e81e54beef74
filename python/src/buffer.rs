//! What a Python array is to oxccl: its address, element count, data type and device,
//! read from the protocols the array libraries share (no library is imported here):
//! numpy's `__array_interface__`, DLPack (`__dlpack__` / `__dlpack_device__`: torch, CuPy,
//! JAX, numpy) and `__cuda_array_interface__` (CuPy, Numba, torch except bf16), tried in
//! that order. Only C-contiguous arrays are taken (a strided view is refused, never copied).
//!
//! The Python package hands contiguous torch CUDA tensors over as a described array, a
//! tuple `(address, elements, data type code, CUDA device)` it reads with torch's own
//! accessors: the two DLPack calls per array cost more host time than the rest of an
//! eager call.

use std::ffi::{c_void, CStr};

use oxccl_collectives::hal::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

/// Where an array's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory (numpy, torch CPU tensors, pinned host memory).
    Host,
    /// Memory of CUDA device `n`.
    Cuda(i32),
    /// Memory of ROCm device `n`.
    Rocm(i32),
    /// Anything else DLPack names (by its device type code).
    Other(i32),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => write!(f, "host memory"),
            Place::Cuda(n) => write!(f, "cuda:{n}"),
            Place::Rocm(n) => write!(f, "rocm:{n}"),
            Place::Other(code) => write!(f, "DLPack device type {code}"),
        }
    }
}

/// A contiguous array as the collectives see it. The owner (the Python object) keeps the
/// memory alive; a `View` is only used while the call that made it holds the object.
#[derive(Debug, Clone, Copy)]
pub struct View {
    /// Address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Where the memory is.
    pub place: Place,
    /// The producer said the memory must not be written.
    pub readonly: bool,
}

impl View {
    /// Bytes the array spans.
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(self.dtype.size())
    }
}

/// Reads `obj`'s array description; `what` names the argument in errors
/// ("all_reduce: input").
pub fn view(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<View> {
    if let Ok(described) = obj.cast::<PyTuple>() {
        return described_view(described, what);
    }
    if let Ok(iface) = obj.getattr("__array_interface__") {
        return interface_view(&iface, Place::Host, what);
    }
    if obj.hasattr("__dlpack__")? && obj.hasattr("__dlpack_device__")? {
        return dlpack_view(obj, what);
    }
    match obj.getattr("__cuda_array_interface__") {
        // The interface does not name the device: -1, checked by the communicator's device
        // when the memory is used.
        Ok(iface) => interface_view(&iface, Place::Cuda(-1), what),
        Err(e) if obj.hasattr("__cuda_array_interface__").unwrap_or(false) => Err(e),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what}: a {} is not an array oxccl can use (it needs __array_interface__, \
             __dlpack__ or __cuda_array_interface__: numpy, torch, CuPy, ...)",
            obj.get_type().name()?
        ))),
    }
}

/// A described array: `(address, elements, data type code, CUDA device)`, the code being
/// [`DataType::code`] (`oxccl._oxccl.dtype_code`).
fn described_view(t: &Bound<'_, PyTuple>, what: &str) -> PyResult<View> {
    let (ptr, count, code, device): (u64, usize, u32, i32) = t.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: a tuple is taken only as (address, elements, data type code, CUDA \
             device), all integers"
        ))
    })?;
    let dtype = DataType::from_code(code)
        .map_err(|_| PyValueError::new_err(format!("{what}: {code} is not a data type code")))?;
    if device < 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: CUDA device {device} is not a device"
        )));
    }
    Ok(View {
        ptr,
        count,
        dtype,
        place: Place::Cuda(device),
        readonly: false,
    })
}

/// numpy's type strings (`<f4`), for the data types numpy and CUDA array interfaces have.
fn typestr_dtype(typestr: &str) -> Option<DataType> {
    let (order, kind) = typestr.split_at_checked(1)?;
    if !matches!(order, "<" | "|" | "=") {
        return None; // big-endian data
    }
    Some(match kind {
        "f2" => DataType::F16,
        "f4" => DataType::F32,
        "f8" => DataType::F64,
        "i1" => DataType::I8,
        "u1" => DataType::U8,
        "i4" => DataType::I32,
        "u4" => DataType::U32,
        "i8" => DataType::I64,
        "u8" => DataType::U64,
        _ => return None,
    })
}

/// Whether `strides` (in units of `unit`) describe a C-contiguous array of `shape`.
/// Dimensions of one element may have any stride (numpy and torch both give such).
fn c_contiguous(shape: &[i64], strides: &[i64], unit: i64) -> bool {
    let mut expect = unit;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(n);
    }
    true
}

fn element_count(shape: &[i64], what: &str) -> PyResult<usize> {
    shape.iter().try_fold(1usize, |acc, &n| {
        usize::try_from(n)
            .ok()
            .and_then(|n| acc.checked_mul(n))
            .ok_or_else(|| PyValueError::new_err(format!("{what}: bad shape {shape:?}")))
    })
}

/// `__array_interface__` / `__cuda_array_interface__` (the same dictionary layout).
fn interface_view(iface: &Bound<'_, PyAny>, place: Place, what: &str) -> PyResult<View> {
    let d = iface.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!("{what}: the array interface is not a dictionary"))
    })?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?.ok_or_else(|| {
            PyTypeError::new_err(format!("{what}: the array interface has no '{k}'"))
        })
    };
    let typestr: String = get("typestr")?.extract()?;
    let dtype = typestr_dtype(&typestr).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what}: data type '{typestr}' is not one oxccl serves (float16/32/64, \
             int8/32/64, uint8/32/64; bfloat16 and fp8 through DLPack)"
        ))
    })?;
    let shape: Vec<i64> = get("shape")?.extract()?;
    let data = get("data")?;
    if data.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{what}: the array has no data pointer (buffer-protocol arrays are not served)"
        )));
    }
    let (ptr, readonly): (u64, bool) = data.extract()?;
    let count = element_count(&shape, what)?;
    if let Some(strides) = d.get_item("strides")? {
        if !strides.is_none() {
            let strides: Vec<i64> = strides.extract()?;
            if !c_contiguous(&shape, &strides, dtype.size() as i64) {
                return Err(not_contiguous(what, &shape, &strides));
            }
        }
    }
    if d.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(PyValueError::new_err(format!(
            "{what}: masked arrays are not served"
        )));
    }
    Ok(View {
        ptr,
        count,
        dtype,
        place,
        readonly,
    })
}

fn not_contiguous(what: &str, shape: &[i64], strides: &[i64]) -> PyErr {
    PyValueError::new_err(format!(
        "{what}: the array is not contiguous (shape {shape:?}, strides {strides:?}); \
         pass a contiguous one (e.g. .contiguous() or numpy.ascontiguousarray)"
    ))
}

// DLPack's C structures (dlpack.h, ABI version 0 "dltensor" capsules).
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
const DL_ROCM: i32 = 10;
const DL_ROCM_HOST: i32 = 11;
const DL_CUDA_MANAGED: i32 = 13;

/// DLPack's (code, bits) to a data type.
fn dlpack_dtype(code: u8, bits: u8) -> Option<DataType> {
    Some(match (code, bits) {
        (0, 8) => DataType::I8,
        (0, 32) => DataType::I32,
        (0, 64) => DataType::I64,
        (1, 8) => DataType::U8,
        (1, 32) => DataType::U32,
        (1, 64) => DataType::U64,
        (2, 16) => DataType::F16,
        (2, 32) => DataType::F32,
        (2, 64) => DataType::F64,
        (4, 16) => DataType::Bf16,
        (10, 8) => DataType::Fp8E4m3,
        (11, 8) => DataType::Fp8E4m3Fnuz,
        (12, 8) => DataType::Fp8E5m2,
        (13, 8) => DataType::Fp8E5m2Fnuz,
        _ => return None,
    })
}

/// A DLPack device as a [`Place`].
fn place_of(device_type: i32, device_id: i32) -> Place {
    match device_type {
        DL_CPU | DL_CUDA_HOST | DL_ROCM_HOST => Place::Host,
        DL_CUDA | DL_CUDA_MANAGED => Place::Cuda(device_id),
        DL_ROCM => Place::Rocm(device_id),
        other => Place::Other(other),
    }
}

/// Where a DLPack producer's memory is, from `__dlpack_device__` alone, without exporting
/// it: torch refuses to export a tensor of another GPU than the current one (BufferError),
/// so the device is checked first. `None` for objects [`view`] does not read through
/// DLPack.
pub fn dlpack_place(obj: &Bound<'_, PyAny>) -> PyResult<Option<Place>> {
    if obj.is_instance_of::<PyTuple>()
        || obj.hasattr("__array_interface__")?
        || !(obj.hasattr("__dlpack__")? && obj.hasattr("__dlpack_device__")?)
    {
        return Ok(None);
    }
    let (dev_type, device_id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    Ok(Some(place_of(dev_type, device_id)))
}

fn dlpack_view(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<View> {
    let (dev_type, _device_id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    // On a GPU, stream -1 asks the producer not to synchronize anything: the call runs on
    // the stream the caller chose, and an event recorded here would break graph capture.
    // Host producers (numpy) take no stream at all.
    let capsule = if matches!(dev_type, DL_CPU | DL_CUDA_HOST | DL_ROCM_HOST) {
        obj.call_method0("__dlpack__")?
    } else {
        let kwargs = PyDict::new(obj.py());
        kwargs.set_item("stream", -1)?;
        obj.call_method("__dlpack__", PyTuple::empty(obj.py()), Some(&kwargs))?
    };
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!("{what}: __dlpack__ did not return a capsule"))
    })?;
    const NAME: &CStr = c"dltensor";
    let ptr = capsule.pointer_checked(Some(NAME)).map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: __dlpack__ returned a capsule that is not an unused 'dltensor'"
        ))
    })?;
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor, whose first member is the
    // DLTensor; it stays valid while the capsule lives (until the end of this function),
    // and the capsule is not consumed (renamed), so its destructor frees it as usual.
    let t = unsafe { &*ptr.cast::<DlTensor>().as_ptr() };
    let ndim = usize::try_from(t.ndim)
        .map_err(|_| PyValueError::new_err(format!("{what}: DLPack ndim {}", t.ndim)))?;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack: `shape` holds `ndim` int64 values for a tensor with ndim > 0.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    let dtype = (t.dtype.lanes == 1)
        .then(|| dlpack_dtype(t.dtype.code, t.dtype.bits))
        .flatten()
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what}: data type (DLPack code {}, {} bits, {} lanes) is not one oxccl \
                 serves (float16/32/64, bfloat16, fp8 e4m3/e5m2, int8/32/64, uint8/32/64)",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ))
        })?;
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: DLPack: non-null `strides` holds `ndim` int64 values (in elements).
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec();
        if !c_contiguous(&shape, &strides, 1) {
            return Err(not_contiguous(what, &shape, &strides));
        }
    }
    let place = place_of(t.device.device_type, t.device.device_id);
    Ok(View {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        count: element_count(&shape, what)?,
        dtype,
        place,
        readonly: false,
    })
}
