use super::*;
use crate::report::decode_histogram;
use proptest::prelude::*;

/// Every property of a kind's report has a rule, and every rule names a property.
#[test]
fn every_field_of_every_report_has_a_rule() {
    let props = |s: schemars::Schema| -> Vec<String> {
        let v = serde_json::to_value(s).expect("schema");
        let mut p: Vec<String> = v["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .cloned()
            .collect();
        p.sort();
        p
    };
    for (kind, schema) in [
        (Kind::Blast, schemars::schema_for!(crate::blast::StepReport)),
        (Kind::Sink, schemars::schema_for!(crate::sink::SinkReport)),
        (
            Kind::Serve,
            schemars::schema_for!(crate::serve::ServeReport),
        ),
    ] {
        let mut ruled: Vec<String> = rules(kind).iter().map(|r| r.0.to_string()).collect();
        ruled.sort();
        assert_eq!(props(schema), ruled, "{kind:?}");
    }
}

fn histogram_of(samples: &[u64]) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for &s in samples {
        h.record(s).expect("auto-resizing");
    }
    h
}

/// A blast step report of `flows` (ids) with `per` datagrams each, `rtt` its round trips.
fn step(shard: Option<(u32, u32, u64)>, flows: &[u16], per: u64, rtt: &[u64]) -> Value {
    let h = histogram_of(rtt);
    let mut r = crate::blast::StepReport {
        tx_packets: per * flows.len() as u64,
        tx_bytes: per * flows.len() as u64 * 60,
        rx_packets: Some(rtt.len() as u64),
        lost: Some(0),
        reordered: Some(0),
        duplicates: Some(0),
        foreign: 0,
        tx_full: 1,
        icmp_errors: 0,
        lost_at_own_socket: Some(0),
        duration_s: 2.0,
        tx_pps: 0.0,
        cpu_ns_per_packet: Some(100.0),
        rx_pps: None,
        requested_pps: Some(1000.0),
        generator_limited: Some(false),
        generator_limited_reason: None,
        pace_forfeited: Some(0),
        late_max_ms: Some(1.5),
        limited_by: None,
        problems: Vec::new(),
        rss_verify: None,
        host: None,
        frame_bytes: Some(60),
        imix_frame_bytes: None,
        mbps: 0.0,
        latency_ns: Latency::of(Some(&h), "round-trip"),
        cpu_latency_ns: None,
        histogram: None,
        latency_histogram: encode_histogram(&h),
        shard: shard.map(|(index, count, at)| ShardReport {
            shard: Shard { index, count },
            start_at: None,
            started: rfc3339(at),
            started_unix_ns: at,
            late_us: None,
            clock: crate::shard::ClockReport::now(),
        }),
        pktgen: String::new(),
        flows_started: None,
        fragmented_datagrams: None,
        fragments: None,
        destinations: None,
        devs: Vec::new(),
        device_tx_packets: None,
        device_refused: None,
        ring_refused: 0,
        backend: None,
        flows: flows
            .iter()
            .map(|&id| crate::blast::FlowReport {
                id,
                src: "198.18.0.1:1".into(),
                dst: "198.18.0.2:9".into(),
                queue: None,
                tx_packets: per,
                rx_packets: None,
                lost: None,
                reordered: None,
                duplicates: None,
            })
            .collect(),
        pmu: crate::PmuCost {
            unavailable: Some("no PMU".into()),
            ..Default::default()
        },
        errors: Vec::new(),
        replay: None,
    };
    r.pktgen = "OK".into();
    serde_json::to_value(r).expect("json")
}

fn named(v: Vec<Value>) -> Vec<(String, Value)> {
    v.into_iter()
        .enumerate()
        .map(|(i, v)| (format!("shard-{i}.json"), v))
        .collect()
}

proptest! {
    /// The merged histogram is the histogram of every sample, whatever shard took it: the
    /// same counts at every value, so the same percentiles.
    #[test]
    fn merged_latency_is_the_histogram_of_all_samples(
        samples in prop::collection::vec(1u64..5_000_000_000, 1..400),
        cuts in prop::collection::vec(0usize..3, 400),
    ) {
        let mut parts: Vec<Vec<u64>> = vec![Vec::new(); 3];
        for (i, s) in samples.iter().enumerate() {
            parts[cuts[i]].push(*s);
        }
        let t0 = 1_795_939_200_000_000_000u64;
        let reports: Vec<Value> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| step(Some((i as u32, 3, t0 + i as u64 * 1_000_000)), &[i as u16], 5, p))
            .collect();
        let m = merge(&named(reports)).expect("merges");
        let all = histogram_of(&samples);
        let h = m.histogram.clone().expect("a histogram");
        prop_assert_eq!(h.len(), all.len());
        for v in all.iter_recorded() {
            prop_assert_eq!(h.count_at(v.value_iterated_to()), v.count_at_value());
        }
        let lat: Latency = serde_json::from_value(m.report["latency_ns"].clone()).expect("latency");
        prop_assert_eq!(Some(lat), Latency::of(Some(&all), "round-trip"));
        let back = decode_histogram(m.report["latency_histogram"].as_str().expect("text")).expect("decodes");
        prop_assert_eq!(back.len(), all.len());
    }
}

