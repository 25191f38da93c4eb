//! Wire formats: the bytes rverbs exchanges with peers out of band.
//!
//! Every format is fixed-size, versioned and little-endian, and every decoder rejects any
//! malformed byte string with an error, never a panic (the fuzz targets in `fuzz/` hold it
//! to that).

pub mod endpoint;
pub mod node;
pub mod notice;

pub use endpoint::{Endpoint, EndpointError, ENDPOINT_LEN, REMOTE_MEMORY_LEN};
pub use node::{node_blob_len, NodeBlob, NodeBlobError, ADDRESSED_BLOB_LEN, MAX_WORLD};
