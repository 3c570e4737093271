//! `blast --pcap FILE`: a capture's Ethernet frames sent again — stamped (every UDP frame
//! with room carries the flowlane header of its flow, so sink accounts loss, order and
//! latency per flow of the capture) or verbatim (byte for byte, counted at the far end by the
//! interface's counters or a second capture).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;

use super::sender::{Flow, ReplayFrame};
use flowlane_wire::pcap::{self, Limits};
use flowlane_wire::{FrameError, Template};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// Most frames read from a capture (each sender thread keeps its share in memory).
pub const MAX_FRAMES: u64 = 1_000_000;
/// Most frame bytes read from a capture.
pub const MAX_BYTES: u64 = 256 << 20;

/// How a capture's frames are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplayMode {
    /// UDP frames with room for it carry the flowlane header (flows: the capture's distinct
    /// address and port pairs); frames that cannot are left out and counted by reason.
    Stamp,
    /// Every frame byte for byte.
    Verbatim,
}

/// Where frames come from instead of being built (`--pcap`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PcapSource {
    /// The capture (pcap or pcapng, Ethernet).
    pub path: PathBuf,
    /// How its frames are sent.
    pub mode: ReplayMode,
}

/// What was made of a capture (in the report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReplayReport {
    /// The file.
    pub file: String,
    /// How its frames are sent.
    pub mode: ReplayMode,
    /// Frames in the file.
    pub frames_in_file: u64,
    /// Frames sent (one pass over them; `--count` or `--duration` go round again).
    pub frames_used: u64,
    /// Flows stamped (stamp mode).
    pub flows: u64,
    /// The MACs were rewritten (this interface's as source, `--dst-mac` or the neighbour's
    /// as destination); else as captured.
    pub macs_rewritten: bool,
    /// Frames left out, by reason (cut by the capture's snap length; in stamp mode what
    /// cannot carry the header).
    pub left_out: BTreeMap<String, u64>,
}

/// A capture made ready to send.
#[derive(Debug)]
pub(super) struct Replay {
    /// The frames in order, each with its flow (an index into `flows`) when stamped.
    pub frames: Vec<(Vec<u8>, Option<usize>)>,
    /// Stamp mode: the capture's flows, ids from 0.
    pub flows: Vec<Flow>,
    pub report: ReplayReport,
}

/// The first four bytes of a pcap (either byte order, µs or ns stamps) or a pcapng file.
fn capture_magic(b: &[u8]) -> Result<(), String> {
    match b.get(..4) {
        Some([0xa1, 0xb2, 0xc3, 0xd4] | [0xd4, 0xc3, 0xb2, 0xa1])
        | Some([0xa1, 0xb2, 0x3c, 0x4d] | [0x4d, 0x3c, 0xb2, 0xa1])
        | Some([0x0a, 0x0d, 0x0d, 0x0a]) => Ok(()),
        Some(m) => Err(format!(
            "not a pcap or pcapng capture (it begins {:02x}{:02x}{:02x}{:02x})",
            m[0], m[1], m[2], m[3]
        )),
        None => Err("not a capture: shorter than a file header".into()),
    }
}

