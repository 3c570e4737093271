//! Captures in: the Ethernet frames of a pcap or pcapng file (as tcpdump, tshark, dumpcap and
//! `flowlane sink --write` write them), read from bytes by the pcap-file crate — for
//! `flowlane blast --pcap` to send again. Only frames whole on the wire are kept: one the
//! capture cut to its snap length is counted apart, never sent cut.

use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::DataLink;

/// What a capture holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// Whole frames, in the file's order.
    pub frames: Vec<Vec<u8>>,
    /// Frames the capture cut short (its snap length), left out.
    pub cut: u64,
    /// The file was pcapng (else classic pcap).
    pub pcapng: bool,
}

/// Why a capture cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureError {
    /// Not a pcap or pcapng file (the first four bytes).
    NotACapture,
    /// Frames of another link type than Ethernet (its number, as tcpdump.org lists them).
    LinkType(u32),
    /// More frames, or frame bytes, than the caller allows.
    TooBig {
        /// What was over.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// The file is damaged at frame `at` (counted from 0).
    Damaged {
        /// Frames read before.
        at: u64,
        /// What the reader said.
        why: String,
    },
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::NotACapture => {
                write!(f, "not a pcap or pcapng file (unknown magic number)")
            }
            CaptureError::LinkType(t) => write!(
                f,
                "link type {t} is not Ethernet (1): only Ethernet frames can be sent again"
            ),
            CaptureError::TooBig { what, limit } => write!(
                f,
                "more than {limit} {what}: cut the capture first (e.g. editcap -c)"
            ),
            CaptureError::Damaged { at, why } => {
                write!(f, "damaged after {at} frames: {why}")
            }
        }
    }
}

impl std::error::Error for CaptureError {}

/// Limits on what is read into memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Frames.
    pub frames: u64,
    /// Frame bytes in all.
    pub bytes: u64,
}

/// Accumulates frames under the limits.
struct Gather {
    out: Captured,
    bytes: u64,
    limits: Limits,
}

impl Gather {
    fn add(&mut self, data: std::borrow::Cow<'_, [u8]>, orig_len: u32) -> Result<(), CaptureError> {
        if (data.len() as u64) < u64::from(orig_len) {
            self.out.cut += 1;
            return Ok(());
        }
        if self.out.frames.len() as u64 >= self.limits.frames {
            return Err(CaptureError::TooBig {
                what: "frames",
                limit: self.limits.frames,
            });
        }
        self.bytes += data.len() as u64;
        if self.bytes > self.limits.bytes {
            return Err(CaptureError::TooBig {
                what: "frame bytes",
                limit: self.limits.bytes,
            });
        }
        self.out.frames.push(data.into_owned());
        Ok(())
    }

    fn damaged(&self, why: impl ToString) -> CaptureError {
        CaptureError::Damaged {
            at: self.out.frames.len() as u64 + self.out.cut,
            why: why.to_string(),
        }
    }
}

