//! Rows of the table, agreement across ranks, JSON.

use std::fmt::Write as _;

use oxccl_collectives::hal::{BackendKind, Device, Error, Result};
use oxccl_collectives::Communicator;

use crate::options::Options;

/// One implementation's result at one size (after [`agree`]: over all ranks).
#[derive(Debug, Clone, Copy, Default)]
pub struct Side {
    /// Microseconds per call (the slowest rank's).
    pub us: f64,
    /// Elements that differ from the exact reference (all ranks).
    pub wrong: usize,
    /// Elements checked (all ranks).
    pub checked: usize,
    /// Largest relative error vs the f64 reference (all ranks).
    pub max_rel_err: f64,
}

/// One size.
#[derive(Debug, Clone)]
pub struct Row {
    pub bytes: usize,
    pub count: usize,
    pub algorithm: &'static str,
    pub world: u32,
    pub ours: Side,
    pub nccl: Option<Side>,
}

impl Side {
    /// Algorithm bandwidth in GB/s.
    pub fn algbw(&self, bytes: usize) -> f64 {
        if self.us > 0.0 {
            bytes as f64 / self.us / 1e3
        } else {
            0.0
        }
    }

    /// Bus bandwidth in GB/s: algbw x 2(n-1)/n.
    pub fn busbw(&self, bytes: usize, world: u32) -> f64 {
        let n = f64::from(world.max(1));
        self.algbw(bytes) * 2.0 * (n - 1.0) / n
    }
}

/// Combines every rank's `side`: slowest time, summed counts, largest error.
pub fn agree(comm: &Communicator, side: Side) -> Result<Side> {
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&side.us.to_le_bytes());
    b.extend_from_slice(&(side.wrong as u64).to_le_bytes());
    b.extend_from_slice(&(side.checked as u64).to_le_bytes());
    b.extend_from_slice(&side.max_rel_err.to_le_bytes());
    let all = comm.bootstrap().all_gather(&b)?;
    let mut out = Side::default();
    for v in all {
        let word = |i: usize| -> Result<[u8; 8]> {
            v.get(8 * i..8 * i + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| Error::InvalidArgument("short result from a rank".into()))
        };
        out.us = out.us.max(f64::from_le_bytes(word(0)?));
        out.wrong += u64::from_le_bytes(word(1)?) as usize;
        out.checked += u64::from_le_bytes(word(2)?) as usize;
        out.max_rel_err = out.max_rel_err.max(f64::from_le_bytes(word(3)?));
    }
    Ok(out)
}

/// A tuned table as comment lines (rank 0).
pub fn print_tune_table(
    t: &oxccl_collectives::tuner::TuneTable,
    source: oxccl_collectives::tuner::TuneSource,
) {
    println!(
        "# tuned {} for {} ranks on {} ({:?}): size(B) registered algorithm grid x block time(us)",
        t.key.dtype, t.key.world, t.key.device, source
    );
    for e in &t.entries {
        println!(
            "#   {:>11} {:>5} {:>12} {:>4} x {:<4} {:>10.2}",
            e.bytes,
            if e.registered { "reg" } else { "-" },
            e.algorithm.name(),
            e.grid,
            e.block,
            e.us
        );
    }
}

/// The table's header (rank 0).
pub fn header(opts: &Options, comm: &Communicator) {
    let caps = comm.device().capabilities();
    println!(
        "# oxccl-perf: {} ranks on {} ({}), {} {} accum {}, {}, {}, {} warm-up + {} iterations{}",
        comm.world_size(),
        caps.name,
        Device::backend(comm.device()),
        opts.dtype,
        opts.op,
        opts.accum,
        if opts.in_place {
            "in place"
        } else {
            "out of place"
        },
        if opts.no_register {
            "unregistered buffers"
        } else {
            "registered buffers"
        },
        opts.warmup,
        opts.iters,
        if opts.graph { ", graph replay" } else { "" }
    );
    if Device::backend(comm.device()) != BackendKind::Host && comm.world_size() > 1 {
        println!(
            "# peers: {}",
            if comm.nvlink() {
                "NVLink between every pair of ranks (oneshot_ll128 available)"
            } else {
                "not all over NVLink (oneshot_ll128 off)"
            }
        );
        println!(
            "# launch: {}",
            if comm.early_launch() {
                "early (each kernel waits on the GPU for the one before it)"
            } else {
                "after the previous kernel (early launch off or not supported)"
            }
        );
    }
    let mut h = format!(
        "{:>12} {:>12} {:>11} {:>10} {:>9} {:>9} {:>7} {:>9}",
        "size(B)", "count", "algorithm", "time(us)", "algbw", "busbw", "#wrong", "maxerr"
    );
    if opts.compare_nccl {
        let _ = write!(
            h,
            " | {:>10} {:>9} {:>9} {:>8}",
            "nccl(us)", "busbw", "maxerr", "speedup"
        );
    }
    println!("{h}");
}

