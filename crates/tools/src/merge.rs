//! `merge`: the reports of a sharded run's shards joined into one report of the same schema,
//! exactly: counts summed, per-flow tables joined (a flow in two shards is refused), latency
//! from the shards' histograms (carried in HdrHistogram's interchange form, so no sample is
//! lost), rates over the common time window, every shard's problems kept, and a row per shard.
//!
//! Every field of a kind's report has a rule ([`rules`]); a unit test holds the rules against
//! the report's schema, so a field added to a report cannot be merged by accident.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::report::{encode_histogram, Latency};
use crate::shard::{rfc3339, Shard, ShardReport};
use crate::ToolError;

/// The reports `merge` joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `blast --json` (one step, or a sweep's steps step by step).
    Blast,
    /// `sink --json`.
    Sink,
    /// `serve --json`.
    Serve,
    /// `http load --json`.
    HttpLoad,
}

/// One shard's row in the merged report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShardRow {
    /// Where the report came from (a file name, `-` and its place in the stream).
    pub source: String,
    /// Its shard, when it said.
    pub shard: Option<Shard>,
    /// When its traffic started (wall clock, RFC 3339).
    pub started: Option<String>,
    /// Its start after the earliest shard's, milliseconds.
    pub start_offset_ms: Option<f64>,
    /// Its own duration, seconds.
    pub duration_s: f64,
    /// Its main count: datagrams sent (blast), frames received (sink and serve).
    pub packets: u64,
    /// Its clock's error bound as its kernel gave it, microseconds.
    pub clock_max_error_us: Option<i64>,
    /// Its problems, as it reported them.
    pub problems: Vec<String>,
}

/// What `merge` makes.
#[derive(Debug, Clone)]
pub struct Merged {
    /// The kind of the reports.
    pub kind: Kind,
    /// The merged report (one object of the kind's schema, a sweep's `{"sweep": [...]}` for
    /// blast), with `shards` and `merge_problems` added.
    pub report: Value,
    /// Per shard.
    pub shards: Vec<ShardRow>,
    /// What does not add up across the shards (missing shards), beside the shards' own.
    pub problems: Vec<String>,
    /// The merged latency distribution, nanoseconds (`--histogram`).
    pub histogram: Option<Histogram<u64>>,
}

impl Merged {
    /// Whether the merged run did what was asked: no shard's problem, none of the merge's.
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.shards.iter().all(|s| s.problems.is_empty())
    }
}

/// The reports in a text: one JSON report, several one after the other (`kubectl logs` of
/// several pods), or `--json-stream` lines, whose `final` records are taken and `interval`
/// records passed over. Lines outside a report that do not open one (`kubectl logs` mixes a
/// shard's status lines on standard error into its output) are passed over and counted;
/// a report that does not parse is an error naming the place.
pub fn read_reports(source: &str, text: &str) -> Result<Reports, ToolError> {
    let mut out = Reports::default();
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        let line_end = rest.find('\n').map_or(rest.len(), |e| e + 1);
        let line = rest[..line_end].trim();
        if line.is_empty() {
            at += line_end;
            continue;
        }
        if !line.starts_with('{') {
            out.skipped_lines += 1;
            at += line_end;
            continue;
        }
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = match stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(ToolError::usage(format!(
                    "{source}: byte {at}: not a JSON report ({e}): {}; give merge the output of \
                     --json or --json-stream",
                    crate::input::excerpt(line)
                )))
            }
            None => break,
        };
        at += stream.byte_offset();
        let Value::Object(mut o) = v else { continue };
        if o.contains_key("interval") && o.len() == 1 {
            continue;
        }
        let v = match o.remove("final") {
            Some(f) if o.is_empty() => f,
            Some(f) => {
                o.insert("final".into(), f);
                Value::Object(o)
            }
            None => Value::Object(o),
        };
        let n = out.reports.len() + 1;
        out.reports.push((format!("{source}#{n}"), v));
    }
    if out.reports.len() == 1 {
        out.reports[0].0 = source.to_string();
    }
    Ok(out)
}

/// What [`read_reports`] found.
#[derive(Debug, Default)]
pub struct Reports {
    /// Each report with where it came from.
    pub reports: Vec<(String, Value)>,
    /// Lines passed over: not JSON, outside any report.
    pub skipped_lines: usize,
}

