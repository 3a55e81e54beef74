//! Host reference of the mixed-precision element-wise reduction.
//!
//! For each element: every input is widened to the accumulation type (decode to f32, then
//! round to the accumulation type), the inputs are combined in order
//! `((x0 op x1) op x2) ...`, each step rounded to the accumulation type, `Avg` divides the
//! sum by the number of inputs (rounded once more), and the result is rounded to the element
//! type once at the end. The device code (`reduce.hpp`) does the same, so results match bit
//! for bit.
//!
//! Rounding in an accumulation narrower than f32 is done as "compute in f32, round to the
//! narrow type": for f16, bf16 and fp8 that is exactly the correctly rounded operation
//! (f32 has more than twice their precision plus two bits, so the double rounding is
//! innocuous for +, *, /), which is also what native f16 instructions give.
//!
//! Integers and f64 ([`DataType::reduces_in_own_type`]) take none of that: each step is one
//! operation of the type itself (integer sums and products wrap, as NCCL's), `Avg` divides
//! the wrapped sum once (integers truncate toward zero, as NCCL's integer average), and
//! only the `Auto` and `Native` accumulation types are accepted for them.

use oxccl_hal::{AccumType, DataType, Error, ReduceOp, Result};

use crate::formats;

/// Where partial results live while reducing: the resolved form of an [`AccumType`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulator {
    /// IEEE binary32.
    F32,
    /// IEEE binary16: every step rounds to f16.
    F16,
    /// The element type itself: every step rounds to the element type.
    Element(DataType),
}

impl Accumulator {
    /// The accumulator `accum` means for elements of `dtype`.
    pub fn new(dtype: DataType, accum: AccumType) -> Accumulator {
        match accum.resolve(dtype) {
            AccumType::F32 => Accumulator::F32,
            AccumType::F16 => Accumulator::F16,
            AccumType::Native | AccumType::Auto => match dtype {
                DataType::F32 => Accumulator::F32,
                DataType::F16 => Accumulator::F16,
                other => Accumulator::Element(other),
            },
        }
    }

    /// Rounds an f32 to this accumulator's precision.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Accumulator::F32 => x,
            Accumulator::F16 => formats::f16::round(x),
            Accumulator::Element(dtype) => formats::round(dtype, x),
        }
    }

    /// One combining step, rounded to the accumulator (`Avg` combines as a sum).
    pub fn combine(self, op: ReduceOp, acc: f32, x: f32) -> f32 {
        self.round(apply(op, acc, x))
    }
}

/// `a op b` in f32, without rounding to anything narrower.
///
/// Min and max compare with `<` / `>` and keep `a` on ties and unordered inputs, so the
/// sign of equal zeros and a NaN in `a` are kept, and a NaN in `b` is ignored.
pub fn apply(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

/// Reduces one element: `inputs` are bit patterns of `dtype`; returns the result's bits.
///
/// An empty input list gives an error, and so does an accumulation type other than `Auto`
/// or `Native` for a type reduced in its own type.
pub fn reduce_element(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    inputs: &[u64],
) -> Result<u64> {
    let (first, rest) = inputs
        .split_first()
        .ok_or_else(|| Error::InvalidArgument("reduce of zero inputs".into()))?;
    if dtype.reduces_in_own_type() {
        if let Some(why) = accum.refusal(dtype) {
            return Err(Error::Unsupported(why));
        }
        let kind = OwnKind::of(dtype);
        let mut acc = *first;
        for &x in rest {
            acc = kind.apply(op, acc, x);
        }
        if op == ReduceOp::Avg {
            acc = kind.average(acc, inputs.len() as u64);
        }
        return Ok(acc & formats::mask(dtype));
    }
    let acc_kind = Accumulator::new(dtype, accum);
    let widen = |bits: u64| acc_kind.round(formats::decode(dtype, bits));
    let mut acc = widen(*first);
    for &x in rest {
        acc = acc_kind.combine(op, acc, widen(x));
    }
    if op == ReduceOp::Avg {
        acc = acc_kind.round(acc / inputs.len() as f32);
    }
    Ok(formats::encode(dtype, acc))
}

/// How the bits of a type reduced in its own type are read (the device's `OwnKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnKind {
    /// Two's complement integer of `bits` bits.
    Signed(u32),
    /// Unsigned integer of `bits` bits.
    Unsigned(u32),
    /// IEEE binary64.
    F64,
}

impl OwnKind {
    fn of(dtype: DataType) -> OwnKind {
        let bits = 8 * dtype.size() as u32;
        match dtype {
            DataType::F64 => OwnKind::F64,
            d if d.is_signed_integer() => OwnKind::Signed(bits),
            _ => OwnKind::Unsigned(bits),
        }
    }

