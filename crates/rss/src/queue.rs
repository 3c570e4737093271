//! From a 32-bit hash to a receive queue (or CPU): the models NICs and kernels use.
//!
//! * [`Reta`]: an indirection table indexed by the low bits of the hash,
//!   `queue = reta[hash & (size - 1)]` — what NICs do (82599: 128 entries; ice/mlx5: up to 512+).
//! * [`QueueModel::Modulo`]: `hash % n`, what some software dispatchers do.
//! * [`QueueModel::Rps`]: Linux RPS/`reciprocal_scale`: `(hash as u64 * n) >> 32`.
//! * [`FreeBsdBuckets`]: FreeBSD's RSS framework: `bucket = hash & mask`, buckets given to CPUs
//!   round-robin (`rss_getcpu`).

use std::fmt;

/// Largest indirection table accepted (entries).
pub const RETA_MAX: usize = 1 << 16;

/// Why an indirection table could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetaError {
    /// Table size must be a power of two from 1 to 65536.
    BadSize(usize),
    /// Zero queues, or weights that sum to zero.
    NoQueues,
    /// The weights add up to more than the table has entries (ethtool refuses this too).
    WeightsExceedSize {
        /// Sum of the weights.
        sum: u64,
        /// Table entries.
        size: usize,
    },
    /// A line of a RETA file could not be read.
    Parse {
        /// 1-based line number (0: the whole text).
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for RetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetaError::BadSize(n) => write!(
                f,
                "indirection table has {n} entries; it must be a power of two from 1 to {RETA_MAX}"
            ),
            RetaError::NoQueues => write!(f, "need at least one queue (and a non-zero weight)"),
            RetaError::WeightsExceedSize { sum, size } => write!(
                f,
                "weights add up to {sum}, more than the {size} entries of the indirection table"
            ),
            RetaError::Parse { line, reason } => write!(f, "RETA line {line}: {reason}"),
        }
    }
}

impl std::error::Error for RetaError {}

/// An RSS indirection table: entry `i` names the queue for hashes whose low bits equal `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reta {
    entries: Vec<u16>,
}

impl Reta {
    /// The default fill of Linux drivers (`ethtool_rxfh_indir_default`): entry `i` = `i % queues`.
    pub fn round_robin(size: usize, queues: usize) -> Result<Reta, RetaError> {
        check_size(size)?;
        if queues == 0 || queues > RETA_MAX {
            return Err(RetaError::NoQueues);
        }
        Ok(Reta {
            entries: (0..size).map(|i| (i % queues) as u16).collect(),
        })
    }

    /// Weighted fill as `ethtool -X DEV weight W0 W1 …` computes it: entry `i` goes to the first
    /// queue `j` with `i < size * (W0 + … + Wj) / sum`, so queue `j` gets about `size * Wj / sum`
    /// entries (a queue with weight 0 gets none).
    pub fn weighted(size: usize, weights: &[u32]) -> Result<Reta, RetaError> {
        check_size(size)?;
        let sum: u64 = weights.iter().map(|&w| w as u64).sum();
        if weights.is_empty() || sum == 0 || weights.len() > RETA_MAX {
            return Err(RetaError::NoQueues);
        }
        if sum > size as u64 {
            return Err(RetaError::WeightsExceedSize { sum, size });
        }
        let mut entries = Vec::with_capacity(size);
        let mut j = 0usize;
        let mut partial = weights[0] as u64;
        for i in 0..size as u64 {
            while i >= size as u64 * partial / sum {
                j += 1;
                partial += weights[j] as u64;
            }
            entries.push(j as u16);
        }
        Ok(Reta { entries })
    }

    /// An explicit table.
    pub fn from_entries(entries: Vec<u16>) -> Result<Reta, RetaError> {
        check_size(entries.len())?;
        Ok(Reta { entries })
    }

    /// Parses a table from text: either whitespace-separated queue numbers, or the output of
    /// `ethtool -x DEV` (lines like `    8:      0     1     2 …`). `#` starts a comment. The
    /// key and hash function of an `ethtool -x` text are read by [`crate::ethtool::EthtoolRss`].
    pub fn parse(text: &str) -> Result<Reta, RetaError> {
        crate::ethtool::EthtoolRss::parse(text).map(|d| d.reta)
    }

    /// The entries.
    pub fn entries(&self) -> &[u16] {
        &self.entries
    }

    /// Number of entries (a power of two).
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Number of queues the table names: highest entry + 1.
    pub fn queues(&self) -> usize {
        self.entries
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1)
    }

    /// Table index for a hash: its low `log2(len)` bits.
    #[inline]
    pub fn index(&self, hash: u32) -> usize {
        hash as usize & (self.entries.len() - 1)
    }

    /// Queue for a hash.
    #[inline]
    pub fn queue(&self, hash: u32) -> u32 {
        self.entries[self.index(hash)] as u32
    }
}

