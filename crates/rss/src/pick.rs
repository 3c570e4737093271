//! The picker: choose source addresses and ports so flows land on chosen queues.
//!
//! The Toeplitz hash is linear over GF(2): `hash(base ^ x) = hash(base) ^ hash(x)`, and
//! `hash(x)` is the XOR of one key window per set bit of `x`. A range of source ports (or
//! addresses) splits into aligned power-of-two blocks; inside a block the high bits are fixed and
//! the low `t` bits are free. For a model that reads a bit field of the hash (a RETA indexed by
//! the low bits, FreeBSD buckets, power-of-two `%` or RPS), landing on table index `j` is a system
//! of linear equations in those free bits. One XOR basis per block answers every index at once:
//! whether a solution exists, one solution, and — from the kernel — exactly how many there are
//! and all of them. No trial hashing is involved; every returned tuple is then verified by
//! hashing it. Models that are not a bit field (`% n`, RPS with `n` not a power of two) are
//! handled by walking the range in Gray-code order, one XOR per candidate, also exact.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::gf2::XorBasis;
use crate::queue::QueueModel;
use crate::toeplitz::Toeplitz;
use crate::tuple::{Symmetric, Tuple};

/// Most free bits in one block (source-address bits plus port bits).
pub const MAX_FREE_BITS: u32 = 64;
/// Most tuples one request may return.
pub const MAX_RESULTS: u64 = 1 << 24;
/// Largest range walked exhaustively for non-linear models.
pub const MAX_WALK: u128 = 1 << 28;

/// What to pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickSpec {
    /// Inclusive range of source addresses to choose from (one address: `(a, a)`).
    pub src_addrs: (IpAddr, IpAddr),
    /// Destination address (fixed).
    pub dst: IpAddr,
    /// Inclusive range of source ports to choose from.
    pub src_ports: (u16, u16),
    /// Destination port (fixed).
    pub dst_port: u16,
    /// Hash the 4-tuple (true) or only the addresses (false, e.g. fragments, FreeBSD UDP).
    pub hash_ports: bool,
    /// Queues to fill; empty = every queue of the model.
    pub queues: Vec<u32>,
    /// Tuples wanted per queue; `None` = all of them.
    pub per_queue: Option<u64>,
    /// The NIC's symmetric hashing: tuples are hashed as [`Tuple::symmetric`] turns them.
    pub symmetric: Symmetric,
    /// Source addresses never offered (e.g. the destination itself, an IPv4 prefix's network
    /// and broadcast addresses). Under [`Symmetric::Sort`] the destination is never offered.
    pub exclude: Vec<IpAddr>,
}

/// Why a request cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickError {
    /// Source and destination families differ.
    MixedFamilies,
    /// A range whose start is above its end.
    EmptyRange,
    /// A queue the model does not have.
    NoSuchQueue {
        /// The queue asked for.
        queue: u32,
        /// Queues the model has.
        queues: u32,
    },
    /// An aligned block has more free bits than [`MAX_FREE_BITS`].
    RangeTooWide {
        /// Free bits found.
        free_bits: u32,
    },
    /// The answer would hold more than [`MAX_RESULTS`] tuples; ask for `per_queue`.
    TooManyResults {
        /// Tuples that would be returned.
        total: u128,
    },
    /// A non-linear model over a range larger than [`MAX_WALK`].
    WalkTooLong {
        /// Candidates in the range.
        candidates: u128,
    },
    /// The source range holds nothing but excluded addresses.
    NothingLeft,
}

