//! The self-test on the host backend: the host kernel table against the host reference.
//! (Exercises the harness and the argument blocks; the GPU run is in ci/.)

use oxccl_hal::host::HostBackend;
use oxccl_hal::{Backend, DeviceId};

#[test]
fn host_selftest_passes() {
    let device = HostBackend::open_device(DeviceId(0)).unwrap();
    let report = oxccl_kernels::selftest::run::<HostBackend>(&device, 0x5eed).unwrap();
    println!("{report}");
    assert!(report.passed(), "{report}");
    // decode: 7 types; encode: 1 + 7 x 4; reduce: 8 float types x 5 ops x 4 accum, and
    // 7 own-type types (integers, f64) x 5 ops; scale: 15 types x 2.
    assert_eq!(report.cases.len(), 7 + 29 + 160 + 35 + 30);
}