impl Replay {
    /// Reads `src` and prepares its frames.
    pub fn load(
        src: &PcapSource,
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Replay, ToolError> {
        let name = src.path.display().to_string();
        let size = std::fs::metadata(&src.path)
            .map_err(|e| ToolError::usage(format!("--pcap {name}: {e}")))?
            .len();
        // The file's framing adds 16 bytes or more per frame: a file this large holds more.
        if size > MAX_BYTES + 16 * MAX_FRAMES + 4096 {
            return Err(ToolError::usage(format!(
                "--pcap {name}: {size} bytes is more than the {MAX_BYTES} bytes of frames a \
                 replay holds in memory: cut the capture first (e.g. editcap -c)"
            )));
        }
        // Devices and FIFOs too are read under the cap, the magic number checked on the
        // first bytes (`--pcap /dev/zero` took ~14 GB before it was looked at).
        let bytes = crate::input::read(
            "--pcap",
            &src.path,
            MAX_BYTES + 16 * MAX_FRAMES + 4096,
            4,
            &capture_magic,
            stop,
        )?;
        let captured = pcap::read(
            &bytes,
            Limits {
                frames: MAX_FRAMES,
                bytes: MAX_BYTES,
            },
        )
        .map_err(|e| ToolError::usage(format!("--pcap {name}: {e}")))?;
        let mut left_out = BTreeMap::new();
        if captured.cut > 0 {
            left_out.insert("cut by the capture's snap length".into(), captured.cut);
        }
        let frames_in_file = captured.frames.len() as u64 + captured.cut;
        let mut frames = Vec::with_capacity(captured.frames.len());
        let mut flows: Vec<Flow> = Vec::new();
        let mut ids: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
        for f in captured.frames {
            if f.len() < 14 {
                *left_out
                    .entry("shorter than an Ethernet header".into())
                    .or_insert(0) += 1;
                continue;
            }
            if src.mode == ReplayMode::Verbatim {
                frames.push((f, None));
                continue;
            }
            let (src_addr, dst_addr) = match flowlane_wire::UdpFrame::parse(&f) {
                Ok(u) if u.payload.len() >= flowlane_wire::HEADER_LEN => (u.src, u.dst),
                Ok(_) => {
                    *left_out
                        .entry("UDP payload shorter than the flowlane header".into())
                        .or_insert(0) += 1;
                    continue;
                }
                Err(e) => {
                    *left_out.entry(reason(&e)).or_insert(0) += 1;
                    continue;
                }
            };
            let next = flows.len();
            let i = *ids.entry((src_addr, dst_addr)).or_insert(next);
            if i == next {
                let id = u16::try_from(next).map_err(|_| {
                    ToolError::usage(format!(
                        "--pcap {name}: more than 65536 flows (address and port pairs) to stamp"
                    ))
                })?;
                flows.push(Flow {
                    id,
                    src: src_addr,
                    dst: dst_addr,
                });
            }
            frames.push((f, Some(i)));
        }
        if frames.is_empty() {
            let why = left_out
                .iter()
                .map(|(r, n)| format!("{n} {r}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ToolError::usage(format!(
                "--pcap {name}: no frame to send ({})",
                if why.is_empty() {
                    "the capture is empty".to_string()
                } else {
                    format!(
                        "left out: {why}{}",
                        if src.mode == ReplayMode::Stamp {
                            "; --pcap-mode verbatim sends frames as they are"
                        } else {
                            ""
                        }
                    )
                }
            )));
        }
        Ok(Replay {
            report: ReplayReport {
                file: name,
                mode: src.mode,
                frames_in_file,
                frames_used: frames.len() as u64,
                flows: flows.len() as u64,
                macs_rewritten: false,
                left_out,
            },
            frames,
            flows,
        })
    }

    /// Sender `w` of `n`'s frames: stamped ones of the flows `from..to` (the share of the
    /// flows it owns, indices made its own), or every `n`-th verbatim frame from the `w`-th.
    pub fn share(
        &self,
        w: usize,
        n: usize,
        flows: std::ops::Range<usize>,
    ) -> Result<Vec<ReplayFrame>, ToolError> {
        let mut out = Vec::new();
        for (i, (bytes, flow)) in self.frames.iter().enumerate() {
            match flow {
                Some(f) if flows.contains(f) => out.push(ReplayFrame::Stamp {
                    template: Template::from_frame(bytes.clone()).map_err(|e| {
                        ToolError::runtime(format!("captured frame {i} cannot be stamped: {e}"))
                    })?,
                    flow: f - flows.start,
                }),
                None if i % n.max(1) == w => out.push(ReplayFrame::Verbatim(bytes.clone())),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Sets every frame's source and destination MACs.
    pub fn rewrite_macs(&mut self, src: [u8; 6], dst: [u8; 6]) {
        for (f, _) in &mut self.frames {
            f[0..6].copy_from_slice(&dst);
            f[6..12].copy_from_slice(&src);
        }
        self.report.macs_rewritten = true;
    }

    /// The largest frame.
    pub fn largest(&self) -> usize {
        self.frames.iter().map(|f| f.0.len()).max().unwrap_or(0)
    }

    /// Frame sizes in order (one pass).
    pub fn sizes(&self) -> Vec<usize> {
        self.frames.iter().map(|f| f.0.len()).collect()
    }
}

/// A frame that cannot carry the header, in words (the report's key).
fn reason(e: &FrameError) -> String {
    match e {
        FrameError::NotIp(_) => "not IP".into(),
        FrameError::NotUdp(_) => "not UDP".into(),
        FrameError::Fragment => "IP fragments".into(),
        FrameError::TooShort { .. } | FrameError::Malformed(_) => "malformed".into(),
        FrameError::MixedFamilies | FrameError::TooLong(_) | FrameError::BadVlan(_) => {
            "malformed".into()
        }
    }
}
