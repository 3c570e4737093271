//! The bench report as one self-contained HTML page: tables and inline SVG charts, no scripts,
//! no fetches.

use std::fmt::Write;

use flowlane_tools::bench::{BenchReport, BenchStep};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: [&str; 6] = [
    "#3b6ea8", "#e07b39", "#4f9d5d", "#b9484e", "#8a6bb8", "#7f7f7f",
];

/// A round axis top and step for values up to `max`: 1, 2 or 5 × 10^k per step, 3 to 6 steps
/// (so ticks read 50k, 100k, 150k — not 223.6k, 167.7k).
fn nice(max: f64) -> (f64, f64) {
    let max = max.max(1.0);
    let mag = 10f64.powf((max / 4.0).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|st| max / st <= 6.0)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// How a chart's value axis runs.
#[derive(Clone, Copy, PartialEq)]
enum Scale {
    Linear,
    /// Powers of ten, for latencies whose tail is orders of magnitude above the median.
    Log,
}

/// A grouped bar chart: one group per label, one bar per series.
fn bars(
    title: &str,
    unit: &str,
    labels: &[String],
    series: &[(String, Vec<Option<f64>>)],
    scale: Scale,
) -> String {
    let (w, h, left, bottom, top) = (760.0, 300.0, 70.0, 50.0, 30.0);
    let values = || series.iter().flat_map(|s| s.1.iter().flatten().copied());
    let vmax = values().fold(0.0f64, f64::max).max(1.0);
    // Linear: 0 … a round top. Log: from the power of ten below the smallest value to the one
    // above the largest.
    let (lo, hi, ticks): (f64, f64, Vec<f64>) = match scale {
        Scale::Linear => {
            let (top_v, step) = nice(vmax);
            let n = (top_v / step).round() as usize;
            (0.0, top_v, (0..=n).map(|i| step * i as f64).collect())
        }
        Scale::Log => {
            let vmin = values().filter(|v| *v > 0.0).fold(vmax, f64::min);
            let (a, b) = (
                vmin.log10().floor(),
                vmax.log10().ceil().max(vmin.log10().floor() + 1.0),
            );
            (a, b, (a as i32..=b as i32).map(|e| 10f64.powi(e)).collect())
        }
    };
    let frac = |v: f64| -> f64 {
        match scale {
            Scale::Linear => (v - lo) / (hi - lo).max(1e-9),
            Scale::Log => ((v.max(1e-9).log10() - lo) / (hi - lo).max(1e-9)).clamp(0.0, 1.0),
        }
    };
    let plot_w = w - left - 20.0;
    let plot_h = h - bottom - top;
    let groups = labels.len().max(1) as f64;
    let gw = plot_w / groups;
    let bw = (gw * 0.8) / series.len().max(1) as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<figure><svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>{t}</title>"#,
        t = esc(title)
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for &v in &ticks {
        let y = top + plot_h - plot_h * frac(v);
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            w - 20.0,
            left - 6.0,
            y + 4.0,
            esc(&short(v))
        );
    }
    for (g, label) in labels.iter().enumerate() {
        let gx = left + gw * g as f64 + gw * 0.1;
        for (k, (_, vals)) in series.iter().enumerate() {
            if let Some(Some(v)) = vals.get(g) {
                let bh = plot_h * frac(*v);
                let _ = write!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    gx + bw * k as f64,
                    top + plot_h - bh,
                    (bw - 1.0).max(1.0),
                    bh,
                    COLORS[k % COLORS.len()],
                    esc(label),
                    esc(&short(*v))
                );
            }
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            gx + gw * 0.4,
            top + plot_h + 16.0,
            esc(label)
        );
    }
    for (k, (name, _)) in series.iter().enumerate() {
        let x = left + 130.0 * k as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            h - 16.0,
            COLORS[k % COLORS.len()],
            x + 14.0,
            h - 7.0,
            esc(name)
        );
    }
    let _ = write!(s, "</svg><figcaption>{}</figcaption></figure>", esc(unit));
    s
}

