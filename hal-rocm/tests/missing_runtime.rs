//! With no HIP runtime, every entry point reports "no ROCm runtime found". Its own test
//! binary: it sets `OXCCL_HIP_LIBRARY` before the process-wide runtime is first loaded.
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use oxccl_hal::{Backend, DeviceId, Error};
use oxccl_hal_rocm::{Hip, RocmBackend, LIBRARY_VAR};

#[test]
fn missing_runtime_is_a_clear_error_every_time() {
    // The only test in this process, so nothing reads the environment concurrently.
    std::env::set_var(LIBRARY_VAR, "/nonexistent/libamdhip64.so");
    for _ in 0..2 {
        let err = RocmBackend::device_count().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::RuntimeMissing(_)), "{text}");
        assert!(
            text.starts_with("no ROCm runtime found (libamdhip64 could not be loaded): "),
            "{text}"
        );
        assert!(text.contains("/nonexistent/libamdhip64.so"), "{text}");
    }
    assert!(matches!(
        RocmBackend::open_device(DeviceId(0)),
        Err(Error::RuntimeMissing(_))
    ));
    assert!(matches!(
        Hip::load("/nonexistent/libamdhip64.so"),
        Err(Error::RuntimeMissing(_))
    ));
}
