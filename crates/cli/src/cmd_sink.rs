//! `flowlane sink`: count and account the frames an interface receives (raw and xdp blasts).

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use flowlane_tools::sink::CaptureSpec;
use flowlane_tools::sink::{self, SinkBackend, SinkConfig, SinkEvent, SinkReport};

use crate::args::parse_duration;
use crate::args::print_json;
use crate::args::{usable_cpus, CpuList};
use crate::live::{latency_line, stop_on_signals, LiveArgs};
use crate::{CmdResult, Failure};
use flowlane_tools::doctor::RunDev;

/// Receive an interface's frames and account flowlane traffic per flow: loss, order, latency.
///
/// Per flow: frames received, lost, reordered and duplicated (from the header's sequence
/// numbers), and one-way latency — the header's transmit time against this host's clock, so
/// sender and sink must share the clock (one host, e.g. two namespaces). The counterpart of
/// `flowlane blast --mode raw|xdp`; it also counts what is not flowlane traffic.
///
/// Frames are read from an AF_PACKET RX ring (a copy of every frame the interface receives;
/// frames this host sends on it are ignored), so the kernel's own path still runs: the sink
/// watches, it does not take packets away. Needs CAP_NET_RAW. With `--backend af-xdp` the
/// frames are taken instead: an XDP program redirects each receive queue's frames to an
/// AF_XDP socket read by a worker of its own (on `--cpus` in turn), and the kernel never
/// makes an skb of them — the fastest way in; the interface must have no other XDP program.
/// Only unicast IP is taken: ARP, neighbour discovery, multicast and broadcast go on to the
/// kernel (counted as `to_kernel`), so senders can still resolve this host's address.
///
/// What is counted where: `malformed` (headers cut short or inconsistent, or a wrong UDP
/// checksum where one can be checked), `foreign` (UDP to the watched port without the flowlane
/// header), `other` (not IP/UDP, fragments, other ports), `ring drops` (frames the kernel could
/// not copy in because the ring was full: the sink was the limit). Lost counts the gaps below
/// each flow's highest sequence number; frames lost after a flow's last one cannot be seen.
///
/// Examples:
///   flowlane sink --dev veth1 --port 9000 --duration 10
///   flowlane sink --dev veth1 --count 100000 --json
///   flowlane sink --dev veth1 --idle 2       # stop 2 s after the traffic stops
///   flowlane sink --dev veth1 -t 5 --write rx.pcap --write-count 1000 --snaplen 128
///
/// Captures: `--write FILE` writes the frames read to a pcap file (nanosecond timestamps from
/// the kernel, Ethernet; tcpdump, tshark and `flowlane blast --pcap` read it) — all of them,
/// the first `--write-count`, every `--write-every`-th, cut to `--snaplen` bytes. The report
/// says how many were written; a write that fails (disk full) ends the run with exit code 1.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SinkArgs {
    /// Interface to receive on.
    #[arg(long)]
    dev: String,

    /// Write the whole one-way latency distribution to this file in HdrHistogram's
    /// percentile-distribution text (.hgrm), in microseconds; a name ending in .hlog gets
    /// HdrHistogram's log instead (the compressed interchange form, nanoseconds, lossless).
    #[arg(long)]
    histogram: Option<std::path::PathBuf>,

    /// Write the frames read to this pcap file (created or truncated).
    #[arg(long, value_name = "FILE")]
    write: Option<std::path::PathBuf>,

    /// With --write: keep only the first N frames chosen.
    #[arg(long, value_name = "N", requires = "write", value_parser = clap::value_parser!(u64).range(1..))]
    write_count: Option<u64>,

    /// With --write: keep every Nth frame read (1: all).
    #[arg(long, value_name = "N", requires = "write", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    write_every: u64,

    /// With --write: keep at most this many bytes of each frame (the length on the wire is
    /// kept beside it).
    #[arg(long, value_name = "BYTES", requires = "write", default_value_t = 65_535, value_parser = clap::value_parser!(u32).range(14..=262_144))]
    snaplen: u32,

    /// Account only UDP to this destination port (others are counted as `other`).
    #[arg(long)]
    port: Option<u16>,

    /// Stop after this many flowlane frames.
    #[arg(long)]
    count: Option<u64>,

    /// Stop after this many seconds.
    #[arg(long, short = 't', value_parser = parse_duration)]
    duration: Option<f64>,

    /// Stop once no frame came for this many seconds (after the first one).
    #[arg(long, value_parser = parse_duration)]
    idle: Option<f64>,

    /// CPU to pin the sink to. Default: the last online CPU (blast defaults to CPU 0).
    #[arg(long, conflicts_with = "cpus")]
    cpu: Option<usize>,

    /// How frames are read: af-packet (a copy; the kernel's path still runs) or af-xdp (taken
    /// from the kernel, one worker per receive queue).
    #[arg(long, value_enum, default_value_t = BackendArg::AfPacket)]
    backend: BackendArg,

    /// With --backend af-xdp: CPUs for the receive queues' workers, in turn (e.g. `1` or
    /// `0-1`). Default: as --cpu.
    #[arg(long, value_parser = crate::args::parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Slots in the receive ring at most (each holds one frame of the interface's MTU; fewer
    /// where --ring-memory says so). AF_XDP: UMEM frames per queue.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(64..=1_048_576))]
    ring: u64,

    #[command(flatten)]
    rings: crate::args::RingMemoryArg,

    /// 5-tuples counted at once per worker (a flow table of this many records, allocated at
    /// the start: ~80 bytes each); a new tuple beyond it evicts the least recently seen of
    /// its buckets, counted with its frames.
    #[arg(long, default_value_t = 65_536, value_parser = parse_tuple_capacity)]
    tuple_capacity: usize,

    /// Seconds a 5-tuple may go without a frame before it expires (a tuple that comes back
    /// later is counted as a new one, as a router's flow table would).
    #[arg(long, value_parser = parse_duration, default_value_t = 30.0)]
    tuple_idle: f64,

    /// IP fragments are reassembled per worker (its receive queue) and the datagrams made
    /// whole accounted as whole ones: at most this many datagrams in reassembly at once (the
    /// least recently started is evicted beyond, counted).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    reasm_contexts: u64,

    /// Bytes the datagrams in reassembly may hold per worker (beyond: the datagram is
    /// dropped, counted as `memory`). Linux's default: 4 MiB.
    #[arg(long, default_value_t = 4 << 20, value_parser = clap::value_parser!(u64).range(1500..=1 << 32))]
    reasm_bytes: u64,

    /// Fragments a datagram may have (45 carry a 64 KiB datagram at MTU 1500).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(2..))]
    reasm_fragments: u16,

    /// Seconds a datagram may take from its first fragment (Linux: 30 s).
    #[arg(long, value_parser = parse_duration, default_value_t = 30.0)]
    reasm_timeout: f64,

    #[command(flatten)]
    live: LiveArgs,

    #[command(flatten)]
    shard: crate::shard::ShardArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendArg {
    /// An AF_PACKET RX ring: a copy of every frame.
    AfPacket,
    /// AF_XDP sockets: the frames taken from the kernel.
    AfXdp,
}

