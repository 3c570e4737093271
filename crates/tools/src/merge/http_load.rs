//! `http load` reports merged: counts summed, pools joined by name with their latency from
//! the shards' histograms, rates over the steady phases' common window.

use serde_json::{Map, Value};

use super::fields::{add_histogram, add_into, histograms_of, int, num, sum_objects};
use crate::http::LatencyUs;
use crate::report::encode_histogram;
use crate::shard::ShardReport;
use crate::ToolError;

type Parts<'a> = [(&'a str, &'a Map<String, Value>)];

/// The fields of `out` only http load has (the rest by the rules).
pub(super) fn merge(
    out: &mut Map<String, Value>,
    parts: &Parts<'_>,
    starts: &[Option<ShardReport>],
) -> Result<(), ToolError> {
    // The steady phases' common window: the earliest shard's start to the latest one's
    // end (the ramps are the same flags in every shard); without starts, the longest.
    let offsets: Vec<f64> = match starts
        .iter()
        .map(|s| s.as_ref().map(|s| s.started_unix_ns))
        .collect::<Option<Vec<u64>>>()
    {
        Some(st) => {
            let begin = st.iter().copied().min().unwrap_or(0);
            st.iter().map(|&s| (s - begin) as f64 / 1e9).collect()
        }
        None => vec![0.0; parts.len()],
    };
    let window = |field: &str| -> f64 {
        parts
            .iter()
            .zip(&offsets)
            .map(|((_, m), o)| o + num(m.get(field)))
            .fold(0.0, f64::max)
    };
    let (steady, whole) = (window("steady_s"), window("duration_s"));
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    out.insert("duration_s".into(), Value::from(round3(whole)));
    out.insert("steady_s".into(), Value::from(round3(steady)));
    // A rate over the window: each shard's rate times its own steady time, summed.
    let rate = |ps: &Parts<'_>, f: &str| -> f64 {
        let n: f64 = ps
            .iter()
            .map(|(_, m)| num(m.get(f)) * num(m.get("steady_s")))
            .sum();
        if steady > 0.0 {
            n / steady
        } else {
            0.0
        }
    };
    out.insert(
        "requests_per_s".into(),
        Value::from(rate(parts, "requests_per_s")),
    );
    out.insert(
        "body_bytes_per_s".into(),
        Value::from(rate(parts, "body_bytes_per_s")),
    );
    let total = sum_objects(parts, "total");
    let (responses, cpu_ns) = (int(total.get("responses")), int(total.get("cpu_ns")));
    out.insert("total".into(), total);
    out.insert(
        "passed".into(),
        Value::from(
            parts
                .iter()
                .all(|(_, m)| m.get("passed") == Some(&Value::Bool(true))),
        ),
    );
    let per = |x: f64| (x > 0.0).then(|| (responses as f64 / x * 10.0).round() / 10.0);
    out.insert(
        "responses_per_cpu_s".into(),
        per(num(out.get("cpu_s"))).unwrap_or(0.0).into(),
    );
    out.insert(
        "responses_per_busy_cpu_s".into(),
        out.get("cpus_busy_s")
            .and_then(Value::as_f64)
            .and_then(per)
            .map_or(Value::Null, Value::from),
    );
    out.insert(
        "worker_cpu_ns_per_response".into(),
        crate::ns_per(cpu_ns, responses).map_or(Value::Null, Value::from),
    );
    let mut memory = sum_objects(parts, "memory");
    if let Some(m) = memory.as_object_mut() {
        let grew = int(m.get("rss_connected_kib")).saturating_sub(int(m.get("rss_start_kib")));
        let per = (grew * 1024)
            .checked_div(int(m.get("connections_then")))
            .unwrap_or(0);
        m.insert("per_connection_bytes".into(), Value::from(per));
        let late = parts
            .iter()
            .map(|(_, p)| num(p.get("memory").and_then(|x| x.get("setup_late_s"))))
            .fold(0.0, f64::max);
        m.insert("setup_late_s".into(), Value::from(late));
    }
    out.insert("memory".into(), memory);
    out.insert("pools".into(), pools(parts, steady)?);
    Ok(())
}

