//! The netlink reply parsers (the kernel's answer to an XDP attach; a netdev dev-get reply
//! with an interface's XDP features; route and neighbour dump entries; the ethtool family's
//! RSS, channel and ring replies), the ethtool ioctl structures' decoders, the BTF walk that
//! finds a kernel function's id, `rss verify`'s map keys, the netdev family's per-queue
//! statistics replies, the coalescing ioctl's answer and nftables' chain dump entries never
//! panic on any bytes, however
//! their lengths lie.
#![no_main]
use flowlane_io::ethtool::{
    channels_ioctl_of, channels_of, drvinfo_of, rings_ioctl_of, rings_of, rss_of, rxfh_of,
};
use flowlane_io::netdev::{neighbour_entry, parse_ack, route_changes, route_of, xdp_features_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_ack(data, 1);
    let _ = xdp_features_of(data);
    let _ = route_of(data);
    let _ = route_changes(data);
    let _ = neighbour_entry(data);
    let _ = rss_of(data);
    let _ = channels_of(data);
    let _ = rings_of(data);
    let _ = rxfh_of(data);
    let _ = drvinfo_of(data);
    let _ = channels_ioctl_of(data);
    let _ = rings_ioctl_of(data);
    let _ = flowlane_io::ethtool::pause_of(data);
    let _ = flowlane_io::ethtool::pause_ioctl_of(data);
    let _ = flowlane_io::bpf::func_id(data, "bpf_xdp_metadata_rx_hash");
    let _ = flowlane_io::bpf::seen_of(data, 1);
    let _ = flowlane_io::netdev::qstats_of(data);
    let _ = flowlane_io::ethtool::coalesce_of(data);
    let _ = flowlane_io::nft::base_chain_of(data);
});
