//! Host time spent inside each exported function, under `OXCCL_NCCL_PROFILE=1`: calls,
//! mean, median, 99th percentile and worst, per function, written to stderr when a
//! communicator is destroyed or aborted (and by [`report`]).
//!
//! Why: a call through this library costs less host time than the real NCCL's in a loop
//! of its own (`ci/gpu/nccl_call_cost.c`), yet PyTorch's eager loops of small calls ran
//! slower with it preloaded. This tells whether the extra time is spent in here (each
//! function's time measured around its body, under PyTorch's own threads) or outside.
//!
//! Each thread keeps its own table (no lock shared between the calling thread and
//! PyTorch's watchdog on the measured path); the tables are merged only to report.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Histogram buckets: bucket `b` holds times in `[2^b, 2^(b+1))` nanoseconds.
const BUCKETS: usize = 40;

/// One function's times on one thread.
#[derive(Debug, Clone)]
struct Stats {
    calls: u64,
    total_ns: u64,
    max_ns: u64,
    buckets: [u64; BUCKETS],
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            calls: 0,
            total_ns: 0,
            max_ns: 0,
            buckets: [0; BUCKETS],
        }
    }
}

impl Stats {
    fn add(&mut self, ns: u64) {
        self.calls += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        let b = (u64::BITS - ns.max(1).leading_zeros() - 1) as usize;
        self.buckets[b.min(BUCKETS - 1)] += 1;
    }

    fn merge(&mut self, other: &Stats) {
        self.calls += other.calls;
        self.total_ns = self.total_ns.saturating_add(other.total_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }

    /// The upper edge of the bucket holding the `q`-quantile (within a factor of 2).
    fn quantile_ns(&self, q: f64) -> u64 {
        let want = ((self.calls as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return 1u64 << (b + 1);
            }
        }
        self.max_ns
    }
}

type Table = BTreeMap<&'static str, Stats>;

/// Every thread's table, for [`report`].
fn tables() -> &'static Mutex<Vec<Arc<Mutex<Table>>>> {
    static ALL: OnceLock<Mutex<Vec<Arc<Mutex<Table>>>>> = OnceLock::new();
    ALL.get_or_init(|| Mutex::new(Vec::new()))
}

thread_local! {
    static MINE: RefCell<Option<Arc<Mutex<Table>>>> = const { RefCell::new(None) };
}

/// Whether `OXCCL_NCCL_PROFILE` is on (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        matches!(
            std::env::var("OXCCL_NCCL_PROFILE").as_deref(),
            Ok("1" | "on" | "true")
        )
    })
}

/// Runs `body`, adding its host time to `name`'s figures when profiling is on.
pub fn timed<T>(name: &'static str, body: impl FnOnce() -> T) -> T {
    if !enabled() {
        return body();
    }
    let start = Instant::now();
    let out = body();
    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    record(name, ns);
    out
}

fn record(name: &'static str, ns: u64) {
    MINE.with(|slot| {
        let mut slot = slot.borrow_mut();
        let table = slot.get_or_insert_with(|| {
            let t = Arc::new(Mutex::new(Table::new()));
            tables()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Arc::clone(&t));
            t
        });
        // Uncontended but for a report in progress.
        table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name)
            .or_default()
            .add(ns);
    });
}

/// Every function's figures so far, all threads together, most total time first.
pub fn summary() -> Vec<String> {
    let mut merged = Table::new();
    for t in tables().lock().unwrap_or_else(|p| p.into_inner()).iter() {
        for (name, s) in t.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            merged.entry(name).or_default().merge(s);
        }
    }
    let mut rows: Vec<(&'static str, Stats)> = merged.into_iter().collect();
    rows.sort_by_key(|(_, s)| std::cmp::Reverse(s.total_ns));
    rows.iter()
        .map(|(name, s)| {
            format!(
                "{name}: {} calls, mean {:.2} us, median < {:.2} us, p99 < {:.2} us, max {:.2} us",
                s.calls,
                s.total_ns as f64 / s.calls.max(1) as f64 / 1e3,
                s.quantile_ns(0.5) as f64 / 1e3,
                s.quantile_ns(0.99) as f64 / 1e3,
                s.max_ns as f64 / 1e3
            )
        })
        .collect()
}

/// Writes [`summary`] to stderr, one line per function, when profiling is on.
pub fn report(when: &str) {
    if !enabled() {
        return;
    }
    let pid = std::process::id();
    let mut out = format!("oxccl-nccl: profile of process {pid} at {when}:\n");
    for line in summary() {
        out.push_str(&format!("oxccl-nccl: profile   {line}\n"));
    }
    crate::error::write_log_line(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_land_in_their_buckets_and_merge() {
        let mut s = Stats::default();
        for ns in [1, 900, 1_000, 1_100, 5_000] {
            s.add(ns);
        }
        assert_eq!((s.calls, s.total_ns, s.max_ns), (5, 8_001, 5_000));
        // 900 and 1000 fall in [512, 1024), 1100 in [1024, 2048).
        assert_eq!(s.buckets[9], 2);
        assert_eq!(s.buckets[10], 1);
        assert_eq!(s.quantile_ns(0.5), 1024);
        assert_eq!(s.quantile_ns(0.99), 8192);
        let mut t = s.clone();
        t.merge(&s);
        assert_eq!((t.calls, t.total_ns, t.buckets[9]), (10, 16_002, 4));
    }

    #[test]
    fn records_from_several_threads_are_summed() {
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..4 {
                        record("ncclProfileTest", 2_000);
                    }
                });
            }
        });
        let line = summary()
            .into_iter()
            .find(|l| l.starts_with("ncclProfileTest:"))
            .unwrap();
        assert!(line.contains("12 calls, mean 2.00 us"), "{line}");
    }
}
