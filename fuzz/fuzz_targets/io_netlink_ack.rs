//! The netlink reply parsers (the kernel's answer to an XDP attach; a netdev dev-get reply
//! with an interface's XDP features; route and neighbour dump entries) never panic on any bytes, however their lengths lie.
#![no_main]
use flowlane_io::netdev::{neighbour_entry, parse_ack, route_changes, route_of, xdp_features_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_ack(data, 1);
    let _ = xdp_features_of(data);
    let _ = route_of(data);
    let _ = route_changes(data);
    let _ = neighbour_entry(data);
});
