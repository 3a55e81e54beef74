//! oxccl-perf on 2 ranks of the host backend: the README command `oxccl-perf -N 2 -b 1K -e
//! 1M -f 4` must pass (every size checked against the reference) and write its JSON and its
//! plot; all-gather, reduce-scatter, all-to-all, broadcast and reduce must pass in and out of
//! place at sizes that are not powers of two, with nccl-tests' sizes and bus bandwidth; flags
//! that make no sense are refused.

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

/// Runs oxccl-perf on 2 host ranks; (stdout, the table's rows as their fields).
fn host_run(args: &[&str]) -> (String, Vec<Vec<String>>) {
    host_run_with(args, &[])
}

/// [`host_run`] with extra environment variables (`OXCCL_ALGO`).
fn host_run_with(args: &[&str], envs: &[(&str, &str)]) -> (String, Vec<Vec<String>>) {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(["-N", "2", "-w", "1", "--iters", "2"])
        .args(args)
        .envs(envs.iter().copied())
        .env("OXCCL_BACKEND", "host")
        .env("OXCCL_TIMEOUT_MS", "60000")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "oxccl-perf {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# PASS"), "{stdout}");
    let rows = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    (stdout, rows)
}

#[test]
fn allgather_on_two_ranks_passes_in_and_out_of_place() {
    for in_place in [false, true] {
        let json = std::env::temp_dir().join(format!(
            "oxccl-perf-allgather-{}-{in_place}.json",
            std::process::id()
        ));
        let mut args = vec!["-c", "allgather", "-b", "1000", "-e", "100000", "-f", "7"];
        args.extend(["-d", "f32", "--json", json.to_str().unwrap()]);
        if in_place {
            args.push("--in-place");
        }
        let (stdout, rows) = host_run(&args);
        let mode = if in_place { "in place" } else { "out of place" };
        assert!(
            stdout.contains("# oxccl-perf allgather: 2 ranks") && stdout.contains(mode),
            "{stdout}"
        );
        // nccl-tests' convention: the size is the gathered output, the count per rank.
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r[0].as_str(), r[1].as_str(), r[6].as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("1000", "125", "0"),
                ("7000", "875", "0"),
                ("49000", "6125", "0")
            ],
            "{stdout}"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        assert_eq!(doc["collective"], "allgather");
        assert_eq!(doc["in_place"], in_place);
        // No reduction: no op, no accumulation type.
        assert!(
            doc.get("op").is_none() && doc.get("accum").is_none(),
            "{doc}"
        );
        let rows = doc["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3);
        for r in rows {
            let side = &r["oxccl"];
            assert_eq!(side["wrong"], 0);
            // Every element of both slots checked on both ranks.
            assert_eq!(side["checked"], 2 * 2 * r["count"].as_u64().unwrap());
            let (alg, bus) = (
                side["algbw_gbps"].as_f64().unwrap(),
                side["busbw_gbps"].as_f64().unwrap(),
            );
            // busbw = algbw x (n-1)/n on 2 ranks.
            assert!((bus - alg * 0.5).abs() <= 1e-12 * alg.max(1.0), "{r}");
        }
    }
}

#[test]
fn allgather_sizes_round_like_nccl_tests_and_the_algorithm_follows_registration() {
    // 1001 bytes of bf16 on 2 ranks: 250 elements per rank, 1000 bytes gathered. Above
    // the one-shot size a registered output is stored into directly; unregistered ones
    // go through the staging buffers. The one-shot hands over above 128 KiB per rank when
    // the output is registered, above 1 MiB when not.
    for (flags, middle, large) in [
        (&[][..], "allgather_direct", "allgather_direct"),
        (
            &["--no-register"][..],
            "allgather_oneshot_ll",
            "allgather_staged",
        ),
    ] {
        let mut args = vec!["-c", "allgather", "-b", "1001", "-e", "20M", "-f", "7"];
        args.extend(flags);
        let (stdout, rows) = host_run(&args);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("1000", "250", "allgather_oneshot_ll"),
                ("7004", "1751", "allgather_oneshot_ll"),
                ("49048", "12262", "allgather_oneshot_ll"),
                // 168 KiB per rank.
                ("343340", "85835", middle),
                // 1.2 MB per rank: above the all-gather one-shot's 1 MiB on 2 ranks.
                ("2403400", "600850", large),
                ("16823804", "4205951", large),
            ],
            "{stdout}"
        );
    }
}

/// Flags, the collective's name, (size, count) of the three rows, output slots, bus factor.
type Case = (
    &'static [&'static str],
    &'static str,
    [(&'static str, &'static str); 3],
    u64,
    f64,
);

