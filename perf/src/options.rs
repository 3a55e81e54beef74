//! Command line of oxccl-perf.

use oxccl_collectives::hal::{AccumType, DataType, Error, ReduceOp, Result};

use crate::collective::{self, Collective};

/// Usage text.
pub const USAGE: &str = "\
usage: oxccl-perf [options]
  -c, --collective C      allreduce (default), allgather, reducescatter, alltoall,
                          alltoallv (uneven chunks), broadcast, reduce
  -b, --minbytes SIZE     smallest size (K/M/G suffixes), default 1K; sizes are nccl-tests':
                          the larger of one rank's buffers (allreduce, broadcast, reduce:
                          the message; allgather: the gathered output, ranks x the per-rank
                          count; reducescatter: the input, ranks x the output; alltoall,
                          alltoallv: either buffer, ranks x the per-peer count)
  -r, --root N            the root rank (broadcast, reduce), default 0
  -e, --maxbytes SIZE     largest size, default 64M
  -f, --stepfactor N      multiply the size by N each step, default 2
  -d, --datatype T        f32 f16 bf16 fp8_e4m3 fp8_e5m2 fp8_e4m3fnuz fp8_e5m2fnuz fp8_e4m3b15 (default bf16)
  -o, --op OP             sum prod min max avg (default sum; allreduce, reducescatter,
                          reduce)
      --accum A           auto native f16 f32 (default auto; allreduce, reducescatter,
                          reduce)
      --in-place          in place (allgather: the input is the rank's slot of the output;
                          reducescatter: the output is the rank's chunk of the input;
                          alltoall has none; default: out of place)
      --no-register       do not register the buffers with the communicator (default:
                          registered, so large sizes take the zero-copy two-shot)
  -w, --warmup N          warm-up calls per size, default 5
      --iters N           timed calls per size, default 20
  -N, --nprocs N          start N ranks of this program on this machine
      --graph             time CUDA graph replays of the calls (CUDA only; ROCm times eagerly)
      --tune MODE         before the sweep, tune the selector for the data type up to the
                          largest size: cache (load the cached table, measure if none) or
                          force (measure again); tables live in OXCCL_TUNE_DIR (allreduce)
      --compare nccl      measure the vendor's library on the same buffers, loaded at run time:
                          NCCL (libnccl.so.2) on CUDA, RCCL (librccl.so.1) on ROCm; `rccl` is
                          accepted too; OXCCL_NCCL_LIB_PATH names another file. Where
                          the library has symmetric windows (NCCL 2.27+) allreduce,
                          allgather and reducescatter are measured twice: NCCL's default
                          mode on our buffers, and its symmetric-memory kernels on
                          ncclMemAlloc buffers registered as symmetric windows; the
                          speedup is against the faster of the two
      --nccl-default-only compare NCCL's default mode only
      --soak SECONDS      instead of the table: random collectives, types, ops, placements
                          and sizes between -b and -e for that long, every call checked
                          against the reference; resident memory, descriptors and mappings
                          printed each minute and required flat (--json: the samples)
      --json FILE         write every row as JSON
      --plot FILE.png     draw latency and busbw against the size (oxccl, and NCCL when
                          compared) into a PNG
      --plot-from FILE    draw the PNG from a JSON file written earlier by --json and exit
                          (to --plot FILE.png, default: FILE with .png for .json)
  -h, --help              this text
environment: OXCCL_ALGO, OXCCL_TUNE, OXCCL_TUNE_DIR, OXCCL_ONESHOT_MAX_BYTES, OXCCL_ZC_THRESHOLD_BYTES, OXCCL_BACKEND, OXCCL_LOG, OXCCL_TIMEOUT_MS, launcher variables";

