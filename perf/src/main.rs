//! oxccl-perf: collective timing and correctness, like nccl-tests' `*_perf`
//! (`-c allreduce`, the default, or `-c allgather`), with the vendor's library measured on
//! the same buffers in the same run (`--compare nccl`: NCCL on CUDA, RCCL on ROCm).
//!
//! ```text
//! oxccl-perf -N 4 -b 1K -e 1G -f 2 -d bf16 -o sum --graph --compare nccl --json out.json --plot out.png
//! oxccl-perf -c allgather -N 4 -b 1K -e 1G -f 2 -d bf16 --compare nccl
//! oxccl-perf --plot-from out.json --plot out.png
//! ```
//!
//! Ranks: `-N n` starts n copies of itself on this machine (one per device, the host
//! backend without a GPU); under torchrun (`--no-python`), mpirun or srun it reads the
//! launcher's environment; with neither it runs as a single rank. Sizes, counts and
//! bandwidths follow nccl-tests ([`collective`]). Every size is checked (output poisoned
//! first, compared bit for bit with the host reference: the rank-order reduction, or every
//! rank's input in its slot; error vs an f64 reference reported); a wrong result makes the
//! exit status non-zero.

mod check;
mod collective;
mod json;
mod options;
mod plot;
mod report;
mod soak;
mod spawn;
mod vendor;

use std::process::ExitCode;

use oxccl_collectives::backend::{AnyMemory, AnyStream};
use oxccl_collectives::hal::{
    BackendKind, Device, DevicePtr, Error, Memory, MemoryKind, Result, Stream,
};
use oxccl_collectives::timing::{run_back_to_back, time_calls, TimingMode};
use oxccl_collectives::Communicator;

use crate::check::Expect;
use crate::collective::Call;
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

/// Buffers of one rank, sized for the largest row: the send buffer for the largest
/// input, the receive buffer for the largest of either (in place, both lie in it).
struct Buffers {
    send: AnyMemory,
    recv: AnyMemory,
}

/// One row's host copies: this rank's input and its output read back.
#[derive(Default)]
struct Host {
    input: Vec<u8>,
    output: Vec<u8>,
}

fn run(opts: &Options) -> Result<bool> {
    spawn::single_rank_defaults();
    // NCCL must never create multicast objects on the lent machines (set before NCCL is
    // loaded; the spawner and the GPU scripts set it too).
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let comm = Communicator::from_env()?;
    let stream = comm.device().create_stream()?;
    let world = comm.world_size();
    let c = opts.collective;
    let shapes = opts
        .sizes()
        .into_iter()
        .map(|b| c.shape(b, opts.dtype, world))
        .collect::<Result<Vec<_>>>()?;
    let (max_send, max_recv) = if opts.soak.is_some() {
        soak::buffer_bytes(opts.max_bytes, world)?
    } else {
        (
            shapes.iter().map(|s| s.send_bytes).max().unwrap_or(0),
            shapes.iter().map(|s| s.size).max().unwrap_or(0),
        )
    };
    let (max_send, max_recv) = (max_send.max(16), max_recv.max(16));
    // Whole 2 MiB pages, as PyTorch's caching allocator and ncclMemAlloc hand out: a
    // cudaMalloc of 1 GiB + 64 bytes, opened by the peer through cudaIpc, made the peer's
    // copy-engine pulls from it stall beside SM work (reduce_copy 3.9 against 2.85 ms on 2
    // H200s; 1 GiB + 64 KiB did not; ci/gpu/probe/ce_overlap_probe.cu, `oxccl-perf` mode).
    let whole_pages = |bytes: usize| (bytes + 64).next_multiple_of(2 << 20);
    let bufs = Buffers {
        send: comm
            .device()
            .alloc(whole_pages(max_send), MemoryKind::Plain)?,
        recv: comm
            .device()
            .alloc(whole_pages(max_recv), MemoryKind::Plain)?,
    };
    // The common MSCCL++ / NCCL-symmetric-memory usage: buffers registered once, so the
    // large sizes run zero-copy (peers read the inputs and write the outputs directly).
    if !opts.no_register {
        comm.register(&bufs.send)?;
        comm.register(&bufs.recv)?;
    }
    let outcome = match opts.soak {
        Some(seconds) => soak::run(opts, &comm, &stream, &bufs, seconds),
        None => sweep(opts, &comm, &stream, &bufs, &shapes),
    };
    stream.synchronize()?;
    if !opts.no_register {
        comm.deregister(&bufs.send)?;
        comm.deregister(&bufs.recv)?;
    }
    drop(bufs);
    let ok = outcome?;
    comm.destroy()?;
    Ok(ok)
}

