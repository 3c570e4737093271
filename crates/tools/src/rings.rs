//! AF_PACKET ring memory from a budget. A ring slot holds one frame of the interface's MTU, so
//! a fixed slot count costs what the MTU says: 4 096 slots on `lo` (64 KiB MTU) map 512 MiB,
//! a receive and a transmit ring per worker and a worker per CPU make 2 GiB on 2 CPUs. Roles
//! instead split a budget (`--ring-memory`, default [`DEFAULT_BUDGET`]) evenly over their rings,
//! give each the most slots that fit (at most the role's own cap), refuse a budget that cannot
//! give each ring [`MIN_SLOTS`], and report what was mapped ([`RingMemory`]).

use flowlane_io::frame::RingGeometry;
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// The default budget for all of a run's rings: 256 MiB.
pub const DEFAULT_BUDGET: u64 = 256 << 20;

/// Fewer slots than this per ring and a burst of a few dozen frames already overflows it.
pub const MIN_SLOTS: usize = 64;

/// What a run's rings map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RingMemory {
    /// The budget, bytes.
    pub budget: u64,
    /// Rings mapped.
    pub rings: usize,
    /// Slots per ring (the fewest, where rings differ).
    pub slots: usize,
    /// Bytes per slot (the largest, where rings differ).
    pub slot_bytes: usize,
    /// Bytes mapped by all the rings.
    pub bytes: u64,
}

impl RingMemory {
    /// `4 rings of 4 120 slots × 1 600 B: 26 MiB mapped (budget 256 MiB)`.
    pub fn line(&self) -> String {
        format!(
            "{} ring{} of {} slots × {} B: {} mapped (budget {})",
            self.rings,
            if self.rings == 1 { "" } else { "s" },
            self.slots,
            self.slot_bytes,
            mib(self.bytes),
            mib(self.budget)
        )
    }
}

/// `26 MiB` (rounded up: a figure never below what was mapped), or `0.1 MiB` below one.
fn mib(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{} MiB", bytes.div_ceil(1 << 20))
    }
}

/// Geometries for `kinds` (per kind: how many rings, bytes per slot), each ring given an equal
/// share of `budget` and at most `max_slots` slots. `flag` names the setting in the refusal of
/// a budget too small for [`MIN_SLOTS`] (or `max_slots`, if fewer) per ring.
pub fn plan(
    budget: u64,
    kinds: &[(usize, usize)],
    max_slots: usize,
    flag: &str,
) -> Result<(Vec<RingGeometry>, RingMemory), ToolError> {
    let rings: usize = kinds.iter().map(|k| k.0).sum();
    let share = usize::try_from(budget / rings.max(1) as u64).unwrap_or(usize::MAX);
    let least = MIN_SLOTS.min(max_slots.max(1));
    let mut out = Vec::with_capacity(kinds.len());
    for &(_, slot) in kinds {
        match RingGeometry::within(share, slot, max_slots.max(1)) {
            Some(g) if g.slots >= least => out.push(g),
            _ => {
                let need: u64 = kinds
                    .iter()
                    .map(|&(n, s)| n as u64 * RingGeometry::new(least, s).bytes as u64)
                    .sum();
                let slot = RingGeometry::new(1, slot).slot_size;
                return Err(ToolError::usage(format!(
                    "{rings} ring{} of {slot}-byte slots need {} for {least} slots each, more \
                     than {flag} {}: raise {flag}, or give fewer CPUs",
                    if rings == 1 { "" } else { "s" },
                    mib(need),
                    mib(budget)
                )));
            }
        }
    }
    let memory = RingMemory {
        budget,
        rings,
        slots: out.iter().map(|g| g.slots).min().unwrap_or(0),
        slot_bytes: out.iter().map(|g| g.slot_size).max().unwrap_or(0),
        bytes: out
            .iter()
            .zip(kinds)
            .map(|(g, &(n, _))| n as u64 * g.bytes as u64)
            .sum(),
    };
    Ok((out, memory))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowlane_io::frame::rx_slot_size;

    #[test]
    fn loopbacks_rings_fit_the_budget_and_say_so() {
        // lo's MTU on 16 CPUs: a receive and a transmit ring each: 32 rings in 256 MiB.
        let (rx, tx) = (rx_slot_size(65536 + 18), 65536 + 18 + 32);
        let (g, m) =
            plan(DEFAULT_BUDGET, &[(16, rx), (16, tx)], 4096, "--ring-memory").expect("fits");
        assert!(m.bytes <= DEFAULT_BUDGET, "{m:?}");
        assert_eq!(m.bytes, 16 * (g[0].bytes + g[1].bytes) as u64);
        assert!(m.slots >= MIN_SLOTS && m.rings == 32, "{m:?}");
        assert!(m.line().starts_with("32 rings of "), "{}", m.line());
        assert!(m.line().ends_with("(budget 256 MiB)"), "{}", m.line());
        // A 1 500-byte MTU is capped by the slots, far below the budget.
        let (_, m) = plan(
            DEFAULT_BUDGET,
            &[(2, rx_slot_size(1518))],
            4096,
            "--ring-memory",
        )
        .expect("fits");
        assert_eq!((m.slots, m.bytes), (4120, 2 * 103 * 65536));
    }

    #[test]
    fn a_budget_below_the_least_ring_is_refused_with_what_it_needs() {
        let e = plan(
            8 << 20,
            &[(2, rx_slot_size(65536 + 18))],
            8192,
            "--ring-memory",
        )
        .expect_err("too small");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
        assert!(e.message.contains("raise --ring-memory"), "{e}");
        assert!(e.message.contains("64 slots each"), "{e}");
        assert!(e.message.contains("more than --ring-memory 8 MiB"), "{e}");
    }
}
