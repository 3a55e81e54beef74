//! Host reference of every element format: encode from f32, decode to f32, bit for bit what
//! the device code does.
//!
//! Each format is its own module with `encode(f32) -> bits` and `decode(bits) -> f32`.
//! [`encode`] and [`decode`] dispatch on a [`DataType`] through the element's bit pattern
//! held in a `u64`, which is how the self-test and the reduction reference move elements
//! around. The rules (rounding, special values) are written down in `docs/number-formats.md`.
//!
//! The types reduced in their own type (integers, f64) have no f32 format: for them
//! [`decode`] is the value converted to f32 and [`encode`] the f32 converted to the type
//! (saturating, NaN to 0), which is all tests and patterns need of them; their reductions
//! never go through f32 (`crate::reduce`).

pub mod bf16;
pub mod e4m3b15;
pub mod f16;
pub mod fp8;

use oxccl_hal::DataType;

/// Decodes one element of `dtype`, given as its bit pattern in the low bits of `bits`.
pub fn decode(dtype: DataType, bits: u64) -> f32 {
    // Only the element's own bits count: upper bits are ignored, as the device does when it
    // reads an element of that size.
    match dtype {
        DataType::F32 => f32::from_bits(bits as u32),
        DataType::I8 => f32::from(bits as u8 as i8),
        DataType::U8 => f32::from(bits as u8),
        DataType::I32 => bits as u32 as i32 as f32,
        DataType::U32 => bits as u32 as f32,
        DataType::I64 => bits as i64 as f32,
        DataType::U64 => bits as f32,
        DataType::F64 => f64::from_bits(bits) as f32,
        DataType::F16 => f16::decode(bits as u16),
        DataType::Bf16 => bf16::decode(bits as u16),
        DataType::Fp8E4m3 => fp8::E4M3.decode(bits as u8),
        DataType::Fp8E5m2 => fp8::E5M2.decode(bits as u8),
        DataType::Fp8E4m3Fnuz => fp8::E4M3_FNUZ.decode(bits as u8),
        DataType::Fp8E5m2Fnuz => fp8::E5M2_FNUZ.decode(bits as u8),
        DataType::Fp8E4m3b15 => e4m3b15::decode(bits as u8),
    }
}

/// Encodes `x` as `dtype`, returning the element's bit pattern in the low bits.
pub fn encode(dtype: DataType, x: f32) -> u64 {
    match dtype {
        DataType::F32 => u64::from(x.to_bits()),
        DataType::F16 => u64::from(f16::encode(x)),
        DataType::Bf16 => u64::from(bf16::encode(x)),
        DataType::Fp8E4m3 => u64::from(fp8::E4M3.encode(x)),
        DataType::Fp8E5m2 => u64::from(fp8::E5M2.encode(x)),
        DataType::Fp8E4m3Fnuz => u64::from(fp8::E4M3_FNUZ.encode(x)),
        DataType::Fp8E5m2Fnuz => u64::from(fp8::E5M2_FNUZ.encode(x)),
        DataType::Fp8E4m3b15 => u64::from(e4m3b15::encode(x)),
        DataType::I8 => u64::from(x as i8 as u8),
        DataType::U8 => u64::from(x as u8),
        DataType::I32 => u64::from(x as i32 as u32),
        DataType::U32 => u64::from(x as u32),
        DataType::I64 => x as i64 as u64,
        DataType::U64 => x as u64,
        DataType::F64 => f64::from(x).to_bits(),
    }
}

/// The mask of an element's own bits in its `u64` bit pattern.
pub fn mask(dtype: DataType) -> u64 {
    match dtype.size() {
        8 => u64::MAX,
        n => (1u64 << (8 * n)) - 1,
    }
}

/// Rounds `x` to the nearest value of `dtype` (encode, then decode).
pub fn round(dtype: DataType, x: f32) -> f32 {
    decode(dtype, encode(dtype, x))
}

/// Whether two decoded values are the same for comparison purposes: equal bit patterns, or
/// both NaN (NaN payloads are not part of any format's contract).
pub fn same_value(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Whether two encoded elements of `dtype` are the same: equal bits, or both NaN.
pub fn same_bits(dtype: DataType, a: u64, b: u64) -> bool {
    let mask = mask(dtype);
    (a & mask) == (b & mask) || (decode(dtype, a).is_nan() && decode(dtype, b).is_nan())
}

/// Reads element `i` of `dtype` from a little-endian byte buffer, as a bit pattern.
///
/// Returns `None` when the buffer is too short.
pub fn read_element(dtype: DataType, bytes: &[u8], i: usize) -> Option<u64> {
    let size = dtype.size();
    let start = i.checked_mul(size)?;
    let chunk = bytes.get(start..start.checked_add(size)?)?;
    let mut word = [0u8; 8];
    word[..size].copy_from_slice(chunk);
    Some(u64::from_le_bytes(word))
}

/// Writes element `i` of `dtype` (a bit pattern) into a little-endian byte buffer.
///
/// Returns `None` when the buffer is too short.
pub fn write_element(dtype: DataType, bytes: &mut [u8], i: usize, bits: u64) -> Option<()> {
    let size = dtype.size();
    let start = i.checked_mul(size)?;
    let chunk = bytes.get_mut(start..start.checked_add(size)?)?;
    chunk.copy_from_slice(&bits.to_le_bytes()[..size]);
    Some(())
}
