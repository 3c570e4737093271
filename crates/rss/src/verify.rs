//! Whether a NIC hashed and queued each flow as the model says: for every flow seen (its
//! tuple, the receive queue it arrived on, the hash the NIC reported for it), our Toeplitz
//! hash over the NIC's key and hash fields, the queue the NIC's table gives for that hash,
//! and the verdict — agrees, the hash differs, or the hash agrees but the frame came up on
//! another queue (the seed's ixgbe bug: "they were turning up on the wrong receive queue").
//! Pure: the frames' readings come from the caller (an XDP program in `rss verify`).

use crate::queue::QueueModel;
use crate::toeplitz::Toeplitz;
use crate::tuple::{Symmetric, Tuple};

/// One flow as the receiver saw it: every frame of it that carried the same queue and NIC
/// hash (a flow whose frames differ is several of these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The frame's addresses and ports (ports `None`: not TCP or UDP, or a fragment).
    pub tuple: Tuple,
    /// The IP protocol (17 UDP, 6 TCP): NICs choose the hash fields per protocol.
    pub proto: u8,
    /// The receive queue it arrived on.
    pub queue: u32,
    /// The hash the NIC reported (`None`: the driver gave none for it).
    pub nic_hash: Option<u32>,
    /// Frames.
    pub packets: u64,
}

/// How the model hashes: the NIC's key, its table, its input transform, and whether it
/// hashes this flow on the addresses only.
#[allow(missing_debug_implementations)]
pub struct Model<'a> {
    /// Toeplitz over the NIC's key.
    pub hasher: &'a Toeplitz,
    /// Hash → queue.
    pub queue: &'a QueueModel,
    /// The NIC's input transform.
    pub symmetric: Symmetric,
    /// Whether a flow of this tuple's family and protocol is hashed on its addresses only
    /// (UDP on the 2-tuple, as many NICs and FreeBSD do); called with the seen tuple and
    /// protocol.
    pub two_tuple: &'a dyn Fn(&Tuple, u8) -> bool,
}

/// What the comparison found for one flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Our hash is the NIC's, and the frame came up on the queue the table gives for it.
    Agrees,
    /// No NIC hash to compare; the queue agrees with ours.
    QueueAgrees,
    /// The NIC's hash is not ours (a different key, fields, function or transform).
    HashDiffers,
    /// The hashes agree but the frame came up on another queue than the table gives: the
    /// driver queued it wrongly.
    WrongQueue,
    /// No NIC hash, and the queue is not the table's for our hash.
    QueueDiffers,
}

impl Verdict {
    /// Whether this flow disagrees with the model.
    pub fn failed(self) -> bool {
        !matches!(self, Verdict::Agrees | Verdict::QueueAgrees)
    }

    /// Words for a report.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::QueueAgrees => "queue agrees (no NIC hash)",
            Verdict::HashDiffers => "hash differs",
            Verdict::WrongQueue => "wrong queue (hash agrees)",
            Verdict::QueueDiffers => "queue differs (no NIC hash)",
        }
    }
}

/// One flow's comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The flow as seen.
    pub seen: Seen,
    /// The tuple as hashed: the addresses only where the NIC hashes this kind on them.
    pub hashed: Tuple,
    /// Our hash.
    pub our_hash: u32,
    /// The queue the table gives for our hash.
    pub expected_queue: u32,
    /// The verdict.
    pub verdict: Verdict,
}

/// Compares every flow seen with the model.
pub fn check(seen: &[Seen], m: &Model<'_>) -> Vec<Checked> {
    seen.iter()
        .map(|s| {
            let hashed = match s.tuple.ports() {
                Some(_) if (m.two_tuple)(&s.tuple, s.proto) => {
                    Tuple::new(s.tuple.src(), s.tuple.dst(), None).unwrap_or(s.tuple)
                }
                _ => s.tuple,
            };
            let our_hash = m.hasher.hash(&hashed.symmetric(m.symmetric));
            let expected_queue = m.queue.queue(our_hash);
            let queue_ok = expected_queue == s.queue;
            let verdict = match s.nic_hash {
                Some(h) if h != our_hash => Verdict::HashDiffers,
                Some(_) if queue_ok => Verdict::Agrees,
                Some(_) => Verdict::WrongQueue,
                None if queue_ok => Verdict::QueueAgrees,
                None => Verdict::QueueDiffers,
            };
            Checked {
                seen: s.clone(),
                hashed,
                our_hash,
                expected_queue,
                verdict,
            }
        })
        .collect()
}

