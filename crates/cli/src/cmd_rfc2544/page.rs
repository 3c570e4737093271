//! The self-contained HTML report: tables and inline SVG charts, no script, no outside file.

use std::fmt::Write;

use flowlane_tools::rfc2544::Rfc2544Report;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A bar chart: one bar per (label, value), values in `unit`.
fn bars(title: &str, unit: &str, rows: &[(String, f64)]) -> String {
    let (w, h, left, bottom) = (640.0, 260.0, 70.0, 40.0);
    let top = rows.iter().map(|r| r.1).fold(0.0f64, f64::max).max(1e-12);
    let n = rows.len().max(1) as f64;
    let slot = (w - left - 10.0) / n;
    let mut s = format!(
        "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{w}\" height=\"{h}\" role=\"img\">",
        esc(title)
    );
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"10\" x2=\"{left}\" y2=\"{}\" stroke=\"#444\"/>\
         <text x=\"4\" y=\"16\" font-size=\"11\">{:.3} {}</text>\
         <text x=\"4\" y=\"{}\" font-size=\"11\">0</text>",
        h - bottom,
        top,
        esc(unit),
        h - bottom
    );
    for (i, (label, v)) in rows.iter().enumerate() {
        let bh = (h - bottom - 10.0) * v / top;
        let x = left + i as f64 * slot + slot * 0.15;
        let _ = write!(
            s,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#3a7bd5\">\
             <title>{}: {v:.4} {}</title></rect>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{v:.3}</text>",
            h - bottom - bh,
            slot * 0.7,
            esc(label),
            esc(unit),
            x + slot * 0.35,
            h - bottom + 16.0,
            esc(label),
            x + slot * 0.35,
            (h - bottom - bh - 4.0).max(12.0),
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// Loss (percent) against offered load (percent of maximum): one line per size.
fn loss_chart(r: &Rfc2544Report) -> String {
    let (w, h, left, bottom) = (640.0, 260.0, 50.0, 30.0);
    let top = r
        .sizes
        .iter()
        .flat_map(|s| s.frame_loss.iter().flatten())
        .map(|p| p.loss_pct)
        .fold(0.0f64, f64::max)
        .max(0.001);
    let colors = [
        "#3a7bd5", "#d5573a", "#3ad58c", "#a83ad5", "#d5b93a", "#3ad5d0", "#666",
    ];
    let mut s = format!(
        "<figure><figcaption>Frame loss against offered load (RFC 2544 §26.3)</figcaption>\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\">\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\
         <text x=\"4\" y=\"16\" font-size=\"11\">{top:.2} %</text>\
         <text x=\"{left}\" y=\"{}\" font-size=\"11\">10 %</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\">100 % of max</text>",
        h - bottom,
        w - 10.0,
        h - bottom,
        h - 8.0,
        w - 90.0,
        h - 8.0
    );
    for (k, size) in r.sizes.iter().enumerate() {
        let Some(points) = &size.frame_loss else {
            continue;
        };
        let pts: Vec<String> = points
            .iter()
            .map(|p| {
                let x = left + (w - left - 10.0) * (f64::from(p.pct_of_max) - 10.0) / 90.0;
                let y = (h - bottom) - (h - bottom - 10.0) * p.loss_pct / top;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let c = colors[k % colors.len()];
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{c}\">{:.0} B</text>",
            pts.join(" "),
            w - 60.0,
            20.0 + 14.0 * k as f64,
            size.frame_bytes
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// The page.
pub fn html(r: &Rfc2544Report) -> String {
    let label = |b: f64| format!("{b:.0} B");
    let mut thr = Vec::new();
    let mut gbps = Vec::new();
    let mut pct = Vec::new();
    let mut lat50 = Vec::new();
    let mut lat99 = Vec::new();
    let mut b2b = Vec::new();
    let mut table = String::new();
    for s in &r.sizes {
        if let Some(t) = &s.throughput {
            let honest = if t.ndr.tester_limited {
                t.ndr.delivered_pps
            } else {
                t.ndr.pps
            };
            thr.push((label(s.frame_bytes), honest / 1e6));
            gbps.push((label(s.frame_bytes), t.ndr_line_bps / 1e9));
            pct.push((label(s.frame_bytes), t.ndr_pct_of_max));
        }
        if let Some(l) = &s.latency {
            lat50.push((label(s.frame_bytes), l.mean_p50_ns / 1e3));
            lat99.push((label(s.frame_bytes), l.mean_p99_ns / 1e3));
        }
        if let Some(b) = &s.back_to_back {
            b2b.push((label(s.frame_bytes), b.mean_frames));
        }
        let t = s.throughput.as_ref();
        let _ = write!(
            table,
            "<tr><td>{:.0}</td><td>{:.0} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.frame_bytes,
            s.max.pps,
            esc(&s.max.source),
            t.map_or("-".into(), |t| format!(
                "{}{}",
                if t.ndr.tester_limited {
                    format!("&ge; {:.0} (tester-limited: a lower bound)", t.ndr.delivered_pps)
                } else {
                    format!("{:.0}", t.ndr.pps)
                },
                if t.ndr.confirmed { "" } else { " (not confirmed)" }
            )),
            t.map_or("-".into(), |t| format!("{:.0}", t.pdr.pps)),
            s.latency
                .as_ref()
                .map_or("-".into(), |l| format!("{:.1} / {:.1}", l.mean_p50_ns / 1e3, l.mean_p99_ns / 1e3)),
            s.back_to_back.as_ref().map_or("-".into(), |b| match &b.corrected_buffer_s {
                Some(c) if !b.bursts.is_empty() => {
                    format!("{:.0} frames, corrected buffer {:.1} µs", b.mean_frames, c * 1e6)
                }
                _ => esc(b.note.as_deref().unwrap_or("-")),
            }),
        );
    }
    let mut flood = String::new();
    for s in &r.sizes {
        for p in s.probe_under_flood.iter().flatten() {
            let l = p.probe_latency_ns.as_ref();
            let us = |f: fn(&flowlane_tools::Latency) -> u64| {
                l.map_or("-".into(), |l| format!("{:.1}", f(l) as f64 / 1e3))
            };
            let _ = write!(
                flood,
                "<tr><td>{:.0}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                s.frame_bytes,
                p.flood_rate_pps
                    .map_or("unpaced".into(), |r| format!("{r:.0}")),
                p.flood_offered_pps,
                p.flood_forwarded_pps,
                p.probe_sent,
                p.probe_lost,
                us(|l| l.p50),
                us(|l| l.p99),
                us(|l| l.max),
                p.flood_destinations,
                esc(&p.tester_limited)
            );
        }
    }
    if !flood.is_empty() {
        flood = format!(
            "<h2>Probe under a random-destination flood</h2><table><tr><th>size</th>\
             <th>flood asked pps</th><th>flood sent pps</th><th>flood forwarded pps</th>\
             <th>probe sent</th><th>probe lost</th><th>p50 µs</th><th>p99 µs</th>\
             <th>max µs</th><th>destinations</th><th>tester-limited</th></tr>{flood}</table>"
        );
    }
    let mut trials = String::new();
    for t in &r.trials {
        let _ = write!(
            trials,
            "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td>\
             <td>{}</td><td>{:.4}</td><td>{}</td><td>{}</td></tr>",
            t.test.name(),
            t.kind.name(),
            t.frame_bytes,
            t.rate_pps,
            t.offered_pps,
            t.sent,
            t.received,
            100.0 * t.loss,
            esc(&t.verdict),
            esc(&t.tester_limited.join("; "))
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>flowlane rfc2544</title>\
         <style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}\
         table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;\
         padding:3px 6px;text-align:right}}figure{{display:inline-block;margin:1em}}</style>\
         </head><body><h1>RFC 2544: {} → DUT → {}</h1>\
         <p>Destination {}; generator: {}; receiver: sink over {}; {} trials in {:.0} s{}.</p>\
         <table><tr><th>size B</th><th>max pps</th><th>NDR pps</th><th>PDR pps</th>\
         <th>latency p50 / p99 µs</th><th>back-to-back</th></tr>{table}</table>\
         {}{}{}{}{}{}{}{flood}\
         <h2>Trials</h2><table><tr><th>test</th><th>kind</th><th>size</th><th>rate</th>\
         <th>offered</th><th>sent</th><th>received</th><th>loss %</th><th>verdict</th>\
         <th>tester-limited</th></tr>{trials}</table></body></html>\n",
        esc(&r.tx_dev),
        esc(&r.rx_dev),
        esc(&r.to),
        esc(&r.generator),
        r.receiver.family(),
        r.trials.len(),
        r.duration_s,
        if r.interrupted { " (interrupted)" } else { "" },
        bars("Throughput (NDR) per frame size", "Mpps", &thr),
        bars("Throughput (NDR) on the line", "Gbit/s", &gbps),
        bars("Throughput (NDR) as % of the maximum rate", "%", &pct),
        bars("Latency p50 at the NDR", "µs", &lat50),
        bars("Latency p99 at the NDR", "µs", &lat99),
        loss_chart(r),
        bars(
            "Back-to-back burst (mean longest without loss)",
            "frames",
            &b2b
        ),
    )
}
