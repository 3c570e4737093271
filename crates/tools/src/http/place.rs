//! `http load`'s connections placed on the receiving interface's RSS queues: each connection
//! is given the source tuples (address, or address and port) that the picker found to land on
//! its queue, as `blast --per-queue` places UDP flows.
//!
//! Connection `i` of a pool goes to queue `queues[i % n]`. A NIC that hashes TCP on the
//! 4-tuple is met with chosen source ports: each connection owns a handful of ports of its
//! queue (a stride through the picker's answer), so that when it reconnects while an earlier
//! 4-tuple of it lingers in TIME_WAIT it takes the next one instead of waiting. A NIC that
//! hashes on the addresses only (the 2-tuple) is met with chosen source addresses and
//! kernel-chosen ports: the ports are not pretended to matter.

use std::net::{IpAddr, SocketAddr};

use flowlane_rss::pick::{addr_to_u128, pick, PickSpec};
use flowlane_rss::{Key, Toeplitz};
use serde::{Deserialize, Serialize};

use crate::blast::Placement;
use crate::ToolError;

/// Source tuples one connection keeps for reconnecting (4-tuple hashing): enough that a
/// connection reconnecting every few milliseconds rarely meets its own TIME_WAIT.
pub const CANDIDATES: usize = 32;

/// Where a pool's connections were placed (in its report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PoolPlacement {
    /// `4-tuple` (source ports chosen) or `2-tuple` (source addresses chosen).
    pub by: String,
    /// The queues filled, in order (connection `i` on `queues[i % len]`).
    pub queues: Vec<u32>,
    /// Connections per queue.
    pub per_queue: u64,
    /// Distinct source addresses used.
    pub addresses: usize,
    /// Source tuples the connection with the fewest holds (each lands on its queue).
    pub least_candidates: usize,
}

/// Each connection's source tuples (port 0: the kernel's choice), and the summary.
#[derive(Debug, Clone)]
pub struct Placed {
    /// Indexed by connection in the pool.
    pub per_conn: Vec<Vec<SocketAddr>>,
    /// Each connection's queue.
    pub queue_of: Vec<u32>,
    /// For the report.
    pub summary: PoolPlacement,
}

