//! IP reassembly on one core, in memory (issue 54 item 6): fragments per second through
//! `reasm::Reassembler` against a reassembler written the usual way — a `HashMap` from
//! (source, destination, protocol, id) to the fragments' copies, concatenated in offset order
//! once their lengths add up, timed-out contexts found by sweeping the map — same run,
//! alternated rounds, medians. Workload: datagrams of 1 472 bytes of UDP payload and header
//! (a 1 514-byte frame's worth) cut into three fragments at a 576-byte MTU's 552 bytes, 1 024
//! datagrams in flight, each datagram's fragments in a shuffled order, interleaved with the
//! others'. Also: memory per context (the table and a context's own fields, beyond the
//! fragments' bytes), and expiry work per context from 10 k to 1 M contexts.
//!
//! Run: `cargo bench -p flowlane-flowtable --bench reasm` (`-- --quick`: fewer rounds).

use std::collections::HashMap;
use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;

use flowlane_flowtable::reasm::{Fragment, Outcome, ReasmConfig, Reassembler};

const PAYLOAD: usize = 1472;
const CUT: usize = 552;
const IN_FLIGHT: u32 = 1024;

/// A datagram's key: source, destination, protocol, id.
type Key = (IpAddr, IpAddr, u8, u32);
/// Its fragments' copies (offset, bytes), its length once known, when it began.
type Pieces = (Vec<(u32, Vec<u8>)>, Option<u32>, u64);

/// The usual reassembler: fragments copied into a map's vector, joined when complete.
#[derive(Default)]
struct Plain {
    map: HashMap<Key, Pieces>,
}

impl Plain {
    fn fragment(&mut self, f: &Fragment<'_>, now: u64) -> Option<Vec<u8>> {
        let key = (f.src, f.dst, f.proto, f.id);
        let e = self
            .map
            .entry(key)
            .or_insert_with(|| (Vec::new(), None, now));
        e.0.push((f.offset, f.data.to_vec()));
        if !f.more {
            e.1 = Some(f.offset + f.data.len() as u32);
        }
        let got: u32 = e.0.iter().map(|p| p.1.len() as u32).sum();
        if e.1 != Some(got) {
            return None;
        }
        let (mut pieces, _, _) = self.map.remove(&key)?;
        pieces.sort_by_key(|p| p.0);
        let mut out = Vec::with_capacity(got as usize);
        for (_, d) in pieces {
            out.extend_from_slice(&d);
        }
        Some(out)
    }

    fn expire(&mut self, now: u64, timeout: u64) {
        self.map.retain(|_, v| now < v.2 + timeout);
    }
}

/// The fragments of `n` datagrams: (id, offset, more, range of the payload), each
/// datagram's three in a shuffled order, `IN_FLIGHT` datagrams interleaved.
fn workload(n: u32) -> Vec<(u32, u32, bool, usize, usize)> {
    let mut out = Vec::with_capacity(n as usize * 3);
    let mut x = 0x9e37_79b9_u32;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    for base in (0..n).step_by(IN_FLIGHT as usize) {
        let ids: Vec<u32> = (base..(base + IN_FLIGHT).min(n)).collect();
        let mut frags: Vec<(u32, u32, bool, usize, usize)> = Vec::new();
        for &id in &ids {
            for k in 0..3 {
                let lo = k * CUT;
                let hi = ((k + 1) * CUT).min(PAYLOAD);
                frags.push((id, lo as u32, k < 2, lo, hi));
            }
        }
        // Fisher-Yates over the whole window: orders within and across datagrams.
        for i in (1..frags.len()).rev() {
            let j = next() as usize % (i + 1);
            frags.swap(i, j);
        }
        out.extend(frags);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn frag<'a>(p: &'a [u8], w: &(u32, u32, bool, usize, usize)) -> Fragment<'a> {
    Fragment {
        src: IpAddr::from([198, 18, 0, 1]),
        dst: IpAddr::from([198, 18, 1, 2]),
        proto: 17,
        id: w.0,
        offset: w.1,
        more: w.2,
        data: &p[w.3..w.4],
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 7 };
    let n = 300_000u32;
    let work = workload(n);
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| i as u8).collect();
    let cfg = ReasmConfig {
        contexts: 4 * IN_FLIGHT as usize,
        bytes: 64 << 20,
        ..ReasmConfig::default()
    };
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            let start = Instant::now();
            let mut done = 0u64;
            if which == 0 {
                let mut r = Reassembler::new(&cfg).expect("reassembler");
                for (i, w) in work.iter().enumerate() {
                    if let Outcome::Complete(d) = r.fragment(&frag(&payload, w), i as u64) {
                        done += black_box(d.data.len()) as u64;
                    }
                    if i % 4096 == 0 {
                        r.expire(i as u64);
                    }
                }
            } else {
                let mut r = Plain::default();
                for (i, w) in work.iter().enumerate() {
                    if let Some(d) = r.fragment(&frag(&payload, w), i as u64) {
                        done += black_box(d.len()) as u64;
                    }
                    if i % 4096 == 0 {
                        r.expire(i as u64, 30_000_000_000);
                    }
                }
            }
            assert_eq!(done, u64::from(n) * PAYLOAD as u64, "every datagram whole");
            let mfps = work.len() as f64 / start.elapsed().as_secs_f64() / 1e6;
            if which == 0 {
                ours.push(mfps);
            } else {
                plain.push(mfps);
            }
        }
    }
    let (o, p) = (median(ours), median(plain));
    println!(
        "reassembly, {n} datagrams of 3 fragments, {IN_FLIGHT} in flight, shuffled: \
         flowlane {o:.2} M fragments/s, HashMap reassembler {p:.2} M/s: ratio {:.2} (target ≥ 2)",
        o / p
    );

    // Memory per context, beyond the fragments' bytes.
    for contexts in [1024usize, 1 << 20] {
        let r = Reassembler::new(&ReasmConfig {
            contexts,
            ..ReasmConfig::default()
        })
        .expect("reassembler");
        println!(
            "memory per context at {contexts} contexts: {:.1} B (target ≤ 128)",
            r.memory_bytes() as f64 / contexts as f64
        );
    }

    // Expiry work per context: n incomplete datagrams (one fragment each), all timing out.
    println!("expiry per context (n incomplete datagrams, all expiring):");
    for n in [10_000u32, 100_000, 1_000_000] {
        let mut r = Reassembler::new(&ReasmConfig {
            contexts: n as usize,
            bytes: 1 << 30,
            timeout_ns: 1_000_000_000,
            ..ReasmConfig::default()
        })
        .expect("reassembler");
        let d = [0u8; 8];
        for id in 0..n {
            let w = (id, 0, true, 0, 8);
            let f = Fragment {
                data: &d,
                ..frag(&payload, &w)
            };
            r.fragment(&f, u64::from(id));
        }
        let start = Instant::now();
        r.expire(3_000_000_000);
        let ns = start.elapsed().as_nanos() as f64 / f64::from(n);
        assert_eq!(r.counts().timed_out, u64::from(n));
        println!("  {n:>9} contexts: {ns:.1} ns each");
    }
}
