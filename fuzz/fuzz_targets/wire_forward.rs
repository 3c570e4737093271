//! The forwarder's frame steps (reflect with every swap, TTL decrement, destination read)
//! never panic on any bytes: a frame they cannot handle is a counted reason.
#![no_main]
use flowlane_wire::forward::{decrement_ttl, fill_checksum, reflect, Swap, L3};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut f = data.to_vec();
    let _ = reflect(&mut f, Swap { ip: true, ports: true });
    let mut g = data.to_vec();
    let _ = reflect(&mut g, Swap::default());
    if let Ok(l3) = L3::parse(data) {
        let mut h = data.to_vec();
        let _ = decrement_ttl(&mut h, &l3);
        let _ = fill_checksum(&mut h, &l3);
        let _ = (l3.dst_v4(data), l3.dst_v6(data));
    }
});