/// A pool's latency by status class from every shard's histograms of that class, classes in
/// order; a shard with a class's percentiles but not its histogram is refused.
fn by_class(refs: &Parts<'_>) -> Result<(Value, Vec<(String, String)>), ToolError> {
    let pairs = |m: &Map<String, Value>, f: &str| -> Vec<(String, Value)> {
        m.get(f)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p.get(0)?.as_str()?.to_string(), p.get(1)?.clone())))
            .collect()
    };
    let mut classes: Vec<String> = refs
        .iter()
        .flat_map(|(_, m)| pairs(m, "by_class").into_iter().map(|c| c.0))
        .collect();
    classes.sort();
    classes.dedup();
    let (mut out, mut hists) = (Vec::new(), Vec::new());
    for class in classes {
        let mut all = None;
        for (src, m) in refs {
            let has = pairs(m, "by_class").iter().any(|c| c.0 == class);
            match pairs(m, "by_class_histograms")
                .into_iter()
                .find(|c| c.0 == class)
            {
                Some((_, Value::String(text))) => {
                    let h = crate::report::decode_histogram(&text).map_err(|e| {
                        ToolError::usage(format!("{src}: {class} latency histogram: {e}"))
                    })?;
                    add_histogram(&mut all, Some(&h));
                }
                _ if has => {
                    return Err(ToolError::usage(format!(
                        "{src} has {class} latency percentiles but not their histogram: they \
                         cannot be merged exactly; rerun with this flowlane"
                    )))
                }
                _ => {}
            }
        }
        if let Some(h) = all {
            let l = serde_json::to_value(LatencyUs::of(&h)).unwrap_or_default();
            out.push(Value::Array(vec![Value::from(class.clone()), l]));
            if let Some(t) = encode_histogram(&h) {
                hists.push((class, t));
            }
        }
    }
    Ok((Value::Array(out), hists))
}

/// Pools joined by name: counts summed, latency from the histograms (by class too), rates
/// over the window.
fn pools(parts: &Parts<'_>, steady: f64) -> Result<Value, ToolError> {
    let mut names: Vec<String> = Vec::new();
    for (_, m) in parts {
        for p in m
            .get("pools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let n = p
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let mut out = Vec::new();
    for name in names {
        let rows: Vec<(String, Map<String, Value>)> = parts
            .iter()
            .flat_map(|(src, m)| {
                let steady = m.get("steady_s").cloned().unwrap_or(Value::Null);
                m.get("pools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|p| p.get("name").and_then(Value::as_str) == Some(name.as_str()))
                    .filter_map(Value::as_object)
                    .map(move |p| {
                        let mut p = p.clone();
                        p.insert("steady_s".into(), steady.clone());
                        (src.to_string(), p)
                    })
            })
            .collect();
        let refs: Vec<(&str, &Map<String, Value>)> =
            rows.iter().map(|(s, m)| (s.as_str(), m)).collect();
        let Some((_, first)) = refs.first() else {
            continue;
        };
        let mut p = Map::new();
        p.insert("name".into(), Value::from(name.clone()));
        if let Some((src, _)) = refs
            .iter()
            .find(|(_, m)| m.get("mode") != first.get("mode"))
        {
            return Err(ToolError::usage(format!(
                "pool {name:?} runs another mode in {src}: not shards of one run"
            )));
        }
        p.insert(
            "mode".into(),
            first.get("mode").cloned().unwrap_or(Value::Null),
        );
        let mut counts = Map::new();
        for (_, r) in &refs {
            let mut c = Map::new();
            for k in ["connections", "answers"] {
                c.insert(k.into(), r.get(k).cloned().unwrap_or(Value::from(0)));
            }
            if counts.is_empty() {
                counts = c;
            } else {
                add_into(&mut counts, &c);
            }
        }
        p.extend(counts);
        p.insert(
            "placement".into(),
            first.get("placement").cloned().unwrap_or(Value::Null),
        );
        let rates: Vec<f64> = refs
            .iter()
            .filter_map(|(_, m)| m.get("rate").and_then(Value::as_f64))
            .collect();
        p.insert(
            "rate".into(),
            if rates.is_empty() {
                Value::Null
            } else {
                Value::from(rates.iter().sum::<f64>())
            },
        );
        for f in ["requests_per_s", "body_bytes_per_s"] {
            let n: f64 = refs
                .iter()
                .map(|(_, m)| num(m.get(f)) * num(m.get("steady_s")))
                .sum();
            p.insert(
                f.into(),
                Value::from(if steady > 0.0 { n / steady } else { 0.0 }),
            );
        }
        for (pct, hist) in [
            ("latency", "latency_histogram"),
            ("latency_actual", "latency_actual_histogram"),
            ("send_lag", "send_lag_histogram"),
        ] {
            let h = histograms_of(&refs, pct, hist)?;
            p.insert(
                pct.into(),
                serde_json::to_value(h.as_ref().and_then(LatencyUs::of)).unwrap_or_default(),
            );
            if let Some(text) = h.as_ref().and_then(encode_histogram) {
                p.insert(hist.into(), Value::from(text));
            }
        }
        let (by_class, hists) = by_class(&refs)?;
        p.insert("by_class".into(), by_class);
        if !hists.is_empty() {
            p.insert(
                "by_class_histograms".into(),
                serde_json::to_value(hists).unwrap_or_default(),
            );
        }
        out.push(Value::Object(p));
    }
    Ok(Value::Array(out))
}
