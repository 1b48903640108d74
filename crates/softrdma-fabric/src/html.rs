//! The HTML report (`softrdma fabric --report out.html`): a table of
//! every scenario and SVG plots (drawn with plotters) a cluster architect
//! reads — step time against loss per link layer, busbw against size,
//! latency against cluster size per algorithm, and per scenario the
//! completion-time distribution and the switch queues over time. One
//! self-contained file: the SVGs are inline, nothing is fetched.

use std::collections::BTreeMap;
use std::fmt::Write;

use plotters::prelude::*;

use crate::report::Report;

/// A series: its label and (x, y) points.
type Series = (String, Vec<(f64, f64)>);

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// How an axis maps values: as they are, or log10 (labels show the value).
#[derive(Clone, Copy, PartialEq)]
enum Axis {
    Linear,
    Log,
}

fn fwd(a: Axis, v: f64) -> f64 {
    match a {
        Axis::Linear => v,
        Axis::Log => v.max(1e-300).log10(),
    }
}

fn label(a: Axis, v: f64) -> String {
    let v = match a {
        Axis::Linear => v,
        Axis::Log => 10f64.powf(v),
    };
    let m = v.abs();
    if v != 0.0 && !(1e-2..1e5).contains(&m) {
        format!("{v:.0e}")
    } else if v.fract().abs() < 1e-9 || m >= 100.0 {
        format!("{v:.0}")
    } else if m >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// One line plot as an SVG string.
fn plot(title: &str, xd: &str, yd: &str, xa: Axis, series: &[Series]) -> String {
    let pts = || series.iter().flat_map(|(_, p)| p.iter());
    let xs: Vec<f64> = pts().map(|p| fwd(xa, p.0)).collect();
    let ys: Vec<f64> = pts().map(|p| p.1).collect();
    if xs.is_empty() {
        return String::new();
    }
    let (mut x0, mut x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let y1 = ys.iter().copied().fold(0.0, f64::max) * 1.08;
    if x1 - x0 < 1e-12 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let pad = (x1 - x0) * 0.03;
    let (x0, x1, y1) = (x0 - pad, x1 + pad, if y1 > 0.0 { y1 } else { 1.0 });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 380)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 17))
                .margin(12)
                .x_label_area_size(42)
                .y_label_area_size(70)
                .build_cartesian_2d(x0..x1, 0.0..y1)?;
            chart
                .configure_mesh()
                .x_desc(xd)
                .y_desc(yd)
                .x_label_formatter(&|v| label(xa, *v))
                .y_label_formatter(&|v| label(Axis::Linear, *v))
                .draw()?;
            for (i, (name, p)) in series.iter().enumerate() {
                let c = COLOURS[i % COLOURS.len()];
                let p: Vec<(f64, f64)> = p.iter().map(|&(x, y)| (fwd(xa, x), y)).collect();
                chart
                    .draw_series(LineSeries::new(p.clone(), c.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                    });
                if p.len() <= 40 {
                    chart.draw_series(p.iter().map(|&q| Circle::new(q, 3, c.filled())))?;
                }
            }
            if series.len() > 1 || !series[0].0.is_empty() {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()?;
            }
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            return format!("<p>plot {}: {}</p>", esc(title), esc(&e.to_string()));
        }
    }
    svg
}

