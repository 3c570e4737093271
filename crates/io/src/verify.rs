//! `rss verify`'s receiving end: the XDP program of [`crate::ebpf::rss_verify_program`]
//! attached to an interface through a BPF link (gone when this is dropped, also if the
//! process dies), and its per-(flow, queue, hash) frame counts read back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::ebpf::{rss_verify_program, verify_key as key, VERIFY_SLOT_LEN as SLOT_LEN};
use crate::maps::ArrayMap;
use crate::sys::bpf::{self, LoadError};
use crate::sys::SysError;

/// What one (flow, queue, hash) entry counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenEntry {
    /// The receive queue.
    pub queue: u32,
    /// The NIC's hash and its type, or the kfunc's negative errno when it gave none.
    pub hash: Result<(u32, u32), i32>,
    /// Addresses (`None`: not an IP frame).
    pub addrs: Option<(IpAddr, IpAddr)>,
    /// Ports (unfragmented UDP or TCP).
    pub ports: Option<(u16, u16)>,
    /// The IP protocol (17 UDP, 6 TCP, …; 0 for a frame that is not IP).
    pub proto: u8,
    /// Frames.
    pub frames: u64,
}

/// A decoded map entry ([`key`] layout); `None` for a key of the wrong size.
pub fn seen_of(k: &[u8], frames: u64) -> Option<SeenEntry> {
    if k.len() != key::LEN {
        return None;
    }
    let u32_at = |o: usize| Some(u32::from_ne_bytes(k.get(o..o + 4)?.try_into().ok()?));
    let be16 = |o: usize| Some(u16::from_be_bytes(k.get(o..o + 2)?.try_into().ok()?));
    let rc = u32_at(key::RC)? as i32;
    let addr = |o: usize| -> Option<IpAddr> {
        match k[key::FAMILY] {
            4 => Some(IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(k.get(o..o + 4)?).ok()?,
            ))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(k.get(o..o + 16)?).ok()?,
            ))),
            _ => None,
        }
    };
    Some(SeenEntry {
        queue: u32_at(key::QUEUE)?,
        hash: if rc == 0 {
            Ok((u32_at(key::HASH)?, u32_at(key::HASH_TYPE)?))
        } else {
            Err(rc)
        },
        addrs: addr(key::SRC).zip(addr(key::DST)),
        ports: (k[key::HAS_PORTS] == 1).then_some((be16(key::SPORT)?, be16(key::DPORT)?)),
        proto: k[key::PROTO],
        frames,
    })
}

/// The attached program and its maps.
#[derive(Debug)]
pub struct RssVerifier {
    flows: OwnedFd,
    slots: OwnedFd,
    full: ArrayMap,
    link: Option<OwnedFd>,
    max_flows: u32,
    /// Why the NIC's hash is not read, when it is not (no kfunc in this kernel, or the driver
    /// refused a device-bound program); frames are then checked by queue only.
    pub no_hash: Option<String>,
}

impl RssVerifier {
    /// Loads and attaches the program to `ifindex` (native XDP where the driver has it),
    /// counting up to `max_flows` distinct entries.
    pub fn attach(ifindex: u32, max_flows: u32) -> Result<RssVerifier, LoadError> {
        let as_load = |error: SysError| LoadError {
            error,
            log: String::new(),
        };
        let flows = bpf::create_map(bpf::MAP_HASH, key::LEN as u32, 8, max_flows, 0, "fl_verify")
            .map_err(as_load)?;
        let full = ArrayMap::create("fl_verify_full", 8, 1).map_err(as_load)?;
        let slots = bpf::create_map(
            bpf::MAP_PERCPU_ARRAY,
            4,
            SLOT_LEN as u32,
            1,
            0,
            "fl_verify_slot",
        )
        .map_err(as_load)?;
        let kfunc =
            crate::sys::btf::vmlinux_func_id("bpf_xdp_metadata_rx_hash").map_err(as_load)?;
        let program = |id| {
            rss_verify_program(flows.as_raw_fd(), slots.as_raw_fd(), full.raw_fd(), id).map_err(
                |e| LoadError {
                    error: SysError {
                        call: "assemble rss_verify",
                        source: std::io::Error::other(e.to_string()),
                    },
                    log: String::new(),
                },
            )
        };
        let mut no_hash = None;
        let bound = match kfunc {
            Some(id) => {
                match bpf::prog_load_dev_bound(ifindex, "fl_rss_verify", &program(Some(id))?) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        no_hash = Some(format!(
                            "the driver refused a device-bound program calling \
                         bpf_xdp_metadata_rx_hash ({}): it does not give XDP its RX hash",
                            e.error.source
                        ));
                        None
                    }
                }
            }
            None => {
                no_hash = Some(
                    "this kernel has no bpf_xdp_metadata_rx_hash (Linux 6.3+ with BTF)".into(),
                );
                None
            }
        };
        let prog = match bound {
            Some(p) => p,
            None => bpf::prog_load(bpf::PROG_XDP, "fl_rss_verify", &program(None)?)?,
        };
        let link = bpf::attach_xdp(&prog, ifindex, 0).map_err(as_load)?;
        Ok(RssVerifier {
            flows,
            slots,
            full,
            link: Some(link),
            max_flows,
            no_hash,
        })
    }

    /// Detaches the program: frames are no longer recorded, and what was is read whole.
    pub fn detach(&mut self) {
        self.link = None;
    }

    /// Every entry counted so far: the map's counts plus each CPU's slot. While the program
    /// is attached a slot being added to the map may be read twice or not at all (status
    /// lines); after [`detach`](Self::detach) the counts are exact.
    pub fn entries(&self) -> Result<Vec<SeenEntry>, SysError> {
        let keys = bpf::map_keys(&self.flows, key::LEN, self.max_flows as usize)?;
        let mut counts: Vec<(Vec<u8>, u64)> = Vec::with_capacity(keys.len());
        for k in keys {
            let Some(v) = bpf::map_lookup(&self.flows, &k, 8)? else {
                continue;
            };
            counts.push((k, u64::from_ne_bytes(v.try_into().unwrap_or_default())));
        }
        let cpus = crate::sys::possible_cpus();
        let stride = SLOT_LEN.next_multiple_of(8);
        if let Some(v) = bpf::map_lookup(&self.slots, &0u32.to_ne_bytes(), stride * cpus)? {
            for slot in v.chunks_exact(stride) {
                let n = slot
                    .get(key::LEN..key::LEN + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_ne_bytes);
                if n == 0 {
                    continue;
                }
                let k = &slot[..key::LEN];
                match counts.iter_mut().find(|c| c.0 == k) {
                    Some(c) => c.1 += n,
                    None => counts.push((k.to_vec(), n)),
                }
            }
        }
        Ok(counts
            .into_iter()
            .filter_map(|(k, n)| seen_of(&k, n))
            .collect())
    }

    /// Frames not counted because the map was full.
    pub fn uncounted(&self) -> u64 {
        self.full
            .get(0)
            .ok()
            .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
            .map_or(0, u64::from_ne_bytes)
    }
}