/// One row (rank 0).
pub fn print_row(r: &Row) {
    let mut line = format!(
        "{:>12} {:>12} {:>11} {:>10.2} {:>9.2} {:>9.2} {:>7} {:>9.2e}",
        r.bytes,
        r.count,
        r.algorithm,
        r.ours.us,
        r.ours.algbw(r.bytes),
        r.ours.busbw(r.bytes, r.world),
        r.ours.wrong,
        r.ours.max_rel_err
    );
    if let Some(n) = &r.nccl {
        let _ = write!(
            line,
            " | {:>10.2} {:>9.2} {:>9.2e} {:>7.2}x",
            n.us,
            n.busbw(r.bytes, r.world),
            n.max_rel_err,
            if r.ours.us > 0.0 {
                n.us / r.ours.us
            } else {
                0.0
            }
        );
    }
    println!("{line}");
}

fn side_json(s: &Side, bytes: usize, world: u32) -> String {
    format!(
        "{{\"time_us\": {:.3}, \"algbw_gbps\": {:.3}, \"busbw_gbps\": {:.3}, \"wrong\": {}, \
         \"checked\": {}, \"max_rel_err\": {:e}}}",
        s.us,
        s.algbw(bytes),
        s.busbw(bytes, world),
        s.wrong,
        s.checked,
        if s.max_rel_err.is_finite() {
            s.max_rel_err
        } else {
            -1.0
        }
    )
}

/// Writes every row as JSON.
pub fn write_json(path: &str, opts: &Options, comm: &Communicator, rows: &[Row]) -> Result<()> {
    let caps = comm.device().capabilities();
    let mut s = format!(
        "{{\n  \"tool\": \"oxccl-perf\",\n  \"ranks\": {},\n  \"device\": {:?},\n  \"backend\": \
         \"{}\",\n  \"dtype\": \"{}\",\n  \"op\": \"{}\",\n  \"accum\": \"{}\",\n  \"in_place\": \
         {},\n  \"graph\": {},\n  \"rows\": [\n",
        comm.world_size(),
        caps.name,
        Device::backend(comm.device()),
        opts.dtype,
        opts.op,
        opts.accum,
        opts.in_place,
        opts.graph
    );
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\"bytes\": {}, \"count\": {}, \"algorithm\": \"{}\", \"oxccl\": {}, \"nccl\": {}}}{}",
            r.bytes,
            r.count,
            r.algorithm,
            side_json(&r.ours, r.bytes, r.world),
            r.nccl
                .as_ref()
                .map_or("null".to_string(), |n| side_json(n, r.bytes, r.world)),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    s.push_str("  ]\n}\n");
    std::fs::write(path, s).map_err(|e| Error::Os {
        call: "write (--json)",
        source: e,
    })
}

/// A JSON value: enough to read back what [`write_json`] writes (`--plot-from`).
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses one JSON document (RFC 8259; numbers as f64).
    pub fn parse(text: &str) -> Result<Json> {
        let mut p = JsonParser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn err(&self, what: &str) -> Error {
        Error::InvalidArgument(format!("JSON: {what} at byte {}", self.i))
    }

    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> Result<()> {
        if self.s[self.i.min(self.s.len())..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(self.err(&format!("expected '{lit}'")))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json> {
        if depth > 64 {
            return Err(self.err("nested too deeply"));
        }
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut members = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(members));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    self.eat(":")?;
                    let v = self.value(depth + 1)?;
                    members.push((key, v));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(members));
                        }
                        _ => return Err(self.err("expected ',' or '}'")),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(self.err("expected ',' or ']'")),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.eat("true").map(|()| Json::Bool(true)),
            Some(b'f') => self.eat("false").map(|()| Json::Bool(false)),
            Some(b'n') => self.eat("null").map(|()| Json::Null),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while matches!(
                    self.s.get(self.i),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.i += 1;
                }
                std::str::from_utf8(&self.s[start..self.i])
                    .ok()
                    .and_then(|t| t.parse::<f64>().ok())
                    .map(Json::Num)
                    .ok_or_else(|| self.err("bad number"))
            }
            _ => Err(self.err("expected a value")),
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.err("bad \\u escape"))?;
        self.i += 4;
        Ok(h)
    }

    fn string(&mut self) -> Result<String> {
        self.eat("\"")?;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return Err(self.err("unterminated string"));
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(self.err("unterminated string"));
                    };
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xd800..0xdc00).contains(&cp) {
                                self.eat("\\u")?;
                                let lo = self.hex4()?;
                                cp = 0x10000
                                    + ((cp - 0xd800) << 10)
                                    + (lo.wrapping_sub(0xdc00) & 0x3ff);
                            }
                            char::from_u32(cp).unwrap_or('\u{fffd}')
                        }
                        _ => return Err(self.err("bad escape")),
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                _ => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| self.err("string is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_of_our_format() {
        let v = Json::parse(
            "{\"a\": [1, -2.5e-3, 0e0], \"s\": \"x\\\"\\u00e9\", \"n\": null, \"t\": true, \
             \"o\": {}, \"e\": []}",
        )
        .unwrap();
        let a = v.get("a").and_then(Json::as_array).unwrap();
        assert_eq!(a[1].as_f64(), Some(-2.5e-3));
        assert_eq!(v.get("s").and_then(Json::as_str), Some("x\"é"));
        assert_eq!(v.get("n"), Some(&Json::Null));
        assert_eq!(v.get("t").and_then(Json::as_bool), Some(true));
        assert!(Json::parse("{\"a\": 1,}").is_err());
        assert!(Json::parse("[1] x").is_err());
        assert!(Json::parse("\"abc").is_err());
    }
}
