//! The flow key: an IPv4 or IPv6 5-tuple, with an interface (or VLAN) where asked, in ten
//! 32-bit words (40 bytes) so that comparing and hashing are a few word operations.
//!
//! The words: ports, then protocol, family and interface, then the addresses. An IPv4 key
//! is whole in its first four words (16 bytes) and its other six are zero, so comparing with
//! an IPv4 key reads 16 bytes of a stored key, not 40: a stored key straddles two cache
//! lines far less often (in 56-byte records, 1 time in 8 instead of 4 — BENCHMARKS.md, "Flow
//! table").

use std::cmp::Ordering;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol numbers the table treats specially.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;

/// One flow's key. The family is part of the key, so an IPv4 flow never equals an IPv6 one
/// (nor an IPv4-mapped IPv6 address its IPv4 address).
#[derive(Debug, Clone, Copy, Eq, Default)]
pub struct FlowKey {
    words: [u32; 10],
}

/// Word by word without a branch on the words: the derived comparison calls `memcmp` for the
/// array (a call per lookup, 42 % of a lookup loop's samples). An IPv4 key's words past the
/// fourth are zero (every constructor leaves them so), and the family is in word 1: equal
/// first four words with an IPv4 key make the other key IPv4 too, so its remaining words are
/// zero as well, and the four decide. The left side's family decides how many words are
/// read, so the table puts the key it looks up on the left.
impl PartialEq for FlowKey {
    #[inline(always)]
    fn eq(&self, other: &FlowKey) -> bool {
        let (a, b) = (&self.words, &other.words);
        let head = (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]);
        if self.is_v6() {
            let mut d = head;
            for i in 4..10 {
                d |= a[i] ^ b[i];
            }
            d == 0
        } else {
            head == 0
        }
    }
}

/// Consistent with the comparison: the same words.
impl std::hash::Hash for FlowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

/// By source address, destination address, ports, then protocol, family and interface (an
/// IPv4 address orders as the number it is, among IPv6 ones as `::a.b.c.d`).
impl Ord for FlowKey {
    fn cmp(&self, other: &FlowKey) -> Ordering {
        (
            self.addr_bits(SRC),
            self.addr_bits(DST),
            self.words[0],
            self.words[1],
        )
            .cmp(&(
                other.addr_bits(SRC),
                other.addr_bits(DST),
                other.words[0],
                other.words[1],
            ))
    }
}

impl PartialOrd for FlowKey {
    fn partial_cmp(&self, other: &FlowKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The accessors of the two words both keys begin with: ports, then protocol, family and
/// interface.
macro_rules! head_accessors {
    () => {
        /// The source port.
        pub fn sport(&self) -> u16 {
            (self.words[0] >> 16) as u16
        }
        /// The destination port.
        pub fn dport(&self) -> u16 {
            self.words[0] as u16
        }
        /// The IP protocol.
        pub fn proto(&self) -> u8 {
            (self.words[1] >> 24) as u8
        }
        /// The interface or VLAN (0: not part of the key).
        pub fn iface(&self) -> u16 {
            self.words[1] as u16
        }
    };
}

const SRC: usize = 0;
const DST: usize = 1;
const V6: u32 = 1 << 16;

impl FlowKey {
    /// An IPv4 5-tuple.
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
        let mut words = [0u32; 10];
        words[0] = (u32::from(sport) << 16) | u32::from(dport);
        words[1] = u32::from(proto) << 24;
        words[2] = u32::from(src);
        words[3] = u32::from(dst);
        FlowKey { words }
    }

    /// An IPv6 5-tuple.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
        let mut words = [0u32; 10];
        words[0] = (u32::from(sport) << 16) | u32::from(dport);
        words[1] = (u32::from(proto) << 24) | V6;
        let (s, d) = (u128::from(src), u128::from(dst));
        for i in 0..4 {
            words[2 + i] = (s >> (96 - 32 * i)) as u32;
            words[6 + i] = (d >> (96 - 32 * i)) as u32;
        }
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
        self.words[1] = (self.words[1] & !0xffff) | u32::from(iface);
        self
    }

