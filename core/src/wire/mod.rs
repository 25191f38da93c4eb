//! Wire formats: the bytes rverbs exchanges with peers out of band, and the headers of
//! datagrams.
//!
//! Every format of rverbs' own is fixed-size, versioned and little-endian ([`endpoint`],
//! [`datagram`], [`node`], [`flags`], [`notice`], [`sequence`], [`cm`]); [`grh`] reads the network header
//! devices write in front of a received datagram, in the byte order of IP. Every decoder
//! rejects any malformed byte string with an error, never a panic (the fuzz targets in
//! `fuzz/` hold it to that).

pub mod cm;
pub mod datagram;
pub mod endpoint;
pub mod flags;
pub mod grh;
pub mod node;
pub mod notice;
pub mod sequence;

pub use cm::{ConnectData, ConnectDataError, CONNECT_DATA_LEN};
pub use datagram::{DatagramEndpoint, DATAGRAM_ENDPOINT_LEN};
pub use endpoint::{Endpoint, EndpointError, ENDPOINT_LEN, REMOTE_MEMORY_LEN};
pub use flags::FlagLayout;
pub use grh::{GrhError, NetworkHeader, NetworkKind, GRH_LEN};
pub use node::{node_blob_len, NodeBlob, NodeBlobError, ADDRESSED_BLOB_LEN, MAX_WORLD};
pub use sequence::{SequenceHeader, SequenceHeaderError, SEQUENCE_HEADER_LEN};
