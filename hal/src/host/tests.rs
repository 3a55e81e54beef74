//! In-process tests of the host backend (the multi-process suites live in `oxccl-tests`).

use std::io::Read;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::*;
use crate::api::{Device, Event, HostVisible, Memory, Module, Multicast, Stream};
use crate::launch::{HostKernelTable, LaunchConfig, ModuleImage};
use crate::types::{DataType, DevicePtr, MemoryKind, MulticastSupport, ReduceOp};
use crate::{Error, IpcHandleKind};

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut v)
        .unwrap();
    // Non-zero, so that a buffer left untouched (zero) never passes for the right data.
    v.iter_mut().for_each(|b| *b |= 0x01);
    v
}

fn dev(id: u32) -> HostDevice {
    HostBackend::open_device(DeviceId(id)).unwrap()
}

fn read_all(stream: &HostStream, mem: &impl Memory) -> Vec<u8> {
    let mut out = vec![0u8; mem.len()];
    stream.read(mem.ptr(), &mut out).unwrap();
    out
}

#[test]
fn device_count_parsing_and_open_bounds() {
    assert_eq!(parse_device_count(None).unwrap(), 8);
    assert_eq!(parse_device_count(Some(" 3 ")).unwrap(), 3);
    assert_eq!(parse_device_count(Some("64")).unwrap(), 64);
    for bad in ["0", "65", "-1", "four", ""] {
        let e = parse_device_count(Some(bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        assert!(e.to_string().contains(DEVICES_VAR), "{e}");
    }
    let count = HostBackend::device_count().unwrap();
    let e = HostBackend::open_device(DeviceId(count)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let d = dev(count - 1);
    assert_eq!(d.id(), DeviceId(count - 1));
    let caps = d.capabilities();
    assert_eq!(caps.backend, Some(crate::BackendKind::Host));
    assert_eq!((caps.name.as_str(), caps.arch.as_str()), ("host", "host"));
    assert_eq!(caps.multicast, MulticastSupport::Emulated);
    assert!(caps.vmm && caps.posix_fd_handles && !caps.legacy_ipc);
    assert_eq!(caps.allocation_granularity, page_size() as u64);
    assert!(caps.multiprocessors >= 1);
    assert!(d.enable_peer_access(DeviceId(0)).is_ok());
    assert!(d.synchronize().is_ok());
}

#[test]
fn allocations_start_zeroed_and_round_trip_through_a_stream() {
    let d = dev(0);
    assert!(matches!(
        d.alloc(0, MemoryKind::Plain),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        d.alloc(usize::MAX, MemoryKind::Physical),
        Err(Error::InvalidArgument(_))
    ));
    let s = d.create_stream().unwrap();
    for kind in [
        MemoryKind::Plain,
        MemoryKind::Physical,
        MemoryKind::Coherent,
    ] {
        let m = d.alloc(5000, kind).unwrap();
        assert_eq!(m.len(), 5000);
        assert!(read_all(&s, &m).iter().all(|&b| b == 0));
        let data = random_bytes(5000);
        s.write(m.ptr(), &data).unwrap();
        assert_eq!(read_all(&s, &m), data);
    }
    assert!(!s.is_capturing().unwrap());
}

#[test]
fn stream_refuses_addresses_outside_live_memory() {
    let d = dev(0);
    let s = d.create_stream().unwrap();
    let m = d.alloc(64, MemoryKind::Plain).unwrap();
    let e = s.write(DevicePtr(16), &[1, 2, 3]).unwrap_err();
    assert!(e.to_string().contains("not inside any live"), "{e}");
    // Crossing the end of the mapping is refused even when another mapping (a test running
    // in parallel) starts right after it.
    let last_byte = m.ptr().offset(page_size() - 1).unwrap();
    assert!(s.write(last_byte, &[1, 2]).is_err());
    // Memory that is not host-backend memory at all (this test's own heap).
    let heap = Box::new([0u8; 64]);
    assert!(s.write(DevicePtr(heap.as_ptr() as u64), &[1]).is_err());
    let mut buf = [0u8; 8];
    assert!(s.read(DevicePtr(u64::MAX - 2), &mut buf).is_err());
    // SAFETY: refused before anything is queued (overlapping ranges).
    let e = unsafe { s.copy(m.ptr(), m.ptr().offset(8).unwrap(), 16) }.unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    // SAFETY: refused before anything is queued (not host-backend memory).
    assert!(unsafe { s.fill(DevicePtr(4096), 1, 8) }.is_err());
    let p = m.ptr();
    drop(m);
    assert!(s.write(p, &[1]).is_err(), "freed memory must be refused");
}

#[test]
fn copies_and_fills_run_in_order() {
    let d = dev(1);
    let s = d.create_stream().unwrap();
    let a = d.alloc(4096, MemoryKind::Plain).unwrap();
    let b = d.alloc(4096, MemoryKind::Plain).unwrap();
    let data = random_bytes(4096);
    s.write(a.ptr(), &data).unwrap();
    // SAFETY: `a` and `b` are live, distinct allocations of 4096 bytes until the sync below.
    unsafe {
        s.copy(b.ptr(), a.ptr(), 4096).unwrap();
        s.fill(a.ptr(), 0xab, 100).unwrap();
        s.copy(b.ptr().offset(1000).unwrap(), a.ptr(), 50).unwrap();
    }
    s.synchronize().unwrap();
    let mut want_b = data.clone();
    want_b[1000..1050].fill(0xab);
    let mut want_a = data;
    want_a[..100].fill(0xab);
    assert_eq!(read_all(&s, &b), want_b);
    assert_eq!(read_all(&s, &a), want_a);
}

/// Argument block of the test kernels: a destination address and a value.
fn args(dst: DevicePtr, value: u64) -> Vec<u8> {
    let mut v = dst.0.to_le_bytes().to_vec();
    v.extend_from_slice(&value.to_le_bytes());
    v
}

fn parse_args(a: &[u8]) -> crate::Result<(*mut u64, u64)> {
    if a.len() != 16 {
        return Err(Error::InvalidArgument(format!(
            "{} argument bytes",
            a.len()
        )));
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&a[..8]);
    let dst = u64::from_le_bytes(w) as usize as *mut u64;
    w.copy_from_slice(&a[8..]);
    Ok((dst, u64::from_le_bytes(w)))
}

/// Writes `value * total_threads` after a pause, so that ordering mistakes show.
fn slow_store(config: &LaunchConfig, a: &[u8]) -> crate::Result<()> {
    let (dst, value) = parse_args(a)?;
    std::thread::sleep(Duration::from_millis(30));
    // SAFETY: the tests pass the address of a live, 8-byte aligned allocation.
    unsafe { dst.write_volatile(value * config.total_threads()) };
    Ok(())
}

fn failing(_: &LaunchConfig, _: &[u8]) -> crate::Result<()> {
    Err(Error::InvalidArgument("kernel refused its input".into()))
}

#[allow(clippy::panic)]
fn panicking(_: &LaunchConfig, _: &[u8]) -> crate::Result<()> {
    panic!("host kernel blew up")
}

static TABLE: HostKernelTable = HostKernelTable {
    name: "test-kernels",
    kernels: &[
        ("slow_store", slow_store),
        ("failing", failing),
        ("panicking", panicking),
    ],
};

#[test]
fn modules_load_host_tables_only_and_name_known_kernels() {
    let d = dev(0);
    let e = d.load_module(&ModuleImage::Cuda(&[1, 2, 3])).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("host kernels only"), "{e}");
    assert!(d.load_module(&ModuleImage::Rocm(&[1])).is_err());
    let m = d.load_module(&ModuleImage::Host(&TABLE)).unwrap();
    assert_eq!(m.kernel("failing").unwrap().name, "failing");
    let e = m.kernel("nope").unwrap_err().to_string();
    assert!(
        e.contains("'nope'") && e.contains("slow_store, failing, panicking"),
        "{e}"
    );
}

#[test]
fn launches_run_in_order_and_errors_are_sticky_until_reported() {
    let d = dev(2);
    let s = d.create_stream().unwrap();
    let m = d.load_module(&ModuleImage::Host(&TABLE)).unwrap();
    let mem = d.alloc(64, MemoryKind::Plain).unwrap();
    let value = u64::from_le_bytes(random_bytes(8)[..8].try_into().unwrap()) >> 20;
    // An early launch is accepted and changes nothing here: host work stays in stream order.
    assert!(!d.capabilities().early_launch);
    let cfg = LaunchConfig::linear(3, 4).with_early_launch(true);
    // SAFETY: the argument block is what `slow_store` reads; `mem` outlives the sync.
    unsafe {
        s.launch(
            &m.kernel("slow_store").unwrap(),
            &cfg,
            &args(mem.ptr(), value),
        )
        .unwrap();
        // Queued after the slow kernel: must see its result and then overwrite bytes 8..16.
        s.copy(mem.ptr().offset(8).unwrap(), mem.ptr(), 8).unwrap();
    }
    s.synchronize().unwrap();
    let bytes = read_all(&s, &mem);
    assert_eq!(bytes[..8], (value * 12).to_le_bytes());
    assert_eq!(bytes[8..16], (value * 12).to_le_bytes());

    // SAFETY: `failing` and `panicking` read nothing.
    unsafe {
        let e = s
            .launch(
                &m.kernel("failing").unwrap(),
                &LaunchConfig::linear(0, 1),
                &[],
            )
            .unwrap_err();
        assert!(e.to_string().contains("empty grid"), "{e}");
        s.launch(&m.kernel("failing").unwrap(), &cfg, &[]).unwrap();
        s.launch(&m.kernel("panicking").unwrap(), &cfg, &[])
            .unwrap();
    }
    let e = s.synchronize().unwrap_err();
    assert!(e.to_string().contains("kernel refused its input"), "{e}");
    // Reported once; the panic came second and is not the first error.
    s.synchronize().unwrap();
    // SAFETY: `panicking` reads nothing.
    unsafe { s.launch(&m.kernel("panicking").unwrap(), &cfg, &[]) }.unwrap();
    let e = s.read(mem.ptr(), &mut [0u8; 8]).unwrap_err();
    assert!(e.to_string().contains("host kernel blew up"), "{e}");
    // The worker survived the panic.
    s.write(mem.ptr(), &[7]).unwrap();
}

#[test]
fn events_order_streams_and_time_work() {
    let d = dev(3);
    let producer = d.create_stream().unwrap();
    let consumer = d.create_stream().unwrap();
    let m = d.load_module(&ModuleImage::Host(&TABLE)).unwrap();
    let mem = d.alloc(64, MemoryKind::Coherent).unwrap();
    let start = d.create_event().unwrap();
    let end = d.create_event().unwrap();
    let e = end.elapsed_ms_since(&start).unwrap_err();
    assert!(e.to_string().contains("never recorded"), "{e}");
    // An event never recorded is complete: waiting on it must not block.
    consumer.wait_event(&end).unwrap();
    end.synchronize().unwrap();

    producer.record(&start).unwrap();
    // SAFETY: `slow_store` writes 8 bytes into `mem`, which outlives the syncs below.
    unsafe {
        producer
            .launch(
                &m.kernel("slow_store").unwrap(),
                &LaunchConfig::linear(1, 1),
                &args(mem.ptr(), 0x5eed),
            )
            .unwrap();
    }
    producer.record(&end).unwrap();
    consumer.wait_event(&end).unwrap();
    // SAFETY: both halves of `mem` are live and disjoint.
    unsafe { consumer.copy(mem.ptr().offset(32).unwrap(), mem.ptr(), 8) }.unwrap();
    consumer.synchronize().unwrap();
    let bytes = read_all(&consumer, &mem);
    assert_eq!(bytes[32..40], 0x5eedu64.to_le_bytes());
    end.synchronize().unwrap();
    let ms = end.elapsed_ms_since(&start).unwrap();
    assert!((25.0..10_000.0).contains(&ms), "{ms} ms");
    assert!(start.elapsed_ms_since(&end).unwrap() < 0.0);
}

#[test]
fn import_in_the_same_process_maps_a_second_view_once() {
    let d = dev(0);
    let other = dev(1);
    let s = d.create_stream().unwrap();
    let mem = d.alloc(10_000, MemoryKind::Physical).unwrap();
    let h = d.export_memory(&mem).unwrap();
    assert_eq!(d.export_memory(&mem).unwrap(), h, "export is idempotent");
    assert_eq!(
        (h.kind, h.len, h.owner_pid),
        (IpcHandleKind::HostMemfd, 10_000, std::process::id())
    );
    assert!(h.payload.is_empty());

    let a = other.import_memory(&h).unwrap();
    let b = other.import_memory(&h).unwrap();
    assert_eq!(a.ptr(), b.ptr());
    assert_ne!(a.ptr(), mem.ptr(), "a second view, not the same mapping");
    assert_eq!(other.ipc_cache_live(), 1);
    let data = random_bytes(10_000);
    s.write(mem.ptr(), &data).unwrap();
    assert_eq!(read_all(&s, &a), data);
    let flag = crate::atomics::HostFlag::new(&b, 8).unwrap();
    flag.store_release(0x0123_4567_89ab_cdef);
    assert_eq!(
        read_all(&s, &mem)[8..16],
        0x0123_4567_89ab_cdefu64.to_le_bytes()
    );
    drop(a);
    assert_eq!(other.ipc_cache_live(), 1);
    drop(b);
    assert_eq!(other.ipc_cache_live(), 0);

    drop(mem);
    let e = other.import_memory(&h).unwrap_err();
    assert!(matches!(e, Error::Ipc(_)), "{e}");
    assert!(e.to_string().contains("stale handle"), "{e}");
    assert_eq!(other.ipc_cache_live(), 0);
}

#[test]
fn foreign_and_malformed_handles_are_rejected() {
    let d = dev(0);
    let mem = d.alloc(100, MemoryKind::Plain).unwrap();
    let good = d.export_memory(&mem).unwrap();
    let mut cuda = good.clone();
    cuda.backend = crate::BackendKind::Cuda;
    let e = d.import_memory(&cuda).unwrap_err();
    assert!(
        matches!(e, Error::Ipc(_)) && e.to_string().contains("CUDA"),
        "{e}"
    );
    let mut kind = good.clone();
    kind.kind = IpcHandleKind::RocmLegacy;
    assert!(matches!(d.import_memory(&kind), Err(Error::Ipc(_))));
    let mut zero = good.clone();
    zero.len = 0;
    assert!(matches!(d.import_memory(&zero), Err(Error::Ipc(_))));
    let mut too_long = good.clone();
    too_long.len = page_size() as u64 + 1;
    let e = d.import_memory(&too_long).unwrap_err();
    assert!(e.to_string().contains("claims"), "{e}");
    let mut gone = good;
    gone.owner_nonce ^= 0xffff;
    assert!(matches!(d.import_memory(&gone), Err(Error::PeerLost(_))));
    assert_eq!(d.ipc_cache_live(), 0);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn multicast_members_in_threads_reduce_and_broadcast() {
    const MEMBERS: u32 = 4;
    const COUNT: usize = 1000;
    let creator = dev(0);
    let e = creator.create_multicast(4096, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(creator.create_multicast(0, 2).is_err());
    let mc = creator.create_multicast(COUNT * 4, MEMBERS).unwrap();
    assert_eq!(mc.len(), (COUNT * 4).next_multiple_of(page_size()));
    let handle = creator.export_multicast(&mc).unwrap();
    assert_eq!(handle.kind, IpcHandleKind::HostMulticast);
    let mut bad = handle.clone();
    bad.payload.pop();
    assert!(matches!(creator.import_multicast(&bad), Err(Error::Ipc(_))));

    // Small random integers: every sum, product, min and max is exact in f32, f16 and bf16,
    // whatever order the members are combined in.
    let inputs: Vec<Vec<f32>> = (0..MEMBERS)
        .map(|_| {
            random_bytes(COUNT)
                .iter()
                .map(|b| f32::from(b % 7) - 3.0)
                .collect()
        })
        .collect();
    let barrier = Arc::new(Barrier::new(MEMBERS as usize));
    let mc = Arc::new(mc);
    let threads: Vec<_> = (0..MEMBERS)
        .map(|r| {
            let handle = handle.clone();
            let barrier = Arc::clone(&barrier);
            let inputs = inputs.clone();
            let creator_mc = Arc::clone(&mc);
            std::thread::spawn(move || {
                let d = dev(r);
                let joined;
                let mc: &HostMulticast = if r == 0 {
                    &creator_mc
                } else {
                    joined = d.import_multicast(&handle).unwrap();
                    &joined
                };
                mc.add_device(d.id()).unwrap();
                let e = mc.map().unwrap_err();
                assert!(e.to_string().contains("bind memory"), "{e}");
                let mem = d.alloc(COUNT * 4, MemoryKind::Physical).unwrap();
                let s = d.create_stream().unwrap();
                s.write(mem.ptr(), &f32_bytes(&inputs[r as usize])).unwrap();
                mc.bind(&mem, 0).unwrap();
                assert!(mc.bind(&mem, 0).is_err(), "second bind of one member");
                assert!(mc.add_device(d.id()).is_err(), "add after bind");
                barrier.wait();
                assert_eq!(mc.bound_members(), MEMBERS);

                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                    let mut out = vec![0u8; COUNT * 4];
                    mc.reduce(0, COUNT, DataType::F32, op, &mut out).unwrap();
                    for i in 0..COUNT {
                        let vals = inputs.iter().map(|v| v[i]);
                        let want = match op {
                            ReduceOp::Sum => vals.sum::<f32>(),
                            ReduceOp::Prod => vals.product(),
                            ReduceOp::Min => vals.fold(f32::INFINITY, f32::min),
                            _ => vals.fold(f32::NEG_INFINITY, f32::max),
                        };
                        let got = f32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
                        assert_eq!(got, want, "{op} element {i}");
                    }
                }
                let mut out = vec![0u8; 8];
                let e = mc
                    .reduce(0, 4, DataType::Fp8E4m3, ReduceOp::Sum, &mut out)
                    .unwrap_err();
                assert!(matches!(e, Error::Unsupported(_)), "{e}");
                let e = mc
                    .reduce(0, 4, DataType::F32, ReduceOp::Sum, &mut out)
                    .unwrap_err();
                assert!(e.to_string().contains("needs an output of 16 bytes"), "{e}");
                assert!(mc
                    .reduce(COUNT * 4 - 4, 2, DataType::F32, ReduceOp::Sum, &mut out)
                    .is_err());
                barrier.wait();

                // Member r broadcasts into its own quarter; then everyone checks all quarters.
                let quarter = COUNT * 4 / MEMBERS as usize;
                let pattern: Vec<u8> = (0..quarter)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(r as u8 + 1) | 1)
                    .collect();
                mc.broadcast(quarter * r as usize, &pattern).unwrap();
                barrier.wait();
                let mine = read_all(&s, &mem);
                for q in 0..MEMBERS as usize {
                    let want: Vec<u8> = (0..quarter)
                        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(q as u8 + 1) | 1)
                        .collect();
                    assert_eq!(
                        mine[q * quarter..(q + 1) * quarter],
                        want[..],
                        "quarter {q}"
                    );
                }
                assert_eq!(mc.map().unwrap().0 % page_size() as u64, 0);
                barrier.wait();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn multicast_reduces_half_precision_and_refuses_unbound_members() {
    let d0 = dev(0);
    let d1 = dev(1);
    let mc0 = d0.create_multicast(64, 2).unwrap();
    let mc1 = d1
        .import_multicast(&d0.export_multicast(&mc0).unwrap())
        .unwrap();
    let s = d0.create_stream().unwrap();
    let a = d0.alloc(64, MemoryKind::Plain).unwrap();
    mc0.bind(&a, 0).unwrap();
    let mut out = vec![0u8; 4];
    let e = mc1
        .reduce(0, 2, DataType::F16, ReduceOp::Sum, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("has not bound memory"), "{e}");
    let b = d1.alloc(32, MemoryKind::Plain).unwrap();
    let e = mc1.bind(&b, mc1.len() - 16).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    mc1.bind(&b, 16).unwrap();
    // f16 1.5 and 2.25 at multicast offset 16, in both members; bf16 view of the same bits.
    let f16 = [0x3e00u16, 0x4080u16];
    let bytes: Vec<u8> = f16.iter().flat_map(|h| h.to_le_bytes()).collect();
    s.write(a.ptr().offset(16).unwrap(), &bytes).unwrap();
    s.write(b.ptr(), &bytes).unwrap();
    mc0.reduce(16, 2, DataType::F16, ReduceOp::Sum, &mut out)
        .unwrap();
    assert_eq!(out, [0x00, 0x42, 0x80, 0x44]); // 3.0 and 4.5
    mc1.reduce(16, 2, DataType::F16, ReduceOp::Avg, &mut out)
        .unwrap();
    assert_eq!(out, bytes);
    mc1.reduce(16, 2, DataType::Bf16, ReduceOp::Max, &mut out)
        .unwrap();
    assert_eq!(out, bytes);
    // Offset 0 is only covered by member 0.
    let e = mc0
        .reduce(0, 2, DataType::F16, ReduceOp::Sum, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("not covered by member"), "{e}");
    // The member views outlive the caller's handles on the memory.
    drop(b);
    mc0.reduce(16, 2, DataType::F16, ReduceOp::Sum, &mut out)
        .unwrap();
    assert_eq!(out, [0x00, 0x42, 0x80, 0x44]);
}

#[test]
fn host_pointer_is_the_device_pointer() {
    let d = dev(0);
    let m = d.alloc_host(24).unwrap();
    assert_eq!(m.host_ptr() as u64, m.ptr().0);
    assert!(m.ptr().is_aligned(page_size() as u64));
}

#[test]
fn a_callers_buffer_is_traced_to_its_allocation_and_exported() {
    let d = dev(0);
    let m = d.alloc(10_000, MemoryKind::Plain).unwrap();
    let inner = m.ptr().offset(4096).unwrap();
    let a = d.find_allocation(inner, 100).unwrap();
    assert_eq!((a.base, a.len, a.offset_of(inner)), (m.ptr(), 10_000, 4096));
    // The same allocation, whichever pointer inside it asks; another one differs.
    assert_eq!(d.find_allocation(m.ptr(), 10_000).unwrap(), a);
    let other = d.alloc(64, MemoryKind::Plain).unwrap();
    assert_ne!(d.find_allocation(other.ptr(), 64).unwrap().id, a.id);
    // Past the end, outside any allocation, or an import (a mapping, not an allocation).
    let e = d.find_allocation(inner, 10_000).unwrap_err().to_string();
    assert!(e.contains("past the end"), "{e}");
    let host = [0u8; 16];
    let e = d
        .find_allocation(DevicePtr(host.as_ptr() as u64), 16)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let handle = d.export_allocation(&a).unwrap();
    assert_eq!(
        handle,
        d.export_memory(&m).unwrap(),
        "one export per allocation"
    );
    let view = dev(1).import_memory(&handle).unwrap();
    assert!(d.find_allocation(view.ptr(), 16).is_err());
    // The import sees the allocation's bytes.
    let s = d.create_stream().unwrap();
    let data = random_bytes(10_000);
    s.write(m.ptr(), &data).unwrap();
    assert_eq!(read_all(&s, &view), data);
    // A freed allocation is not exported again under its old identity.
    drop(view);
    drop(m);
    assert!(d.export_allocation(&a).is_err());
    d.release_export(&a);
}

#[test]
fn a_buffer_across_pieces_side_by_side_is_one_range() {
    let d = dev(0);
    let piece = 4 * page_size();
    let chunks = HostChunks::allocate(piece, 3).unwrap();
    let base = chunks.ptr();
    // From the middle of the first piece to the middle of the last.
    let at = base.offset(piece / 2).unwrap();
    let span = d.find_allocation(at, 2 * piece).unwrap();
    assert_eq!(
        (span.base, span.len, span.offset_of(at)),
        (base, 3 * piece, piece as u64 / 2)
    );
    // The same pieces give the same identity; one piece, or another run, another one.
    assert_eq!(d.find_allocation(base, 3 * piece).unwrap(), span);
    let one = d.find_allocation(base, 16).unwrap();
    assert_eq!((one.base, one.len), (base, piece));
    let pair = d
        .find_allocation(base.offset(piece).unwrap(), piece + 1)
        .unwrap();
    assert_eq!(
        (pair.base, pair.len),
        (base.offset(piece).unwrap(), 2 * piece)
    );
    let ids = [span.id, one.id, pair.id];
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
    // Past the last piece.
    let e = d.find_allocation(at, 3 * piece).unwrap_err().to_string();
    assert!(e.contains("past the end"), "{e}");
    // Plain allocations never run on into each other, even when adjacent.
    let m = d.alloc(piece, MemoryKind::Plain).unwrap();
    let e = d
        .find_allocation(m.ptr(), piece + 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("past the end"), "{e}");

    // Exported as its pieces, mapped side by side: the bytes across the boundaries read
    // the same through the import, and writes through it land in the pieces.
    let s = d.create_stream().unwrap();
    let data = random_bytes(2 * piece);
    s.write(at, &data).unwrap();
    let handle = d.export_allocation(&span).unwrap();
    assert_eq!(handle.len, 3 * piece as u64);
    let view = dev(1).import_memory(&handle).unwrap();
    assert_eq!(view.len(), 3 * piece);
    let mut back = vec![0u8; 2 * piece];
    s.read(view.ptr().offset(piece / 2).unwrap(), &mut back)
        .unwrap();
    assert_eq!(back, data);
    let more = random_bytes(64);
    s.write(view.ptr().offset(2 * piece - 32).unwrap(), &more)
        .unwrap();
    let mut through = vec![0u8; 64];
    s.read(base.offset(2 * piece - 32).unwrap(), &mut through)
        .unwrap();
    assert_eq!(through, more);
    drop(view);

    // One piece mapped again in place: a new allocation there, so the range across it
    // has a new identity and its old one is not exported again; the other pieces keep
    // theirs.
    let mut chunks = chunks;
    chunks.remap(1).unwrap();
    let moved = d.find_allocation(at, 2 * piece).unwrap();
    assert_eq!((moved.base, moved.len), (span.base, span.len));
    assert!(![span.id, one.id, pair.id].contains(&moved.id));
    assert_eq!(d.find_allocation(base, 16).unwrap(), one);
    assert!(d.export_allocation(&span).is_err());
    let mut zero = vec![1u8; 64];
    s.read(base.offset(piece).unwrap(), &mut zero).unwrap();
    assert!(
        zero.iter().all(|&b| b == 0),
        "a remapped piece starts zeroed"
    );
    assert!(chunks.remap(3).is_err());

    // Freed: the range is not exported again under its old identity, and pieces mapped
    // again in its place (likely at the same address) get a new one.
    drop(chunks);
    assert!(d.export_allocation(&span).is_err());
    let again = HostChunks::allocate(piece, 3).unwrap();
    let renewed = d.find_allocation(again.ptr(), 2 * piece).unwrap();
    assert!(![span.id, one.id, pair.id].contains(&renewed.id));
}

#[test]
fn malformed_lists_of_pieces_are_refused() {
    let d = dev(0);
    let piece = page_size();
    let chunks = HostChunks::allocate(piece, 2).unwrap();
    let span = d.find_allocation(chunks.ptr(), 2 * piece).unwrap();
    let good = d.export_allocation(&span).unwrap();
    let mut cut = good.clone();
    cut.payload.truncate(24);
    let mut short = good.clone();
    short.len = piece as u64;
    let mut odd = good.clone();
    odd.payload[0] ^= 1;
    for h in [cut, short, odd] {
        let e = dev(1).import_memory(&h).unwrap_err();
        assert!(matches!(e, Error::Ipc(_)), "{e}");
    }
    assert!(HostChunks::allocate(piece + 1, 2).is_err());
    assert!(HostChunks::allocate(piece, 0).is_err());
}
