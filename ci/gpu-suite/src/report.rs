//! The pass/fail table: per-rank results, serialized for the rendezvous and merged by rank 0.

use std::fmt::Write as _;
use std::time::Duration;

use oxccl_hal::Result;

/// One case's outcome on one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    /// Whether it passed.
    pub ok: bool,
    /// What the table cell shows ("PASS", "FAIL", or a number).
    pub cell: String,
    /// Detail or error text.
    pub detail: String,
}

impl CaseResult {
    /// From a case's result; the detail gets the elapsed time.
    pub fn from_result(r: Result<String>, took: Duration) -> CaseResult {
        match r {
            Ok(detail) => CaseResult {
                ok: true,
                cell: "PASS".into(),
                detail: format!("{detail} ({:.0} ms)", took.as_secs_f64() * 1e3),
            },
            Err(e) => CaseResult {
                ok: false,
                cell: "FAIL".into(),
                detail: e.to_string(),
            },
        }
    }
}

/// One rank's results.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// The rank.
    pub rank: u32,
    /// Cases in order.
    pub cases: Vec<(String, CaseResult)>,
    /// Free-form lines (device description, warnings).
    pub notes: Vec<String>,
}

fn clean(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

impl Report {
    /// An empty report for `rank`.
    pub fn new(rank: u32) -> Report {
        Report {
            rank,
            ..Report::default()
        }
    }

    /// Adds a case.
    pub fn push(&mut self, name: &str, r: CaseResult) {
        self.cases.push((name.to_string(), r));
    }

    /// Adds a bandwidth figure: the cell is the GB/s value; a failed check fails the case.
    pub fn bandwidth(&mut self, name: &str, r: Result<f64>) {
        let case = match r {
            Ok(gbps) => CaseResult {
                ok: true,
                cell: format!("{gbps:.1}"),
                detail: "every byte checked".into(),
            },
            Err(e) => CaseResult {
                ok: false,
                cell: "FAIL".into(),
                detail: e.to_string(),
            },
        };
        self.push(name, case);
    }

    /// Adds a note.
    pub fn note(&mut self, line: String) {
        self.notes.push(line);
    }

    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|(_, c)| c.ok)
    }

    /// Line-based text for the rendezvous.
    pub fn to_wire(&self) -> Vec<u8> {
        let mut out = String::new();
        for n in &self.notes {
            let _ = writeln!(out, "N\t{}", clean(n));
        }
        for (name, c) in &self.cases {
            let status = if c.ok { "PASS" } else { "FAIL" };
            let _ = writeln!(
                out,
                "C\t{}\t{status}\t{}\t{}",
                clean(name),
                clean(&c.cell),
                clean(&c.detail)
            );
        }
        out.into_bytes()
    }

    /// Inverse of [`Report::to_wire`].
    pub fn from_wire(rank: u32, bytes: &[u8]) -> Report {
        let mut r = Report::new(rank);
        for line in String::from_utf8_lossy(bytes).lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["N", note] => r.notes.push((*note).to_string()),
                ["C", name, status, cell, detail] => r.cases.push((
                    (*name).to_string(),
                    CaseResult {
                        ok: *status == "PASS",
                        cell: (*cell).to_string(),
                        detail: (*detail).to_string(),
                    },
                )),
                _ => {}
            }
        }
        r
    }
}

/// The merged table: one row per case, one column per rank; `None` marks a rank that
/// never reported. Returns the text and whether everything passed.
pub fn render(reports: &[Option<Report>]) -> (String, bool) {
    let mut names: Vec<String> = Vec::new();
    for r in reports.iter().flatten() {
        for (n, _) in &r.cases {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    let width = names.iter().map(String::len).max().unwrap_or(4).max(4);
    let mut out = String::new();
    let mut all_ok = true;
    let _ = write!(out, "{:width$}", "case");
    for rank in 0..reports.len() {
        let _ = write!(out, "  {:>8}", format!("rank{rank}"));
    }
    out.push('\n');
    for name in &names {
        let _ = write!(out, "{name:width$}");
        for r in reports {
            let cell = match r {
                None => {
                    all_ok = false;
                    "LOST".to_string()
                }
                Some(r) => match r.cases.iter().find(|(n, _)| n == name) {
                    Some((_, c)) => {
                        all_ok &= c.ok;
                        c.cell.clone()
                    }
                    None => {
                        all_ok = false;
                        "-".to_string()
                    }
                },
            };
            let _ = write!(out, "  {cell:>8}");
        }
        out.push('\n');
    }
    if reports.iter().any(Option::is_none) {
        all_ok = false;
    }
    let _ = writeln!(
        out,
        "\n{}",
        if all_ok {
            "RESULT: PASS"
        } else {
            "RESULT: FAIL"
        }
    );
    for r in reports.iter().flatten() {
        for n in &r.notes {
            let _ = writeln!(out, "  {n}");
        }
        for (name, c) in &r.cases {
            let mark = if c.ok { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "  [{mark}] rank{} {name}: {}", r.rank, c.detail);
        }
    }
    (out, all_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_wire_and_render() {
        let mut a = Report::new(0);
        a.note("device 0: test".into());
        a.push(
            "case one",
            CaseResult::from_result(Ok("fine\tdone".into()), Duration::from_millis(3)),
        );
        a.bandwidth("bw (GB/s)", Ok(391.84));
        let back = Report::from_wire(0, &a.to_wire());
        assert_eq!(back.cases.len(), 2);
        assert_eq!(back.cases[1].1.cell, "391.8");
        let mut b = Report::new(1);
        b.push(
            "case one",
            CaseResult::from_result(Err(oxccl_hal::Error::Ipc("x".into())), Duration::ZERO),
        );
        let (text, ok) = render(&[Some(back.clone()), Some(b)]);
        assert!(!ok);
        assert!(text.contains("RESULT: FAIL"), "{text}");
        let (text, ok) = render(&[Some(back.clone()), None]);
        assert!(!ok && text.contains("LOST"), "{text}");
        let (text, ok) = render(&[Some(back)]);
        assert!(ok, "{text}");
    }
}
