//! PreMulSum (NCCL's `ncclRedOpCreatePreMulSum`) on the host backend across ranks:
//! allreduce, reduce-scatter and reduce, every data type, a different scalar on every rank
//! given on the host or in (host-backend) device memory, counts that are not powers of two,
//! in and out of place, every root. Each output is poisoned first and compared bit for bit
//! with a reference computed here: every rank's input times its scalar, rounded to the type
//! (integers wrap), then the host reference sum in rank order; the inputs must stay as they
//! were (out of place).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use oxccl_collectives::algorithms::reduce_scatter::staged::REDUCESCATTER_STAGED;
use oxccl_collectives::backend::AnyMemory;
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Memory, MemoryKind, ReduceOp, Stream,
};
use oxccl_collectives::kernels::{formats, reduce};
use oxccl_collectives::{Algorithm, Collective, CommConfig, PreMul};

mod common;
use common::{accums, input, same_bits, threads_with, Rank};

fn threads(world: u32, forced: Option<Algorithm>, body: impl Fn(&Rank) + Send + Sync + 'static) {
    threads_with(
        world,
        move |_| CommConfig {
            timeout: Duration::from_secs(20),
            staging_bytes: 64 << 10, // small staging: large counts take several rounds
            forced: forced.into(),
            ..CommConfig::default()
        },
        body,
    );
}

const POISON: u8 = 0xa5;

/// The scalar of `rank` for a call (bits of `dtype`): never zero, different per rank,
/// negative on some.
fn scalar_of(dtype: DataType, rank: u32, salt: u64) -> u64 {
    let k = (rank as u64 + salt) % 5;
    if dtype.reduces_in_own_type() && dtype != DataType::F64 {
        // 3, -2, 7, 5, -1 (wrapping in the type).
        let v: i64 = [3, -2, 7, 5, -1][k as usize];
        return v as u64 & formats::mask(dtype);
    }
    let v = [0.5f64, -1.25, 3.0, -0.75, 1.5][k as usize];
    if dtype == DataType::F64 {
        return v.to_bits();
    }
    formats::encode(dtype, v as f32)
}

/// `scalar * x` for one element, computed here from the definition (not through the
/// kernels' reference): float formats in f32 rounded once to the type, f64 in f64, integers
/// wrapping in the type.
fn product(dtype: DataType, scalar: u64, x: u64) -> u64 {
    match dtype {
        DataType::F64 => (f64::from_bits(x) * f64::from_bits(scalar)).to_bits(),
        d if d.reduces_in_own_type() => {
            let bits = 8 * d.size() as u32;
            let wide = u128::from(x).wrapping_mul(u128::from(scalar));
            (wide & (u128::MAX >> (128 - bits))) as u64
        }
        d => formats::encode(d, formats::decode(d, x) * formats::decode(d, scalar)),
    }
}

/// Every rank's input times its scalar.
fn products(dtype: DataType, world: u32, elems: usize, salt: u64) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| {
            let x = input(dtype, r, elems, salt);
            let s = scalar_of(dtype, r, salt);
            let mut out = vec![0u8; x.len()];
            for i in 0..elems {
                let v = formats::read_element(dtype, &x, i).unwrap();
                formats::write_element(dtype, &mut out, i, product(dtype, s, v)).unwrap();
            }
            out
        })
        .collect()
}

/// The sum in rank order of `elems` elements starting at element `from` of every rank's
/// products.
fn sum(dtype: DataType, accum: AccumType, p: &[Vec<u8>], from: usize, elems: usize) -> Vec<u8> {
    let (a, b) = (
        dtype.bytes(from).unwrap(),
        dtype.bytes(from + elems).unwrap(),
    );
    let refs: Vec<&[u8]> = p.iter().map(|v| &v[a..b]).collect();
    let mut out = vec![0u8; b - a];
    reduce::reduce(dtype, ReduceOp::Sum, accum, &refs, &mut out, elems).unwrap();
    out
}

/// One call's shape.
#[derive(Debug, Clone, Copy)]
struct Case {
    collective: Collective,
    dtype: DataType,
    accum: AccumType,
    count: usize,
    in_place: bool,
    device_scalar: bool,
    root: u32,
    salt: u64,
}

