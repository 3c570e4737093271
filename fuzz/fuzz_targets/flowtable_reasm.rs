//! The reassembler under any stream of fragments (hostile offsets, lengths, repeats, time
//! jumping): no panic, every fragment accounted once, buffers within the budget, contexts
//! within the table.
#![no_main]

use flowlane_flowtable::reasm::{Fragment, Outcome, ReasmConfig, Reassembler};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cfg = ReasmConfig {
        contexts: 16,
        bytes: 16 * 1024,
        max_fragments: 45,
        timeout_ns: 1_000_000,
        seed: 3,
    };
    let Ok(mut r) = Reassembler::new(&cfg) else {
        return;
    };
    let payload = [0x5au8; 2048];
    let mut now = 0u64;
    // Each 8-byte record: id, offset (16 bits, bytes), more/v6 flags, length (11 bits), time.
    for rec in data.chunks_exact(8) {
        let off = u32::from(u16::from_le_bytes([rec[1], rec[2]]));
        let len = usize::from(u16::from_le_bytes([rec[4], rec[5]]) & 0x7ff);
        now += u64::from(rec[6]) * 50_000;
        let v6 = rec[3] & 2 != 0;
        let f = Fragment {
            src: if v6 { "2001:2::1".parse().unwrap() } else { "198.18.0.1".parse().unwrap() },
            dst: if v6 { "2001:2::2".parse().unwrap() } else { "198.18.1.2".parse().unwrap() },
            proto: rec[7],
            id: u32::from(rec[0] & 7) | if v6 { u32::from(rec[7]) << 24 } else { 0 },
            offset: off,
            more: rec[3] & 1 != 0,
            data: &payload[..len],
        };
        if let Outcome::Complete(d) = r.fragment(&f, now) {
            assert!(!d.data.is_empty() && d.data.len() <= 65_535);
        }
        if rec[3] & 4 != 0 {
            r.expire(now);
        }
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert!(c.held_bytes <= 16 * 1024);
        assert!(c.held_contexts <= 16);
    }
});
