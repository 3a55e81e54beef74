//! `--plot FILE.png`: latency and bus bandwidth against the message size, oxccl and (when
//! measured) NCCL, drawn with plotters into a PNG. The text is drawn with the embedded
//! DejaVu Sans (`assets/`), so no system font is needed. `--plot-from FILE.json` draws a
//! table written earlier by `--json`.

use std::path::Path;
use std::sync::OnceLock;

use oxccl_collectives::hal::{Device, Error, Result};
use oxccl_collectives::Communicator;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::collective;
use crate::json;
use crate::options::Options;
use crate::report::Row;

/// DejaVu Sans 2.37 (Bitstream Vera license: `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Image size in pixels: two panels side by side under the title.
pub const WIDTH: u32 = 1600;
pub const HEIGHT: u32 = 700;

const OXCCL_COLOR: RGBColor = RGBColor(31, 119, 180);
const NCCL_COLOR: RGBColor = RGBColor(230, 100, 10);

/// One implementation at one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// Microseconds per call.
    pub us: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
}

/// One message size.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub bytes: u64,
    pub oxccl: Measure,
    pub nccl: Option<Measure>,
}

/// What one PNG shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    /// The compared library's name for the legend: NCCL, or RCCL on ROCm.
    pub vendor: &'static str,
    pub points: Vec<Point>,
}

fn plot_error(what: impl Into<String>) -> Error {
    Error::Os {
        call: "write (--plot)",
        source: std::io::Error::other(what.into()),
    }
}

/// "allreduce bf16 sum, 4 ranks, NVIDIA H200 (CUDA), graph replay, out of place"; no op
/// for a collective that does not reduce ("allgather bf16, ...").
#[allow(clippy::too_many_arguments)]
fn title(
    collective: &str,
    dtype: &str,
    op: Option<&str>,
    accum: Option<&str>,
    ranks: u64,
    device: &str,
    backend: &str,
    graph: bool,
    in_place: bool,
) -> String {
    let mut t = format!("{collective} {dtype}");
    if let Some(op) = op.filter(|o| !o.is_empty()) {
        t.push_str(&format!(" {op}"));
    }
    if let Some(accum) = accum.filter(|a| !a.is_empty() && *a != "auto") {
        t.push_str(&format!(" (accum {accum})"));
    }
    t.push_str(&format!(
        ", {ranks} rank{}",
        if ranks == 1 { "" } else { "s" }
    ));
    match (
        device.is_empty(),
        backend.is_empty() || backend.eq_ignore_ascii_case(device),
    ) {
        (false, false) => t.push_str(&format!(", {device} ({backend})")),
        (false, true) => t.push_str(&format!(", {device}")),
        (true, false) => t.push_str(&format!(", {backend}")),
        (true, true) => {}
    }
    t.push_str(if graph {
        ", graph replay"
    } else {
        ", stream launches"
    });
    t.push_str(if in_place {
        ", in place"
    } else {
        ", out of place"
    });
    t
}

impl Figure {
    /// The rows of this run.
    pub fn from_rows(opts: &Options, comm: &Communicator, rows: &[Row]) -> Figure {
        let caps = comm.device().capabilities();
        let backend = Device::backend(comm.device()).to_string();
        let c = opts.collective;
        let (op, accum) = (opts.op.to_string(), opts.accum.to_string());
        Figure {
            title: title(
                c.name,
                &opts.dtype.to_string(),
                c.reduces().then_some(op.as_str()),
                c.reduces().then_some(accum.as_str()),
                u64::from(comm.world_size()),
                &caps.name,
                &backend,
                opts.graph,
                opts.in_place,
            ),
            vendor: vendor_label(
                oxccl_collectives::backend::vendor::name(Device::backend(comm.device())),
                rows.iter().any(|r| r.nccl_symmetric.is_some()),
            ),
            points: rows
                .iter()
                .map(|r| Point {
                    bytes: r.bytes as u64,
                    oxccl: Measure {
                        us: r.ours.us,
                        busbw: r.ours.busbw(r.bytes, r.bus_factor),
                    },
                    nccl: r.best_nccl().map(|n| Measure {
                        us: n.us,
                        busbw: n.busbw(r.bytes, r.bus_factor),
                    }),
                })
                .collect(),
        }
    }

