//! How evenly a key and a queue model spread a population of flows.

use crate::queue::QueueModel;
use crate::toeplitz::Toeplitz;
use crate::tuple::Tuple;

/// Load per queue for a sample of flows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Spread {
    /// Flows hashed.
    pub flows: u64,
    /// Flows per queue.
    pub per_queue: Vec<u64>,
    /// Smallest queue load.
    pub min: u64,
    /// Largest queue load.
    pub max: u64,
    /// `max / mean`: 1.0 is perfect; the busiest queue carries this multiple of a fair share.
    pub max_over_mean: f64,
    /// Distinct hash values seen among the flows.
    pub distinct_hashes: u64,
}

/// Hashes every tuple and counts flows per queue of `model`.
pub fn spread(hasher: &Toeplitz, model: &QueueModel, tuples: &[Tuple]) -> Spread {
    let mut per_queue = vec![0u64; model.queues().max(1) as usize];
    let mut hashes = vec![0u32; tuples.len()];
    hasher.hash_batch(tuples, &mut hashes);
    for &h in &hashes {
        if let Some(slot) = per_queue.get_mut(model.queue(h) as usize) {
            *slot += 1;
        }
    }
    hashes.sort_unstable();
    hashes.dedup();
    let flows = tuples.len() as u64;
    let min = per_queue.iter().copied().min().unwrap_or(0);
    let max = per_queue.iter().copied().max().unwrap_or(0);
    let mean = flows as f64 / per_queue.len() as f64;
    Spread {
        flows,
        min,
        max,
        max_over_mean: if mean > 0.0 { max as f64 / mean } else { 0.0 },
        distinct_hashes: hashes.len() as u64,
        per_queue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use crate::queue::Reta;
    use std::net::Ipv4Addr;

    #[test]
    fn microsoft_key_spreads_ports_evenly_symmetric_key_collapses() {
        let model = QueueModel::Reta(Reta::round_robin(128, 4).expect("valid"));
        let tuples: Vec<Tuple> = (0..4096u16)
            .map(|p| {
                Tuple::v4(
                    Ipv4Addr::new(198, 18, 0, (p % 200) as u8),
                    Ipv4Addr::new(198, 19, 0, 1),
                    10000 + p,
                    8080,
                )
            })
            .collect();
        let good = spread(&Toeplitz::new(&Key::MICROSOFT), &model, &tuples);
        assert_eq!(good.flows, 4096);
        assert_eq!(good.per_queue.iter().sum::<u64>(), 4096);
        assert!(good.max_over_mean < 1.2, "{good:?}");
        assert!(good.distinct_hashes > 4000);
        let sym = spread(&Toeplitz::new(&Key::symmetric()), &model, &tuples);
        assert!(sym.distinct_hashes <= 1 << 16);
    }
}