/// The kind of a report, by the fields only it has.
pub fn kind_of(v: &Value) -> Option<Kind> {
    let has = |k: &str| v.get(k).is_some();
    if has("pktgen") || v.get("sweep").is_some_and(Value::is_array) {
        Some(Kind::Blast)
    } else if has("flowlane_packets") && has("ring_drops") {
        Some(Kind::Sink)
    } else if has("workers") && has("steering") && has("total") {
        Some(Kind::Serve)
    } else if has("requests_per_s") && has("pools") && has("steady_s") {
        Some(Kind::HttpLoad)
    } else {
        None
    }
}

/// Merges `reports` (each `(source, report)`) into one.
pub fn merge(reports: &[(String, Value)]) -> Result<Merged, ToolError> {
    let first = reports
        .first()
        .ok_or_else(|| ToolError::usage("merge needs at least one report"))?;
    let kind = kind_of(&first.1).ok_or_else(|| {
        ToolError::usage(format!(
            "{}: not a report merge knows (blast, sink, serve or http load --json)",
            first.0
        ))
    })?;
    if let Some((src, _)) = reports.iter().find(|(_, v)| kind_of(v) != Some(kind)) {
        return Err(ToolError::usage(format!(
            "{src} is not a {kind:?} report like {}: merge joins reports of one kind",
            first.0
        )));
    }
    // Each report checked against its type first: a report of another version is refused.
    for (src, v) in reports {
        let ok = match kind {
            Kind::Blast => serde_json::from_value::<crate::blast::BlastJson>(v.clone()).is_ok(),
            Kind::Sink => serde_json::from_value::<crate::sink::SinkReport>(v.clone()).is_ok(),
            Kind::Serve => serde_json::from_value::<crate::serve::ServeReport>(v.clone()).is_ok(),
            Kind::HttpLoad => {
                serde_json::from_value::<crate::http::HttpLoadReport>(v.clone()).is_ok()
            }
        };
        if !ok {
            return Err(ToolError::usage(format!(
                "{src}: not a {kind:?} report of this flowlane's schema"
            )));
        }
    }
    match kind {
        Kind::Blast if reports.iter().any(|(_, v)| v.get("sweep").is_some()) => {
            merge_sweep(reports)
        }
        _ => {
            let parts: Vec<(&str, &Map<String, Value>)> = reports
                .iter()
                .map(|(s, v)| (s.as_str(), v.as_object().expect("checked: an object")))
                .collect();
            let (report, shards, problems, histogram) = merge_one(kind, &parts)?;
            Ok(finish(
                kind,
                Value::Object(report),
                shards,
                problems,
                histogram,
            ))
        }
    }
}

fn finish(
    kind: Kind,
    mut report: Value,
    shards: Vec<ShardRow>,
    problems: Vec<String>,
    histogram: Option<Histogram<u64>>,
) -> Merged {
    if let Some(o) = report.as_object_mut() {
        o.insert(
            "shards".into(),
            serde_json::to_value(&shards).unwrap_or_default(),
        );
        o.insert("merge_problems".into(), Value::from(problems.clone()));
    }
    Merged {
        kind,
        report,
        shards,
        problems,
        histogram,
    }
}

/// A sweep's steps merged step by step (every shard ran the same sizes).
fn merge_sweep(reports: &[(String, Value)]) -> Result<Merged, ToolError> {
    let steps: Vec<Vec<Map<String, Value>>> = reports
        .iter()
        .map(|(_, v)| match v.get("sweep") {
            Some(Value::Array(a)) => a.iter().filter_map(|s| s.as_object().cloned()).collect(),
            _ => v.as_object().cloned().into_iter().collect(),
        })
        .collect();
    let n = steps[0].len();
    if let Some(i) = steps.iter().position(|s| s.len() != n) {
        return Err(ToolError::usage(format!(
            "{} has {} steps, {} has {n}: the shards of a sweep run the same sizes",
            reports[i].0,
            steps[i].len(),
            reports[0].0
        )));
    }
    let mut merged = Vec::new();
    let (mut rows, mut problems, mut all): (Vec<ShardRow>, Vec<String>, Option<Histogram<u64>>) =
        (Vec::new(), Vec::new(), None);
    for i in 0..n {
        let parts: Vec<(&str, &Map<String, Value>)> = reports
            .iter()
            .zip(&steps)
            .map(|((s, _), st)| (s.as_str(), &st[i]))
            .collect();
        let (m, r, p, h) = merge_one(Kind::Blast, &parts)?;
        merged.push(Value::Object(m));
        if i == 0 {
            rows = r;
        }
        problems.extend(p.into_iter().map(|p| format!("step {}: {p}", i + 1)));
        add_histogram(&mut all, h.as_ref());
    }
    Ok(finish(
        Kind::Blast,
        serde_json::json!({ "sweep": merged }),
        rows,
        problems,
        all,
    ))
}

