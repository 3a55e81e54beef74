//! Host time spent inside each exported function, under `OXCCL_NCCL_PROFILE=1`: calls,
//! mean, median, 99th percentile and worst, per function, written to stderr when a
//! communicator is finalized, destroyed or aborted (and by [`report`]). Also, per function,
//! the time outside this library between two calls of it on one thread (an eager loop's
//! share spent in the caller: PyTorch's own work per call).
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

/// Histogram buckets: eight per power of two (quantiles within 12%); see [`bucket_of`].
const BUCKETS: usize = 64 * 8;

/// The bucket of `ns`: below 8 ns one per nanosecond; above, octave `o` (`2^o <= ns`)
/// split in eight by the three bits after the leading one.
fn bucket_of(ns: u64) -> usize {
    if ns < 8 {
        return ns as usize;
    }
    let o = u64::BITS - 1 - ns.leading_zeros();
    let s = (ns >> (o - 3)) & 7;
    (o as usize) * 8 + s as usize
}

/// The first time past bucket `b`.
fn bucket_end(b: usize) -> u64 {
    if b < 8 {
        return b as u64 + 1;
    }
    let (o, s) = ((b / 8) as u32, (b % 8) as u64);
    if o < 3 {
        // Buckets 8..24 hold nothing: times up to 7 ns have their own, 8 ns starts octave 3.
        return 8;
    }
    (9 + s).checked_shl(o - 3).unwrap_or(u64::MAX)
}

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
        self.buckets[bucket_of(ns).min(BUCKETS - 1)] += 1;
    }

    fn merge(&mut self, other: &Stats) {
        self.calls += other.calls;
        self.total_ns = self.total_ns.saturating_add(other.total_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }

    /// The upper edge of the bucket holding the `q`-quantile (within 12%).
    fn quantile_ns(&self, q: f64) -> u64 {
        let want = ((self.calls as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return bucket_end(b);
            }
        }
        self.max_ns
    }
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Span {
    /// Inside the function.
    Inside,
    /// From the return of one call of the function to the start of the next on the same
    /// thread, with no other call of this library between.
    Between,
}

type Table = BTreeMap<(&'static str, Span), Stats>;

/// Every thread's table, for [`report`].
fn tables() -> &'static Mutex<Vec<Arc<Mutex<Table>>>> {
    static ALL: OnceLock<Mutex<Vec<Arc<Mutex<Table>>>>> = OnceLock::new();
    ALL.get_or_init(|| Mutex::new(Vec::new()))
}

thread_local! {
    static MINE: RefCell<Option<Arc<Mutex<Table>>>> = const { RefCell::new(None) };
    /// The function this thread last returned from, and when.
    static LAST: std::cell::Cell<Option<(&'static str, Instant)>> = const { std::cell::Cell::new(None) };
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
    measure(name, body)
}

/// [`timed`] with profiling on.
fn measure<T>(name: &'static str, body: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    if let Some((last, at)) = LAST.with(|l| l.take()) {
        if last == name {
            record((name, Span::Between), nanos(start - at));
        }
    }
    let out = body();
    let end = Instant::now();
    record((name, Span::Inside), nanos(end - start));
    LAST.with(|l| l.set(Some((name, end))));
    out
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn record(key: (&'static str, Span), ns: u64) {
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
            .entry(key)
            .or_default()
            .add(ns);
    });
}

/// Every function's figures so far, all threads together, most total time first.
pub fn summary() -> Vec<String> {
    let mut merged = Table::new();
    for t in tables().lock().unwrap_or_else(|p| p.into_inner()).iter() {
        for (key, s) in t.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            merged.entry(*key).or_default().merge(s);
        }
    }
    // Functions by their total time inside; each one's time between calls after it (the
    // table is ordered by (name, span), so a stable sort keeps Inside before Between).
    let inside: BTreeMap<&'static str, u64> = merged
        .iter()
        .filter(|((_, span), _)| *span == Span::Inside)
        .map(|((name, _), s)| (*name, s.total_ns))
        .collect();
    let mut rows: Vec<((&'static str, Span), Stats)> = merged.into_iter().collect();
    rows.sort_by_key(|((name, _), _)| std::cmp::Reverse(inside.get(name).copied().unwrap_or(0)));
    rows.iter()
        .map(|((name, span), s)| {
            let what = match span {
                Span::Inside => format!("{name}: {} calls", s.calls),
                Span::Between => format!("  outside, between two {name} calls: {}", s.calls),
            };
            format!(
                "{what}, mean {:.2} us, median < {:.2} us, p99 < {:.2} us, max {:.2} us",
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
        // 900 in [896, 960), 1000 in [960, 1024), 1100 in [1024, 1152), 5000 in [4608, 5120).
        assert_eq!(
            (bucket_end(bucket_of(900)), bucket_end(bucket_of(1000))),
            (960, 1024)
        );
        assert_eq!(s.quantile_ns(0.5), 1024);
        assert_eq!(s.quantile_ns(0.99), 5120);
        assert_eq!(s.quantile_ns(0.2), 2);
        // Every time lies below its bucket's end, and the end starts a later bucket.
        for ns in [
            0,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            1023,
            1024,
            1025,
            123_456_789,
            u64::MAX / 3,
        ] {
            let b = bucket_of(ns);
            let end = bucket_end(b);
            assert!(ns < end, "{ns}");
            assert_eq!(bucket_of(end - 1), b, "{ns}");
            assert!(bucket_of(end) > b, "{ns}");
        }
        let mut t = s.clone();
        t.merge(&s);
        assert_eq!((t.calls, t.total_ns, t.max_ns), (10, 16_002, 5_000));
    }

    #[test]
    fn records_from_several_threads_are_summed() {
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..4 {
                        record(("ncclProfileTest", Span::Inside), 2_000);
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

    #[test]
    fn time_between_two_calls_of_one_function_is_kept_apart() {
        // A thread of its own: `LAST` is per thread. Two calls of the function follow each
        // other once without another function between.
        std::thread::spawn(record_sequence).join().unwrap();
        let rows = summary();
        let inside = rows
            .iter()
            .find(|l| l.starts_with("ncclBetweenTest: 3 calls"));
        let between = rows
            .iter()
            .find(|l| l.contains("outside, between two ncclBetweenTest calls: 1,"));
        assert!(inside.is_some() && between.is_some(), "{rows:#?}");
    }

    fn record_sequence() {
        for name in [
            "ncclBetweenTest",
            "ncclOtherTest",
            "ncclBetweenTest",
            "ncclBetweenTest",
        ] {
            measure(name, || ());
        }
    }
}
