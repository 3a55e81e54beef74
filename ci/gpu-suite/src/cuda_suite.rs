//! The CUDA multi-process suite: one process per GPU, handles exchanged through the
//! file rendezvous, every moved byte checked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oxccl_hal::atomics::HostFlag;
use oxccl_hal::{
    Backend, BackendKind, Device, DeviceId, DevicePtr, Error, Event, HostVisible, IpcHandle,
    IpcHandleKind, LaunchConfig, Memory, MemoryKind, Module, Result, Stream,
};
use oxccl_hal_cuda::{CudaBackend, CudaDevice, CudaImported, CudaKernel, CudaMemory, CudaStream};

use crate::kernels::{self, pattern};
use crate::rendezvous::Rendezvous;
use crate::report::{CaseResult, Report};

/// Bytes per slot of the peer-write buffers.
const SLOT: usize = 1 << 20;
/// Bytes moved by each bandwidth probe.
const BW_BYTES: usize = 256 << 20;
/// Timed repetitions per bandwidth probe (the median is reported).
const BW_ITERS: usize = 10;
/// Polls before a waiting kernel gives up (seconds of spinning, not minutes).
const MAX_SPINS: u64 = 50_000_000;

struct Kernels {
    signal: CudaKernel,
    wait: CudaKernel,
    store16: CudaKernel,
    fill: CudaKernel,
    check: CudaKernel,
}

/// What every case needs.
struct Ctx {
    dev: CudaDevice,
    stream: CudaStream,
    side: CudaStream,
    k: Kernels,
    rdv: Rendezvous,
    threads: u32,
    blocks: u32,
}

impl Ctx {
    fn rank(&self) -> u32 {
        self.rdv.rank()
    }
    fn world(&self) -> u32 {
        self.rdv.world()
    }
    fn next(&self) -> u32 {
        (self.rank() + 1) % self.world()
    }
    fn prev(&self) -> u32 {
        (self.rank() + self.world() - 1) % self.world()
    }

    fn grid(&self) -> LaunchConfig {
        LaunchConfig::linear(self.blocks, self.threads)
    }

    /// Writes pattern(seed) into `count` u32 at `data` with the fill kernel.
    fn fill_pattern(
        &self,
        stream: &CudaStream,
        data: DevicePtr,
        count: u64,
        seed: u32,
    ) -> Result<()> {
        let args = kernels::pattern_args(data, count, seed, DevicePtr::NULL);
        // SAFETY: `data` is live device memory (local or imported) of `count` u32 that the
        // caller keeps alive until the stream is synchronized.
        unsafe { stream.launch(&self.k.fill, &self.grid(), &args) }
    }

    /// Counts elements at `data` that differ from pattern(seed), with the check kernel.
    fn check_pattern(&self, data: DevicePtr, count: u64, seed: u32) -> Result<u64> {
        let counter = self.dev.alloc(8, MemoryKind::Plain)?;
        self.stream.write(counter.ptr(), &0u64.to_le_bytes())?;
        let args = kernels::pattern_args(data, count, seed, counter.ptr());
        // SAFETY: `data` holds `count` u32 and `counter` 8 bytes, both live until the
        // synchronize below.
        unsafe { self.stream.launch(&self.k.check, &self.grid(), &args)? };
        self.stream.synchronize()?;
        let mut out = [0u8; 8];
        self.stream.read(counter.ptr(), &mut out)?;
        Ok(u64::from_le_bytes(out))
    }

    /// Reads `count` u32 at `data` to the host and counts pattern(seed) mismatches.
    fn host_check(&self, data: DevicePtr, count: usize, seed: u32) -> Result<u64> {
        let mut bytes = vec![0u8; count * 4];
        self.stream.read(data, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .enumerate()
            .filter(|(i, c)| {
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != pattern(seed, *i as u64)
            })
            .count() as u64)
    }

    /// Both checks; an error naming what differed.
    fn verify(&self, what: &str, data: DevicePtr, count: usize, seed: u32) -> Result<()> {
        let on_device = self.check_pattern(data, count as u64, seed)?;
        let on_host = self.host_check(data, count, seed)?;
        if on_device != 0 || on_host != 0 {
            return Err(Error::Unsupported(format!(
                "{what}: {on_device} mismatches found by the check kernel, {on_host} on the host \
                 (of {count} words)"
            )));
        }
        Ok(())
    }

