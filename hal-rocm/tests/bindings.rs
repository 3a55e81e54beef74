//! The checked-in HIP bindings (`src/sys/v{5,6,7}.rs`): what bindgen makes of each
//! generation's headers today, and one function table for all generations (the neutral
//! layer in `src/sys/mod.rs` loads a single table whichever runtime answers).
#![cfg(feature = "hip")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

const GENERATIONS: [u32; 3] = [5, 6, 7];

fn checked_in(generation: u32) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/sys/v{generation}.rs"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text from `start` to the first line that is exactly `}` after it.
fn item<'a>(text: &'a str, start: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("no `{start}` in the bindings"));
    let len = text[from..]
        .find("\n}\n")
        .unwrap_or_else(|| panic!("`{start}` does not end"));
    &text[from..from + len + 2]
}

#[test]
fn regenerating_the_bindings_reproduces_the_checked_in_files() {
    // Set by build.rs; it regenerates v<N>.rs there when OXCCL_HIP<N>_INCLUDE_DIR is set.
    let out = PathBuf::from(env!("OXCCL_HIP_BINDGEN_OUT"));
    let all = std::env::var("OXCCL_HIP_ALL_GENERATIONS").is_ok_and(|v| v == "1");
    for g in GENERATIONS {
        let fresh = out.join(format!("v{g}.rs"));
        let Ok(fresh) = std::fs::read_to_string(&fresh) else {
            assert!(
                !all,
                "OXCCL_HIP_ALL_GENERATIONS=1 but the build did not regenerate v{g}.rs: was \
                 OXCCL_HIP{g}_INCLUDE_DIR set when it built?"
            );
            eprintln!("no HIP {g}.x headers at build time: v{g}.rs not compared");
            continue;
        };
        assert!(
            fresh == checked_in(g),
            "src/sys/v{g}.rs differs from what bindgen makes of the HIP {g}.x headers; \
             regenerate with ci/toolchains/hip-bindgen.sh and review the diff (a changed \
             value or layout needs a translation in src/sys/mod.rs)"
        );
    }
}

/// The declarations of `block` (a field, a `let`, a method, each with its continuation
/// lines), sorted. Bindgen emits the functions in the order the headers declare them, and
/// that order differs between generations (the 5.7 headers declare `hipMemGetAddressRange`
/// after the peer-access calls, 6.4 and 7.2 before them); the table is filled by symbol
/// name, so what must agree is each declaration, not where it stands.
fn declarations(block: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in block.lines() {
        let t = line.trim();
        let shorthand_field = t
            .strip_suffix(',')
            .is_some_and(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let starts = t.starts_with("pub ")
            || t.starts_with("let ")
            || t.starts_with("Ok(")
            || t.starts_with('}')
            || t.starts_with("__library")
            || shorthand_field;
        match out.last_mut() {
            Some(last) if !starts => {
                last.push('\n');
                last.push_str(line);
            }
            _ => out.push(line.to_string()),
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn every_generation_has_the_same_function_table() {
    let v7 = checked_in(7);
    let table = declarations(item(&v7, "pub struct HipApi {"));
    let loader = declarations(item(&v7, "impl HipApi {"));
    assert!(
        table
            .iter()
            .any(|d| d.contains("pub hipModuleLaunchKernel:")),
        "{table:?}"
    );
    for g in [5, 6] {
        let text = checked_in(g);
        assert_eq!(
            declarations(item(&text, "pub struct HipApi {")),
            table,
            "the function table of HIP {g}.x differs from 7.x's: src/sys/mod.rs loads one \
             table for all generations, so this needs a translation there"
        );
        assert_eq!(
            declarations(item(&text, "impl HipApi {")),
            loader,
            "HIP {g}.x"
        );
    }
}

/// The comparison above sees a changed signature, wherever the declaration stands.
#[test]
fn a_changed_signature_is_a_different_table() {
    let v7 = checked_in(7);
    let table = item(&v7, "pub struct HipApi {");
    let changed = table.replacen("psize: *mut usize", "psize: *mut u32", 1);
    assert_ne!(changed, table, "no hipMemGetAddressRange in the table");
    assert_ne!(declarations(&changed), declarations(table));
}

#[test]
fn the_symbol_list_is_the_function_table() {
    let v7 = checked_in(7);
    let table = item(&v7, "pub struct HipApi {");
    let mut fields: Vec<&str> = table
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split(':').next())
        .filter(|n| n.starts_with("hip"))
        .collect();
    let mut listed = oxccl_hal_rocm::sys::FUNCTIONS.to_vec();
    fields.sort_unstable();
    listed.sort_unstable();
    assert_eq!(fields, listed);
}

#[test]
fn each_file_says_which_headers_it_comes_from() {
    for (g, headers) in [(5, "5.7"), (6, "6.4"), (7, "7.2")] {
        let text = checked_in(g);
        assert!(
            text.contains(&format!(
                "// HIP {g}.x ABI: generated by bindgen from the HIP {headers} headers"
            )),
            "v{g}.rs"
        );
        assert!(
            text.contains(&format!("pub const HIP_VERSION_MAJOR: u32 = {g};")),
            "v{g}.rs"
        );
    }
}
