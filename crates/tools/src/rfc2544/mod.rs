//! `flowlane rfc2544`: throughput, latency, frame loss and back-to-back per frame size.

pub mod search;
