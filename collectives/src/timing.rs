//! Timing queued work with device events, eagerly or by CUDA graph replay. Shared by the
//! tuner ([`crate::tuner`]) and `oxccl-perf`, so both measure the same way.

use oxccl_backend::{AnyEvent, AnyStream};
use oxccl_hal::{Event, Result, Stream};

/// How calls are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingMode {
    /// `iters` calls queued one after another between two events.
    Eager,
    /// `iters` calls captured once into a CUDA graph, one warm replay, then timed replays
    /// (the launch cost of a graph node, as in training loops that replay graphs). Streams
    /// of backends without graphs fall back to [`TimingMode::Eager`].
    Graph,
}

/// Times `call` (which queues one operation on `stream`): microseconds per call, the
/// median of `reps` timed repetitions of `iters` calls each. The caller warms up first.
pub fn time_calls(
    stream: &AnyStream,
    events: &(AnyEvent, AnyEvent),
    mode: TimingMode,
    iters: usize,
    reps: usize,
    call: &dyn Fn() -> Result<()>,
) -> Result<f64> {
    let iters = iters.max(1);
    let reps = reps.max(1);
    let mut samples = Vec::with_capacity(reps);
    if mode == TimingMode::Graph {
        #[cfg(feature = "cuda")]
        if let AnyStream::Cuda(s) = stream {
            let exec = capture(s, iters, call)?;
            exec.launch(s)?;
            stream.synchronize()?;
            for _ in 0..reps {
                stream.record(&events.0)?;
                exec.launch(s)?;
                stream.record(&events.1)?;
                events.1.synchronize()?;
                samples.push(f64::from(events.1.elapsed_ms_since(&events.0)?));
            }
            return Ok(median_us(&mut samples, iters));
        }
        tracing::debug!("graph timing needs a CUDA stream; timing stream launches");
    }
    for _ in 0..reps {
        stream.record(&events.0)?;
        for _ in 0..iters {
            call()?;
        }
        stream.record(&events.1)?;
        events.1.synchronize()?;
        samples.push(f64::from(events.1.elapsed_ms_since(&events.0)?));
    }
    Ok(median_us(&mut samples, iters))
}

/// Queues `calls` calls back to back and waits for them: captured as one CUDA graph and
/// launched once where the stream can capture (so each kernel is scheduled while the one
/// before it runs, as in graph timing), else launched one after another.
pub fn run_back_to_back(
    stream: &AnyStream,
    calls: usize,
    call: &dyn Fn() -> Result<()>,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let AnyStream::Cuda(s) = stream {
        capture(s, calls, call)?.launch(s)?;
        return stream.synchronize();
    }
    for _ in 0..calls {
        call()?;
    }
    stream.synchronize()
}

/// `calls` calls captured into an instantiated graph. The capture is ended also when a
/// call fails, so the stream is usable afterwards.
#[cfg(feature = "cuda")]
fn capture(
    s: &oxccl_backend::hal_cuda::CudaStream,
    calls: usize,
    call: &dyn Fn() -> Result<()>,
) -> Result<oxccl_backend::hal_cuda::CudaGraphExec> {
    s.begin_capture()?;
    let mut first_err = None;
    for _ in 0..calls {
        if let Err(e) = call() {
            first_err = Some(e);
            break;
        }
    }
    let graph = s.end_capture();
    if let Some(e) = first_err {
        return Err(e);
    }
    graph?.instantiate(s)
}

/// Median of per-repetition milliseconds, as microseconds per call.
fn median_us(ms: &mut [f64], iters: usize) -> f64 {
    ms.sort_by(f64::total_cmp);
    let mid = ms.len() / 2;
    let m = if ms.is_empty() {
        0.0
    } else if ms.len() % 2 == 1 {
        ms[mid]
    } else {
        (ms[mid - 1] + ms[mid]) / 2.0
    };
    m * 1e3 / iters as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_per_call() {
        assert_eq!(median_us(&mut [3.0, 1.0, 2.0], 10), 200.0);
        assert_eq!(median_us(&mut [4.0, 1.0, 2.0, 3.0], 1), 2500.0);
        assert_eq!(median_us(&mut [], 1), 0.0);
    }
}
