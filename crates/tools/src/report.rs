//! Report pieces several roles share.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency percentiles in nanoseconds, from an HdrHistogram of every measured packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// What was timed: `round-trip` or `one-way`.
    pub kind: String,
}

impl Latency {
    /// The percentiles of `h` (`None` when nothing was measured).
    pub fn of(h: Option<&Histogram<u64>>, kind: &str) -> Option<Latency> {
        let h = h.filter(|h| !h.is_empty())?;
        Some(Latency {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            kind: kind.to_string(),
        })
    }
}

/// Nanoseconds of CPU time per item (packet, request), to 0.1 ns; `None` when there was none.
pub fn ns_per(cpu_ns: u64, items: u64) -> Option<f64> {
    (items > 0).then(|| (cpu_ns as f64 / items as f64 * 10.0).round() / 10.0)
}

/// What each packet cost in the CPU's own terms, from the workers' hardware counters (cycles,
/// instructions, last-level cache misses over their loops), or why that is not known here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PmuCost {
    /// CPU cycles per packet.
    pub cycles_per_packet: Option<f64>,
    /// Instructions per packet.
    pub instructions_per_packet: Option<f64>,
    /// Instructions per cycle.
    pub ipc: Option<f64>,
    /// Last-level cache misses per packet.
    pub llc_misses_per_packet: Option<f64>,
    /// Why the counters could not be read (no PMU, `perf_event_paranoid`, a capability).
    pub unavailable: Option<String>,
}

impl PmuCost {
    /// From the workers' loop counters over `packets`; `unavailable` from the runtime.
    pub fn of(
        l: &flowlane_runtime::LoopSnapshot,
        packets: u64,
        unavailable: Option<String>,
    ) -> PmuCost {
        if unavailable.is_some() {
            return PmuCost {
                unavailable,
                ..PmuCost::default()
            };
        }
        let per = |v: u64| ns_per(v, packets);
        PmuCost {
            cycles_per_packet: per(l.pmu_cycles),
            instructions_per_packet: per(l.pmu_instructions),
            ipc: (l.pmu_cycles > 0)
                .then(|| (l.pmu_instructions as f64 / l.pmu_cycles as f64 * 100.0).round() / 100.0),
            llc_misses_per_packet: per(l.pmu_llc_misses),
            unavailable: None,
        }
    }
}

/// The full distribution of `h` (nanoseconds) in HdrHistogram's percentile-distribution text
/// (`.hgrm`, as `outputPercentileDistribution` writes it, values in microseconds, 5 ticks per
/// half distance), which HdrHistogram's plotter and other tools read and can merge.
pub fn hgrm(h: &Histogram<u64>) -> String {
    use std::fmt::Write as _;
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut s = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        let value = us(h.highest_equivalent(v.value_iterated_to()));
        total += v.count_since_last_iteration();
        if q < 1.0 {
            let _ = writeln!(
                s,
                "{value:12.3} {q:2.12} {total:10} {:14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(s, "{value:12.3} {q:2.12} {total:10}");
        }
    }
    let _ = writeln!(
        s,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / 1000.0,
        h.stdev() / 1000.0
    );
    let _ = writeln!(
        s,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        us(h.max()),
        h.len()
    );
    let _ = writeln!(
        s,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        (2 * 10u64.pow(u32::from(h.sigfig()))).next_power_of_two()
    );
    s
}

/// A worker that stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkerError {
    /// The worker's index.
    pub worker: usize,
    /// What it said.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgrm_is_the_percentile_distribution_format() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3).expect("bounds");
        for v in 1..=10_000u64 {
            h.record(v * 1000).expect("record");
        }
        let text = hgrm(&h);
        let rows: Vec<Vec<f64>> = text
            .lines()
            .skip(2)
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                l.split_whitespace()
                    .map(|x| x.parse().expect("number"))
                    .collect()
            })
            .collect();
        // Values and counts rise; the last row is the 100th percentile with every sample.
        assert!(rows
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][2] <= w[1][2]));
        let last = rows.last().expect("rows");
        assert_eq!((last[1], last[2]), (1.0, 10_000.0));
        assert!((last[0] - 10_000.0).abs() <= 10.0, "{last:?}");
        let median = rows.iter().find(|r| r[1] >= 0.5).expect("median");
        assert!((median[0] - 5_000.0).abs() <= 5.0, "{median:?}");
        assert!(text.contains("#[Max     =") && text.contains("Total count    =        10000]"));
        assert!(text.contains("SubBuckets     =         2048]"), "{text}");
    }
}