    /// Exchanges handles under `tag`: every rank's handle, in rank order.
    fn exchange(&self, tag: &str, handle: &IpcHandle) -> Result<Vec<IpcHandle>> {
        self.rdv
            .all_gather(tag, &handle.to_bytes())?
            .iter()
            .map(|b| IpcHandle::from_bytes(b))
            .collect()
    }

    /// Imports every peer's handle (None at this rank's own index).
    fn import_peers(&self, handles: &[IpcHandle]) -> Result<Vec<Option<CudaImported>>> {
        handles
            .iter()
            .enumerate()
            .map(|(r, h)| {
                if r as u32 == self.rank() {
                    Ok(None)
                } else {
                    self.dev.import_memory(h).map(Some)
                }
            })
            .collect()
    }

    fn peer<'a>(&self, imports: &'a [Option<CudaImported>], r: u32) -> Result<&'a CudaImported> {
        imports
            .get(r as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("no import of rank {r}")))
    }
}

/// State that later cases reuse.
#[derive(Default)]
struct Shared {
    vmm_handles: Vec<IpcHandle>,
    vmm_imports: Vec<Option<CudaImported>>,
    own: Option<CudaMemory>,
}

fn fail(msg: String) -> Error {
    Error::Unsupported(msg)
}

/// VMM export/import: each rank fills its last slot, every peer reads it through its import.
fn case_vmm(c: &Ctx, s: &mut Shared) -> Result<String> {
    let world = c.world() as usize;
    let own = c.dev.alloc(SLOT * (world + 1), MemoryKind::Physical)?;
    let words = SLOT / 4;
    let seed = |r: u32| 1000 + r;
    c.fill_pattern(
        &c.stream,
        own.ptr().offset(SLOT * world)?,
        words as u64,
        seed(c.rank()),
    )?;
    c.stream.synchronize()?;
    let handle = c.dev.export_memory(&own)?;
    if handle.kind != IpcHandleKind::CudaPosixFd {
        return Err(fail(format!(
            "physical memory exported as {:?}",
            handle.kind
        )));
    }
    s.own = Some(own);
    s.vmm_handles = c.exchange("vmm", &handle)?;
    s.vmm_imports = c.import_peers(&s.vmm_handles)?;
    for p in (0..c.world()).filter(|&p| p != c.rank()) {
        let imp = c.peer(&s.vmm_imports, p)?;
        c.verify(
            &format!("rank {p}'s buffer"),
            imp.ptr().offset(SLOT * world)?,
            words,
            seed(p),
        )?;
    }
    c.rdv.barrier("vmm.done")?;
    Ok(format!("imported {} peers", world - 1))
}

/// Peer writes: rank r fills slot r of every peer's buffer; owners check.
fn case_peer_writes(c: &Ctx, s: &Shared) -> Result<String> {
    let words = SLOT / 4;
    let own = s
        .own
        .as_ref()
        .ok_or_else(|| fail("no VMM buffer (earlier case failed)".into()))?;
    let result = (|| {
        for p in (0..c.world()).filter(|&p| p != c.rank()) {
            let dst = c
                .peer(&s.vmm_imports, p)?
                .ptr()
                .offset(SLOT * c.rank() as usize)?;
            c.fill_pattern(&c.stream, dst, words as u64, c.rank())?;
        }
        c.stream.synchronize()
    })();
    // Owners check only after every writer finished (or failed).
    c.rdv.barrier("peer_writes.written")?;
    result?;
    for p in (0..c.world()).filter(|&p| p != c.rank()) {
        c.verify(
            &format!("slot written by rank {p}"),
            own.ptr().offset(SLOT * p as usize)?,
            words,
            p,
        )?;
    }
    c.rdv.barrier("peer_writes.done")?;
    Ok(format!("{} peers x {} KiB", c.world() - 1, SLOT >> 10))
}

fn launch_wait(
    c: &Ctx,
    stream: &CudaStream,
    flag: DevicePtr,
    expected: u64,
    result: DevicePtr,
) -> Result<()> {
    let args = kernels::wait_args(flag, expected, MAX_SPINS, result);
    // SAFETY: `flag` (8 bytes) and `result` (4 bytes) stay live until the caller
    // synchronizes the stream.
    unsafe { stream.launch(&c.k.wait, &LaunchConfig::linear(1, 1), &args) }
}

