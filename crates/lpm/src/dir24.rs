//! DIR-24-8 (Gupta, Lin & McKeown 1998; DPDK `rte_lpm`): the baseline the benchmarks compare
//! against. A 2^24-entry first table indexed by the top 24 bits (64 MiB here, `u32`
//! entries), and 256-entry second-level groups for the /24s that hold longer prefixes.

use crate::key::{Key, Prefix};
use crate::rib::Rib;
use crate::NO_ROUTE;

const EXT: u32 = 0x8000_0000;

/// One `tbl24` entry's worth of a table (see [`Dir24_8::block`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// One next hop for the whole /24 ([`Dir24_8::NONE`] for no route).
    Direct(u32),
    /// Routes longer than /24 inside it: a next hop per address ([`crate::NO_ROUTE`] for
    /// none).
    Group(Box<[u32; 256]>),
}

/// IPv4 DIR-24-8, built once from a table. It is the benchmarks' baseline and the native
/// router's table; a data plane holding its tables elsewhere applies a change by rewriting
/// only the entries the change covers ([`Dir24_8::span`], [`Dir24_8::block`]).
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

    /// The `tbl24` entries a route of prefix `p` lies in: the /24s it covers, or the one
    /// that holds it.
    pub fn span(p: Prefix<u32>) -> std::ops::Range<u32> {
        let first = p.addr() >> 8;
        let n = 1u32 << (24 - u32::from(p.len()).min(24));
        first..first + n
    }

    /// What `tbl24` entry `i` (the /24 at `i << 8`) is for `rib`, equal to what
    /// [`Dir24_8::build`] makes of it (with a group's contents in place of its number),
    /// from the routes covering and inside that /24 alone: the cost of the routes in one
    /// direct slot of the RIB (a /18), not of the table.
    ///
    /// # Panics
    /// When `i` is not below 2^24.
    pub fn block(rib: &Rib<u32>, i: u32) -> Block {
        assert!(i < 1 << 24, "Dir24_8::block: entry {i} is past tbl24");
        let lo = i << 8;
        let slot = lo.slot();
        // The longest route of /24 or shorter covering the /24: the slot's best short one,
        // unless a longer one in its list covers it too.
        let mut base = (rib.short_hop(slot), 0u8);
        let mut longer = false;
        for r in rib.chunk(slot) {
            if r.len <= 24 {
                if lo.mask(r.len) == r.addr && r.len >= base.1 {
                    base = (r.hop, r.len);
                }
            } else if r.addr >> 8 == i {
                longer = true;
            }
        }
        if !longer {
            return Block::Direct(if base.0 == NO_ROUTE {
                Self::NONE
            } else {
                base.0
            });
        }
        // Covering routes come before the routes nested in them in the list, so painting in
        // its order leaves the longest match at every address.
        let mut g = Box::new([base.0; 256]);
        for r in rib.chunk(slot) {
            if r.len > 24 && r.addr >> 8 == i {
                let start = (r.addr & 0xff) as usize;
                g[start..start + (1usize << (32 - u32::from(r.len)))].fill(r.hop);
            }
        }
        Block::Group(g)
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
