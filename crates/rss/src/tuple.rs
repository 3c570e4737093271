//! Flow tuples in the exact byte layout the Toeplitz hash consumes.
//!
//! A [`Tuple`] stores its hash input — source address, destination address, then (for a 4-tuple)
//! source port and destination port, all in network byte order — so hashing never re-serializes.
//! Fragments carry no ports beyond the first, so NICs hash every fragment on the 2-tuple:
//! use [`Tuple::addrs_only`] for them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Longest hash input: an IPv6 4-tuple (16 + 16 + 2 + 2 bytes).
pub const MAX_INPUT_LEN: usize = 36;

/// Which fields a tuple holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TupleKind {
    /// IPv4 source and destination addresses (8 input bytes).
    V4Addrs,
    /// IPv4 addresses and ports (12 input bytes).
    V4Ports,
    /// IPv6 addresses (32 input bytes).
    V6Addrs,
    /// IPv6 addresses and ports (36 input bytes).
    V6Ports,
}

impl TupleKind {
    /// Hash input length in bytes.
    #[inline]
    pub fn input_len(self) -> usize {
        match self {
            TupleKind::V4Addrs => 8,
            TupleKind::V4Ports => 12,
            TupleKind::V6Addrs => 32,
            TupleKind::V6Ports => 36,
        }
    }

    /// Address length in bytes (4 or 16).
    #[inline]
    pub fn addr_len(self) -> usize {
        match self {
            TupleKind::V4Addrs | TupleKind::V4Ports => 4,
            TupleKind::V6Addrs | TupleKind::V6Ports => 16,
        }
    }

    /// Whether ports are part of the hash input.
    #[inline]
    pub fn has_ports(self) -> bool {
        matches!(self, TupleKind::V4Ports | TupleKind::V6Ports)
    }

    /// Short name as used in output: `ipv4-2tuple`, `ipv4-4tuple`, `ipv6-2tuple`, `ipv6-4tuple`.
    pub fn name(self) -> &'static str {
        match self {
            TupleKind::V4Addrs => "ipv4-2tuple",
            TupleKind::V4Ports => "ipv4-4tuple",
            TupleKind::V6Addrs => "ipv6-2tuple",
            TupleKind::V6Ports => "ipv6-4tuple",
        }
    }
}

/// How a NIC makes the hash the same in both directions of a flow.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Symmetric {
    /// Plain Toeplitz: (a → b) and (b → a) usually hash differently.
    #[default]
    Off,
    /// Linux `RXH_XFRM_SYM_XOR` (ethtool `xfrm symmetric-xor`, Intel ice/iavf): the input becomes
    /// `(src^dst, src^dst, sport^dport, sport^dport)` before hashing.
    Xor,
    /// Sort before hash (DPDK's `RTE_ETH_HASH_FUNCTION_SYMMETRIC_TOEPLITZ_SORT`, software RSS):
    /// the endpoint `(addr, port)` that compares smaller is put first.
    Sort,
}

impl Symmetric {
    /// The name the output uses: `off`, `xor`, `sort`.
    pub fn name(self) -> &'static str {
        match self {
            Symmetric::Off => "off",
            Symmetric::Xor => "xor",
            Symmetric::Sort => "sort",
        }
    }
}

/// Why a tuple could not be made or parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TupleError {
    /// Source is IPv4 and destination IPv6, or the other way round.
    MixedFamilies,
    /// Ports were given for one end only.
    PortOnOneEnd,
    /// A line did not have 2 or 4 whitespace-separated fields; this many were found.
    FieldCount(usize),
    /// Field number (1-based) is not an IP address.
    BadAddr(usize),
    /// Field number (1-based) is not a port in 0..=65535.
    BadPort(usize),
}

