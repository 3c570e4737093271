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

/// A grouped bar chart: one group per label, one bar per series.
fn bars(
    title: &str,
    unit: &str,
    labels: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let (w, h, left, bottom, top) = (760.0, 300.0, 70.0, 50.0, 30.0);
    let max = series
        .iter()
        .flat_map(|s| s.1.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v))
        .max(1.0);
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
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = top + plot_h - plot_h * i as f64 / 4.0;
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
                let bh = plot_h * v / max;
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
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A count, or a dash where it was not measured.
fn opt(v: Option<u64>) -> String {
    v.map_or("–".into(), |x| x.to_string())
}

/// The report page.
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
    let worker_series: Vec<(String, Vec<Option<f64>>)> = cpus
        .iter()
        .map(|&c| {
            (
                format!("worker cpu{c}"),
                series(&|s| {
                    s.workers
                        .iter()
                        .find(|w| w.cpu == c)
                        .map(|w| w.rx_packets as f64)
                }),
            )
        })
        .collect();
    let dist_chart = bars(
        "Per-bucket distribution: datagrams each worker received",
        "Each worker owns the buckets whose RETA entries point at its CPU; with RSS-faithful steering a step with k buckets feeds k workers.",
        &labels,
        &worker_series,
    );
    let lat = |q: fn(&flowlane_tools::Latency) -> u64| {
        series(&move |s| s.latency_ns.as_ref().map(|l| q(l) as f64 / 1e3))
    };
    let lat_chart = bars(
        "Round-trip latency (µs)",
        "From the echoes: p50, p99, p99.9 and max of the round trip per step (echo steps only).",
        &labels,
        &[
            ("p50".into(), lat(|l| l.p50)),
            ("p99".into(), lat(|l| l.p99)),
            ("p99.9".into(), lat(|l| l.p999)),
            ("max".into(), lat(|l| l.max)),
        ],
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
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
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
            esc(&busy.join(" "))
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
figure {{ margin: 1.5em 0; }}
figcaption {{ font-size: 12px; color: #555; }}
</style></head>
<body>
<h1>flowlane bench</h1>
<p>{setup} {cpus} CPUs, kernel {kernel}, {frame}-byte frames, {per} flows per bucket, {secs} s per step. flowlane {ver}.</p>
<h2>What you are looking at</h2>
<p>Step <i>k</i> sends traffic on RSS buckets 0…k−1 only: flows are chosen so that their Toeplitz hash lands on those buckets. The server runs one pinned worker per CPU. If the host scales per core, packets per second grow with <i>k</i> and each worker receives exactly what its buckets were sent (got / expected). The five numbers are the FreeBSD RSS experiment's accounting: frames the client's interface <b>sent</b>, the server's interface <b>received</b>, the server program <b>saw</b>, it <b>echoed</b>, and came <b>back</b> to the client; where two neighbours differ, that is where packets went missing.</p>
<h2>Problems</h2>
<ul class="problems">{problems}</ul>
{none}
<h2>Charts</h2>
{pps_chart}
{dist_chart}
{lat_chart}
<h2>Steps</h2>
<table><tr><th>mode</th><th>buckets</th><th>sent</th><th>received</th><th>seen</th><th>echoed</th><th>back</th><th>seen pps</th><th>per worker (got / expected, worker CPU per packet)</th><th>missteered</th><th>socket drops</th><th>queue drops</th><th>CPU busy</th></tr>
{rows}</table>
</body></html>
"#,
        cpus = r.host.cpus,
        kernel = esc(&r.host.kernel),
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
