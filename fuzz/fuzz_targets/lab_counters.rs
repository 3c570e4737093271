//! /proc/net/snmp, /proc/net/dev, /proc/net/softnet_stat, /proc/interrupts, sysfs CPU masks and
//! drivers' per-queue statistic names never panic any parser, whatever the text.
#![no_main]
use flowlane_lab::{DevCounters, Snmp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Snmp::parse(text);
    let _ = DevCounters::parse(text);
    let _ = flowlane_lab::counters::parse_softnet(text);
    let _ = flowlane_lab::nic::parse_interrupts(text);
    let _ = flowlane_lab::nic::parse_cpu_mask(text);
    let _ = flowlane_lab::nic::queue_of_irq_name(text);
    // Each line a statistic's name, its length the value.
    let stats: Vec<(String, u64)> = text
        .lines()
        .map(|l| (l.to_string(), l.len() as u64))
        .collect();
    let _ = flowlane_lab::counters::queue_counts(&stats);
});