    /// A file written by `--json` ([`json::Report`]).
    pub fn from_json(text: &str) -> Result<Figure> {
        let doc: json::Report = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("not an oxccl-perf --json file: {e}")))?;
        let c = collective::by_name(&doc.collective).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "collective '{}' unknown to this oxccl-perf ({})",
                doc.collective,
                collective::names()
            ))
        })?;
        // A bus bandwidth the file lacks is derived from the time with the file's
        // collective's factor (the size column is nccl-tests', as the factor expects).
        let factor = (c.bus_factor)(doc.ranks);
        let measure = |bytes: f64, side: &json::Side| Measure {
            us: side.time_us,
            busbw: side.busbw_gbps.unwrap_or(if side.time_us > 0.0 {
                bytes / side.time_us / 1e3 * factor
            } else {
                0.0
            }),
        };
        let points = doc
            .rows
            .iter()
            .map(|r| Point {
                bytes: r.bytes,
                oxccl: measure(r.bytes as f64, &r.oxccl),
                // The faster of the vendor's modes, as the table's speedup.
                nccl: match (&r.nccl, &r.nccl_symmetric) {
                    (Some(d), Some(s)) if s.time_us > 0.0 && s.time_us < d.time_us => Some(s),
                    (d, s) => d.as_ref().or(s.as_ref()),
                }
                .map(|n| measure(r.bytes as f64, n)),
            })
            .collect();
        let symmetric = doc.rows.iter().any(|r| r.nccl_symmetric.is_some());
        Ok(Figure {
            title: title(
                c.name,
                &doc.dtype,
                doc.op.as_deref(),
                doc.accum.as_deref(),
                u64::from(doc.ranks),
                &doc.device,
                &doc.backend,
                doc.graph,
                doc.in_place,
            ),
            vendor: vendor_label(
                if doc.backend.eq_ignore_ascii_case("rocm") {
                    "RCCL"
                } else {
                    "NCCL"
                },
                symmetric,
            ),
            points,
        })
    }
}

/// The legend's name for the vendor's line: with symmetric windows measured, the line is
/// the faster of the two modes at each size.
fn vendor_label(vendor: &'static str, symmetric: bool) -> &'static str {
    match (vendor, symmetric) {
        ("NCCL", true) => "NCCL (faster of default, symmetric)",
        ("RCCL", true) => "RCCL (faster of default, symmetric)",
        (v, _) => v,
    }
}

/// "1K", "64K", "1M", "1G" (powers of 1024), else the number of bytes.
pub fn size_label(bytes: f64) -> String {
    let b = bytes.round();
    for (unit, name) in [
        (1u64 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ] {
        let u = unit as f64;
        if b >= u && (b / u).fract() == 0.0 {
            return format!("{}{name}", b / u);
        }
    }
    format!("{b}")
}

/// A number for an axis: three significant digits, no trailing zeros, no exponent in the
/// usual ranges.
fn number_label(v: f64) -> String {
    let a = v.abs();
    if a < 1e-12 {
        return "0".into();
    }
    if !(1e-4..1e7).contains(&a) {
        return format!("{v:.1e}");
    }
    let prec = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.prec$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// An x label: the size at integer log2 positions, nothing between them.
fn x_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        size_label(v.round().exp2())
    } else {
        String::new()
    }
}

/// Registers the embedded font with plotters (once per process).
fn font() -> Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok =
        *OK.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(plot_error("the embedded font (DejaVu Sans) does not load"))
    }
}

type Series = Vec<(f64, f64)>;

/// The (log2 size, value) points of each implementation; values that cannot be drawn on
/// the axis (not finite, or not positive on a log axis) are left out.
fn series(fig: &Figure, value: impl Fn(&Measure) -> f64, log: bool) -> (Series, Series) {
    let keep = |v: f64| v.is_finite() && (!log || v > 0.0) && (log || v >= 0.0);
    let mut ours = Vec::new();
    let mut nccl = Vec::new();
    for p in fig.points.iter().filter(|p| p.bytes > 0) {
        let x = (p.bytes as f64).log2();
        let v = value(&p.oxccl);
        if keep(v) {
            ours.push((x, v));
        }
        if let Some(n) = &p.nccl {
            let v = value(n);
            if keep(v) {
                nccl.push((x, v));
            }
        }
    }
    (ours, nccl)
}