type OneMerged = (
    Map<String, Value>,
    Vec<ShardRow>,
    Vec<String>,
    Option<Histogram<u64>>,
);

/// One report's worth (a step of blast, a sink's or a server's run) from every shard.
fn merge_one(kind: Kind, parts: &[(&str, &Map<String, Value>)]) -> Result<OneMerged, ToolError> {
    let shard_of = |m: &Map<String, Value>| -> Option<ShardReport> {
        m.get("shard")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
    };
    let starts: Vec<Option<ShardReport>> = parts.iter().map(|(_, m)| shard_of(m)).collect();
    let problems = check_shards(parts, &starts)?;
    let mut out = Map::new();
    for &(field, rule) in rules(kind) {
        // A field no shard wrote (skipped when empty) stays out.
        if parts.iter().all(|(_, m)| !m.contains_key(field)) {
            continue;
        }
        let vals: Vec<&Value> = parts
            .iter()
            .map(|(_, m)| m.get(field).unwrap_or(&Value::Null))
            .collect();
        if let Some(v) = merge_field(field, rule, &vals, parts)? {
            out.insert(field.to_string(), v);
        }
    }
    // Time: the common window, from the earliest shard's start to the latest one's end (each
    // start on its own host's wall clock); without starts, the longest run.
    let durations: Vec<f64> = parts
        .iter()
        .map(|(_, m)| num(m.get("duration_s")))
        .collect();
    let window = match starts
        .iter()
        .map(|s| s.as_ref().map(|s| s.started_unix_ns))
        .collect()
    {
        Some(st) => {
            let st: Vec<u64> = st;
            let begin = st.iter().copied().min().unwrap_or(0);
            st.iter()
                .zip(&durations)
                .map(|(&s, &d)| (s - begin) as f64 / 1e9 + d)
                .fold(0.0, f64::max)
        }
        None => durations.iter().copied().fold(0.0, f64::max),
    };
    out.insert(
        "duration_s".into(),
        Value::from((window * 1000.0).round() / 1000.0),
    );
    let per_s = |n: u64| {
        if window > 0.0 {
            (n as f64 / window).round()
        } else {
            0.0
        }
    };
    let sum = |f: &str| -> u64 { parts.iter().map(|(_, m)| int(m.get(f))).sum() };
    let h = histograms(parts)?;
    let weight = match kind {
        Kind::Blast => "tx_packets",
        Kind::Sink => "rx_packets",
        Kind::Serve | Kind::HttpLoad => "",
    };
    match kind {
        Kind::Blast => {
            out.insert("tx_pps".into(), Value::from(per_s(sum("tx_packets"))));
            if out.get("rx_packets").is_some_and(|v| !v.is_null()) {
                out.insert("rx_pps".into(), Value::from(per_s(sum("rx_packets"))));
            } else {
                out.insert("rx_pps".into(), Value::Null);
            }
            let mbps = if window > 0.0 {
                (sum("tx_bytes") as f64 * 8.0 / window / 1e5).round() / 10.0
            } else {
                0.0
            };
            out.insert("mbps".into(), Value::from(mbps));
            out.insert("limited_by".into(), limited_by(parts));
            out.insert("flows".into(), join_flows(parts, &["id"])?);
        }
        Kind::Sink => {
            out.insert("rx_pps".into(), Value::from(per_s(sum("rx_packets"))));
            out.insert("flows".into(), join_flows(parts, &["id", "queue"])?);
            out.insert(
                "by_size".into(),
                sum_rows_by(parts, "by_size", "frame_bytes"),
            );
            for f in ["tuples", "fragments"] {
                out.insert(f.into(), sum_objects(parts, f));
            }
        }
        Kind::Serve => {
            let mut total = sum_objects(parts, "total");
            serve_ratios(&mut total, parts);
            out.insert("total".into(), total);
        }
        Kind::HttpLoad => http_load::merge(&mut out, parts, &starts)?,
    }
    if !weight.is_empty() {
        out.insert(
            "cpu_ns_per_packet".into(),
            weighted(parts, "cpu_ns_per_packet", weight),
        );
    }
    out.insert(
        "pmu".into(),
        pmu(parts, if weight.is_empty() { "total" } else { weight }),
    );
    if kind == Kind::HttpLoad {
        out.insert(
            "latency".into(),
            serde_json::to_value(h.as_ref().and_then(crate::http::LatencyUs::of))
                .unwrap_or_default(),
        );
        out.insert(
            "latency_histogram".into(),
            h.as_ref()
                .and_then(encode_histogram)
                .map_or(Value::Null, Value::from),
        );
    } else if kind != Kind::Serve {
        let what = if kind == Kind::Blast {
            "round-trip"
        } else {
            "one-way"
        };
        out.insert(
            "latency_ns".into(),
            serde_json::to_value(Latency::of(h.as_ref(), what)).unwrap_or_default(),
        );
        out.insert(
            "latency_histogram".into(),
            h.as_ref()
                .and_then(encode_histogram)
                .map_or(Value::Null, Value::from),
        );
    }
    if kind == Kind::Blast {
        let line = pktgen(&out, window);
        out.insert("pktgen".into(), Value::from(line));
    }
    let begin = starts.iter().flatten().map(|s| s.started_unix_ns).min();
    let rows = parts
        .iter()
        .zip(&starts)
        .zip(&durations)
        .map(|(((src, m), s), &d)| ShardRow {
            source: src.to_string(),
            shard: s.as_ref().map(|s| s.shard),
            started: s.as_ref().map(|s| s.started.clone()),
            start_offset_ms: s
                .as_ref()
                .zip(begin)
                .map(|(s, b)| ((s.started_unix_ns - b) as f64 / 1e3).round() / 1e3),
            duration_s: d,
            packets: int(m.get(if kind == Kind::Blast {
                "tx_packets"
            } else {
                "rx_packets"
            })) + m.get("total").map_or(0, |t| int(t.get("rx_packets"))),
            clock_max_error_us: s.as_ref().and_then(|s| s.clock.max_error_us),
            problems: strings(m.get(match kind {
                Kind::Blast => "problems",
                _ => "errors",
            })),
        })
        .collect();
    Ok((out, rows, problems, h))
}

