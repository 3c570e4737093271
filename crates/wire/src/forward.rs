//! What a forwarder does to a frame, in place, and why it refuses one.
//!
//! * [`reflect`]: swap the MACs and, as asked, the IP addresses and the UDP/TCP ports — the
//!   reflector that sends every frame back where it came from. Swapping two 16-bit-aligned
//!   fields of one checksum's coverage leaves the one's-complement sum as it was (addition
//!   commutes), so the IPv4 header checksum and the UDP/TCP checksum stay valid untouched;
//!   the tests check that against a full recomputation.
//! * [`decrement_ttl`]: the router's TTL / hop-limit step; IPv4's header checksum is updated
//!   incrementally (RFC 1624 eqn. 3), never recomputed.
//! * [`L3::parse`]: the little a forwarder needs to know — where the IP header is, its family,
//!   protocol, destination — checked enough that no later step reads past the frame.
//!
//! Every refusal is a [`Reason`], counted by the caller; nothing here panics on any bytes
//! (fuzzed: `wire_forward`).

use crate::checksum;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// Why a forwarder did not forward a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Not IPv4 or IPv6 (ARP, LLDP, …): passed or dropped as the user asked.
    NotIp,
    /// Headers cut short or inconsistent (a length, the version).
    Malformed,
    /// TTL or hop limit would reach 0.
    TtlExceeded,
    /// No route to the destination.
    NoRoute,
    /// A route, but no MAC for its next hop.
    NoNeighbour,
    /// Larger than the outgoing interface carries.
    TooBig,
}

impl Reason {
    /// Every reason, in report order.
    pub const ALL: [Reason; 6] = [
        Reason::NotIp,
        Reason::Malformed,
        Reason::TtlExceeded,
        Reason::NoRoute,
        Reason::NoNeighbour,
        Reason::TooBig,
    ];

    /// The name in reports (`not_ip`, `malformed`, …).
    pub fn name(self) -> &'static str {
        match self {
            Reason::NotIp => "not_ip",
            Reason::Malformed => "malformed",
            Reason::TtlExceeded => "ttl_exceeded",
            Reason::NoRoute => "no_route",
            Reason::NoNeighbour => "no_neighbour",
            Reason::TooBig => "too_big",
        }
    }
}

/// What to swap besides the MACs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swap {
    /// Source and destination IP addresses.
    pub ip: bool,
    /// Source and destination UDP/TCP ports (of unfragmented datagrams and first fragments).
    pub ports: bool,
}

/// Where a frame's IP header is and what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L3 {
    /// Offset of the IP header.
    pub at: usize,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IPv4 protocol / IPv6 next header.
    pub proto: u8,
    /// Offset of the transport header; `None` for a non-first fragment (IPv4) or an IPv6
    /// fragment header.
    pub l4: Option<usize>,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

impl L3 {
    /// Finds the IP header behind Ethernet and an optional 802.1Q tag, and checks its lengths
    /// against the frame.
    pub fn parse(b: &[u8]) -> Result<L3, Reason> {
        let mut et = be16(b, 12).ok_or(Reason::Malformed)?;
        let mut at = ETH_LEN;
        if et == ETHERTYPE_VLAN {
            et = be16(b, 16).ok_or(Reason::Malformed)?;
            at += VLAN_LEN;
        }
        match et {
            ETHERTYPE_IPV4 => {
                let ip = b.get(at..at + IPV4_LEN).ok_or(Reason::Malformed)?;
                let ihl = (ip[0] & 0x0f) as usize * 4;
                let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
                if ip[0] >> 4 != 4 || ihl < IPV4_LEN || total < ihl || at + total > b.len() {
                    return Err(Reason::Malformed);
                }
                let frag_off = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
                Ok(L3 {
                    at,
                    v6: false,
                    proto: ip[9],
                    l4: (frag_off == 0).then_some(at + ihl),
                })
            }
            ETHERTYPE_IPV6 => {
                let ip = b.get(at..at + IPV6_LEN).ok_or(Reason::Malformed)?;
                let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
                if ip[0] >> 4 != 6 || at + IPV6_LEN + plen > b.len() {
                    return Err(Reason::Malformed);
                }
                Ok(L3 {
                    at,
                    v6: true,
                    proto: ip[6],
                    l4: (ip[6] != 44).then_some(at + IPV6_LEN),
                })
            }
            _ => Err(Reason::NotIp),
        }
    }

