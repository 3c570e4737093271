//! `rss verify --dev IF`: did the NIC hash and queue each received frame the way the model
//! says? An XDP program on the interface records, per frame, the hash the NIC computed
//! (`bpf_xdp_metadata_rx_hash`) and the receive queue, counted per (flow, queue, hash); the
//! comparison with our Toeplitz over the NIC's own key, fields and table is the pure
//! `rss::verify`. Runs beside any traffic (every frame passes on).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowlane_io::bpf::{RssVerifier, SeenEntry};
use flowlane_rss::queue::QueueModel;
use flowlane_rss::verify::{check, tally, Model, Seen};
use flowlane_rss::{Symmetric, Toeplitz, Tuple};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// What `rss verify` is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyConfig {
    /// The receiving interface.
    pub dev: String,
    /// Seconds to watch (`None`: until stopped).
    pub duration_s: Option<f64>,
    /// Seconds between status lines.
    pub interval_s: f64,
    /// Distinct (flow, queue, hash) entries recorded at most.
    pub max_flows: u32,
}

/// One flow's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlowCheck {
    /// Source address (and port, for UDP and TCP).
    pub src: String,
    /// Destination address (and port).
    pub dst: String,
    /// Frames.
    pub frames: u64,
    /// The receive queue they arrived on.
    pub queue: u32,
    /// The NIC's hash, 8 hex digits (`None`: the driver gave none).
    pub nic_hash: Option<String>,
    /// The NIC's hash type (the kernel's `xdp_rss_hash_type` bits).
    pub nic_hash_type: Option<u32>,
    /// The same in words: what the NIC says it hashed (`IPv4 L4 UDP`: the 4-tuple; `IPv4`
    /// alone: the addresses; `none`: no type given).
    pub nic_hash_type_name: Option<String>,
    /// Our hash over the NIC's key and fields (`None`: no model to compare with).
    pub our_hash: Option<String>,
    /// The queue the NIC's table gives for our hash.
    pub expected_queue: Option<u32>,
    /// `agrees`, `hash differs`, `wrong queue (hash agrees)`, … or `not compared`.
    pub verdict: String,
}

/// The counts the summary line gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerifySummary {
    /// Whether the flows were compared with a model (`false`: the NIC has no RSS to read).
    pub compared: bool,
    pub flows: usize,
    pub with_nic_hash: usize,
    pub hash_agrees: usize,
    pub queue_agrees: usize,
    pub wrong_queue: usize,
}

/// What `rss verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerifyReport {
    /// The interface.
    pub dev: String,
    /// Seconds watched.
    pub duration_s: f64,
    /// What the frames were compared with: the NIC's own RSS, or why there is nothing to
    /// compare them with (the flows are listed with what the NIC did all the same).
    pub model: String,
    /// Why the NIC's hash was not read, if it was not.
    pub no_nic_hash: Option<String>,
    /// Frames of IP flows recorded, frames that were not IP, and frames not recorded
    /// because the flow table was full.
    pub frames: u64,
    pub other_frames: u64,
    pub uncounted_frames: u64,
    /// Per flow (and per queue and hash, where a flow's frames differed).
    pub flows: Vec<FlowCheck>,
    /// The counts.
    pub summary: VerifySummary,
    /// Disagreements, each named: a flow whose hash differs, or whose hash agrees but came
    /// up on another queue (the driver's fault).
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// Whether every compared flow agreed.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

