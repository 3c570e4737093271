//! The flow key: an IPv4 or IPv6 5-tuple, with an interface (or VLAN) where asked, in ten
//! 32-bit words (40 bytes) so that comparing and hashing are a few word operations.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol numbers the table treats specially.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;

/// One flow's key. IPv4 addresses sit in the last word of their 16 bytes, and the family is
/// part of the key, so an IPv4 flow never equals an IPv6 one.
#[derive(Debug, Clone, Copy, Eq, Default, PartialOrd, Ord)]
pub struct FlowKey {
    words: [u32; 10],
}

/// Word by word without a branch: the derived comparison calls `memcmp` for the array (a
/// call per lookup, 42 % of a lookup loop's samples).
impl PartialEq for FlowKey {
    #[inline(always)]
    fn eq(&self, other: &FlowKey) -> bool {
        let mut d = 0u32;
        for (a, b) in self.words.iter().zip(&other.words) {
            d |= a ^ b;
        }
        d == 0
    }
}

/// Consistent with the comparison: the same words.
impl std::hash::Hash for FlowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

const V6: u32 = 1 << 16;

impl FlowKey {
    /// An IPv4 5-tuple.
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
        let mut words = [0u32; 10];
        words[3] = u32::from(src);
        words[7] = u32::from(dst);
        words[8] = (u32::from(sport) << 16) | u32::from(dport);
        words[9] = u32::from(proto) << 24;
        FlowKey { words }
    }

    /// An IPv6 5-tuple.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
        let mut words = [0u32; 10];
        let (s, d) = (u128::from(src), u128::from(dst));
        for i in 0..4 {
            words[i] = (s >> (96 - 32 * i)) as u32;
            words[4 + i] = (d >> (96 - 32 * i)) as u32;
        }
        words[8] = (u32::from(sport) << 16) | u32::from(dport);
        words[9] = (u32::from(proto) << 24) | V6;
        FlowKey { words }
    }

    /// A 5-tuple of either family; `None` when the families differ.
    pub fn new(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> Option<FlowKey> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(FlowKey::v4(s, d, sport, dport, proto)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(FlowKey::v6(s, d, sport, dport, proto)),
            _ => None,
        }
    }

    /// The same flow seen on interface (or VLAN) `iface`: a different key per interface.
    pub fn on(mut self, iface: u16) -> FlowKey {
        self.words[9] = (self.words[9] & !0xffff) | u32::from(iface);
        self
    }

    fn addr(&self, at: usize) -> IpAddr {
        if self.is_v6() {
            let mut v = 0u128;
            for i in 0..4 {
                v = (v << 32) | u128::from(self.words[at + i]);
            }
            IpAddr::V6(Ipv6Addr::from(v))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.words[at + 3]))
        }
    }

    /// Whether it is an IPv6 flow.
    pub fn is_v6(&self) -> bool {
        self.words[9] & V6 != 0
    }
    /// The source address.
    pub fn src(&self) -> IpAddr {
        self.addr(0)
    }
    /// The destination address.
    pub fn dst(&self) -> IpAddr {
        self.addr(4)
    }
    /// The source port.
    pub fn sport(&self) -> u16 {
        (self.words[8] >> 16) as u16
    }
    /// The destination port.
    pub fn dport(&self) -> u16 {
        self.words[8] as u16
    }
    /// The IP protocol.
    pub fn proto(&self) -> u8 {
        (self.words[9] >> 24) as u8
    }
    /// The interface or VLAN (0: not part of the key).
    pub fn iface(&self) -> u16 {
        self.words[9] as u16
    }

    /// The key's last word (where a key that straddles two cache lines ends).
    #[inline(always)]
    pub(crate) fn last_word(&self) -> &u32 {
        &self.words[9]
    }

    /// A keyed 64-bit hash: the five 64-bit words XORed with the seed's lanes, folded by
    /// three 64×64→128-bit multiplies (high half XOR low half, as foldhash and wyhash fold),
    /// then mixed. Keyed by the table's seed so that flows chosen by an attacker cannot be
    /// aimed at one bucket without knowing it. Written here rather than taken from a crate:
    /// one fixed-size key, inlined into the lookup (SipHash costs ~3× as much).
    #[inline]
    pub fn hash(&self, seed: u64) -> u64 {
        #[inline(always)]
        fn fold(a: u64, b: u64) -> u64 {
            let p = u128::from(a) * u128::from(b);
            (p as u64) ^ ((p >> 64) as u64)
        }
        let w = |i: usize| u64::from(self.words[2 * i]) << 32 | u64::from(self.words[2 * i + 1]);
        const K: [u64; 5] = [
            0x243F_6A88_85A3_08D3,
            0x1319_8A2E_0370_7344,
            0xA409_3822_299F_31D0,
            0x082E_FA98_EC4E_6C89,
            0x4528_21E6_38D0_1377,
        ];
        let a = fold(w(0) ^ K[0] ^ seed, w(1) ^ K[1]);
        let b = fold(w(2) ^ K[2], w(3) ^ K[3] ^ seed);
        let c = fold(w(4) ^ K[4], seed ^ K[0].rotate_left(17));
        fold(a ^ c, b ^ K[1].rotate_left(31))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_and_families_differ() {
        let k = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 1, 2),
            1234,
            80,
            TCP,
        );
        assert_eq!(k.src().to_string(), "198.18.0.1");
        assert_eq!(k.dst().to_string(), "198.18.1.2");
        assert_eq!(
            (k.sport(), k.dport(), k.proto(), k.iface()),
            (1234, 80, TCP, 0)
        );
        assert!(!k.is_v6());
        let six = FlowKey::v6(
            "::ffff:198.18.0.1".parse().expect("v6"),
            "::ffff:198.18.1.2".parse().expect("v6"),
            1234,
            80,
            TCP,
        );
        assert_ne!(k, six, "an IPv4-mapped IPv6 flow is another flow");
        assert_eq!(six.src().to_string(), "::ffff:198.18.0.1");
        let on3 = k.on(3);
        assert_ne!(on3, k);
        assert_eq!((on3.iface(), on3.proto()), (3, TCP));
        assert_ne!(k.hash(1), k.hash(2), "the seed keys the hash");
        assert_eq!(k.hash(7), k.hash(7));
    }
}
