//! IP fragments as they arrive: Ethernet / [802.1Q] / IPv4 with MF or an offset, or IPv6 with
//! a fragment header right after the fixed header (RFC 8200 §4.5; other extension headers
//! before it are not followed). What a reassembler needs of each: the addresses, the
//! protocol carried, the identification, where the piece sits and whether more follow.

use std::net::IpAddr;

use crate::frame::FrameError;

/// One fragment, borrowed from its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentView<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The protocol carried (IPv6: the fragment header's next header).
    pub proto: u8,
    /// Identification (IPv4: 16 bits; IPv6: 32).
    pub id: u32,
    /// Byte offset of `data` in the datagram's payload.
    pub offset: u32,
    /// More fragments follow.
    pub more: bool,
    /// The fragment's payload (Ethernet padding excluded).
    pub data: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]))
}

impl<'a> FragmentView<'a> {
    /// The fragment in `b`, or why it is none: `NotIp`, or `Malformed` for headers cut
    /// short or inconsistent, `Fragment` never (a whole datagram is `Malformed("not a
    /// fragment")`).
    pub fn parse(b: &'a [u8]) -> Result<FragmentView<'a>, FrameError> {
        let short = FrameError::Malformed("headers cut short");
        let mut et = be16(b, 12).ok_or(short.clone())?;
        let mut l3 = 14;
        if et == 0x8100 {
            et = be16(b, 16).ok_or(short.clone())?;
            l3 += 4;
        }
        match et {
            0x0800 => {
                let ip = b.get(l3..l3 + 20).ok_or(short)?;
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
                if ip[0] >> 4 != 4 || ihl < 20 || total < ihl || l3 + total > b.len() {
                    return Err(FrameError::Malformed("IPv4 header"));
                }
                let frag = u16::from_be_bytes([ip[6], ip[7]]);
                let (more, offset) = (frag & 0x2000 != 0, u32::from(frag & 0x1fff) * 8);
                if !more && offset == 0 {
                    return Err(FrameError::Malformed("not a fragment"));
                }
                Ok(FragmentView {
                    src: IpAddr::from([ip[12], ip[13], ip[14], ip[15]]),
                    dst: IpAddr::from([ip[16], ip[17], ip[18], ip[19]]),
                    proto: ip[9],
                    id: u32::from(u16::from_be_bytes([ip[4], ip[5]])),
                    offset,
                    more,
                    data: &b[l3 + ihl..l3 + total],
                })
            }
            0x86dd => {
                let ip = b.get(l3..l3 + 48).ok_or(short)?;
                let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
                if ip[0] >> 4 != 6 || plen < 8 || l3 + 40 + plen > b.len() {
                    return Err(FrameError::Malformed("IPv6 header"));
                }
                if ip[6] != 44 {
                    return Err(FrameError::Malformed("not a fragment"));
                }
                let fh = &ip[40..48];
                let off = u16::from_be_bytes([fh[2], fh[3]]);
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&ip[8..24]);
                d.copy_from_slice(&ip[24..40]);
                Ok(FragmentView {
                    src: IpAddr::from(s),
                    dst: IpAddr::from(d),
                    proto: fh[0],
                    id: u32::from_be_bytes([fh[4], fh[5], fh[6], fh[7]]),
                    offset: u32::from(off >> 3) * 8,
                    more: off & 1 != 0,
                    data: &b[l3 + 48..l3 + 40 + plen],
                })
            }
            other => Err(FrameError::NotIp(other)),
        }
    }
}

/// Cuts a whole Ethernet / [802.1Q] / IPv4 or IPv6 frame into fragments carrying at most
/// `piece` bytes of the IP payload each (rounded down to a multiple of 8, at least 8), in
/// order, with identification `id` (IPv4: its low 16 bits). IPv4: the header copied (DF
/// cleared), its length, flags, offset and checksum set. IPv6: a fragment header inserted
/// after the fixed one (extension headers before it are not expected). `None`: not an IP
/// frame this can cut, or a datagram that fits one piece.
pub fn split(frame: &[u8], piece: usize, id: u32) -> Option<Vec<Vec<u8>>> {
    let ranges = pieces(ip_payload_len(frame)?, piece, None)?;
    split_ranges(frame, &ranges, id)
}

/// A hostile way to cut a datagram, for testing a device's reassembly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// The first fragment runs 8 bytes into the second (same bytes: still an overlap).
    OverlapForward,
    /// The second fragment starts 8 bytes inside the first.
    OverlapBack,
    /// A first fragment of 8 bytes: the UDP header alone, the rest of the datagram after.
    TinyFirst,
    /// The first fragment sent again right after it.
    Duplicate,
    /// The last fragment never sent (a context left waiting).
    Incomplete,
    /// Teardrop: the second fragment lies wholly inside the first (offset 8, 8 bytes).
    Teardrop,
}