impl fmt::Display for TupleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TupleError::MixedFamilies => {
                write!(f, "source and destination must both be IPv4 or both IPv6")
            }
            TupleError::PortOnOneEnd => {
                write!(
                    f,
                    "give ports on both ends (4-tuple) or on neither (2-tuple)"
                )
            }
            TupleError::FieldCount(n) => write!(
                f,
                "expected `SRC DST` or `SRC DST SPORT DPORT`, found {n} field(s)"
            ),
            TupleError::BadAddr(i) => write!(f, "field {i} is not an IPv4 or IPv6 address"),
            TupleError::BadPort(i) => write!(f, "field {i} is not a port number (0-65535)"),
        }
    }
}

impl std::error::Error for TupleError {}

/// A flow tuple, stored as its Toeplitz input bytes (network order), zero-padded.
///
/// Invariant: `len` is 8, 12, 32 or 36 and every byte of `bytes` past `len` is zero. The SIMD
/// hash path relies on the fixed 40-byte `repr(C)` layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, align(8))]
pub struct Tuple {
    bytes: [u8; MAX_INPUT_LEN],
    len: u8,
    _pad: [u8; 3],
}

impl Tuple {
    fn from_parts(src: &[u8], dst: &[u8], ports: Option<(u16, u16)>) -> Tuple {
        let mut t = Tuple {
            bytes: [0; MAX_INPUT_LEN],
            len: 0,
            _pad: [0; 3],
        };
        let a = src.len();
        t.bytes[..a].copy_from_slice(src);
        t.bytes[a..2 * a].copy_from_slice(dst);
        let mut len = 2 * a;
        if let Some((sp, dp)) = ports {
            t.bytes[len..len + 2].copy_from_slice(&sp.to_be_bytes());
            t.bytes[len + 2..len + 4].copy_from_slice(&dp.to_be_bytes());
            len += 4;
        }
        t.len = len as u8;
        t
    }

    /// A tuple from raw hash input bytes (8, 12, 32 or 36 of them), e.g. taken from a capture.
    pub fn from_input_bytes(input: &[u8]) -> Option<Tuple> {
        let (a, ports) = match input.len() {
            8 => (4, false),
            12 => (4, true),
            32 => (16, false),
            36 => (16, true),
            _ => return None,
        };
        let ports = ports.then(|| {
            let p = &input[2 * a..];
            (
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            )
        });
        Some(Tuple::from_parts(&input[..a], &input[a..2 * a], ports))
    }

    /// IPv4 4-tuple.
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> Tuple {
        Tuple::from_parts(&src.octets(), &dst.octets(), Some((src_port, dst_port)))
    }

    /// IPv4 2-tuple (addresses only).
    pub fn v4_addrs(src: Ipv4Addr, dst: Ipv4Addr) -> Tuple {
        Tuple::from_parts(&src.octets(), &dst.octets(), None)
    }

