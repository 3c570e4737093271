//! Ethernet / [802.1Q] / IPv4 or IPv6 / UDP frames: a template built once, patched per packet,
//! and a parser for the receive side. Frame sizes exclude the 4-byte Ethernet FCS (the NIC adds
//! it), as `ip -s link` and AF_PACKET count them.

use std::net::{IpAddr, SocketAddr};

use crate::checksum;
use crate::header::{FlowHeader, HEADER_LEN};

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const PROTO_UDP: u8 = 17;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSpec {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// 802.1Q VLAN id (0–4094), if tagged.
    pub vlan: Option<u16>,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port (same family as `src`).
    pub dst: SocketAddr,
    /// Frame length in bytes, Ethernet FCS excluded.
    pub frame_len: usize,
}

/// Why a frame cannot be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Source and destination are of different families.
    MixedFamilies,
    /// The frame is shorter than its headers need.
    TooShort {
        /// Bytes given (or asked for).
        len: usize,
        /// Bytes the headers need.
        need: usize,
    },
    /// Longer than an IP datagram can be.
    TooLong(usize),
    /// A VLAN id above 4094.
    BadVlan(u16),
    /// Not IPv4 or IPv6 (the EtherType).
    NotIp(u16),
    /// Not UDP (the IP protocol / next header).
    NotUdp(u8),
    /// A fragment (only whole datagrams are parsed).
    Fragment,
    /// A header field is inconsistent (name of the field).
    Malformed(&'static str),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::MixedFamilies => {
                write!(f, "source and destination are different IP families")
            }
            FrameError::TooShort { len, need } => {
                write!(f, "{len} bytes is shorter than the {need} bytes of headers")
            }
            FrameError::TooLong(n) => write!(f, "{n} bytes is longer than an IP datagram can be"),
            FrameError::BadVlan(v) => write!(f, "VLAN id {v} is out of range (0-4094)"),
            FrameError::NotIp(t) => write!(f, "EtherType {t:#06x} is not IPv4 or IPv6"),
            FrameError::NotUdp(p) => write!(f, "IP protocol {p} is not UDP"),
            FrameError::Fragment => write!(f, "an IP fragment"),
            FrameError::Malformed(what) => write!(f, "malformed {what}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Header bytes before the UDP payload for a family and tagging.
pub fn headers_len(v6: bool, vlan: bool) -> usize {
    ETH_LEN + if vlan { VLAN_LEN } else { 0 } + if v6 { IPV6_LEN } else { IPV4_LEN } + UDP_LEN
}

/// A built frame and where its parts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The frame, checksums valid.
    pub bytes: Vec<u8>,
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the UDP header.
    pub l4: usize,
    /// Offset of the payload.
    pub payload: usize,
    /// IPv6 (else IPv4).
    pub v6: bool,
}

