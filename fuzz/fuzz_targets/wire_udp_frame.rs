//! Received frames never panic the parser; a parsed frame's payload lies inside it, and a
//! payload header either decodes or is refused; checksum verification never panics.
#![no_main]
use flowlane_wire::{FlowHeader, FragmentView, UdpFrame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = UdpFrame::parse(data) {
        assert!(f.payload.len() + 42 <= data.len());
        let _ = FlowHeader::read(f.payload);
        // The sink verifies checksums of whatever arrives.
        let _ = f.checksum_ok(data);
    }
    let _ = FlowHeader::read(data);
    // Fragments for the reassembler: their piece lies inside the frame.
    if let Ok(f) = FragmentView::parse(data) {
        assert!(f.data.len() + 34 <= data.len());
        assert!(f.more || f.offset > 0);
    }
});
