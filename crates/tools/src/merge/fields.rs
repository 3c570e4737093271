//! How `merge` joins a field of several reports: the rules' generic merges, and the
//! kind-specific ones (flows, rows by key, sums of objects, weighted figures, histograms).

use hdrhistogram::Histogram;
use serde_json::{Map, Value};

use super::rules::Rule;
use crate::report::decode_histogram;
use crate::ToolError;

pub(super) fn merge_field(
    field: &str,
    rule: Rule,
    vals: &[&Value],
    parts: &[(&str, &Map<String, Value>)],
) -> Result<Option<Value>, ToolError> {
    let present: Vec<&Value> = vals.iter().copied().filter(|v| !v.is_null()).collect();
    Ok(match rule {
        Rule::Drop | Rule::Own => None,
        _ if present.is_empty() => Some(Value::Null),
        Rule::Sum => Some(Value::from(
            present.iter().map(|v| int(Some(v))).sum::<u64>(),
        )),
        Rule::SumF => Some(Value::from(
            present.iter().map(|v| num(Some(v))).sum::<f64>(),
        )),
        Rule::Max => Some(Value::from(
            present
                .iter()
                .map(|v| num(Some(v)))
                .fold(f64::MIN, f64::max),
        )),
        Rule::Any => Some(Value::from(
            present.iter().any(|v| v.as_bool() == Some(true)),
        )),
        Rule::First => Some(present[0].clone()),
        Rule::Same => {
            if let Some(i) = vals.iter().position(|v| *v != vals[0]) {
                return Err(ToolError::usage(format!(
                    "{} has {field} {}, {} has {}: not shards of one run",
                    parts[i].0, vals[i], parts[0].0, vals[0]
                )));
            }
            Some(vals[0].clone())
        }
        Rule::Concat => Some(Value::Array(
            present
                .iter()
                .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                .collect(),
        )),
        Rule::Union => {
            let mut all: Vec<String> = present.iter().flat_map(|v| strings(Some(v))).collect();
            all.sort();
            all.dedup();
            Some(Value::from(all))
        }
        Rule::Problems => {
            let mut all = Vec::new();
            for (v, (src, m)) in vals.iter().zip(parts) {
                let who = match m.get("shard").and_then(|s| s.get("shard")) {
                    Some(s) => format!("shard {}/{}", int(s.get("index")), int(s.get("count"))),
                    None => src.to_string(),
                };
                let list = match v {
                    Value::String(s) => vec![s.clone()],
                    _ => strings(Some(v)),
                };
                all.extend(list.into_iter().map(|p| format!("{who}: {p}")));
            }
            Some(match field {
                "generator_limited_reason" if all.is_empty() => Value::Null,
                "generator_limited_reason" => Value::from(all.join("; ")),
                _ => Value::from(all),
            })
        }
    })
}

/// Every shard's histogram added into one (`None`: no shard timed anything).
pub(super) fn histograms(
    parts: &[(&str, &Map<String, Value>)],
) -> Result<Option<Histogram<u64>>, ToolError> {
    let key = if parts.iter().any(|(_, m)| m.contains_key("latency_ns")) {
        "latency_ns"
    } else {
        "latency"
    };
    histograms_of(parts, key, "latency_histogram")
}

/// The histograms in field `hist` of every part added; a part with percentiles (`pct`) but
/// no histogram is refused, since percentiles cannot be merged exactly.
pub(super) fn histograms_of(
    parts: &[(&str, &Map<String, Value>)],
    pct: &str,
    hist: &str,
) -> Result<Option<Histogram<u64>>, ToolError> {
    let mut all = None;
    for (src, m) in parts {
        let Some(text) = m.get(hist).and_then(Value::as_str) else {
            if m.get(pct).is_some_and(|l| !l.is_null()) {
                return Err(ToolError::usage(format!(
                    "{src} has latency percentiles ({pct}) but not their histogram ({hist}): \
                     percentiles cannot be merged exactly; rerun with this flowlane"
                )));
            }
            continue;
        };
        let h =
            decode_histogram(text).map_err(|e| ToolError::usage(format!("{src}: {hist}: {e}")))?;
        add_histogram(&mut all, Some(&h));
    }
    Ok(all)
}

