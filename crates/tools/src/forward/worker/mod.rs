//! The forwarder's user-space workers, in the engine's budgeted poll loop: the reflector
//! ([`reflect`]), the router ([`route`]) and the bridge ([`bridge`]), each over AF_PACKET rings
//! or an AF_XDP socket group, with what the multi-port ones share ([`ports`]).

pub mod bridge;
pub mod cache;
pub mod ports;
pub mod reflect;
pub mod route;