impl std::fmt::Display for PickError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PickError::MixedFamilies => {
                write!(f, "source and destination must both be IPv4 or both IPv6")
            }
            PickError::EmptyRange => write!(f, "a range's start is above its end"),
            PickError::NoSuchQueue { queue, queues } => {
                write!(
                    f,
                    "queue {queue} does not exist (the model has {queues} queues)"
                )
            }
            PickError::RangeTooWide { free_bits } => write!(
                f,
                "source range too wide: {free_bits} free bits in one block (at most \
                 {MAX_FREE_BITS}); narrow the address range"
            ),
            PickError::TooManyResults { total } => write!(
                f,
                "{total} tuples match; ask for a number per queue (at most {MAX_RESULTS} in all)"
            ),
            PickError::WalkTooLong { candidates } => write!(
                f,
                "this queue model is not a bit field of the hash, so the range is walked; \
                 {candidates} candidates exceed the limit of {MAX_WALK}"
            ),
            PickError::NothingLeft => write!(
                f,
                "the source range holds only the destination and excluded addresses (an IPv4 \
                 prefix's network and broadcast addresses); widen it"
            ),
        }
    }
}

impl std::error::Error for PickError {}

/// One chosen tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Picked {
    /// The flow.
    pub tuple: Tuple,
    /// Its hash (verified).
    pub hash: u32,
}

/// The answer for one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePick {
    /// The queue.
    pub queue: u32,
    /// Chosen tuples, sorted by source address then port.
    pub tuples: Vec<Picked>,
    /// How many tuples in the whole free range land on this queue (exact).
    pub available: u128,
}

/// How the answer was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Linear algebra over GF(2).
    Gf2,
    /// Gray-code walk of the range (non-linear model).
    Walk,
}

/// The picker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickResult {
    /// One entry per requested queue, in request order.
    pub queues: Vec<QueuePick>,
    /// How it was computed.
    pub method: Method,
    /// Tuples whose verification hash disagreed with the solution (always 0 unless a bug).
    pub verify_failures: u64,
}

/// Range bookkeeping for one family: addresses as integers, bit positions in the hash input.
#[derive(Debug, Clone, Copy)]
struct Layout {
    addr_bits: u32,
    /// Input byte offset of the source port.
    sport_off: usize,
}

impl Layout {
    /// Input bit position (MSB-first) of source-address bit `j` (LSB = 0).
    fn addr_bit_pos(&self, j: u32) -> usize {
        (self.addr_bits - 1 - j) as usize
    }
    /// Input bit position of source-port bit `j`.
    fn port_bit_pos(&self, j: u32) -> usize {
        self.sport_off * 8 + (15 - j) as usize
    }
}

/// An address as an integer (IPv4 in the low 32 bits), the order the picker's ranges use.
pub fn addr_to_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    }
}