/// Runs one PreMulSum call on this rank and checks it.
fn check(r: &Rank, c: Case) -> Result<(), String> {
    let (rank, world) = (r.comm.rank(), r.comm.world_size());
    let dev = r.comm.device();
    let dtype = c.dtype;
    let bytes = dtype.bytes(c.count).unwrap();
    let in_elems = match c.collective {
        Collective::ReduceScatter => c.count * world as usize,
        _ => c.count,
    };
    let in_bytes = dtype.bytes(in_elems).unwrap();
    let a: AnyMemory = dev.alloc(in_bytes + 16, MemoryKind::Plain).unwrap();
    let b: AnyMemory = dev.alloc(bytes + 16, MemoryKind::Plain).unwrap();
    let s: AnyMemory = dev.alloc(16, MemoryKind::Plain).unwrap();
    // Out of place the output sits one element past 16-byte alignment (the byte paths).
    let inp = a.ptr();
    let out = match (c.collective, c.in_place) {
        (Collective::ReduceScatter, true) => inp.offset(bytes * rank as usize).unwrap(),
        (_, true) => inp,
        (_, false) => b.ptr().offset(dtype.size()).unwrap(),
    };
    let mine = input(dtype, rank, in_elems, c.salt);
    r.stream.write(inp, &mine).unwrap();
    if !c.in_place {
        r.stream.write(out, &vec![POISON; bytes]).unwrap();
    }
    let bits = scalar_of(dtype, rank, c.salt);
    let scalar = if c.device_scalar {
        let mut v = vec![0u8; dtype.size()];
        formats::write_element(dtype, &mut v, 0, bits).unwrap();
        r.stream.write(s.ptr(), &v).unwrap();
        PreMul::Device(s.ptr())
    } else {
        PreMul::Host(bits)
    };
    let (count, accum) = (c.count, c.accum);
    // SAFETY: the buffers hold what each collective reads and writes, the scalar one
    // element; all live until the synchronize below.
    let result = unsafe {
        match c.collective {
            Collective::AllReduce => r
                .comm
                .all_reduce_premul(inp, out, count, dtype, scalar, accum, &r.stream),
            Collective::ReduceScatter => r
                .comm
                .reduce_scatter_premul(inp, out, count, dtype, scalar, accum, &r.stream),
            _ => r
                .comm
                .reduce_premul(inp, out, count, dtype, scalar, accum, c.root, &r.stream),
        }
    };
    r.stream.synchronize().unwrap();
    let what = format!("rank {rank}/{world} {c:?}");
    result
        .and_then(|()| r.comm.check_error(&r.stream))
        .map_err(|e| format!("{what}: {e}"))?;
    let p = products(dtype, world, in_elems, c.salt);
    let mut got = vec![0u8; bytes];
    r.stream.read(out, &mut got).unwrap();
    let want = match c.collective {
        Collective::AllReduce => Some(sum(dtype, accum, &p, 0, count)),
        Collective::ReduceScatter => Some(sum(dtype, accum, &p, rank as usize * count, count)),
        _ if rank == c.root => Some(sum(dtype, accum, &p, 0, count)),
        _ => None,
    };
    match want {
        Some(w) => same_bits(dtype, &got, &w, count).map_err(|d| format!("{what}: {d}"))?,
        // A reduce's other ranks: the output untouched (the input, in place).
        None if c.in_place => (got == mine)
            .then_some(())
            .ok_or(format!("{what}: a non-root's in-place buffer changed"))?,
        None => got
            .iter()
            .all(|b| *b == POISON)
            .then_some(())
            .ok_or(format!("{what}: a non-root's output was written"))?,
    }
    if !c.in_place {
        let mut now = vec![0u8; in_bytes];
        r.stream.read(inp, &mut now).unwrap();
        if now != mine {
            return Err(format!("{what}: the input changed"));
        }
    }
    Ok(())
}