    /// Address `which` (SRC or DST) as 128 bits (an IPv4 one in the low 32).
    fn addr_bits(&self, which: usize) -> u128 {
        if self.is_v6() {
            let at = 2 + 4 * which;
            (0..4).fold(0u128, |v, i| (v << 32) | u128::from(self.words[at + i]))
        } else {
            u128::from(self.words[2 + which])
        }
    }

    fn addr(&self, which: usize) -> IpAddr {
        let bits = self.addr_bits(which);
        if self.is_v6() {
            IpAddr::V6(Ipv6Addr::from(bits))
        } else {
            IpAddr::V4(Ipv4Addr::from(bits as u32))
        }
    }

    /// Whether it is an IPv6 flow.
    pub fn is_v6(&self) -> bool {
        self.words[1] & V6 != 0
    }
    /// The source address.
    pub fn src(&self) -> IpAddr {
        self.addr(SRC)
    }
    /// The destination address.
    pub fn dst(&self) -> IpAddr {
        self.addr(DST)
    }
    head_accessors!();

    /// A keyed 64-bit hash: the five 64-bit words XORed with the seed's lanes, folded by
    /// three 64×64→128-bit multiplies (high half XOR low half, as foldhash and wyhash fold),
    /// then mixed. Keyed by the table's seed so that flows chosen by an attacker cannot be
    /// aimed at one bucket without knowing it. Written here rather than taken from a crate:
    /// one fixed-size key, inlined into the lookup (SipHash costs ~3× as much).
    #[inline]
    pub fn hash(&self, seed: u64) -> u64 {
        // An IPv4 key's words 4-9 are zero: the same value from the seed alone, which a loop
        // of lookups computes once (two multiplies of three saved a key).
        let tail = if self.is_v6() {
            let w = |i: usize| pair(&self.words, i);
            (
                fold(w(2) ^ K[2], w(3) ^ K[3] ^ seed),
                fold(w(4) ^ K[4], seed ^ K[0].rotate_left(17)),
            )
        } else {
            zero_tail(seed)
        };
        finish(&self.words, seed, tail)
    }

    /// The IPv4 key, for an IPv4 flow.
    pub fn as_v4(&self) -> Option<V4Key> {
        (!self.is_v6()).then(|| V4Key {
            words: [self.words[0], self.words[1], self.words[2], self.words[3]],
        })
    }
}

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

const K: [u64; 5] = [
    0x243F_6A88_85A3_08D3,
    0x1319_8A2E_0370_7344,
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
    0x4528_21E6_38D0_1377,
];

/// Words `2i` and `2i + 1` as one, the first in the low half: on a little-endian CPU one
/// 64-bit load (the other order took two loads, two shifts and an OR, a key's hash and
/// comparison reading four pairs).
#[inline(always)]
fn pair(words: &[u32], i: usize) -> u64 {
    u64::from(words[2 * i]) | u64::from(words[2 * i + 1]) << 32
}

/// The hash from a key's first four words (either key's) and the folds of the rest.
#[inline(always)]
fn finish(words: &[u32], seed: u64, (b, c): (u64, u64)) -> u64 {
    let a = fold(pair(words, 0) ^ K[0] ^ seed, pair(words, 1) ^ K[1]);
    fold(a ^ c, b ^ K[1].rotate_left(31))
}

/// The hash's two folds of words 4-9 when they are zero (an IPv4 key's).
#[inline(always)]
fn zero_tail(seed: u64) -> (u64, u64) {
    (
        fold(K[2], K[3] ^ seed),
        fold(K[4], seed ^ K[0].rotate_left(17)),
    )
}

/// What a [`crate::FlowTable`] needs of its key: equality, a keyed hash, the IP protocol (a
/// new flow's timeout class) and how far a comparison reads (the lines a lookup prefetches).
pub trait TableKey: Copy + Eq + Default + std::fmt::Debug {
    /// A keyed 64-bit hash (the table's seed).
    fn keyed_hash(&self, seed: u64) -> u64;
    /// The IP protocol.
    fn protocol(&self) -> u8;
    /// Bytes of another key, from its start, that `self == other` reads.
    fn compared_bytes(&self) -> usize;
}

