//! An interface's RSS and queues as they are (`rss show --dev IF`, and `--dev` wherever flows
//! are hashed or placed): read through ethtool netlink or `SIOCETHTOOL` (io's `ethtool`) and
//! sysfs/procfs (lab's `nic`), each item with how it was read or why it could not be. Nothing
//! is guessed: a driver without RSS (veth) says so per item.

use std::time::Instant;

use flowlane_io::ethtool::{self, Ethtool, Via, FLOW_TYPES, HASH_DISCARD};
use flowlane_io::SysError;
use flowlane_lab::nic::NicSysfs;
use flowlane_rss::ethtool::{EthtoolRss, HashFunction};
use flowlane_rss::queue::Reta;
use flowlane_rss::{Key, Symmetric};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// One item of the reading: its value and how it was read, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Item<T> {
    /// `netlink`, `ioctl` or `sysfs`; `None` when nothing was read.
    pub via: Option<String>,
    /// The value.
    pub value: Option<T>,
    /// Why there is no value: the driver does not support it (`EOPNOTSUPP`), or the call's
    /// error.
    pub missing: Option<String>,
}

impl<T> Item<T> {
    fn read(r: Result<(T, Via), SysError>) -> Item<T> {
        match r {
            Ok((v, via)) => Item {
                via: Some(via.name().into()),
                value: Some(v),
                missing: None,
            },
            Err(e) => Item {
                via: None,
                value: None,
                missing: Some(missing(&e)),
            },
        }
    }
}

fn missing(e: &SysError) -> String {
    match e.source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => "the driver does not support it (EOPNOTSUPP)".into(),
        _ => e.to_string(),
    }
}

/// One RSS context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RssContext {
    /// 0: the default context.
    pub context: u32,
    /// `toeplitz`, `xor`, `crc32` (ethtool's names).
    pub hash_function: Option<String>,
    /// The input transform: `none`, `symmetric-xor`, `symmetric-or-xor`.
    pub input_xfrm: Option<String>,
    /// The key, hex (empty: the driver reported none).
    pub key: String,
    /// The indirection table: entry → queue.
    pub indir: Vec<u32>,
}

/// What one flow type hashes on (`ethtool -n IF rx-flow-hash T`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlowHash {
    /// ethtool's name of the flow type (`udp4`, `tcp6`, …).
    pub flow_type: String,
    /// The fields (`ip-src`, `ip-dst`, `l4-src-port`, `l4-dst-port`, …).
    pub fields: Vec<String>,
    /// Frames of this type are dropped, not hashed.
    pub discard: bool,
}

/// Channel counts (`ethtool -l`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// Ring sizes (`ethtool -g`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rings {
    pub rx_max: Option<u32>,
    pub tx_max: Option<u32>,
    pub rx: Option<u32>,
    pub tx: Option<u32>,
    pub rx_mini: Option<u32>,
    pub rx_jumbo: Option<u32>,
}

/// Ethernet flow control (`ethtool -a`) and pause frames counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Pause {
    pub autoneg: Option<bool>,
    /// Received pause frames stop our sending.
    pub rx: Option<bool>,
    /// We send pause frames.
    pub tx: Option<bool>,
    pub rx_frames: Option<u64>,
    pub tx_frames: Option<u64>,
}

/// Receive and checksum offloads (`ethtool -k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Offloads {
    /// Generic receive offload: the stack merges segments of a flow before the socket.
    pub gro: Option<bool>,
    /// Large receive offload: the NIC merges them (breaks forwarding).
    pub lro: Option<bool>,
    pub rx_checksum: Option<bool>,
    pub tx_checksum: Option<bool>,
}

/// Interrupt coalescing (`ethtool -c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Coalesce {
    pub rx_usecs: u32,
    pub rx_frames: u32,
    pub tx_usecs: u32,
    pub tx_frames: u32,
    /// The driver retunes the receive interrupt rate by itself.
    pub adaptive_rx: bool,
    pub adaptive_tx: bool,
}

/// The driver (`ethtool -i`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Driver {
    pub driver: String,
    pub version: String,
    pub firmware: String,
    /// The bus address; empty for a virtual device.
    pub bus: String,
}

/// Everything read about one interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NicReport {
    /// The interface.
    pub dev: String,
    /// Whether the kernel has the ethtool netlink family (else every item is by ioctl).
    pub ethtool_netlink: bool,
    /// The driver and bus (ioctl: netlink has no such message).
    pub driver: Item<Driver>,
    /// RSS contexts, the default first.
    pub rss: Item<Vec<RssContext>>,
    /// Hash fields per flow type (ioctl `ETHTOOL_GRXFH`).
    pub hash_fields: Item<Vec<FlowHash>>,
    /// Channels.
    pub channels: Item<Channels>,
    /// Rings.
    pub rings: Item<Rings>,
    /// Flow control.
    #[serde(default = "not_read::<Pause>")]
    pub pause: Item<Pause>,
    /// Offloads (ioctl).
    #[serde(default = "not_read::<Offloads>")]
    pub offloads: Item<Offloads>,
    /// Interrupt coalescing (ioctl).
    #[serde(default = "not_read::<Coalesce>")]
    pub coalesce: Item<Coalesce>,
    /// NUMA node, queues' RPS/XPS, RFS, IRQs and their affinity (sysfs, procfs).
    pub host: NicSysfs,
    /// How long the whole reading took, milliseconds.
    pub read_ms: f64,
}