/// Every collective, data type and accumulation, four (count, in place, residence) cases
/// each, every root of the reduce in turn.
fn every_case(r: &Rank) {
    let world = r.comm.world_size();
    let mut salt = 0;
    for collective in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce,
    ] {
        for dtype in DataType::ALL {
            for accum in accums(dtype) {
                for (count, in_place, device_scalar) in [
                    (1, false, false),
                    (3, true, true),
                    (1000, false, true),
                    (12345, true, false),
                ] {
                    salt += 1;
                    let case = Case {
                        collective,
                        dtype,
                        accum,
                        count,
                        in_place,
                        device_scalar,
                        root: (salt % u64::from(world)) as u32,
                        salt,
                    };
                    check(r, case).unwrap();
                }
            }
        }
    }
}

#[test]
fn every_collective_type_and_residence_on_two_and_three_ranks() {
    for world in [2, 3] {
        threads(world, None, every_case);
    }
}

#[test]
fn reduce_scatter_through_staging_rounds() {
    threads(3, Some(REDUCESCATTER_STAGED), |r| {
        let mut salt = 1000;
        for dtype in [DataType::Bf16, DataType::I32, DataType::Fp8E5m2] {
            for count in [7, 40_001] {
                salt += 1;
                let case = Case {
                    collective: Collective::ReduceScatter,
                    dtype,
                    accum: AccumType::Auto,
                    count,
                    in_place: salt % 2 == 0,
                    device_scalar: true,
                    root: 0,
                    salt,
                };
                check(r, case).unwrap();
            }
        }
    });
}

/// A device scalar is read when the kernel runs: the same call with the memory holding
/// another value gives that value's result (what a replayed CUDA graph sees), and a larger
/// call after a smaller one grows the communicator's buffer without disturbing either.
#[test]
fn a_device_scalar_is_read_at_run_time() {
    threads(2, None, |r| {
        let rank = r.comm.rank();
        let dev = r.comm.device();
        let dtype = DataType::F32;
        let s = dev.alloc(16, MemoryKind::Plain).unwrap();
        for (k, count) in [(1u32, 5usize), (2, 3000), (3, 5)] {
            let x = dev.alloc(count * 4 * 2, MemoryKind::Plain).unwrap();
            let y = dev.alloc(count * 4, MemoryKind::Plain).unwrap();
            let ones: Vec<u8> = (0..count * 2).flat_map(|_| 1f32.to_le_bytes()).collect();
            r.stream.write(x.ptr(), &ones).unwrap();
            // Rank r scales by k * (r + 1): the sum is k * 3 everywhere.
            let scalar = (k * (rank + 1)) as f32;
            r.stream.write(s.ptr(), &scalar.to_le_bytes()).unwrap();
            // SAFETY: x holds 2 * count f32, y count, s one; synchronized below.
            unsafe {
                r.comm
                    .reduce_scatter_premul(
                        x.ptr(),
                        y.ptr(),
                        count,
                        dtype,
                        PreMul::Device(s.ptr()),
                        AccumType::Auto,
                        &r.stream,
                    )
                    .unwrap();
            }
            r.stream.synchronize().unwrap();
            let mut got = vec![0u8; count * 4];
            r.stream.read(y.ptr(), &mut got).unwrap();
            let want: Vec<u8> = (0..count)
                .flat_map(|_| (3.0 * k as f32).to_le_bytes())
                .collect();
            assert_eq!(got, want, "rank {rank} round {k}");
        }
    });
}

#[test]
fn premul_refuses_what_the_sum_refuses() {
    threads(2, None, |r| {
        let dev = r.comm.device();
        let x = dev.alloc(64, MemoryKind::Plain).unwrap();
        let host = PreMul::Host(u64::from(2f32.to_bits()));
        // SAFETY: refused before anything is launched.
        let e = unsafe {
            r.comm.reduce_premul(
                x.ptr(),
                x.ptr(),
                4,
                DataType::F32,
                host,
                AccumType::Auto,
                2,
                &r.stream,
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("root 2"), "{e}");
        // SAFETY: as above.
        let e = unsafe {
            r.comm.all_reduce_premul(
                DevicePtr::NULL,
                x.ptr(),
                4,
                DataType::F32,
                host,
                AccumType::Auto,
                &r.stream,
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
        // SAFETY: as above.
        let e = unsafe {
            r.comm.all_reduce_premul(
                x.ptr(),
                x.ptr(),
                4,
                DataType::F32,
                host,
                AccumType::F16,
                &r.stream,
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("f16"), "{e}");
    });
}
