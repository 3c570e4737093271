//! Typed BPF maps over the raw `bpf(2)` calls: an [`ArrayMap`] knows its value size and entry
//! count and refuses a value or index that does not fit before the kernel sees it; a
//! [`CpuMap`] takes a queue size and the program each CPU's entry runs, not 8 raw bytes.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys::bpf;
use crate::SysError;

fn invalid(call: &'static str, what: String) -> SysError {
    SysError {
        call,
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, what),
    }
}

/// An array map: `entries` values of `value_size` bytes, indexed by a u32.
#[derive(Debug)]
pub struct ArrayMap {
    fd: OwnedFd,
    value_size: usize,
    entries: u32,
}

impl ArrayMap {
    /// Creates the map (`BPF_MAP_TYPE_ARRAY`; every value starts zeroed).
    pub fn create(name: &str, value_size: usize, entries: u32) -> Result<ArrayMap, SysError> {
        let size = u32::try_from(value_size).map_err(|_| {
            invalid(
                "bpf(BPF_MAP_CREATE)",
                format!("{value_size}-byte values are too large"),
            )
        })?;
        let fd = bpf::create_map(bpf::MAP_ARRAY, 4, size, entries, 0, name)?;
        Ok(ArrayMap {
            fd,
            value_size,
            entries,
        })
    }

    /// Writes entry `index`.
    pub fn set(&self, index: u32, value: &[u8]) -> Result<(), SysError> {
        const CALL: &str = "bpf(BPF_MAP_UPDATE_ELEM)";
        if index >= self.entries {
            return Err(invalid(
                CALL,
                format!("index {index} of a {}-entry map", self.entries),
            ));
        }
        if value.len() != self.value_size {
            return Err(invalid(
                CALL,
                format!(
                    "a {}-byte value for {}-byte entries",
                    value.len(),
                    self.value_size
                ),
            ));
        }
        bpf::map_update(&self.fd, &index.to_ne_bytes(), value, 4, self.value_size)
    }

    /// Reads entry `index`.
    pub fn get(&self, index: u32) -> Result<Vec<u8>, SysError> {
        const CALL: &str = "bpf(BPF_MAP_LOOKUP_ELEM)";
        if index >= self.entries {
            return Err(invalid(
                CALL,
                format!("index {index} of a {}-entry map", self.entries),
            ));
        }
        bpf::map_lookup(&self.fd, &index.to_ne_bytes(), self.value_size)?
            .ok_or_else(|| invalid(CALL, format!("no entry {index} in an array map")))
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Bytes per value.
    pub fn value_size(&self) -> usize {
        self.value_size
    }
}

/// An IPv6 longest-prefix-match map (`BPF_MAP_TYPE_LPM_TRIE`): keys are a prefix length and
/// 16 address bytes (network order), values a u32. A program looks up an address with length
/// 128 and gets the value of the longest prefix that covers it; each update or removal is
/// atomic for readers (the kernel's trie is RCU-protected).
#[derive(Debug)]
pub struct LpmTrie6 {
    fd: OwnedFd,
}

impl LpmTrie6 {
    /// Bytes of a key: the length (u32, native order), then the address.
    pub const KEY_SIZE: usize = 20;

    /// Creates the map for up to `entries` prefixes.
    pub fn create(name: &str, entries: u32) -> Result<LpmTrie6, SysError> {
        let fd = bpf::create_map(
            bpf::MAP_LPM_TRIE,
            Self::KEY_SIZE as u32,
            4,
            entries,
            bpf::F_NO_PREALLOC,
            name,
        )?;
        Ok(LpmTrie6 { fd })
    }

    fn key(len: u8, addr: [u8; 16]) -> Result<[u8; 20], SysError> {
        if len > 128 {
            return Err(invalid(
                "bpf(BPF_MAP_UPDATE_ELEM)",
                format!("prefix length {len} of an IPv6 address"),
            ));
        }
        let mut k = [0u8; Self::KEY_SIZE];
        k[..4].copy_from_slice(&u32::from(len).to_ne_bytes());
        k[4..].copy_from_slice(&addr);
        Ok(k)
    }