fn check_size(size: usize) -> Result<(), RetaError> {
    if size == 0 || size > RETA_MAX || !size.is_power_of_two() {
        return Err(RetaError::BadSize(size));
    }
    Ok(())
}

/// FreeBSD's RSS bucket model (`sys/net/rss_config.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeBsdBuckets {
    bits: u32,
    ncpus: u32,
}

/// FreeBSD caps the bucket count at 2^7 = 128 (`RSS_MAXBITS`).
pub const FREEBSD_MAX_BITS: u32 = 7;

impl FreeBsdBuckets {
    /// The default for `ncpus` CPUs: `bits = fls(ncpus - 1) + 1` (at least two buckets per
    /// CPU), at most 7; `ncpus` of 0 is treated as 1.
    pub fn new(ncpus: u32) -> FreeBsdBuckets {
        let ncpus = ncpus.max(1);
        let fls = 32 - (ncpus - 1).leading_zeros(); // fls(0) = 0
        FreeBsdBuckets {
            bits: (fls + 1).min(FREEBSD_MAX_BITS),
            ncpus,
        }
    }

    /// A configuration whose bits are set by hand, as the tunable `net.inet.rss.bits` does
    /// (the seed set 3 for 8 buckets); `None` outside 0..=[`FREEBSD_MAX_BITS`].
    pub fn with_bits(bits: u32, ncpus: u32) -> Option<FreeBsdBuckets> {
        (bits <= FREEBSD_MAX_BITS).then_some(FreeBsdBuckets {
            bits,
            ncpus: ncpus.max(1),
        })
    }

    /// Bits of the hash used (`rss_bits`).
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Number of buckets (`rss_buckets = 1 << bits`).
    pub fn buckets(&self) -> u32 {
        1 << self.bits
    }

    /// Number of CPUs.
    pub fn ncpus(&self) -> u32 {
        self.ncpus
    }

    /// Bucket of a hash: `hash & (buckets - 1)` (`rss_hash2bucket`).
    pub fn bucket(&self, hash: u32) -> u32 {
        hash & (self.buckets() - 1)
    }

    /// CPU that owns a bucket: round-robin over CPUs 0..ncpus (`rss_getcpu`).
    pub fn cpu(&self, bucket: u32) -> u32 {
        bucket % self.ncpus
    }
}

/// A hash → queue model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueModel {
    /// NIC indirection table.
    Reta(Reta),
    /// `hash % n`.
    Modulo(u32),
    /// Linux RPS: `(hash * n) >> 32`.
    Rps(u32),
    /// FreeBSD buckets; the "queue" is the bucket.
    FreeBsd(FreeBsdBuckets),
}

/// When the queue is `table[(hash >> shift) & mask]`, the picker can solve for it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearView {
    /// Right shift applied to the hash.
    pub shift: u32,
    /// Mask applied after the shift (`2^k - 1`).
    pub mask: u32,
    /// Queue for each masked value (`mask + 1` entries).
    pub table: Vec<u32>,
}

impl QueueModel {
    /// Queue for a hash.
    pub fn queue(&self, hash: u32) -> u32 {
        match self {
            QueueModel::Reta(r) => r.queue(hash),
            QueueModel::Modulo(n) => hash % (*n).max(1),
            QueueModel::Rps(n) => ((hash as u64 * (*n).max(1) as u64) >> 32) as u32,
            QueueModel::FreeBsd(b) => b.bucket(hash),
        }
    }

    /// Number of queues (or buckets).
    pub fn queues(&self) -> u32 {
        match self {
            QueueModel::Reta(r) => r.queues() as u32,
            QueueModel::Modulo(n) | QueueModel::Rps(n) => (*n).max(1),
            QueueModel::FreeBsd(b) => b.buckets(),
        }
    }

    /// The index the model looks up for a hash (RETA index, bucket), when it has one.
    pub fn index(&self, hash: u32) -> Option<u32> {
        match self {
            QueueModel::Reta(r) => Some(r.index(hash) as u32),
            QueueModel::FreeBsd(b) => Some(b.bucket(hash)),
            _ => None,
        }
    }

    /// The model as a table lookup on a bit field of the hash, if it is one. `Modulo` and `Rps`
    /// are only when `n` is a power of two (then they read the low or high bits).
    pub fn linear_view(&self) -> Option<LinearView> {
        match self {
            QueueModel::Reta(r) => Some(LinearView {
                shift: 0,
                mask: r.len() as u32 - 1,
                table: r.entries().iter().map(|&q| q as u32).collect(),
            }),
            QueueModel::FreeBsd(b) => Some(LinearView {
                shift: 0,
                mask: b.buckets() - 1,
                table: (0..b.buckets()).collect(),
            }),
            QueueModel::Modulo(n) if n.is_power_of_two() => Some(LinearView {
                shift: 0,
                mask: n - 1,
                table: (0..*n).collect(),
            }),
            QueueModel::Rps(n) if n.is_power_of_two() => Some(LinearView {
                shift: 32 - n.trailing_zeros(),
                mask: n - 1,
                table: (0..*n).collect(),
            }),
            _ => None,
        }
    }

