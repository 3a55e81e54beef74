//! Rows of the table, agreement across ranks, the JSON file.

use std::fmt::Write as _;

use oxccl_collectives::hal::{BackendKind, Device, Error, Result};
use oxccl_collectives::Communicator;

use crate::json;
use crate::options::Options;

/// One implementation's result at one size (after [`agree`]: over all ranks).
#[derive(Debug, Clone, Copy, Default)]
pub struct Side {
    /// Microseconds per call (the slowest rank's).
    pub us: f64,
    /// Elements that differ from the exact reference (all ranks).
    pub wrong: usize,
    /// Elements checked (all ranks).
    pub checked: usize,
    /// Largest relative error vs the f64 reference (all ranks).
    pub max_rel_err: f64,
}

/// One size.
#[derive(Debug, Clone)]
pub struct Row {
    /// nccl-tests' size ([`crate::collective::Shape::size`]).
    pub bytes: usize,
    /// Elements passed to the call.
    pub count: usize,
    pub algorithm: &'static str,
    /// busbw / algbw of the collective on this many ranks.
    pub bus_factor: f64,
    pub ours: Side,
    /// The vendor's library in its default mode, on our buffers.
    pub nccl: Option<Side>,
    /// NCCL's symmetric-memory kernels, on buffers in symmetric windows (NCCL 2.27+).
    pub nccl_symmetric: Option<Side>,
}

impl Row {
    /// The faster of the vendor's modes measured at this size.
    pub fn best_nccl(&self) -> Option<Side> {
        match (self.nccl, self.nccl_symmetric) {
            (Some(d), Some(s)) => Some(if s.us > 0.0 && s.us < d.us { s } else { d }),
            (d, s) => d.or(s),
        }
    }
}

impl Side {
    /// Algorithm bandwidth in GB/s.
    pub fn algbw(&self, bytes: usize) -> f64 {
        if self.us > 0.0 {
            bytes as f64 / self.us / 1e3
        } else {
            0.0
        }
    }

    /// Bus bandwidth in GB/s: algbw x the collective's factor
    /// ([`crate::collective::Collective::bus_factor`]).
    pub fn busbw(&self, bytes: usize, factor: f64) -> f64 {
        self.algbw(bytes) * factor
    }
}

/// Combines every rank's `side`: slowest time, summed counts, largest error.
pub fn agree(comm: &Communicator, side: Side) -> Result<Side> {
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&side.us.to_le_bytes());
    b.extend_from_slice(&(side.wrong as u64).to_le_bytes());
    b.extend_from_slice(&(side.checked as u64).to_le_bytes());
    b.extend_from_slice(&side.max_rel_err.to_le_bytes());
    let all = comm.bootstrap().all_gather(&b)?;
    let mut out = Side::default();
    for v in all {
        let word = |i: usize| -> Result<[u8; 8]> {
            v.get(8 * i..8 * i + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| Error::InvalidArgument("short result from a rank".into()))
        };
        out.us = out.us.max(f64::from_le_bytes(word(0)?));
        out.wrong += u64::from_le_bytes(word(1)?) as usize;
        out.checked += u64::from_le_bytes(word(2)?) as usize;
        out.max_rel_err = out.max_rel_err.max(f64::from_le_bytes(word(3)?));
    }
    Ok(out)
}

/// A tuned table as comment lines (rank 0).
pub fn print_tune_table(
    t: &oxccl_collectives::tuner::TuneTable,
    source: oxccl_collectives::tuner::TuneSource,
) {
    println!(
        "# tuned {} for {} ranks on {} ({:?}): size(B) registered algorithm grid x block time(us)",
        t.key.dtype, t.key.world, t.key.device, source
    );
    for e in &t.entries {
        println!(
            "#   {:>11} {:>5} {:>12} {:>4} x {:<4} {:>10.2}",
            e.bytes,
            if e.registered { "reg" } else { "-" },
            e.algorithm.name(),
            e.grid,
            e.block,
            e.us
        );
    }
}

