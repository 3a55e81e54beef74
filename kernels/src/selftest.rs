//! GPU self-test: runs the device number-format conversions, the mixed-precision
//! reduction and PreMulSum's pre-multiply (`oxccl_scale`) on random inputs and compares the
//! results bit for bit with the host reference ([`crate::formats`], [`crate::reduce`]).
//!
//! ```no_run
//! # fn demo<B: oxccl_hal::Backend>(device: &B::Device) -> oxccl_hal::Result<()> {
//! let report = oxccl_kernels::selftest::run::<B>(device, 42)?;
//! println!("{report}");
//! assert!(report.passed());
//! # Ok(()) }
//! ```
//!
//! NaN results compare equal whatever their payload (payloads are not part of any format's
//! contract); everything else must match exactly, including the sign of zero.

use std::fmt;

use oxccl_hal::{
    AccumType, Backend, BackendKind, DataType, Device, LaunchConfig, Memory, MemoryKind, Module,
    ReduceOp, Result, Stream,
};

use crate::abi::{self, KernelArgs};
use crate::{formats, module_image, reduce};

/// Element counts used for encode and reduce cases (not powers of two on purpose).
pub const SIZES: [usize; 4] = [1, 3, 1000, 12345];
/// Input counts cycled through by the reduce cases.
const INPUT_COUNTS: [usize; 5] = [2, 3, 8, 1, 5];
/// Byte value the outputs are filled with before every launch.
const POISON: u8 = 0xa5;
/// Mismatches kept in the report (the counts are always complete).
const KEEP_MISMATCHES: usize = 10;
/// Largest buffer any case uses: 65,536 decoded f32.
const BUFFER_BYTES: usize = 65536 * 4;
/// Every reduce kernel's name starts with this.
const REDUCE_KERNEL_PREFIX: &str = "oxccl_selftest_reduce_";

/// The reduce kernel of a data type: one per element format, one for the types reduced in
/// their own type (integers, f64). A kernel given a block of another type writes nothing.
/// One kernel per format keeps every gfx942 kernel one scratch-free function of a size the
/// backend compiles quickly (`src/device/selftest_kernels.cu`).
pub(crate) fn reduce_kernel(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "oxccl_selftest_reduce_f32",
        DataType::F16 => "oxccl_selftest_reduce_f16",
        DataType::Bf16 => "oxccl_selftest_reduce_bf16",
        DataType::Fp8E4m3 => "oxccl_selftest_reduce_fp8_e4m3",
        DataType::Fp8E5m2 => "oxccl_selftest_reduce_fp8_e5m2",
        DataType::Fp8E4m3Fnuz => "oxccl_selftest_reduce_fp8_e4m3_fnuz",
        DataType::Fp8E5m2Fnuz => "oxccl_selftest_reduce_fp8_e5m2_fnuz",
        DataType::Fp8E4m3b15 => "oxccl_selftest_reduce_fp8_e4m3b15",
        DataType::I8
        | DataType::U8
        | DataType::I32
        | DataType::U32
        | DataType::I64
        | DataType::U64
        | DataType::F64 => "oxccl_selftest_reduce_own_type",
    }
}

/// One line of the report: a kernel run and how many elements disagreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseResult {
    /// Kernel name.
    pub kernel: &'static str,
    /// Element type.
    pub dtype: DataType,
    /// Case details (op, accumulation, inputs).
    pub detail: String,
    /// Elements compared.
    pub elements: usize,
    /// Elements that differ from the host reference.
    pub mismatches: usize,
}

/// One element that differed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Kernel, type and details of the case.
    pub case: String,
    /// Element index.
    pub index: usize,
    /// Input bit patterns of the element (the f32 bits for encode).
    pub inputs: Vec<u64>,
    /// What the device produced (bits).
    pub got: u64,
    /// What the host reference says (bits).
    pub want: u64,
}

/// Outcome of [`run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfTestReport {
    /// The backend that ran the kernels.
    pub backend: BackendKind,
    /// The seed of the random inputs.
    pub seed: u64,
    /// Every case run.
    pub cases: Vec<CaseResult>,
    /// The first few mismatches.
    pub first_mismatches: Vec<Mismatch>,
}

