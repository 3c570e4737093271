//! What an interface says about itself in sysfs (`/sys/class/net/IF/…`, as the calling
//! process's mount of /sys shows its network namespace): MAC, MTU, speed, counters. Read, never
//! written; a missing interface is `None` or an error naming it, never a panic.

use std::io;

fn read(ifname: &str, file: &str) -> io::Result<String> {
    if ifname.is_empty() || ifname.contains('/') || ifname.starts_with('.') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{ifname}` is not an interface name"),
        ));
    }
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{file}")).map(|s| s.trim().into())
}

/// `aa:bb:cc:dd:ee:ff` (see [`flowlane_wire::Mac`]).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    flowlane_wire::Mac::parse(s).map(|m| m.0)
}

/// The interface's MAC address (`None`: no such interface here).
pub fn mac(ifname: &str) -> Option<[u8; 6]> {
    parse_mac(&read(ifname, "address").ok()?)
}

/// The interface's MTU (`None`: no such interface here).
pub fn mtu(ifname: &str) -> Option<usize> {
    read(ifname, "mtu").ok()?.parse().ok()
}

/// The link speed in Mb/s, where the driver reports one (veth: 10 000; loopback: none).
pub fn speed_mbps(ifname: &str) -> Option<f64> {
    read(ifname, "speed")
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|&s| s > 0.0)
}

/// One of the interface's counters (`statistics/NAME`, e.g. `tx_packets`).
pub fn counter(ifname: &str, name: &str) -> Option<u64> {
    read(ifname, &format!("statistics/{name}"))
        .ok()?
        .parse()
        .ok()
}

/// The interface's receive and transmit queues (`queues/rx-N`, `queues/tx-N`).
pub fn queues(ifname: &str) -> Option<(u32, u32)> {
    read(ifname, "ifindex").ok()?;
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    let (mut rx, mut tx) = (0, 0);
    for e in dir.flatten() {
        let n = e.file_name();
        let n = n.to_string_lossy();
        if n.starts_with("rx-") {
            rx += 1;
        } else if n.starts_with("tx-") {
            tx += 1;
        }
    }
    Some((rx, tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_describes_itself() {
        assert_eq!(mac("lo"), Some([0; 6]));
        assert!(mtu("lo").is_some_and(|m| m >= 1280));
        assert!(counter("lo", "rx_packets").is_some());
        assert_eq!(mtu("fl-no-such-if"), None);
        assert_eq!(mtu("../lo"), None, "no path tricks");
    }

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("02:f1:0e:00:00:0a"),
            Some([2, 0xf1, 0x0e, 0, 0, 0x0a])
        );
        for bad in [
            "02:f1:0e:00:00",
            "02:f1:0e:00:00:0g",
            "02:f1:0e:00:00:",
            "2:f1:0e:00:00:01:02",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
