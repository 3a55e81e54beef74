//! The README command on the host backend: `oxccl-perf -N 2 -b 1K -e 1M -f 4` must pass
//! (every size checked against the reference) and write its JSON and its plot.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::process::Command;

mod common;

#[test]
fn two_ranks_on_the_host_backend_pass() {
    let json = std::env::temp_dir().join(format!("oxccl-perf-{}.json", std::process::id()));
    let png = json.with_extension("png");
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args([
            "-N", "2", "-b", "1K", "-e", "1M", "-f", "4", "-w", "1", "--iters", "2",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .env("OXCCL_BACKEND", "host")
        .env("OXCCL_TIMEOUT_MS", "60000")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "oxccl-perf failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# PASS"), "{stdout}");
    for size in ["1024", "4096", "16384", "65536", "262144", "1048576"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(size)),
            "{size}: {stdout}"
        );
    }
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(
        text.contains("\"rows\"") && text.contains("\"bytes\": 1048576"),
        "{text}"
    );
    let _ = std::fs::remove_file(json);
    let (w, h, left, right) = common::colored_pixels(&png);
    assert_eq!((w, h), (1600, 700));
    assert!(left > 200 && right > 200, "colored pixels: {left} {right}");
    let _ = std::fs::remove_file(png);
}

#[test]
fn bad_options_exit_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(["-b", "4M", "-e", "1M"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
}
