//! /proc/net/snmp, /proc/net/dev and /proc/net/softnet_stat parsers never panic on any text.
#![no_main]
use flowlane_lab::{DevCounters, Snmp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Snmp::parse(text);
    let _ = DevCounters::parse(text);
    let _ = flowlane_lab::counters::parse_softnet(text);
});
