//! DIR-24-8 (Gupta, Lin & McKeown 1998; DPDK `rte_lpm`): the baseline the benchmarks compare
//! against. A 2^24-entry first table indexed by the top 24 bits (64 MiB here, `u32`
//! entries), and 256-entry second-level groups for the /24s that hold longer prefixes.

use crate::key::Prefix;
use crate::rib::Rib;
use crate::NO_ROUTE;

const EXT: u32 = 0x8000_0000;

/// IPv4 DIR-24-8, built once from a table (no incremental updates: it is a baseline).
#[derive(Debug, Clone)]
pub struct Dir24_8 {
    tbl24: Vec<u32>,
    tbl8: Vec<u32>,
}

impl Dir24_8 {
    /// Builds from every route of `rib`.
    pub fn build(rib: &Rib<u32>) -> Self {
        let mut routes: Vec<(Prefix<u32>, u32)> = rib.iter().collect();
        routes.sort_by_key(|(p, _)| p.len());
        let mut tbl24 = vec![NO_ROUTE & !EXT; 1 << 24];
        let mut tbl8: Vec<u32> = Vec::new();
        for &(p, hop) in &routes {
            let len = u32::from(p.len());
            let first = (p.addr() >> 8) as usize;
            if len <= 24 {
                tbl24[first..first + (1usize << (24 - len))].fill(hop);
            } else {
                let e = tbl24[first];
                let group = if e & EXT != 0 {
                    (e & !EXT) as usize
                } else {
                    let g = tbl8.len() / 256;
                    tbl8.extend(std::iter::repeat_n(e, 256));
                    tbl24[first] = g as u32 | EXT;
                    g
                };
                let start = group * 256 + (p.addr() & 0xff) as usize;
                tbl8[start..start + (1usize << (32 - len))].fill(hop);
            }
        }
        // Stored "no route" is the 31-bit value; widen it once here for tbl8.
        for e in &mut tbl8 {
            if *e == NO_ROUTE & !EXT {
                *e = NO_ROUTE;
            }
        }
        Dir24_8 { tbl24, tbl8 }
    }

    /// Longest-match next hop of `addr`.
    #[inline]
    pub fn lookup(&self, addr: u32) -> Option<u32> {
        let hop = self.lookup_raw(addr);
        (hop != NO_ROUTE).then_some(hop)
    }

    /// Batch lookup ([`NO_ROUTE`] where none matches).
    ///
    /// # Panics
    /// When `addrs` and `out` differ in length.
    pub fn lookup_batch(&self, addrs: &[u32], out: &mut [u32]) {
        assert_eq!(
            addrs.len(),
            out.len(),
            "lookup_batch: addrs and out differ in length"
        );
        for (o, &a) in out.iter_mut().zip(addrs) {
            *o = self.lookup_raw(a);
        }
    }

    /// The two tables as a data plane elsewhere (an XDP program's array maps) reads them:
    /// `tbl24[addr >> 8]` is a next hop, [`Dir24_8::NONE`] for no route, or — with
    /// [`Dir24_8::EXTENDED`] set — a group `g` whose next hops are `tbl8[g * 256 + (addr &
    /// 0xff)]` ([`crate::NO_ROUTE`] for none).
    pub fn tables(&self) -> (&[u32], &[u32]) {
        (&self.tbl24, &self.tbl8)
    }

    /// Set in a `tbl24` entry that names a `tbl8` group.
    pub const EXTENDED: u32 = EXT;
    /// A `tbl24` entry with no route.
    pub const NONE: u32 = NO_ROUTE & !EXT;

    /// Bytes of both tables.
    pub fn bytes(&self) -> usize {
        (self.tbl24.len() + self.tbl8.len()) * 4
    }

    #[inline(always)]
    fn lookup_raw(&self, addr: u32) -> u32 {
        let e = self.tbl24[(addr >> 8) as usize];
        if e & EXT != 0 {
            self.tbl8[(((e & !EXT) << 8) | (addr & 0xff)) as usize]
        } else if e == NO_ROUTE & !EXT {
            NO_ROUTE
        } else {
            e
        }
    }
}