    /// Sets the value of `addr/len`.
    pub fn set(&self, len: u8, addr: [u8; 16], value: u32) -> Result<(), SysError> {
        let k = Self::key(len, addr)?;
        bpf::map_update(&self.fd, &k, &value.to_ne_bytes(), Self::KEY_SIZE, 4)
    }

    /// Removes `addr/len`; whether it was there.
    pub fn remove(&self, len: u8, addr: [u8; 16]) -> Result<bool, SysError> {
        bpf::map_delete(&self.fd, &Self::key(len, addr)?)
    }

    /// The value of the longest prefix covering `addr` (a lookup with length 128).
    pub fn lookup(&self, addr: [u8; 16]) -> Result<Option<u32>, SysError> {
        let v = bpf::map_lookup(&self.fd, &Self::key(128, addr)?, 4)?;
        Ok(v.and_then(|v| Some(u32::from_ne_bytes(v.try_into().ok()?))))
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A set of addresses (`BPF_MAP_TYPE_HASH`, 16-byte keys in network order: IPv6, or IPv4 as
/// `::ffff:a.b.c.d`), e.g. the host's own, whose frames a program passes to the kernel. Each
/// insertion or removal is atomic for readers.
#[derive(Debug)]
pub struct AddrSet {
    fd: OwnedFd,
}

impl AddrSet {
    /// Bytes of a key.
    pub const KEY_SIZE: usize = 16;

    /// Creates the set for up to `entries` addresses.
    pub fn create(name: &str, entries: u32) -> Result<AddrSet, SysError> {
        let fd = bpf::create_map(bpf::MAP_HASH, Self::KEY_SIZE as u32, 4, entries, 0, name)?;
        Ok(AddrSet { fd })
    }

    /// Adds `addr`.
    pub fn insert(&self, addr: [u8; 16]) -> Result<(), SysError> {
        bpf::map_update(&self.fd, &addr, &1u32.to_ne_bytes(), Self::KEY_SIZE, 4)
    }

    /// Removes `addr`; whether it was there.
    pub fn remove(&self, addr: [u8; 16]) -> Result<bool, SysError> {
        bpf::map_delete(&self.fd, &addr)
    }

    /// Whether `addr` is in the set.
    pub fn contains(&self, addr: [u8; 16]) -> Result<bool, SysError> {
        Ok(bpf::map_lookup(&self.fd, &addr, 4)?.is_some())
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A cpumap: per CPU, a queue of frames that CPU's kernel thread takes off and gives the
/// stack, with a program that runs on each frame as it does.
#[derive(Debug)]
pub struct CpuMap {
    fd: OwnedFd,
    cpus: u32,
}

impl CpuMap {
    /// Creates a cpumap with an entry slot for each of `cpus` CPUs (none active yet).
    pub fn create(name: &str, cpus: u32) -> Result<CpuMap, SysError> {
        // struct bpf_cpumap_val: the queue size, then the program's descriptor.
        let fd = bpf::create_map(bpf::MAP_CPUMAP, 4, 8, cpus, 0, name)?;
        Ok(CpuMap { fd, cpus })
    }

    /// Activates `cpu` with a queue of `queue_size` frames (1 to 16384), each frame run
    /// through `program` (loaded for `ATTACH_XDP_CPUMAP`) as it is taken off.
    pub fn set(&self, cpu: u32, queue_size: u32, program: &OwnedFd) -> Result<(), SysError> {
        const CALL: &str = "bpf(BPF_MAP_UPDATE_ELEM)";
        if cpu >= self.cpus {
            return Err(invalid(
                CALL,
                format!("CPU {cpu} of a {}-CPU map", self.cpus),
            ));
        }
        let mut entry = queue_size.to_ne_bytes().to_vec();
        entry.extend_from_slice(&program.as_raw_fd().to_ne_bytes());
        bpf::map_update(&self.fd, &cpu.to_ne_bytes(), &entry, 4, 8)
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An XSKMAP: per receive queue, the AF_XDP socket an XDP program redirects that queue's
/// frames to.
#[derive(Debug)]
pub struct XskMap {
    fd: OwnedFd,
    queues: u32,
}

impl XskMap {
    /// Creates the map with a slot for each of `queues` receive queues (none filled yet).
    pub fn create(name: &str, queues: u32) -> Result<XskMap, SysError> {
        let fd = bpf::create_map(bpf::MAP_XSKMAP, 4, 4, queues.max(1), 0, name)?;
        Ok(XskMap { fd, queues })
    }

    /// Sends queue `queue`'s frames to socket `xsk`.
    pub fn set(&self, queue: u32, xsk: &crate::frame::Xsk) -> Result<(), SysError> {
        self.set_raw(queue, xsk.raw_fd())
    }

    /// Sends queue `queue`'s frames to the AF_XDP socket `fd` (one of an
    /// [`XskGroup`](crate::frame::XskGroup)'s).
    pub fn set_raw(&self, queue: u32, fd: RawFd) -> Result<(), SysError> {
        const CALL: &str = "bpf(BPF_MAP_UPDATE_ELEM)";
        if queue >= self.queues {
            return Err(invalid(
                CALL,
                format!("queue {queue} of a {}-queue map", self.queues),
            ));
        }
        bpf::map_update(&self.fd, &queue.to_ne_bytes(), &fd.to_ne_bytes(), 4, 4)
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Counters a program keeps per CPU without atomics (`BPF_MAP_TYPE_PERCPU_ARRAY` of u64:
/// each CPU adds to its own copy), read from here by summing or per CPU.
#[derive(Debug)]
pub struct PerCpuCounters {
    fd: OwnedFd,
    entries: u32,
    cpus: usize,
}

impl PerCpuCounters {
    /// `entries` counters, zero.
    pub fn create(name: &str, entries: u32) -> Result<PerCpuCounters, SysError> {
        Ok(PerCpuCounters {
            fd: bpf::create_map(bpf::MAP_PERCPU_ARRAY, 4, 8, entries.max(1), 0, name)?,
            entries: entries.max(1),
            cpus: crate::sys::possible_cpus(),
        })
    }

    /// The descriptor programs refer to the map by.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Counter `i` of every possible CPU (zeros where it cannot be read).
    pub fn per_cpu(&self, i: u32) -> Vec<u64> {
        if i >= self.entries {
            return vec![0; self.cpus];
        }
        match bpf::map_lookup(&self.fd, &i.to_ne_bytes(), 8 * self.cpus) {
            Ok(Some(v)) => v
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            _ => vec![0; self.cpus],
        }
    }
}

/// The XDP bridge's maps: its forwarding table (an array of one-word slots, laid out as
/// `ebpf::fdb`) and its ports (a device map: port index → ifindex).
#[derive(Debug)]
pub struct BridgeMaps {
    fdb: OwnedFd,
    ports: OwnedFd,
}

impl BridgeMaps {
    /// An empty table and device map (up to 64 ports).
    pub fn create() -> Result<BridgeMaps, SysError> {
        Ok(BridgeMaps {
            fdb: bpf::create_map(
                bpf::MAP_ARRAY,
                4,
                8,
                crate::ebpf::fdb::SLOTS,
                0,
                "fl_br_fdb",
            )?,
            ports: bpf::create_map(bpf::MAP_DEVMAP, 4, 4, 64, 0, "fl_br_ports")?,
        })
    }

    /// Makes interface `ifindex` port `port` (a redirect and flood target).
    pub fn set_port(&self, port: u32, ifindex: u32) -> Result<(), SysError> {
        bpf::map_update(
            &self.ports,
            &port.to_ne_bytes(),
            &ifindex.to_ne_bytes(),
            4,
            4,
        )
    }

    /// The table's descriptor and the device map's, for the program.
    pub fn fds(&self) -> (RawFd, RawFd) {
        (self.fdb.as_raw_fd(), self.ports.as_raw_fd())
    }

    /// The used slots: (index, word).
    fn used(&self) -> Result<Vec<(u32, u64)>, SysError> {
        let mut out = Vec::new();
        for i in 0..crate::ebpf::fdb::SLOTS {
            if let Some(v) = bpf::map_lookup(&self.fdb, &i.to_ne_bytes(), 8)? {
                let w = u64::from_ne_bytes(v[..8].try_into().unwrap_or_default());
                if w != 0 {
                    out.push((i, w));
                }
            }
        }
        Ok(out)
    }

    /// Every learnt station: (MAC, port).
    pub fn entries(&self) -> Result<Vec<([u8; 6], u32)>, SysError> {
        use crate::ebpf::fdb;
        Ok(self
            .used()?
            .into_iter()
            .map(|(_, w)| {
                (
                    fdb::mac_bytes(w >> fdb::MAC_SHIFT),
                    ((w >> fdb::PORT_SHIFT) & 0xff) as u32,
                )
            })
            .collect())
    }

    /// One ageing sweep: a station heard since the last sweep loses its seen bit, one not
    /// heard is forgotten; how many were forgotten. Sweeping every T seconds forgets a
    /// station between T and 2T after it was last heard.
    pub fn sweep(&self) -> Result<usize, SysError> {
        use crate::ebpf::fdb;
        let mut gone = 0;
        for (i, w) in self.used()? {
            let new = if w & fdb::SEEN != 0 {
                w & !fdb::SEEN
            } else {
                0
            };
            gone += usize::from(new == 0);
            bpf::map_update(&self.fdb, &i.to_ne_bytes(), &new.to_ne_bytes(), 4, 8)?;
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the kernel (needs CAP_BPF; skipped without it): a value of the wrong size or
    /// an index past the end is refused before the call, a right one is taken.
    #[test]
    fn an_array_map_refuses_what_does_not_fit() {
        let m = match ArrayMap::create("fl_test_arr", 16, 2) {
            Ok(m) => m,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: creating a BPF map needs CAP_BPF");
                return;
            }
            Err(e) => panic!("create: {e}"),
        };
        assert_eq!(m.value_size(), 16);
        m.set(1, &[7; 16]).expect("a value that fits");
        let e = m.set(2, &[0; 16]).expect_err("past the end");
        assert_eq!(e.source.kind(), std::io::ErrorKind::InvalidInput);
        let e = m.set(0, &[0; 8]).expect_err("short value");
        assert!(
            e.to_string().contains("8-byte value for 16-byte entries"),
            "{e}"
        );
    }

    /// The kernel's trie answers the longest prefix, and removals and replacements take.
    #[test]
    fn an_lpm_trie_answers_the_longest_prefix() {
        let t = match LpmTrie6::create("fl_test_lpm", 16) {
            Ok(t) => t,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: creating a BPF map needs CAP_BPF");
                return;
            }
            Err(e) => panic!("create: {e}"),
        };
        let a = |s: &str| s.parse::<std::net::Ipv6Addr>().expect("address").octets();
        t.set(32, a("2001:2::"), 1).expect("set");
        t.set(48, a("2001:2:0:1::"), 2).expect("set");
        t.set(128, a("2001:2:0:1::7"), 3).expect("set");
        assert_eq!(t.lookup(a("2001:2:0:1::7")).expect("lookup"), Some(3));
        assert_eq!(t.lookup(a("2001:2:0:1::8")).expect("lookup"), Some(2));
        assert_eq!(t.lookup(a("2001:2:5::1")).expect("lookup"), Some(1));
        assert_eq!(t.lookup(a("2001:3::1")).expect("lookup"), None);
        t.set(48, a("2001:2:0:1::"), 4).expect("replace");
        assert_eq!(t.lookup(a("2001:2:0:1::8")).expect("lookup"), Some(4));
        assert!(t.remove(48, a("2001:2:0:1::")).expect("remove"));
        assert!(!t.remove(48, a("2001:2:0:1::")).expect("remove again"));
        assert_eq!(t.lookup(a("2001:2:0:1::8")).expect("lookup"), Some(1));
        assert!(t.set(129, a("::"), 0).is_err(), "a length past 128");
    }
}
