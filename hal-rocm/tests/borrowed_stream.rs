//! A caller's `hipStream_t` wrapped without ownership ([`RocmStream::borrowed`]), driven
//! against the fake HIP runtime: work is queued on the caller's stream, on the wrapped
//! device, and the wrapper never destroys the stream.
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Fake;
use oxccl_hal::{Device, DeviceId, Event, Memory, MemoryKind, Stream};
use oxccl_hal_rocm::{RocmDevice, RocmStream};

#[test]
fn borrowed_stream_moves_bytes_and_is_never_destroyed() {
    for g in common::generations() {
        eprintln!("HIP ABI generation {g}");
        borrowed_stream_moves_bytes(g);
    }
}

fn borrowed_stream_moves_bytes(g: u32) {
    let fake = Fake::new(g);
    let dev = RocmDevice::open_on(&fake.hip, DeviceId(1)).unwrap();
    // The caller's stream, made outside oxccl's safe types (as a program would with
    // hipStreamCreate).
    let raw = fake.hip.stream_create().unwrap();
    // SAFETY: `raw` is a live stream of the fake's device 1 until destroyed below.
    let s = unsafe { RocmStream::borrowed(&dev, raw) }.unwrap();
    assert!(!s.is_owned());
    assert_eq!(s.as_raw(), raw);

    let a = dev.alloc(32, MemoryKind::Plain).unwrap();
    let data: Vec<u8> = (0..32).map(|i| i * 3 + 1).collect();
    // Another device current on this thread: the borrowed stream makes its own current.
    fake.hip.set_device(0).unwrap();
    s.write(a.ptr(), &data).unwrap();
    assert_eq!(fake.hip.current_device().unwrap(), 1);
    let mut back = [0u8; 32];
    s.read(a.ptr(), &mut back).unwrap();
    assert_eq!(back.to_vec(), data);

    let (start, stop) = (dev.create_event().unwrap(), dev.create_event().unwrap());
    s.record(&start).unwrap();
    s.record(&stop).unwrap();
    stop.synchronize().unwrap();
    assert_eq!(stop.elapsed_ms_since(&start).unwrap(), 1.5);
    s.synchronize().unwrap();

    drop(s);
    assert_eq!(
        fake.calls("hipStreamDestroy"),
        0,
        "a borrowed stream was destroyed"
    );
    // The caller still owns it: destroying it now is the only destroy.
    // SAFETY: made above, no work left on it, not used after this.
    unsafe { fake.hip.stream_destroy(raw) }.unwrap();
    assert_eq!(fake.calls("hipStreamDestroy"), 1);

    // A stream made here is destroyed by its owner, once.
    let own = dev.create_stream().unwrap();
    assert!(own.is_owned());
    drop(own);
    assert_eq!(fake.calls("hipStreamDestroy"), 2);
}

#[test]
fn null_stream_can_be_borrowed() {
    for g in common::generations() {
        eprintln!("HIP ABI generation {g}");
        null_stream(g);
    }
}

fn null_stream(g: u32) {
    let fake = Fake::new(g);
    let dev = RocmDevice::open_on(&fake.hip, DeviceId(0)).unwrap();
    // SAFETY: NULL is HIP's null stream of the current device, always valid.
    let s = unsafe { RocmStream::borrowed(&dev, std::ptr::null_mut()) }.unwrap();
    let a = dev.alloc(8, MemoryKind::Plain).unwrap();
    s.write(a.ptr(), &[7; 8]).unwrap();
    let mut back = [0u8; 8];
    s.read(a.ptr(), &mut back).unwrap();
    assert_eq!(back, [7; 8]);
    drop(s);
    assert_eq!(fake.calls("hipStreamDestroy"), 0);
}