/// Both keys: their own hash and protocol; how much a comparison reads.
macro_rules! table_key {
    ($t:ty, |$k:ident| $bytes:expr) => {
        impl TableKey for $t {
            #[inline(always)]
            fn keyed_hash(&self, seed: u64) -> u64 {
                self.hash(seed)
            }
            fn protocol(&self) -> u8 {
                self.proto()
            }
            #[inline(always)]
            fn compared_bytes(&self) -> usize {
                let $k = self;
                $bytes
            }
        }
    };
}

table_key!(FlowKey, |k| if k.is_v6() { 40 } else { 16 });
table_key!(V4Key, |_k| 16);

/// An IPv4 5-tuple, with an interface (or VLAN) where asked, in 16 bytes: the key of a table
/// that holds IPv4 flows only. Its records are 24 bytes smaller than [`FlowKey`]'s (32 bytes
/// with a 4-byte value, against 56), as DPDK's l3fwd keys its IPv4 table on 16 bytes rather
/// than sharing one key with IPv6. The same words as an IPv4 [`FlowKey`]'s first four, and
/// the same hash.
#[derive(Debug, Clone, Copy, Eq, Default)]
pub struct V4Key {
    words: [u32; 4],
}

impl V4Key {
    /// An IPv4 5-tuple.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> V4Key {
        V4Key {
            words: [
                (u32::from(sport) << 16) | u32::from(dport),
                u32::from(proto) << 24,
                u32::from(src),
                u32::from(dst),
            ],
        }
    }

    /// The same flow seen on interface (or VLAN) `iface`: a different key per interface.
    pub fn on(mut self, iface: u16) -> V4Key {
        self.words[1] = (self.words[1] & !0xffff) | u32::from(iface);
        self
    }

    /// The source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.words[2])
    }
    /// The destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.words[3])
    }
    head_accessors!();

    /// The hash of the same flow as a [`FlowKey`] (its other words are zero).
    #[inline]
    pub fn hash(&self, seed: u64) -> u64 {
        finish(&self.words, seed, zero_tail(seed))
    }
}

/// Two 64-bit compares (the derived one may call `memcmp`).
impl PartialEq for V4Key {
    #[inline(always)]
    fn eq(&self, other: &V4Key) -> bool {
        let (a, b) = (&self.words, &other.words);
        (pair(a, 0) ^ pair(b, 0)) | (pair(a, 1) ^ pair(b, 1)) == 0
    }
}

impl std::hash::Hash for V4Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

/// As [`FlowKey`]'s: source, destination, ports, then protocol and interface.
impl Ord for V4Key {
    fn cmp(&self, other: &V4Key) -> Ordering {
        let order = |k: &V4Key| (k.words[2], k.words[3], k.words[0], k.words[1]);
        order(self).cmp(&order(other))
    }
}

