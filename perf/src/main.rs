//! oxccl-perf: allreduce timing and correctness, like nccl-tests' all_reduce_perf, with
//! NCCL measured on the same buffers in the same run (`--compare nccl`, CUDA builds).
//!
//! ```text
//! oxccl-perf -N 4 -b 1K -e 1G -f 2 -d bf16 -o sum --graph --compare nccl --json out.json --plot out.png
//! oxccl-perf --plot-from out.json --plot out.png
//! ```
//!
//! Ranks: `-N n` starts n copies of itself on this machine (one per device, the host
//! backend without a GPU); under torchrun (`--no-python`), mpirun or srun it reads the
//! launcher's environment; with neither it runs as a single rank. Every size is checked
//! (output poisoned first, compared bit for bit with the rank-order reference, error vs an
//! f64 reference reported); a wrong result makes the exit status non-zero.

mod check;
#[cfg(feature = "cuda")]
mod cuda;
mod json;
mod options;
mod plot;
mod report;
mod spawn;

use std::process::ExitCode;

use oxccl_collectives::backend::{AnyMemory, AnyStream};
use oxccl_collectives::hal::{Device, Memory, MemoryKind, Result, Stream};
use oxccl_collectives::timing::{run_back_to_back, time_calls, TimingMode};
use oxccl_collectives::Communicator;

