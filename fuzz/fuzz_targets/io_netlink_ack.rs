//! The netlink reply parsers (the kernel's answer to an XDP attach; a netdev dev-get reply
//! with an interface's XDP features) never panic on any bytes, however their lengths lie.
#![no_main]
use flowlane_io::netdev::{parse_ack, xdp_features_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_ack(data, 1);
    let _ = xdp_features_of(data);
});