    /// IPv6 4-tuple.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16, dst_port: u16) -> Tuple {
        Tuple::from_parts(&src.octets(), &dst.octets(), Some((src_port, dst_port)))
    }

    /// IPv6 2-tuple (addresses only).
    pub fn v6_addrs(src: Ipv6Addr, dst: Ipv6Addr) -> Tuple {
        Tuple::from_parts(&src.octets(), &dst.octets(), None)
    }

    /// A tuple from two addresses and optional ports (`None` = 2-tuple).
    pub fn new(src: IpAddr, dst: IpAddr, ports: Option<(u16, u16)>) -> Result<Tuple, TupleError> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                Ok(Tuple::from_parts(&s.octets(), &d.octets(), ports))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                Ok(Tuple::from_parts(&s.octets(), &d.octets(), ports))
            }
            _ => Err(TupleError::MixedFamilies),
        }
    }

    /// A 4-tuple from two socket addresses.
    pub fn from_socket_addrs(src: SocketAddr, dst: SocketAddr) -> Result<Tuple, TupleError> {
        Tuple::new(src.ip(), dst.ip(), Some((src.port(), dst.port())))
    }

    /// Parses a line `SRC DST [SPORT DPORT]` (whitespace-separated; IPv4 or IPv6).
    pub fn parse_line(line: &str) -> Result<Tuple, TupleError> {
        let mut fields = [""; 4];
        let mut n = 0;
        for f in line.split_ascii_whitespace() {
            if n < 4 {
                fields[n] = f;
            }
            n += 1;
        }
        if n != 2 && n != 4 {
            return Err(TupleError::FieldCount(n));
        }
        let src: IpAddr = fields[0].parse().map_err(|_| TupleError::BadAddr(1))?;
        let dst: IpAddr = fields[1].parse().map_err(|_| TupleError::BadAddr(2))?;
        let ports = if n == 4 {
            let sp: u16 = fields[2].parse().map_err(|_| TupleError::BadPort(3))?;
            let dp: u16 = fields[3].parse().map_err(|_| TupleError::BadPort(4))?;
            Some((sp, dp))
        } else {
            None
        };
        Tuple::new(src, dst, ports)
    }

    /// The hash input bytes.
    #[inline]
    pub fn input(&self) -> &[u8] {
        &self.bytes[..self.input_len()]
    }

    /// Hash input length in bytes: 8, 12, 32 or 36.
    #[inline]
    pub fn input_len(&self) -> usize {
        // The invariant keeps `len` <= MAX_INPUT_LEN; `min` lets the compiler drop bound checks.
        (self.len as usize).min(MAX_INPUT_LEN)
    }

    /// The hash input zero-padded to [`MAX_INPUT_LEN`] bytes (fast paths index it directly).
    #[inline]
    pub fn padded_input(&self) -> &[u8; MAX_INPUT_LEN] {
        &self.bytes
    }

    /// What the tuple holds.
    #[inline]
    pub fn kind(&self) -> TupleKind {
        match self.len {
            8 => TupleKind::V4Addrs,
            12 => TupleKind::V4Ports,
            32 => TupleKind::V6Addrs,
            _ => TupleKind::V6Ports,
        }
    }

    fn addr(&self, off: usize) -> IpAddr {
        if self.kind().addr_len() == 4 {
            let mut o = [0u8; 4];
            o.copy_from_slice(&self.bytes[off..off + 4]);
            IpAddr::V4(Ipv4Addr::from(o))
        } else {
            let mut o = [0u8; 16];
            o.copy_from_slice(&self.bytes[off..off + 16]);
            IpAddr::V6(Ipv6Addr::from(o))
        }
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        self.addr(0)
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        self.addr(self.kind().addr_len())
    }

    /// `(src_port, dst_port)` for a 4-tuple.
    pub fn ports(&self) -> Option<(u16, u16)> {
        let a = self.kind().addr_len();
        self.kind().has_ports().then(|| {
            let b = &self.bytes[2 * a..2 * a + 4];
            (
                u16::from_be_bytes([b[0], b[1]]),
                u16::from_be_bytes([b[2], b[3]]),
            )
        })
    }

    /// The same flow without ports: what NICs hash for IP fragments (RSS on the 2-tuple).
    pub fn addrs_only(&self) -> Tuple {
        let a = self.kind().addr_len();
        Tuple::from_parts(&self.bytes[..a], &self.bytes[a..2 * a], None)
    }

    /// The reverse direction: source and destination (and ports) swapped.
    pub fn reversed(&self) -> Tuple {
        let a = self.kind().addr_len();
        Tuple::from_parts(
            &self.bytes[a..2 * a],
            &self.bytes[..a],
            self.ports().map(|(s, d)| (d, s)),
        )
    }

    /// The input the NIC actually hashes under a symmetric-hashing model.
    pub fn symmetric(&self, mode: Symmetric) -> Tuple {
        let a = self.kind().addr_len();
        match mode {
            Symmetric::Off => *self,
            Symmetric::Xor => {
                let mut t = *self;
                for i in 0..a {
                    let x = self.bytes[i] ^ self.bytes[a + i];
                    t.bytes[i] = x;
                    t.bytes[a + i] = x;
                }
                if self.kind().has_ports() {
                    for i in 0..2 {
                        let x = self.bytes[2 * a + i] ^ self.bytes[2 * a + 2 + i];
                        t.bytes[2 * a + i] = x;
                        t.bytes[2 * a + 2 + i] = x;
                    }
                }
                t
            }
            Symmetric::Sort => {
                let src = (&self.bytes[..a], self.ports().map(|p| p.0));
                let dst = (&self.bytes[a..2 * a], self.ports().map(|p| p.1));
                if dst < src {
                    self.reversed()
                } else {
                    *self
                }
            }
        }
    }
}

