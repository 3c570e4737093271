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