/// The label of a scenario's link layer and transport.
fn fabric_label(r: &Report) -> String {
    let p = &r.params;
    let mut s = format!("{} {}", p.link_layer, p.recovery.replace('_', "-"));
    if p.dcqcn {
        s.push_str(" DCQCN");
    }
    s
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Groups `(series label, x, y)` into sorted series, keeping those with
/// two distinct x or more; `None` if none has.
fn group(points: impl Iterator<Item = (String, f64, f64)>) -> Option<Vec<Series>> {
    let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (k, x, y) in points {
        m.entry(k).or_default().push((x, y));
    }
    let out: Vec<Series> = m
        .into_iter()
        .filter_map(|(k, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v.windows(2).any(|w| w[0].0 != w[1].0).then_some((k, v))
        })
        .collect();
    (!out.is_empty()).then_some(out)
}

/// The whole report for `reports`.
pub fn html(reports: &[Report]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>softrdma fabric report</title><style>\
         body{{font-family:sans-serif;margin:2em;color:#222}}\
         table{{border-collapse:collapse;font-size:13px;margin:1em 0;display:block;max-width:100%;overflow-x:auto}}\
         td,th{{border:1px solid #bbb;padding:3px 6px;text-align:right}}\
         th{{background:#eee}} td.l{{text-align:left}} .bad{{color:#b00;font-weight:bold}}\
         h2{{margin-top:2em}} figure{{display:inline-block;margin:0.5em}}\
         </style></head><body>\n<h1>softrdma fabric report</h1>\n\
         <p>{} scenario(s). Every figure comes from a packet-level run whose hosts run softrdma's \
         own RDMA transport engine; the model and its validation are in docs/fabric.md.</p>\n",
        reports.len()
    );
    h.push_str(
        "<h2>Scenarios</h2>\n<table><tr><th>scenario</th><th>hosts</th><th>link layer, transport</th>\
         <th>loss / link</th><th>workload</th><th>makespan µs</th><th>mean step µs</th>\
         <th>algbw Gb/s</th><th>busbw Gb/s</th><th>goodput / host Gb/s</th><th>FCT p50 / p99 / max µs</th>\
         <th>retransmits</th><th>timeouts</th><th>drops tail / headroom / corruption</th>\
         <th>pause µs (worst link)</th><th>deepest queue KB</th><th>GPU idle</th><th>$ / week</th>\
         <th>sim events/s, wall s, RSS MB</th></tr>\n",
    );
    for r in reports {
        let t = &r.totals;
        let opt = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
        let goodput = if r.makespan_us > 0.0 {
            r.delivered_bytes as f64 * 8.0 / (r.makespan_us * 1e3) / f64::from(r.hosts.max(1))
        } else {
            0.0
        };
        let wl = match &r.params.algorithm {
            Some(a) => format!("{} {} of {} B", r.params.workload, a, r.bytes),
            None => format!("{} of {} B", r.params.workload, r.bytes),
        };
        let (idle, usd) = match &r.cost {
            Some(c) => (
                format!("{:.1} %", c.idle_fraction * 100.0),
                format!("{:.0}", c.idle_usd_per_week),
            ),
            None => ("–".into(), "–".into()),
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}{}</td><td>{}</td><td class=\"l\">{}</td><td>{} ({})</td><td class=\"l\">{}</td>\
             <td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.1} / {:.1} / {:.1}</td>\
             <td>{}</td><td>{}</td><td>{} / {} / {}</td><td>{:.1} ({:.1})</td><td>{:.0}</td><td>{}</td><td>{}</td>\
             <td>{:.2} M, {:.2}, {:.0}</td></tr>",
            esc(&r.name),
            if r.completed {
                String::new()
            } else {
                format!(" <span class=\"bad\">{} messages NOT COMPLETED</span>", r.messages_left)
            },
            r.hosts,
            esc(&fabric_label(r)),
            r.params.loss_rate,
            esc(&r.params.loss_links),
            esc(&wl),
            r.makespan_us,
            mean(&r.step_us),
            opt(r.algbw_gbps),
            opt(r.busbw_gbps),
            goodput,
            r.fct.p50_us,
            r.fct.p99_us,
            r.fct.max_us,
            t.retransmits,
            t.timeouts,
            t.drops_tail,
            t.drops_headroom,
            t.drops_corruption,
            r.pause_us_total,
            r.pause_us_max_link,
            r.max_queue_bytes as f64 / 1024.0,
            idle,
            usd,
            r.events_per_s / 1e6,
            r.wall_s,
            r.peak_rss_mb
        );
    }
    h.push_str("</table>\n");
    let collective = || {
        reports.iter().filter(|r| {
            r.completed && matches!(r.params.workload.as_str(), "training" | "all_reduce")
        })
    };
    let mut figs = Vec::new();
    // Step time against loss, one line per link layer and transport.
    let nonzero = collective()
        .map(|r| r.params.loss_rate)
        .filter(|&q| q > 0.0)
        .fold(f64::MAX, f64::min);
    if nonzero < f64::MAX {
        let floor = nonzero / 10.0;
        if let Some(s) = group(collective().map(|r| {
            let q = if r.params.loss_rate > 0.0 {
                r.params.loss_rate
            } else {
                floor
            };
            (
                format!(
                    "{} {}",
                    fabric_label(r),
                    r.params.algorithm.clone().unwrap_or_default()
                ),
                q * 100.0,
                mean(&r.step_us),
            )
        })) {
            figs.push(plot(
                "Step time against loss per link (0 % at the left edge)",
                "loss per link (%)",
                "mean step time (µs)",
                Axis::Log,
                &s,
            ));
        }
        if let Some(s) = group(collective().filter_map(|r| {
            let c = r.cost.as_ref()?;
            let q = if r.params.loss_rate > 0.0 {
                r.params.loss_rate
            } else {
                floor
            };
            Some((
                format!(
                    "{} {}",
                    fabric_label(r),
                    r.params.algorithm.clone().unwrap_or_default()
                ),
                q * 100.0,
                c.idle_usd_per_week / 1e3,
            ))
        })) {
            figs.push(plot(
                "Idle GPUs' cost against loss per link",
                "loss per link (%)",
                "k$ per week",
                Axis::Log,
                &s,
            ));
        }
    }
    // busbw against size, one line per algorithm.
    if let Some(s) = group(collective().filter_map(|r| {
        Some((
            format!("{} {}", r.params.algorithm.clone()?, fabric_label(r)),
            r.bytes as f64,
            r.busbw_gbps?,
        ))
    })) {
        figs.push(plot(
            "busbw against size",
            "bytes per host",
            "busbw (Gb/s)",
            Axis::Log,
            &s,
        ));
    }
    // Latency against cluster size, one line per algorithm.
    if let Some(s) = group(collective().filter_map(|r| {
        Some((
            format!("{} {} B", r.params.algorithm.clone()?, r.bytes),
            f64::from(r.hosts),
            mean(&r.step_us),
        ))
    })) {
        figs.push(plot(
            "All-reduce time against cluster size",
            "hosts",
            "time (µs)",
            Axis::Log,
            &s,
        ));
    }
    if !figs.is_empty() {
        h.push_str("<h2>Across scenarios</h2>\n");
        for f in figs {
            let _ = writeln!(h, "<figure>{f}</figure>");
        }
    }
    for r in reports {
        let _ = writeln!(h, "<h2>{}</h2>", esc(&r.name));
        let mut figs = Vec::new();
        if r.fct_cdf.len() > 1 {
            figs.push(plot(
                "Message completion times",
                "completion time (µs)",
                "share of messages done",
                Axis::Linear,
                &[(String::new(), r.fct_cdf.clone())],
            ));
        }
        if r.goodput.len() > 1 {
            figs.push(plot(
                "Goodput reaching the hosts over time",
                "simulated time (µs)",
                "Gb/s per host",
                Axis::Linear,
                &[(String::new(), r.goodput.clone())],
            ));
        }
        if r.queue_samples.len() > 1 {
            let buf = r
                .queue_samples
                .iter()
                .map(|s| (s.0, s.1 as f64 / 1024.0))
                .collect();
            let deep = r
                .queue_samples
                .iter()
                .map(|s| (s.0, s.2 as f64 / 1024.0))
                .collect();
            figs.push(plot(
                "Switch queues over time",
                "simulated time (µs)",
                "KB",
                Axis::Linear,
                &[
                    ("all switch buffers".into(), buf),
                    ("deepest egress queue".into(), deep),
                ],
            ));
        } else {
            h.push_str(
                "<p>(Run with <code>--sample-us N</code> for queue occupancy over time.)</p>\n",
            );
        }
        if r.step_us.len() > 1 {
            let steps = r
                .step_us
                .iter()
                .enumerate()
                .map(|(i, &s)| (i as f64 + 1.0, s))
                .collect();
            figs.push(plot(
                "Time of each step",
                "step",
                "µs",
                Axis::Linear,
                &[(String::new(), steps)],
            ));
        }
        for f in figs {
            let _ = writeln!(h, "<figure>{f}</figure>");
        }
        if let Some(c) = &r.cost {
            h.push_str("<p>Cost assumptions:</p><ul>");
            for a in &c.assumptions {
                let _ = write!(h, "<li>{}</li>", esc(a));
            }
            h.push_str("</ul>\n");
        }
        h.push_str(
            "<table><tr><th>busiest links</th><th>from</th><th>to</th><th>packets</th><th>MB</th>\
             <th>deepest queue KB</th><th>pause µs</th><th>longest pause µs</th><th>drops</th></tr>\n",
        );
        for l in &r.links {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.1}</td>\
                 <td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td></tr>",
                l.id,
                esc(&l.from),
                esc(&l.to),
                l.tx_packets,
                l.tx_bytes as f64 / 1e6,
                l.max_queue_bytes as f64 / 1024.0,
                l.pause_us,
                l.max_pause_us,
                l.drops_tail + l.drops_headroom + l.drops_corruption
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</body></html>\n");
    h
}