impl fmt::Display for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ports() {
            Some((sp, dp)) => write!(
                f,
                "{} -> {}",
                SocketAddr::new(self.src(), sp),
                SocketAddr::new(self.dst(), dp)
            ),
            None => write!(f, "{} -> {}", self.src(), self.dst()),
        }
    }
}

impl fmt::Debug for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tuple({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Tuple>(), 40);
    }

    #[test]
    fn v4_bytes_in_network_order() {
        let t = Tuple::v4(
            Ipv4Addr::new(66, 9, 149, 187),
            Ipv4Addr::new(161, 142, 100, 80),
            2794,
            1766,
        );
        assert_eq!(
            t.input(),
            &[66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6]
        );
        assert_eq!(t.kind(), TupleKind::V4Ports);
        assert_eq!(t.ports(), Some((2794, 1766)));
        assert_eq!(t.to_string(), "66.9.149.187:2794 -> 161.142.100.80:1766");
        assert_eq!(t.addrs_only().kind(), TupleKind::V4Addrs);
        assert_eq!(t.addrs_only().input(), &t.input()[..8]);
    }

    #[test]
    fn parse_lines() {
        let t = Tuple::parse_line(" 2001:2::1\t2001:2::2 10 20 ").expect("valid line");
        assert_eq!(t.kind(), TupleKind::V6Ports);
        assert_eq!(t.to_string(), "[2001:2::1]:10 -> [2001:2::2]:20");
        assert_eq!(
            Tuple::parse_line("1.2.3.4 5.6.7.8").map(|t| t.kind()),
            Ok(TupleKind::V4Addrs)
        );
        assert_eq!(Tuple::parse_line(""), Err(TupleError::FieldCount(0)));
        assert_eq!(Tuple::parse_line("1.2.3.4"), Err(TupleError::FieldCount(1)));
        assert_eq!(
            Tuple::parse_line("1.2.3.4 5.6.7.8 1"),
            Err(TupleError::FieldCount(3))
        );
        assert_eq!(
            Tuple::parse_line("1.2.3.4 5.6.7.8 1 2 3"),
            Err(TupleError::FieldCount(5))
        );
        assert_eq!(
            Tuple::parse_line("1.2.3 5.6.7.8"),
            Err(TupleError::BadAddr(1))
        );
        assert_eq!(
            Tuple::parse_line("1.2.3.4 5.6.7.8 1 65536"),
            Err(TupleError::BadPort(4))
        );
        assert_eq!(
            Tuple::parse_line("1.2.3.4 ::1"),
            Err(TupleError::MixedFamilies)
        );
    }

    #[test]
    fn symmetric_transforms_are_direction_free() {
        let t = Tuple::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 19, 0, 1),
            1000,
            8080,
        );
        for mode in [Symmetric::Xor, Symmetric::Sort] {
            assert_eq!(t.symmetric(mode), t.reversed().symmetric(mode), "{mode:?}");
        }
        assert_ne!(
            t.symmetric(Symmetric::Off),
            t.reversed().symmetric(Symmetric::Off)
        );
        let x = t.symmetric(Symmetric::Xor);
        assert_eq!(&x.input()[..4], &[0, 1, 0, 0]);
        assert_eq!(x.ports(), Some((1000 ^ 8080, 1000 ^ 8080)));
    }
}