impl From<BackendArg> for SinkBackend {
    fn from(b: BackendArg) -> SinkBackend {
        match b {
            BackendArg::AfPacket => SinkBackend::AfPacket,
            BackendArg::AfXdp => SinkBackend::AfXdp,
        }
    }
}

pub fn run(a: SinkArgs) -> CmdResult {
    if let Some(p) = &a.histogram {
        crate::side::check("--histogram", p)?;
    }
    let cfg = SinkConfig {
        sharding: a.shard.sharding()?,
        timed_flows: None,
        backend: a.backend.into(),
        cpus: match &a.cpus {
            Some(c) => usable_cpus(Some(c))?,
            None => Vec::new(),
        },
        metrics: a.live.metrics,
        dev: a.dev.clone(),
        port: a.port,
        count: a.count,
        duration_s: a.duration,
        idle_s: a.idle,
        cpu: match a.cpu {
            Some(c) => usable_cpus(Some(&CpuList(vec![c])))?[0],
            // The last usable CPU: senders default to the first.
            None => usable_cpus(None)?.last().copied().unwrap_or(0),
        },
        ring: a.ring as usize,
        ring_memory: a.rings.bytes(),
        tuples: flowlane_tools::sink::TupleSpec {
            capacity: a.tuple_capacity,
            idle_s: a.tuple_idle,
        },
        reasm: flowlane_tools::sink::ReasmSpec {
            contexts: a.reasm_contexts as usize,
            bytes: a.reasm_bytes as usize,
            max_fragments: a.reasm_fragments,
            timeout_s: a.reasm_timeout,
        },
        interval_s: a.live.interval,
        write: a.write.as_ref().map(|path| CaptureSpec {
            path: path.clone(),
            count: a.write_count,
            every: a.write_every,
            snaplen: a.snaplen,
        }),
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let (mut log, stream) = (a.live.log(), a.live.stream());
    let host = crate::host::before_run(
        &if cfg.cpus.is_empty() {
            vec![cfg.cpu]
        } else {
            cfg.cpus.clone()
        },
        &[RunDev::here(&cfg.dev)],
    );
    let mut r = sink::run(&cfg, &stop, &mut |event| match event {
        SinkEvent::Started(s) => {
            log.line(&format!(
                "flowlane sink: {} (MTU {}), {}, {}, {}{}",
                cfg.dev,
                s.mtu,
                match cfg.port {
                    Some(p) => format!("UDP port {p}"),
                    None => "any UDP port".into(),
                },
                if cfg.cpus.is_empty() {
                    format!("CPU {}", cfg.cpu)
                } else {
                    format!("CPUs {:?}", cfg.cpus)
                },
                match &s.rings {
                    Some(m) => m.line(),
                    None => format!("{} slots per queue", cfg.ring),
                },
                if cfg.backend == SinkBackend::AfXdp {
                    ", AF_XDP (frames taken from the kernel)"
                } else {
                    ""
                }
            ));
            crate::host::say(&mut log, &host);
        }
        SinkEvent::Tick(t) if !a.live.quiet || stream.on() => {
            stream.interval(&t);
            if a.live.quiet {
                return;
            }
            let secs = t.interval_s.max(1e-9);
            log.line(&format!(
                "{:>7.1}s  rx {:>10.0} pps {:>9.1} Mbps  ring drops {}  malformed {}  foreign {}",
                t.elapsed_s,
                t.rx_packets as f64 / secs,
                t.rx_bytes as f64 * 8.0 / secs / 1e6,
                t.ring_drops,
                t.malformed,
                t.foreign
            ));
        }
        SinkEvent::Tick(_) => {}
    })
    .map_err(Failure::from_tool)?;
    r.host = Some(host);
    if a.live.json {
        print_json(&r)?;
    } else if stream.on() {
        stream.last(&r)?;
    } else {
        print_summary(&r);
    }
    crate::live::write_histogram(a.histogram.as_deref(), r.histogram.as_ref())?;
    for e in &r.errors {
        errln!("flowlane: sink stopped: {e}");
    }
    Ok(if r.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_summary(r: &SinkReport) {
    outln!();
    outln!(
        "received {} frames ({} bytes) in {} s: {} pps",
        r.rx_packets,
        r.rx_bytes,
        r.duration_s,
        r.rx_pps
    );
    if let Some(b) = &r.backend {
        outln!("{}", crate::args::backend_line(b));
    }
    outln!(
        "flowlane: {} frames in {} flow(s): lost {}, reordered {}, duplicates {}",
        r.flowlane_packets,
        r.flows.len(),
        r.lost,
        r.reordered,
        r.duplicates
    );
    outln!(
        "not accounted: {} malformed ({} bad checksum), {} foreign, {} other, {} truncated",
        r.malformed,
        r.bad_checksum,
        r.foreign,
        r.other,
        r.truncated
    );
    if r.ring_drops > 0 {
        outln!(
            "{} frames were dropped because the ring was full: the sink, not the path, lost them \
             (a larger --ring, or a less busy CPU)",
            r.ring_drops
        );
    }
    if r.clock_skew > 0 {
        outln!(
            "{} frames were stamped after they arrived: the sender's clock is not this host's, \
             latency is not meaningful",
            r.clock_skew
        );
    }
    if let Some(c) = &r.capture {
        outln!(
            "capture: {} of {} frames written to {} ({} cut to the snap length, {} bytes)",
            c.written,
            c.seen,
            c.path.display(),
            c.cut,
            c.bytes
        );
    }
    if let Some(l) = latency_line(r.latency_ns.as_ref(), "one-way (send → sink)") {
        outln!("{l}");
    }
    if let Some(c) = r.cpu_ns_per_packet {
        outln!("cost: {c:.0} ns of sink CPU per frame (thread CPU clock)");
    }
    outln!("{}", crate::live::pmu_line("frame", &r.pmu));
    if r.checksum_not_filled > 0 {
        outln!(
            "{} frames carried a checksum left to the sender's offload (not filled in): accounted, \
             not judged",
            r.checksum_not_filled
        );
    }
    if let Some(k) = r.to_kernel {
        outln!("left to the kernel (not unicast IP: ARP, neighbour discovery, multicast): {k}");
    }
    if let Some(t) = &r.tuples {
        outln!(
            "5-tuples: {} seen, {} held at the end, {} expired, {} evicted (tables of {} per \
             worker, {:.1} MiB); their frames: {} held, {} expired, {} evicted",
            t.seen,
            t.live,
            t.expired,
            t.evicted,
            t.capacity,
            t.memory_bytes as f64 / f64::from(1 << 20),
            t.frames_live,
            t.frames_expired,
            t.frames_evicted
        );
    }
    if let Some(f) = &r.fragments {
        outln!(
            "IP fragments: {} in, {} datagrams made whole of {}; dropped: {} overlapping, {} \
             duplicates, {} past the fragment limit, {} too big, {} over the byte budget, {} \
             malformed, {} timed out, {} evicted; {} still waiting ({} datagrams, {} bytes)",
            f.fragments,
            f.datagrams,
            f.datagram_fragments,
            f.overlap,
            f.duplicate,
            f.too_many,
            f.too_big,
            f.memory,
            f.malformed,
            f.timed_out,
            f.evicted,
            f.held_fragments,
            f.held_contexts,
            f.held_bytes
        );
    }
    if r.split_flows > 0 {
        outln!(
            "{} flows came in on more than one receive queue: their loss and order are counted \
             per queue (a row each)",
            r.split_flows
        );
    }
    for z in &r.by_size {
        outln!(
            "  size {:>5} B ({} flow(s)): received {}, lost {}, reordered {}, duplicates {}",
            z.frame_bytes,
            z.flows,
            z.rx_packets,
            z.lost,
            z.reordered,
            z.duplicates
        );
    }
    if r.flows.len() <= 16 {
        for f in &r.flows {
            outln!(
                "  flow {:>3}{} {} -> {}: received {}, lost {}, reordered {}, duplicates {}",
                f.id,
                f.queue.map_or(String::new(), |q| format!(" (queue {q})")),
                f.src.as_deref().unwrap_or("?"),
                f.dst.as_deref().unwrap_or("?"),
                f.rx_packets,
                f.lost,
                f.reordered,
                f.duplicates
            );
        }
    }
}

fn parse_tuple_capacity(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of tuples"))?;
    if (1..=(1 << 28)).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} tuples: give 1 to 268435456"))
    }
}