/// Flags `--soak` refuses.
const SOAK_REFUSES: [&str; 19] = [
    "-c",
    "--collective",
    "-d",
    "--datatype",
    "-o",
    "--op",
    "--in-place",
    "-r",
    "--root",
    "-f",
    "--graph",
    "--compare",
    "--nccl-default-only",
    "--tune",
    "--plot",
    "--plot-from",
    "-w",
    "--warmup",
    "--iters",
];

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Options {
    pub collective: &'static Collective,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub factor: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub accum: AccumType,
    pub in_place: bool,
    /// The root rank (broadcast, reduce).
    pub root: u32,
    pub no_register: bool,
    pub warmup: usize,
    pub iters: usize,
    pub nprocs: Option<u32>,
    pub graph: bool,
    pub compare_nccl: bool,
    /// `--nccl-default-only`: compare NCCL's default mode alone (no symmetric windows).
    pub nccl_default_only: bool,
    /// `--soak SECONDS`: random checked collectives for that long instead of the table.
    pub soak: Option<u64>,
    /// Tune before the sweep: `Some(force)`.
    pub tune: Option<bool>,
    pub json: Option<String>,
    pub plot: Option<String>,
    pub plot_from: Option<String>,
    pub help: bool,
}

/// Parses "64", "1K", "4M", "1G" (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| Error::InvalidArgument(format!("'{s}' is not a size (e.g. 64, 8K, 4M, 1G)")))
}

fn number(s: &str, what: &str) -> Result<usize> {
    s.parse::<usize>()
        .map_err(|_| Error::InvalidArgument(format!("{what}: '{s}' is not a number")))
}

fn accum(s: &str) -> Result<AccumType> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(AccumType::Auto),
        "native" => Ok(AccumType::Native),
        "f16" => Ok(AccumType::F16),
        "f32" => Ok(AccumType::F32),
        other => Err(Error::InvalidArgument(format!(
            "--accum '{other}': auto, native, f16 or f32"
        ))),
    }
}

