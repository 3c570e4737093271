//! Which flows a run sends: counted up (or drawn at random) through the source ranges, or
//! placed on RSS queues by the picker.

use std::net::{IpAddr, SocketAddr, UdpSocket};

use super::sender::Flow;
use flowlane_rss::pick::{addr_to_u128, pick, PickSpec};
use flowlane_rss::{Key, Toeplitz};
use rand::SeedableRng;

use super::BlastConfig;
use crate::ToolError;

/// The source address the kernel would use towards `dst`.
pub fn route_source(dst: SocketAddr) -> Result<IpAddr, ToolError> {
    let any = SocketAddr::new(
        if dst.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u16; 8])
        },
        0,
    );
    let s = UdpSocket::bind(any).map_err(|e| ToolError::runtime(format!("socket: {e}")))?;
    s.connect(dst)
        .and_then(|()| s.local_addr())
        .map(|a| a.ip())
        .map_err(|e| ToolError::usage(format!("no route to {dst}: {e}")))
}

/// Flows with their RSS queue (when placed).
pub fn make_flows(a: &BlastConfig) -> Result<Vec<(Flow, Option<u32>)>, ToolError> {
    let dst = a.dest()?;
    let (lo, hi) = match a.from {
        Some(r) => r,
        None => {
            let s = route_source(dst)?;
            (s, s)
        }
    };
    if lo.is_ipv4() != dst.is_ipv4() || hi.is_ipv4() != dst.is_ipv4() {
        return Err(ToolError::usage(
            "the source and destination are different address families",
        ));
    }
    if addr_to_u128(lo) > addr_to_u128(hi) {
        return Err(ToolError::usage("the source address range runs backwards"));
    }
    if let Some(p) = &a.placement {
        return placed(a, p, (lo, hi));
    }
    let naddr = span(lo, hi);
    let (plo, phi) = a.sport.unwrap_or((0, 0));
    if plo > phi {
        return Err(ToolError::usage("the source port range runs backwards"));
    }
    let nport = (phi - plo) as u64 + 1;
    let n = a.flows as u64;
    if n == 0 || n > 65_536 {
        return Err(ToolError::usage("1 to 65536 flows"));
    }
    let space = naddr.saturating_mul(nport);
    if a.sport.is_some() && n > space {
        return Err(ToolError::usage(format!(
            "{n} flows need {n} distinct (address, port) sources; the ranges give {space}"
        )));
    }
    // Source i of the ranges: address i / nport, port i % nport.
    let order: Vec<u64> = if a.random {
        if n > space {
            return Err(ToolError::usage(format!(
                "random sources: {n} distinct ones asked, the ranges give {space}: widen the \
                 address or port range"
            )));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
        let space = usize::try_from(space).unwrap_or(usize::MAX);
        rand::seq::index::sample(&mut rng, space, n as usize)
            .into_iter()
            .map(|i| i as u64)
            .collect()
    } else {
        (0..n).collect()
    };
    let base = addr_to_u128(lo);
    Ok(order
        .into_iter()
        .enumerate()
        .map(|(id, i)| {
            let port = if a.sport.is_some() {
                plo + (i % nport) as u16
            } else {
                0
            };
            let v = base + ((i / nport) % naddr) as u128;
            let src = match lo {
                IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(v as u32)),
                IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(v)),
            };
            (
                Flow {
                    id: id as u16,
                    src: SocketAddr::new(src, port),
                    dst,
                },
                None,
            )
        })
        .collect())
}