fn u128_to_addr(v: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// Splits `lo..=hi` into aligned blocks `(start, free_bits)`, ascending.
fn aligned_blocks(lo: u128, hi: u128) -> Vec<(u128, u32)> {
    if lo == 0 && hi == u128::MAX {
        return vec![(0, 128)];
    }
    let mut out = Vec::new();
    let mut cur = lo;
    loop {
        // Largest block aligned at `cur` that ends inside the range. `cur` has its low `k`
        // bits clear, so `cur + 2^k - 1` cannot overflow.
        let mut k = cur.trailing_zeros().min(127);
        while cur + ((1u128 << k) - 1) > hi {
            k -= 1;
        }
        out.push((cur, k));
        let last = cur + ((1u128 << k) - 1);
        if last >= hi {
            return out;
        }
        cur = last + 1;
    }
}

/// Picks tuples for the requested queues. See the module documentation.
pub fn pick(
    hasher: &Toeplitz,
    model: &QueueModel,
    spec: &PickSpec,
) -> Result<PickResult, PickError> {
    let (lo, hi) = spec.src_addrs;
    let same_family = |a: IpAddr| a.is_ipv4() == spec.dst.is_ipv4();
    if !same_family(lo) || !same_family(hi) {
        return Err(PickError::MixedFamilies);
    }
    let (alo, ahi) = (addr_to_u128(lo), addr_to_u128(hi));
    let (plo, phi) = spec.src_ports;
    if alo > ahi || plo > phi {
        return Err(PickError::EmptyRange);
    }
    let nqueues = model.queues();
    let queues: Vec<u32> = if spec.queues.is_empty() {
        (0..nqueues).collect()
    } else {
        spec.queues.clone()
    };
    if let Some(&q) = queues.iter().find(|&&q| q >= nqueues) {
        return Err(PickError::NoSuchQueue {
            queue: q,
            queues: nqueues,
        });
    }
    let addr_bits = if spec.dst.is_ipv4() { 32 } else { 128 };
    let layout = Layout {
        addr_bits,
        sport_off: (addr_bits / 8 * 2) as usize,
    };
    // Without ports in the hash the port is irrelevant: one block, no free port bits.
    let port_blocks = if spec.hash_ports {
        aligned_blocks(plo as u128, phi as u128)
    } else {
        vec![(plo as u128, 0)]
    };
    let addr_blocks: Vec<(u128, u32)> = allowed_ranges(alo, ahi, spec)
        .into_iter()
        .flat_map(|(a, b)| aligned_blocks(a, b))
        .collect();
    if addr_blocks.is_empty() {
        return Err(PickError::NothingLeft);
    }
    let ctx = Ctx {
        hasher,
        model,
        spec,
        layout,
        like: lo,
    };
    match model.linear_view() {
        Some(view) => ctx.solve_gf2(&view, &queues, &addr_blocks, &port_blocks),
        None => ctx.walk(&queues, &addr_blocks, &port_blocks),
    }
}

/// `lo..=hi` less the excluded addresses, as ascending sub-ranges. Under [`Symmetric::Sort`]
/// the destination is excluded too, so every sub-range lies wholly on one side of it.
fn allowed_ranges(lo: u128, hi: u128, spec: &PickSpec) -> Vec<(u128, u128)> {
    // Under sorting, a source equal to the destination is ordered by its port: not linear,
    // so the destination is left out; otherwise it is the caller's to exclude (a loopback
    // test sends from the address it sends to).
    let sorted_dst = (spec.symmetric == Symmetric::Sort).then_some(&spec.dst);
    let mut cut: Vec<u128> = spec
        .exclude
        .iter()
        .filter(|a| a.is_ipv4() == spec.dst.is_ipv4())
        .chain(sorted_dst)
        .map(|&a| addr_to_u128(a))
        .filter(|x| (lo..=hi).contains(x))
        .collect();
    cut.sort_unstable();
    cut.dedup();
    let mut out = Vec::new();
    let mut cur = Some(lo);
    for x in cut {
        let Some(c) = cur else { break };
        if x > c {
            out.push((c, x - 1));
        }
        cur = x.checked_add(1);
    }
    if let Some(c) = cur.filter(|&c| c <= hi) {
        out.push((c, hi));
    }
    out
}

struct Ctx<'a> {
    hasher: &'a Toeplitz,
    model: &'a QueueModel,
    spec: &'a PickSpec,
    layout: Layout,
    like: IpAddr,
}

/// One aligned (address block × port block): base values and the free variables' images.
struct Block {
    addr_base: u128,
    addr_free: u32,
    port_base: u16,
    port_free: u32,
    base_hash: u32,
    /// Hash image of each free variable: address bits first, then port bits.
    images: Vec<u32>,
}

