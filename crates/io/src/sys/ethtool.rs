//! An interface's RSS and queues as `ethtool` reads them: generic netlink's `ethtool` family
//! where the kernel has the message (`RSS_GET`, `CHANNELS_GET`, `RINGS_GET`), the
//! `SIOCETHTOOL` ioctl where it has not (and for what netlink does not carry on every kernel:
//! the driver's name and bus, the hash fields per flow type). Every reader says which way it
//! went ([`Via`]); a driver without the operation answers `EOPNOTSUPP`, which callers report as
//! "not supported", never as a guess.
//!
//! The decoders (`*_of`) are pure and tested on messages and structures encoded as the kernel
//! writes them (the kernel's `Documentation/netlink/specs/ethtool.yaml` and
//! `include/uapi/linux/ethtool.h` are the reference).

use std::io;

use super::netdev::ethtool_buf;
use super::netlink::{
    attributes, genl_request, push_attr, u32_at, Rtnl, GENL_HDRLEN, NLA_F_NESTED, NLM_F_DUMP,
};
use super::SysError;

/// How a reading was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Generic netlink, the `ethtool` family.
    Netlink,
    /// The `SIOCETHTOOL` ioctl.
    Ioctl,
}

impl Via {
    /// `netlink` or `ioctl`.
    pub fn name(self) -> &'static str {
        match self {
            Via::Netlink => "netlink",
            Via::Ioctl => "ioctl",
        }
    }
}

/// One RSS context's configuration (`ethtool -x`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rss {
    /// The context (0: the default one).
    pub context: u32,
    /// The hash function in use, as `ETH_RSS_HASH_*` bits (1 Toeplitz, 2 XOR, 4 CRC32).
    pub hfunc: Option<u32>,
    /// The input transform (`RXH_XFRM_*`: 1 symmetric-xor, 2 symmetric-or-xor).
    pub input_xfrm: Option<u32>,
    /// The indirection table: entry → queue.
    pub indir: Vec<u32>,
    /// The hash key.
    pub key: Vec<u8>,
}

/// Channel counts and their maxima (`ethtool -l`); `None`: the driver gave none ("n/a").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Channels {
    pub max_rx: Option<u32>,
    pub max_tx: Option<u32>,
    pub max_other: Option<u32>,
    pub max_combined: Option<u32>,
    pub rx: Option<u32>,
    pub tx: Option<u32>,
    pub other: Option<u32>,
    pub combined: Option<u32>,
}

/// Ring sizes and their maxima (`ethtool -g`); `None`: the driver gave none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rings {
    pub rx_max: Option<u32>,
    pub rx_mini_max: Option<u32>,
    pub rx_jumbo_max: Option<u32>,
    pub tx_max: Option<u32>,
    pub rx: Option<u32>,
    pub rx_mini: Option<u32>,
    pub rx_jumbo: Option<u32>,
    pub tx: Option<u32>,
}

/// Ethernet flow control (`ethtool -a`) and the pause frames counted (`ethtool -I -a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pause {
    /// Pause settings follow autonegotiation.
    pub autoneg: Option<bool>,
    /// Honour received pause frames (the link partner can stop our sending).
    pub rx: Option<bool>,
    /// Send pause frames (we can stop the partner's).
    pub tx: Option<bool>,
    /// Pause frames received and sent, where the driver counts them.
    pub rx_frames: Option<u64>,
    pub tx_frames: Option<u64>,
}

/// The driver and where the device sits (`ethtool -i`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriverInfo {
    pub driver: String,
    pub version: String,
    pub firmware: String,
    /// The bus address (`0000:03:00.0`); empty for a virtual device.
    pub bus: String,
}

/// `ETH_RSS_HASH_*` bit → ethtool's name for the function.
pub fn hash_function_name(bits: u32) -> &'static str {
    match bits {
        1 => "toeplitz",
        2 => "xor",
        4 => "crc32",
        0 => "none reported",
        _ => "unknown",
    }
}

/// `RXH_XFRM_*` bits → ethtool's name for the input transform.
pub fn input_xfrm_name(bits: u32) -> &'static str {
    match bits {
        0 => "none",
        1 => "symmetric-xor",
        2 => "symmetric-or-xor",
        _ => "unknown",
    }
}

/// The flow types `ethtool -n IF rx-flow-hash T` asks about: (`*_FLOW` value, ethtool's name).
pub const FLOW_TYPES: [(u32, &str); 10] = [
    (0x01, "tcp4"),
    (0x02, "udp4"),
    (0x03, "sctp4"),
    (0x04, "ah4/esp4"),
    (0x05, "tcp6"),
    (0x06, "udp6"),
    (0x07, "sctp6"),
    (0x08, "ah6/esp6"),
    (0x10, "ip4"),
    (0x11, "ip6"),
];