    /// Name for output.
    pub fn name(&self) -> &'static str {
        match self {
            QueueModel::Reta(_) => "reta",
            QueueModel::Modulo(_) => "modulo",
            QueueModel::Rps(_) => "rps",
            QueueModel::FreeBsd(_) => "freebsd",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_default() {
        let r = Reta::round_robin(128, 3).expect("valid");
        assert_eq!(&r.entries()[..5], &[0, 1, 2, 0, 1]);
        assert_eq!(r.queues(), 3);
        assert_eq!(r.index(0xffff_ff85), 5);
        assert_eq!(r.queue(0x85), 2);
        assert_eq!(Reta::round_robin(100, 3), Err(RetaError::BadSize(100)));
        assert_eq!(Reta::round_robin(128, 0), Err(RetaError::NoQueues));
    }

    #[test]
    fn weighted_like_ethtool() {
        let r = Reta::weighted(8, &[1, 1, 2]).expect("valid");
        assert_eq!(r.entries(), &[0, 0, 1, 1, 2, 2, 2, 2]);
        let r = Reta::weighted(128, &[1, 0, 1]).expect("valid");
        assert_eq!(r.entries().iter().filter(|&&q| q == 1).count(), 0);
        assert_eq!(r.entries().iter().filter(|&&q| q == 0).count(), 64);
        assert_eq!(
            Reta::weighted(4, &[3, 3]),
            Err(RetaError::WeightsExceedSize { sum: 6, size: 4 })
        );
        assert_eq!(Reta::weighted(4, &[0, 0]), Err(RetaError::NoQueues));
    }

    #[test]
    fn parse_plain_and_ethtool() {
        let r = Reta::parse("0 1\n2 3 # comment\n").expect("valid");
        assert_eq!(r.entries(), &[0, 1, 2, 3]);
        let ethtool = "RX flow hash indirection table for veth0 with 2 RX ring(s):\n\
                       \x20   0:      0     1     0     1\n\
                       \x20   4:      1     0     1     0\n\
                       RSS hash key:\n\
                       6d:5a:56:da:25:5b:0e:c2:41:67:25:3d:43:a3:8f:b0:d0:ca:2b:cb:ae:7b:30:b4:77:cb:2d:a3:80:30:f2:0c:6a:42:b7:3b:be:ac:01:fa\n\
                       RSS hash function:\n    toeplitz: on\n";
        let r = Reta::parse(ethtool).expect("valid");
        assert_eq!(r.entries(), &[0, 1, 0, 1, 1, 0, 1, 0]);
        assert!(matches!(
            Reta::parse("0 1 x"),
            Err(RetaError::Parse { line: 1, .. })
        ));
        assert!(matches!(Reta::parse("0 1 2"), Err(RetaError::BadSize(3))));
        assert!(matches!(Reta::parse(""), Err(RetaError::Parse { .. })));
        let skipped = "RX flow hash indirection table for x:\n    0: 0 1\n    4: 0 1\n";
        assert!(matches!(
            Reta::parse(skipped),
            Err(RetaError::Parse { line: 3, .. })
        ));
    }

    #[test]
    fn freebsd_bucket_counts() {
        // bits = fls(ncpus - 1) + 1, capped at 7.
        for (ncpus, buckets) in [
            (1, 2),
            (2, 4),
            (3, 8),
            (4, 8),
            (5, 16),
            (8, 16),
            (64, 128),
            (256, 128),
        ] {
            assert_eq!(
                FreeBsdBuckets::new(ncpus).buckets(),
                buckets,
                "ncpus={ncpus}"
            );
        }
        let b = FreeBsdBuckets::new(4);
        assert_eq!(b.bucket(0x1234_567f), 7);
        assert_eq!(
            (0..8).map(|k| b.cpu(k)).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 0, 1, 2, 3]
        );
    }

    #[test]
    fn models_agree_with_linear_views() {
        let models = [
            QueueModel::Reta(Reta::round_robin(128, 6).expect("valid")),
            QueueModel::FreeBsd(FreeBsdBuckets::new(6)),
            QueueModel::Modulo(8),
            QueueModel::Rps(4),
        ];
        for m in &models {
            let v = m.linear_view().expect("linear");
            for h in [0u32, 1, 0xdead_beef, 0x8000_0000, 0xffff_ffff, 0x1234_5678] {
                assert_eq!(
                    m.queue(h),
                    v.table[((h >> v.shift) & v.mask) as usize],
                    "{m:?}"
                );
            }
        }
        assert_eq!(QueueModel::Rps(3).linear_view(), None);
        assert_eq!(QueueModel::Rps(3).queue(0xffff_ffff), 2);
        assert_eq!(QueueModel::Modulo(3).queue(7), 1);
    }
}
