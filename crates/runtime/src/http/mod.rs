//! HTTP/1.1 over TCP, per core: the server's worker ([`server`]) and the load generator's
//! ([`client`]). Both run one epoll set per pinned worker and parse heads in place with
//! `httparse` (through `flowlane_wire::http`).

pub mod client;
pub mod server;
