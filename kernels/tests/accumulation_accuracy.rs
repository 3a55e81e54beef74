//! Measures, not assumes, that wider accumulation is never less accurate than native
//! accumulation: sums of 2..=8 random inputs per element (the allreduce's rank counts),
//! each result compared with the exact sum (f64) rounded to the element type.
//!
//! For the fp8 types the f32 accumulator holds every partial sum exactly, so its result is
//! the correctly rounded exact sum and no element may be further from it than the native
//! result; for f16/bf16 the means and maxima are compared. The table printed with
//! `--nocapture` is the one quoted in docs/number-formats.md.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use oxccl_hal::{AccumType, DataType, ReduceOp};
use oxccl_kernels::{formats, reduce};

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Finite, non-zero values in [-4, 4] of `dtype`, as bits.
    fn value(&mut self, dtype: DataType) -> u64 {
        loop {
            let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
            let x = ((u * 8.0 - 4.0) as f32).clamp(-4.0, 4.0);
            let bits = formats::encode(dtype, x);
            let back = formats::decode(dtype, bits);
            if back.is_finite() && back != 0.0 {
                return bits;
            }
        }
    }
}

struct Errors {
    mean: f64,
    max: f64,
}

fn errors(dtype: DataType, accum: AccumType, cases: &[Vec<u64>]) -> (Errors, Vec<f64>) {
    let mut per = Vec::with_capacity(cases.len());
    for inputs in cases {
        let exact: f64 = inputs
            .iter()
            .map(|&b| f64::from(formats::decode(dtype, b)))
            .sum();
        let bits = reduce::reduce_element(dtype, ReduceOp::Sum, accum, inputs).unwrap();
        let got = f64::from(formats::decode(dtype, bits));
        // Saturating formats clamp; compare against the exact sum itself (the ideal result).
        per.push(if got.is_finite() {
            (got - exact).abs()
        } else {
            f64::INFINITY
        });
    }
    let finite: Vec<f64> = per.iter().copied().filter(|e| e.is_finite()).collect();
    let mean = finite.iter().sum::<f64>() / finite.len().max(1) as f64;
    let max = per.iter().copied().fold(0.0, f64::max);
    (Errors { mean, max }, per)
}

#[test]
fn wider_accumulation_is_never_less_accurate() {
    let types = [
        (DataType::Fp8E4m3, AccumType::F32, true),
        (DataType::Fp8E5m2, AccumType::F32, true),
        (DataType::Fp8E4m3Fnuz, AccumType::F32, true),
        (DataType::Fp8E5m2Fnuz, AccumType::F32, true),
        (DataType::Fp8E4m3b15, AccumType::F32, true),
        (DataType::Fp8E4m3, AccumType::F16, false),
        (DataType::Fp8E4m3b15, AccumType::F16, false),
        (DataType::F16, AccumType::F32, false),
        (DataType::Bf16, AccumType::F32, false),
    ];
    println!("dtype          wide  ranks  mean err native  mean err wide  max native  max wide");
    for (dtype, wide, exact_in_f32) in types {
        for ranks in [2usize, 4, 8] {
            let mut rng =
                Rng(0x9e37_79b9_7f4a_7c15 ^ (ranks as u64) ^ u64::from(dtype.code()) << 8);
            let cases: Vec<Vec<u64>> = (0..20_000)
                .map(|_| (0..ranks).map(|_| rng.value(dtype)).collect())
                .collect();
            let (native, per_native) = errors(dtype, AccumType::Native, &cases);
            let (w, per_wide) = errors(dtype, wide, &cases);
            println!(
                "{:<14} {:<5} {:>5}  {:>15.3e}  {:>13.3e}  {:>10.3e}  {:>8.3e}",
                dtype.to_string(),
                format!("{wide}"),
                ranks,
                native.mean,
                w.mean,
                native.max,
                w.max
            );
            assert!(w.mean <= native.mean, "{dtype} {wide} x{ranks}: mean");
            assert!(w.max <= native.max, "{dtype} {wide} x{ranks}: max");
            if exact_in_f32 {
                for (i, (a, b)) in per_wide.iter().zip(&per_native).enumerate() {
                    assert!(a <= b, "{dtype} x{ranks} case {i}: wide {a} > native {b}");
                }
            }
            // With two ranks both round one exact sum once; from three on, native
            // accumulation rounds every partial sum and measurably loses accuracy (the
            // comparison above would be vacuous otherwise).
            if ranks > 2 {
                assert!(
                    native.mean > w.mean,
                    "{dtype} {wide} x{ranks}: no difference"
                );
            } else {
                assert_eq!(native.mean, w.mean, "{dtype} {wide} x2");
            }
        }
    }
}