use crate::options::Options;
use crate::report::{Row, Side};

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OXCCL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let opts = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("oxccl-perf: {e}\n\n{}", options::USAGE);
            return ExitCode::from(2);
        }
    };
    if opts.help {
        println!("{}", options::USAGE);
        return ExitCode::SUCCESS;
    }
    if let (Some(from), Some(png)) = (&opts.plot_from, opts.plot_from_target()) {
        return match plot_from(from, &png) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("oxccl-perf: --plot-from {from}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(n) = opts.nprocs {
        if std::env::var("RANK").is_err() {
            return spawn::run(n);
        }
    }
    match run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--plot-from FILE.json`: draws a table written earlier by `--json`; runs nothing.
fn plot_from(json: &str, png: &str) -> Result<()> {
    let text = std::fs::read_to_string(json).map_err(|e| oxccl_collectives::hal::Error::Os {
        call: "read (--plot-from)",
        source: e,
    })?;
    let fig = plot::Figure::from_json(&text)?;
    plot::write_png(std::path::Path::new(png), &fig)?;
    println!("# plot: {png} ({} sizes)", fig.points.len());
    Ok(())
}

/// Buffers of one rank, sized for the largest message.
struct Buffers {
    input: AnyMemory,
    output: AnyMemory,
}

fn run(opts: &Options) -> Result<bool> {
    spawn::single_rank_defaults();
    // NCCL must never create multicast objects on the lent machines (set before NCCL is
    // loaded; the spawner and the GPU scripts set it too).
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let comm = Communicator::from_env()?;
    let stream = comm.device().create_stream()?;
    let rank = comm.rank();
    let world = comm.world_size();
    let max_bytes = opts.sizes().last().copied().unwrap_or(0).max(16);
    let bufs = Buffers {
        input: comm.device().alloc(max_bytes + 64, MemoryKind::Plain)?,
        output: comm.device().alloc(max_bytes + 64, MemoryKind::Plain)?,
    };
    // The common MSCCL++ / NCCL-symmetric-memory usage: buffers registered once, so the
    // large sizes run zero-copy (peers read the inputs and write the outputs directly).
    if !opts.no_register {
        comm.register(&bufs.input)?;
        comm.register(&bufs.output)?;
    }
    #[cfg(feature = "cuda")]
    let nccl = if opts.compare_nccl {
        Some(cuda::Nccl::new(&comm, &stream)?)
    } else {
        None
    };
    #[cfg(not(feature = "cuda"))]
    if opts.compare_nccl {
        eprintln!("oxccl-perf: --compare nccl needs a build with --features cuda; skipped");
    }
    if let Some(force) = opts.tune {
        let tables = comm.tune(&[opts.dtype], max_bytes, force)?;
        if rank == 0 {
            for (t, source) in &tables {
                report::print_tune_table(t, *source);
            }
        }
    }
    if rank == 0 {
        report::header(opts, &comm);
    }
    let mut rows = Vec::new();
    let mut all_ok = true;
    let mut plot_ok = true;
    let mut host = vec![0u8; 0];
    for (k, bytes) in opts.sizes().into_iter().enumerate() {
        let count = (bytes / opts.dtype.size()).max(1);
        let bytes = opts.dtype.bytes(count)?;
        let seed = 0x5eed_0000 + k as u64;
        host.resize(bytes, 0);
        let input = bufs.input.ptr();
        let output = if opts.in_place {
            input
        } else {
            bufs.output.ptr()
        };
        let choice = comm.choose_for(input, output, count, opts.dtype)?;
        // Correctness: fresh input, poisoned output, one call, exact check.
        let ours = measure_side(
            opts,
            &comm,
            &stream,
            &bufs,
            &mut host,
            count,
            seed,
            |i, o| {
                // SAFETY: both buffers hold `bytes` (+64) bytes and outlive the stream's work.
                unsafe { comm.all_reduce(i, o, count, opts.dtype, opts.op, opts.accum, &stream) }
            },
            true,
        )?;
        #[cfg(feature = "cuda")]
        let theirs = match &nccl {
            Some(n) if n.supports(opts.dtype, opts.accum) => Some(measure_side(
                opts,
                &comm,
                &stream,
                &bufs,
                &mut host,
                count,
                seed,
                |i, o| n.all_reduce(i, o, count, opts.dtype, opts.op, &stream),
                false,
            )?),
            _ => None,
        };
        #[cfg(not(feature = "cuda"))]
        let theirs: Option<Side> = None;
        // Every rank's verdict and the slowest rank's time.
        let ours = report::agree(&comm, ours)?;
        let theirs = match theirs {
            Some(t) => Some(report::agree(&comm, t)?),
            None => None,
        };
        let row = Row {
            bytes,
            count,
            algorithm: choice.algorithm.name(),
            world,
            ours,
            nccl: theirs,
        };
        all_ok &= row.ours.wrong == 0;
        if rank == 0 {
            report::print_row(&row);
        }
        rows.push(row);
    }
    if rank == 0 {
        if let Some(path) = &opts.json {
            report::write_json(path, opts, &comm, &rows)?;
        }
        if let Some(path) = &opts.plot {
            // A failed plot fails the run but must not skip the collective teardown.
            let fig = plot::Figure::from_rows(opts, &comm, &rows);
            match plot::write_png(std::path::Path::new(path), &fig) {
                Ok(()) => println!("# plot: {path}"),
                Err(e) => {
                    eprintln!("oxccl-perf: --plot: {e}");
                    plot_ok = false;
                }
            }
        }
        println!(
            "# {}: every size {}",
            if all_ok { "PASS" } else { "FAIL" },
            if all_ok {
                "matched the reference"
            } else {
                "did NOT match the reference"
            }
        );
    }
    stream.synchronize()?;
    if !opts.no_register {
        comm.deregister(&bufs.input)?;
        comm.deregister(&bufs.output)?;
    }
    drop(bufs);
    #[cfg(feature = "cuda")]
    drop(nccl);
    comm.destroy()?;
    Ok(all_ok && plot_ok)
}

/// Checks then times one implementation (`call(input, output)` queues one allreduce).
#[allow(clippy::too_many_arguments)]
fn measure_side(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    bufs: &Buffers,
    host: &mut [u8],
    count: usize,
    seed: u64,
    call: impl Fn(oxccl_collectives::hal::DevicePtr, oxccl_collectives::hal::DevicePtr) -> Result<()>,
    exact: bool,
) -> Result<Side> {
    let bytes = host.len();
    let input = bufs.input.ptr();
    let output = if opts.in_place {
        input
    } else {
        bufs.output.ptr()
    };
    check::fill(opts.dtype, seed, comm.rank(), host);
    stream.write(input, host)?;
    if !opts.in_place {
        // SAFETY: the output holds `bytes` bytes.
        unsafe { stream.fill(output, 0xff, bytes) }?;
    }
    call(input, output)?;
    stream.synchronize()?;
    if exact {
        comm.check_error(stream)?;
    }
    stream.read(output, host)?;
    let mut verdict = check::check(
        opts.dtype,
        opts.op,
        opts.accum,
        seed,
        comm.world_size(),
        host,
        count,
        exact,
    );
    if let (true, Some((i, got, want))) = (exact, verdict.first_wrong) {
        eprintln!(
            "oxccl-perf: rank {}: {} wrong of {} checked at {} bytes; first at element {i}: \
             {got:#x}, want {want:#x}",
            comm.rank(),
            verdict.wrong,
            verdict.checked,
            bytes
        );
    }
    if exact {
        verdict.wrong += check_back_to_back(opts, comm, stream, output, host, count, &|| {
            call(output, output)
        })?;
    }
    // Timing. In place keeps re-reducing its own output: fine for timing (values may grow,
    // the work is the same); out of place re-reads the same input.
    let us = time(opts, comm, stream, || call(input, output))?;
    comm.bootstrap().barrier()?;
    Ok(Side {
        us,
        wrong: verdict.wrong,
        checked: verdict.checked,
        max_rel_err: verdict.max_rel_err,
    })
}

/// In-place calls [`check_back_to_back`] queues after the checked one.
const BACK_TO_BACK: usize = 2;

/// Calls the timing loop makes back to back: each kernel is scheduled while the one
/// before it runs (early launch), so it must still see that one's result and epoch.
/// Checked on the result just verified (in `host`, read from `output`): `BACK_TO_BACK`
/// more in-place calls on `output`, queued as one graph where the backend has graphs,
/// against the host's repeated reduction. Returns the wrong elements (reported on stderr).
fn check_back_to_back(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    output: oxccl_collectives::hal::DevicePtr,
    host: &mut [u8],
    count: usize,
    in_place_call: &dyn Fn() -> Result<()>,
) -> Result<usize> {
    let first = check::checked_values(opts.dtype, host, count);
    run_back_to_back(stream, BACK_TO_BACK, in_place_call)?;
    comm.check_error(stream)?;
    stream.read(output, host)?;
    let (wrong, first_wrong) = check::check_repeated(
        opts.dtype,
        opts.op,
        opts.accum,
        comm.world_size(),
        &first,
        host,
        count,
        BACK_TO_BACK,
    );
    if let Some((i, got, want)) = first_wrong {
        eprintln!(
            "oxccl-perf: rank {}: {wrong} wrong of {} after {BACK_TO_BACK} back-to-back calls \
             at {} bytes; first at element {i}: {got:#x}, want {want:#x}",
            comm.rank(),
            first.len(),
            host.len()
        );
    }
    Ok(wrong)
}

/// Microseconds per call: warm-up, then `iters` calls between two events (graph mode:
/// the calls are captured once and the graph is replayed), the median of three.
fn time(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    call: impl Fn() -> Result<()>,
) -> Result<f64> {
    let dev_events = (comm.device().create_event()?, comm.device().create_event()?);
    for _ in 0..opts.warmup {
        call()?;
    }
    stream.synchronize()?;
    let mode = if opts.graph {
        TimingMode::Graph
    } else {
        TimingMode::Eager
    };
    time_calls(stream, &dev_events, mode, opts.iters, 3, &call)
}