impl SelfTestReport {
    /// Whether every element of every case matched.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.mismatches == 0)
    }

    /// Elements compared in all.
    pub fn elements(&self) -> usize {
        self.cases.iter().map(|c| c.elements).sum()
    }

    /// Mismatching elements in all.
    pub fn mismatches(&self) -> usize {
        self.cases.iter().map(|c| c.mismatches).sum()
    }
}

impl fmt::Display for SelfTestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "oxccl kernels self-test on {} (seed {})",
            self.backend, self.seed
        )?;
        writeln!(
            f,
            "{:<22} {:<13} {:<34} {:>9} {:>10}",
            "kernel", "dtype", "case", "elements", "mismatches"
        )?;
        // Decode and encode cases one line each; reduce cases summarised per data type.
        let mut reduce_rows: Vec<(&str, DataType, usize, usize, usize)> = Vec::new();
        for c in &self.cases {
            if c.kernel.starts_with(REDUCE_KERNEL_PREFIX) {
                match reduce_rows.iter_mut().find(|r| r.1 == c.dtype) {
                    Some(r) => {
                        r.2 += 1;
                        r.3 += c.elements;
                        r.4 += c.mismatches;
                    }
                    None => reduce_rows.push((c.kernel, c.dtype, 1, c.elements, c.mismatches)),
                }
            } else {
                writeln!(
                    f,
                    "{:<22} {:<13} {:<34} {:>9} {:>10}",
                    c.kernel,
                    c.dtype.to_string(),
                    c.detail,
                    c.elements,
                    c.mismatches
                )?;
            }
        }
        for (kernel, dtype, cases, elements, mismatches) in reduce_rows {
            let detail = if dtype.reduces_in_own_type() {
                format!("{cases} cases: 5 ops, own type")
            } else {
                format!("{cases} cases: 5 ops x 4 accum types")
            };
            writeln!(
                f,
                "{:<22} {:<13} {:<34} {:>9} {:>10}",
                kernel,
                dtype.to_string(),
                detail,
                elements,
                mismatches
            )?;
        }
        writeln!(
            f,
            "{}: {} cases, {} elements, {} mismatches",
            if self.passed() { "PASSED" } else { "FAILED" },
            self.cases.len(),
            self.elements(),
            self.mismatches()
        )?;
        for m in &self.first_mismatches {
            let inputs: Vec<String> = m.inputs.iter().map(|b| format!("{b:#x}")).collect();
            writeln!(
                f,
                "  mismatch: {} [{}] inputs [{}]: got {:#x}, want {:#x}",
                m.case,
                m.index,
                inputs.join(", "),
                m.got,
                m.want
            )?;
        }
        Ok(())
    }
}

/// A small deterministic generator (splitmix64): reproducible inputs from the seed.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A random finite, non-zero element of `dtype` (bits).
    fn element(&mut self, dtype: DataType) -> u64 {
        loop {
            let bits = match dtype {
                // f32: exponents within 2^-20..2^20, so products of 8 stay finite.
                DataType::F32 => {
                    let e = 127 - 20 + self.below(41);
                    (self.next() & 0x807f_ffff) | (e << 23)
                }
                d => self.next() & formats::mask(d),
            };
            let v = formats::decode(dtype, bits);
            if v.is_finite() && v != 0.0 {
                return bits;
            }
        }
    }

    /// A random f32 to encode as `dtype`: representable values, exact midpoints between
    /// neighbours (ties), values near them, the whole range and beyond, and infinities.
    fn encode_input(&mut self, dtype: DataType) -> f32 {
        let a = self.element(dtype);
        let x = formats::decode(dtype, a);
        match self.below(6) {
            0 => x,
            1 | 2 => {
                // Midpoint to the neighbour away from zero (or the saturation bound).
                let next = formats::decode(dtype, a + 1);
                if next.is_finite() && next.abs() > x.abs() {
                    ((f64::from(x) + f64::from(next)) / 2.0) as f32
                } else {
                    x * 1.5
                }
            }
            3 => f32::from_bits(
                x.to_bits()
                    .wrapping_add(self.below(9) as u32)
                    .wrapping_sub(4),
            ),
            4 => {
                let scale = f32::from_bits(((self.below(80) as u32) + 87) << 23); // 2^-40..2^39
                let s = if self.next() & 1 == 0 { 1.0 } else { -1.0 };
                s * scale * (1.0 + (self.below(1 << 20) as f32) / (1u32 << 20) as f32)
            }
            _ => match self.below(3) {
                0 => f32::INFINITY,
                1 => f32::NEG_INFINITY,
                _ => -x,
            },
        }
    }
}

