//! `http`: an HTTP/1.1 server ([`serve`]) and load generator ([`load`]) that scale per core —
//! one pinned worker per CPU with its own socket(s) and event loop, no accept or dispatch
//! thread, heads parsed in place by `httparse`.

pub mod config;
pub mod load;
pub mod load_worker;
pub mod place;
pub mod serve;
pub mod serve_worker;

pub use config::{split_url, HttpLoadConfig, PoolConfig, UrlConfig};
pub use load::{HttpLoadCounts, HttpLoadEvent, HttpLoadReport, LatencyUs};
pub use serve::{HttpServeConfig, HttpServeEvent, HttpServeReport};