impl Template {
    /// Builds the frame: IPv4 with DF set, TTL 64, ID 0; IPv6 hop limit 64, flow label 0; a
    /// payload of bytes counting up from 0.
    pub fn build(s: &TemplateSpec) -> Result<Template, FrameError> {
        let v6 = match (s.src.ip(), s.dst.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => false,
            (IpAddr::V6(_), IpAddr::V6(_)) => true,
            _ => return Err(FrameError::MixedFamilies),
        };
        if let Some(v) = s.vlan {
            if v > 4094 {
                return Err(FrameError::BadVlan(v));
            }
        }
        let need = headers_len(v6, s.vlan.is_some());
        if s.frame_len < need {
            return Err(FrameError::TooShort {
                len: s.frame_len,
                need,
            });
        }
        let l3 = ETH_LEN + if s.vlan.is_some() { VLAN_LEN } else { 0 };
        let l4 = l3 + if v6 { IPV6_LEN } else { IPV4_LEN };
        let payload = l4 + UDP_LEN;
        let udp_len = s.frame_len - l4;
        if udp_len > 0xffff {
            return Err(FrameError::TooLong(s.frame_len));
        }
        let mut b = vec![0u8; s.frame_len];
        b[0..6].copy_from_slice(&s.dst_mac);
        b[6..12].copy_from_slice(&s.src_mac);
        let ethertype = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
        if let Some(v) = s.vlan {
            b[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            b[14..16].copy_from_slice(&v.to_be_bytes());
            b[16..18].copy_from_slice(&ethertype.to_be_bytes());
        } else {
            b[12..14].copy_from_slice(&ethertype.to_be_bytes());
        }
        let (src_ip, dst_ip): (Vec<u8>, Vec<u8>) = match (s.src.ip(), s.dst.ip()) {
            (IpAddr::V4(a), IpAddr::V4(c)) => (a.octets().to_vec(), c.octets().to_vec()),
            (IpAddr::V6(a), IpAddr::V6(c)) => (a.octets().to_vec(), c.octets().to_vec()),
            _ => return Err(FrameError::MixedFamilies),
        };
        if v6 {
            let ip = &mut b[l3..l4];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = PROTO_UDP;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&src_ip);
            ip[24..40].copy_from_slice(&dst_ip);
        } else {
            let ip = &mut b[l3..l4];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((udp_len + IPV4_LEN) as u16).to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = PROTO_UDP;
            ip[12..16].copy_from_slice(&src_ip);
            ip[16..20].copy_from_slice(&dst_ip);
            let c = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        {
            let udp = &mut b[l4..payload];
            udp[0..2].copy_from_slice(&s.src.port().to_be_bytes());
            udp[2..4].copy_from_slice(&s.dst.port().to_be_bytes());
            udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        }
        for (i, x) in b[payload..].iter_mut().enumerate() {
            *x = i as u8;
        }
        let acc = checksum::pseudo_header(&src_ip, &dst_ip, udp_len as u32);
        let mut c = !checksum::fold(checksum::sum(&b[l4..], acc));
        if c == 0 {
            c = 0xffff; // 0 means "no checksum" in UDP
        }
        b[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        Ok(Template {
            bytes: b,
            l3,
            l4,
            payload,
            v6,
        })
    }

    /// A template from a frame seen on a wire (a capture): Ethernet / [802.1Q] / IPv4 or IPv6 /
    /// UDP with room for the flowlane header in its payload. The frame is kept as it is —
    /// addresses, ports, IP options, TOS, Ethernet padding — except its checksums, which are
    /// computed afresh (a capture may hold none, or one left for offload to fill), so that
    /// [`Template::patch`] keeps them valid.
    pub fn from_frame(mut bytes: Vec<u8>) -> Result<Template, FrameError> {
        let (l3, l4, payload, ulen, v6) = {
            let f = UdpFrame::parse(&bytes)?;
            let payload = f.l4 + UDP_LEN;
            if f.payload.len() < HEADER_LEN {
                return Err(FrameError::TooShort {
                    len: bytes.len(),
                    need: payload + HEADER_LEN,
                });
            }
            (
                f.l3,
                f.l4,
                payload,
                UDP_LEN + f.payload.len(),
                f.src.is_ipv6(),
            )
        };
        let (src, dst) = if v6 {
            (l3 + 8..l3 + 24, l3 + 24..l3 + 40)
        } else {
            let ip = &mut bytes[l3..l4];
            ip[10..12].fill(0);
            let c = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            (l3 + 12..l3 + 16, l3 + 16..l3 + 20)
        };
        bytes[l4 + 6..l4 + 8].fill(0);
        let acc = checksum::pseudo_header(&bytes[src], &bytes[dst], ulen as u32);
        let mut c = !checksum::fold(checksum::sum(&bytes[l4..l4 + ulen], acc));
        if c == 0 {
            c = 0xffff;
        }
        bytes[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        Ok(Template {
            bytes,
            l3,
            l4,
            payload,
            v6,
        })
    }

    /// Sets the IPv4 TTL (the header checksum updated by RFC 1624) or the IPv6 hop limit.
    /// The UDP checksum does not cover it.
    pub fn set_ttl(&mut self, ttl: u8) {
        let l3 = self.l3;
        if self.v6 {
            self.bytes[l3 + 7] = ttl;
            return;
        }
        let ip = &mut self.bytes[l3..l3 + IPV4_LEN];
        let old = [ip[8], ip[9]];
        ip[8] = ttl;
        let check = u16::from_be_bytes([ip[10], ip[11]]);
        let new = checksum::update(check, &old, &[ip[8], ip[9]]);
        ip[10..12].copy_from_slice(&new.to_be_bytes());
    }

    /// Payload bytes per frame.
    pub fn payload_len(&self) -> usize {
        self.bytes.len() - self.payload
    }

    /// Writes `h` into a copy of this template (`frame`, same length) and updates the UDP
    /// checksum incrementally (RFC 1624) from whatever header bytes `frame` held before.
    /// Returns false (frame untouched) when the payload has no room for a header.
    #[inline]
    pub fn patch(&self, frame: &mut [u8], h: &FlowHeader) -> bool {
        let at = self.payload;
        if frame.len() < at + HEADER_LEN {
            return false;
        }
        let mut old = [0u8; HEADER_LEN];
        old.copy_from_slice(&frame[at..at + HEADER_LEN]);
        h.write(&mut frame[at..]);
        let ck = u16::from_be_bytes([frame[self.l4 + 6], frame[self.l4 + 7]]);
        let mut c = checksum::update(ck, &old, &frame[at..at + HEADER_LEN]);
        if c == 0 {
            c = 0xffff;
        }
        frame[self.l4 + 6..self.l4 + 8].copy_from_slice(&c.to_be_bytes());
        true
    }
}

/// Where a frame built from a template goes, written into it per packet (`blast`'s
/// destination ranges, pktgen's `dst_min`/`dst_max`, `udp_dst_min`/`udp_dst_max` and MAC
/// counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readdress {
    /// Destination address (the template's family).
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// Source and destination MACs.
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
}

impl Template {
    /// Writes `to` into a copy of this template (`frame`, same length, possibly readdressed
    /// before) and updates the IPv4 header checksum and the UDP checksum incrementally (RFC
    /// 1624) from whatever `frame` held: two 16-bit-word updates per packet, no pass over the
    /// payload. Returns false (frame untouched) when the frame is shorter than its headers or
    /// `to` is of the other family.
    #[inline]
    pub fn readdress(&self, frame: &mut [u8], to: &Readdress) -> bool {
        if frame.len() < self.payload {
            return false;
        }
        let (at, len) = if self.v6 {
            (self.l3 + 24, 16)
        } else {
            (self.l3 + 16, 4)
        };
        let mut new = [0u8; 18];
        match (to.dst, self.v6) {
            (IpAddr::V4(a), false) => new[..4].copy_from_slice(&a.octets()),
            (IpAddr::V6(a), true) => new[..16].copy_from_slice(&a.octets()),
            _ => return false,
        }
        frame[0..6].copy_from_slice(&to.dst_mac);
        frame[6..12].copy_from_slice(&to.src_mac);
        let mut old = [0u8; 18];
        old[..len].copy_from_slice(&frame[at..at + len]);
        let p = self.l4 + 2;
        old[len..len + 2].copy_from_slice(&frame[p..p + 2]);
        frame[at..at + len].copy_from_slice(&new[..len]);
        frame[p..p + 2].copy_from_slice(&to.dport.to_be_bytes());
        if !self.v6 {
            // The IPv4 header checksum covers the address, not the port.
            let c = u16::from_be_bytes([frame[self.l3 + 10], frame[self.l3 + 11]]);
            let c = checksum::update(c, &old[..len], &new[..len]);
            frame[self.l3 + 10..self.l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        // The UDP checksum covers both (the address through the pseudo-header).
        new[len..len + 2].copy_from_slice(&to.dport.to_be_bytes());
        let ck = u16::from_be_bytes([frame[self.l4 + 6], frame[self.l4 + 7]]);
        let mut c = checksum::update(ck, &old[..len + 2], &new[..len + 2]);
        if c == 0 {
            c = 0xffff;
        }
        frame[self.l4 + 6..self.l4 + 8].copy_from_slice(&c.to_be_bytes());
        true
    }
}

/// A parsed UDP frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpFrame<'a> {
    /// VLAN id, if tagged.
    pub vlan: Option<u16>,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// The UDP payload (trimmed to the UDP length; Ethernet padding excluded).
    pub payload: &'a [u8],
    /// Offset of the IP header in the frame.
    l3: usize,
    /// Offset of the UDP header in the frame.
    l4: usize,
}

fn be16(b: &[u8], at: usize) -> Result<u16, FrameError> {
    b.get(at..at + 2)
        .map(|s| u16::from_be_bytes([s[0], s[1]]))
        .ok_or(FrameError::TooShort {
            len: b.len(),
            need: at + 2,
        })
}

impl<'a> UdpFrame<'a> {
    /// Parses Ethernet / [802.1Q] / IPv4 or IPv6 / UDP. IPv6 extension headers are not
    /// followed (their next header is reported as not UDP).
    pub fn parse(b: &'a [u8]) -> Result<UdpFrame<'a>, FrameError> {
        let mut et = be16(b, 12)?;
        let mut l3 = ETH_LEN;
        let mut vlan = None;
        if et == ETHERTYPE_VLAN {
            vlan = Some(be16(b, 14)? & 0x0fff);
            et = be16(b, 16)?;
            l3 += VLAN_LEN;
        }
        let short = |need: usize| FrameError::TooShort { len: b.len(), need };
        let (src_ip, dst_ip, l4, ip_end): (IpAddr, IpAddr, usize, usize) = match et {
            ETHERTYPE_IPV4 => {
                let ip = b.get(l3..l3 + IPV4_LEN).ok_or(short(l3 + IPV4_LEN))?;
                if ip[0] >> 4 != 4 {
                    return Err(FrameError::Malformed("IPv4 version"));
                }
                let ihl = (ip[0] & 0x0f) as usize * 4;
                if ihl < IPV4_LEN {
                    return Err(FrameError::Malformed("IPv4 header length"));
                }
                let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
                if total < ihl || l3 + total > b.len() {
                    return Err(FrameError::Malformed("IPv4 total length"));
                }
                let frag = u16::from_be_bytes([ip[6], ip[7]]);
                if frag & 0x3fff != 0 {
                    return Err(FrameError::Fragment);
                }
                if ip[9] != PROTO_UDP {
                    return Err(FrameError::NotUdp(ip[9]));
                }
                let s: [u8; 4] = [ip[12], ip[13], ip[14], ip[15]];
                let d: [u8; 4] = [ip[16], ip[17], ip[18], ip[19]];
                (s.into(), d.into(), l3 + ihl, l3 + total)
            }
            ETHERTYPE_IPV6 => {
                let ip = b.get(l3..l3 + IPV6_LEN).ok_or(short(l3 + IPV6_LEN))?;
                if ip[0] >> 4 != 6 {
                    return Err(FrameError::Malformed("IPv6 version"));
                }
                let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
                if l3 + IPV6_LEN + plen > b.len() {
                    return Err(FrameError::Malformed("IPv6 payload length"));
                }
                if ip[6] == 44 {
                    return Err(FrameError::Fragment);
                }
                if ip[6] != PROTO_UDP {
                    return Err(FrameError::NotUdp(ip[6]));
                }
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&ip[8..24]);
                d.copy_from_slice(&ip[24..40]);
                (s.into(), d.into(), l3 + IPV6_LEN, l3 + IPV6_LEN + plen)
            }
            other => return Err(FrameError::NotIp(other)),
        };
        let udp = b.get(l4..l4 + UDP_LEN).ok_or(short(l4 + UDP_LEN))?;
        let ulen = u16::from_be_bytes([udp[4], udp[5]]) as usize;
        if ulen < UDP_LEN || l4 + ulen > ip_end {
            return Err(FrameError::Malformed("UDP length"));
        }
        Ok(UdpFrame {
            vlan,
            src: SocketAddr::new(src_ip, u16::from_be_bytes([udp[0], udp[1]])),
            dst: SocketAddr::new(dst_ip, u16::from_be_bytes([udp[2], udp[3]])),
            payload: &b[l4 + UDP_LEN..l4 + ulen],
            l3,
            l4,
        })
    }

    /// Whether the UDP checksum field holds only the pseudo-header's sum: a datagram sent from
    /// this host with checksum offload, not filled in yet (`CHECKSUM_PARTIAL`: the device
    /// would add the rest). A reader that is not told so (AF_XDP) can tell such a frame from a
    /// corrupt one by this.
    pub fn checksum_partial(&self, frame: &[u8]) -> bool {
        let udp_len = UDP_LEN + self.payload.len();
        let Some(ip) = frame.get(self.l3..) else {
            return false;
        };
        let (s, d) = if self.src.is_ipv6() {
            (ip.get(8..24), ip.get(24..40))
        } else {
            (ip.get(12..16), ip.get(16..20))
        };
        let (Some(s), Some(d), Some(field)) = (s, d, frame.get(self.l4 + 6..self.l4 + 8)) else {
            return false;
        };
        let pseudo = checksum::fold(checksum::pseudo_header(s, d, udp_len as u32));
        u16::from_be_bytes([field[0], field[1]]) == pseudo
    }

    /// Verifies the UDP checksum against `frame`, the bytes this view was parsed from. An IPv4
    /// checksum of 0 means "none" and passes; in IPv6 it is mandatory.
    pub fn checksum_ok(&self, frame: &[u8]) -> bool {
        let udp_end = self.l4 + UDP_LEN + self.payload.len();
        let (Some(ip), Some(udp)) = (frame.get(self.l3..), frame.get(self.l4..udp_end)) else {
            return false;
        };
        let (s, d) = if self.src.is_ipv6() {
            (ip.get(8..24), ip.get(24..40))
        } else {
            (ip.get(12..16), ip.get(16..20))
        };
        let (Some(s), Some(d)) = (s, d) else {
            return false;
        };
        if self.src.is_ipv4() && udp.get(6..8) == Some(&[0, 0]) {
            return true;
        }
        checksum::fold(checksum::sum(
            udp,
            checksum::pseudo_header(s, d, udp.len() as u32),
        )) == 0xffff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn checksum_ok(frame: &[u8]) -> bool {
        UdpFrame::parse(frame).is_ok_and(|f| f.checksum_ok(frame))
    }

    fn spec(src: &str, dst: &str, len: usize, vlan: Option<u16>) -> TemplateSpec {
        TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan,
            src: src.parse().expect("addr"),
            dst: dst.parse().expect("addr"),
            frame_len: len,
        }
    }

    proptest! {
        /// A frame readdressed any number of times, stamped between, is byte for byte the
        /// frame built for its last destination and stamped alike.
        #[test]
        fn readdressed_frames_equal_frames_built_for_the_destination(
            v6 in any::<bool>(),
            hops in proptest::collection::vec((any::<u128>(), any::<u16>(), any::<u32>()), 1..6),
            len in 0usize..200,
        ) {
            let (src, first) = if v6 {
                ("[2001:2::1]:1000", "[2001:2::2]:9000")
            } else {
                ("198.18.0.1:1000", "198.18.1.2:9000")
            };
            let len = len + if v6 { 78 } else { 60 };
            let t = Template::build(&spec(src, first, len, None)).expect("builds");
            let mut frame = t.bytes.clone();
            for (addr, port, seq) in &hops {
                let dst = if v6 {
                    IpAddr::from(std::net::Ipv6Addr::from(*addr))
                } else {
                    IpAddr::from(std::net::Ipv4Addr::from(*addr as u32))
                };
                let to = Readdress {
                    dst,
                    dport: *port,
                    src_mac: [2, 0, 0, 0, 0, (*seq % 7) as u8],
                    dst_mac: [2, 0, 0, 0, 1, (*seq % 5) as u8],
                };
                let h = FlowHeader { flow: 3, seq: *seq, tx_ns: u64::from(*seq) * 7 };
                prop_assert!(t.readdress(&mut frame, &to));
                prop_assert!(t.patch(&mut frame, &h));
                let mut s = spec(src, "198.18.0.9:1", len, None);
                s.dst = SocketAddr::new(dst, *port);
                s.src_mac = to.src_mac;
                s.dst_mac = to.dst_mac;
                let fresh = Template::build(&s).expect("builds");
                let mut want = fresh.bytes.clone();
                prop_assert!(fresh.patch(&mut want, &h));
                prop_assert_eq!(&frame, &want);
                prop_assert!(checksum_ok(&frame));
            }
        }
    }

    #[test]
    fn readdressing_refuses_the_other_family_and_short_frames() {
        let t =
            Template::build(&spec("198.18.0.1:1000", "198.18.1.2:9000", 60, None)).expect("builds");
        let mut f = t.bytes.clone();
        let v6 = Readdress {
            dst: "2001:2::1".parse().expect("addr"),
            dport: 1,
            src_mac: [0; 6],
            dst_mac: [0; 6],
        };
        assert!(!t.readdress(&mut f, &v6));
        assert_eq!(f, t.bytes);
        let v4 = Readdress {
            dst: "198.18.2.2".parse().expect("addr"),
            ..v6
        };
        assert!(!t.readdress(&mut f[..40], &v4));
    }

    #[test]
    fn a_ttl_set_keeps_every_checksum_valid() {
        for ttl in [1u8, 2, 63, 255] {
            let mut t = Template::build(&spec("198.18.0.1:1000", "198.18.1.2:9000", 60, None))
                .expect("builds");
            t.set_ttl(ttl);
            assert_eq!(t.bytes[t.l3 + 8], ttl);
            assert_eq!(
                checksum::checksum(&t.bytes[t.l3..t.l4]),
                0,
                "IPv4 header sum"
            );
            assert!(checksum_ok(&t.bytes));
            let mut t6 = Template::build(&spec("[2001:2::1]:1", "[2001:2::2]:2", 80, Some(3)))
                .expect("builds");
            t6.set_ttl(ttl);
            assert_eq!(t6.bytes[t6.l3 + 7], ttl);
            assert!(checksum_ok(&t6.bytes));
        }
    }

    #[test]
    fn a_captured_frame_becomes_a_template_with_valid_checksums() {
        let built = Template::build(&spec("198.18.0.1:1000", "198.18.0.2:9000", 100, Some(5)))
            .expect("builds");
        // As a capture may hold it: checksums zeroed (offload), a TOS set, Ethernet padding.
        let mut seen = built.bytes.clone();
        seen[built.l3 + 1] = 0x10;
        seen[built.l3 + 10..built.l3 + 12].fill(0);
        seen[built.l4 + 6..built.l4 + 8].fill(0);
        let ip_len = seen.len() - built.l3;
        seen.extend_from_slice(&[0; 6]);
        let t = Template::from_frame(seen.clone()).expect("a template");
        assert_eq!((t.l3, t.l4, t.payload, t.v6), (18, 38, 46, false));
        assert_eq!(t.bytes.len(), seen.len(), "padding kept");
        assert_eq!(t.bytes[t.l3 + 1], 0x10, "TOS kept");
        assert_eq!(checksum::checksum(&t.bytes[t.l3..t.l4]), 0);
        assert!(checksum_ok(&t.bytes));
        assert_eq!(ip_len, 100 - 18);
        // Patched, it stays valid.
        let mut f = t.bytes.clone();
        assert!(t.patch(
            &mut f,
            &FlowHeader {
                flow: 7,
                seq: 3,
                tx_ns: 99
            }
        ));
        assert!(checksum_ok(&f));
        assert_eq!(FlowHeader::read(&f[t.payload..]).expect("header").flow, 7);
        // IPv6 too; and what cannot carry the header is refused.
        let b6 = Template::build(&spec("[2001:2::1]:1", "[2001:2::2]:2", 90, None)).expect("v6");
        let t6 = Template::from_frame(b6.bytes.clone()).expect("v6 template");
        assert_eq!(t6.bytes, b6.bytes, "already valid: unchanged");
        let small = Template::build(&spec("198.18.0.1:1", "198.18.0.2:2", 50, None)).expect("50");
        assert!(matches!(
            Template::from_frame(small.bytes),
            Err(FrameError::TooShort { .. })
        ));
        let mut arp = built.bytes.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(Template::from_frame(arp), Err(FrameError::NotIp(0x0806)));
    }

    #[test]
    fn smallest_frames_and_refusals() {
        let t =
            Template::build(&spec("198.18.0.1:1000", "198.18.0.2:9000", 60, None)).expect("builds");
        assert_eq!(t.payload_len(), 18);
        assert_eq!(
            checksum::checksum(&t.bytes[t.l3..t.l4]),
            0,
            "IPv4 header checksum"
        );
        assert!(checksum_ok(&t.bytes));
        let t6 =
            Template::build(&spec("[2001:2::1]:1", "[2001:2::2]:2", 66, Some(7))).expect("builds");
        assert_eq!(t6.payload_len(), 0);
        assert!(checksum_ok(&t6.bytes));
        // One flipped payload bit is caught.
        let mut bad = t.bytes.clone();
        bad[t.payload] ^= 1;
        assert!(!checksum_ok(&bad));
        assert_eq!(
            Template::build(&spec("198.18.0.1:1", "198.18.0.2:2", 41, None)),
            Err(FrameError::TooShort { len: 41, need: 42 })
        );
        assert_eq!(
            Template::build(&spec("198.18.0.1:1", "[2001:2::2]:2", 100, None)),
            Err(FrameError::MixedFamilies)
        );
        assert_eq!(
            Template::build(&spec("198.18.0.1:1", "198.18.0.2:2", 100, Some(4095))),
            Err(FrameError::BadVlan(4095))
        );
    }

    #[test]
    fn parse_reads_what_build_wrote() {
        for (s, d, vlan) in [
            ("198.18.0.1:1000", "198.18.0.2:9000", None),
            ("198.18.0.1:1000", "198.18.0.2:9000", Some(100)),
            ("[2001:2::1]:5", "[2001:2::2]:6", None),
        ] {
            let t = Template::build(&spec(s, d, 128, vlan)).expect("builds");
            let f = UdpFrame::parse(&t.bytes).expect("parses");
            assert_eq!(f.src.to_string(), s);
            assert_eq!(f.dst.to_string(), d);
            assert_eq!(f.vlan, vlan);
            assert_eq!(f.payload, &t.bytes[t.payload..]);
        }
        // Ethernet padding after the IP datagram is not payload.
        let t = Template::build(&spec("198.18.0.1:1", "198.18.0.2:2", 50, None)).expect("ok");
        let mut padded = t.bytes.clone();
        padded.extend_from_slice(&[0xee; 10]);
        assert_eq!(UdpFrame::parse(&padded).expect("parses").payload.len(), 8);
        assert!(matches!(
            UdpFrame::parse(&t.bytes[..30]),
            Err(FrameError::TooShort { .. })
        ));
    }

    proptest! {
        #[test]
        fn patched_checksums_stay_valid(
            len in 58usize..300, seqs in proptest::collection::vec(any::<(u16, u32, u64)>(), 1..8),
            v6 in any::<bool>(),
        ) {
            let (s, d) = if v6 { ("[2001:2::1]:7", "[2001:2::2]:9") } else { ("198.18.0.1:7", "198.18.0.2:9") };
            let len = if v6 { len + 20 } else { len };
            let t = Template::build(&spec(s, d, len, None)).expect("builds");
            let mut frame = t.bytes.clone();
            for (flow, seq, tx_ns) in seqs {
                let h = FlowHeader { flow, seq, tx_ns };
                prop_assert!(t.patch(&mut frame, &h));
                prop_assert!(checksum_ok(&frame));
                let f = UdpFrame::parse(&frame).expect("parses");
                prop_assert_eq!(FlowHeader::read(f.payload), Ok(h));
            }
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = UdpFrame::parse(&b);
        }
    }
}
