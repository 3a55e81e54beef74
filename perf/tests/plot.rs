//! `--plot-from`: a JSON table in oxccl-perf's format becomes a decodable, non-blank PNG,
//! without running any collective.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::process::Command;

mod common;

#[test]
fn plot_from_json_writes_a_png() {
    let dir = std::env::temp_dir();
    let json = dir.join(format!("oxccl-plot-{}.json", std::process::id()));
    let png = dir.join(format!("oxccl-plot-{}.png", std::process::id()));
    let mut rows = Vec::new();
    for e in (10..=30).step_by(2) {
        let bytes = 1u64 << e;
        let us = 6.0 + bytes as f64 / 3e5;
        let nccl_us = 9.0 + bytes as f64 / 3.5e5;
        let bw = |t: f64| bytes as f64 / t / 1e3 * 1.5;
        rows.push(format!(
            "    {{\"bytes\": {bytes}, \"count\": {}, \"algorithm\": \"oneshot_ll\", \"oxccl\": \
             {{\"time_us\": {us:.3}, \"algbw_gbps\": 0, \"busbw_gbps\": {:.3}, \"wrong\": 0, \
             \"checked\": 1, \"max_rel_err\": 0e0}}, \"nccl\": {{\"time_us\": {nccl_us:.3}, \
             \"busbw_gbps\": {:.3}}}}}",
            bytes / 2,
            bw(us),
            bw(nccl_us)
        ));
    }
    let text = format!(
        "{{\n  \"tool\": \"oxccl-perf\",\n  \"ranks\": 4,\n  \"device\": \"NVIDIA H200\",\n  \
         \"backend\": \"CUDA\",\n  \"dtype\": \"bf16\",\n  \"op\": \"sum\",\n  \"accum\": \
         \"auto\",\n  \"in_place\": false,\n  \"graph\": true,\n  \"rows\": [\n{}\n  ]\n}}\n",
        rows.join(",\n")
    );
    std::fs::write(&json, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .arg("--plot-from")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (w, h, left, right) = common::colored_pixels(&png);
    assert_eq!((w, h), (1600, 700));
    assert!(left > 500 && right > 500, "colored pixels: {left} {right}");

    // Without --plot: next to the JSON file, same name with .png.
    let default_png = json.with_extension("png");
    let _ = std::fs::remove_file(&default_png);
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .arg("--plot-from")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(default_png.exists());

    // A file that is not our JSON fails with a message, not a panic.
    std::fs::write(&json, "{\"rows\": 3}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .arg("--plot-from")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not an oxccl-perf --json file") && err.contains("expected a sequence"),
        "{err}"
    );
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(png);
}
