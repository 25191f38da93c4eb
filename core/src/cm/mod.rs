//! The RDMA connection manager (librdmacm, feature `rdmacm`): RC connections by address
//! and port, and multicast groups joined through `rdma_join_multicast`.
pub mod connect;
mod error;
mod event;
pub(crate) mod ffi;
mod id;
pub mod multicast;

pub use connect::{connect, CmConfig, Connection, Listener};
pub use error::{CmCall, CmError, CmEvent, CmStep, DeviceName};
pub use multicast::CmJoin;