/// How many flows agreed, per question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Flows.
    pub flows: usize,
    /// Flows with a NIC hash.
    pub with_hash: usize,
    /// Flows whose NIC hash equals ours.
    pub hash_agrees: usize,
    /// Flows on the queue the table gives for our hash.
    pub queue_agrees: usize,
    /// Flows whose hash agrees but whose queue does not (the driver's fault).
    pub wrong_queue: usize,
}

/// The summary of a comparison.
pub fn tally(checked: &[Checked]) -> Tally {
    let mut t = Tally {
        flows: checked.len(),
        ..Tally::default()
    };
    for c in checked {
        if c.seen.nic_hash.is_some() {
            t.with_hash += 1;
        }
        if c.seen.nic_hash == Some(c.our_hash) {
            t.hash_agrees += 1;
        }
        if c.expected_queue == c.seen.queue {
            t.queue_agrees += 1;
        }
        if c.verdict == Verdict::WrongQueue {
            t.wrong_queue += 1;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Key, Reta};
    use std::net::Ipv4Addr;

    fn flow(sport: u16) -> Tuple {
        Tuple::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            sport,
            9000,
        )
    }

    /// Frames a NIC with the Microsoft key and a 4-queue table would give: right, one with a
    /// hash of another key, one on the wrong ring with the right hash, one without a hash.
    #[test]
    fn the_wrong_ring_and_a_wrong_hash_are_told_apart() {
        let h = Toeplitz::new(&Key::MICROSOFT);
        let q = QueueModel::Reta(Reta::round_robin(128, 4).expect("table"));
        let four = |_: &Tuple, _: u8| false;
        let m = Model {
            hasher: &h,
            queue: &q,
            symmetric: Symmetric::Off,
            two_tuple: &four,
        };
        let right = |t: Tuple, n| {
            let hash = h.hash(&t);
            Seen {
                tuple: t,
                proto: 17,
                queue: q.queue(hash),
                nic_hash: Some(hash),
                packets: n,
            }
        };
        let ok = right(flow(1000), 10);
        let mut wrong_ring = right(flow(1001), 5);
        wrong_ring.queue = (wrong_ring.queue + 1) % 4;
        let mut other_key = right(flow(1002), 7);
        other_key.nic_hash = Some(Toeplitz::new(&Key::symmetric()).hash(&flow(1002)));
        let mut no_hash = right(flow(1003), 1);
        no_hash.nic_hash = None;
        let c = check(&[ok, wrong_ring, other_key, no_hash], &m);
        let v: Vec<Verdict> = c.iter().map(|c| c.verdict).collect();
        assert_eq!(
            v,
            vec![
                Verdict::Agrees,
                Verdict::WrongQueue,
                Verdict::HashDiffers,
                Verdict::QueueAgrees
            ]
        );
        let t = tally(&c);
        assert_eq!(
            (
                t.flows,
                t.with_hash,
                t.hash_agrees,
                t.queue_agrees,
                t.wrong_queue
            ),
            (4, 3, 2, 3, 1)
        );
        assert!(c[1].verdict.failed() && !c[3].verdict.failed());
    }

    /// A NIC that hashes UDP on the addresses: the ports do not enter our hash either, so
    /// every port of a pair of addresses gives one hash and one queue.
    #[test]
    fn a_two_tuple_nic_is_checked_on_the_addresses() {
        let h = Toeplitz::new(&Key::MICROSOFT);
        let q = QueueModel::Reta(Reta::round_robin(128, 8).expect("table"));
        let two = |_: &Tuple, _: u8| true;
        let m = Model {
            hasher: &h,
            queue: &q,
            symmetric: Symmetric::Off,
            two_tuple: &two,
        };
        let addrs = Tuple::v4_addrs(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let hash = h.hash(&addrs);
        let seen: Vec<Seen> = (1000..1010)
            .map(|p| Seen {
                tuple: flow(p),
                proto: 17,
                queue: q.queue(hash),
                nic_hash: Some(hash),
                packets: 1,
            })
            .collect();
        let c = check(&seen, &m);
        assert!(c.iter().all(|c| c.verdict == Verdict::Agrees), "{c:?}");
        assert!(c.iter().all(|c| c.hashed.ports().is_none()));
        // The same frames against a 4-tuple model: the hashes differ.
        let four = |_: &Tuple, _: u8| false;
        let m4 = Model {
            two_tuple: &four,
            ..m
        };
        assert!(check(&seen, &m4)
            .iter()
            .all(|c| c.verdict == Verdict::HashDiffers));
    }
}