/// The byte ranges (offset, length) of a payload of `len` cut in pieces of at most `piece`
/// (a multiple of 8), changed as `attack` says; `None` when it fits one piece.
pub fn pieces(len: usize, piece: usize, attack: Option<Attack>) -> Option<Vec<(usize, usize)>> {
    let piece = (piece / 8 * 8).max(8);
    if len <= piece {
        return None;
    }
    let mut r: Vec<(usize, usize)> = (0..len)
        .step_by(piece)
        .map(|o| (o, piece.min(len - o)))
        .collect();
    match attack {
        None => {}
        Some(Attack::OverlapForward) => r[0].1 = (r[0].1 + 8).min(len),
        Some(Attack::OverlapBack) => {
            r[1].0 -= 8;
            r[1].1 += 8;
        }
        Some(Attack::TinyFirst) => {
            let (o, l) = r[0];
            if l > 8 {
                r[0] = (o, 8);
                r.insert(1, (o + 8, l - 8));
            }
        }
        Some(Attack::Duplicate) => r.insert(1, r[0]),
        Some(Attack::Incomplete) => {
            r.pop();
        }
        Some(Attack::Teardrop) => r[1] = (8, 8),
    }
    Some(r)
}

/// How many IP fragments the kernel cuts a locally sent UDP datagram of `payload` bytes into
/// at path MTU `mtu` (1: it leaves whole). Every fragment but the last carries the most
/// payload a multiple of 8 allows: `(mtu − 20) & !7` for IPv4, `(mtu − 48) & !7` for IPv6
/// (its 40-byte header and the 8-byte fragment header).
pub fn kernel_pieces(payload: usize, mtu: usize, v6: bool) -> usize {
    let ip = if v6 { 40 } else { 20 };
    let datagram = payload + 8;
    if datagram + ip <= mtu {
        return 1;
    }
    let per = mtu.saturating_sub(if v6 { 48 } else { 20 }) & !7;
    if per == 0 {
        return 0;
    }
    datagram.div_ceil(per)
}

/// The IP payload's length of an IPv4 or IPv6 frame.
pub fn ip_payload_len(frame: &[u8]) -> Option<usize> {
    let (l3, v6, hlen) = layout(frame)?;
    if v6 {
        Some(usize::from(be16(frame, l3 + 4)?))
    } else {
        usize::from(be16(frame, l3 + 2)?).checked_sub(hlen)
    }
}

/// Where the IP header starts, the family, the IP header's length.
fn layout(frame: &[u8]) -> Option<(usize, bool, usize)> {
    let mut et = be16(frame, 12)?;
    let mut l3 = 14;
    if et == 0x8100 {
        et = be16(frame, 16)?;
        l3 += 4;
    }
    match et {
        0x0800 => Some((l3, false, usize::from(frame.get(l3)? & 0x0f) * 4)),
        0x86dd => Some((l3, true, 40)),
        _ => None,
    }
}

