//! Captures out: the frames a worker reads, written to a pcap file (`sink --write`) through
//! the pcap-file crate — nanosecond timestamps, Ethernet link type, as tcpdump and tshark read
//! them. Which frames are kept: the first `count` (or all), every `every`-th of those read,
//! each cut to `snaplen` bytes (the file keeps the length on the wire beside it).
//!
//! Writing goes through a 1 MiB buffer on the worker's thread: a frame costs a copy, and a
//! write to the file once a megabyte has gathered. A write that fails (disk full) ends the
//! worker with the reason — a capture is never cut short without saying so.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

/// What to keep.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct CaptureSpec {
    /// The file (created, or truncated).
    pub path: PathBuf,
    /// Keep at most this many frames (`None`: every one chosen).
    pub count: Option<u64>,
    /// Keep every `every`-th frame read (1: all).
    pub every: u64,
    /// Keep at most this many bytes of each frame.
    pub snaplen: u32,
}

/// What a capture wrote.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct CaptureReport {
    /// The file.
    pub path: PathBuf,
    /// Frames offered (every frame read).
    pub seen: u64,
    /// Frames written.
    pub written: u64,
    /// Of those, frames cut to the snap length.
    pub cut: u64,
    /// Frame bytes written (after cutting).
    pub bytes: u64,
}

/// An open capture file.
#[derive(Debug)]
pub struct Capture {
    spec: CaptureSpec,
    /// `None` once finished.
    out: Option<PcapWriter<BufWriter<File>>>,
    report: CaptureReport,
    /// A frame whose VLAN tag the kernel took off, with the tag put back.
    tagged: Vec<u8>,
}

/// 802.1Q's EtherType.
const TPID: [u8; 2] = [0x81, 0x00];

impl Capture {
    /// Creates the file and writes the pcap header.
    pub fn create(spec: &CaptureSpec) -> Result<Capture, String> {
        if spec.every == 0 {
            return Err("every 0th frame: keep every 1st (all) or more".into());
        }
        if spec.snaplen < 14 {
            return Err(format!(
                "a snap length of {} bytes does not hold an Ethernet header (14)",
                spec.snaplen
            ));
        }
        let file = File::create(&spec.path).map_err(|e| what(&spec.path, "create", &e))?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: spec.snaplen,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: if cfg!(target_endian = "big") {
                Endianness::Big
            } else {
                Endianness::Little
            },
        };
        let out = PcapWriter::with_header(BufWriter::with_capacity(1 << 20, file), header)
            .map_err(|e| format!("{}: writing the pcap header: {e}", spec.path.display()))?;
        Ok(Capture {
            report: CaptureReport {
                path: spec.path.clone(),
                ..CaptureReport::default()
            },
            spec: spec.clone(),
            out: Some(out),
            tagged: Vec::new(),
        })
    }

    /// Whether the next frame offered will be written: a reader may skip the work of
    /// preparing one that will not.
    #[inline]
    pub fn wants(&self) -> bool {
        self.spec.count.is_none_or(|c| self.report.written < c)
            && self.report.seen.is_multiple_of(self.spec.every)
    }

    /// Offers one frame read at `ts_ns` (CLOCK_REALTIME; 0: now), `wire_len` bytes long on
    /// the wire (`data` may be shorter when the ring cut it), with the VLAN tag the kernel
    /// took off (put back in the file, as libpcap does).
    pub fn offer(
        &mut self,
        ts_ns: u64,
        data: &[u8],
        wire_len: usize,
        vlan: Option<u16>,
    ) -> Result<(), String> {
        let keep = self.wants();
        self.report.seen += 1;
        if !keep {
            return Ok(());
        }
        let (data, wire_len) = match vlan {
            Some(tci) if data.len() >= 12 => {
                self.tagged.clear();
                self.tagged.extend_from_slice(&data[..12]);
                self.tagged.extend_from_slice(&TPID);
                self.tagged.extend_from_slice(&tci.to_be_bytes());
                self.tagged.extend_from_slice(&data[12..]);
                (&self.tagged[..], wire_len + 4)
            }
            _ => (data, wire_len),
        };
        let snap = data.len().min(self.spec.snaplen as usize);
        let ts = if ts_ns == 0 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
        } else {
            Duration::from_nanos(ts_ns)
        };
        let orig = u32::try_from(wire_len.max(snap)).unwrap_or(u32::MAX);
        let Some(out) = self.out.as_mut() else {
            return Err(format!(
                "{}: written to after the end",
                self.spec.path.display()
            ));
        };
        out.write_packet(&PcapPacket::new(ts, orig, &data[..snap]))
            .map_err(|e| format!("{}: {e}", self.spec.path.display()))?;
        self.report.written += 1;
        self.report.bytes += snap as u64;
        if snap < wire_len {
            self.report.cut += 1;
        }
        Ok(())
    }

    /// Writes what is buffered out and closes the file; what was written. Later offers fail.
    pub fn finish(&mut self) -> Result<CaptureReport, String> {
        let path = &self.spec.path;
        if let Some(out) = self.out.take() {
            let mut w = out.into_writer();
            w.flush().map_err(|e| what(path, "write", &e))?;
            w.get_ref()
                .sync_data()
                .map_err(|e| what(path, "sync", &e))?;
        }
        Ok(self.report.clone())
    }

    /// What was written so far.
    pub fn report(&self) -> &CaptureReport {
        &self.report
    }
}

