//! The `--json` file: one schema, written by [`crate::report::write_json`] and read back by
//! `--plot-from` ([`crate::plot::Figure::from_json`]), both through serde.

use serde::{Deserialize, Serialize};

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always "oxccl-perf".
    pub tool: String,
    /// The collective every row times (`-c`: "allreduce", ...). Files written before the
    /// field existed were all allreduce.
    #[serde(default = "allreduce")]
    pub collective: String,
    pub ranks: u32,
    pub device: String,
    pub backend: String,
    pub dtype: String,
    /// The reduction op and accumulation type; absent for collectives that do not reduce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accum: Option<String>,
    pub in_place: bool,
    pub graph: bool,
    pub rows: Vec<Row>,
}

fn allreduce() -> String {
    "allreduce".to_string()
}

/// One message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// nccl-tests' size: the larger of one rank's send and receive buffers, in bytes.
    pub bytes: u64,
    /// Elements passed to the call (per rank).
    #[serde(default)]
    pub count: u64,
    #[serde(default)]
    pub algorithm: String,
    pub oxccl: Side,
    /// The same size through NCCL/RCCL in the same run (`--compare nccl`), else null.
    #[serde(default)]
    pub nccl: Option<Side>,
    /// NCCL's symmetric-memory kernels at this size (buffers in symmetric windows, NCCL
    /// 2.27+), else absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_symmetric: Option<Side>,
}

/// One implementation at one size. Everything but the time may be absent in a file edited by
/// hand; the plot then derives the bus bandwidth from the time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub time_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    #[serde(default)]
    pub wrong: u64,
    #[serde(default)]
    pub checked: u64,
    /// Largest relative error against the f64 reference; null where it is not finite (JSON
    /// has no NaN or infinity).
    #[serde(default)]
    pub max_rel_err: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing_fields() {
        let r = Report {
            tool: "oxccl-perf".into(),
            collective: "allreduce".into(),
            ranks: 2,
            device: "NVIDIA \"H200\"".into(),
            backend: "CUDA".into(),
            dtype: "bf16".into(),
            op: Some("sum".into()),
            accum: Some("auto".into()),
            in_place: false,
            graph: true,
            rows: vec![Row {
                bytes: 1024,
                count: 512,
                algorithm: "oneshot_ll".into(),
                oxccl: Side {
                    time_us: 2.5,
                    algbw_gbps: Some(0.4),
                    busbw_gbps: Some(0.4),
                    wrong: 0,
                    checked: 1024,
                    max_rel_err: None,
                },
                nccl: None,
                nccl_symmetric: None,
            }],
        };
        let text = serde_json::to_string_pretty(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), r);
        assert!(text.contains("\"op\": \"sum\""), "{text}");
        // Without a reduction the file has no op or accumulation type.
        let plain = Report {
            op: None,
            accum: None,
            ..r.clone()
        };
        let text = serde_json::to_string_pretty(&plain).unwrap();
        assert!(
            !text.contains("\"op\"") && !text.contains("\"accum\""),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), plain);
        // An older file: no collective, a row with only bytes and a time.
        let old: Report = serde_json::from_str(
            "{\"tool\": \"oxccl-perf\", \"ranks\": 2, \"device\": \"d\", \"backend\": \"CUDA\", \
             \"dtype\": \"f32\", \"op\": \"sum\", \"accum\": \"auto\", \"in_place\": true, \
             \"graph\": false, \"rows\": [{\"bytes\": 8, \"oxccl\": {\"time_us\": 1.0}}]}",
        )
        .unwrap();
        assert_eq!(old.collective, "allreduce");
        assert_eq!(old.rows[0].nccl, None);
        assert_eq!(old.rows[0].oxccl.busbw_gbps, None);
        assert!(serde_json::from_str::<Report>("{\"rows\": []}").is_err());
    }
}