pub(crate) fn not_read<T>() -> Item<T> {
    Item {
        via: None,
        value: None,
        missing: Some("not read".into()),
    }
}

/// Reads `dev` in the calling thread's namespace. An interface that is not there is a usage
/// error; everything else missing is said per item.
pub fn read(dev: &str) -> Result<NicReport, ToolError> {
    let t0 = Instant::now();
    flowlane_io::netdev::ifindex(dev).map_err(|_| {
        ToolError::usage(format!(
            "no interface `{dev}` here (see `ip link`; in a namespace, run inside it)"
        ))
    })?;
    let et = Ethtool::open().map_err(|e| ToolError::runtime(e.to_string()))?;
    let driver = Item::read(ethtool::driver_info(dev).map(|d| {
        (
            Driver {
                driver: d.driver,
                version: d.version,
                firmware: d.firmware,
                bus: d.bus,
            },
            Via::Ioctl,
        )
    }));
    let rss = Item::read(et.rss(dev).map(|(cs, via)| {
        let cs = cs
            .into_iter()
            .map(|c| RssContext {
                context: c.context,
                hash_function: c.hfunc.map(|h| ethtool::hash_function_name(h).into()),
                input_xfrm: c.input_xfrm.map(|x| ethtool::input_xfrm_name(x).into()),
                key: c.key.iter().map(|b| format!("{b:02x}")).collect(),
                indir: c.indir,
            })
            .collect();
        (cs, via)
    }));
    let hash_fields = Item::read(hash_fields(dev).map(|v| (v, Via::Ioctl)));
    let channels = Item::read(et.channels(dev).map(|(c, via)| {
        (
            Channels {
                max_rx: c.max_rx,
                max_tx: c.max_tx,
                max_other: c.max_other,
                max_combined: c.max_combined,
                rx: c.rx,
                tx: c.tx,
                other: c.other,
                combined: c.combined,
            },
            via,
        )
    }));
    let rings = Item::read(et.rings(dev).map(|(r, via)| {
        (
            Rings {
                rx_max: r.rx_max,
                tx_max: r.tx_max,
                rx: r.rx,
                tx: r.tx,
                rx_mini: r.rx_mini,
                rx_jumbo: r.rx_jumbo,
            },
            via,
        )
    }));
    let pause = Item::read(et.pause(dev).map(|(p, via)| {
        (
            Pause {
                autoneg: p.autoneg,
                rx: p.rx,
                tx: p.tx,
                rx_frames: p.rx_frames,
                tx_frames: p.tx_frames,
            },
            via,
        )
    }));
    let offloads = Item::read(ethtool::offloads(dev).map(|o| {
        (
            Offloads {
                gro: o.gro,
                lro: o.lro,
                rx_checksum: o.rx_checksum,
                tx_checksum: o.tx_checksum,
            },
            Via::Ioctl,
        )
    }));
    let coalesce = Item::read(ethtool::coalesce(dev).map(|c| {
        (
            Coalesce {
                rx_usecs: c.rx_usecs,
                rx_frames: c.rx_frames,
                tx_usecs: c.tx_usecs,
                tx_frames: c.tx_frames,
                adaptive_rx: c.adaptive_rx,
                adaptive_tx: c.adaptive_tx,
            },
            Via::Ioctl,
        )
    }));
    let host = flowlane_lab::nic::read_nic(std::path::Path::new("/"), dev);
    Ok(NicReport {
        dev: dev.into(),
        ethtool_netlink: et.has_netlink(),
        driver,
        rss,
        hash_fields,
        channels,
        rings,
        pause,
        offloads,
        coalesce,
        host,
        read_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Every flow type's fields; the first refusal ends it (a driver without the call refuses
/// them all).
fn hash_fields(dev: &str) -> Result<Vec<FlowHash>, SysError> {
    FLOW_TYPES
        .iter()
        .map(|&(ft, name)| {
            let mask = ethtool::hash_fields(dev, ft)?;
            Ok(FlowHash {
                flow_type: name.into(),
                fields: ethtool::hash_field_names(mask)
                    .into_iter()
                    .map(String::from)
                    .collect(),
                discard: mask & HASH_DISCARD != 0,
            })
        })
        .collect()
}

impl NicReport {
    /// The default context as an `ethtool -x` text would give it, for the queue model:
    /// `Err` says why the NIC's RSS cannot be modelled (none, no table, not Toeplitz).
    pub fn model(&self) -> Result<EthtoolRss, String> {
        let ctx = match (&self.rss.value, &self.rss.missing) {
            (Some(cs), _) => cs.iter().find(|c| c.context == 0).ok_or_else(|| {
                format!("{}: the driver reported no default RSS context", self.dev)
            })?,
            (None, why) => {
                return Err(format!(
                    "{} has no RSS to read: {}",
                    self.dev,
                    why.as_deref().unwrap_or("nothing reported")
                ))
            }
        };
        let entries: Vec<u16> = ctx
            .indir
            .iter()
            .map(|&q| u16::try_from(q).map_err(|_| format!("queue {q} in the table")))
            .collect::<Result<_, _>>()?;
        let reta = Reta::from_entries(entries).map_err(|e| format!("{}: {e}", self.dev))?;
        let key = if ctx.key.is_empty() {
            None
        } else {
            let bytes: Vec<u8> = (0..ctx.key.len() / 2)
                .filter_map(|i| u8::from_str_radix(ctx.key.get(2 * i..2 * i + 2)?, 16).ok())
                .collect();
            Some(Key::new(&bytes).map_err(|e| format!("{}'s key: {e}", self.dev))?)
        };
        let function = ctx.hash_function.as_deref().map(|f| match f {
            "toeplitz" => HashFunction::Toeplitz,
            other => HashFunction::Other(other.into()),
        });
        let (symmetric, unmodelled_transform) = match ctx.input_xfrm.as_deref() {
            None => (None, None),
            Some("none") => (Some(Symmetric::Off), None),
            Some("symmetric-xor") => (Some(Symmetric::Xor), None),
            Some(other) => (None, Some(other.to_string())),
        };
        Ok(EthtoolRss {
            reta,
            key,
            function,
            symmetric,
            unmodelled_transform,
        })
    }

    /// Whether UDP over IPv4 is hashed on the addresses only (the 2-tuple), as the NIC says
    /// (`None`: it did not say).
    pub fn udp4_two_tuple(&self) -> Option<bool> {
        self.two_tuple("udp4")
    }

    /// Whether flows of this type (`udp4`, `tcp4`, `udp6`, `tcp6`: ethtool's names) are
    /// hashed on the addresses only, as the NIC says (`None`: it did not say).
    pub fn two_tuple(&self, flow_type: &str) -> Option<bool> {
        let f = self
            .hash_fields
            .value
            .as_ref()?
            .iter()
            .find(|f| f.flow_type == flow_type)?;
        Some(!f.fields.iter().any(|x| x.starts_with("l4-")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(function: &str, xfrm: &str, udp4: &[&str]) -> NicReport {
        let item = |v| Item {
            via: Some("netlink".into()),
            value: Some(v),
            missing: None,
        };
        NicReport {
            dev: "eth0".into(),
            ethtool_netlink: true,
            driver: Item {
                via: None,
                value: None,
                missing: None,
            },
            rss: item(vec![RssContext {
                context: 0,
                hash_function: Some(function.into()),
                input_xfrm: Some(xfrm.into()),
                key: Key::MICROSOFT.to_hex(),
                indir: vec![0, 1, 2, 3, 0, 1, 2, 3],
            }]),
            hash_fields: Item {
                via: Some("ioctl".into()),
                value: Some(vec![FlowHash {
                    flow_type: "udp4".into(),
                    fields: udp4.iter().map(|s| s.to_string()).collect(),
                    discard: false,
                }]),
                missing: None,
            },
            channels: Item {
                via: None,
                value: None,
                missing: None,
            },
            rings: Item {
                via: None,
                value: None,
                missing: None,
            },
            offloads: crate::nic::not_read(),
            coalesce: crate::nic::not_read(),
            pause: Item {
                via: None,
                value: None,
                missing: Some("EOPNOTSUPP".into()),
            },
            host: flowlane_lab::nic::read_nic(std::path::Path::new("/nonexistent"), "eth0"),
            read_ms: 0.0,
        }
    }

    /// What a NIC reported becomes the model an `ethtool -x` text of it would give: its key,
    /// table and transform; a function or transform flowlane does not model is said, not
    /// modelled; UDP hashed on the addresses is seen as such.
    #[test]
    fn a_read_nic_becomes_the_model_or_says_why_not() {
        let r = report("toeplitz", "symmetric-xor", &["ip-src", "ip-dst"]);
        let m = r.model().expect("modelled");
        assert_eq!(m.key, Some(Key::MICROSOFT));
        assert_eq!(m.reta.entries(), &[0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(m.symmetric, Some(Symmetric::Xor));
        assert!(m.unmodelled().is_none());
        assert_eq!(r.udp4_two_tuple(), Some(true));
        let xor = report(
            "xor",
            "none",
            &["ip-src", "ip-dst", "l4-src-port", "l4-dst-port"],
        );
        assert!(xor.model().expect("read").unmodelled().is_some());
        assert_eq!(xor.udp4_two_tuple(), Some(false));
        let or_xor = report("toeplitz", "symmetric-or-xor", &[]);
        assert!(or_xor.model().expect("read").unmodelled().is_some());
        let mut none = report("toeplitz", "none", &[]);
        none.rss.value = None;
        none.rss.missing = Some("the driver does not support it (EOPNOTSUPP)".into());
        assert!(none.model().expect_err("no RSS").contains("EOPNOTSUPP"));
    }
}