#[test]
fn reducescatter_alltoall_and_broadcast_on_two_ranks_pass() {
    // Sizes per nccl-tests: reduce-scatter's and all-to-all's is the send buffer (ranks x
    // the count), broadcast's the message. Every element checked on both ranks, nothing
    // wrong; busbw = algbw x (n-1)/n, or x 1 for broadcast.
    let cases: [Case; 5] = [
        (
            &["-c", "reducescatter", "-d", "f32"],
            "reducescatter",
            [("1000", "125"), ("7000", "875"), ("49000", "6125")],
            1,
            0.5,
        ),
        (
            &[
                "-c",
                "reducescatter",
                "-d",
                "bf16",
                "--accum",
                "f32",
                "-o",
                "max",
                "--in-place",
            ],
            "reducescatter",
            [("1000", "250"), ("7000", "1750"), ("49000", "12250")],
            1,
            0.5,
        ),
        (
            &["-c", "alltoall", "-d", "f32"],
            "alltoall",
            [("1000", "125"), ("7000", "875"), ("49000", "6125")],
            2,
            0.5,
        ),
        (
            &["-c", "broadcast", "-d", "f32", "--root", "1"],
            "broadcast",
            [("1000", "250"), ("7000", "1750"), ("49000", "12250")],
            1,
            1.0,
        ),
        (
            &["-c", "broadcast", "-d", "bf16", "--in-place"],
            "broadcast",
            [("1000", "500"), ("7000", "3500"), ("49000", "24500")],
            1,
            1.0,
        ),
    ];
    for (flags, name, sizes, slots, factor) in cases {
        let json =
            std::env::temp_dir().join(format!("oxccl-perf-{name}-{}.json", std::process::id()));
        let mut args = vec![
            "-b",
            "1000",
            "-e",
            "100000",
            "-f",
            "7",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend(flags);
        let (stdout, rows) = host_run(&args);
        assert!(
            stdout.contains(&format!("# oxccl-perf {name}: 2 ranks")),
            "{stdout}"
        );
        let got: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r[0].as_str(), r[1].as_str()))
            .collect();
        assert_eq!(got, sizes, "{flags:?}\n{stdout}");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        assert_eq!(doc["collective"], name);
        for r in doc["rows"].as_array().unwrap() {
            let side = &r["oxccl"];
            assert_eq!(side["wrong"], 0, "{flags:?} {r}");
            assert_eq!(
                side["checked"],
                2 * slots * r["count"].as_u64().unwrap(),
                "{flags:?} {r}"
            );
            let (alg, bus) = (
                side["algbw_gbps"].as_f64().unwrap(),
                side["busbw_gbps"].as_f64().unwrap(),
            );
            assert!(
                (bus - alg * factor).abs() <= 1e-12 * alg.max(1.0),
                "{flags:?} {r}"
            );
        }
    }
}

#[test]
fn reduce_on_two_ranks_passes_at_either_root_in_and_out_of_place() {
    // nccl-tests' reduce: the size is the message, busbw = algbw. The root's output is the
    // reduction bit for bit; the other rank's output must stay poisoned (in place: its
    // input). Up to 2 MiB the one-shot serves; above, registered buffers take the direct
    // kernel, unregistered ones the staged one.
    let cases: [(&[&str], &str); 4] = [
        (&["-d", "f32", "--root", "1"], "reduce_direct"),
        (
            &["-d", "bf16", "-o", "max", "--accum", "f32", "--in-place"],
            "reduce_direct",
        ),
        (
            &[
                "-d",
                "fp8_e4m3",
                "-o",
                "avg",
                "--root",
                "1",
                "--no-register",
            ],
            "reduce_staged",
        ),
        (
            &["-d", "f16", "-o", "prod", "--in-place", "--no-register"],
            "reduce_staged",
        ),
    ];
    for (flags, algorithm) in cases {
        let json = std::env::temp_dir().join(format!(
            "oxccl-perf-reduce-{}-{}.json",
            algorithm,
            std::process::id()
        ));
        let mut args = vec![
            "-c",
            "reduce",
            "-b",
            "1000",
            "-e",
            "2401000",
            "-f",
            "7",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend(flags);
        let (stdout, rows) = host_run(&args);
        assert!(stdout.contains("# oxccl-perf reduce: 2 ranks"), "{stdout}");
        let size = |d: &str| match d {
            "f32" => 4,
            "fp8_e4m3" => 1,
            _ => 2,
        };
        let elt = size(flags[1]);
        let want: Vec<(String, String, &str)> = [1000usize, 7000, 49000, 343_000, 2_401_000]
            .iter()
            .map(|b| {
                let algorithm = if *b <= 2 << 20 {
                    "reduce_oneshot_ll"
                } else {
                    algorithm
                };
                (b.to_string(), (b / elt).to_string(), algorithm)
            })
            .collect();
        let got: Vec<(String, String, &str)> = rows
            .iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[2].as_str()))
            .collect();
        assert_eq!(got, want, "{flags:?}\n{stdout}");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        assert_eq!(doc["collective"], "reduce");
        for r in doc["rows"].as_array().unwrap() {
            let side = &r["oxccl"];
            assert_eq!(side["wrong"], 0, "{flags:?} {r}");
            // Every element of the output checked on both ranks (the root's reduction, the
            // other rank's untouched buffer).
            assert_eq!(
                side["checked"],
                2 * r["count"].as_u64().unwrap(),
                "{flags:?} {r}"
            );
            let (alg, bus) = (
                side["algbw_gbps"].as_f64().unwrap(),
                side["busbw_gbps"].as_f64().unwrap(),
            );
            assert!((bus - alg).abs() <= 1e-12 * alg.max(1.0), "{flags:?} {r}");
        }
    }
}