/// Shards named by the reports: the same count everywhere, no index twice (usage errors);
/// missing ones are problems of the merged run.
fn check_shards(
    parts: &[(&str, &Map<String, Value>)],
    starts: &[Option<ShardReport>],
) -> Result<Vec<String>, ToolError> {
    let named: Vec<(&str, Shard)> = parts
        .iter()
        .zip(starts)
        .filter_map(|((src, _), s)| s.as_ref().map(|s| (*src, s.shard)))
        .collect();
    let Some(&(_, first)) = named.first() else {
        return Ok(Vec::new());
    };
    // Whole runs (shard 0/1: a start time only) on hosts of their own are joined as they are.
    if named.iter().all(|(_, s)| s.whole()) {
        return Ok(Vec::new());
    }
    if named.len() != parts.len() {
        return Err(ToolError::usage(
            "some reports say which shard they are and some do not: merge the shards of one \
             run (each run with --shard or --shards)",
        ));
    }
    // A report's shard is what it says: checked as `--shard` is (index below count, at most
    // MAX_SHARDS), before anything is sized by it.
    for &(src, s) in &named {
        Shard::new(s.index, s.count)
            .map_err(|e| ToolError::usage(format!("{src}: {}", e.message)))?;
    }
    let mut seen = vec![None::<&str>; first.count as usize];
    for &(src, s) in &named {
        if s.count != first.count {
            return Err(ToolError::usage(format!(
                "{src} is shard {s}, of another count than {first}: the shards of one run agree \
                 on N"
            )));
        }
        if let Some(prev) = seen[s.index as usize].replace(src) {
            return Err(ToolError::usage(format!(
                "{prev} and {src} are both shard {s}: each shard once"
            )));
        }
    }
    let missing: Vec<String> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| i.to_string())
        .collect();
    Ok(if missing.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "shards {} of {} are missing: the merged report covers {} of the run's {} shards",
            missing.join(", "),
            first.count,
            named.len(),
            first.count
        )]
    })
}

/// When a merged run began (the earliest shard's start), RFC 3339.
pub fn began(m: &Merged) -> Option<String> {
    let ns = m
        .shards
        .iter()
        .filter_map(|r| r.started.as_deref())
        .filter_map(|s| humantime::parse_rfc3339(s).ok())
        .min()?;
    let d = ns.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(rfc3339(d.as_nanos() as u64))
}

mod fields;
mod http_load;
mod rules;

use fields::*;
pub use rules::{rules, Rule};

#[cfg(test)]
mod tests;
