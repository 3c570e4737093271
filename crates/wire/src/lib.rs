//! # flowlane-wire — packets as bytes
//!
//! Layer: pure (no I/O, no clock, no `unsafe`).
//!
//! * [`checksum`]: the Internet checksum (RFC 1071) and its incremental update (RFC 1624), so a
//!   frame built once can have fields patched in place per packet.
//! * [`header`]: the 16-byte flowlane payload header (magic, flow id, sequence number, transmit
//!   timestamp) that lets a receiver count loss, reordering, duplicates and latency.
//! * [`frame`]: Ethernet (+ optional 802.1Q tag) / IPv4 or IPv6 / UDP frame templates, and a
//!   parser that returns a view of such a frame or says exactly what is wrong with it.
//! * [`forward`]: what a forwarder does to a frame in place — reflect (MACs, addresses, ports
//!   swapped, checksums still valid), TTL/hop-limit decrement (RFC 1624) — and why it refuses one.
//! * [`http`]: HTTP/1.x heads read by `httparse` on the caller's buffer, chunked bodies walked,
//!   heads written, what a request asks of flowlane's server, and the body pattern.
//! * [`pcap`]: the Ethernet frames of a pcap or pcapng capture, read from bytes.
//! * [`seq`]: per-flow loss, reordering and duplicate accounting from sequence numbers.

#![forbid(unsafe_code)]

pub mod checksum;
pub mod forward;
pub mod fragment;
pub mod frame;
pub mod header;
pub mod http;
pub mod mac;
pub mod pcap;
pub mod seq;

pub use fragment::FragmentView;
pub use frame::{FrameError, Readdress, Template, TemplateSpec, UdpFrame};
pub use header::{FlowHeader, HeaderError, HEADER_LEN};
pub use mac::Mac;