#[test]
fn bad_options_exit_with_usage() {
    for args in [
        &["-b", "4M", "-e", "1M"][..],
        &["-c", "allgather", "-o", "max"][..],
        &["-c", "gather"][..],
        &["-c", "alltoall", "--in-place"][..],
        &["-c", "allgather", "--root", "1"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("usage"),
            "{args:?}"
        );
    }
}

#[test]
fn integer_and_f64_reductions_on_two_ranks_pass() {
    // The own-type types through the perf tool's reference: i32 sums, u8 max, i64 avg
    // (truncating), f64 sums, all bit for bit on both ranks; and reduce-scatter of i32.
    for (dtype, op) in [
        ("i32", "sum"),
        ("u8", "max"),
        ("int64", "avg"),
        ("double", "sum"),
    ] {
        let (stdout, rows) =
            host_run(&["-b", "999", "-e", "70000", "-f", "7", "-d", dtype, "-o", op]);
        assert!(rows.len() >= 3, "{stdout}");
    }
    let (stdout, _) = host_run(&[
        "-c",
        "reducescatter",
        "-b",
        "1000",
        "-e",
        "9000",
        "-d",
        "u32",
    ]);
    assert!(stdout.contains("u32"), "{stdout}");
    // f32 accumulation has no meaning for integers: refused with a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(["-N", "2", "-d", "i32", "--accum", "f32"])
        .env("OXCCL_BACKEND", "host")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("own type"), "{err}");
}

#[test]
fn soak_on_two_host_ranks_checks_every_call_and_stays_flat() {
    let json = std::env::temp_dir().join(format!("oxccl-soak-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(["-N", "2", "--soak", "4", "-b", "1", "-e", "256K", "--json"])
        .arg(&json)
        .env("OXCCL_BACKEND", "host")
        .env("OXCCL_TIMEOUT_MS", "60000")
        .env("OXCCL_SOAK_SAMPLE_SECS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "soak failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# PASS: soak"), "{stdout}");
    // Samples from both ranks, each second.
    for rank in 0..2 {
        let samples = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("# soak rank {rank} at")))
            .count();
        assert!(samples >= 2, "rank {rank}: {stdout}");
    }
    let text = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(text.contains("\"mode\": \"soak\""), "{text}");
    assert!(text.contains("\"wrong\": 0"), "{text}");
    assert!(text.contains("\"flat_on_every_rank\": true"), "{text}");
    let calls: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"calls\": "))
        .and_then(|v| v.trim_end_matches(',').parse().ok())
        .unwrap();
    assert!(calls > 20, "{text}");
}

#[test]
fn alltoallv_moves_uneven_chunks_registered_and_not() {
    // Rank r sends rank p 1/2 to all of each chunk (`v_count`); the rest of every receive
    // slot must keep the poison, which the check verifies. These sizes take the one-shot
    // by default; every other algorithm forced (registered outputs where it stores into
    // the peers' outputs, unregistered ones for the staging).
    for (flags, forced, algorithm) in [
        (&[][..], None, "alltoallv_oneshot_ll"),
        (&[][..], Some("alltoallv_direct"), "alltoallv_direct"),
        (&[][..], Some("alltoallv_copy"), "alltoallv_copy"),
        (
            &["--no-register"][..],
            Some("alltoallv_staged"),
            "alltoallv_staged",
        ),
    ] {
        let mut args = vec![
            "-c",
            "alltoallv",
            "-b",
            "1000",
            "-e",
            "400000",
            "-f",
            "13",
            "-d",
            "f32",
        ];
        args.extend(flags);
        let envs: Vec<_> = forced.map(|a| ("OXCCL_ALGO", a)).into_iter().collect();
        let (stdout, rows) = host_run_with(&args, &envs);
        assert!(
            stdout.contains("# oxccl-perf alltoallv: 2 ranks"),
            "{stdout}"
        );
        assert_eq!(rows.len(), 3, "{stdout}");
        for r in &rows {
            assert_eq!((r[2].as_str(), r[6].as_str()), (algorithm, "0"), "{stdout}");
        }
    }
}