/// A histogram in HdrHistogram's compressed interchange form: the V2 encoding, DEFLATE-
/// compressed, in base64 (`HISTFAAA…`, what the Java, C, Go and Python HdrHistograms read and
/// write), so that reports can be merged without losing a sample. `None` when empty.
pub fn encode_histogram(h: &Histogram<u64>) -> Option<String> {
    use base64::Engine;
    use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
    if h.is_empty() {
        return None;
    }
    let mut bytes = Vec::new();
    V2DeflateSerializer::new().serialize(h, &mut bytes).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A histogram as HdrHistogram's log (version 1.3: what `HistogramLogReader` reads), one
/// interval holding the whole distribution in the interchange form; values in nanoseconds,
/// the interval's maximum in milliseconds (the format's default unit ratio of 10⁶).
pub fn hlog(h: &Histogram<u64>) -> String {
    format!(
        "#[Histogram log format version 1.3]\n#[Values in nanoseconds]\n\
         \"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n\
         0.000,0.000,{:.3},{}\n",
        h.max() as f64 / 1e6,
        encode_histogram(h).unwrap_or_default()
    )
}

/// The most a histogram's encoding may inflate to: the counts of the widest histogram (5
/// significant digits over the whole u64 range, ~6 M counters) at up to 9 bytes each.
const MAX_INFLATED: u64 = 64 << 20;

/// A histogram from its interchange form ([`encode_histogram`]); the error in words. Hostile
/// input is bounded before the decoder sees it: the DEFLATE stream is inflated here under
/// [`MAX_INFLATED`] (a few bytes can claim gigabytes), and the V2 header's payload length must
/// be what was inflated; only then does HdrHistogram's reader decode the counts.
pub fn decode_histogram(text: &str) -> Result<Histogram<u64>, String> {
    use base64::Engine;
    use hdrhistogram::serialization::Deserializer;
    use std::io::Read;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not base64: {e}"))?;
    let be32 = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    // V2 compressed: its cookie (the word size in bits 4–7, as HdrHistogram writes it), the
    // compressed length, a zlib stream.
    let cookie = |c: Option<u32>| c.map(|c| c & 0xffff_ff0f);
    if cookie(be32(&bytes, 0)) != Some(0x1c84_9304) {
        return Err("not HdrHistogram's compressed V2 encoding (HISTFAAA…)".into());
    }
    let clen = be32(&bytes, 4).unwrap_or(0) as usize;
    let zipped = bytes
        .get(8..8usize.saturating_add(clen))
        .ok_or("the compressed length runs past the end")?;
    let mut inner = Vec::new();
    flate2::read::ZlibDecoder::new(zipped)
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut inner)
        .map_err(|e| format!("the DEFLATE stream: {e}"))?;
    if inner.len() as u64 > MAX_INFLATED {
        return Err(format!("inflates beyond {MAX_INFLATED} bytes"));
    }
    // V2: its cookie, then the payload's length after a 40-byte header.
    if cookie(be32(&inner, 0)) != Some(0x1c84_9303)
        || be32(&inner, 4).map(|n| n as usize) != inner.len().checked_sub(40)
    {
        return Err("the inflated V2 header does not match its payload".into());
    }
    Deserializer::new()
        .deserialize(&mut inner.as_slice())
        .map_err(|e| format!("not an HdrHistogram V2 encoding: {e:?}"))
}

#[cfg(test)]
mod histogram_tests {
    use super::*;

    #[test]
    fn the_interchange_form_round_trips_every_sample() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
        for v in [1u64, 17, 999, 1_000, 123_456, 7_000_000, 59_000_000_000] {
            h.record_n(v, v % 7 + 1).expect("in range");
        }
        let text = encode_histogram(&h).expect("not empty");
        assert!(text.starts_with("HISTFAAA"), "{text}");
        let back = decode_histogram(&text).expect("decodes");
        assert_eq!(back, h);
        assert!(decode_histogram("HISTFAAAnot").is_err());
        // A header claiming 4 GiB of payload is refused before anything is allocated.
        use base64::Engine;
        use std::io::Write;
        let mut inner = vec![0x1c, 0x84, 0x93, 0x13, 0xff, 0xff, 0xff, 0xff];
        inner.extend([0u8; 32]);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&inner).expect("deflate");
        let zipped = z.finish().expect("deflate");
        let mut outer = vec![0x1c, 0x84, 0x93, 0x14];
        outer.extend((zipped.len() as u32).to_be_bytes());
        outer.extend(zipped);
        let hostile = base64::engine::general_purpose::STANDARD.encode(outer);
        assert!(decode_histogram(&hostile)
            .expect_err("refused")
            .contains("header"));
        assert!(decode_histogram("!!").is_err());
        assert_eq!(encode_histogram(&Histogram::new(3).expect("h")), None);
    }
}