/// Width of the algorithm column: the longest algorithm name.
fn algorithm_width() -> usize {
    oxccl_collectives::ALGORITHMS
        .iter()
        .map(|a| a.name().len())
        .max()
        .unwrap_or(0)
        .max("algorithm".len())
}

/// The table's header (rank 0).
pub fn header(opts: &Options, comm: &Communicator) {
    let caps = comm.device().capabilities();
    let c = opts.collective;
    let data = if c.reduces() {
        format!("{} {} accum {}", opts.dtype, opts.op, opts.accum)
    } else {
        opts.dtype.to_string()
    };
    println!(
        "# oxccl-perf {}: {} ranks on {} ({}), {data}, {}, {}, {} warm-up + {} iterations{}",
        c.name,
        comm.world_size(),
        caps.name,
        Device::backend(comm.device()),
        if opts.in_place {
            "in place"
        } else {
            "out of place"
        },
        if opts.no_register {
            "unregistered buffers"
        } else {
            "registered buffers"
        },
        opts.warmup,
        opts.iters,
        match (opts.graph, Device::backend(comm.device())) {
            (false, _) => "",
            (true, BackendKind::Cuda) => ", graph replay",
            // collectives::timing falls back to eager timing where the backend has no graphs.
            (true, _) => ", timed eagerly (--graph: no graphs on this backend)",
        }
    );
    if Device::backend(comm.device()) != BackendKind::Host && comm.world_size() > 1 {
        println!(
            "# peers: {}",
            if comm.nvlink() {
                "NVLink between every pair of ranks (oneshot_ll128 available)"
            } else {
                "not all over NVLink (oneshot_ll128 off)"
            }
        );
        println!(
            "# launch: {}",
            if comm.early_launch() {
                "early (each kernel waits on the GPU for the one before it)"
            } else {
                "after the previous kernel (early launch off or not supported)"
            }
        );
    }
    let mut h = format!(
        "{:>12} {:>12} {:>w$} {:>10} {:>9} {:>9} {:>7} {:>9}",
        "size(B)",
        "count",
        "algorithm",
        "time(us)",
        "algbw",
        "busbw",
        "#wrong",
        "maxerr",
        w = algorithm_width()
    );
    if opts.compare_nccl {
        // The vendor's library: NCCL, or RCCL on ROCm.
        let lib = oxccl_collectives::backend::vendor::name(Device::backend(comm.device()));
        let _ = write!(
            h,
            " | {:>10} {:>9} {:>9} {:>8}",
            format!("{}(us)", lib.to_ascii_lowercase()),
            "busbw",
            "maxerr",
            "speedup"
        );
        if symmetric_columns(opts) {
            let _ = write!(
                h,
                " | {:>10} {:>9} {:>9} {:>8}",
                "sym(us)", "busbw", "maxerr", "vs best"
            );
        }
    }
    println!("{h}");
}

/// Whether the table has the symmetric-mode columns: the collective has NCCL symmetric
/// kernels and they were not turned off (a library without windows prints "-" there).
pub fn symmetric_columns(opts: &Options) -> bool {
    opts.compare_nccl && opts.collective.nccl_symmetric && !opts.nccl_default_only
}

fn speedup(ours: &Side, theirs: &Side) -> f64 {
    if ours.us > 0.0 {
        theirs.us / ours.us
    } else {
        0.0
    }
}

