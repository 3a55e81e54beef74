//! Host reference of every element format: encode from f32, decode to f32, bit for bit what
//! the device code does.
//!
//! Each format is its own module with `encode(f32) -> bits` and `decode(bits) -> f32`.
//! [`encode`] and [`decode`] dispatch on a [`DataType`] through the element's bit pattern
//! held in a `u32`, which is how the self-test and the reduction reference move elements
//! around. The rules (rounding, special values) are written down in `docs/number-formats.md`.

pub mod bf16;
pub mod e4m3b15;
pub mod f16;
pub mod fp8;

use oxccl_hal::DataType;

/// Decodes one element of `dtype`, given as its bit pattern in the low bits of `bits`.
pub fn decode(dtype: DataType, bits: u32) -> f32 {
    // Only the element's own bits count: upper bits are ignored, as the device does when it
    // reads an element of that size.
    match dtype {
        DataType::F32 => f32::from_bits(bits),
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
pub fn encode(dtype: DataType, x: f32) -> u32 {
    match dtype {
        DataType::F32 => x.to_bits(),
        DataType::F16 => u32::from(f16::encode(x)),
        DataType::Bf16 => u32::from(bf16::encode(x)),
        DataType::Fp8E4m3 => u32::from(fp8::E4M3.encode(x)),
        DataType::Fp8E5m2 => u32::from(fp8::E5M2.encode(x)),
        DataType::Fp8E4m3Fnuz => u32::from(fp8::E4M3_FNUZ.encode(x)),
        DataType::Fp8E5m2Fnuz => u32::from(fp8::E5M2_FNUZ.encode(x)),
        DataType::Fp8E4m3b15 => u32::from(e4m3b15::encode(x)),
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
pub fn same_bits(dtype: DataType, a: u32, b: u32) -> bool {
    let mask = match dtype.size() {
        1 => 0xff,
        2 => 0xffff,
        _ => u32::MAX,
    };
    (a & mask) == (b & mask) || (decode(dtype, a).is_nan() && decode(dtype, b).is_nan())
}

/// Reads element `i` of `dtype` from a little-endian byte buffer, as a bit pattern.
///
/// Returns `None` when the buffer is too short.
pub fn read_element(dtype: DataType, bytes: &[u8], i: usize) -> Option<u32> {
    let size = dtype.size();
    let start = i.checked_mul(size)?;
    let chunk = bytes.get(start..start.checked_add(size)?)?;
    let mut word = [0u8; 4];
    word[..size].copy_from_slice(chunk);
    Some(u32::from_le_bytes(word))
}

/// Writes element `i` of `dtype` (a bit pattern) into a little-endian byte buffer.
///
/// Returns `None` when the buffer is too short.
pub fn write_element(dtype: DataType, bytes: &mut [u8], i: usize, bits: u32) -> Option<()> {
    let size = dtype.size();
    let start = i.checked_mul(size)?;
    let chunk = bytes.get_mut(start..start.checked_add(size)?)?;
    chunk.copy_from_slice(&bits.to_le_bytes()[..size]);
    Some(())
}
