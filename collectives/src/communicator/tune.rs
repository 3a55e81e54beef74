//! Tuning on this communicator: [`Communicator::tune`] loads or measures the tables the
//! selector consults; the measurement itself is [`crate::tuner::measure`], which reaches
//! the communicator only through [`TuneTarget`].

use std::sync::Arc;

use oxccl_backend::AnyStream;
use oxccl_hal::{DataType, Device, DevicePtr, Error, Memory, MemoryKind, Result, Stream};

use super::Communicator;
use crate::algorithms::{Algorithm, Call, CallShape, Collective, PeerBuffers, Plan};
use crate::tuner::{self, TuneBuffers, TuneKey, TuneSource, TuneTable, TuneTarget, TUNE_MIN};

impl Communicator {
    /// Tunes the selector for `dtypes` (collective: every rank calls it with the same
    /// arguments; no other work of this communicator may be in flight). Per data type:
    /// loads the cached table unless `force`, checks every rank loaded the same one, and
    /// otherwise measures every candidate up to `max_bytes` per rank ([`crate::tuner`])
    /// and caches the result. Returns the tables now in use and where each came from.
    /// Ranks on several nodes have one algorithm per collective (the PortChannel one):
    /// nothing to tune, no table.
    pub fn tune(
        &self,
        dtypes: &[DataType],
        max_bytes: usize,
        force: bool,
    ) -> Result<Vec<(Arc<TuneTable>, TuneSource)>> {
        let at = |e: Error| e.at_rank(self.rank);
        self.check_not_aborted()?;
        if self.multi_node {
            tracing::info!(rank = self.rank, "ranks on several nodes: nothing to tune");
            return Ok(Vec::new());
        }
        let dir = self.config.tune_dir.clone().or_else(tuner::cache_dir);
        let mut out = Vec::with_capacity(dtypes.len());
        for &dtype in dtypes {
            let key = TuneTarget::key(self, dtype);
            let loaded = match (&dir, force) {
                (Some(d), false) => tuner::load(d, &key),
                _ => None,
            };
            // Use a cached table only if every rank has the very same one.
            let mine = loaded.as_ref().map_or(0, TuneTable::fingerprint);
            let all = self.bootstrap.all_gather(&mine.to_le_bytes()).map_err(at)?;
            let same = all.iter().all(|b| b.as_slice() == mine.to_le_bytes());
            let (table, source) = match loaded {
                Some(t) if same => (t, TuneSource::Cache),
                _ => {
                    let t = self.measure(dtype, max_bytes).map_err(at)?;
                    if let Some(d) = &dir {
                        if let Err(e) = tuner::store(d, &t) {
                            tracing::warn!(rank = self.rank, error = %e, "tune table not cached");
                        }
                    }
                    (t, TuneSource::Measured)
                }
            };
            tracing::info!(
                rank = self.rank,
                %dtype,
                entries = table.entries.len(),
                ?source,
                "tune table in use"
            );
            let table = Arc::new(table);
            self.tuned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(dtype, Arc::clone(&table));
            out.push((table, source));
        }
        Ok(out)
    }

    /// Measures the allreduce table of `dtype` up to `max_bytes` per rank on buffers of
    /// its own (registered for the duration, then released).
    fn measure(&self, dtype: DataType, max_bytes: usize) -> Result<TuneTable> {
        let device = self.device();
        let stream = device.create_stream()?;
        let events = (device.create_event()?, device.create_event()?);
        let list_sizes = tuner::sizes(max_bytes);
        let max = list_sizes.last().copied().unwrap_or(TUNE_MIN);
        let input = device.alloc(max + 64, MemoryKind::Plain)?;
        let output = device.alloc(max + 64, MemoryKind::Plain)?;
        // Finite, non-zero values in every format (0x3c.. is about 1 in the fp8 formats).
        // SAFETY: both ranges lie inside the allocations just made, which outlive the fills
        // (the stream is synchronized before they are dropped).
        unsafe {
            stream.fill(input.ptr(), 0x3c, max + 64)?;
            stream.fill(output.ptr(), 0, max + 64)?;
        }
        stream.synchronize()?;
        self.register(&input)?;
        self.register(&output)?;
        let started = std::time::Instant::now();
        let buffers = TuneBuffers {
            input: input.ptr(),
            output: output.ptr(),
        };
        let result = tuner::measure(
            self,
            Collective::AllReduce,
            dtype,
            &list_sizes,
            buffers,
            &stream,
            &events,
        );
        let synced = stream.synchronize();
        self.deregister(&input)?;
        self.deregister(&output)?;
        synced?;
        let table = result?;
        tracing::info!(
            rank = self.rank,
            %dtype,
            entries = table.entries.len(),
            seconds = started.elapsed().as_secs_f64(),
            "tuned"
        );
        Ok(table)
    }
}

impl TuneTarget for Communicator {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.bootstrap.all_gather(bytes)
    }

    fn call_shape(&self, count: usize, dtype: DataType, registered: bool) -> Result<CallShape<'_>> {
        Ok(self.shape(
            Collective::AllReduce,
            count,
            dtype,
            dtype.bytes(count)?,
            registered,
        ))
    }

    fn peer_buffers(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        bytes: usize,
    ) -> Option<PeerBuffers> {
        self.registered_view(Collective::AllReduce, input, output, bytes)
    }

    unsafe fn launch(
        &self,
        algorithm: Algorithm,
        plan: &Plan,
        call: &Call,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations, which are the communicator's launch's.
        unsafe { Communicator::launch(self, algorithm, plan, call, stream) }
    }

    fn is_set_up(&self, algorithm: Algorithm) -> bool {
        self.instance(algorithm).is_some()
    }

    fn check_error(&self, stream: &AnyStream) -> Result<()> {
        Communicator::check_error(self, stream)
    }

    fn key(&self, dtype: DataType) -> TuneKey {
        TuneKey::new(
            self.device.capabilities(),
            Device::backend(&self.device),
            self.world,
            dtype,
        )
    }
}