/// `per_queue` flows for each queue, found by the picker (exact, no trial), interleaved over
/// the queues.
fn placed(
    a: &BlastConfig,
    p: &super::Placement,
    (lo, hi): (IpAddr, IpAddr),
) -> Result<Vec<(Flow, Option<u32>)>, ToolError> {
    let dst = a.dest()?;
    let model = p.model.build()?;
    let key = Key::parse(&p.key).map_err(|e| ToolError::usage(e.to_string()))?;
    let spec = PickSpec {
        src_addrs: (lo, hi),
        dst: dst.ip(),
        src_ports: a.sport.unwrap_or((1024, 65535)),
        dst_port: dst.port(),
        hash_ports: p.hash_ports,
        queues: p.queues.clone(),
        per_queue: Some(p.per_queue),
        symmetric: p.symmetric,
        exclude: Vec::new(),
    };
    let r =
        pick(&Toeplitz::new(&key), &model, &spec).map_err(|e| ToolError::usage(e.to_string()))?;
    if let Some(q) = r
        .queues
        .iter()
        .find(|q| (q.tuples.len() as u64) < p.per_queue)
    {
        return Err(ToolError::usage(format!(
            "queue {} is reached by only {} flows in the source range; widen the source \
             addresses or ports",
            q.queue,
            q.tuples.len()
        )));
    }
    // Interleaved (queue 0's first flow, queue 1's first, …, queue 0's second, …), so that
    // each sending thread's contiguous share of the flows covers every queue: which CPU sends
    // a flow says nothing about where it should be received.
    let interleaved = (0..p.per_queue as usize).flat_map(|i| {
        r.queues
            .iter()
            .filter_map(move |q| q.tuples.get(i).map(|t| (q.queue, t)))
    });
    let mut flows = Vec::new();
    for (queue, t) in interleaved {
        // Hashed on the addresses only, the port is free: the range's first, or the
        // kernel's choice.
        let sport = match t.tuple.ports() {
            Some((p, _)) => p,
            None => a.sport.map_or(0, |r| r.0),
        };
        let id = u16::try_from(flows.len()).map_err(|_| ToolError::usage("at most 65536 flows"))?;
        let src = SocketAddr::new(t.tuple.src(), sport);
        flows.push((Flow { id, src, dst }, Some(queue)));
    }
    Ok(flows)
}

/// Addresses in an inclusive range (capped at u64).
fn span(lo: IpAddr, hi: IpAddr) -> u64 {
    let d = addr_to_u128(hi) - addr_to_u128(lo);
    u64::try_from(d).map_or(u64::MAX, |d| d.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blast::{ModelSpec, Placement};

    fn cfg() -> BlastConfig {
        let mut c = BlastConfig::new("198.18.0.2:9000".parse().expect("addr"), 0);
        c.from = Some((
            "198.18.0.1".parse().expect("addr"),
            "198.18.0.4".parse().expect("addr"),
        ));
        c
    }

    #[test]
    fn counted_sources_walk_ports_then_addresses() {
        let mut c = cfg();
        c.sport = Some((1000, 1001));
        c.flows = 5;
        let f = make_flows(&c).expect("flows");
        let srcs: Vec<String> = f.iter().map(|(f, _)| f.src.to_string()).collect();
        assert_eq!(
            srcs,
            [
                "198.18.0.1:1000",
                "198.18.0.1:1001",
                "198.18.0.2:1000",
                "198.18.0.2:1001",
                "198.18.0.3:1000"
            ]
        );
        c.flows = 9;
        assert!(make_flows(&c).is_err(), "8 sources for 9 flows");
    }

    /// A receiver that hashes addresses only: every flow from an address of its own, placed
    /// by the 2-tuple hash; the port is the range's first.
    #[test]
    fn two_tuple_placement_gives_each_flow_its_own_address() {
        let mut c = cfg();
        c.from = Some((
            "198.18.0.100".parse().expect("addr"),
            "198.18.0.254".parse().expect("addr"),
        ));
        c.sport = Some((5000, 5000));
        c.placement = Some(Placement {
            per_queue: 2,
            queues: Vec::new(),
            key: Key::MICROSOFT.to_hex(),
            symmetric: Default::default(),
            model: ModelSpec::Modulo(4),
            hash_ports: false,
        });
        let f = make_flows(&c).expect("flows");
        assert_eq!(f.len(), 8);
        let h = Toeplitz::new(&Key::MICROSOFT);
        let mut addrs: Vec<IpAddr> = f.iter().map(|(f, _)| f.src.ip()).collect();
        for (flow, q) in &f {
            assert_eq!(flow.src.port(), 5000);
            let t = flowlane_rss::Tuple::new(flow.src.ip(), flow.dst.ip(), None).expect("tuple");
            assert_eq!(Some(h.hash(&t) % 4), *q);
        }
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), 8, "one address per flow");
    }

    #[test]
    fn placed_flows_hash_to_their_queue_interleaved() {
        let mut c = cfg();
        c.placement = Some(Placement {
            per_queue: 2,
            queues: Vec::new(),
            key: Key::MICROSOFT.to_hex(),
            symmetric: Default::default(),
            model: ModelSpec::Modulo(4),
            hash_ports: true,
        });
        let f = make_flows(&c).expect("flows");
        assert_eq!(f.len(), 8);
        let h = Toeplitz::new(&Key::MICROSOFT);
        for (i, (flow, q)) in f.iter().enumerate() {
            assert_eq!(*q, Some(i as u32 % 4), "interleaved");
            let t = flowlane_rss::Tuple::from_socket_addrs(flow.src, flow.dst).expect("tuple");
            assert_eq!(h.hash(&t) % 4, i as u32 % 4);
        }
    }
}