fn launch_signal(c: &Ctx, stream: &CudaStream, flag: DevicePtr, value: u64) -> Result<()> {
    let args = kernels::signal_args(flag, value);
    // SAFETY: `flag` stays live until the caller synchronizes the stream.
    unsafe { stream.launch(&c.k.signal, &LaunchConfig::linear(1, 1), &args) }
}

fn read_u32(c: &Ctx, p: DevicePtr) -> Result<u32> {
    let mut b = [0u8; 4];
    c.stream.read(p, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// System-scope atomics across GPUs: the waiter spins on its own flag memory, the peer's
/// signal kernel adds to it through the mapping; once towards the next rank, once towards
/// the previous one.
fn case_gpu_atomics(c: &Ctx) -> Result<String> {
    let world = c.world() as usize;
    let flags = c.dev.alloc(16 * world, MemoryKind::Coherent)?;
    // SAFETY: `flags` is live for its length until the synchronize.
    unsafe { c.stream.fill(flags.ptr(), 0, 16 * world)? };
    c.stream.synchronize()?;
    let handles = c.exchange("atomics.handles", &c.dev.export_memory(&flags)?)?;
    let imports = c.import_peers(&handles)?;
    let result = c.dev.alloc(8, MemoryKind::Plain)?;
    let mut done = Vec::new();
    for (dir, target, source, base) in [
        ("next", c.next(), c.prev(), 0usize),
        ("prev", c.prev(), c.next(), world),
    ] {
        c.stream.write(result.ptr(), &[0u8; 8])?;
        // Wait on our own slot that `source` signals, then let everyone arm before signalling.
        let my_slot = flags.ptr().offset(8 * (base + source as usize))?;
        launch_wait(c, &c.stream, my_slot, 1, result.ptr())?;
        c.rdv.barrier(&format!("atomics.{dir}.armed"))?;
        let their_slot = c
            .peer(&imports, target)?
            .ptr()
            .offset(8 * (base + c.rank() as usize))?;
        launch_signal(c, &c.side, their_slot, 1)?;
        c.side.synchronize()?;
        c.stream.synchronize()?;
        let r = read_u32(c, result.ptr())?;
        c.rdv.barrier(&format!("atomics.{dir}.done"))?;
        if r != kernels::WAIT_OK {
            return Err(fail(format!(
                "waiting for rank {source} ({dir} direction): result {r} ({} = timed out)",
                kernels::WAIT_TIMEOUT
            )));
        }
        done.push(format!("{source}->{}", c.rank()));
    }
    Ok(done.join(", "))
}

/// Host-mapped flags: the host's store is seen by a spinning kernel, and a kernel's signal
/// is seen by the host.
fn case_host_flags(c: &Ctx) -> Result<String> {
    let host = c.dev.alloc_host(4096)?;
    let result = c.dev.alloc(8, MemoryKind::Plain)?;
    c.stream.write(result.ptr(), &[0u8; 8])?;
    launch_wait(c, &c.stream, host.ptr(), 1, result.ptr())?;
    std::thread::sleep(Duration::from_millis(20));
    let to_device = HostFlag::new(&host, 0)?;
    to_device.store_release(1);
    c.stream.synchronize()?;
    let r = read_u32(c, result.ptr())?;
    if r != kernels::WAIT_OK {
        return Err(fail(format!(
            "kernel waiting on a host-mapped flag: result {r}"
        )));
    }
    let to_host = HostFlag::new(&host, 64)?;
    launch_signal(c, &c.stream, host.ptr().offset(64)?, 1)?;
    let seen = to_host.wait_at_least(1, Duration::from_secs(10))?;
    c.stream.synchronize()?;
    // Keep a plain atomic view too, to show the value stays put after the kernel ended.
    // SAFETY: offset 64 of a live, 8-byte aligned 4 KiB host allocation.
    let now = unsafe { &*host.host_ptr().add(64).cast::<AtomicU64>() }.load(Ordering::Acquire);
    if seen != 1 || now != 1 {
        return Err(fail(format!("host saw {seen} then {now} after one signal")));
    }
    Ok("host->kernel, kernel->host".into())
}

/// The same handle imported twice through the cache maps one address.
fn case_import_twice(c: &Ctx, s: &Shared) -> Result<String> {
    let next = c.next();
    let h = s
        .vmm_handles
        .get(next as usize)
        .ok_or_else(|| fail("no VMM handles".into()))?;
    let first = c.peer(&s.vmm_imports, next)?;
    let again = c.dev.import_memory(h)?;
    let third = c
        .dev
        .import_memory(&IpcHandle::from_bytes(&h.to_bytes())?)?;
    if again.ptr() != first.ptr() || third.ptr() != first.ptr() {
        return Err(fail(format!(
            "addresses differ: {} / {} / {}",
            first.ptr(),
            again.ptr(),
            third.ptr()
        )));
    }
    drop((again, third));
    c.verify(
        "rank's buffer after re-imports",
        first.ptr().offset(SLOT * c.world() as usize)?,
        SLOT / 4,
        1000 + next,
    )?;
    Ok(format!("rank {next}'s buffer at {}", first.ptr()))
}

/// Legacy IPC: plain allocations exported with cuIpcGetMemHandle, read by every peer.
fn case_legacy(c: &Ctx) -> Result<String> {
    let words = SLOT / 4;
    let mem = c.dev.alloc(SLOT, MemoryKind::Plain)?;
    c.fill_pattern(&c.stream, mem.ptr(), words as u64, 2000 + c.rank())?;
    c.stream.synchronize()?;
    let handle = c.dev.export_memory(&mem)?;
    if handle.kind != IpcHandleKind::CudaLegacy || handle.payload.len() != 64 {
        return Err(fail(format!("plain memory exported as {:?}", handle.kind)));
    }
    let handles = c.exchange("legacy.handles", &handle)?;
    let outcome = (|| {
        let imports = c.import_peers(&handles)?;
        for p in (0..c.world()).filter(|&p| p != c.rank()) {
            let imp = c.peer(&imports, p)?;
            c.verify(
                &format!("rank {p}'s legacy buffer"),
                imp.ptr(),
                words,
                2000 + p,
            )?;
            let again = c.dev.import_memory(&handles[p as usize])?;
            if again.ptr() != imp.ptr() {
                return Err(fail(format!(
                    "legacy re-import of rank {p} moved: {} vs {}",
                    imp.ptr(),
                    again.ptr()
                )));
            }
        }
        Ok(())
    })();
    // The owners keep their memory until every importer is done.
    c.rdv.barrier("legacy.done")?;
    outcome.map(|()| format!("imported {} peers", c.world() - 1))
}

/// Callers' buffers (memory oxccl did not allocate, as PyTorch's caching allocator hands
/// out): a cuMemAlloc block and a VMM chunk are traced back from an interior pointer to
/// their allocation (base, length, identity), exported, and mapped by every peer, which
/// checks the bytes at the buffer's offset; freeing and allocating again gives a new
/// identity; host memory and ranges past an allocation's end are refused.
fn case_foreign(c: &Ctx) -> Result<String> {
    let words = SLOT / 4;
    let block_len = 3 * SLOT;
    let block = oxccl_hal_cuda::alloc_unowned(block_len)?;
    let outcome = (|| {
        let at = block.offset(SLOT + 256)?;
        let found = c.dev.find_allocation(at, SLOT)?;
        if found.base != block
            || found.len < block_len
            || found.offset_of(at) != (SLOT + 256) as u64
        {
            return Err(fail(format!("cuMemAlloc block {block} found as {found:?}")));
        }
        let e = c.dev.find_allocation(at, block_len).map(|_| ()).err();
        if !e
            .as_ref()
            .is_some_and(|e| e.to_string().contains("past the end"))
        {
            return Err(fail(format!("a range past the block's end: {e:?}")));
        }
        let host = c.dev.alloc_host(4096)?;
        if c.dev.find_allocation(host.ptr(), 16).is_ok() {
            return Err(fail(
                "pinned host memory was taken for device memory".into(),
            ));
        }
        let stack = [0u8; 16];
        if c.dev
            .find_allocation(DevicePtr(stack.as_ptr() as u64), 16)
            .is_ok()
        {
            return Err(fail("a stack address was taken for device memory".into()));
        }
        // The legacy export of the block, read by every peer at the buffer's offset.
        c.fill_pattern(&c.stream, at, words as u64, 3000 + c.rank())?;
        c.stream.synchronize()?;
        let handle = c.dev.export_allocation(&found)?;
        if handle.kind != IpcHandleKind::CudaLegacy || handle.len != found.len as u64 {
            return Err(fail(format!("cuMemAlloc block exported as {handle:?}")));
        }
        let handles = c.exchange("foreign.legacy", &handle)?;
        let imports = c.import_peers(&handles)?;
        for p in (0..c.world()).filter(|&p| p != c.rank()) {
            let imp = c.peer(&imports, p)?;
            c.verify(
                &format!("rank {p}'s caller buffer"),
                imp.ptr().offset(SLOT + 256)?,
                words,
                3000 + p,
            )?;
        }
        drop(imports);
        c.rdv.barrier("foreign.legacy.done")?;
        // A VMM chunk (POSIX-FD shareable): found from inside, exported as a descriptor,
        // mapped here (an import in the exporting process maps a second range).
        let chunk = c.dev.alloc(2 * SLOT, MemoryKind::Physical)?;
        let inner = chunk.ptr().offset(SLOT)?;
        let vmm = c.dev.find_allocation(inner, 4096)?;
        if vmm.offset_of(inner) != SLOT as u64 {
            return Err(fail(format!("VMM chunk {} found as {vmm:?}", chunk.ptr())));
        }
        c.fill_pattern(&c.stream, inner, words as u64, 4000 + c.rank())?;
        c.stream.synchronize()?;
        let vh = c.dev.export_allocation(&vmm)?;
        if vh.kind != IpcHandleKind::CudaPosixFd {
            return Err(fail(format!("VMM chunk exported as {:?}", vh.kind)));
        }
        let view = c.dev.import_memory(&vh)?;
        c.verify(
            "a VMM chunk through its export",
            view.ptr().offset(SLOT)?,
            words,
            4000 + c.rank(),
        )?;
        drop(view);
        c.dev.release_export(&vmm);
        let detail = format!(
            "block of {} MiB id {}, VMM chunk id {}, {} peers read the block",
            found.len >> 20,
            found.id,
            vmm.id,
            c.world() - 1
        );
        Ok((detail, found.id))
    })();
    // SAFETY: allocated above; every peer finished reading it (barrier) or failed.
    unsafe { oxccl_hal_cuda::free_unowned(block) }?;
    let again = oxccl_hal_cuda::alloc_unowned(block_len)?;
    let renewed = c.dev.find_allocation(again, 16);
    // SAFETY: allocated just above, used only by the query.
    unsafe { oxccl_hal_cuda::free_unowned(again) }?;
    let (detail, old_id) = outcome?;
    let renewed = renewed?;
    if renewed.id == old_id {
        return Err(fail(format!(
            "a freed and reallocated block kept its identity {old_id}"
        )));
    }
    Ok(format!(
        "{detail}; reallocated {} at {} with a new id {}",
        if again == block {
            "the same address"
        } else {
            "another address"
        },
        again,
        renewed.id
    ))
}

/// A caller's buffer across VMM chunks mapped side by side (PyTorch's expandable segments
/// map a segment chunk by chunk, and a tensor may cross chunks): found as one range with
/// one identity, exported as its pieces and mapped side by side by every peer (and by its
/// owner), which check the bytes across the chunk boundaries; one chunk alone, or another
/// run of them, is another allocation; a range past the last chunk is refused.
fn case_foreign_chunks(c: &Ctx) -> Result<String> {
    const CHUNKS: usize = 3;
    let (seg, chunk) = oxccl_hal_cuda::alloc_unowned_chunks(SLOT, CHUNKS)?;
    let outcome = (|| {
        // From the middle of the first chunk to the middle of the last.
        let start = chunk / 2;
        let bytes = (CHUNKS - 1) * chunk;
        let at = seg.offset(start)?;
        let span = c.dev.find_allocation(at, bytes)?;
        if span.base != seg || span.len != CHUNKS * chunk || span.offset_of(at) != start as u64 {
            return Err(fail(format!(
                "a range across {CHUNKS} chunks of {chunk} bytes at {seg} found as {span:?}"
            )));
        }
        let again = c
            .dev
            .find_allocation(seg.offset(16)?, CHUNKS * chunk - 16)?;
        let one = c.dev.find_allocation(seg, 16)?;
        let pair = c.dev.find_allocation(seg.offset(chunk)?, chunk + 16)?;
        if again != span
            || one.len != chunk
            || pair.base != seg.offset(chunk)?
            || pair.len != 2 * chunk
            || [span.id, pair.id].contains(&one.id)
            || pair.id == span.id
        {
            return Err(fail(format!(
                "the same range found again as {again:?} (first {span:?}); the first chunk \
                 alone as {one:?}; the last two as {pair:?}"
            )));
        }
        let past = c.dev.find_allocation(at, CHUNKS * chunk).map(|_| ()).err();
        if !past
            .as_ref()
            .is_some_and(|e| e.to_string().contains("past the end"))
        {
            return Err(fail(format!("a range past the last chunk: {past:?}")));
        }
        let words = bytes / 4;
        c.fill_pattern(&c.stream, at, words as u64, 5000 + c.rank())?;
        c.stream.synchronize()?;
        let handle = c.dev.export_allocation(&span)?;
        if handle.kind != IpcHandleKind::CudaPosixFd || handle.len != span.len as u64 {
            return Err(fail(format!(
                "a range across chunks exported as {handle:?}"
            )));
        }
        let own = c.dev.import_memory(&handle)?;
        c.verify(
            "a range across chunks through its own export",
            own.ptr().offset(start)?,
            words,
            5000 + c.rank(),
        )?;
        drop(own);
        let handles = c.exchange("foreign.chunks", &handle)?;
        let imports = c.import_peers(&handles)?;
        for p in (0..c.world()).filter(|&p| p != c.rank()) {
            let imp = c.peer(&imports, p)?;
            c.verify(
                &format!("rank {p}'s range across {CHUNKS} chunks"),
                imp.ptr().offset(start)?,
                words,
                5000 + p,
            )?;
        }
        drop(imports);
        c.rdv.barrier("foreign.chunks.done")?;
        c.dev.release_export(&span);
        Ok(format!(
            "{CHUNKS} chunks of {} MiB as one range (id {:#x}), {} peers read {} MiB across \
             the boundaries",
            chunk >> 20,
            span.id,
            c.world() - 1,
            bytes >> 20
        ))
    })();
    // SAFETY: allocated above; every peer finished reading it (barrier) or failed.
    unsafe { oxccl_hal_cuda::free_unowned_chunks(seg, chunk, CHUNKS) }?;
    outcome
}

/// Error paths: garbage, foreign kinds, corrupt payloads and handles of freed memory all
/// fail with an error (the process survives to report it).
fn case_errors(c: &Ctx) -> Result<String> {
    let mut checked = Vec::new();
    if !matches!(
        IpcHandle::from_bytes(b"not a handle at all"),
        Err(Error::Ipc(_))
    ) {
        return Err(fail("garbage bytes parsed as a handle".into()));
    }
    checked.push("garbage");

    let vmm = c.dev.alloc(SLOT, MemoryKind::Physical)?;
    let plain = c.dev.alloc(SLOT, MemoryKind::Plain)?;
    let vmm_h = c.dev.export_memory(&vmm)?;
    let plain_h = c.dev.export_memory(&plain)?;
    let vmm_hs = c.exchange("errors.vmm", &vmm_h)?;
    let plain_hs = c.exchange("errors.plain", &plain_h)?;
    let peer = c.next() as usize;

    let mut wrong_kind = vmm_hs[peer].clone();
    wrong_kind.kind = IpcHandleKind::CudaMulticastFd;
    if !matches!(c.dev.import_memory(&wrong_kind), Err(Error::Ipc(_))) {
        return Err(fail(
            "a multicast-kind handle was accepted as memory".into(),
        ));
    }
    let mut foreign = plain_hs[peer].clone();
    foreign.backend = BackendKind::Rocm;
    if !matches!(c.dev.import_memory(&foreign), Err(Error::Ipc(_))) {
        return Err(fail("a ROCm handle was accepted".into()));
    }
    checked.push("wrong kind/backend");

    let mut corrupt = plain_hs[peer].clone();
    for (i, b) in corrupt.payload.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
    if let Ok(m) = c.dev.import_memory(&corrupt) {
        return Err(fail(format!(
            "a corrupt legacy handle imported at {}",
            m.ptr()
        )));
    }
    checked.push("corrupt legacy");

    // Free the exported memory, then let the peers try.
    drop(vmm);
    drop(plain);
    c.rdv.barrier("errors.freed")?;
    let stale_vmm = c.dev.import_memory(&vmm_hs[peer]);
    let stale_plain = c.dev.import_memory(&plain_hs[peer]);
    c.rdv.barrier("errors.done")?;
    match stale_vmm {
        Ok(m) => {
            return Err(fail(format!(
                "import of freed VMM memory succeeded at {}",
                m.ptr()
            )))
        }
        Err(e) => tracing_note("freed VMM", &e),
    }
    match stale_plain {
        Ok(m) => {
            return Err(fail(format!(
                "import of freed legacy memory succeeded at {}",
                m.ptr()
            )))
        }
        Err(e) => tracing_note("freed legacy", &e),
    }
    checked.push("freed VMM");
    checked.push("freed legacy");
    Ok(checked.join(", "))
}

fn tracing_note(what: &str, e: &Error) {
    if std::env::var_os("OXCCL_SUITE_VERBOSE").is_some() {
        eprintln!("  ({what}: {e})");
    }
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Times `op` (warm-up, then BW_ITERS timed runs), then zeroes `dst`, runs `op` once more
/// and checks every byte. Returns GB/s of the median run.
fn measure(
    c: &Ctx,
    tag: &str,
    dst: DevicePtr,
    src_seed: u32,
    op: &dyn Fn() -> Result<()>,
) -> Result<f64> {
    let (start, end) = (c.dev.create_event()?, c.dev.create_event()?);
    c.rdv.barrier(&format!("bw.{tag}.start"))?;
    for _ in 0..2 {
        op()?;
    }
    c.stream.synchronize()?;
    let mut times = Vec::with_capacity(BW_ITERS);
    for _ in 0..BW_ITERS {
        c.stream.record(&start)?;
        op()?;
        c.stream.record(&end)?;
        end.synchronize()?;
        times.push(end.elapsed_ms_since(&start)?);
    }
    // SAFETY: `dst` is live for BW_BYTES (the caller's buffer) until the synchronize.
    unsafe { c.stream.fill(dst, 0, BW_BYTES)? };
    op()?;
    c.stream.synchronize()?;
    let bad = c.check_pattern(dst, (BW_BYTES / 4) as u64, src_seed)?;
    c.rdv.barrier(&format!("bw.{tag}.done"))?;
    if bad != 0 {
        return Err(fail(format!(
            "{bad} of {} words wrong after the copy",
            BW_BYTES / 4
        )));
    }
    let ms = f64::from(median(times));
    Ok(BW_BYTES as f64 / 1e9 / (ms / 1e3))
}

/// Bandwidth: copy engine to the next rank, 16-byte peer stores to the next rank, and the
/// local device-to-device copy, all at 256 MiB.
fn case_bandwidth(c: &Ctx, report: &mut Report) -> Result<()> {
    let src = c.dev.alloc(BW_BYTES, MemoryKind::Physical)?;
    let local = c.dev.alloc(BW_BYTES, MemoryKind::Plain)?;
    let inbox = c.dev.alloc(BW_BYTES, MemoryKind::Physical)?;
    let seed = 3000 + c.rank();
    c.fill_pattern(&c.stream, src.ptr(), (BW_BYTES / 4) as u64, seed)?;
    c.stream.synchronize()?;
    let handles = c.exchange("bw.handles", &c.dev.export_memory(&inbox)?)?;
    let peer_dst = c.dev.import_memory(&handles[c.next() as usize])?;
    let bytes = BW_BYTES;

    let ce = measure(c, "ce", peer_dst.ptr(), seed, &|| {
        // SAFETY: `src` and the next rank's inbox are live for `bytes` during the probe
        // (peers hold their inboxes until the final barrier).
        unsafe { c.stream.copy(peer_dst.ptr(), src.ptr(), bytes) }
    });
    report.bandwidth("peer copy, copy engine (GB/s)", ce);

    let store_args = kernels::copy_args(peer_dst.ptr(), src.ptr(), bytes as u64);
    let st = measure(c, "store16", peer_dst.ptr(), seed, &|| {
        // SAFETY: as above; both buffers are 16-byte aligned (granularity-aligned maps).
        unsafe { c.stream.launch(&c.k.store16, &c.grid(), &store_args) }
    });
    report.bandwidth("peer copy, 16-byte stores (GB/s)", st);

    let d2d = measure(c, "d2d", local.ptr(), seed, &|| {
        // SAFETY: both local buffers are live for `bytes`.
        unsafe { c.stream.copy(local.ptr(), src.ptr(), bytes) }
    });
    report.bandwidth("local device-to-device copy (GB/s)", d2d);

    c.rdv.barrier("bw.end")?;
    Ok(())
}

/// Opens the device, loads the kernels, and runs every case; returns this rank's report.
pub fn run(rdv: Rendezvous, local_rank: u32) -> Result<Report> {
    let mut report = Report::new(rdv.rank());
    let dev = CudaBackend::open_device(DeviceId(local_rank))?;
    let image = oxccl_kernels::module_image(BackendKind::Cuda)?;
    let module = dev.load_module(&image)?;
    let k = Kernels {
        signal: module.kernel(kernels::SIGNAL)?,
        wait: module.kernel(kernels::WAIT)?,
        store16: module.kernel(kernels::STORE16)?,
        fill: module.kernel(kernels::FILL_PATTERN)?,
        check: module.kernel(kernels::CHECK_PATTERN)?,
    };
    let threads = 512;
    let per_sm = k
        .store16
        .max_active_blocks_per_multiprocessor(threads, 0)?
        .clamp(1, 4);
    let blocks = dev.capabilities().multiprocessors.max(1) * per_sm;
    let caps = dev.capabilities().clone();
    report.note(format!(
        "rank {} on device {local_rank}: {} ({}, {} SMs, VMM {}, POSIX-FD {}, multicast {:?})",
        rdv.rank(),
        caps.name,
        caps.arch,
        caps.multiprocessors,
        caps.vmm,
        caps.posix_fd_handles,
        caps.multicast
    ));
    for p in 0..rdv.world() {
        if p != local_rank && p < CudaBackend::device_count()? {
            if let Err(e) = dev.enable_peer_access(DeviceId(p)) {
                report.note(format!("peer access {local_rank}->{p}: {e}"));
            }
        }
    }
    let c = Ctx {
        stream: dev.create_stream()?,
        side: dev.create_stream()?,
        dev,
        k,
        rdv,
        threads,
        blocks,
    };
    let mut shared = Shared::default();
    let timed = |f: &mut dyn FnMut() -> Result<String>| -> CaseResult {
        let t = Instant::now();
        let r = f();
        CaseResult::from_result(r, t.elapsed())
    };
    report.push(
        "VMM export/import across processes",
        timed(&mut || case_vmm(&c, &mut shared)),
    );
    report.push(
        "peer writes seen by the owner",
        timed(&mut || case_peer_writes(&c, &shared)),
    );
    report.push(
        "system-scope flag GPU->GPU (both directions)",
        timed(&mut || case_gpu_atomics(&c)),
    );
    report.push(
        "host-mapped flags (host<->kernel)",
        timed(&mut || case_host_flags(&c)),
    );
    report.push(
        "same handle imported twice (one address)",
        timed(&mut || case_import_twice(&c, &shared)),
    );
    report.push("legacy IPC import", timed(&mut || case_legacy(&c)));
    report.push(
        "callers' allocations found, exported, mapped",
        timed(&mut || case_foreign(&c)),
    );
    report.push(
        "callers' ranges across VMM chunks found, exported, mapped",
        timed(&mut || case_foreign_chunks(&c)),
    );
    report.push(
        "error paths (bad/stale handles)",
        timed(&mut || case_errors(&c)),
    );
    if let Err(e) = case_bandwidth(&c, &mut report) {
        report.push(
            "bandwidth probe",
            CaseResult::from_result(Err(e), Duration::ZERO),
        );
    }
    drop(shared);
    c.rdv.barrier("end")?;
    Ok(report)
}