fn short(v: f64) -> String {
    // Whole numbers print without decimals (axis ticks are round).
    let t = |x: f64, unit: &str| {
        if (x - x.round()).abs() < 1e-9 {
            format!("{x:.0}{unit}")
        } else {
            format!("{x:.1}{unit}")
        }
    };
    if v >= 1e6 {
        t(v / 1e6, "M")
    } else if v >= 1e3 {
        t(v / 1e3, "k")
    } else if v >= 1.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// A count, or a dash where it was not measured.
fn opt(v: Option<u64>) -> String {
    v.map_or("–".into(), |x| x.to_string())
}

/// The report page.
///
/// Long: the page written top to bottom (header, each table, each chart) in the order it reads;
/// each part is a few `write!`s with nothing to name apart.
/// The host's conditions (`doctor`'s rules) as a table, WARN and FAIL first.
fn host_table(checks: Option<&flowlane_tools::doctor::DoctorReport>) -> String {
    use flowlane_tools::doctor::Verdict;
    let Some(c) = checks else {
        return "<p>Not read (a report from an older flowlane).</p>".into();
    };
    let rank = |v: Verdict| match v {
        Verdict::Fail => 0,
        Verdict::Warn => 1,
        Verdict::Pass => 2,
        Verdict::Skip => 3,
    };
    let mut f: Vec<_> = c.findings.iter().collect();
    f.sort_by_key(|x| rank(x.verdict));
    let rows: String = f
        .iter()
        .map(|x| {
            let v = format!("{:?}", x.verdict).to_uppercase();
            format!(
                "<tr><td class=\"{}\">{v}</td><td style=\"text-align:left\">{}{}</td>\
                 <td style=\"text-align:left\">{}</td><td style=\"text-align:left\">{}</td>\
                 <td style=\"text-align:left\"><code>{}</code></td></tr>",
                v.to_lowercase(),
                esc(&x.id),
                x.subject
                    .as_deref()
                    .map_or(String::new(), |s| format!(" [{}]", esc(s))),
                esc(&x.seen),
                esc(&x.why),
                esc(x.fix.as_deref().unwrap_or(""))
            )
        })
        .collect();
    format!(
        "<p>{} pass, {} warn, {} fail, {} skip: what on this host could distort the figures \
         above (read before the first step; nothing was changed).</p>\
         <table><tr><th>verdict</th><th>rule</th><th>seen</th><th>why it matters</th>\
         <th>fix</th></tr>{rows}</table>",
        c.counts.pass, c.counts.warn, c.counts.fail, c.counts.skip
    )
}

pub fn html(r: &BenchReport) -> String {
    let steps = &r.steps;
    let labels: Vec<String> = steps
        .iter()
        .map(|s| format!("{} k={}", s.mode, s.buckets))
        .collect();
    let series = |f: &dyn Fn(&BenchStep) -> Option<f64>| steps.iter().map(f).collect::<Vec<_>>();
    let pps_chart = bars(
        "Packets per second by active buckets",
        "Per step: what the client sent, what the server program saw, echoed, and what came back (per second of the step).",
        &labels,
        &[
            ("sent".into(), series(&|s| Some(s.pps.sent as f64))),
            ("server saw".into(), series(&|s| Some(s.pps.server_seen as f64))),
            ("echoed".into(), series(&|s| s.pps.echoed.map(|x| x as f64))),
            ("back".into(), series(&|s| s.pps.back.map(|x| x as f64))),
        ],
        Scale::Linear,
    );
    // Scaling: what the server saw against k, beside k × what it saw with one bucket (same
    // mode): the ideal of a host that scales per core.
    let one = |mode: &str| {
        steps
            .iter()
            .find(|s| s.mode == mode && s.buckets == 1)
            .map(|s| s.pps.server_seen as f64)
    };
    let scale_chart = bars(
        "Scaling: packets per second the server saw, against the ideal",
        "Per step: what the server program saw per second, and k × what it saw with one bucket in the same mode (the ideal of a host that scales per core).",
        &labels,
        &[
            ("server saw".into(), series(&|s| Some(s.pps.server_seen as f64))),
            (
                "ideal: k × 1 bucket".into(),
                series(&|s| one(&s.mode).map(|o| o * s.buckets as f64)),
            ),
        ],
        Scale::Linear,
    );
    let cpus: Vec<u64> = steps
        .iter()
        .flat_map(|s| s.workers.iter().map(|w| w.cpu))
        .fold(Vec::new(), |mut v, c| {
            if !v.contains(&c) {
                v.push(c);
            }
            v
        });
    // One series per worker CPU, of what `f` reads from that worker in each step.
    let per_worker = |f: &dyn Fn(&flowlane_tools::bench::BenchWorker) -> Option<f64>| {
        cpus.iter()
            .map(|&c| {
                (
                    format!("worker cpu{c}"),
                    series(&|s| s.workers.iter().find(|w| w.cpu == c).and_then(f)),
                )
            })
            .collect::<Vec<(String, Vec<Option<f64>>)>>()
    };
    let worker_series = per_worker(&|w| Some(w.rx_packets as f64));
    let dist_chart = bars(
        "Per-bucket distribution: datagrams each worker received",
        "Each worker owns the buckets whose RETA entries point at its CPU; with RSS-faithful steering a step with k buckets feeds k workers.",
        &labels,
        &worker_series,
        Scale::Linear,
    );
    let cost_series = per_worker(&|w| w.cpu_ns_per_packet);
    let cost_chart = bars(
        "CPU time per packet, per core (ns)",
        "Each server worker's own CPU time (its thread's CPU clock) per datagram it received: flat across k when adding cores adds no cost per packet. The kernel's receive path in softirq is not in it.",
        &labels,
        &cost_series,
        Scale::Linear,
    );
    let lat = |q: fn(&flowlane_tools::Latency) -> u64| {
        series(&move |s| s.latency_ns.as_ref().map(|l| q(l) as f64 / 1e3))
    };
    let lat_chart = bars(
        "Round-trip latency (µs, log scale)",
        "From the echoes: p50, p99, p99.9 and max of the round trip per step (echo steps only), on a log scale: the tail is often orders of magnitude above the median.",
        &labels,
        &[
            ("p50".into(), lat(|l| l.p50)),
            ("p99".into(), lat(|l| l.p99)),
            ("p99.9".into(), lat(|l| l.p999)),
            ("max".into(), lat(|l| l.max)),
        ],
        Scale::Log,
    );
    let mut rows = String::new();
    for s in steps {
        let f = &s.five;
        let workers: Vec<String> = s
            .workers
            .iter()
            .map(|w| {
                let cost = w
                    .cpu_ns_per_packet
                    .map_or(String::new(), |n| format!(", {n:.0} ns/pkt"));
                format!("cpu{}: {} / {}{cost}", w.cpu, w.rx_packets, w.expected)
            })
            .collect();
        let busy: Vec<String> = s.cpu_busy_pct.iter().map(|x| format!("{x}%")).collect();
        let kernel: Vec<String> = s
            .kernel_cpus
            .iter()
            .map(|c| {
                format!(
                    "cpu{}: {} / {} / {}",
                    c.cpu, c.processed, c.backlog_drops, c.time_squeeze
                )
            })
            .collect();
        let queues: Vec<String> = s
            .server_queues
            .iter()
            .map(|q| {
                format!(
                    "rxq{}: {} / {}",
                    q.queue,
                    q.xdp_packets,
                    q.drops + q.xdp_drops
                )
            })
            .collect();
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.mode),
            s.buckets,
            opt(f.client_sent),
            opt(f.server_received),
            f.server_seen,
            opt(f.server_echoed),
            opt(f.client_back),
            s.pps.server_seen,
            esc(&workers.join(", ")),
            s.missteered,
            s.socket_drops,
            opt(s.queue_drops),
            esc(&busy.join(" ")),
            esc(&kernel.join(", ")),
            esc(&queues.join(", "))
        );
    }
    let problems: Vec<String> = r
        .problems
        .iter()
        .map(|p| format!("<li>{}</li>", esc(p)))
        .collect();
    let setup = match &r.lab {
        Some(lab) if r.rss_faithful => format!(
            "Lab <b>{}</b>: two network namespaces joined by a veth pair with {} queues; receive steering <b>{}</b> ({} Toeplitz, key {}…, RETA of {} entries).",
            esc(&lab.name),
            lab.queues,
            esc(&lab.steer),
            esc(&lab.hash),
            esc(&lab.key.chars().take(16).collect::<String>()),
            lab.reta_size
        ),
        _ => "<b>Loopback run (127.0.0.1): not RSS-faithful</b> — no NIC queues, no steering; the \
              kernel processes each datagram on the sender's CPU."
            .to_string(),
    };
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>flowlane bench report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th {{ background: #f3f3f3; }}
.problems li {{ color: #a00; }}
td.fail {{ color: #a00; font-weight: bold; }}
td.warn {{ color: #a60; }}
figure {{ margin: 1.5em 0; }}
figcaption {{ font-size: 12px; color: #555; }}
</style></head>
<body>
<h1>flowlane bench</h1>
<p>{setup} {cpus} CPUs, kernel {kernel}, {frame}-byte frames, {per} flows per bucket, {secs} s per step. flowlane {ver}.</p>
<h2>What you are looking at</h2>
<p>Step <i>k</i> sends traffic on RSS buckets 0…k−1 only: flows are chosen so that their Toeplitz hash lands on those buckets. The server runs one pinned worker per CPU. If the host scales per core, packets per second grow with <i>k</i> and each worker receives exactly what its buckets were sent (got / expected). The five numbers follow a packet's path: frames the client's interface <b>sent</b>, the server's interface <b>received</b>, the server program <b>saw</b>, it <b>echoed</b>, and came <b>back</b> to the client; where two neighbours differ, that is where packets went missing.</p>
<h2>Problems</h2>
<ul class="problems">{problems}</ul>
{none}
<h2>The host</h2>
{host}
<h2>Charts</h2>
{pps_chart}
{scale_chart}
{cost_chart}
{dist_chart}
{lat_chart}
<h2>Steps</h2>
<table><tr><th>mode</th><th>buckets</th><th>sent</th><th>received</th><th>seen</th><th>echoed</th><th>back</th><th>seen pps</th><th>per worker (got / expected, worker CPU per packet)</th><th>missteered</th><th>socket drops</th><th>queue drops</th><th>CPU busy</th><th>kernel per CPU (processed / backlog drops / squeezed)</th><th>server queues (XDP packets / drops)</th></tr>
{rows}</table>
</body></html>
"#,
        cpus = r.host.cpus,
        kernel = esc(&r.host.kernel),
        host = host_table(r.host.checks.as_ref()),
        frame = r.frame_bytes,
        per = r.per_bucket,
        secs = r.step_secs,
        ver = esc(&r.flowlane_version),
        problems = problems.join(""),
        none = if problems.is_empty() {
            "<p>None: every number adds up.</p>"
        } else {
            ""
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ticks_are_round() {
        assert_eq!(nice(223_600.0), (250_000.0, 50_000.0));
        assert_eq!(nice(9.0), (10.0, 2.0));
        assert_eq!(nice(1.0), (1.0, 0.2));
        let (top, step) = nice(167_700.0);
        assert_eq!((top, step), (200_000.0, 50_000.0));
        assert_eq!(short(150_000.0), "150k");
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(short(223_600.0), "223.6k");
    }

    #[test]
    fn log_charts_tick_at_powers_of_ten() {
        let c = bars(
            "t",
            "u",
            &["a".into()],
            &[
                ("s".into(), vec![Some(35.0)]),
                ("m".into(), vec![Some(4200.0)]),
            ],
            Scale::Log,
        );
        for tick in [">10<", ">100<", ">1k<", ">10k<"] {
            assert!(c.contains(tick), "{tick} in {c}");
        }
    }
}
