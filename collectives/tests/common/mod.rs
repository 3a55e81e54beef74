//! Ranks, inputs and references shared by the collectives' integration tests.

// Every test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use oxccl_collectives::backend::{AnyDevice, AnyMemory, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Memory, MemoryKind, ReduceOp,
    Stream,
};
use oxccl_collectives::kernels::{formats, pattern, reduce};
use oxccl_collectives::{CommConfig, Communicator};

/// One rank of a test: its communicator and a stream.
pub struct Rank {
    pub comm: Communicator,
    pub stream: AnyStream,
}

/// Runs `body` on `world` ranks as threads of this process (each its own host device),
/// with a configuration per rank; tears every communicator down collectively.
pub fn threads_with(
    world: u32,
    config_of: impl Fn(u32) -> CommConfig + Send + Sync + 'static,
    body: impl Fn(&Rank) + Send + Sync + 'static,
) {
    let id =
        UniqueId::create_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &BootstrapConfig::default()).unwrap();
    let body = Arc::new(body);
    let config_of = Arc::new(config_of);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let body = Arc::clone(&body);
            let config_of = Arc::clone(&config_of);
            std::thread::spawn(move || {
                let bs = Bootstrap::new(&id, r, world, &BootstrapConfig::default()).unwrap();
                let dev = AnyDevice::open_with(BackendKind::Host, DeviceId(r)).unwrap();
                let comm = Communicator::new(bs, dev, config_of(r)).unwrap();
                let stream = comm.device().create_stream().unwrap();
                let rank = Rank { comm, stream };
                body(&rank);
                rank.comm.destroy().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank thread panicked");
    }
}

/// Deterministic non-zero inputs of `rank` (`oxccl_kernels::pattern::allreduce_input`).
pub fn input(dtype: DataType, rank: u32, count: usize, salt: u64) -> Vec<u8> {
    pattern::allreduce_input(dtype, rank, count, salt).unwrap()
}

/// The accumulation types the tests try for `dtype` (each one the kernels serve:
/// `AccumType::refusal`). Integers and f64 have one (they reduce in their own type).
pub fn accums(dtype: DataType) -> Vec<AccumType> {
    match dtype {
        DataType::F32 => vec![AccumType::Auto],
        DataType::F16 | DataType::Bf16 => vec![AccumType::Auto, AccumType::F32],
        d if d.reduces_in_own_type() => vec![AccumType::Auto],
        _ => vec![AccumType::Auto, AccumType::Native, AccumType::F32],
    }
}

/// What every rank must hold after the allreduce of [`input`]s: the host reference, in
/// rank order.
pub fn expected(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    world: u32,
    count: usize,
    salt: u64,
) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| input(dtype, r, count, salt)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0u8; dtype.bytes(count).unwrap()];
    reduce::reduce(dtype, op, accum, &refs, &mut out, count).unwrap();
    out
}

/// The buffers of one check on `device` (the caller keeps them alive) and its input and
/// output: in place one buffer; out of place the input sits one element past 16-byte
/// alignment, so the kernels' byte paths run too.
pub fn check_buffers(
    device: &AnyDevice,
    dtype: DataType,
    count: usize,
    in_place: bool,
) -> ([AnyMemory; 2], DevicePtr, DevicePtr) {
    let bytes = dtype.bytes(count).unwrap();
    let skew = if in_place { 0 } else { dtype.size() };
    let a: AnyMemory = device.alloc(bytes + 16, MemoryKind::Plain).unwrap();
    let b: AnyMemory = device.alloc(bytes + 16, MemoryKind::Plain).unwrap();
    let inp = a.ptr().offset(skew).unwrap();
    let out = if in_place { inp } else { b.ptr() };
    ([a, b], inp, out)
}

/// Writes `rank`'s [`input`] into `inp`, and poisons `out` when it is another buffer.
pub fn stage(
    stream: &AnyStream,
    (inp, out): (DevicePtr, DevicePtr),
    dtype: DataType,
    rank: u32,
    count: usize,
    salt: u64,
) {
    stream.write(inp, &input(dtype, rank, count, salt)).unwrap();
    if inp != out {
        stream
            .write(out, &vec![0xa5u8; dtype.bytes(count).unwrap()])
            .unwrap();
    }
}

/// Compares `count` elements of `got` with `want` bit for bit: the first that differs.
pub fn same_bits(dtype: DataType, got: &[u8], want: &[u8], count: usize) -> Result<(), String> {
    for i in 0..count {
        let g = formats::read_element(dtype, got, i).unwrap();
        let w = formats::read_element(dtype, want, i).unwrap();
        if !formats::same_bits(dtype, g, w) {
            return Err(format!("element {i} is {g:#x}, want {w:#x}"));
        }
    }
    Ok(())
}

/// Runs this test binary's ignored `child_rank` test as `world` rank processes on this
/// machine (launcher environment as torchrun sets it, host backend, `env` on top), and
/// asserts that every rank exits successfully; `what` names the case in the message.
pub fn run_child_ranks(world: u32, env: &[(&str, &str)], what: &str) {
    let exe = std::env::current_exe().unwrap();
    // Below the ephemeral range: a port from bind(0) can be handed to another test's
    // outgoing connection before rank 0 binds it.
    let master_port = oxccl_collectives::channels::bootstrap::free_rendezvous_port().unwrap();
    let children: Vec<_> = (0..world)
        .map(|r| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("OXCCL_TEST_CHILD", "1")
                .env("OXCCL_BACKEND", "host")
                .env("OXCCL_TIMEOUT_MS", "20000")
                .envs(env.iter().copied())
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", master_port.to_string())
                .env("OXCCL_BOOTSTRAP_PORT", (master_port + 1).to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "{what}: a rank failed ({status})");
    }
}

/// The signature bytes a rank's first call of `count` elements of `dtype` (sum, auto
/// accumulation) with `algorithm` sends to the others: a test rank that must take part in
/// that check without launching anything sends the same.
pub fn first_call_signature(count: u64, dtype: DataType, algorithm: u32) -> Vec<u8> {
    // count, then the zero-copy offsets (none), then the collective (allreduce: 0), dtype,
    // op, accum, algorithm, the launch (the host backend's fixed 1 x 32) and the root (0).
    let mut v = count.to_le_bytes().to_vec();
    v.extend_from_slice(&u64::MAX.to_le_bytes());
    v.extend_from_slice(&u64::MAX.to_le_bytes());
    for x in [
        0u32,
        dtype.code(),
        ReduceOp::Sum.code(),
        AccumType::Auto.code(),
        algorithm,
        1,
        32,
        0, // root
    ] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// Queues an allreduce (`op`, automatic accumulation) of `count` elements from `inp` into
/// `out` on `r`'s stream after whatever is queued there, synchronizes, checks the
/// communicator's device error word, and returns `out`'s bytes.
///
/// # Safety
/// `inp` and `out` must hold `count` elements of `dtype` on `r`'s device (one buffer in
/// place), live and written by nothing else until this returns.
pub unsafe fn all_reduce_and_read(
    r: &Rank,
    (inp, out): (DevicePtr, DevicePtr),
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Vec<u8> {
    // SAFETY: the caller's obligations; synchronized before returning.
    unsafe {
        r.comm
            .all_reduce(inp, out, count, dtype, op, AccumType::Auto, &r.stream)
            .unwrap();
    }
    r.stream.synchronize().unwrap();
    r.comm.check_error(&r.stream).unwrap();
    let mut got = vec![0u8; dtype.bytes(count).unwrap()];
    r.stream.read(out, &mut got).unwrap();
    got
}