pub(super) fn add_histogram(all: &mut Option<Histogram<u64>>, h: Option<&Histogram<u64>>) {
    let Some(h) = h else { return };
    match all {
        // Auto-resizing histograms (the roles' and a decoded one's) take any value.
        Some(a) => {
            let _ = a.add(h);
        }
        None => {
            let mut a = h.clone();
            a.auto(true);
            *all = Some(a);
        }
    }
}

/// The per-flow rows of every shard in one table, sorted by `keys`; a flow (its keys) in two
/// shards is refused: sequence accounting cannot be joined across senders.
pub(super) fn join_flows(
    parts: &[(&str, &Map<String, Value>)],
    keys: &[&str],
) -> Result<Value, ToolError> {
    let mut rows: Vec<(Vec<String>, &str, Value)> = Vec::new();
    for (src, m) in parts {
        for f in m
            .get("flows")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let k: Vec<String> = keys
                .iter()
                .map(|k| f.get(*k).map_or(String::new(), Value::to_string))
                .collect();
            rows.push((k, src, f.clone()));
        }
    }
    rows.sort_by(|a, b| {
        let n = |k: &[String]| {
            k.iter()
                .map(|s| s.parse::<u64>().unwrap_or(u64::MAX))
                .collect::<Vec<_>>()
        };
        n(&a.0).cmp(&n(&b.0))
    });
    for w in rows.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(ToolError::usage(format!(
                "flow {} is in {} and in {}: each flow belongs to one shard (give every shard \
                 the same --flows and its own --shard I/N)",
                w[0].0.join(" queue "),
                w[0].1,
                w[1].1
            )));
        }
    }
    Ok(Value::Array(rows.into_iter().map(|r| r.2).collect()))
}

/// Rows of an array field summed by a key field (sink's `by_size`).
pub(super) fn sum_rows_by(parts: &[(&str, &Map<String, Value>)], field: &str, key: &str) -> Value {
    let mut rows: Vec<Map<String, Value>> = Vec::new();
    for (_, m) in parts {
        for r in m.get(field).and_then(Value::as_array).into_iter().flatten() {
            let Some(r) = r.as_object() else { continue };
            match rows.iter_mut().find(|x| x.get(key) == r.get(key)) {
                Some(x) => add_into(x, r),
                None => rows.push(r.clone()),
            }
        }
    }
    rows.sort_by_key(|r| int(r.get(key)));
    Value::from(rows)
}

/// An object field of every shard with its numbers summed (`null` where none has it).
pub(super) fn sum_objects(parts: &[(&str, &Map<String, Value>)], field: &str) -> Value {
    let mut acc: Option<Map<String, Value>> = None;
    for (_, m) in parts {
        if let Some(o) = m.get(field).and_then(Value::as_object) {
            match acc.as_mut() {
                Some(a) => add_into(a, o),
                None => acc = Some(o.clone()),
            }
        }
    }
    acc.map_or(Value::Null, Value::Object)
}

/// Adds `b`'s integers into `a`'s (other fields stay `a`'s: the caller sets them).
pub(super) fn add_into(a: &mut Map<String, Value>, b: &Map<String, Value>) {
    for (k, v) in b {
        if let (Some(x), Some(y)) = (a.get(k).and_then(Value::as_u64), v.as_u64()) {
            a.insert(k.clone(), Value::from(x.saturating_add(y)));
        }
    }
}

