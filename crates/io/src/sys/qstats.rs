//! The kernel's own per-queue statistics (generic netlink's `netdev` family, `qstats-get`
//! with queue scope, Linux 6.8+), where a driver offers them: one vocabulary for every driver,
//! beside the driver's own statistic names (`ethtool -S`). A driver that does not offer them
//! answers `EOPNOTSUPP` or nothing, which readers report as such.

use super::netlink::{attributes, genl_request, u32_at, Rtnl, GENL_HDRLEN, NLM_F_DUMP};
use super::SysError;

const NETDEV_CMD_QSTATS_GET: u8 = 12;
const A_IFINDEX: u16 = 1;
const A_QUEUE_TYPE: u16 = 2;
const A_QUEUE_ID: u16 = 3;
const A_SCOPE: u16 = 4;
const A_RX_PACKETS: u16 = 8;
const A_RX_BYTES: u16 = 9;
const A_TX_PACKETS: u16 = 10;
const A_RX_ALLOC_FAIL: u16 = 12;
const A_RX_HW_DROPS: u16 = 13;
/// `NETDEV_QSTATS_SCOPE_QUEUE`.
const SCOPE_QUEUE: u32 = 1;

/// One queue's statistics (`None`: the driver does not count that one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// The queue.
    pub queue: u32,
    /// A receive queue (else a transmit queue).
    pub rx: bool,
    /// Packets.
    pub packets: Option<u64>,
    /// Bytes.
    pub bytes: Option<u64>,
    /// Receive: packets the hardware dropped.
    pub hw_drops: Option<u64>,
    /// Receive: buffer allocations that failed.
    pub alloc_fail: Option<u64>,
}

/// A `uint` attribute: 4 or 8 bytes, as the kernel sends it.
fn uint(a: &[u8]) -> Option<u64> {
    match a.len() {
        4 => u32_at(a, 0).map(u64::from),
        8 => Some(u64::from_ne_bytes(a.try_into().ok()?)),
        _ => None,
    }
}

/// One `qstats-get` reply (`None`: not a queue-scoped reply).
pub fn qstats_of(payload: &[u8]) -> Option<QueueStats> {
    let mut q = QueueStats::default();
    let (mut ty, mut id) = (None, None);
    for (kind, a) in attributes(payload.get(GENL_HDRLEN..)?) {
        match kind {
            A_QUEUE_TYPE => ty = u32_at(a, 0),
            A_QUEUE_ID => id = u32_at(a, 0),
            A_RX_PACKETS | A_TX_PACKETS => q.packets = uint(a),
            A_RX_BYTES => q.bytes = uint(a),
            A_RX_HW_DROPS => q.hw_drops = uint(a),
            A_RX_ALLOC_FAIL => q.alloc_fail = uint(a),
            _ => {}
        }
    }
    q.queue = id?;
    q.rx = ty? == 0;
    Some(q)
}

/// Interface `ifindex`'s per-queue statistics; `None` where the kernel has no such message
/// or the driver offers none (`EOPNOTSUPP`, or an empty answer).
pub fn queue_stats(ifindex: u32) -> Result<Option<Vec<QueueStats>>, SysError> {
    let nl = Rtnl::open_protocol(libc::NETLINK_GENERIC, "netlink genl netdev qstats-get")?;
    let family = super::netlink::genl_family(&nl, b"netdev\0")?;
    let Some(family) = family else {
        return Ok(None);
    };
    let (idx, scope) = (ifindex.to_ne_bytes(), SCOPE_QUEUE.to_ne_bytes());
    let mut req = genl_request(
        family,
        NETDEV_CMD_QSTATS_GET,
        2,
        &[(A_IFINDEX, &idx), (A_SCOPE, &scope)],
    );
    let flags = u16::from_ne_bytes([req[6], req[7]]) | NLM_F_DUMP;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    match nl.collect(&req, 2, family, true, 1 << 16) {
        Ok(r) => {
            let v: Vec<QueueStats> = r.iter().filter_map(|p| qstats_of(p)).collect();
            Ok((!v.is_empty()).then_some(v))
        }
        Err(e)
            if matches!(
                e.source.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::netlink::push_attr;

    #[test]
    fn queue_replies_read_with_four_and_eight_byte_counts() {
        let mut p = vec![NETDEV_CMD_QSTATS_GET, 1, 0, 0];
        push_attr(&mut p, A_IFINDEX, &7u32.to_ne_bytes());
        push_attr(&mut p, A_QUEUE_TYPE, &0u32.to_ne_bytes());
        push_attr(&mut p, A_QUEUE_ID, &3u32.to_ne_bytes());
        push_attr(&mut p, A_RX_PACKETS, &5_000_000_000u64.to_ne_bytes());
        push_attr(&mut p, A_RX_HW_DROPS, &12u32.to_ne_bytes());
        let q = qstats_of(&p).expect("reads");
        assert_eq!(
            q,
            QueueStats {
                queue: 3,
                rx: true,
                packets: Some(5_000_000_000),
                bytes: None,
                hw_drops: Some(12),
                alloc_fail: None,
            }
        );
        // A transmit queue; a reply without a queue id is not a queue's.
        let mut t = vec![NETDEV_CMD_QSTATS_GET, 1, 0, 0];
        push_attr(&mut t, A_QUEUE_TYPE, &1u32.to_ne_bytes());
        push_attr(&mut t, A_QUEUE_ID, &0u32.to_ne_bytes());
        push_attr(&mut t, A_TX_PACKETS, &9u32.to_ne_bytes());
        let q = qstats_of(&t).expect("reads");
        assert_eq!((q.rx, q.packets), (false, Some(9)));
        let mut none = vec![NETDEV_CMD_QSTATS_GET, 1, 0, 0];
        push_attr(&mut none, A_RX_PACKETS, &1u32.to_ne_bytes());
        assert_eq!(qstats_of(&none), None);
        // A count of an odd width is not read.
        let mut odd = vec![NETDEV_CMD_QSTATS_GET, 1, 0, 0];
        push_attr(&mut odd, A_QUEUE_TYPE, &0u32.to_ne_bytes());
        push_attr(&mut odd, A_QUEUE_ID, &0u32.to_ne_bytes());
        push_attr(&mut odd, A_RX_PACKETS, &[1, 2, 3]);
        assert_eq!(qstats_of(&odd).expect("reads").packets, None);
    }

    #[test]
    fn this_kernel_answers_for_loopback() {
        // lo offers no per-queue statistics: an answer of none, not an error.
        let r = queue_stats(1).expect("the request is understood");
        assert!(r.is_none(), "{r:?}");
    }
}