/// The buffers and kernels a run reuses.
struct Harness<'d, B: Backend> {
    stream: B::Stream,
    module: B::Module,
    inputs: Vec<B::Memory>,
    output: B::Memory,
    _device: &'d B::Device,
}

impl<B: Backend> Harness<'_, B> {
    fn launch<A: KernelArgs>(&self, name: &str, work: usize, args: &A) -> Result<()> {
        let kernel = self.module.kernel(name)?;
        // Fewer blocks than elements on purpose: the grid-stride loops get exercised.
        let blocks = work.div_ceil(256).clamp(1, 96) as u32;
        let config = LaunchConfig::linear(blocks, 256);
        // SAFETY: every pointer in `args` points into `self.inputs` / `self.output`, which
        // hold BUFFER_BYTES each (more than any case uses) and live until the stream is
        // synchronised below; the argument block is the one `name` takes.
        unsafe { self.stream.launch(&kernel, &config, args.as_bytes())? };
        self.stream.synchronize()
    }

    fn poison_output(&self) -> Result<()> {
        // SAFETY: the output allocation is live and BUFFER_BYTES long.
        unsafe { self.stream.fill(self.output.ptr(), POISON, BUFFER_BYTES)? };
        self.stream.synchronize()
    }

    fn read_output(&self, bytes: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; bytes];
        self.stream.read(self.output.ptr(), &mut v)?;
        Ok(v)
    }
}

/// Collects results and the first mismatches.
struct Collector {
    report: SelfTestReport,
}

impl Collector {
    fn case(
        &mut self,
        kernel: &'static str,
        dtype: DataType,
        detail: String,
        elements: usize,
        mut compare: impl FnMut(usize) -> Option<(u64, u64, Vec<u64>)>,
    ) {
        let mut mismatches = 0;
        for i in 0..elements {
            if let Some((got, want, inputs)) = compare(i) {
                mismatches += 1;
                if self.report.first_mismatches.len() < KEEP_MISMATCHES {
                    self.report.first_mismatches.push(Mismatch {
                        case: format!("{kernel} {dtype} {detail}"),
                        index: i,
                        inputs,
                        got,
                        want,
                    });
                }
            }
        }
        self.report.cases.push(CaseResult {
            kernel,
            dtype,
            detail,
            elements,
            mismatches,
        });
    }
}

/// Runs the self-test kernels of `B` on `device` with inputs drawn from `seed`.
///
/// Loads [`module_image`] of the device's backend (an error when the crate was built without that
/// backend's feature), then for each data type: decodes every code (fp8: 256, 16-bit
/// types: 65,536), encodes random inputs of [`SIZES`] elements, and reduces random inputs
/// with every op and accumulation type. Outputs are poisoned before every launch. Returns
/// the report; mismatches are not an `Err` (check [`SelfTestReport::passed`]).
pub fn run<B: Backend>(device: &B::Device, seed: u64) -> Result<SelfTestReport> {
    let image = module_image(device.backend())?;
    let module = device.load_module(&image)?;
    let stream = device.create_stream()?;
    let inputs = (0..abi::OXCCL_SELFTEST_MAX_INPUTS)
        .map(|_| device.alloc(BUFFER_BYTES, MemoryKind::Plain))
        .collect::<Result<Vec<_>>>()?;
    let output = device.alloc(BUFFER_BYTES, MemoryKind::Plain)?;
    let h = Harness::<B> {
        stream,
        module,
        inputs,
        output,
        _device: device,
    };
    let mut rng = Rng(seed);
    let mut out = Collector {
        report: SelfTestReport {
            backend: device.backend(),
            seed,
            cases: Vec::new(),
            first_mismatches: Vec::new(),
        },
    };
    for (k, dtype) in DataType::ALL.into_iter().enumerate() {
        // PreMulSum's pre-multiply: a scalar given by value, out of place, and one read
        // from device memory, in place.
        scale_case(&h, &mut out, &mut rng, dtype, SIZES[k % SIZES.len()], false)?;
        scale_case(
            &h,
            &mut out,
            &mut rng,
            dtype,
            SIZES[(k + 2) % SIZES.len()],
            true,
        )?;
        // Integers and f64 have no f32 format to decode or encode: only their reduction.
        if dtype.reduces_in_own_type() {
            for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
                let count = SIZES[k % SIZES.len()];
                let inputs = INPUT_COUNTS[k % INPUT_COUNTS.len()];
                reduce_case(
                    &h,
                    &mut out,
                    &mut rng,
                    dtype,
                    op,
                    AccumType::Auto,
                    count,
                    inputs,
                )?;
            }
            continue;
        }
        if dtype != DataType::F32 {
            decode_case(&h, &mut out, dtype)?;
        }
        for (i, &n) in SIZES.iter().enumerate() {
            if dtype != DataType::F32 || i == 0 {
                encode_case(&h, &mut out, &mut rng, dtype, n)?;
            }
        }
        let mut k = 0;
        for op in ReduceOp::ALL {
            for accum in [
                AccumType::Auto,
                AccumType::Native,
                AccumType::F16,
                AccumType::F32,
            ] {
                let count = SIZES[k % SIZES.len()];
                let inputs = INPUT_COUNTS[k % INPUT_COUNTS.len()];
                reduce_case(&h, &mut out, &mut rng, dtype, op, accum, count, inputs)?;
                k += 1;
            }
        }
    }
    Ok(out.report)
}