fn endpoint(addr: std::net::IpAddr, port: Option<u16>) -> String {
    match (addr, port) {
        (a, None) => a.to_string(),
        (std::net::IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
        (a, Some(p)) => format!("{a}:{p}"),
    }
}

/// `xdp_rss_hash_type` bits in words (`include/net/xdp.h`: L3 IPv4 1, IPv6 2, extension
/// headers 4, L4 8, TCP 16, UDP 32, SCTP 64, IPsec 128, ICMP 256).
pub fn hash_type_name(bits: u32) -> String {
    const NAMES: [(u32, &str); 9] = [
        (1, "IPv4"),
        (2, "IPv6"),
        (4, "ext-headers"),
        (8, "L4"),
        (16, "TCP"),
        (32, "UDP"),
        (64, "SCTP"),
        (128, "IPsec"),
        (256, "ICMP"),
    ];
    let words: Vec<&str> = NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if words.is_empty() {
        "none".into()
    } else {
        words.join(" ")
    }
}

/// The NIC's RSS as a model: key, table, transform, and per flow type whether it hashes on
/// the addresses only; `Err`: why there is none.
struct NicModel {
    hasher: Toeplitz,
    queue: QueueModel,
    symmetric: Symmetric,
    /// (udp4, udp6, tcp4, tcp6) hashed on the addresses only.
    two_tuple: [bool; 4],
}

fn nic_model(nic: &crate::nic::NicReport) -> Result<NicModel, String> {
    let rss = nic.model()?;
    if let Some(why) = rss.unmodelled() {
        return Err(why);
    }
    let key = rss
        .key
        .ok_or_else(|| format!("{} reported no key", nic.dev))?;
    let two = |ft: &str| {
        nic.hash_fields
            .value
            .as_ref()
            .and_then(|v| v.iter().find(|f| f.flow_type == ft))
            .is_some_and(|f| !f.fields.iter().any(|x| x.starts_with("l4-")))
    };
    Ok(NicModel {
        hasher: Toeplitz::new(&key),
        queue: QueueModel::Reta(rss.reta),
        symmetric: rss.symmetric.unwrap_or(Symmetric::Off),
        two_tuple: [two("udp4"), two("udp6"), two("tcp4"), two("tcp6")],
    })
}

/// A verifying program attached to an interface, recording until [`Watch::finish`].
#[derive(Debug)]
pub struct Watch {
    dev: String,
    nic: crate::nic::NicReport,
    verifier: RssVerifier,
    max_flows: u32,
    t0: Instant,
}

/// Reads `dev`'s RSS and attaches the verifying program to it (in the calling thread's
/// namespace), recording up to `max_flows` distinct entries.
/// [`start`] on IF inside network namespace `netns` (one `ip netns` names), or here.
pub fn start_in(dev: &str, netns: Option<&str>, max_flows: u32) -> Result<Watch, ToolError> {
    match netns {
        None => start(dev, max_flows),
        Some(n) => {
            if n.contains('/') || !std::path::Path::new(&format!("/run/netns/{n}")).exists() {
                return Err(ToolError::usage(format!(
                    "{dev}@{n}: no namespace `{n}` (see `ip netns list`)"
                )));
            }
            flowlane_lab::Netns::existing(n)
                .run_with_sys(|| start(dev, max_flows))
                .map_err(|e| ToolError::runtime(format!("entering namespace {n}: {e}")))?
        }
    }
}

pub fn start(dev: &str, max_flows: u32) -> Result<Watch, ToolError> {
    let nic = crate::nic::read(dev)?;
    let ifindex =
        flowlane_io::netdev::ifindex(dev).map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
    if max_flows == 0 {
        return Err(ToolError::usage("--max-flows must be at least 1"));
    }
    let verifier = RssVerifier::attach(ifindex, max_flows).map_err(|e| {
        let log = if e.log.is_empty() {
            String::new()
        } else {
            format!("\nverifier: {}", e.log)
        };
        crate::error::denied_open(
            &e.error,
            format!(
                "cannot attach the verifying XDP program to {dev}: {}{log}",
                e.error
            ),
            "rss verify needs root (CAP_BPF and CAP_NET_ADMIN) to attach an XDP program",
        )
    })?;
    Ok(Watch {
        dev: dev.into(),
        nic,
        verifier,
        max_flows,
        t0: Instant::now(),
    })
}

impl Watch {
    /// Flows and frames recorded so far (approximate while frames still come).
    pub fn counts(&self) -> Result<(usize, u64), ToolError> {
        let e = self
            .verifier
            .entries()
            .map_err(|e| ToolError::runtime(e.to_string()))?;
        Ok((e.len(), e.iter().map(|x| x.frames).sum()))
    }

    /// Waits (at most a second) until no more frames are being recorded: after a sender
    /// stops, its last frames may still wait in the receiver's ring.
    pub fn settle(&self) -> Result<(), ToolError> {
        let until = Instant::now() + Duration::from_secs(1);
        let mut last = self.counts()?;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.counts()?;
            if now == last {
                break;
            }
            last = now;
        }
        Ok(())
    }

    /// Detaches the program (the counts are then whole and still) and judges them.
    pub fn finish(mut self) -> Result<VerifyReport, ToolError> {
        self.verifier.detach();
        let entries = self
            .verifier
            .entries()
            .map_err(|e| ToolError::runtime(e.to_string()))?;
        let mut r = judge(&self.dev, &self.nic, &entries);
        r.no_nic_hash = self.verifier.no_hash.clone();
        r.uncounted_frames = self.verifier.uncounted();
        r.duration_s = self.t0.elapsed().as_secs_f64();
        if r.uncounted_frames > 0 {
            r.problems.push(format!(
                "{} frames were not recorded: the flow table ({} entries) was full (--max-flows)",
                r.uncounted_frames, self.max_flows
            ));
        }
        Ok(r)
    }
}

