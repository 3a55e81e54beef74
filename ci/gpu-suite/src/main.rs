//! `oxccl-gpu-suite`: GPU tests run one process per GPU (torchrun, mpirun or by hand).
//!
//! ```text
//! oxccl-gpu-suite selftest [--seed N]
//! oxccl-gpu-suite suite [--rendezvous DIR] [--timeout SECS]
//! oxccl-gpu-suite faults CASE        (one injected fault; see faults.rs)
//! ```
//! Ranks come from `RANK`, `WORLD_SIZE` and `LOCAL_RANK` (torchrun's names; defaults 0, 1,
//! 0); `LOCAL_RANK` picks the GPU. Handles travel through files in the rendezvous directory
//! (`--rendezvous` or `OXCCL_SUITE_DIR`); use a fresh directory per run. The exit code is
//! non-zero when any case fails on any rank.

// Without a GPU backend only the argument handling is live; the rest serves the GPU builds.
#![cfg_attr(not(feature = "cuda"), allow(dead_code, unused_imports))]

mod channels_bench;
#[cfg(feature = "cuda")]
mod cuda_suite;
mod faults;
mod kernels;
mod rendezvous;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use oxccl_hal::{Error, Result};

use crate::rendezvous::Rendezvous;
use crate::report::Report;

const USAGE: &str =
    "usage: oxccl-gpu-suite <selftest|suite|channels|faults CASE> [--rendezvous DIR] [--timeout SECS] [--seed N]\n\
  env: RANK, WORLD_SIZE, LOCAL_RANK (torchrun), OXCCL_SUITE_DIR, OXCCL_SUITE_RUN_ID";

#[derive(Debug)]
struct Args {
    command: String,
    rendezvous: Option<PathBuf>,
    timeout: Duration,
    seed: u32,
    /// The fault case (`faults CASE`).
    case: Option<String>,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let command = it
        .next()
        .ok_or_else(|| Error::InvalidArgument(USAGE.into()))?;
    let mut args = Args {
        command,
        rendezvous: std::env::var_os("OXCCL_SUITE_DIR").map(PathBuf::from),
        timeout: Duration::from_secs(120),
        seed: 1,
        case: None,
    };
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| Error::InvalidArgument(format!("{flag} needs a value\n{USAGE}")))
        };
        match flag.as_str() {
            "--rendezvous" => args.rendezvous = Some(PathBuf::from(value()?)),
            "--timeout" => {
                let v = value()?;
                let secs: u64 = v
                    .parse()
                    .map_err(|_| Error::InvalidArgument(format!("--timeout {v}")))?;
                args.timeout = Duration::from_secs(secs);
            }
            "--seed" => {
                let v = value()?;
                args.seed = v
                    .parse()
                    .map_err(|_| Error::InvalidArgument(format!("--seed {v}")))?;
            }
            "-h" | "--help" => return Err(Error::InvalidArgument(USAGE.into())),
            case if args.command == "faults" && args.case.is_none() => {
                args.case = Some(case.to_string())
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown argument {other}\n{USAGE}"
                )))
            }
        }
    }
    Ok(args)
}

fn env_u32(name: &str, default: u32) -> Result<u32> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a number"))),
        Err(_) => Ok(default),
    }
}

struct Ranks {
    rank: u32,
    world: u32,
    local_rank: u32,
}

fn ranks() -> Result<Ranks> {
    let r = Ranks {
        rank: env_u32("RANK", 0)?,
        world: env_u32("WORLD_SIZE", 1)?,
        local_rank: env_u32("LOCAL_RANK", 0)?,
    };
    if r.world == 0 || r.rank >= r.world {
        return Err(Error::InvalidArgument(format!(
            "RANK {} of WORLD_SIZE {}",
            r.rank, r.world
        )));
    }
    Ok(r)
}

fn rendezvous(args: &Args, r: &Ranks) -> Result<Rendezvous> {
    let dir = match (&args.rendezvous, r.world) {
        (Some(d), _) => d.clone(),
        (None, 1) => std::env::temp_dir().join(format!("oxccl-suite-{}", std::process::id())),
        (None, _) => {
            return Err(Error::InvalidArgument(format!(
                "{} ranks need a shared rendezvous directory: --rendezvous DIR or OXCCL_SUITE_DIR",
                r.world
            )))
        }
    };
    let run = std::env::var("OXCCL_SUITE_RUN_ID")
        .or_else(|_| std::env::var("TORCHELASTIC_RUN_ID"))
        .unwrap_or_else(|_| "run".into());
    Rendezvous::new(&dir, &run, r.rank, r.world, args.timeout)
}

/// The kernels' self-test on `LOCAL_RANK`'s device of the chosen backend (`OXCCL_BACKEND`,
/// else the GPU backend that was built, else the host backend's host kernels).
fn selftest(args: &Args, r: &Ranks) -> Result<bool> {
    use oxccl_hal::{Backend, DeviceId};
    let device = oxccl_backend::AnyBackend::open_device(DeviceId(r.local_rank))?;
    let report =
        oxccl_kernels::selftest::run::<oxccl_backend::AnyBackend>(&device, u64::from(args.seed))?;
    println!(
        "oxccl self-test, rank {} on {} device {}:\n{report}",
        r.rank,
        device.backend(),
        r.local_rank
    );
    Ok(report.passed())
}

#[cfg(feature = "cuda")]
fn suite(args: &Args, r: &Ranks) -> Result<bool> {
    let rdv = rendezvous(args, r)?;
    let report = match cuda_suite::run(rdv.clone(), r.local_rank) {
        Ok(rep) => rep,
        Err(e) => {
            let mut rep = Report::new(r.rank);
            rep.push(
                "setup",
                report::CaseResult::from_result(Err(e), Duration::ZERO),
            );
            rep
        }
    };
    let mine_ok = report.passed();
    let gathered = rdv.gather_partial("report", &report.to_wire())?;
    if r.rank == 0 {
        let reports: Vec<Option<Report>> = gathered
            .iter()
            .enumerate()
            .map(|(i, b)| b.as_ref().map(|b| Report::from_wire(i as u32, b)))
            .collect();
        let (table, all_ok) = report::render(&reports);
        println!("oxccl GPU suite, {} ranks:\n{table}", r.world);
        return Ok(all_ok && mine_ok);
    }
    Ok(mine_ok)
}

#[cfg(not(feature = "cuda"))]
fn suite(args: &Args, r: &Ranks) -> Result<bool> {
    let _ = rendezvous(args, r)?;
    Err(Error::Unsupported(
        "the multi-process suite needs a GPU backend; rebuild with --features cuda".into(),
    ))
}

fn main() -> ExitCode {
    let outcome = parse_args().and_then(|args| {
        let r = ranks()?;
        match args.command.as_str() {
            "selftest" => selftest(&args, &r),
            "suite" => suite(&args, &r),
            "channels" => channels_bench::run(args.timeout),
            "faults" => faults::run(args.case.as_deref().unwrap_or("")),
            other => Err(Error::InvalidArgument(format!(
                "unknown command {other}\n{USAGE}"
            ))),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("oxccl-gpu-suite: {e}");
            ExitCode::from(2)
        }
    }
}
