//! The rtnetlink acknowledgement parser (the kernel's answer to an XDP attach) never panics
//! on any bytes, however its lengths lie.
#![no_main]
use flowlane_io::netdev::parse_ack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_ack(data, 1);
});
