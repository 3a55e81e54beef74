//! Tests that need a GPU. Without a CUDA driver (or device) each prints
//! "skipped: <reason>" and returns; with one, each runs fully.

use oxccl_hal::{
    multicast_gate, Backend, BackendKind, Device, DeviceId, Error, Event, HostVisible, IpcHandle,
    IpcHandleKind, Memory, MemoryKind, ModuleImage, Result, Stream,
};
use oxccl_hal_cuda::{CudaBackend, CudaDevice};

/// The first device, or `None` after printing why the test is skipped.
fn gpu() -> Result<Option<CudaDevice>> {
    match CudaBackend::device_count() {
        Err(Error::RuntimeMissing(reason)) => {
            println!("skipped: {reason}");
            Ok(None)
        }
        Ok(0) => {
            println!("skipped: the CUDA driver reports no device");
            Ok(None)
        }
        Ok(_) => CudaBackend::open_device(DeviceId(0)).map(Some),
        Err(e) => Err(e),
    }
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn capabilities_are_read_from_the_device() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let caps = dev.capabilities();
    println!("{caps:#?}");
    assert_eq!(caps.backend, Some(BackendKind::Cuda));
    assert!(caps.arch.starts_with("sm_"), "{}", caps.arch);
    assert!(caps.multiprocessors > 0);
    assert!(caps.total_memory > 0);
    assert!(!caps.name.is_empty());
    if caps.vmm {
        assert!(caps.allocation_granularity.is_power_of_two());
    }
    Ok(())
}

#[test]
fn round_trip_random_data_through_every_memory_kind() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let stream = dev.create_stream()?;
    let kinds: &[MemoryKind] = if dev.capabilities().vmm {
        &[
            MemoryKind::Plain,
            MemoryKind::Physical,
            MemoryKind::Coherent,
        ]
    } else {
        &[MemoryKind::Plain]
    };
    for (i, &kind) in kinds.iter().enumerate() {
        let len = (3 << 20) + 13;
        let mem = dev.alloc(len, kind)?;
        assert_eq!(mem.len(), len);
        let data = random_bytes(len, 0x1234 + i as u64);
        stream.write(mem.ptr(), &data)?;
        let mut back = vec![0u8; len];
        stream.read(mem.ptr(), &mut back)?;
        assert!(
            back == data,
            "{kind:?}: read back differs from what was written"
        );

        // Device-to-device copy and fill.
        let other = dev.alloc(len, MemoryKind::Plain)?;
        // SAFETY: both allocations are live for `len` bytes until the synchronize below.
        unsafe { stream.copy(other.ptr(), mem.ptr(), len)? };
        // SAFETY: `mem` is live for `len` bytes.
        unsafe { stream.fill(mem.ptr(), 0xA5, 4096)? };
        stream.synchronize()?;
        stream.read(other.ptr(), &mut back)?;
        assert!(back == data, "{kind:?}: device copy differs");
        let mut head = vec![0u8; 4097];
        stream.read(mem.ptr(), &mut head)?;
        assert!(head[..4096].iter().all(|&b| b == 0xA5));
        assert_eq!(head[4096], data[4096]);
    }
    Ok(())
}

#[test]
fn zero_bytes_is_invalid() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    for kind in [MemoryKind::Plain, MemoryKind::Physical] {
        assert!(matches!(dev.alloc(0, kind), Err(Error::InvalidArgument(_))));
    }
    assert!(matches!(dev.alloc_host(0), Err(Error::InvalidArgument(_))));
    Ok(())
}

#[test]
fn host_memory_is_visible_to_the_device() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let host = dev.alloc_host(1 << 16)?;
    let stream = dev.create_stream()?;
    let data = random_bytes(1 << 16, 99);
    stream.write(host.ptr(), &data)?;
    // SAFETY: the allocation is 64 KiB, the copy above finished, nothing else writes it.
    let seen = unsafe { std::slice::from_raw_parts(host.host_ptr(), 1 << 16) };
    assert!(seen == data.as_slice());
    Ok(())
}

#[test]
fn vmm_export_and_import_in_process() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    if !dev.capabilities().vmm || !dev.capabilities().posix_fd_handles {
        println!("skipped: device lacks VMM with POSIX-FD handles");
        return Ok(());
    }
    let stream = dev.create_stream()?;
    let len = 5 << 20;
    let mem = dev.alloc(len, MemoryKind::Physical)?;
    let data = random_bytes(len, 7);
    stream.write(mem.ptr(), &data)?;

    let handle = dev.export_memory(&mem)?;
    assert_eq!(handle.kind, IpcHandleKind::CudaPosixFd);
    assert_eq!(
        dev.export_memory(&mem)?,
        handle,
        "exporting twice gives one handle"
    );
    let wire = IpcHandle::from_bytes(&handle.to_bytes())?;

    let a = dev.import_memory(&wire)?;
    let b = dev.import_memory(&wire)?;
    assert_eq!(a.len(), len);
    assert_eq!(
        a.ptr(),
        b.ptr(),
        "the same handle imported twice maps one address"
    );
    assert_ne!(a.ptr(), mem.ptr(), "the import is a second mapping");
    let mut back = vec![0u8; len];
    stream.read(a.ptr(), &mut back)?;
    assert!(back == data, "the import sees the owner's bytes");

    // Writes through the import are seen by the owner.
    let patch = random_bytes(4096, 8);
    stream.write(b.ptr(), &patch)?;
    let mut head = vec![0u8; 4096];
    stream.read(mem.ptr(), &mut head)?;
    assert!(head == patch);
    drop((a, b));

    // After the owner frees the memory, the export is withdrawn: importing fails cleanly.
    drop(mem);
    let stale = dev.import_memory(&wire);
    assert!(stale.is_err(), "import of freed memory succeeded");
    println!(
        "stale import: {}",
        stale.err().map(|e| e.to_string()).unwrap_or_default()
    );
    Ok(())
}