/// Writes the two-panel PNG (`path` must end in `.png`).
pub fn write_png(path: &Path, fig: &Figure) -> Result<()> {
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
    {
        return Err(Error::InvalidArgument(format!(
            "--plot {}: the file name must end in .png",
            path.display()
        )));
    }
    font()?;
    draw(path, fig).map_err(|e| plot_error(format!("{}: {e}", path.display())))
}

fn draw(path: &Path, fig: &Figure) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.margin(8, 0, 0, 0);
    let root = root.titled(&fig.title, (FAMILY, 26).into_font().color(&BLACK))?;
    let panels = root.split_evenly((1, 2));
    let (lat_ours, lat_nccl) = series(fig, |m| m.us, true);
    let (bw_ours, bw_nccl) = series(fig, |m| m.busbw, false);
    if lat_ours.is_empty() && lat_nccl.is_empty() {
        return Err("no row with a positive time to plot".into());
    }

    // x: log2(bytes), ticks at powers of two.
    let xs = lat_ours.iter().chain(&lat_nccl).map(|p| p.0);
    let (xmin, xmax) = bounds(xs);
    // At least three powers of two wide, so that the (1, 2, 5 x 10^k) ticks of the
    // linear axis fall on whole powers of two.
    let pad = ((3.0 - (xmax - xmin)) / 2.0).max(0.5);
    let (xlo, xhi) = (xmin - pad, xmax + pad);

    // (a) latency, log y.
    let ys = lat_ours.iter().chain(&lat_nccl).map(|p| p.1);
    let (ymin, ymax) = bounds(ys);
    let (ylo, yhi) = (ymin / 1.6, ymax * 1.6);
    if let Some(area) = panels.first() {
        let mut chart = ChartBuilder::on(area)
            .caption("(a) latency", (FAMILY, 22))
            .margin(14)
            .x_label_area_size(55)
            .y_label_area_size(80)
            .build_cartesian_2d(xlo..xhi, (ylo..yhi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .y_desc("time per call (us, log scale)")
            .x_label_formatter(&|v| x_label(*v))
            .x_labels(12)
            .y_label_formatter(&|v| number_label(*v))
            .label_style((FAMILY, 16))
            .axis_desc_style((FAMILY, 18))
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;
        lines(&mut chart, &lat_ours, &lat_nccl, fig.vendor)?;
    }

    // (b) bus bandwidth, linear y from 0.
    let ys = bw_ours.iter().chain(&bw_nccl).map(|p| p.1);
    let (_, bmax) = bounds(ys);
    let bhi = if bmax > 0.0 { bmax * 1.12 } else { 1.0 };
    if let Some(area) = panels.get(1) {
        let mut chart = ChartBuilder::on(area)
            .caption("(b) bus bandwidth", (FAMILY, 22))
            .margin(14)
            .x_label_area_size(55)
            .y_label_area_size(80)
            .build_cartesian_2d(xlo..xhi, 0f64..bhi)?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .y_desc("busbw (GB/s)")
            .x_label_formatter(&|v| x_label(*v))
            .x_labels(12)
            .y_label_formatter(&|v| number_label(*v))
            .y_labels(8)
            .label_style((FAMILY, 16))
            .axis_desc_style((FAMILY, 18))
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;
        lines(&mut chart, &bw_ours, &bw_nccl, fig.vendor)?;
    }
    root.present()?;
    Ok(())
}

fn bounds(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    if lo.is_finite() && hi.is_finite() {
        (lo, hi)
    } else {
        (1.0, 1.0)
    }
}

/// One line with its points per implementation, and the legend.
fn lines<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    ours: &Series,
    nccl: &Series,
    vendor: &'static str,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (name, color, pts) in [("oxccl", OXCCL_COLOR, ours), (vendor, NCCL_COLOR, nccl)] {
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(3)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 18))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes an 8-bit RGB(A) PNG: (width, height, RGB pixels).
    fn decode(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        let ch = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("unexpected color type {other:?}"),
        };
        let px = buf[..info.buffer_size()]
            .chunks_exact(ch)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        (info.width, info.height, px)
    }

    /// Pixels of `color` in the left and right halves.
    fn count(w: u32, px: &[[u8; 3]], color: RGBColor) -> (usize, usize) {
        let want = [color.0, color.1, color.2];
        let mut n = (0, 0);
        for (i, p) in px.iter().enumerate() {
            if *p == want {
                if (i as u32 % w) < w / 2 {
                    n.0 += 1;
                } else {
                    n.1 += 1;
                }
            }
        }
        n
    }

    fn synthetic(nccl: bool) -> Figure {
        Figure {
            title: title(
                "allreduce",
                "bf16",
                Some("sum"),
                Some("auto"),
                2,
                "host",
                "host",
                false,
                false,
            ),
            vendor: "NCCL",
            points: (10..=20)
                .step_by(2)
                .map(|e| {
                    let bytes = 1u64 << e;
                    let m = |lat: f64| Measure {
                        us: lat + bytes as f64 / 2e4,
                        busbw: bytes as f64 / (lat + bytes as f64 / 2e4) / 1e3,
                    };
                    Point {
                        bytes,
                        oxccl: m(5.0),
                        nccl: nccl.then(|| m(9.0)),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn writes_a_two_panel_png() {
        let dir = std::env::temp_dir();
        for nccl in [false, true] {
            let path = dir.join(format!("oxccl-plot-unit-{}-{nccl}.png", std::process::id()));
            write_png(&path, &synthetic(nccl)).unwrap();
            let (w, h, px) = decode(&path);
            assert_eq!((w, h), (WIDTH, HEIGHT));
            // Lines and points of each implementation in both panels.
            let (l, r) = count(w, &px, OXCCL_COLOR);
            assert!(l > 200 && r > 200, "oxccl pixels {l} {r}");
            let (l, r) = count(w, &px, NCCL_COLOR);
            if nccl {
                assert!(l > 200 && r > 200, "NCCL pixels {l} {r}");
            } else {
                assert_eq!((l, r), (0, 0));
            }
            // Text (black, anti-aliased) somewhere: title, labels.
            assert!(
                px.iter()
                    .filter(|p| p[0] < 60 && p[1] < 60 && p[2] < 60)
                    .count()
                    > 1000
            );
            let _ = std::fs::remove_file(path);
        }
        assert!(write_png(&dir.join("x.svg"), &synthetic(true)).is_err());
        let empty = Figure {
            title: String::new(),
            vendor: "NCCL",
            points: Vec::new(),
        };
        assert!(write_png(&dir.join("oxccl-plot-empty.png"), &empty).is_err());
    }

    #[test]
    fn reads_the_json_format() {
        let text = "{\"tool\": \"oxccl-perf\", \"ranks\": 4, \"device\": \"NVIDIA H200\", \
                    \"backend\": \"CUDA\", \"dtype\": \"bf16\", \"op\": \"sum\", \"accum\": \"auto\", \
                    \"in_place\": false, \"graph\": true, \"rows\": [\n\
                    {\"bytes\": 1024, \"count\": 512, \"algorithm\": \"oneshot_ll\", \"oxccl\": \
                    {\"time_us\": 5.909, \"algbw_gbps\": 0.173, \"busbw_gbps\": 0.260, \"wrong\": 0, \
                    \"checked\": 2048, \"max_rel_err\": 8.5e-3}, \"nccl\": null},\n\
                    {\"bytes\": 2048, \"count\": 1024, \"algorithm\": \"oneshot_ll\", \"oxccl\": \
                    {\"time_us\": 7.0}, \"nccl\": {\"time_us\": 9.0, \"busbw_gbps\": 0.3}}]}";
        let fig = Figure::from_json(text).unwrap();
        assert_eq!(
            fig.title,
            "allreduce bf16 sum, 4 ranks, NVIDIA H200 (CUDA), graph replay, out of place"
        );
        assert_eq!(fig.points.len(), 2);
        assert_eq!(fig.points[0].oxccl.busbw, 0.260);
        assert_eq!(fig.points[0].nccl, None);
        // busbw computed when absent: 2048 B / 7 us, x 2(n-1)/n.
        let bw = fig.points[1].oxccl.busbw;
        assert!((bw - 2048.0 / 7.0 / 1e3 * 1.5).abs() < 1e-9, "{bw}");
        assert_eq!(fig.points[1].nccl.map(|m| m.us), Some(9.0));
        // A collective this build does not know: its busbw factor is unknown.
        let other = text.replacen("{", "{\"collective\": \"scatter\", ", 1);
        let e = Figure::from_json(&other).unwrap_err().to_string();
        assert!(e.contains("'scatter' unknown"), "{e}");
        assert!(Figure::from_json("{\"rows\": [{\"bytes\": 1}]}").is_err());
        assert!(Figure::from_json("{}").is_err());
    }

    #[test]
    fn reads_an_allgather_file() {
        let text = "{\"tool\": \"oxccl-perf\", \"collective\": \"allgather\", \"ranks\": 4, \
                    \"device\": \"NVIDIA H200\", \"backend\": \"CUDA\", \"dtype\": \"bf16\", \
                    \"in_place\": true, \"graph\": false, \"rows\": [\n\
                    {\"bytes\": 4000, \"count\": 500, \"oxccl\": {\"time_us\": 8.0}, \
                    \"nccl\": {\"time_us\": 10.0, \"busbw_gbps\": 0.2}}]}";
        let fig = Figure::from_json(text).unwrap();
        assert_eq!(
            fig.title,
            "allgather bf16, 4 ranks, NVIDIA H200 (CUDA), stream launches, in place"
        );
        // busbw derived with allgather's factor (n-1)/n of the size column, not allreduce's.
        let bw = fig.points[0].oxccl.busbw;
        assert!((bw - 4000.0 / 8.0 / 1e3 * 0.75).abs() < 1e-12, "{bw}");
        assert_eq!(fig.points[0].nccl.map(|m| m.busbw), Some(0.2));
    }

    #[test]
    fn the_vendor_line_is_the_faster_mode_at_each_size() {
        let text = "{\"tool\": \"oxccl-perf\", \"ranks\": 2, \"device\": \"NVIDIA H200\", \
                    \"backend\": \"CUDA\", \"dtype\": \"bf16\", \"in_place\": false, \
                    \"graph\": true, \"rows\": [\n\
                    {\"bytes\": 1024, \"oxccl\": {\"time_us\": 2.0}, \"nccl\": {\"time_us\": 6.0}, \
                    \"nccl_symmetric\": {\"time_us\": 4.0}},\n\
                    {\"bytes\": 2048, \"oxccl\": {\"time_us\": 3.0}, \"nccl\": {\"time_us\": 7.0}, \
                    \"nccl_symmetric\": {\"time_us\": 8.0}},\n\
                    {\"bytes\": 4096, \"oxccl\": {\"time_us\": 3.0}, \"nccl\": {\"time_us\": 7.5}}]}";
        let fig = Figure::from_json(text).unwrap();
        let us: Vec<_> = fig.points.iter().map(|p| p.nccl.map(|m| m.us)).collect();
        assert_eq!(us, [Some(4.0), Some(7.0), Some(7.5)]);
        assert_eq!(fig.vendor, "NCCL (faster of default, symmetric)");
        let plain = Figure::from_json(&text.replace("nccl_symmetric", "other")).unwrap();
        assert_eq!(plain.vendor, "NCCL");
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(1024.0), "1K");
        assert_eq!(size_label(65536.0), "64K");
        assert_eq!(size_label(1048576.0), "1M");
        assert_eq!(size_label((1u64 << 30) as f64), "1G");
        assert_eq!(size_label(1000.0), "1000");
        assert_eq!(number_label(20.0), "20");
        assert_eq!(number_label(2.5), "2.5");
        assert_eq!(number_label(0.5), "0.5");
        assert_eq!(number_label(0.015000000000000001), "0.015");
        assert_eq!(number_label(0.005), "0.005");
        assert_eq!(number_label(250.0), "250");
        assert_eq!(number_label(10000.0), "10000");
        assert_eq!(number_label(0.0), "0");
        assert_eq!(
            title(
                "allreduce",
                "f32",
                Some("max"),
                Some("f32"),
                1,
                "host",
                "host",
                false,
                true
            ),
            "allreduce f32 max (accum f32), 1 rank, host, stream launches, in place"
        );
        assert_eq!(x_label(20.0), "1M");
        assert_eq!(x_label(20.5), "");
    }
}
