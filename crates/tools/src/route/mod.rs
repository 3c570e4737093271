//! The route role: longest-prefix routing as flowlane does it, in one place. [`tables`] loads
//! the router's tables from the kernel or a file and keeps them following the kernel (what
//! `forward --mode route` and `route lookup` share); [`decide`] is what the router knows and
//! how it decides; [`bench`] measures our FIB against a reference in the same run (`route
//! bench`). The FIB itself is the pure `lpm` crate; the measurement harness stays here, with
//! the role, because `lpm` knows nothing of time.

pub mod bench;
pub mod decide;
pub mod tables;

pub use bench::*;

/// `flowlane route lookup --json`: each address's longest match and next hop.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct LookupReport {
    /// In the order asked.
    pub lookups: Vec<Lookup>,
    /// The numbered next hops of a table read from `ip route` output (`N: what`); empty for a
    /// plain table.
    pub legend: Vec<String>,
}

/// One address looked up.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Lookup {
    /// The address as given.
    pub address: String,
    /// The longest matching prefix (`None`: no route).
    pub prefix: Option<String>,
    /// Its next hop.
    pub next_hop: Option<u32>,
    /// The next hop's name from the legend, where the table has one.
    pub next_hop_name: Option<String>,
}