/// Watches until the duration ends or `stop` is raised; `on_tick` gets the flows and frames
/// counted so far each interval.
pub fn run(
    cfg: &VerifyConfig,
    stop: &Arc<AtomicBool>,
    on_tick: &mut dyn FnMut(usize, u64),
) -> Result<VerifyReport, ToolError> {
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    let w = start(&cfg.dev, cfg.max_flows)?;
    loop {
        let next = Instant::now() + interval;
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            if duration.is_some_and(|d| w.t0.elapsed() >= d) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (flows, frames) = w.counts()?;
        on_tick(flows, frames);
        if stop.load(Ordering::Relaxed) || duration.is_some_and(|d| w.t0.elapsed() >= d) {
            break;
        }
    }
    w.finish()
}

/// The report for what the program recorded on `dev`, against the NIC's model (pure).
pub fn judge(dev: &str, nic: &crate::nic::NicReport, entries: &[SeenEntry]) -> VerifyReport {
    let model = nic_model(nic);
    let mut seen = Vec::new();
    let mut other = 0;
    for e in entries {
        let Some((s, d)) = e.addrs else {
            other += e.frames;
            continue;
        };
        let Ok(tuple) = Tuple::new(s, d, e.ports) else {
            other += e.frames;
            continue;
        };
        seen.push((
            Seen {
                tuple,
                proto: e.proto,
                queue: e.queue,
                nic_hash: e.hash.ok().map(|h| h.0),
                packets: e.frames,
            },
            e,
        ));
    }
    seen.sort_by_key(|(s, e)| (s.queue, endpoint(s.tuple.src(), e.ports.map(|p| p.0))));
    let row = |s: &Seen, e: &SeenEntry| FlowCheck {
        src: endpoint(s.tuple.src(), e.ports.map(|p| p.0)),
        dst: endpoint(s.tuple.dst(), e.ports.map(|p| p.1)),
        frames: s.packets,
        queue: s.queue,
        nic_hash: s.nic_hash.map(|h| format!("{h:08x}")),
        nic_hash_type: e.hash.ok().map(|h| h.1),
        nic_hash_type_name: e.hash.ok().map(|h| hash_type_name(h.1)),
        our_hash: None,
        expected_queue: None,
        verdict: "not compared".into(),
    };
    let mut problems = Vec::new();
    let (flows, summary, model_words) = match &model {
        Ok(m) => {
            let two = |t: &Tuple, proto: u8| {
                let v6 = usize::from(matches!(t.src(), std::net::IpAddr::V6(_)));
                match proto {
                    17 => m.two_tuple[v6],
                    6 => m.two_tuple[2 + v6],
                    _ => false,
                }
            };
            let mm = Model {
                hasher: &m.hasher,
                queue: &m.queue,
                symmetric: m.symmetric,
                two_tuple: &two,
            };
            let plain: Vec<Seen> = seen.iter().map(|(s, _)| s.clone()).collect();
            let checked = check(&plain, &mm);
            let t = tally(&checked);
            let mut rows = Vec::new();
            for (c, (_, e)) in checked.iter().zip(&seen) {
                let mut r = row(&c.seen, e);
                r.our_hash = Some(format!("{:08x}", c.our_hash));
                r.expected_queue = Some(c.expected_queue);
                r.verdict = c.verdict.name().into();
                if c.verdict.failed() {
                    problems.push(format!(
                        "{} → {}: {} (NIC hash {}, ours {:08x}; queue {}, the table's {})",
                        r.src,
                        r.dst,
                        c.verdict.name(),
                        r.nic_hash.as_deref().unwrap_or("none"),
                        c.our_hash,
                        c.seen.queue,
                        c.expected_queue
                    ));
                }
                rows.push(r);
            }
            let words = format!(
                "{}'s own RSS: Toeplitz over key {}, its {}-entry table, transform {}",
                dev,
                nic.rss
                    .value
                    .as_ref()
                    .and_then(|c| c.first())
                    .map_or(String::new(), |c| c.key.clone()),
                match &m.queue {
                    QueueModel::Reta(r) => r.entries().len(),
                    _ => 0,
                },
                m.symmetric.name()
            );
            (
                rows,
                VerifySummary {
                    compared: true,
                    flows: t.flows,
                    with_nic_hash: t.with_hash,
                    hash_agrees: t.hash_agrees,
                    queue_agrees: t.queue_agrees,
                    wrong_queue: t.wrong_queue,
                },
                words,
            )
        }
        Err(why) => {
            let rows: Vec<FlowCheck> = seen.iter().map(|(s, e)| row(s, e)).collect();
            let with = rows.iter().filter(|r| r.nic_hash.is_some()).count();
            (
                rows,
                VerifySummary {
                    compared: false,
                    flows: seen.len(),
                    with_nic_hash: with,
                    hash_agrees: 0,
                    queue_agrees: 0,
                    wrong_queue: 0,
                },
                format!(
                    "nothing to compare with: {why}. The flows below are what the driver did; \
                     its hash is not Toeplitz over a key we can read (on veth it is the \
                     kernel's own flow hash, and the queue is the sender's transmit queue)"
                ),
            )
        }
    };
    VerifyReport {
        dev: dev.into(),
        duration_s: 0.0,
        model: model_words,
        no_nic_hash: None,
        frames: seen.iter().map(|(s, _)| s.packets).sum(),
        other_frames: other,
        uncounted_frames: 0,
        flows,
        summary,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::{FlowHash, Item, NicReport, RssContext};
    use flowlane_rss::{Key, Reta};
    use std::net::{IpAddr, Ipv4Addr};

    fn item<T>(v: T) -> Item<T> {
        Item {
            via: Some("netlink".into()),
            value: Some(v),
            missing: None,
        }
    }

    fn missing<T>() -> Item<T> {
        Item {
            via: None,
            value: None,
            missing: Some("the driver does not support it (EOPNOTSUPP)".into()),
        }
    }

    /// A NIC with the Microsoft key, a 4-queue table, UDP/IPv4 hashed on the 2-tuple.
    fn nic(udp4_fields: &[&str]) -> NicReport {
        NicReport {
            dev: "eth0".into(),
            ethtool_netlink: true,
            driver: missing(),
            rss: item(vec![RssContext {
                context: 0,
                hash_function: Some("toeplitz".into()),
                input_xfrm: Some("none".into()),
                key: Key::MICROSOFT.to_hex(),
                indir: Reta::round_robin(128, 4)
                    .expect("table")
                    .entries()
                    .iter()
                    .map(|&q| u32::from(q))
                    .collect(),
            }]),
            hash_fields: item(vec![FlowHash {
                flow_type: "udp4".into(),
                fields: udp4_fields.iter().map(|s| s.to_string()).collect(),
                discard: false,
            }]),
            channels: missing(),
            rings: missing(),
            offloads: crate::nic::not_read(),
            coalesce: crate::nic::not_read(),
            pause: Item {
                via: None,
                value: None,
                missing: Some("EOPNOTSUPP".into()),
            },
            host: flowlane_lab::nic::read_nic(std::path::Path::new("/nonexistent"), "eth0"),
            read_ms: 0.0,
        }
    }

    fn entry(sport: u16, proto: u8, hashed_on: Option<(u16, u16)>, queue_shift: u32) -> SeenEntry {
        let (s, d) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let h = Toeplitz::new(&Key::MICROSOFT);
        let t = Tuple::new(IpAddr::V4(s), IpAddr::V4(d), hashed_on).expect("tuple");
        let hash = h.hash(&t);
        let q = QueueModel::Reta(Reta::round_robin(128, 4).expect("table")).queue(hash);
        SeenEntry {
            queue: (q + queue_shift) % 4,
            hash: Ok((hash, 0)),
            addrs: Some((IpAddr::V4(s), IpAddr::V4(d))),
            ports: Some((sport, 9000)),
            proto,
            frames: 10,
        }
    }

    #[test]
    fn a_two_tuple_udp_nic_and_a_wrong_ring_are_judged_by_protocol() {
        let n = nic(&["ip-src", "ip-dst"]);
        let entries = vec![
            // UDP hashed on the addresses, on the right queue.
            entry(1000, 17, None, 0),
            // TCP hashed on the 4-tuple (tcp4's fields were not given: the 4-tuple).
            entry(1001, 6, Some((1001, 9000)), 0),
            // UDP with the right hash on the wrong ring: the driver's fault, named.
            entry(1002, 17, None, 1),
        ];
        let r = judge("eth0", &n, &entries);
        let v: Vec<&str> = r.flows.iter().map(|f| f.verdict.as_str()).collect();
        assert_eq!(
            v,
            vec!["agrees", "agrees", "wrong queue (hash agrees)"],
            "{r:?}"
        );
        assert_eq!(r.summary.wrong_queue, 1);
        assert!(r.summary.compared);
        assert_eq!(r.problems.len(), 1);
        assert!(r.problems[0].contains("198.18.0.1:1002") && r.problems[0].contains("wrong queue"));
        assert!(!r.ok());
        // The same frames against a NIC that hashes UDP on the 4-tuple: the UDP hashes differ.
        let r4 = judge(
            "eth0",
            &nic(&["ip-src", "ip-dst", "l4-src-port", "l4-dst-port"]),
            &entries,
        );
        assert_eq!(r4.flows[0].verdict, "hash differs");
        // A NIC without RSS: listed, not compared, not failed.
        let mut none = nic(&[]);
        none.rss = missing();
        let r0 = judge("veth0", &none, &entries);
        assert!(r0.ok() && !r0.summary.compared && r0.flows.len() == 3);
        assert!(r0.model.contains("nothing to compare"));
        assert_eq!(hash_type_name(1 | 8 | 32), "IPv4 L4 UDP");
        assert_eq!(hash_type_name(0), "none");
        assert_eq!(r.flows[0].nic_hash_type_name.as_deref(), Some("none"));
    }
}