impl Options {
    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options> {
        let mut o = Options {
            collective: collective::COLLECTIVES[0],
            min_bytes: 1 << 10,
            max_bytes: 64 << 20,
            factor: 2,
            dtype: DataType::Bf16,
            op: ReduceOp::Sum,
            accum: AccumType::Auto,
            in_place: false,
            root: 0,
            no_register: false,
            warmup: 5,
            iters: 20,
            nprocs: None,
            graph: false,
            compare_nccl: false,
            nccl_default_only: false,
            soak: None,
            tune: None,
            json: None,
            plot: None,
            plot_from: None,
            help: false,
        };
        let mut it = args.into_iter();
        // Flags the soak draws itself or has no use for (refused with --soak).
        let mut not_for_soak = Vec::new();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            if SOAK_REFUSES.contains(&flag.as_str()) {
                not_for_soak.push(flag.clone());
            }
            let mut value = || -> Result<String> {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| Error::InvalidArgument(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "-c" | "--collective" => {
                    let v = value()?;
                    o.collective = collective::by_name(&v).ok_or_else(|| {
                        Error::InvalidArgument(format!("-c {v}: one of {}", collective::names()))
                    })?;
                }
                "-b" | "--minbytes" => o.min_bytes = parse_size(&value()?)?,
                "-e" | "--maxbytes" => o.max_bytes = parse_size(&value()?)?,
                "-f" | "--stepfactor" => o.factor = number(&value()?, "-f")?,
                "-d" | "--datatype" => o.dtype = value()?.parse()?,
                "-o" | "--op" => o.op = value()?.parse()?,
                "--accum" => o.accum = accum(&value()?)?,
                "--in-place" => o.in_place = true,
                "-r" | "--root" => {
                    o.root = u32::try_from(number(&value()?, "--root")?)
                        .map_err(|_| Error::InvalidArgument("--root: too large".into()))?
                }
                "--no-register" => o.no_register = true,
                "-w" | "--warmup" => o.warmup = number(&value()?, "-w")?,
                "--iters" => o.iters = number(&value()?, "--iters")?.max(1),
                "-N" | "--nprocs" => {
                    let n = number(&value()?, "-N")?;
                    if !(1..=8).contains(&n) {
                        return Err(Error::InvalidArgument(format!("-N {n}: 1..=8 ranks")));
                    }
                    o.nprocs = Some(n as u32);
                }
                "--graph" => o.graph = true,
                "--compare" => {
                    let v = value()?;
                    if !v.eq_ignore_ascii_case("nccl") && !v.eq_ignore_ascii_case("rccl") {
                        return Err(Error::InvalidArgument(format!(
                            "--compare {v}: only nccl (or rccl)"
                        )));
                    }
                    o.compare_nccl = true;
                }
                "--nccl-default-only" => o.nccl_default_only = true,
                "--soak" => {
                    let v = number(&value()?, "--soak")?;
                    if v == 0 {
                        return Err(Error::InvalidArgument("--soak 0: at least 1 second".into()));
                    }
                    o.soak = Some(v as u64);
                }
                "--tune" => {
                    o.tune = Some(match value()?.to_ascii_lowercase().as_str() {
                        "cache" | "cached" => false,
                        "force" => true,
                        v => {
                            return Err(Error::InvalidArgument(format!(
                                "--tune {v}: cache or force"
                            )))
                        }
                    })
                }
                "--json" => o.json = Some(value()?),
                "--plot" => {
                    let v = value()?;
                    if !v.to_ascii_lowercase().ends_with(".png") {
                        return Err(Error::InvalidArgument(format!(
                            "--plot {v}: the file name must end in .png"
                        )));
                    }
                    o.plot = Some(v);
                }
                "--plot-from" => o.plot_from = Some(value()?),
                "-h" | "--help" => o.help = true,
                other => return Err(Error::InvalidArgument(format!("unknown option '{other}'"))),
            }
        }
        if o.min_bytes == 0 || o.max_bytes < o.min_bytes {
            return Err(Error::InvalidArgument(format!(
                "sizes: -b {} -e {} (need 0 < b <= e)",
                o.min_bytes, o.max_bytes
            )));
        }
        if o.factor < 2 {
            return Err(Error::InvalidArgument("-f must be at least 2".into()));
        }
        if o.soak.is_some() && !not_for_soak.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "--soak draws the collective, type, op, placement and root of every call and \
                 times nothing, so {} mean nothing with it",
                not_for_soak.join(", ")
            )));
        }
        o.check_collective()?;
        Ok(o)
    }

    /// Refuses flags the collective has no use for, rather than ignoring them: an op or an
    /// accumulation type other than the defaults without a reduction, `--tune` where
    /// `Communicator::tune` does not tune the collective's selector.
    fn check_collective(&self) -> Result<()> {
        let c = self.collective;
        if !c.reduces() && (self.op != ReduceOp::Sum || self.accum != AccumType::Auto) {
            return Err(Error::InvalidArgument(format!(
                "-c {}: does not reduce, so -o {} / --accum {} mean nothing (only the \
                 defaults, sum and auto, are accepted)",
                c.name, self.op, self.accum
            )));
        }
        if self.in_place && !c.has_in_place {
            return Err(Error::InvalidArgument(format!(
                "-c {}: NCCL defines no in-place form, so --in-place is refused",
                c.name
            )));
        }
        if self.root != 0 && !c.kind.has_root() {
            return Err(Error::InvalidArgument(format!(
                "-c {}: has no root, so --root {} means nothing",
                c.name, self.root
            )));
        }
        if self.tune.is_some() && !c.tunable {
            return Err(Error::InvalidArgument(format!(
                "-c {}: --tune tunes the allreduce selector only",
                c.name
            )));
        }
        Ok(())
    }

    /// Where `--plot-from` draws: `--plot`, else the JSON file's name with `.png`.
    pub fn plot_from_target(&self) -> Option<String> {
        let from = self.plot_from.as_ref()?;
        Some(self.plot.clone().unwrap_or_else(|| {
            let p = std::path::Path::new(from);
            if p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("json"))
            {
                p.with_extension("png").to_string_lossy().into_owned()
            } else {
                format!("{from}.png")
            }
        }))
    }

    /// Message sizes in bytes, smallest first.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            match s.checked_mul(self.factor) {
                Some(n) => s = n,
                None => break,
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Options> {
        Options::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn soak_takes_sizes_and_refuses_what_it_draws_itself() {
        let o = parse("--soak 600 -b 1 -e 64M -N 2 --json s.json").unwrap();
        assert_eq!(o.soak, Some(600));
        assert_eq!((o.min_bytes, o.max_bytes), (1, 64 << 20));
        assert!(parse("--soak 0").is_err());
        for extra in [
            "-c allgather",
            "-d f32",
            "--graph",
            "--compare nccl",
            "-r 1",
            "--iters 3",
        ] {
            let e = parse(&format!("--soak 10 {extra}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--soak draws"), "{extra}: {e}");
        }
    }

    #[test]
    fn sizes_and_flags() {
        let o = parse("-N 2 -b 1K -e 1M -f 4 -d f32 -o max --iters 3 --json=x.json").unwrap();
        assert_eq!(o.sizes(), vec![1024, 4096, 16384, 65536, 262144, 1 << 20]);
        assert_eq!(
            (o.nprocs, o.dtype, o.op, o.iters),
            (Some(2), DataType::F32, ReduceOp::Max, 3)
        );
        assert_eq!(o.json.as_deref(), Some("x.json"));
        let o = parse("--plot-from r.json --plot=out.PNG").unwrap();
        assert_eq!(
            (o.plot_from.as_deref(), o.plot.as_deref()),
            (Some("r.json"), Some("out.PNG"))
        );
        assert!(parse("--plot out.svg").is_err());
        assert_eq!(parse_size("3G").unwrap(), 3 << 30);
        assert!(parse("-b 1X").is_err());
        assert!(parse("-b 2M -e 1M").is_err());
        assert!(parse("--compare mpi").is_err());
        let o = parse("--compare nccl --nccl-default-only").unwrap();
        assert!(o.compare_nccl && o.nccl_default_only);
        assert!(parse("-N 9").is_err());
        assert!(parse("--bogus").is_err());
        assert_eq!(o.collective.name, "allreduce");
    }

    #[test]
    fn collective_flag() {
        assert_eq!(parse("").unwrap().collective.name, "allreduce");
        assert_eq!(parse("-c allreduce").unwrap().collective.name, "allreduce");
        assert_eq!(
            parse("--collective=all_reduce -o max --tune force")
                .unwrap()
                .collective
                .name,
            "allreduce"
        );
        assert_eq!(parse("-c allgather").unwrap().collective.name, "allgather");
        let o = parse("-c all_gather -o sum --accum auto --in-place -d fp8_e4m3fnuz").unwrap();
        assert_eq!(o.collective.name, "allgather");
        let e = parse("-c gather").unwrap_err().to_string();
        assert!(
            e.contains("-c gather") && e.contains("allreduce, allgather"),
            "{e}"
        );
        assert!(parse("-c").is_err());
    }

    #[test]
    fn allgather_refuses_what_it_has_no_use_for() {
        // No reduction: an op or accumulation other than the defaults is an error, in
        // either order of the flags.
        for args in [
            "-c allgather -o max",
            "-o avg -c allgather",
            "-c allgather --accum f32",
            "--accum=native --collective allgather",
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains("does not reduce"), "{args}: {e}");
        }
        let e = parse("-c allgather --tune cache").unwrap_err().to_string();
        assert!(
            e.contains("--tune tunes the allreduce selector only"),
            "{e}"
        );
        // The same flags are fine for allreduce.
        assert!(parse("-o max --accum f32 --tune cache").is_ok());
    }
}