    /// The destination IPv4 address (host order), for an IPv4 header.
    pub fn dst_v4(&self, b: &[u8]) -> Option<u32> {
        let d = b.get(self.at + 16..self.at + 20)?;
        (!self.v6).then(|| u32::from_be_bytes([d[0], d[1], d[2], d[3]]))
    }

    /// The destination IPv6 address, for an IPv6 header.
    pub fn dst_v6(&self, b: &[u8]) -> Option<u128> {
        let d: [u8; 16] = b.get(self.at + 24..self.at + 40)?.try_into().ok()?;
        self.v6.then(|| u128::from_be_bytes(d))
    }
}

/// Swaps two equal, non-overlapping ranges of `b` (`a < c`).
fn swap_ranges(b: &mut [u8], a: usize, c: usize, len: usize) {
    let (lo, hi) = b.split_at_mut(c);
    lo[a..a + len].swap_with_slice(&mut hi[..len]);
}

/// Swaps destination and source MAC. Frames shorter than an Ethernet header are malformed.
pub fn swap_macs(b: &mut [u8]) -> Result<(), Reason> {
    if b.len() < ETH_LEN {
        return Err(Reason::Malformed);
    }
    swap_ranges(b, 0, 6, 6);
    Ok(())
}

/// Sends the frame back: MACs swapped, and addresses and ports as `swap` asks. With only the
/// MACs swapped every Ethernet frame is reflected; with addresses or ports, a frame that is
/// not IP is refused ([`Reason::NotIp`], unchanged) so the caller can pass or drop it as asked.
/// Checksums stay valid without an update (see the module's comment). On a refusal the frame
/// is left as it came.
pub fn reflect(b: &mut [u8], swap: Swap) -> Result<(), Reason> {
    if b.len() < ETH_LEN {
        return Err(Reason::Malformed);
    }
    let l3 = if swap.ip || swap.ports {
        Some(L3::parse(b)?)
    } else {
        None
    };
    reflect_parsed(b, l3.as_ref(), swap)
}

/// [`reflect`] for a caller that has parsed the frame already (a worker that also completes
/// its checksum parses it once): `l3` is the frame's [`L3::parse`], needed when `swap` moves
/// addresses or ports (else [`Reason::NotIp`]).
pub fn reflect_parsed(b: &mut [u8], l3: Option<&L3>, swap: Swap) -> Result<(), Reason> {
    if b.len() < ETH_LEN {
        return Err(Reason::Malformed);
    }
    if swap.ip || swap.ports {
        let l3 = *l3.ok_or(Reason::NotIp)?;
        if swap.ip {
            let (src, len) = if l3.v6 { (8, 16) } else { (12, 4) };
            swap_ranges(b, l3.at + src, l3.at + src + len, len);
        }
        if swap.ports && matches!(l3.proto, PROTO_UDP | PROTO_TCP) {
            if let Some(l4) = l3.l4.filter(|&l4| l4 + 4 <= b.len()) {
                swap_ranges(b, l4, l4 + 2, 2);
            }
        }
    }
    swap_ranges(b, 0, 6, 6);
    Ok(())
}

/// Where a UDP or TCP checksum lies and what it covers: (the field's offset, the pseudo
/// header's sum, the segment's range). `None` for other protocols and non-first fragments.
fn l4_span(b: &[u8], l3: &L3) -> Result<Option<(usize, u64, std::ops::Range<usize>)>, Reason> {
    let (off, proto) = match l3.proto {
        PROTO_UDP => (6, 17u32),
        PROTO_TCP => (16, 6u32),
        _ => return Ok(None),
    };
    let Some(l4) = l3.l4 else { return Ok(None) };
    let (src, dst, end) = if l3.v6 {
        let plen = be16(b, l3.at + 4).ok_or(Reason::Malformed)? as usize;
        (
            l3.at + 8..l3.at + 24,
            l3.at + 24..l3.at + 40,
            l3.at + IPV6_LEN + plen,
        )
    } else {
        let total = be16(b, l3.at + 2).ok_or(Reason::Malformed)? as usize;
        (
            l3.at + 12..l3.at + 16,
            l3.at + 16..l3.at + 20,
            l3.at + total,
        )
    };
    if end > b.len() || l4 + off + 2 > end {
        return Err(Reason::Malformed);
    }
    let len = (end - l4) as u32;
    let mut acc = checksum::sum(&b[src], 0);
    acc = checksum::sum(&b[dst], acc);
    acc += u64::from(proto) + u64::from(len >> 16) + u64::from(len & 0xffff);
    Ok(Some((l4 + off, acc, l4..end)))
}