/// Places `connections` on the queues of `p` towards `target`. `sources` are contiguous
/// candidate addresses (the pool's source prefix; one address when the kernel would choose
/// it), `ports` the local port range for chosen ports.
pub fn place(
    p: &Placement,
    target: SocketAddr,
    sources: &[IpAddr],
    ports: (u16, u16),
    connections: usize,
) -> Result<Placed, ToolError> {
    let model = p.model.build()?;
    let key = Key::parse(&p.key).map_err(|e| ToolError::usage(e.to_string()))?;
    let hasher = Toeplitz::new(&key);
    let (first, last) = match (sources.first(), sources.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => return Err(ToolError::usage("placement needs a source address")),
    };
    if addr_to_u128(last) < addr_to_u128(first)
        || addr_to_u128(last) - addr_to_u128(first) + 1 != sources.len() as u128
    {
        return Err(ToolError::usage(
            "placement needs contiguous source addresses (a prefix)",
        ));
    }
    let queues: Vec<u32> = if p.queues.is_empty() {
        (0..model.queues()).collect()
    } else {
        p.queues.clone()
    };
    let n = queues.len().max(1);
    if connections as u64 != p.per_queue * n as u64 {
        return Err(ToolError::usage(format!(
            "{connections} connections cannot fill {n} queues with {} each: give {} \
             connections",
            p.per_queue,
            p.per_queue * n as u64
        )));
    }
    let spec = |addrs: (IpAddr, IpAddr), per_queue: u64| PickSpec {
        src_addrs: addrs,
        dst: target.ip(),
        src_ports: ports,
        dst_port: target.port(),
        hash_ports: p.hash_ports,
        queues: queues.clone(),
        per_queue: Some(per_queue),
        symmetric: p.symmetric,
        // A source prefix never offers the server's own address; one source address (the
        // route's, which on one host may be the server's) is used as it is.
        exclude: if p.hash_ports {
            Vec::new()
        } else {
            vec![target.ip()]
        },
    };
    let fail = |e: flowlane_rss::pick::PickError| ToolError::usage(e.to_string());
    // Per queue (in `queues` order), the tuples found.
    let mut found: Vec<Vec<SocketAddr>> = vec![Vec::new(); n];
    if p.hash_ports {
        // Address by address until every queue has enough ports for its connections.
        let want = p.per_queue.saturating_mul(CANDIDATES as u64);
        for &a in sources {
            let short: u64 = found
                .iter()
                .map(|f| want.saturating_sub(f.len() as u64))
                .max()
                .unwrap_or(0);
            if short == 0 {
                break;
            }
            let r = pick(&hasher, &model, &spec((a, a), short)).map_err(fail)?;
            for (f, q) in found.iter_mut().zip(&r.queues) {
                let room = want.saturating_sub(f.len() as u64) as usize;
                f.extend(q.tuples.iter().take(room).filter_map(|t| {
                    let (sport, _) = t.tuple.ports()?;
                    Some(SocketAddr::new(t.tuple.src(), sport))
                }));
            }
        }
    } else {
        // One address per connection where the prefix has enough of them (as the seed's
        // clients each had their own), else shared in turn.
        let r = pick(&hasher, &model, &spec((first, last), p.per_queue)).map_err(fail)?;
        for (f, q) in found.iter_mut().zip(&r.queues) {
            f.extend(q.tuples.iter().map(|t| SocketAddr::new(t.tuple.src(), 0)));
        }
    }
    if let Some((q, f)) = queues
        .iter()
        .zip(&found)
        .find(|(_, f)| (f.len() as u64) < if p.hash_ports { p.per_queue } else { 1 })
    {
        let what = if p.hash_ports {
            "source ports"
        } else {
            "source addresses"
        };
        return Err(ToolError::usage(format!(
            "queue {q} is reached by only {} of the {what} available ({} connections need \
             {}); give more source addresses (--source PREFIX --source-count N)",
            f.len(),
            p.per_queue,
            if p.hash_ports { p.per_queue } else { 1 }
        )));
    }
    let k = p.per_queue as usize;
    let mut per_conn = Vec::with_capacity(connections);
    let mut queue_of = Vec::with_capacity(connections);
    for i in 0..connections {
        let (qi, j) = (i % n, i / n);
        let f = &found[qi];
        let mine: Vec<SocketAddr> = if p.hash_ports {
            // A stride: connection j of the queue holds tuples j, j + k, j + 2k, …
            f.iter().skip(j).step_by(k.max(1)).copied().collect()
        } else {
            vec![f[j % f.len()]]
        };
        per_conn.push(mine);
        queue_of.push(queues[qi]);
    }
    let mut addrs: Vec<IpAddr> = per_conn.iter().flatten().map(|s| s.ip()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    let summary = PoolPlacement {
        by: if p.hash_ports { "4-tuple" } else { "2-tuple" }.into(),
        queues,
        per_queue: p.per_queue,
        addresses: addrs.len(),
        least_candidates: per_conn.iter().map(Vec::len).min().unwrap_or(0),
    };
    Ok(Placed {
        per_conn,
        queue_of,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blast::ModelSpec;
    use flowlane_rss::{Symmetric, Tuple};

    fn placement(queues: &[u32], per_queue: u64, hash_ports: bool) -> Placement {
        Placement {
            per_queue,
            queues: queues.to_vec(),
            key: Key::MICROSOFT.to_hex(),
            symmetric: Symmetric::Off,
            model: ModelSpec::Reta((0..128).map(|i| (i % 4) as u16).collect()),
            hash_ports,
        }
    }

    fn queue_of(t: SocketAddr, target: SocketAddr, hash_ports: bool) -> u32 {
        let ports = hash_ports.then_some((t.port(), target.port()));
        let tuple = Tuple::new(t.ip(), target.ip(), ports).expect("one family");
        let h = Toeplitz::new(&Key::MICROSOFT).hash(&tuple);
        // The table is 0 1 2 3 repeated, indexed by the hash's low 7 bits.
        (h & 127) % 4
    }

    fn range(first: [u8; 4], n: u32) -> Vec<IpAddr> {
        let f = u32::from_be_bytes(first);
        (0..n)
            .map(|i| IpAddr::from((f + i).to_be_bytes()))
            .collect()
    }

    #[test]
    fn every_tuple_of_every_connection_lands_on_its_queue() {
        let target: SocketAddr = "198.18.0.1:8080".parse().expect("addr");
        for hash_ports in [true, false] {
            let p = placement(&[1, 3], 3, hash_ports);
            let sources = range([198, 18, 1, 1], 200);
            let r = place(&p, target, &sources, (32768, 60999), 6).expect("placed");
            assert_eq!(r.queue_of, vec![1, 3, 1, 3, 1, 3]);
            for (c, q) in r.per_conn.iter().zip(&r.queue_of) {
                assert!(!c.is_empty());
                for t in c {
                    assert_eq!(queue_of(*t, target, hash_ports), *q, "{t}");
                    if hash_ports {
                        assert!((32768..=60999).contains(&t.port()), "{t}");
                    } else {
                        assert_eq!(t.port(), 0, "the kernel chooses the port");
                    }
                }
            }
            // No tuple is given to two connections.
            let mut all: Vec<SocketAddr> = r.per_conn.iter().flatten().copied().collect();
            let len = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), len);
            if hash_ports {
                assert_eq!(r.summary.least_candidates, CANDIDATES);
                assert_eq!(r.summary.by, "4-tuple");
                // One address gives 28 232 ports: enough for 6 × 32.
                assert_eq!(r.summary.addresses, 1);
            } else {
                assert_eq!(r.summary.by, "2-tuple");
                assert_eq!(r.summary.addresses, 6, "one address per connection");
            }
        }
    }

    #[test]
    fn too_few_sources_or_a_wrong_count_is_said() {
        let target: SocketAddr = "198.18.0.1:8080".parse().expect("addr");
        // Two addresses cannot reach four queues on the 2-tuple (at most two of them).
        let p = placement(&[], 1, false);
        let e = place(&p, target, &range([198, 18, 1, 1], 2), (1024, 65535), 4)
            .expect_err("too few")
            .to_string();
        assert!(e.contains("source addresses"), "{e}");
        let p = placement(&[], 2, true);
        let e = place(&p, target, &range([198, 18, 1, 1], 1), (1024, 65535), 7)
            .expect_err("7 is not 2 × 4")
            .to_string();
        assert!(e.contains("give 8 connections"), "{e}");
        // A port range of one port reaches one queue at most.
        let e = place(&p, target, &range([198, 18, 1, 1], 1), (40000, 40000), 8)
            .expect_err("one port")
            .to_string();
        assert!(e.contains("source ports"), "{e}");
    }
}