    /// Sign-extends the low `bits` bits.
    fn signed(bits: u32, x: u64) -> i64 {
        let shift = 64 - bits;
        ((x << shift) as i64) >> shift
    }

    /// `a op b` in the type (bits in, bits out, upper bits unspecified); `Avg` combines as
    /// a sum. Min and max keep `a` on ties and, for f64, on unordered inputs.
    fn apply(self, op: ReduceOp, a: u64, b: u64) -> u64 {
        match self {
            OwnKind::F64 => {
                let (x, y) = (f64::from_bits(a), f64::from_bits(b));
                let r = match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => {
                        if y < x {
                            y
                        } else {
                            x
                        }
                    }
                    ReduceOp::Max => {
                        if y > x {
                            y
                        } else {
                            x
                        }
                    }
                };
                r.to_bits()
            }
            OwnKind::Signed(bits) | OwnKind::Unsigned(bits) => {
                // Wrapping sums and products of the low bits are the same for both.
                let key = |x: u64| match self {
                    OwnKind::Signed(_) => i128::from(OwnKind::signed(bits, x)),
                    _ => i128::from(x & (u64::MAX >> (64 - bits))),
                };
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => {
                        if key(b) < key(a) {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if key(b) > key(a) {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
        }
    }

    /// The average of `n` inputs from their sum: integers truncate toward zero.
    fn average(self, sum: u64, n: u64) -> u64 {
        match self {
            OwnKind::F64 => (f64::from_bits(sum) / n as f64).to_bits(),
            OwnKind::Signed(bits) => (OwnKind::signed(bits, sum) / n as i64) as u64,
            OwnKind::Unsigned(bits) => (sum & (u64::MAX >> (64 - bits))) / n,
        }
    }
}

/// Reduces `count` elements of `dtype` from each buffer in `inputs` (little-endian bytes)
/// into `output`.
pub fn reduce(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    inputs: &[&[u8]],
    output: &mut [u8],
    count: usize,
) -> Result<()> {
    let bytes = dtype.bytes(count)?;
    if inputs.is_empty() {
        return Err(Error::InvalidArgument("reduce of zero inputs".into()));
    }
    if inputs.iter().any(|b| b.len() < bytes) || output.len() < bytes {
        return Err(Error::InvalidArgument(format!(
            "reduce of {count} x {dtype}: a buffer is shorter than {bytes} bytes"
        )));
    }
    let mut elems = vec![0u64; inputs.len()];
    for i in 0..count {
        for (slot, input) in elems.iter_mut().zip(inputs) {
            *slot = formats::read_element(dtype, input, i).unwrap_or_default();
        }
        let r = reduce_element(dtype, op, accum, &elems)?;
        formats::write_element(dtype, output, i, r)
            .ok_or_else(|| Error::InvalidArgument("reduce output too short".into()))?;
    }
    Ok(())
}

/// PreMulSum's pre-multiply of one element (NCCL's `ncclRedOpCreatePreMulSum`: each rank
/// multiplies its own input by its own scalar before the sum): `scalar * x`, both bit
/// patterns of `dtype` (its own bits in the low bits), the result's bits.
///
/// Float formats decode both to f32, multiply and encode once (the product of two elements
/// of a format narrower than f32 is exact in f32, so this is the type's correctly rounded
/// product, rounded as [`formats::encode`] rounds every reduction's result); f64 multiplies
/// in f64; integers multiply in the type, wrapping. The device's `oxccl_scale`
/// (`src/device/scale.cu`) computes the same bits.
pub fn pre_multiply_element(dtype: DataType, scalar: u64, x: u64) -> u64 {
    match dtype {
        DataType::F64 => (f64::from_bits(x) * f64::from_bits(scalar)).to_bits(),
        // Two's complement: the low bits of the wrapping product are the same signed or
        // unsigned.
        d if d.reduces_in_own_type() => x.wrapping_mul(scalar) & formats::mask(d),
        d => formats::encode(d, formats::decode(d, x) * formats::decode(d, scalar)),
    }
}

/// [`pre_multiply_element`] of `count` elements of `dtype` from `input` into `output`
/// (little-endian bytes; they may be the same length but are separate slices).
pub fn pre_multiply(
    dtype: DataType,
    scalar: u64,
    input: &[u8],
    output: &mut [u8],
    count: usize,
) -> Result<()> {
    let bytes = dtype.bytes(count)?;
    if input.len() < bytes || output.len() < bytes {
        return Err(Error::InvalidArgument(format!(
            "pre-multiply of {count} x {dtype}: a buffer is shorter than {bytes} bytes"
        )));
    }
    for i in 0..count {
        let x = formats::read_element(dtype, input, i).unwrap_or_default();
        formats::write_element(dtype, output, i, pre_multiply_element(dtype, scalar, x))
            .ok_or_else(|| Error::InvalidArgument("pre-multiply output too short".into()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(dtype: DataType, x: f32) -> u64 {
        formats::encode(dtype, x)
    }

    fn own(dtype: DataType, op: ReduceOp, xs: &[i64]) -> i64 {
        let bits: Vec<u64> = xs
            .iter()
            .map(|&x| x as u64 & formats::mask(dtype))
            .collect();
        let r = reduce_element(dtype, op, AccumType::Auto, &bits).unwrap_or(u64::MAX);
        if dtype.is_signed_integer() {
            OwnKind::signed(8 * dtype.size() as u32, r)
        } else {
            r as i64
        }
    }

    #[test]
    fn integers_wrap_and_average_truncates_toward_zero() {
        use DataType::*;
        assert_eq!(own(I8, ReduceOp::Sum, &[100, 100]), -56);
        assert_eq!(own(U8, ReduceOp::Sum, &[200, 100]), 44);
        assert_eq!(own(I32, ReduceOp::Prod, &[1 << 20, 1 << 12]), 0);
        assert_eq!(
            own(I32, ReduceOp::Sum, &[i32::MAX as i64, 1]),
            i32::MIN as i64
        );
        assert_eq!(own(I64, ReduceOp::Sum, &[i64::MAX, 2]), i64::MIN + 1);
        assert_eq!(own(I8, ReduceOp::Min, &[5, -3, 7]), -3);
        assert_eq!(own(U8, ReduceOp::Min, &[5, 0xfd, 7]), 5);
        assert_eq!(own(I32, ReduceOp::Max, &[-5, -3, -7]), -3);
        assert_eq!(own(U32, ReduceOp::Max, &[5, 0xffff_fffd, 7]), 0xffff_fffd);
        assert_eq!(own(I32, ReduceOp::Avg, &[-7, 0, 0]), -2);
        assert_eq!(own(I32, ReduceOp::Avg, &[7, 0, 0]), 2);
        assert_eq!(own(I8, ReduceOp::Avg, &[-128, 0]), -64);
        assert_eq!(own(U64, ReduceOp::Avg, &[u64::MAX as i64, 1]), 0);
        assert_eq!(own(U64, ReduceOp::Min, &[-1, 3]), 3);
    }

    #[test]
    fn f64_reduces_in_f64() {
        let d = DataType::F64;
        let x = |v: f64| v.to_bits();
        // 2^60 + 1 is not an f32 (nor a sum rounded through one).
        let big = (1u64 << 60) as f64;
        let r = reduce_element(d, ReduceOp::Sum, AccumType::Auto, &[x(big), x(1.0)]).unwrap_or(0);
        assert_eq!(f64::from_bits(r), big + 1.0);
        let r = reduce_element(d, ReduceOp::Avg, AccumType::Native, &[x(1.0), x(2.0)]).unwrap_or(0);
        assert_eq!(f64::from_bits(r), 1.5);
        let r =
            reduce_element(d, ReduceOp::Min, AccumType::Auto, &[x(f64::NAN), x(1.0)]).unwrap_or(0);
        assert!(f64::from_bits(r).is_nan());
        let e = reduce_element(d, ReduceOp::Sum, AccumType::F32, &[x(1.0)]).unwrap_err();
        assert!(e.to_string().contains("own"), "{e}");
        assert!(reduce_element(DataType::I32, ReduceOp::Sum, AccumType::F16, &[1]).is_err());
    }

    #[test]
    fn accumulators_resolve_per_issue() {
        assert_eq!(
            Accumulator::new(DataType::Fp8E4m3b15, AccumType::Auto),
            Accumulator::F32
        );
        assert_eq!(
            Accumulator::new(DataType::Fp8E4m3, AccumType::Auto),
            Accumulator::F16
        );
        assert_eq!(
            Accumulator::new(DataType::Fp8E5m2Fnuz, AccumType::Auto),
            Accumulator::F16
        );
        assert_eq!(
            Accumulator::new(DataType::Bf16, AccumType::Auto),
            Accumulator::Element(DataType::Bf16)
        );
        assert_eq!(
            Accumulator::new(DataType::F16, AccumType::Native),
            Accumulator::F16
        );
        assert_eq!(
            Accumulator::new(DataType::F32, AccumType::F16),
            Accumulator::F16
        );
    }

    #[test]
    fn e4m3b15_sum_rounds_once_at_the_end() {
        // 0.5 + 0.5 + ... leaves the format's range at once; in f32 the partial sums are
        // exact, and the end result saturates only once.
        let d = DataType::Fp8E4m3b15;
        let x = e(d, 0.75);
        let y = e(d, -0.5);
        let r = reduce_element(d, ReduceOp::Sum, AccumType::Auto, &[x, x, y]).unwrap_or(0);
        assert_eq!(formats::decode(d, r), 1.0);
        // Native accumulation saturates after the first step: 1.875 - 0.5 = 1.375.
        let r = reduce_element(d, ReduceOp::Sum, AccumType::Native, &[x, x, x, y]).unwrap_or(0);
        assert_eq!(formats::decode(d, r), 1.375);
    }

    #[test]
    fn f16_accumulation_rounds_every_step() {
        let d = DataType::F32;
        let big = e(d, 2048.0);
        let one = e(d, 1.0);
        // In f16, 2048 + 1 = 2048 (ulp 2 at 2048, tie to even), twice.
        let r = reduce_element(d, ReduceOp::Sum, AccumType::F16, &[big, one, one]).unwrap_or(0);
        assert_eq!(f32::from_bits(r as u32), 2048.0);
        let r = reduce_element(d, ReduceOp::Sum, AccumType::F32, &[big, one, one]).unwrap_or(0);
        assert_eq!(f32::from_bits(r as u32), 2050.0);
    }

    #[test]
    fn ops() {
        let d = DataType::Bf16;
        let xs = [e(d, 3.0), e(d, -2.0), e(d, 5.0)];
        let get = |op| formats::decode(d, reduce_element(d, op, AccumType::Auto, &xs).unwrap_or(0));
        assert_eq!(get(ReduceOp::Sum), 6.0);
        assert_eq!(get(ReduceOp::Prod), -30.0);
        assert_eq!(get(ReduceOp::Min), -2.0);
        assert_eq!(get(ReduceOp::Max), 5.0);
        assert_eq!(get(ReduceOp::Avg), 2.0);
        assert!(reduce_element(d, ReduceOp::Sum, AccumType::Auto, &[]).is_err());
    }

    #[test]
    fn buffers() {
        let d = DataType::F16;
        let a: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|&x| (e(d, x) as u16).to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.5f32, 0.25, -3.0]
            .iter()
            .flat_map(|&x| (e(d, x) as u16).to_le_bytes())
            .collect();
        let mut out = vec![0u8; 6];
        assert!(reduce(d, ReduceOp::Sum, AccumType::Auto, &[&a, &b], &mut out, 3).is_ok());
        let got: Vec<f32> = (0..3)
            .map(|i| formats::decode(d, formats::read_element(d, &out, i).unwrap_or(0)))
            .collect();
        assert_eq!(got, vec![1.5, 2.25, 0.0]);
        assert!(reduce(d, ReduceOp::Sum, AccumType::Auto, &[&a, &b], &mut out, 4).is_err());
    }

    #[test]
    fn pre_multiply_rounds_once_and_integers_wrap() {
        use DataType::*;
        let pm = |d, s: u64, x: u64| pre_multiply_element(d, s, x);
        // Integers: the product in the type, wrapping.
        assert_eq!(
            pm(I8, (-3i8) as u8 as u64, 50),
            (-150i32 as i8) as u8 as u64
        );
        assert_eq!(pm(U8, 16, 17), (16 * 17) & 0xff);
        assert_eq!(
            pm(I32, 3, i32::MAX as u32 as u64),
            (i32::MAX as u32).wrapping_mul(3) as u64
        );
        assert_eq!(pm(U64, u64::MAX, 2), u64::MAX - 1);
        // f64 multiplies in f64 (2^60 + 1 times 3 is no f32 product).
        let big = ((1u64 << 60) + 1) as f64;
        assert_eq!(
            f64::from_bits(pm(F64, 3f64.to_bits(), big.to_bits())),
            big * 3.0
        );
        // f16: 1025 * 3 = 3075 rounds to 3076 (ulp 2 in 2^11..2^12, the tie to even).
        let (a, b) = (e(F16, 1025.0), e(F16, 3.0));
        assert_eq!(formats::decode(F16, pm(F16, b, a)), 3076.0);
        // bf16 and fp8 saturate as encode does, the sign kept.
        let m = pm(Fp8E4m3, e(Fp8E4m3, -4.0), e(Fp8E4m3, 448.0));
        assert_eq!(formats::decode(Fp8E4m3, m), -448.0);
        assert_eq!(
            formats::decode(Bf16, pm(Bf16, e(Bf16, 0.5), e(Bf16, 3.0))),
            1.5
        );
        let mut out = vec![0u8; 4];
        assert!(pre_multiply(F16, b, &[0, 0x3c, 0, 0x40], &mut out, 2).is_ok());
        assert_eq!(out, [0, 0x42, 0, 0x46]); // 3.0, 6.0
        assert!(pre_multiply(F16, b, &[0; 2], &mut out, 2).is_err());
    }
}