/// Computes and writes the UDP or TCP checksum of an unfragmented datagram in full — for a
/// frame a local sender left to checksum offload (only the pseudo-header sum is in place), so
/// that it is valid on the wire once forwarded. Other protocols are left alone. Returns
/// whether it wrote one.
pub fn fill_checksum(b: &mut [u8], l3: &L3) -> Result<bool, Reason> {
    let Some((field, pseudo, seg)) = l4_span(b, l3)? else {
        return Ok(false);
    };
    b[field] = 0;
    b[field + 1] = 0;
    let mut c = !checksum::fold(checksum::sum(&b[seg], pseudo));
    // UDP sends a computed 0 as 0xffff (0 means "no checksum").
    if c == 0 && l3.proto == PROTO_UDP {
        c = 0xffff;
    }
    b[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(true)
}

/// Completes a UDP or TCP checksum that a local sender left to offload, for a reader that is
/// not told so (AF_XDP gives no `CHECKSUM_PARTIAL` flag): the field holds exactly the pseudo
/// header's sum. Returns whether the frame was such a one, now complete. The cheap test (the
/// pseudo header, 12 or 36 bytes) comes first; the segment is summed only for a frame that
/// passes it — every offloaded one, and a valid one in 65 535 by chance. A frame whose whole
/// already verifies is left as it is and still counted: an offloaded frame whose checksum
/// happens to equal the pseudo header's sum (1 in 65 535) is complete as it came, and the
/// count is then every frame left to offload, as the AF_PACKET flag counts them (a test that
/// expected 5 000 saw 4 999 when it did not).
pub fn complete_partial(b: &mut [u8], l3: &L3) -> Result<bool, Reason> {
    let Some((field, pseudo, seg)) = l4_span(b, l3)? else {
        return Ok(false);
    };
    let have = u16::from_be_bytes([b[field], b[field + 1]]);
    // IPv4 UDP's 0 is "no checksum", never a partial one.
    if have != checksum::fold(pseudo) || (have == 0 && l3.proto == PROTO_UDP) {
        return Ok(false);
    }
    if checksum::fold(checksum::sum(&b[seg], pseudo)) == 0xffff {
        return Ok(true);
    }
    fill_checksum(b, l3)
}

/// Decrements the IPv4 TTL (with the header checksum updated by RFC 1624) or the IPv6 hop
/// limit. A frame whose TTL is 0 or 1 is refused ([`Reason::TtlExceeded`]) and left as it
/// came: a router does not forward it.
pub fn decrement_ttl(b: &mut [u8], l3: &L3) -> Result<(), Reason> {
    if l3.v6 {
        let hl = b.get_mut(l3.at + 7).ok_or(Reason::Malformed)?;
        if *hl <= 1 {
            return Err(Reason::TtlExceeded);
        }
        *hl -= 1;
        return Ok(());
    }
    let ip = b
        .get_mut(l3.at..l3.at + IPV4_LEN)
        .ok_or(Reason::Malformed)?;
    if ip[8] <= 1 {
        return Err(Reason::TtlExceeded);
    }
    // TTL and protocol form one 16-bit word of the header.
    let old = [ip[8], ip[9]];
    ip[8] -= 1;
    let check = u16::from_be_bytes([ip[10], ip[11]]);
    let new = checksum::update(check, &old, &[ip[8], ip[9]]);
    ip[10..12].copy_from_slice(&new.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Template, TemplateSpec, UdpFrame};
    use proptest::prelude::*;

    fn ipv4_header_ok(f: &[u8], at: usize) -> bool {
        let ihl = (f[at] & 0x0f) as usize * 4;
        checksum::fold(checksum::sum(&f[at..at + ihl], 0)) == 0xffff
    }

    fn frame(v6: bool, vlan: Option<u16>, sport: u16, dport: u16, len: usize) -> Vec<u8> {
        let (s, d) = if v6 {
            ("[2001:2::1]", "[2001:2::2]")
        } else {
            ("198.18.0.1", "198.18.0.2")
        };
        let t = Template::build(&TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan,
            src: format!("{s}:{sport}").parse().expect("addr"),
            dst: format!("{d}:{dport}").parse().expect("addr"),
            frame_len: len,
        })
        .expect("template");
        t.bytes
    }

    proptest! {
        #[test]
        fn reflected_frames_keep_valid_checksums_and_change_only_the_swapped_fields(
            v6 in any::<bool>(),
            tagged in any::<bool>(),
            sport in 1u16..,
            dport in 1u16..,
            extra in 0usize..200,
            payload_byte in any::<u8>(),
        ) {
            let len = crate::frame::headers_len(v6, tagged) + 16 + extra;
            let mut f = frame(v6, tagged.then_some(7), sport, dport, len);
            let n = f.len();
            for b in f[n - extra..].iter_mut() {
                *b = payload_byte;
            }
            // Recompute the UDP checksum over the changed payload, as a sender would.
            let fixed = {
                let mut g = f.clone();
                let l3 = L3::parse(&g).expect("ip");
                let l4 = l3.l4.expect("l4");
                g[l4 + 6] = 0;
                g[l4 + 7] = 0;
                let (s, d) = if v6 { (&g[l3.at + 8..l3.at + 24], &g[l3.at + 24..l3.at + 40]) }
                    else { (&g[l3.at + 12..l3.at + 16], &g[l3.at + 16..l3.at + 20]) };
                let ulen = u16::from_be_bytes([g[l4 + 4], g[l4 + 5]]) as usize;
                let c = !checksum::fold(checksum::sum(
                    &g[l4..l4 + ulen],
                    checksum::pseudo_header(s, d, ulen as u32),
                ));
                let c = if c == 0 { 0xffff } else { c };
                g[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
                g
            };
            f = fixed.clone();
            prop_assert!(UdpFrame::parse(&f).expect("parses").checksum_ok(&f));
            reflect(&mut f, Swap { ip: true, ports: true }).expect("reflects");
            let r = UdpFrame::parse(&f).expect("still parses");
            let o = UdpFrame::parse(&fixed).expect("parses");
            prop_assert_eq!(r.src, o.dst);
            prop_assert_eq!(r.dst, o.src);
            prop_assert_eq!(&f[0..6], &fixed[6..12]);
            prop_assert_eq!(&f[6..12], &fixed[0..6]);
            prop_assert_eq!(r.payload, o.payload);
            prop_assert!(r.checksum_ok(&f), "UDP checksum valid untouched");
            let l3 = L3::parse(&f).expect("ip");
            if !v6 {
                prop_assert!(ipv4_header_ok(&f, l3.at), "IPv4 header checksum valid");
            }
            // Everything outside the swapped fields is byte-identical.
            let mut back = f.clone();
            reflect(&mut back, Swap { ip: true, ports: true }).expect("reflects");
            prop_assert_eq!(back, fixed);
        }

        #[test]
        fn ttl_decrement_matches_a_full_recomputation(ttl in 0u8.., tos in any::<u8>(), id in any::<u16>()) {
            let mut f = frame(false, None, 1000, 2000, 80);
            let at = ETH_LEN;
            f[at + 1] = tos;
            f[at + 4..at + 6].copy_from_slice(&id.to_be_bytes());
            f[at + 8] = ttl;
            f[at + 10] = 0;
            f[at + 11] = 0;
            let c = !checksum::fold(checksum::sum(&f[at..at + 20], 0));
            f[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
            let orig = f.clone();
            let l3 = L3::parse(&f).expect("ip");
            match decrement_ttl(&mut f, &l3) {
                Ok(()) => {
                    prop_assert!(ttl > 1);
                    prop_assert_eq!(f[at + 8], ttl - 1);
                    prop_assert!(ipv4_header_ok(&f, at));
                    prop_assert_eq!(&f[..at + 8], &orig[..at + 8]);
                    prop_assert_eq!(&f[at + 12..], &orig[at + 12..]);
                }
                Err(r) => {
                    prop_assert_eq!(r, Reason::TtlExceeded);
                    prop_assert!(ttl <= 1);
                    prop_assert_eq!(f, orig);
                }
            }
        }

        #[test]
        fn any_bytes_are_refused_or_handled_never_a_panic(b in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut f = b.clone();
            let _ = reflect(&mut f, Swap { ip: true, ports: true });
            if let Ok(l3) = L3::parse(&b) {
                let mut g = b.clone();
                let _ = decrement_ttl(&mut g, &l3);
                let _ = (l3.dst_v4(&b), l3.dst_v6(&b));
                let mut h = b.clone();
                let _ = complete_partial(&mut h, &l3);
            }
        }
    }

    #[test]
    fn a_filled_checksum_is_the_one_the_template_has() {
        for v6 in [false, true] {
            let good = frame(v6, None, 4242, 9000, 120);
            let mut f = good.clone();
            let l3 = L3::parse(&f).expect("ip");
            let l4 = l3.l4.expect("l4");
            f[l4 + 6] = 0x12; // what offload leaves: not the checksum
            fill_checksum(&mut f, &l3).expect("fills");
            assert_eq!(f, good, "v6 {v6}");
        }
    }

    /// What a sender with checksum offload leaves (the pseudo header's sum in the field) is
    /// completed to the template's checksum; a valid frame, a corrupt one and one without a
    /// checksum (IPv4 UDP's 0) are left as they are.
    #[test]
    fn a_partial_checksum_is_completed_and_nothing_else_is_touched() {
        for v6 in [false, true] {
            let good = frame(v6, None, 4242, 9000, 120);
            let l3 = L3::parse(&good).expect("ip");
            let l4 = l3.l4.expect("l4");
            let (src, dst) = if v6 {
                (&good[l3.at + 8..l3.at + 24], &good[l3.at + 24..l3.at + 40])
            } else {
                (&good[l3.at + 12..l3.at + 16], &good[l3.at + 16..l3.at + 20])
            };
            let udp_len = u16::from_be_bytes([good[l4 + 4], good[l4 + 5]]);
            let pseudo = checksum::fold(checksum::pseudo_header(src, dst, udp_len.into()));
            let mut partial = good.clone();
            partial[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
            assert_eq!(complete_partial(&mut partial, &l3), Ok(true), "v6 {v6}");
            assert_eq!(partial, good, "v6 {v6}");
            let mut same = good.clone();
            assert_eq!(complete_partial(&mut same, &l3), Ok(false));
            assert_eq!(same, good);
            // Offloaded, and its checksum happens to equal the pseudo header's sum: complete
            // as it came, counted. Made so by a payload word that brings the sum there.
            let mut lucky = good.clone();
            let c = u16::from_be_bytes([good[l4 + 6], good[l4 + 7]]);
            let end = lucky.len() - 2;
            let w = u16::from_be_bytes([lucky[end], lucky[end + 1]]);
            // Raising the payload by d lowers the checksum by d: d = c − pseudo (one's
            // complement), so the checksum becomes the pseudo header's sum.
            let d = checksum::fold(u64::from(c) + u64::from(!pseudo));
            let nw = checksum::fold(u64::from(w) + u64::from(d));
            lucky[end..end + 2].copy_from_slice(&nw.to_be_bytes());
            lucky[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
            let l3x = L3::parse(&lucky).expect("ip");
            let before = lucky.clone();
            let mut check = lucky.clone();
            fill_checksum(&mut check, &l3x).expect("fills");
            assert_eq!(check, before, "v6 {v6}: the made frame is valid as it is");
            assert_eq!(complete_partial(&mut lucky, &l3x), Ok(true));
            assert_eq!(lucky, before, "left as it came");
            let mut corrupt = good.clone();
            corrupt[l4 + 6] ^= 0x40;
            let before = corrupt.clone();
            assert_eq!(complete_partial(&mut corrupt, &l3), Ok(false));
            assert_eq!(corrupt, before, "a corrupt checksum is not made valid");
            if !v6 {
                let mut none = good.clone();
                none[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
                let before = none.clone();
                assert_eq!(complete_partial(&mut none, &l3), Ok(false));
                assert_eq!(none, before);
            }
        }
    }

    #[test]
    fn hop_limit_and_refusals() {
        let mut f = frame(true, None, 1, 2, 100);
        let l3 = L3::parse(&f).expect("ip");
        assert!(l3.v6);
        assert_eq!(
            l3.dst_v6(&f),
            Some(0x2001_0002_0000_0000_0000_0000_0000_0002)
        );
        assert_eq!(l3.dst_v4(&f), None);
        let hl = f[l3.at + 7];
        decrement_ttl(&mut f, &l3).expect("forwards");
        assert_eq!(f[l3.at + 7], hl - 1);
        f[l3.at + 7] = 1;
        assert_eq!(decrement_ttl(&mut f, &l3), Err(Reason::TtlExceeded));
        // ARP: MACs only is fine, addresses are refused and the frame left alone.
        let mut arp = frame(false, None, 1, 2, 60);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let orig = arp.clone();
        let swap = Swap {
            ip: true,
            ports: false,
        };
        assert_eq!(reflect(&mut arp, swap), Err(Reason::NotIp));
        assert_eq!(arp, orig);
        reflect(&mut arp, Swap::default()).expect("MACs only");
        assert_eq!(&arp[0..6], &orig[6..12]);
        assert_eq!(
            reflect(&mut [0u8; 13], Swap::default()),
            Err(Reason::Malformed)
        );
        // An IPv4 total length beyond the frame is malformed.
        let mut bad = frame(false, None, 1, 2, 60);
        bad[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(L3::parse(&bad), Err(Reason::Malformed));
        let names: Vec<_> = Reason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), 6);
    }
}
