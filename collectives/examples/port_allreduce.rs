//! The PortChannel allreduce, forced in a communicator: a checked sweep (bit for bit against
//! the host reference in rank order) and a timing per size, one rank per process.
//!
//! GPU node, one process per GPU (torchrun, mpirun or srun set RANK, WORLD_SIZE, LOCAL_RANK,
//! MASTER_ADDR, MASTER_PORT):
//!
//! ```sh
//! cargo build --release -p oxccl-collectives --features cuda --example port_allreduce
//! OXCCL_PORT_TRANSPORT=ipc torchrun --nproc-per-node 2 --no-python \
//!     target/release/examples/port_allreduce
//! ```
//!
//! `OXCCL_PORT_TRANSPORT=ipc|tcp|ib|auto`, `OXCCL_PORT_CHUNK_KB`, `OXCCL_TIMEOUT_MS` as for
//! `CommConfig::from_env` (`OXCCL_ALGO` is set to `port_channel` here);
//! `OXCCL_BACKEND=host` runs it without a GPU.
//! An argument caps the largest count (default 16 Mi + 1 elements).
//! Exit status 1 when any element differs from the reference or a call fails.

use std::time::Instant;

use oxccl_collectives::algorithms::all_reduce::port_channel::{PortAllreduce, PORT_CHANNEL};
use oxccl_collectives::backend::{self, AnyDevice, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig};
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DeviceId, Error, Memory, MemoryKind, ReduceOp, Result, Stream,
};
use oxccl_collectives::kernels::{formats, pattern, reduce};
use oxccl_collectives::{CommConfig, Communicator};

/// Runs one checked call and `iters` timed ones; returns (mismatches, microseconds/call).
fn run(
    comm: &Communicator,
    device: &AnyDevice,
    stream: &AnyStream,
    (rank, world): (u32, u32),
    dtype: DataType,
    count: usize,
    iters: u32,
) -> Result<(usize, f64)> {
    let bytes = dtype.bytes(count)?;
    let inp = device.alloc(bytes, MemoryKind::Plain)?;
    let out = device.alloc(bytes, MemoryKind::Plain)?;
    let salt = count as u64 ^ u64::from(dtype.code()) << 40;
    stream.write(
        inp.ptr(),
        &pattern::allreduce_input(dtype, rank, count, salt)?,
    )?;
    stream.write(out.ptr(), &vec![0xa5u8; bytes])?;
    let call = || {
        // SAFETY: both buffers hold `count` elements and outlive every call (each loop
        // below synchronizes the stream before they are dropped).
        unsafe {
            comm.all_reduce(
                inp.ptr(),
                out.ptr(),
                count,
                dtype,
                ReduceOp::Sum,
                AccumType::Auto,
                stream,
            )
        }
    };
    call()?;
    comm.check_error(stream)?;
    let mut got = vec![0u8; bytes];
    stream.read(out.ptr(), &mut got)?;
    let inputs = (0..world)
        .map(|r| pattern::allreduce_input(dtype, r, count, salt))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let mut want = vec![0u8; bytes];
    reduce::reduce(
        dtype,
        ReduceOp::Sum,
        AccumType::Auto,
        &refs,
        &mut want,
        count,
    )?;
    let bad = (0..count)
        .filter(|&i| {
            let g = formats::read_element(dtype, &got, i).unwrap_or_default();
            let w = formats::read_element(dtype, &want, i).unwrap_or_default();
            !formats::same_bits(dtype, g, w)
        })
        .count();
    let start = Instant::now();
    for _ in 0..iters {
        call()?;
    }
    comm.check_error(stream)?;
    Ok((
        bad,
        start.elapsed().as_secs_f64() * 1e6 / f64::from(iters.max(1)),
    ))
}

fn main() -> Result<()> {
    let (bootstrap, info) = Bootstrap::from_env(&BootstrapConfig::from_env()?)?;
    let device = AnyDevice::open_with(backend::chosen()?, DeviceId(info.local_rank))?;
    let config = CommConfig {
        forced: PORT_CHANNEL.into(),
        ..CommConfig::from_env()?
    };
    let comm = Communicator::new(bootstrap, device, config)?;
    let ar = comm
        .instance(PORT_CHANNEL)
        .and_then(|i| i.as_any().downcast_ref::<PortAllreduce>())
        .ok_or_else(|| Error::Unsupported("port_channel was not set up".into()))?;
    let device = comm.device();
    let stream = device.create_stream()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    if rank == 0 {
        println!(
            "port allreduce: {world} ranks, {} backend, transports {:?}, chunk {} bytes",
            Device::backend(device),
            ar.transports(),
            ar.chunk_bytes()
        );
        println!(
            "{:>10} {:>12} {:>12} {:>10}",
            "dtype", "count", "us/call", "wrong"
        );
    }
    let max_count = match std::env::args().nth(1) {
        Some(a) => a
            .parse::<usize>()
            .map_err(|_| Error::InvalidArgument(format!("max count '{a}' is not a number")))?,
        None => usize::MAX,
    };
    let mut failed = false;
    let counts = [1usize, 3, 1000, 12_345, (1 << 20) + 7, (16 << 20) + 1];
    for count in counts.into_iter().filter(|c| *c <= max_count) {
        for dtype in [DataType::F32, DataType::Bf16, DataType::Fp8E4m3] {
            let (bad, us) = run(&comm, device, &stream, (rank, world), dtype, count, 10)?;
            failed |= bad != 0;
            if rank == 0 || bad != 0 {
                println!(
                    "{:>10} {count:>12} {us:>12.1} {bad:>10}  (rank {rank})",
                    dtype.to_string()
                );
            }
        }
    }
    stream.synchronize()?;
    comm.destroy()?;
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
