//! Shared by the integration tests of this crate.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Marks the child process of [`rerun_tcp_tests_through_the_bounce_buffers`].
pub const BOUNCE_CHILD: &str = "OXCCL_TEST_BOUNCE_CHILD";

/// Runs the `tcp_` tests of the calling test binary again, in a child process with
/// `OXCCL_TCP_BOUNCE=1`: the data of host-backend memory then takes the bounce buffers and
/// streams of GPU memory, a path the host backend otherwise never runs. Returns at once in
/// that child.
pub fn rerun_tcp_tests_through_the_bounce_buffers() {
    if std::env::var_os(BOUNCE_CHILD).is_some() {
        return; // the child itself
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("tcp_")
        .env(oxccl_channels::connection::tcp::BOUNCE_VAR, "1")
        .env(BOUNCE_CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "through the bounce buffers:\n{text}");
    assert!(text.contains("test result: ok."), "{text}");
}