fn decode_case<B: Backend>(h: &Harness<'_, B>, out: &mut Collector, dtype: DataType) -> Result<()> {
    let count = 1usize << (8 * dtype.size()).min(16);
    let mut input = vec![0u8; dtype.bytes(count)?];
    for code in 0..count {
        formats::write_element(dtype, &mut input, code, code as u64);
    }
    h.stream.write(h.inputs[0].ptr(), &input)?;
    h.poison_output()?;
    let args = abi::OxcclSelftestDecodeArgs {
        input: abi::ptr(h.inputs[0].ptr()),
        output: abi::ptr(h.output.ptr()),
        count: count as u64,
        dtype: dtype.code(),
        _pad0: 0,
    };
    h.launch("oxccl_selftest_decode", count, &args)?;
    let got = h.read_output(count * 4)?;
    out.case(
        "oxccl_selftest_decode",
        dtype,
        "every code".into(),
        count,
        |i| {
            let g = formats::read_element(DataType::F32, &got, i).unwrap_or_default();
            let want = formats::decode(dtype, i as u64);
            (!formats::same_value(f32::from_bits(g as u32), want))
                .then(|| (g, u64::from(want.to_bits()), vec![i as u64]))
        },
    );
    Ok(())
}

fn encode_case<B: Backend>(
    h: &Harness<'_, B>,
    out: &mut Collector,
    rng: &mut Rng,
    dtype: DataType,
    count: usize,
) -> Result<()> {
    let xs: Vec<f32> = (0..count).map(|_| rng.encode_input(dtype)).collect();
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    h.stream.write(h.inputs[0].ptr(), &bytes)?;
    h.poison_output()?;
    let args = abi::OxcclSelftestEncodeArgs {
        input: abi::ptr(h.inputs[0].ptr()),
        output: abi::ptr(h.output.ptr()),
        count: count as u64,
        dtype: dtype.code(),
        _pad0: 0,
    };
    h.launch("oxccl_selftest_encode", count, &args)?;
    let got = h.read_output(dtype.bytes(count)?)?;
    out.case(
        "oxccl_selftest_encode",
        dtype,
        format!("{count} random f32"),
        count,
        |i| {
            let g = formats::read_element(dtype, &got, i).unwrap_or_default();
            let want = formats::encode(dtype, xs[i]);
            (!formats::same_bits(dtype, g, want))
                .then(|| (g, want, vec![u64::from(xs[i].to_bits())]))
        },
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn reduce_case<B: Backend>(
    h: &Harness<'_, B>,
    out: &mut Collector,
    rng: &mut Rng,
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    count: usize,
    num_inputs: usize,
) -> Result<()> {
    let len = dtype.bytes(count)?;
    let mut host_inputs = Vec::with_capacity(num_inputs);
    let mut ptrs = [std::ptr::null::<std::ffi::c_void>(); abi::OXCCL_SELFTEST_MAX_INPUTS as usize];
    for (k, slot) in ptrs.iter_mut().enumerate().take(num_inputs) {
        let mut buf = vec![0u8; len];
        for i in 0..count {
            formats::write_element(dtype, &mut buf, i, rng.element(dtype));
        }
        h.stream.write(h.inputs[k].ptr(), &buf)?;
        *slot = abi::ptr::<std::ffi::c_void>(h.inputs[k].ptr()).cast_const();
        host_inputs.push(buf);
    }
    h.poison_output()?;
    let args = abi::OxcclSelftestReduceArgs {
        inputs: ptrs,
        output: abi::ptr(h.output.ptr()),
        count: count as u64,
        num_inputs: num_inputs as u32,
        dtype: dtype.code(),
        op: op.code(),
        accum: accum.code(),
    };
    let kernel = reduce_kernel(dtype);
    h.launch(kernel, count, &args)?;
    let got = h.read_output(len)?;
    let refs: Vec<&[u8]> = host_inputs.iter().map(Vec::as_slice).collect();
    let mut want = vec![0u8; len];
    reduce::reduce(dtype, op, accum, &refs, &mut want, count)?;
    let detail = format!("{op} accum={accum} x{num_inputs} n={count}");
    out.case(kernel, dtype, detail, count, |i| {
        let g = formats::read_element(dtype, &got, i).unwrap_or_default();
        let w = formats::read_element(dtype, &want, i).unwrap_or_default();
        (!formats::same_bits(dtype, g, w)).then(|| {
            let ins = refs
                .iter()
                .map(|b| formats::read_element(dtype, b, i).unwrap_or_default())
                .collect();
            (g, w, ins)
        })
    });
    Ok(())
}

/// One `oxccl_scale` case: `count` random elements times a random scalar of `dtype`; with
/// `device_scalar` the scalar is read from device memory and the call is in place.
fn scale_case<B: Backend>(
    h: &Harness<'_, B>,
    out: &mut Collector,
    rng: &mut Rng,
    dtype: DataType,
    count: usize,
    device_scalar: bool,
) -> Result<()> {
    let len = dtype.bytes(count)?;
    let mut input = vec![0u8; len];
    for i in 0..count {
        formats::write_element(dtype, &mut input, i, rng.element(dtype));
    }
    let scalar = rng.element(dtype);
    h.poison_output()?;
    let target = if device_scalar {
        &h.output
    } else {
        &h.inputs[0]
    };
    let (src, dst) = if device_scalar {
        (h.output.ptr(), h.output.ptr())
    } else {
        (h.inputs[0].ptr(), h.output.ptr())
    };
    h.stream.write(target.ptr(), &input)?;
    let mut scalar_ptr = std::ptr::null();
    if device_scalar {
        let mut bytes = vec![0u8; dtype.size()];
        formats::write_element(dtype, &mut bytes, 0, scalar);
        h.stream.write(h.inputs[1].ptr(), &bytes)?;
        scalar_ptr = abi::ptr::<std::ffi::c_void>(h.inputs[1].ptr()).cast_const();
    }
    let args = abi::OxcclScaleArgs {
        input: abi::ptr::<std::ffi::c_void>(src).cast_const(),
        output: abi::ptr(dst),
        scalar: scalar_ptr,
        scalar_bits: if device_scalar { 0 } else { scalar },
        count: count as u64,
        dtype: dtype.code(),
        _pad0: 0,
    };
    h.launch("oxccl_scale", count, &args)?;
    let got = h.read_output(len)?;
    let mut want = vec![0u8; len];
    reduce::pre_multiply(dtype, scalar, &input, &mut want, count)?;
    let detail = format!(
        "scalar {scalar:#x} ({}) n={count}",
        if device_scalar {
            "device, in place"
        } else {
            "value"
        }
    );
    out.case("oxccl_scale", dtype, detail, count, |i| {
        let g = formats::read_element(dtype, &got, i).unwrap_or_default();
        let w = formats::read_element(dtype, &want, i).unwrap_or_default();
        (!formats::same_bits(dtype, g, w)).then(|| {
            let x = formats::read_element(dtype, &input, i).unwrap_or_default();
            (g, w, vec![x, scalar])
        })
    });
    Ok(())
}