impl Ctx<'_> {
    fn tuple(&self, addr: u128, port: u16) -> Tuple {
        let src = u128_to_addr(addr, self.like);
        let ports = self.spec.hash_ports.then_some((port, self.spec.dst_port));
        // Families were checked in `pick`.
        Tuple::new(src, self.spec.dst, ports).unwrap_or_else(|_| unreachable!("families checked"))
    }

    /// The hash the NIC computes for `t` (its symmetric transformation applied).
    fn hash(&self, t: &Tuple) -> u32 {
        self.hasher.hash(&t.symmetric(self.spec.symmetric))
    }

    /// The key window a free input bit at `pos` of the source address (`in_addr`) or source
    /// port contributes: under `Xor` the bit also stands in the destination's field; under
    /// `Sort`, a source above the destination is hashed in the destination's place.
    fn image(&self, pos: usize, in_addr: bool, addr_base: u128) -> u32 {
        let key = self.hasher.key();
        let shift = if in_addr {
            self.layout.addr_bits as usize
        } else {
            16
        };
        let dst = addr_to_u128(self.spec.dst);
        match self.spec.symmetric {
            Symmetric::Off => key.window(pos),
            Symmetric::Xor => key.window(pos) ^ key.window(pos + shift),
            // Blocks never straddle the destination (see `allowed_ranges`).
            Symmetric::Sort if addr_base > dst => key.window(pos + shift),
            Symmetric::Sort => key.window(pos),
        }
    }

    fn block(
        &self,
        (addr_base, addr_free): (u128, u32),
        (port_base, port_free): (u128, u32),
    ) -> Result<Block, PickError> {
        let free = addr_free + port_free;
        if free > MAX_FREE_BITS {
            return Err(PickError::RangeTooWide { free_bits: free });
        }
        let mut images = Vec::with_capacity(free as usize);
        for j in 0..addr_free {
            images.push(self.image(self.layout.addr_bit_pos(j), true, addr_base));
        }
        for j in 0..port_free {
            images.push(self.image(self.layout.port_bit_pos(j), false, addr_base));
        }
        let port_base = port_base as u16;
        Ok(Block {
            addr_base,
            addr_free,
            port_base,
            port_free,
            base_hash: self.hash(&self.tuple(addr_base, port_base)),
            images,
        })
    }

    /// The tuple for an assignment `x` of the block's free variables.
    fn assign(&self, b: &Block, x: u64) -> Tuple {
        let amask = if b.addr_free == 0 {
            0
        } else {
            u64::MAX >> (64 - b.addr_free)
        };
        let addr = b.addr_base | (x & amask) as u128;
        let port = b.port_base | ((x >> b.addr_free) as u16 & (((1u32 << b.port_free) - 1) as u16));
        self.tuple(addr, port)
    }

    fn verify(&self, t: Tuple, queue: u32, failures: &mut u64) -> Option<Picked> {
        let hash = self.hash(&t);
        if self.model.queue(hash) == queue {
            Some(Picked { tuple: t, hash })
        } else {
            *failures += 1;
            None
        }
    }

    fn solve_gf2(
        &self,
        view: &crate::queue::LinearView,
        queues: &[u32],
        addr_blocks: &[(u128, u32)],
        port_blocks: &[(u128, u32)],
    ) -> Result<PickResult, PickError> {
        let project = |h: u32| ((h >> view.shift) & view.mask) as u64;
        // Table indices per queue.
        let indices: Vec<Vec<u64>> = queues
            .iter()
            .map(|&q| {
                (0..view.table.len() as u64)
                    .filter(|&j| view.table[j as usize] == q)
                    .collect()
            })
            .collect();
        let mut results = empty_results(queues);
        let mut failures = 0u64;
        let mut blocks = Vec::new();
        for &ab in addr_blocks {
            for &pb in port_blocks {
                blocks.push(self.block(ab, pb)?);
            }
        }
        // Pass 1: exact counts (no enumeration).
        let mut solved: Vec<(usize, XorBasis)> = Vec::with_capacity(blocks.len());
        for (bi, b) in blocks.iter().enumerate() {
            let mut basis = XorBasis::default();
            for (v, &img) in b.images.iter().enumerate() {
                basis.insert(project(img), 1u64 << v);
            }
            let per_solution = 1u128 << basis.kernel().len();
            let base = project(b.base_hash);
            for (qi, idx) in indices.iter().enumerate() {
                for &j in idx {
                    if basis.solve(j ^ base).is_some() {
                        results[qi].available += per_solution;
                    }
                }
            }
            solved.push((bi, basis));
        }
        let wanted = |avail: u128| -> u128 {
            match self.spec.per_queue {
                Some(k) => avail.min(k as u128),
                None => avail,
            }
        };
        let total: u128 = results.iter().map(|r| wanted(r.available)).sum();
        if total > MAX_RESULTS as u128 {
            return Err(PickError::TooManyResults { total });
        }
        // Pass 2: enumerate solutions until each queue has what it asked for.
        for (qi, idx) in indices.iter().enumerate() {
            let want = wanted(results[qi].available) as usize;
            let queue = results[qi].queue;
            'blocks: for (bi, basis) in &solved {
                let b = &blocks[*bi];
                let base = project(b.base_hash);
                for &j in idx {
                    if results[qi].tuples.len() >= want {
                        break 'blocks;
                    }
                    let Some(mut x) = basis.solve(j ^ base) else {
                        continue;
                    };
                    let kernel = basis.kernel();
                    let count: u128 = 1u128 << kernel.len();
                    let mut i: u128 = 0;
                    loop {
                        if let Some(p) = self.verify(self.assign(b, x), queue, &mut failures) {
                            results[qi].tuples.push(p);
                        }
                        i += 1;
                        if i == count || results[qi].tuples.len() >= want {
                            break;
                        }
                        // Gray code: flip the kernel vector of the lowest set bit of i.
                        x ^= kernel[i.trailing_zeros() as usize];
                    }
                }
            }
        }
        Ok(finish(results, Method::Gf2, failures))
    }

    fn walk(
        &self,
        queues: &[u32],
        addr_blocks: &[(u128, u32)],
        port_blocks: &[(u128, u32)],
    ) -> Result<PickResult, PickError> {
        let mut candidates: u128 = 0;
        for &(_, af) in addr_blocks {
            for &(_, pf) in port_blocks {
                candidates = candidates.saturating_add(1u128 << (af + pf).min(127));
            }
        }
        if candidates > MAX_WALK {
            return Err(PickError::WalkTooLong { candidates });
        }
        let slot = |q: u32| queues.iter().position(|&x| x == q);
        let mut results = empty_results(queues);
        let mut failures = 0;
        let cap = self.spec.per_queue.unwrap_or(MAX_RESULTS) as usize;
        let mut kept = 0u64;
        for &ab in addr_blocks {
            for &pb in port_blocks {
                let b = self.block(ab, pb)?;
                let n: u64 = 1 << b.images.len();
                let (mut x, mut h) = (0u64, b.base_hash);
                for i in 0..n {
                    if i > 0 {
                        let v = i.trailing_zeros() as usize;
                        x ^= 1 << v;
                        h ^= b.images[v];
                    }
                    let q = self.model.queue(h);
                    if let Some(s) = slot(q) {
                        results[s].available += 1;
                        if results[s].tuples.len() < cap {
                            if let Some(p) = self.verify(self.assign(&b, x), q, &mut failures) {
                                results[s].tuples.push(p);
                                kept += 1;
                                if kept > MAX_RESULTS {
                                    return Err(PickError::TooManyResults {
                                        total: kept as u128,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(finish(results, Method::Walk, failures))
    }
}

fn empty_results(queues: &[u32]) -> Vec<QueuePick> {
    queues
        .iter()
        .map(|&q| QueuePick {
            queue: q,
            tuples: Vec::new(),
            available: 0,
        })
        .collect()
}

/// Sorts each queue's tuples by source address then port, and wraps up.
fn finish(mut queues: Vec<QueuePick>, method: Method, verify_failures: u64) -> PickResult {
    for r in &mut queues {
        r.tuples
            .sort_by_key(|p| (addr_to_u128(p.tuple.src()), p.tuple.ports().map(|x| x.0)));
    }
    PickResult {
        queues,
        method,
        verify_failures,
    }
}

#[cfg(test)]
mod tests;