/// serve's totals: its ratios from the summed counts.
pub(super) fn serve_ratios(total: &mut Value, parts: &[(&str, &Map<String, Value>)]) {
    let Some(t) = total.as_object_mut() else {
        return;
    };
    let (rx, cpu, rounds) = (
        int(t.get("rx_packets")),
        int(t.get("cpu_ns")),
        int(t.get("rounds")),
    );
    t.insert(
        "cpu_ns_per_packet".into(),
        Value::from(crate::ns_per(cpu, rx)),
    );
    // Batch fill: each shard's weighted by its rounds.
    let fill: f64 = parts
        .iter()
        .filter_map(|(_, m)| m.get("total"))
        .map(|s| num(s.get("batch_fill")) * int(s.get("rounds")) as f64)
        .sum();
    let f = if rounds > 0 {
        fill / rounds as f64
    } else {
        0.0
    };
    t.insert(
        "batch_fill".into(),
        Value::from((f * 1000.0).round() / 1000.0),
    );
}

/// A per-packet figure weighted by each shard's packets.
pub(super) fn weighted(parts: &[(&str, &Map<String, Value>)], field: &str, by: &str) -> Value {
    let (mut sum, mut n) = (0.0, 0u64);
    for (_, m) in parts {
        let Some(v) = m.get(field).and_then(Value::as_f64) else {
            return Value::Null;
        };
        let w = int(m.get(by));
        sum += v * w as f64;
        n += w;
    }
    if n == 0 {
        return Value::Null;
    }
    Value::from((sum / n as f64 * 10.0).round() / 10.0)
}

/// Hardware-counter cost: weighted where every shard has it, else the first reason it is
/// not known.
pub(super) fn pmu(parts: &[(&str, &Map<String, Value>)], by: &str) -> Value {
    let pm: Vec<(&Value, u64)> = parts
        .iter()
        .filter_map(|(_, m)| {
            let w = m.get(by).map_or(0, |v| {
                v.as_u64()
                    .unwrap_or_else(|| int(v.get("rx_packets")) + int(v.get("responses")))
            });
            m.get("pmu").map(|p| (p, w))
        })
        .collect();
    if let Some((p, _)) = pm.iter().find(|(p, _)| !p["unavailable"].is_null()) {
        return serde_json::json!({ "unavailable": p["unavailable"] });
    }
    let mut out = Map::new();
    for f in [
        "cycles_per_packet",
        "instructions_per_packet",
        "ipc",
        "llc_misses_per_packet",
    ] {
        let rows: Vec<(&str, Map<String, Value>)> = pm
            .iter()
            .map(|(p, w)| {
                let mut m = Map::new();
                m.insert(f.into(), p[f].clone());
                m.insert("w".into(), Value::from(*w));
                ("", m)
            })
            .collect();
        let refs: Vec<(&str, &Map<String, Value>)> = rows.iter().map(|(s, m)| (*s, m)).collect();
        out.insert(f.into(), weighted(&refs, f, "w"));
    }
    out.insert("unavailable".into(), Value::Null);
    Value::Object(out)
}

/// `generator` when any shard's generator was the limit, else `path` when any path was.
pub(super) fn limited_by(parts: &[(&str, &Map<String, Value>)]) -> Value {
    let all: Vec<&str> = parts
        .iter()
        .filter_map(|(_, m)| m.get("limited_by").and_then(Value::as_str))
        .collect();
    ["generator", "path"]
        .into_iter()
        .find(|w| all.contains(w))
        .map_or(Value::Null, Value::from)
}

/// pktgen's line for the merged step.
pub(super) fn pktgen(m: &Map<String, Value>, window: f64) -> String {
    let mut m = m.clone();
    m.insert("pktgen".into(), Value::from(""));
    let step: Option<crate::blast::StepReport> = serde_json::from_value(Value::Object(m)).ok();
    match step {
        Some(s) => crate::blast::pktgen_line(&s, window, s.mean_frame(), s.mbps),
        None => String::new(),
    }
}

pub(super) fn int(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn num(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_f64).unwrap_or(0.0)
}

pub(super) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|x| match x {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}