#[test]
fn counts_add_up_flows_join_and_the_window_is_common() {
    let t0 = 1_795_939_200_000_000_000u64;
    let reports = named(vec![
        step(Some((1, 2, t0 + 500_000_000)), &[2, 3], 10, &[1_000, 2_000]),
        step(Some((0, 2, t0)), &[0, 1], 10, &[3_000]),
    ]);
    let m = merge(&reports).expect("merges");
    assert!(m.ok(), "{:?}", m.problems);
    let r = &m.report;
    assert_eq!(r["tx_packets"], 40);
    assert_eq!(r["tx_bytes"], 2400);
    assert_eq!(r["rx_packets"], 3);
    assert_eq!(r["tx_full"], 2);
    assert_eq!(r["requested_pps"], 2000.0);
    // Shard 1 began 0.5 s after shard 0 and each sent for 2 s: 2.5 s in common.
    assert_eq!(r["duration_s"], 2.5);
    assert_eq!(r["tx_pps"], 16.0);
    let ids: Vec<u64> = r["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|f| f["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(m.shards.len(), 2);
    assert_eq!(m.shards[0].start_offset_ms, Some(500.0));
    // The same schema: every field one of the report's own, besides the rows and the merge's
    // problems, and it reads back as a step report.
    for k in r.as_object().expect("object").keys() {
        assert!(
            rules(Kind::Blast).iter().any(|(f, _)| f == k)
                || k == "shards"
                || k == "merge_problems",
            "{k}"
        );
    }
    serde_json::from_value::<crate::blast::StepReport>(r.clone()).expect("a step report");
    assert!(r["pktgen"]
        .as_str()
        .expect("line")
        .starts_with("OK: 2500000 usec, 40 "));
    // Whole runs of their own (a start time, no shard) on two hosts are joined as they are.
    let whole = merge(&named(vec![
        step(Some((0, 1, t0)), &[0], 10, &[]),
        step(Some((0, 1, t0)), &[1], 10, &[]),
    ]))
    .expect("joined");
    assert!(whole.ok(), "{:?}", whole.problems);
    assert_eq!(whole.report["tx_packets"], 20);
    // Without the missing shard, the merged run says so.
    let only = merge(&reports[..1]).expect("merges");
    assert!(!only.ok());
    assert!(
        only.problems[0].contains("shards 0 of 2 are missing"),
        "{:?}",
        only.problems
    );
}

#[test]
fn what_is_not_one_run_is_refused() {
    let t0 = 1_795_939_200_000_000_000u64;
    let e = |r: Vec<Value>| merge(&named(r)).expect_err("refused").message;
    // A flow in two shards.
    let m = e(vec![
        step(Some((0, 2, t0)), &[0, 1], 10, &[]),
        step(Some((1, 2, t0)), &[1, 2], 10, &[]),
    ]);
    assert!(m.contains("flow 1 is in"), "{m}");
    // The same shard twice; counts that disagree.
    let m = e(vec![
        step(Some((0, 2, t0)), &[0], 1, &[]),
        step(Some((0, 2, t0)), &[1], 1, &[]),
    ]);
    assert!(m.contains("both shard 0/2"), "{m}");
    let m = e(vec![
        step(Some((0, 2, t0)), &[0], 1, &[]),
        step(Some((1, 3, t0)), &[1], 1, &[]),
    ]);
    assert!(m.contains("another count"), "{m}");
    // Different frame sizes; another kind.
    let mut other = step(Some((1, 2, t0)), &[1], 1, &[]);
    other["frame_bytes"] = Value::from(128);
    let m = e(vec![step(Some((0, 2, t0)), &[0], 1, &[]), other]);
    assert!(m.contains("frame_bytes"), "{m}");
    let m = e(vec![
        step(None, &[0], 1, &[]),
        serde_json::json!({"workers": [], "steering": "x", "total": {}}),
    ]);
    assert!(m.contains("not a Blast report"), "{m}");
    // A shard the report cannot be (index beyond its count, a count beyond the limit).
    let m = e(vec![
        step(Some((5, 2, t0)), &[0], 1, &[]),
        step(Some((1, 2, t0)), &[1], 1, &[]),
    ]);
    assert!(m.contains("index runs from 0 to 1"), "{m}");
    let m = e(vec![
        step(Some((0, u32::MAX, t0)), &[0], 1, &[]),
        step(Some((1, 2, t0)), &[1], 1, &[]),
    ]);
    assert!(m.contains("shards, not"), "{m}");
    // Percentiles without their histogram cannot be merged.
    let mut bare = step(None, &[0], 1, &[5]);
    bare.as_object_mut()
        .expect("object")
        .remove("latency_histogram");
    let m = e(vec![bare, step(None, &[1], 1, &[6])]);
    assert!(m.contains("latency_histogram"), "{m}");
}

#[test]
fn streams_and_concatenated_reports_are_read() {
    let one = step(None, &[0], 1, &[]).to_string();
    let text = format!("{{\"interval\": {{\"tx_packets\": 1}}}}\n{{\"final\": {one}}}\n{one}\n");
    let r = read_reports("-", &text).expect("reads");
    assert_eq!(r.reports.len(), 2);
    assert_eq!(r.reports[0].0, "-#1");
    assert_eq!(r.skipped_lines, 0);
    // Status lines between reports (kubectl logs mixes standard error in) are passed over.
    let pretty = serde_json::to_string_pretty(&step(None, &[0], 1, &[])).expect("json");
    let mixed = format!("flowlane blast (udp): 1 flow(s)\n{pretty}\n    1.0s  tx 5 pps\n{one}\n");
    let r = read_reports("logs", &mixed).expect("reads");
    assert_eq!((r.reports.len(), r.skipped_lines), (2, 2));
    // A report cut short is an error.
    assert!(read_reports("x", &one[..one.len() / 2]).is_err());
}