/// Fragments of a whole IPv4 or IPv6 frame carrying the given (offset, length) ranges of its
/// IP payload, in that order — overlapping, repeated or missing ranges as given (a fragment
/// has "more" set unless it reaches the payload's end). See [`split`] for the headers.
pub fn split_ranges(frame: &[u8], ranges: &[(usize, usize)], id: u32) -> Option<Vec<Vec<u8>>> {
    let (l3, v6, hlen) = layout(frame)?;
    if hlen < 20 {
        return None;
    }
    let total = ip_payload_len(frame)?;
    let payload = frame.get(l3 + hlen..l3 + hlen + total)?;
    let head = &frame[..l3 + hlen];
    let mut out = Vec::with_capacity(ranges.len());
    for &(offset, len) in ranges {
        let chunk = payload.get(offset..offset + len)?;
        let more = offset + len < total;
        let mut f = head.to_vec();
        if v6 {
            let next = f[l3 + 6];
            f[l3 + 6] = 44;
            let plen = (8 + chunk.len()) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
            let off = ((offset / 8) as u16) << 3 | u16::from(more);
            f.extend_from_slice(&[next, 0]);
            f.extend_from_slice(&off.to_be_bytes());
            f.extend_from_slice(&id.to_be_bytes());
        } else {
            let tl = (hlen + chunk.len()) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&tl.to_be_bytes());
            f[l3 + 4..l3 + 6].copy_from_slice(&(id as u16).to_be_bytes());
            let flags = (offset / 8) as u16 | if more { 0x2000 } else { 0 };
            f[l3 + 6..l3 + 8].copy_from_slice(&flags.to_be_bytes());
            f[l3 + 10..l3 + 12].fill(0);
            let c = crate::checksum::checksum(&f[l3..l3 + hlen]);
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        f.extend_from_slice(chunk);
        out.push(f);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_cut_at_an_mtu() {
        // 1 480 bytes of UDP datagram fill a 1 500-byte IPv4 packet; one more is cut.
        assert_eq!(kernel_pieces(1472, 1500, false), 1);
        assert_eq!(kernel_pieces(1473, 1500, false), 2);
        // 3 008 bytes: 1 480 + 1 480 + 48 (IPv4); 1 448 + 1 448 + 112 (IPv6).
        assert_eq!(kernel_pieces(3000, 1500, false), 3);
        assert_eq!(kernel_pieces(3000, 1500, true), 3);
        assert_eq!(kernel_pieces(1452, 1500, true), 1);
        assert_eq!(kernel_pieces(1453, 1500, true), 2);
        assert_eq!(kernel_pieces(65_507, 1500, false), 45);
    }
    use crate::{Template, TemplateSpec};

    fn whole(v6: bool) -> Vec<u8> {
        let (src, dst) = if v6 {
            ("[2001:2::1]:1000", "[2001:2::2]:9000")
        } else {
            ("198.18.0.1:1000", "198.18.1.2:9000")
        };
        Template::build(&TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src: src.parse().expect("addr"),
            dst: dst.parse().expect("addr"),
            frame_len: 200,
        })
        .expect("frame")
        .bytes
    }

    #[test]
    fn ipv4_fragments_say_where_they_sit() {
        let mut f = whole(false);
        assert!(FragmentView::parse(&f).is_err(), "a whole datagram");
        // MF set, offset 0; then offset 24 (3 units), the last.
        f[14 + 4..14 + 6].copy_from_slice(&0x1234u16.to_be_bytes());
        f[14 + 6] = 0x20;
        let v = FragmentView::parse(&f).expect("fragment");
        assert_eq!((v.id, v.offset, v.more, v.proto), (0x1234, 0, true, 17));
        assert_eq!(v.data.len(), 200 - 34);
        f[14 + 6..14 + 8].copy_from_slice(&3u16.to_be_bytes());
        let v = FragmentView::parse(&f).expect("fragment");
        assert_eq!((v.offset, v.more), (24, false));
        assert!(FragmentView::parse(&f[..30]).is_err());
    }

    /// Cut and read back: each piece where `split` put it, the pieces joined are the
    /// datagram's payload, IPv4 headers' checksums good.
    #[test]
    fn split_fragments_read_back_as_the_datagram() {
        for v6 in [false, true] {
            let f = whole(v6);
            let l4 = if v6 { 54 } else { 34 };
            let frags = split(&f, 60, 0x0102_0304).expect("cut");
            assert_eq!(frags.len(), (f.len() - l4).div_ceil(56));
            let mut joined = Vec::new();
            for (k, g) in frags.iter().enumerate() {
                let v = FragmentView::parse(g).expect("a fragment");
                assert_eq!(v.offset as usize, joined.len());
                assert_eq!(v.more, k + 1 < frags.len());
                assert_eq!(v.proto, 17);
                assert_eq!(v.id, if v6 { 0x0102_0304 } else { 0x0304 });
                joined.extend_from_slice(v.data);
                if !v6 {
                    assert_eq!(crate::checksum::checksum(&g[14..34]), 0);
                }
            }
            assert_eq!(joined, f[l4..]);
        }
        assert!(split(&whole(false), 4000, 1).is_none(), "fits one piece");
    }

    #[test]
    fn attacks_change_the_ranges_as_named() {
        let p = |a| pieces(100, 32, Some(a)).expect("cut");
        assert_eq!(
            pieces(100, 32, None),
            Some(vec![(0, 32), (32, 32), (64, 32), (96, 4)])
        );
        assert_eq!(p(Attack::OverlapForward)[0], (0, 40));
        assert_eq!(p(Attack::OverlapBack)[1], (24, 40));
        assert_eq!(&p(Attack::TinyFirst)[..2], &[(0, 8), (8, 24)]);
        assert_eq!(&p(Attack::Duplicate)[..2], &[(0, 32), (0, 32)]);
        assert_eq!(p(Attack::Incomplete).len(), 3);
        assert_eq!(p(Attack::Teardrop)[1], (8, 8));
        // Built: a duplicate is the first fragment again, byte for byte.
        let f = whole(false);
        let len = ip_payload_len(&f).expect("IP");
        let frags = split_ranges(
            &f,
            &pieces(len, 64, Some(Attack::Duplicate)).expect("cut"),
            9,
        )
        .expect("built");
        assert_eq!(frags[0], frags[1]);
    }

    #[test]
    fn ipv6_fragments_are_read_from_their_header() {
        let mut f = whole(true);
        assert!(FragmentView::parse(&f).is_err(), "a whole datagram");
        // Insert a fragment header: next header UDP, offset 5 units, M set, id 0xdeadbeef.
        let mut g = f[..54].to_vec();
        g[14 + 6] = 44;
        let plen = u16::from_be_bytes([g[18], g[19]]) + 8;
        g[18..20].copy_from_slice(&plen.to_be_bytes());
        g.extend_from_slice(&[17, 0, 0, (5 << 3) | 1, 0xde, 0xad, 0xbe, 0xef]);
        g.extend_from_slice(&f.split_off(54));
        let v = FragmentView::parse(&g).expect("fragment");
        assert_eq!(
            (v.id, v.offset, v.more, v.proto, v.data.len()),
            (0xdead_beef, 40, true, 17, 200 - 54)
        );
    }
}