#[test]
fn bad_handles_are_refused() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    assert!(matches!(
        IpcHandle::from_bytes(b"garbage"),
        Err(Error::Ipc(_))
    ));
    let mut handle = IpcHandle {
        backend: BackendKind::Host,
        kind: IpcHandleKind::HostMemfd,
        owner_pid: std::process::id(),
        owner_nonce: 1,
        id: 1,
        len: 4096,
        payload: Vec::new(),
    };
    assert!(matches!(dev.import_memory(&handle), Err(Error::Ipc(_))));
    handle.backend = BackendKind::Cuda;
    assert!(matches!(dev.import_memory(&handle), Err(Error::Ipc(_))));
    handle.kind = IpcHandleKind::CudaLegacy;
    handle.payload = vec![0x5a; 63];
    assert!(matches!(dev.import_memory(&handle), Err(Error::Ipc(_))));
    // A well-formed VMM handle naming an owner that does not exist.
    handle.kind = IpcHandleKind::CudaPosixFd;
    handle.payload = (2u64 << 20).to_le_bytes().to_vec();
    handle.payload.extend_from_slice(&0u32.to_le_bytes());
    handle.owner_pid = u32::MAX - 1;
    assert!(dev.import_memory(&handle).is_err());
    Ok(())
}

#[test]
fn streams_events_and_capture_state() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let stream = dev.create_stream()?;
    assert!(!stream.is_capturing()?);
    let (start, end) = (dev.create_event()?, dev.create_event()?);
    let mem = dev.alloc(64 << 20, MemoryKind::Plain)?;
    stream.record(&start)?;
    // SAFETY: `mem` is live for 64 MiB until the synchronize below.
    unsafe { stream.fill(mem.ptr(), 1, 64 << 20)? };
    stream.record(&end)?;
    end.synchronize()?;
    let ms = end.elapsed_ms_since(&start)?;
    assert!(ms >= 0.0, "{ms}");
    let other = dev.create_stream()?;
    other.wait_event(&end)?;
    other.synchronize()?;
    dev.synchronize()?;
    Ok(())
}

/// A sync event orders work across streams like a timed one (a fill on one stream, the
/// wait on another, then a read there sees the fill) and cannot be timed.
#[test]
fn sync_events_order_work_and_are_not_timed() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let (done, other) = (dev.create_sync_event()?, dev.create_sync_event()?);
    let n = 64 << 20;
    let mem = dev.alloc(n, MemoryKind::Plain)?;
    // SAFETY: `mem` holds n bytes and lives past the read below, which synchronizes `b`
    // (and through the wait, the fill on `a`).
    unsafe { a.fill(mem.ptr(), 0x3c, n)? };
    a.record(&done)?;
    b.wait_event(&done)?;
    let mut back = vec![0u8; n];
    b.read(mem.ptr(), &mut back)?;
    assert!(
        back.iter().all(|&x| x == 0x3c),
        "the read on b ran before the fill on a"
    );
    b.record(&other)?;
    other.synchronize()?;
    assert!(
        other.elapsed_ms_since(&done).is_err(),
        "a sync event was timed"
    );
    Ok(())
}

#[test]
fn the_device_works_from_other_threads() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let dev = std::sync::Arc::new(dev);
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let dev = std::sync::Arc::clone(&dev);
            std::thread::spawn(move || -> Result<()> {
                let stream = dev.create_stream()?;
                let mem = dev.alloc(1 << 20, MemoryKind::Plain)?;
                let data = random_bytes(1 << 20, 1000 + t);
                stream.write(mem.ptr(), &data)?;
                let mut back = vec![0u8; 1 << 20];
                stream.read(mem.ptr(), &mut back)?;
                assert!(back == data);
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| Error::Unsupported("worker thread panicked".into()))??;
    }
    Ok(())
}

#[test]
fn invalid_module_image_is_an_error() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    let garbage = random_bytes(4096, 5);
    let r = dev.load_module(&ModuleImage::Cuda(&garbage));
    assert!(
        matches!(
            r,
            Err(Error::Backend {
                call: "cuModuleLoadData",
                ..
            })
        ),
        "{r:?}"
    );
    assert!(matches!(
        dev.load_module(&ModuleImage::Cuda(&[])),
        Err(Error::InvalidArgument(_))
    ));
    Ok(())
}

#[test]
fn peer_access_is_idempotent() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    dev.enable_peer_access(DeviceId(0))?;
    if CudaBackend::device_count()? < 2 {
        println!("skipped (peer part): one device");
        return Ok(());
    }
    match dev.enable_peer_access(DeviceId(1)) {
        Ok(()) => dev.enable_peer_access(DeviceId(1)),
        Err(Error::Unsupported(m)) => {
            println!("skipped (peer part): {m}");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[test]
fn multicast_is_refused_by_default() -> Result<()> {
    let Some(dev) = gpu()? else { return Ok(()) };
    if multicast_gate::check().is_ok() {
        // Never create a multicast object from a test.
        println!("skipped: the multicast gate is open in this environment");
        return Ok(());
    }
    assert!(matches!(
        dev.create_multicast(2 << 20, 2),
        Err(Error::MulticastGated(_))
    ));
    let handle = IpcHandle {
        backend: BackendKind::Cuda,
        kind: IpcHandleKind::CudaMulticastFd,
        owner_pid: std::process::id(),
        owner_nonce: 1,
        id: 1,
        len: 2 << 20,
        payload: vec![0; 16],
    };
    assert!(matches!(
        dev.import_multicast(&handle),
        Err(Error::MulticastGated(_))
    ));
    Ok(())
}