fn what(path: &Path, doing: &str, e: &std::io::Error) -> String {
    format!("{}: cannot {doing} the capture: {e}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcap::PcapReader;

    fn spec(name: &str, count: Option<u64>, every: u64, snaplen: u32) -> CaptureSpec {
        CaptureSpec {
            path: std::env::temp_dir().join(format!(
                "flowlane-capture-{name}-{}.pcap",
                std::process::id()
            )),
            count,
            every,
            snaplen,
        }
    }

    fn read(path: &Path) -> Vec<(Duration, u32, Vec<u8>)> {
        let mut r = PcapReader::new(File::open(path).expect("open")).expect("header");
        assert_eq!(r.header().datalink, DataLink::ETHERNET);
        assert_eq!(r.header().ts_resolution, TsResolution::NanoSecond);
        let mut out = Vec::new();
        while let Some(p) = r.next_raw_packet() {
            let p = p.expect("packet");
            out.push((
                Duration::new(u64::from(p.ts_sec), p.ts_frac),
                p.orig_len,
                p.data.to_vec(),
            ));
        }
        out
    }

    #[test]
    fn every_nth_of_the_first_n_cut_to_the_snap_length() {
        let s = spec("nth", Some(3), 2, 20);
        let mut c = Capture::create(&s).expect("create");
        for i in 0..10u8 {
            let frame = vec![i; 30];
            c.offer(1_000_000_000 + u64::from(i), &frame, 30, None)
                .expect("offer");
        }
        let r = c.finish().expect("finish");
        assert_eq!((r.seen, r.written, r.cut, r.bytes), (10, 3, 3, 60));
        let got = read(&s.path);
        // Frames 0, 2, 4: every second, the first three of those.
        assert_eq!(got.len(), 3);
        for (k, (ts, orig, data)) in got.iter().enumerate() {
            let i = 2 * k as u8;
            assert_eq!(*ts, Duration::new(1, u32::from(i)));
            assert_eq!(*orig, 30);
            assert_eq!(data, &vec![i; 20]);
        }
        std::fs::remove_file(&s.path).ok();
    }

    #[test]
    fn a_tag_the_kernel_took_off_is_put_back() {
        let s = spec("vlan", None, 1, 65_535);
        let mut c = Capture::create(&s).expect("create");
        let frame: Vec<u8> = (0..60).collect();
        c.offer(5, &frame, 60, Some(0x0123)).expect("offer");
        c.offer(6, &frame, 60, None).expect("offer");
        let r = c.finish().expect("finish");
        assert_eq!((r.written, r.cut, r.bytes), (2, 0, 124));
        let got = read(&s.path);
        let tagged = &got[0].2;
        assert_eq!(got[0].1, 64);
        assert_eq!(&tagged[..12], &frame[..12]);
        assert_eq!(&tagged[12..16], &[0x81, 0x00, 0x01, 0x23]);
        assert_eq!(&tagged[16..], &frame[12..]);
        assert_eq!(got[1].2, frame);
        std::fs::remove_file(&s.path).ok();
    }

    #[test]
    fn impossible_asks_are_refused() {
        assert!(Capture::create(&spec("zero", None, 0, 100)).is_err());
        assert!(Capture::create(&spec("short", None, 1, 10)).is_err());
        let mut bad = spec("dir", None, 1, 100);
        bad.path = PathBuf::from("/nonexistent-flowlane-dir/x.pcap");
        let e = Capture::create(&bad).expect_err("no such directory");
        assert!(e.contains("cannot create"), "{e}");
    }
}