impl PartialOrd for V4Key {
    fn partial_cmp(&self, other: &V4Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl From<V4Key> for FlowKey {
    fn from(k: V4Key) -> FlowKey {
        let mut words = [0u32; 10];
        words[..4].copy_from_slice(&k.words);
        FlowKey { words }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A key's fields, as a reference to compare and order by.
    type Fields = (bool, u128, u128, u16, u16, u8, u16);

    fn build(f: Fields) -> FlowKey {
        let (v6, s, d, sp, dp, proto, iface) = f;
        if v6 {
            FlowKey::v6(Ipv6Addr::from(s), Ipv6Addr::from(d), sp, dp, proto).on(iface)
        } else {
            FlowKey::v4(
                Ipv4Addr::from(s as u32),
                Ipv4Addr::from(d as u32),
                sp,
                dp,
                proto,
            )
            .on(iface)
        }
    }

    /// Fields from a small alphabet, so that equal and nearly equal keys are common: IPv4
    /// and IPv6 keys with the same numbers (an IPv4 address and `::a.b.c.d`), the same
    /// ports with another protocol or interface.
    fn fields() -> impl Strategy<Value = Fields> {
        let addr = prop_oneof![0u128..3, Just(0xc612_0001), Just(0x2001_0002u128 << 96 | 7)];
        (
            any::<bool>(),
            addr.clone(),
            addr,
            0u16..2,
            0u16..2,
            prop_oneof![Just(6u8), Just(17)],
            0u16..2,
        )
            .prop_map(|(v6, s, d, sp, dp, p, i)| {
                let m = |a: u128| if v6 { a } else { a as u32 as u128 };
                (v6, m(s), m(d), sp, dp, p, i)
            })
    }

    proptest! {
        /// Equality reads four words of an IPv4 key and ten of an IPv6 one, from either
        /// side, and is exactly the fields' equality; the order is the fields' order (source,
        /// destination, ports, then protocol, family, interface); equal keys hash alike.
        #[test]
        fn equality_and_order_are_the_fields(a in fields(), b in fields()) {
            let (ka, kb) = (build(a), build(b));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(kb == ka, a == b);
            let order = |f: Fields| (f.1, f.2, f.3, f.4, f.5, f.0, f.6);
            prop_assert_eq!(ka.cmp(&kb), order(a).cmp(&order(b)));
            if a == b {
                prop_assert_eq!(ka.hash(9), kb.hash(9));
            }
            let (v6, s, d, sp, dp, proto, iface) = a;
            prop_assert_eq!(ka.is_v6(), v6);
            let back = |ip: IpAddr| match ip {
                IpAddr::V4(x) => u128::from(u32::from(x)),
                IpAddr::V6(x) => u128::from(x),
            };
            prop_assert_eq!((back(ka.src()), back(ka.dst())), (s, d));
            prop_assert_eq!((ka.sport(), ka.dport(), ka.proto(), ka.iface()), (sp, dp, proto, iface));
        }
    }

    /// An IPv4 5-tuple's fields, from a small alphabet (equal keys are common).
    fn v4_fields() -> impl Strategy<Value = (u32, u32, u16, u16, u8, u16)> {
        (
            0u32..3,
            0u32..3,
            0u16..2,
            0u16..2,
            prop_oneof![Just(6u8), Just(17)],
            0u16..2,
        )
    }

    proptest! {
        /// The 16-byte key is the IPv4 FlowKey's first four words: equal exactly when the
        /// fields are, the same hash, the same order, and each converts to the other.
        #[test]
        fn an_ipv4_key_is_the_flow_keys_first_words(a in v4_fields(), b in v4_fields()) {
            let v4 = |f: (u32, u32, u16, u16, u8, u16)| {
                V4Key::new(Ipv4Addr::from(f.0), Ipv4Addr::from(f.1), f.2, f.3, f.4).on(f.5)
            };
            let full = |f: (u32, u32, u16, u16, u8, u16)| {
                FlowKey::v4(Ipv4Addr::from(f.0), Ipv4Addr::from(f.1), f.2, f.3, f.4).on(f.5)
            };
            let (ka, kb) = (v4(a), v4(b));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(FlowKey::from(ka), full(a));
            prop_assert_eq!(full(a).as_v4(), Some(ka));
            prop_assert_eq!(ka.hash(3), full(a).hash(3));
            prop_assert_eq!(ka.cmp(&kb), full(a).cmp(&full(b)));
            prop_assert_eq!(
                (u32::from(ka.src()), u32::from(ka.dst()), ka.sport(), ka.dport(), ka.proto(), ka.iface()),
                a
            );
        }
    }

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
        assert_eq!(six.as_v4(), None);
        assert_eq!(six.src().to_string(), "::ffff:198.18.0.1");
        let on3 = k.on(3);
        assert_ne!(on3, k);
        assert_eq!((on3.iface(), on3.proto()), (3, TCP));
        assert_ne!(k.hash(1), k.hash(2), "the seed keys the hash");
        assert_eq!(k.hash(7), k.hash(7));
    }
}