/// The `RXH_*` bits of a hash-fields answer, by ethtool's words.
pub const HASH_FIELDS: [(u64, &str); 9] = [
    (1 << 1, "l2-dst-mac"),
    (1 << 2, "vlan"),
    (1 << 3, "l3-proto"),
    (1 << 4, "ip-src"),
    (1 << 5, "ip-dst"),
    (1 << 6, "l4-src-port"),
    (1 << 7, "l4-dst-port"),
    (1 << 8, "gtp-teid"),
    (1 << 9, "ip6-flow-label"),
];

/// `RXH_DISCARD`: frames of the flow type are dropped, not hashed.
pub const HASH_DISCARD: u64 = 1 << 31;

/// The field names of an `RXH_*` mask.
pub fn hash_field_names(mask: u64) -> Vec<&'static str> {
    HASH_FIELDS
        .iter()
        .filter(|(b, _)| mask & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

// The ethtool netlink messages and attributes (uapi/linux/ethtool_netlink_generated.h).
const ETHTOOL_MSG_RINGS_GET: u8 = 15;
const ETHTOOL_MSG_CHANNELS_GET: u8 = 17;
const ETHTOOL_MSG_RSS_GET: u8 = 38;
const ETHTOOL_MSG_PAUSE_GET: u8 = 21;
const ETHTOOL_A_HEADER_FLAGS: u16 = 3;
/// `ETHTOOL_FLAG_STATS`: ask for the statistics too.
const ETHTOOL_FLAG_STATS: u32 = 4;
const ETHTOOL_A_PAUSE_AUTONEG: u16 = 2;
const ETHTOOL_A_PAUSE_RX: u16 = 3;
const ETHTOOL_A_PAUSE_TX: u16 = 4;
const ETHTOOL_A_PAUSE_STATS: u16 = 5;
const ETHTOOL_A_PAUSE_STAT_TX_FRAMES: u16 = 2;
const ETHTOOL_A_PAUSE_STAT_RX_FRAMES: u16 = 3;
const ETHTOOL_A_HEADER_DEV_NAME: u16 = 2;
/// Every request's first attribute is the header nest (`*_HEADER` = 1).
const A_HEADER: u16 = 1;
const ETHTOOL_A_RSS_CONTEXT: u16 = 2;
const ETHTOOL_A_RSS_HFUNC: u16 = 3;
const ETHTOOL_A_RSS_INDIR: u16 = 4;
const ETHTOOL_A_RSS_HKEY: u16 = 5;
const ETHTOOL_A_RSS_INPUT_XFRM: u16 = 6;

/// The `RSS_GET` reply's configuration (`None`: not a reply the decoder can read).
pub fn rss_of(payload: &[u8]) -> Option<Rss> {
    let mut r = Rss::default();
    for (kind, a) in attributes(payload.get(GENL_HDRLEN..)?) {
        match kind {
            ETHTOOL_A_RSS_CONTEXT => r.context = u32_at(a, 0)?,
            ETHTOOL_A_RSS_HFUNC => r.hfunc = u32_at(a, 0),
            ETHTOOL_A_RSS_INPUT_XFRM => r.input_xfrm = u32_at(a, 0),
            ETHTOOL_A_RSS_INDIR => {
                r.indir = a.chunks_exact(4).filter_map(|c| u32_at(c, 0)).collect()
            }
            ETHTOOL_A_RSS_HKEY => r.key = a.to_vec(),
            _ => {}
        }
    }
    Some(r)
}

/// The `PAUSE_GET` reply's settings and, where asked and counted, its statistics.
pub fn pause_of(payload: &[u8]) -> Option<Pause> {
    let mut p = Pause::default();
    let flag = |a: &[u8]| a.first().map(|&b| b != 0);
    let u64_of = |a: &[u8]| Some(u64::from_ne_bytes(a.get(..8)?.try_into().ok()?));
    for (kind, a) in attributes(payload.get(GENL_HDRLEN..)?) {
        match kind {
            ETHTOOL_A_PAUSE_AUTONEG => p.autoneg = flag(a),
            ETHTOOL_A_PAUSE_RX => p.rx = flag(a),
            ETHTOOL_A_PAUSE_TX => p.tx = flag(a),
            ETHTOOL_A_PAUSE_STATS => {
                for (k, v) in attributes(a) {
                    match k {
                        ETHTOOL_A_PAUSE_STAT_TX_FRAMES => p.tx_frames = u64_of(v),
                        ETHTOOL_A_PAUSE_STAT_RX_FRAMES => p.rx_frames = u64_of(v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(p)
}

/// The eight u32 attributes (2..=9) that `CHANNELS_GET` and `RINGS_GET` replies both carry,
/// in their order.
fn eight_u32(payload: &[u8]) -> Option<[Option<u32>; 8]> {
    let mut v = [None; 8];
    for (kind, a) in attributes(payload.get(GENL_HDRLEN..)?) {
        if let Some(slot) = (kind as usize).checked_sub(2).and_then(|i| v.get_mut(i)) {
            *slot = u32_at(a, 0);
        }
    }
    Some(v)
}

/// The `CHANNELS_GET` reply's counts.
pub fn channels_of(payload: &[u8]) -> Option<Channels> {
    let [max_rx, max_tx, max_other, max_combined, rx, tx, other, combined] = eight_u32(payload)?;
    Some(Channels {
        max_rx,
        max_tx,
        max_other,
        max_combined,
        rx,
        tx,
        other,
        combined,
    })
}

/// The `RINGS_GET` reply's sizes.
pub fn rings_of(payload: &[u8]) -> Option<Rings> {
    let [rx_max, rx_mini_max, rx_jumbo_max, tx_max, rx, rx_mini, rx_jumbo, tx] =
        eight_u32(payload)?;
    Some(Rings {
        rx_max,
        rx_mini_max,
        rx_jumbo_max,
        tx_max,
        rx,
        rx_mini,
        rx_jumbo,
        tx,
    })
}

/// A request of the ethtool family for interface `ifname`: the header nest with its name.
fn request(family: u16, cmd: u8, seq: u32, ifname: &str, dump: bool) -> Vec<u8> {
    let mut name = ifname.as_bytes().to_vec();
    name.push(0);
    let mut header = Vec::new();
    push_attr(&mut header, ETHTOOL_A_HEADER_DEV_NAME, &name);
    if cmd == ETHTOOL_MSG_PAUSE_GET {
        push_attr(
            &mut header,
            ETHTOOL_A_HEADER_FLAGS,
            &ETHTOOL_FLAG_STATS.to_ne_bytes(),
        );
    }
    let mut req = genl_request(family, cmd, seq, &[(A_HEADER | NLA_F_NESTED, &header)]);
    if dump {
        let flags = u16::from_ne_bytes([req[6], req[7]]) | NLM_F_DUMP;
        req[6..8].copy_from_slice(&flags.to_ne_bytes());
    }
    req
}

/// A generic netlink socket with the `ethtool` family resolved (`None` where the kernel has no
/// such family: before Linux 5.6, or built without it). One socket answers every request.
#[derive(Debug)]
pub struct Ethtool {
    nl: Option<(Rtnl, u16)>,
    seq: std::cell::Cell<u32>,
}

fn unsupported(e: &SysError) -> bool {
    matches!(
        e.source.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOENT)
    )
}

impl Ethtool {
    /// Opens the socket and resolves the family.
    pub fn open() -> Result<Ethtool, SysError> {
        let nl = Rtnl::open_protocol(libc::NETLINK_GENERIC, "netlink genl ethtool")?;
        let family = super::netlink::genl_family(&nl, b"ethtool\0")?;
        Ok(Ethtool {
            nl: family.map(|f| (nl, f)),
            seq: std::cell::Cell::new(1),
        })
    }

    /// Whether the kernel has the ethtool netlink family.
    pub fn has_netlink(&self) -> bool {
        self.nl.is_some()
    }

    fn ask(&self, cmd: u8, ifname: &str, dump: bool) -> Option<Result<Vec<Vec<u8>>, SysError>> {
        let (nl, family) = self.nl.as_ref()?;
        let seq = self.seq.get().wrapping_add(1);
        self.seq.set(seq);
        let req = request(*family, cmd, seq, ifname, dump);
        Some(nl.collect(&req, seq, *family, dump, 4096))
    }

    /// The default RSS context and, where the kernel lists them, the others.
    pub fn rss(&self, ifname: &str) -> Result<(Vec<Rss>, Via), SysError> {
        match self.ask(ETHTOOL_MSG_RSS_GET, ifname, false) {
            Some(Ok(r)) => {
                let mut all: Vec<Rss> = r.iter().filter_map(|p| rss_of(p)).collect();
                // Other contexts: a dump (Linux 6.11+); an older kernel refuses it, and the
                // default context is then all that is said.
                if let Some(Ok(d)) = self.ask(ETHTOOL_MSG_RSS_GET, ifname, true) {
                    all.extend(
                        d.iter()
                            .filter_map(|p| rss_of(p))
                            .filter(|c| c.context != 0),
                    );
                }
                Ok((all, Via::Netlink))
            }
            Some(Err(e)) if !unsupported(&e) => Err(e),
            // No family, or no such message on this kernel: the ioctl. (A driver without
            // RSS refuses both; the ioctl's refusal is then the answer.)
            _ => rxfh_ioctl(ifname).map(|r| (vec![r], Via::Ioctl)),
        }
    }

    /// The channel counts.
    pub fn channels(&self, ifname: &str) -> Result<(Channels, Via), SysError> {
        match self.ask(ETHTOOL_MSG_CHANNELS_GET, ifname, false) {
            Some(Ok(r)) => Ok((
                r.first().and_then(|p| channels_of(p)).unwrap_or_default(),
                Via::Netlink,
            )),
            Some(Err(e)) if !unsupported(&e) => Err(e),
            _ => channels_ioctl(ifname).map(|c| (c, Via::Ioctl)),
        }
    }

    /// Flow control and its pause-frame counts.
    pub fn pause(&self, ifname: &str) -> Result<(Pause, Via), SysError> {
        match self.ask(ETHTOOL_MSG_PAUSE_GET, ifname, false) {
            Some(Ok(r)) => Ok((
                r.first().and_then(|p| pause_of(p)).unwrap_or_default(),
                Via::Netlink,
            )),
            Some(Err(e)) if !unsupported(&e) => Err(e),
            _ => pause_ioctl(ifname).map(|p| (p, Via::Ioctl)),
        }
    }

    /// The ring sizes.
    pub fn rings(&self, ifname: &str) -> Result<(Rings, Via), SysError> {
        match self.ask(ETHTOOL_MSG_RINGS_GET, ifname, false) {
            Some(Ok(r)) => Ok((
                r.first().and_then(|p| rings_of(p)).unwrap_or_default(),
                Via::Netlink,
            )),
            Some(Err(e)) if !unsupported(&e) => Err(e),
            _ => rings_ioctl(ifname).map(|c| (c, Via::Ioctl)),
        }
    }
}

// The ioctl commands (uapi/linux/ethtool.h).
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GRINGPARAM: u32 = 0x10;
const ETHTOOL_GRXFH: u32 = 0x29;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GRSSH: u32 = 0x46;
/// `struct ethtool_rxfh` up to its `rss_config[]`.
const RXFH_HEADER: usize = 24;
/// `struct ethtool_drvinfo`.
const DRVINFO_LEN: usize = 196;
/// `struct ethtool_rxnfc` (with its flow spec), the most a hash-fields answer writes.
const RXNFC_LEN: usize = 192;
/// Bounds on what a driver may state, so a wrong size cannot ask for a huge buffer.
const MAX_INDIR: u32 = 1 << 16;
const MAX_KEY: u32 = 1 << 10;

/// One ioctl on a byte image of the structure: padded to whole 8-byte words (the buffer the
/// call takes), written back after.
fn ioctl_bytes(ifname: &str, bytes: &mut Vec<u8>, call: &'static str) -> Result<(), SysError> {
    let len = bytes.len();
    bytes.resize(len.next_multiple_of(8), 0);
    let mut words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
        .collect();
    ethtool_buf(ifname, &mut words, call)?;
    bytes.clear();
    bytes.extend(words.iter().flat_map(|w| w.to_ne_bytes()));
    bytes.truncate(len);
    Ok(())
}

fn command(cmd: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    b[..4].copy_from_slice(&cmd.to_ne_bytes());
    b
}

/// An `ethtool_rxfh` answer: the sizes in its header, then the table and the key.
pub fn rxfh_of(b: &[u8]) -> Option<Rss> {
    let indir_size = u32_at(b, 8)? as usize;
    let key_size = u32_at(b, 12)? as usize;
    let table = b.get(RXFH_HEADER..RXFH_HEADER.checked_add(indir_size.checked_mul(4)?)?)?;
    let key_at = RXFH_HEADER + indir_size * 4;
    Some(Rss {
        context: u32_at(b, 4)?,
        hfunc: b.get(16).map(|&h| u32::from(h)),
        input_xfrm: b.get(17).map(|&x| u32::from(x)),
        indir: table.chunks_exact(4).filter_map(|c| u32_at(c, 0)).collect(),
        key: b.get(key_at..key_at.checked_add(key_size)?)?.to_vec(),
    })
}

/// The default context's key, function and table through `ETHTOOL_GRSSH`: one call for the
/// sizes, one for the contents.
pub fn rxfh_ioctl(ifname: &str) -> Result<Rss, SysError> {
    const CALL: &str = "ioctl(SIOCETHTOOL, ETHTOOL_GRSSH)";
    let mut head = command(ETHTOOL_GRSSH, RXFH_HEADER);
    ioctl_bytes(ifname, &mut head, CALL)?;
    let bad = || SysError {
        call: CALL,
        source: io::Error::new(io::ErrorKind::InvalidData, "sizes out of bounds"),
    };
    let indir = u32_at(&head, 8)
        .filter(|&n| n <= MAX_INDIR)
        .ok_or_else(bad)?;
    let key = u32_at(&head, 12)
        .filter(|&n| n <= MAX_KEY)
        .ok_or_else(bad)?;
    let mut full = command(
        ETHTOOL_GRSSH,
        RXFH_HEADER + indir as usize * 4 + key as usize,
    );
    full[8..12].copy_from_slice(&indir.to_ne_bytes());
    full[12..16].copy_from_slice(&key.to_ne_bytes());
    ioctl_bytes(ifname, &mut full, CALL)?;
    rxfh_of(&full).ok_or_else(bad)
}

/// An `ethtool_channels` answer.
pub fn channels_ioctl_of(b: &[u8]) -> Option<Channels> {
    // The ioctl has no "n/a": a driver leaves 0 where it has none, as ethtool then prints.
    let f = |i: usize| u32_at(b, 4 + 4 * i).filter(|&v| v != 0);
    Some(Channels {
        max_rx: f(0),
        max_tx: f(1),
        max_other: f(2),
        max_combined: f(3),
        rx: f(4),
        tx: f(5),
        other: f(6),
        combined: f(7),
    })
    .filter(|_| b.len() >= 36)
}

/// The channel counts through `ETHTOOL_GCHANNELS`.
pub fn channels_ioctl(ifname: &str) -> Result<Channels, SysError> {
    let mut b = command(ETHTOOL_GCHANNELS, 36);
    ioctl_bytes(ifname, &mut b, "ioctl(SIOCETHTOOL, ETHTOOL_GCHANNELS)")?;
    Ok(channels_ioctl_of(&b).unwrap_or_default())
}

/// An `ethtool_ringparam` answer.
pub fn rings_ioctl_of(b: &[u8]) -> Option<Rings> {
    let f = |i: usize| u32_at(b, 4 + 4 * i).filter(|&v| v != 0);
    Some(Rings {
        rx_max: f(0),
        rx_mini_max: f(1),
        rx_jumbo_max: f(2),
        tx_max: f(3),
        rx: f(4),
        rx_mini: f(5),
        rx_jumbo: f(6),
        tx: f(7),
    })
    .filter(|_| b.len() >= 36)
}

/// The ring sizes through `ETHTOOL_GRINGPARAM`.
pub fn rings_ioctl(ifname: &str) -> Result<Rings, SysError> {
    let mut b = command(ETHTOOL_GRINGPARAM, 36);
    ioctl_bytes(ifname, &mut b, "ioctl(SIOCETHTOOL, ETHTOOL_GRINGPARAM)")?;
    Ok(rings_ioctl_of(&b).unwrap_or_default())
}

/// `ETHTOOL_GPAUSEPARAM`.
const ETHTOOL_GPAUSEPARAM: u32 = 0x12;

/// An `ethtool_pauseparam` answer (no counts: the ioctl has none).
pub fn pause_ioctl_of(b: &[u8]) -> Option<Pause> {
    let f = |i: usize| u32_at(b, 4 + 4 * i).map(|v| v != 0);
    Some(Pause {
        autoneg: f(0),
        rx: f(1),
        tx: f(2),
        rx_frames: None,
        tx_frames: None,
    })
    .filter(|_| b.len() >= 16)
}

/// Flow control through `ETHTOOL_GPAUSEPARAM`.
pub fn pause_ioctl(ifname: &str) -> Result<Pause, SysError> {
    let mut b = command(ETHTOOL_GPAUSEPARAM, 16);
    ioctl_bytes(ifname, &mut b, "ioctl(SIOCETHTOOL, ETHTOOL_GPAUSEPARAM)")?;
    Ok(pause_ioctl_of(&b).unwrap_or_default())
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// An `ethtool_drvinfo` answer.
pub fn drvinfo_of(b: &[u8]) -> Option<DriverInfo> {
    let field = |i: usize| b.get(4 + 32 * i..4 + 32 * (i + 1)).map(c_string);
    Some(DriverInfo {
        driver: field(0)?,
        version: field(1)?,
        firmware: field(2)?,
        bus: field(3)?,
    })
}

/// The driver and bus through `ETHTOOL_GDRVINFO` (netlink has no such message).
pub fn driver_info(ifname: &str) -> Result<DriverInfo, SysError> {
    const CALL: &str = "ioctl(SIOCETHTOOL, ETHTOOL_GDRVINFO)";
    let mut b = command(ETHTOOL_GDRVINFO, DRVINFO_LEN);
    ioctl_bytes(ifname, &mut b, CALL)?;
    drvinfo_of(&b).ok_or(SysError {
        call: CALL,
        source: io::Error::new(io::ErrorKind::InvalidData, "short answer"),
    })
}

/// The fields a flow type hashes on (`RXH_*` bits) through `ETHTOOL_GRXFH`, as `ethtool -n IF
/// rx-flow-hash T` asks (netlink carries them only from Linux 6.17, inside `RSS_GET`).
pub fn hash_fields(ifname: &str, flow_type: u32) -> Result<u64, SysError> {
    let mut b = command(ETHTOOL_GRXFH, RXNFC_LEN);
    b[4..8].copy_from_slice(&flow_type.to_ne_bytes());
    ioctl_bytes(ifname, &mut b, "ioctl(SIOCETHTOOL, ETHTOOL_GRXFH)")?;
    Ok(b.get(8..16)
        .and_then(|d| d.try_into().ok())
        .map_or(0, u64::from_ne_bytes))
}

const ETHTOOL_GCOALESCE: u32 = 0x0e;
const ETHTOOL_GRXCSUM: u32 = 0x14;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_GGRO: u32 = 0x2b;
/// `ETH_FLAG_LRO` in `ETHTOOL_GFLAGS`.
const ETH_FLAG_LRO: u32 = 1 << 15;
/// `struct ethtool_coalesce`: the command and 22 words.
const COALESCE_LEN: usize = 92;

/// The receive offloads that change what a packet count means or what a packet costs, as
/// `ethtool -k` shows them (`None`: the driver would not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offloads {
    pub gro: Option<bool>,
    pub lro: Option<bool>,
    pub rx_checksum: Option<bool>,
    pub tx_checksum: Option<bool>,
}

/// One `struct ethtool_value` query: its `data`.
fn value_ioctl(ifname: &str, cmd: u32, call: &'static str) -> Result<u32, SysError> {
    let mut b = command(cmd, 8);
    ioctl_bytes(ifname, &mut b, call)?;
    Ok(u32_at(&b, 4).unwrap_or(0))
}

/// GRO, LRO and the checksum offloads through the legacy value calls every kernel answers
/// from the device's feature bits (`ETHTOOL_GGRO`, `GFLAGS`, `GRXCSUM`, `GTXCSUM`). An
/// interface that is not there is an error; a refused item is `None`.
pub fn offloads(ifname: &str) -> Result<Offloads, SysError> {
    let gro = value_ioctl(ifname, ETHTOOL_GGRO, "ioctl(SIOCETHTOOL, ETHTOOL_GGRO)");
    if let Err(e) = &gro {
        if e.source.raw_os_error() == Some(libc::ENODEV) {
            return Err(SysError {
                call: e.call,
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
    }
    let on = |r: Result<u32, SysError>| r.ok().map(|v| v != 0);
    Ok(Offloads {
        gro: on(gro),
        lro: value_ioctl(ifname, ETHTOOL_GFLAGS, "ioctl(SIOCETHTOOL, ETHTOOL_GFLAGS)")
            .ok()
            .map(|f| f & ETH_FLAG_LRO != 0),
        rx_checksum: on(value_ioctl(
            ifname,
            ETHTOOL_GRXCSUM,
            "ioctl(SIOCETHTOOL, ETHTOOL_GRXCSUM)",
        )),
        tx_checksum: on(value_ioctl(
            ifname,
            ETHTOOL_GTXCSUM,
            "ioctl(SIOCETHTOOL, ETHTOOL_GTXCSUM)",
        )),
    })
}

/// Interrupt coalescing as `ethtool -c` shows its main lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Coalesce {
    pub rx_usecs: u32,
    pub rx_frames: u32,
    pub tx_usecs: u32,
    pub tx_frames: u32,
    pub adaptive_rx: bool,
    pub adaptive_tx: bool,
}

/// A `struct ethtool_coalesce` answer (word `i` after the command at byte `4 i`).
pub fn coalesce_of(b: &[u8]) -> Option<Coalesce> {
    let w = |i: usize| u32_at(b, 4 * i);
    Some(Coalesce {
        rx_usecs: w(1)?,
        rx_frames: w(2)?,
        tx_usecs: w(5)?,
        tx_frames: w(6)?,
        adaptive_rx: w(10)? != 0,
        adaptive_tx: w(11)? != 0,
    })
}

/// Interrupt coalescing through `ETHTOOL_GCOALESCE` (veth and loopback refuse it).
pub fn coalesce(ifname: &str) -> Result<Coalesce, SysError> {
    let mut b = command(ETHTOOL_GCOALESCE, COALESCE_LEN);
    ioctl_bytes(ifname, &mut b, "ioctl(SIOCETHTOOL, ETHTOOL_GCOALESCE)")?;
    coalesce_of(&b).ok_or_else(|| SysError {
        call: "ioctl(SIOCETHTOOL, ETHTOOL_GCOALESCE)",
        source: io::Error::new(io::ErrorKind::InvalidData, "short answer"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coalesce_answer_reads_as_ethtool_c_shows_it() {
        // An ixgbe-like answer: rx-usecs 50 (ITR), adaptive rx on, tx-usecs 0, tx-frames 256.
        let mut b = vec![0u8; COALESCE_LEN];
        let mut put = |i: usize, v: u32| b[4 * i..4 * i + 4].copy_from_slice(&v.to_ne_bytes());
        put(0, ETHTOOL_GCOALESCE);
        put(1, 50);
        put(6, 256);
        put(10, 1);
        let c = coalesce_of(&b).expect("whole");
        assert_eq!((c.rx_usecs, c.rx_frames, c.tx_frames), (50, 0, 256));
        assert!(c.adaptive_rx && !c.adaptive_tx);
        assert_eq!(coalesce_of(&b[..40]), None, "a short answer is no answer");
    }

    #[test]
    fn offloads_of_veth_and_lo_read_as_the_kernel_sets_them() {
        // Loopback: the kernel's own device, checksums "offloaded" (nothing to check), no LRO.
        let o = offloads("lo").expect("lo answers");
        assert_eq!(o.rx_checksum, Some(true));
        assert_eq!(o.lro, Some(false));
        assert!(o.gro.is_some());
        assert!(offloads("fl-no-such-if0").is_err());
        // lo has no coalescing to report.
        assert!(coalesce("lo").is_err());
    }

    /// A reply as the kernel writes it: `genlmsghdr` {cmd, version 1}, then `attrs`.
    fn reply(cmd: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![cmd, 1, 0, 0];
        for (k, v) in attrs {
            push_attr(&mut b, *k, v);
        }
        b
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn an_rss_reply_reads_as_ethtool_shows_it() {
        // mlx5-like: header nest, context 0 omitted, Toeplitz, symmetric-xor, 8 entries over
        // 4 queues, a 40-byte key.
        let key: Vec<u8> = (0..40).collect();
        let mut header = Vec::new();
        push_attr(&mut header, 1, &7u32.to_ne_bytes());
        push_attr(&mut header, 2, b"eth0\0");
        let p = reply(
            38,
            &[
                (A_HEADER | NLA_F_NESTED, header),
                (ETHTOOL_A_RSS_HFUNC, 1u32.to_ne_bytes().to_vec()),
                (ETHTOOL_A_RSS_INDIR, u32s(&[0, 1, 2, 3, 0, 1, 2, 3])),
                (ETHTOOL_A_RSS_HKEY, key.clone()),
                (ETHTOOL_A_RSS_INPUT_XFRM, 1u32.to_ne_bytes().to_vec()),
            ],
        );
        let r = rss_of(&p).expect("reads");
        assert_eq!(r.context, 0);
        assert_eq!(r.hfunc.map(hash_function_name), Some("toeplitz"));
        assert_eq!(r.input_xfrm.map(input_xfrm_name), Some("symmetric-xor"));
        assert_eq!(r.indir, vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(r.key, key);
        // A second context in a dump.
        let p = reply(
            38,
            &[
                (ETHTOOL_A_RSS_CONTEXT, 1u32.to_ne_bytes().to_vec()),
                (ETHTOOL_A_RSS_HFUNC, 2u32.to_ne_bytes().to_vec()),
            ],
        );
        let r = rss_of(&p).expect("reads");
        assert_eq!(
            (r.context, r.hfunc.map(hash_function_name)),
            (1, Some("xor"))
        );
        // Cut short, or shorter than the generic header: nothing is made up.
        assert_eq!(rss_of(&[38, 1]), None);
        let cut = rss_of(&p[..p.len() - 2]).expect("reads what is whole");
        assert_eq!(cut.hfunc, None);
    }

    #[test]
    fn channel_and_ring_replies_leave_absent_counts_absent() {
        // veth with 3 queues: RX and TX counts and maxima, no other, no combined ("n/a").
        let p = reply(
            18,
            &[
                (2, u32s(&[3])),
                (3, u32s(&[3])),
                (6, u32s(&[3])),
                (7, u32s(&[2])),
            ],
        );
        let c = channels_of(&p).expect("reads");
        assert_eq!(
            (c.max_rx, c.max_tx, c.rx, c.tx),
            (Some(3), Some(3), Some(3), Some(2))
        );
        assert_eq!(
            (c.max_other, c.max_combined, c.combined),
            (None, None, None)
        );
        // ixgbe-like rings: 4096 max, 512 set.
        let p = reply(
            16,
            &[
                (2, u32s(&[4096])),
                (5, u32s(&[4096])),
                (6, u32s(&[512])),
                (9, u32s(&[512])),
            ],
        );
        let r = rings_of(&p).expect("reads");
        assert_eq!(
            (r.rx_max, r.tx_max, r.rx, r.tx),
            (Some(4096), Some(4096), Some(512), Some(512))
        );
        assert_eq!(r.rx_jumbo, None);
        // An attribute past the eight is passed over.
        let p = reply(18, &[(40, u32s(&[1]))]);
        assert_eq!(channels_of(&p), Some(Channels::default()));
    }

    #[test]
    fn ioctl_structures_read_as_the_kernel_writes_them() {
        // ethtool_rxfh: context 0, 4 entries, 8-byte key, hfunc XOR, no transform.
        let mut b = vec![0u8; RXFH_HEADER];
        b[..4].copy_from_slice(&ETHTOOL_GRSSH.to_ne_bytes());
        b[8..12].copy_from_slice(&4u32.to_ne_bytes());
        b[12..16].copy_from_slice(&8u32.to_ne_bytes());
        b[16] = 2;
        b.extend(u32s(&[1, 0, 1, 0]));
        b.extend(1..=8u8);
        let r = rxfh_of(&b).expect("reads");
        assert_eq!(r.indir, vec![1, 0, 1, 0]);
        assert_eq!(r.key, (1..=8).collect::<Vec<u8>>());
        assert_eq!(r.hfunc, Some(2));
        // Sizes that run past the answer: refused, not read out of bounds.
        b[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(rxfh_of(&b), None);
        // ethtool_drvinfo: driver "ixgbe", bus "0000:03:00.0".
        let mut d = command(ETHTOOL_GDRVINFO, DRVINFO_LEN);
        d[4..9].copy_from_slice(b"ixgbe");
        d[100..112].copy_from_slice(b"0000:03:00.0");
        let i = drvinfo_of(&d).expect("reads");
        assert_eq!(
            (i.driver.as_str(), i.bus.as_str()),
            ("ixgbe", "0000:03:00.0")
        );
        assert_eq!(drvinfo_of(&d[..50]), None);
        // ethtool_channels: combined 8 of 63, nothing else.
        let mut c = command(ETHTOOL_GCHANNELS, 36);
        c[16..20].copy_from_slice(&63u32.to_ne_bytes());
        c[32..36].copy_from_slice(&8u32.to_ne_bytes());
        let ch = channels_ioctl_of(&c).expect("reads");
        assert_eq!(
            (ch.max_combined, ch.combined, ch.rx),
            (Some(63), Some(8), None)
        );
        assert_eq!(channels_ioctl_of(&c[..20]), None);
    }

    #[test]
    fn a_pause_reply_reads_settings_and_counts() {
        let mut stats = Vec::new();
        push_attr(&mut stats, 1, &[0; 4]); // PAD
        push_attr(
            &mut stats,
            ETHTOOL_A_PAUSE_STAT_TX_FRAMES,
            &5u64.to_ne_bytes(),
        );
        push_attr(
            &mut stats,
            ETHTOOL_A_PAUSE_STAT_RX_FRAMES,
            &1234u64.to_ne_bytes(),
        );
        let p = reply(
            22,
            &[
                (ETHTOOL_A_PAUSE_AUTONEG, vec![1]),
                (ETHTOOL_A_PAUSE_RX, vec![1]),
                (ETHTOOL_A_PAUSE_TX, vec![0]),
                (ETHTOOL_A_PAUSE_STATS | NLA_F_NESTED, stats),
            ],
        );
        let r = pause_of(&p).expect("reads");
        assert_eq!(
            r,
            Pause {
                autoneg: Some(true),
                rx: Some(true),
                tx: Some(false),
                rx_frames: Some(1234),
                tx_frames: Some(5),
            }
        );
        // The ioctl's structure: rx on, no counts.
        let mut b = command(ETHTOOL_GPAUSEPARAM, 16);
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let i = pause_ioctl_of(&b).expect("reads");
        assert_eq!(
            (i.autoneg, i.rx, i.tx, i.rx_frames),
            (Some(false), Some(true), Some(false), None)
        );
        assert_eq!(pause_ioctl_of(&b[..8]), None);
    }

    #[test]
    fn hash_fields_name_what_ethtool_names() {
        // UDP/IPv4 on the 4-tuple, and on the 2-tuple (FreeBSD's default, a fragment's).
        assert_eq!(
            hash_field_names(0xf0),
            vec!["ip-src", "ip-dst", "l4-src-port", "l4-dst-port"]
        );
        assert_eq!(hash_field_names(0x30), vec!["ip-src", "ip-dst"]);
        assert!(hash_field_names(0).is_empty());
    }

    #[test]
    fn a_request_names_the_interface_in_a_nested_header() {
        let req = request(30, ETHTOOL_MSG_RSS_GET, 9, "eth0", true);
        // nlmsghdr: length, family, flags (REQUEST | DUMP), seq.
        assert_eq!(u32_at(&req, 0), Some(req.len() as u32));
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), 30);
        assert_eq!(u16::from_ne_bytes([req[6], req[7]]), 1 | NLM_F_DUMP);
        assert_eq!(req[16], ETHTOOL_MSG_RSS_GET);
        let attrs = attributes(&req[16 + GENL_HDRLEN..]);
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs[0].0, A_HEADER);
        let inner = attributes(attrs[0].1);
        assert_eq!(inner, vec![(ETHTOOL_A_HEADER_DEV_NAME, &b"eth0\0"[..])]);
    }
}