/// Reads the Ethernet frames of a pcap or pcapng capture held in `bytes`.
pub fn read(bytes: &[u8], limits: Limits) -> Result<Captured, CaptureError> {
    let magic = bytes
        .get(..4)
        .map(|m| u32::from_be_bytes([m[0], m[1], m[2], m[3]]))
        .ok_or(CaptureError::NotACapture)?;
    let mut g = Gather {
        out: Captured::default(),
        bytes: 0,
        limits,
    };
    match magic {
        0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1 => {
            // The crate's slice parsers: the capture is in memory already (its readers
            // allocate an 8 MB buffer each, which held the fuzzer to 2 000 inputs a second).
            let (mut rest, r) = PcapParser::new(bytes).map_err(|e| g.damaged(e))?;
            let link = r.header().datalink;
            if link != DataLink::ETHERNET {
                return Err(CaptureError::LinkType(u32::from(link)));
            }
            // Raw records: the crate's checked ones refuse a frame longer than the file's snap
            // length even when it was cut to it, which is what a snap length is for.
            while !rest.is_empty() {
                let (next, p) = r.next_raw_packet(rest).map_err(|e| g.damaged(e))?;
                rest = next;
                g.add(p.data, p.orig_len)?;
            }
        }
        0x0a0d_0d0a => {
            g.out.pcapng = true;
            let (mut rest, mut r) = PcapNgParser::new(bytes).map_err(|e| g.damaged(e))?;
            while !rest.is_empty() {
                let (next, b) = r.next_block(rest).map_err(|e| g.damaged(e))?;
                rest = next;
                // Owned, so the reader is free to be asked about the interface.
                let (iface, data, orig) = match b {
                    Block::EnhancedPacket(p) => (p.interface_id, p.data.to_vec(), p.original_len),
                    Block::SimplePacket(p) => (0, p.data.to_vec(), p.original_len),
                    Block::Packet(p) => {
                        (u32::from(p.interface_id), p.data.to_vec(), p.original_len)
                    }
                    _ => continue,
                };
                let link = r
                    .interfaces()
                    .get(iface as usize)
                    .map(|i| i.linktype)
                    .ok_or_else(|| {
                        g.damaged(format!("a frame of undescribed interface {iface}"))
                    })?;
                if link != DataLink::ETHERNET {
                    return Err(CaptureError::LinkType(u32::from(link)));
                }
                g.add(data.into(), orig)?;
            }
        }
        _ => return Err(CaptureError::NotACapture),
    }
    Ok(g.out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use std::time::Duration;

    const ROOMY: Limits = Limits {
        frames: 1000,
        bytes: 1 << 20,
    };

    fn pcap(snaplen: u32, link: DataLink, frames: &[(&[u8], u32)]) -> Vec<u8> {
        let h = PcapHeader {
            snaplen,
            datalink: link,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), h).expect("header");
        for (i, (d, orig)) in frames.iter().enumerate() {
            w.write_packet(&PcapPacket::new(Duration::from_micros(i as u64), *orig, d))
                .expect("packet");
        }
        w.into_writer()
    }

    #[test]
    fn whole_frames_are_read_and_cut_ones_counted() {
        let a = [1u8; 60];
        let b = [2u8; 20];
        let bytes = pcap(
            20,
            DataLink::ETHERNET,
            &[(&a[..20], 60), (&b, 20), (&a[..20], 20)],
        );
        let c = read(&bytes, ROOMY).expect("reads");
        assert_eq!(c.frames, vec![b.to_vec(), a[..20].to_vec()]);
        assert_eq!((c.cut, c.pcapng), (1, false));
    }

    #[test]
    fn pcapng_is_read_too() {
        let mut w = PcapNgWriter::new(Vec::new()).expect("section");
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0))
            .expect("interface");
        for i in 0..3u8 {
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_secs(1),
                original_len: 61,
                data: vec![i; 61].into(),
                options: vec![],
            })
            .expect("packet");
        }
        let c = read(&w.into_inner(), ROOMY).expect("reads");
        assert_eq!(c.frames.len(), 3);
        assert_eq!(c.frames[2], vec![2u8; 61]);
        assert!(c.pcapng);
    }

    #[test]
    fn what_cannot_be_sent_is_refused_with_the_reason() {
        assert_eq!(read(b"hello", ROOMY), Err(CaptureError::NotACapture));
        assert_eq!(read(b"", ROOMY), Err(CaptureError::NotACapture));
        let raw_ip = pcap(100, DataLink::RAW, &[(&[0x45; 20], 20)]);
        assert_eq!(read(&raw_ip, ROOMY), Err(CaptureError::LinkType(101)));
        let f = [0u8; 100];
        let many = pcap(200, DataLink::ETHERNET, &[(&f[..], 100u32); 5]);
        let tight = Limits {
            frames: 4,
            bytes: 1 << 20,
        };
        assert!(matches!(
            read(&many, tight),
            Err(CaptureError::TooBig { what: "frames", .. })
        ));
        let small = Limits {
            frames: 100,
            bytes: 450,
        };
        assert!(matches!(
            read(&many, small),
            Err(CaptureError::TooBig {
                what: "frame bytes",
                ..
            })
        ));
        // Cut in the middle of a record.
        let cut = &many[..many.len() - 30];
        assert!(matches!(
            read(cut, ROOMY),
            Err(CaptureError::Damaged { at: 4, .. })
        ));
    }
}