/// The table: every size checked, then timed, against NCCL where asked.
fn sweep(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    bufs: &Buffers,
    shapes: &[collective::Shape],
) -> Result<bool> {
    let (rank, world, c) = (comm.rank(), comm.world_size(), opts.collective);
    let (max_send, max_recv) = (bufs.send.len(), bufs.recv.len());
    let nccl = if opts.compare_nccl && Device::backend(comm.device()) != BackendKind::Host {
        Some(vendor::Nccl::new(comm)?)
    } else {
        if opts.compare_nccl {
            eprintln!(
                "oxccl-perf: --compare nccl needs a GPU backend (a build with --features cuda \
                 or rocm, on a GPU); skipped"
            );
        }
        None
    };
    // NCCL's symmetric mode needs its own buffers (ncclMemAlloc, registered as symmetric
    // windows by every rank), sized as ours.
    let symmetric = match &nccl {
        Some(n) if c.nccl_symmetric && !opts.nccl_default_only => {
            let w = n.symmetric_buffers(max_send, max_recv)?;
            if w.is_none() && rank == 0 {
                eprintln!(
                    "oxccl-perf: the loaded library has no symmetric windows (NCCL 2.27+); \
                     only its default mode is compared"
                );
            }
            w
        }
        _ => None,
    };
    if let Some(force) = opts.tune {
        let tables = comm.tune(&[opts.dtype], max_send, force)?;
        if rank == 0 {
            for (t, source) in &tables {
                report::print_tune_table(t, *source);
            }
        }
    }
    if rank == 0 {
        report::header(opts, comm);
    }
    let bus_factor = (c.bus_factor)(world);
    let mut rows = Vec::new();
    let mut all_ok = true;
    let mut plot_ok = true;
    let mut host = Host::default();
    for (k, shape) in shapes.iter().enumerate() {
        let count = shape.count;
        let expect = Expect {
            dtype: opts.dtype,
            op: opts.op,
            accum: opts.accum,
            seed: 0x5eed_0000 + k as u64,
            world,
            count,
            slots: (c.recv_slots)(world),
            rank,
            root: opts.root,
            in_place: opts.in_place,
        };
        host.input.resize(shape.send_bytes, 0);
        host.output.resize(shape.recv_bytes, 0);
        let (input, output) = c.pointers(
            bufs.send.ptr(),
            bufs.recv.ptr(),
            count,
            opts.dtype,
            rank,
            opts.in_place,
        )?;
        let choice = comm.choose_collective_for(c.kind, input, output, count, opts.dtype)?;
        let call = |input, output| Call {
            input,
            output,
            count,
            dtype: opts.dtype,
            op: opts.op,
            accum: opts.accum,
            root: opts.root,
            stream,
        };
        // Correctness: fresh input, poisoned output, one call, exact check.
        let ours = measure_side(
            opts,
            comm,
            stream,
            (bufs.send.ptr(), bufs.recv.ptr()),
            &mut host,
            &expect,
            |i, o| {
                // SAFETY: the buffers were sized for this row (shape) and outlive the
                // stream's work (synchronized before they are dropped).
                unsafe { (c.oxccl)(comm, &call(i, o)) }
            },
            true,
        )?;
        // NCCL on the same buffers (its default mode), then on buffers in symmetric
        // windows (its symmetric-memory kernels, NCCL 2.27+).
        let (theirs, theirs_symmetric) = match &nccl {
            Some(n) if (c.nccl_supports)(n, opts.dtype, opts.accum) => {
                let nccl_side = |send, recv, host: &mut Host| {
                    measure_side(
                        opts,
                        comm,
                        stream,
                        (send, recv),
                        host,
                        &expect,
                        |i, o| (c.nccl)(n, &call(i, o)),
                        false,
                    )
                };
                let default = nccl_side(bufs.send.ptr(), bufs.recv.ptr(), &mut host)?;
                let symmetric = match &symmetric {
                    Some(w) => Some(nccl_side(w.send(), w.recv(), &mut host)?),
                    None => None,
                };
                (Some(default), symmetric)
            }
            _ => (None, None),
        };
        // Every rank's verdict and the slowest rank's time.
        let ours = report::agree(comm, ours)?;
        let agree = |side: Option<Side>| side.map(|t| report::agree(comm, t)).transpose();
        let row = Row {
            bytes: shape.size,
            count,
            algorithm: choice.algorithm.name(),
            bus_factor,
            ours,
            nccl: agree(theirs)?,
            nccl_symmetric: agree(theirs_symmetric)?,
        };
        all_ok &= row.ours.wrong == 0;
        if rank == 0 {
            report::print_row(opts, &row);
        }
        rows.push(row);
    }
    if rank == 0 {
        if let Some(path) = &opts.json {
            report::write_json(path, opts, comm, &rows)?;
        }
        if let Some(path) = &opts.plot {
            // A failed plot fails the run but must not skip the collective teardown.
            let fig = plot::Figure::from_rows(opts, comm, &rows);
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
    // The vendor's windows and communicator go before our buffers.
    stream.synchronize()?;
    drop(symmetric);
    drop(nccl);
    Ok(all_ok && plot_ok)
}

/// Checks then times one implementation (`call(input, output)` queues one call of the
/// collective) on one pair of buffers (sized for the largest row).
#[allow(clippy::too_many_arguments)]
fn measure_side(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    (send, recv): (DevicePtr, DevicePtr),
    host: &mut Host,
    expect: &Expect,
    call: impl Fn(DevicePtr, DevicePtr) -> Result<()>,
    exact: bool,
) -> Result<Side> {
    let c = opts.collective;
    let (count, dtype, rank) = (expect.count, expect.dtype, comm.rank());
    let (input, output, mut verdict) = check_once(
        c,
        opts.in_place,
        comm,
        stream,
        (send, recv),
        host,
        expect,
        &call,
        exact,
    )?;
    if exact {
        // Back to back on the output just checked, as the collective allows (see
        // `Collective::repeat_in_place`).
        if c.repeat_in_place {
            // In place on the output: it must lie where it lies out of place.
            let (in_place_input, in_place_output) =
                c.pointers(send, recv, count, dtype, rank, true)?;
            if in_place_output != output {
                return Err(Error::Unsupported(format!(
                    "{}: back-to-back check with the in-place output elsewhere",
                    c.name
                )));
            }
            verdict.wrong +=
                check_back_to_back(opts, comm, stream, in_place_output, host, expect, &|| {
                    call(in_place_input, in_place_output)
                })?;
        } else if !(opts.in_place
            && matches!(
                c.kind,
                oxccl_collectives::Collective::ReduceScatter
                    | oxccl_collectives::Collective::Reduce
            ))
        {
            // The same call again: its input is untouched, so its output stays as it was
            // (not so for the reducing ones in place, whose output is (part of) their input:
            // no back-to-back check there).
            verdict.wrong += check_back_to_back(opts, comm, stream, output, host, expect, &|| {
                call(input, output)
            })?;
        }
    }
    // Timing. In place, allreduce keeps re-reducing its own output: fine for timing
    // (values may grow, the work is the same); out of place re-reads the same input.
    let us = time(opts, comm, stream, || call(input, output))?;
    comm.bootstrap().barrier()?;
    Ok(Side {
        us,
        wrong: verdict.wrong,
        checked: verdict.checked,
        max_rel_err: verdict.max_rel_err,
    })
}

/// One checked call: fresh input (`host.input`, sized for the call), the output
/// (`host.output`, sized for it) poisoned, one call, then the output read back into
/// `host.output` and compared with the reference (`exact`: bit for bit; otherwise only the
/// error is measured). Returns the call's (input, output) and the verdict.
#[allow(clippy::too_many_arguments)]
fn check_once(
    c: &collective::Collective,
    in_place: bool,
    comm: &Communicator,
    stream: &AnyStream,
    (send, recv): (DevicePtr, DevicePtr),
    host: &mut Host,
    expect: &Expect,
    call: &dyn Fn(DevicePtr, DevicePtr) -> Result<()>,
    exact: bool,
) -> Result<(DevicePtr, DevicePtr, check::Verdict)> {
    let (count, dtype, rank) = (expect.count, expect.dtype, comm.rank());
    let (input, output) = c.pointers(send, recv, count, dtype, rank, in_place)?;
    check::fill(dtype, expect.seed, rank, &mut host.input);
    // Poison the whole output first: in place the input is then written into it.
    // SAFETY: the receive buffer holds the output (sized for the largest row).
    unsafe { stream.fill(output, 0xff, host.output.len()) }?;
    stream.write(input, &host.input)?;
    call(input, output)?;
    stream.synchronize()?;
    if exact {
        comm.check_error(stream)?;
    }
    stream.read(output, &mut host.output)?;
    let verdict = (c.check)(expect, &host.output, exact);
    if let (true, Some((i, got, want))) = (exact, verdict.first_wrong) {
        eprintln!(
            "oxccl-perf: rank {rank}: {} {} wrong of {} checked at {} bytes; first at element \
             {i}: {got:#x}, want {want:#x}",
            c.name,
            verdict.wrong,
            verdict.checked,
            host.output.len()
        );
    }
    Ok((input, output, verdict))
}

/// In-place calls [`check_back_to_back`] queues after the checked one.
const BACK_TO_BACK: usize = 2;

/// Calls the timing loop makes back to back: each kernel is scheduled while the one
/// before it runs (early launch), so it must still see that one's result and epoch.
/// Checked on the result just verified (in `host.output`, read from `output`):
/// `BACK_TO_BACK` more in-place calls on `output`, queued as one graph where the backend
/// has graphs, against what the collective makes of its own result
/// ([`crate::collective::Collective::check_repeated`]). Returns the wrong elements
/// (reported on stderr).
fn check_back_to_back(
    opts: &Options,
    comm: &Communicator,
    stream: &AnyStream,
    output: DevicePtr,
    host: &mut Host,
    expect: &Expect,
    in_place_call: &dyn Fn() -> Result<()>,
) -> Result<usize> {
    let first = check::checked_values(expect, &host.output);
    run_back_to_back(stream, BACK_TO_BACK, in_place_call)?;
    comm.check_error(stream)?;
    stream.read(output, &mut host.output)?;
    let (wrong, first_wrong) =
        (opts.collective.check_repeated)(expect, &first, &host.output, BACK_TO_BACK);
    if let Some((i, got, want)) = first_wrong {
        eprintln!(
            "oxccl-perf: rank {}: {wrong} wrong of {} after {BACK_TO_BACK} back-to-back calls \
             at {} bytes; first at element {i}: {got:#x}, want {want:#x}",
            comm.rank(),
            first.len(),
            host.output.len()
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