/// One row (rank 0).
pub fn print_row(opts: &Options, r: &Row) {
    let mut line = format!(
        "{:>12} {:>12} {:>w$} {:>10.2} {:>9.2} {:>9.2} {:>7} {:>9.2e}",
        r.bytes,
        r.count,
        r.algorithm,
        r.ours.us,
        r.ours.algbw(r.bytes),
        r.ours.busbw(r.bytes, r.bus_factor),
        r.ours.wrong,
        r.ours.max_rel_err,
        w = algorithm_width()
    );
    if let Some(n) = &r.nccl {
        let _ = write!(
            line,
            " | {:>10.2} {:>9.2} {:>9.2e} {:>7.2}x",
            n.us,
            n.busbw(r.bytes, r.bus_factor),
            n.max_rel_err,
            speedup(&r.ours, n)
        );
    }
    if symmetric_columns(opts) {
        match (&r.nccl_symmetric, r.best_nccl()) {
            (Some(s), Some(best)) => {
                let _ = write!(
                    line,
                    " | {:>10.2} {:>9.2} {:>9.2e} {:>7.2}x",
                    s.us,
                    s.busbw(r.bytes, r.bus_factor),
                    s.max_rel_err,
                    speedup(&r.ours, &best)
                );
            }
            _ => {
                let _ = write!(line, " | {:>10} {:>9} {:>9} {:>8}", "-", "-", "-", "-");
            }
        }
    }
    println!("{line}");
}

fn side_json(s: &Side, bytes: usize, factor: f64) -> json::Side {
    json::Side {
        time_us: s.us,
        algbw_gbps: Some(s.algbw(bytes)),
        busbw_gbps: Some(s.busbw(bytes, factor)),
        wrong: s.wrong as u64,
        checked: s.checked as u64,
        max_rel_err: s.max_rel_err.is_finite().then_some(s.max_rel_err),
    }
}

/// Writes every row as JSON ([`json::Report`]).
pub fn write_json(path: &str, opts: &Options, comm: &Communicator, rows: &[Row]) -> Result<()> {
    let caps = comm.device().capabilities();
    let c = opts.collective;
    let report = json::Report {
        tool: "oxccl-perf".to_string(),
        collective: c.name.to_string(),
        ranks: comm.world_size(),
        device: caps.name.clone(),
        backend: Device::backend(comm.device()).to_string(),
        dtype: opts.dtype.to_string(),
        op: c.reduces().then(|| opts.op.to_string()),
        accum: c.reduces().then(|| opts.accum.to_string()),
        in_place: opts.in_place,
        graph: opts.graph,
        rows: rows
            .iter()
            .map(|r| json::Row {
                bytes: r.bytes as u64,
                count: r.count as u64,
                algorithm: r.algorithm.to_string(),
                oxccl: side_json(&r.ours, r.bytes, r.bus_factor),
                nccl: r.nccl.as_ref().map(|n| side_json(n, r.bytes, r.bus_factor)),
                nccl_symmetric: r
                    .nccl_symmetric
                    .as_ref()
                    .map(|n| side_json(n, r.bytes, r.bus_factor)),
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&report)
        .map_err(|e| Error::InvalidArgument(format!("JSON: {e}")))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::Os {
        call: "write (--json)",
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(us: f64) -> Side {
        Side {
            us,
            ..Side::default()
        }
    }

    #[test]
    fn best_nccl_is_the_faster_mode_measured() {
        let row = |d: Option<f64>, s: Option<f64>| Row {
            bytes: 1024,
            count: 512,
            algorithm: "oneshot_ll",
            bus_factor: 1.0,
            ours: side(2.0),
            nccl: d.map(side),
            nccl_symmetric: s.map(side),
        };
        let best = |r: Row| r.best_nccl().map(|s| s.us);
        assert_eq!(best(row(Some(6.0), Some(4.0))), Some(4.0));
        assert_eq!(best(row(Some(6.0), Some(8.0))), Some(6.0));
        assert_eq!(best(row(Some(6.0), None)), Some(6.0));
        assert_eq!(best(row(None, Some(5.0))), Some(5.0));
        assert_eq!(best(row(None, None)), None);
        // A symmetric side that measured nothing never wins.
        assert_eq!(best(row(Some(6.0), Some(0.0))), Some(6.0));
        assert_eq!(speedup(&side(2.0), &side(6.0)), 3.0);
    }
}
