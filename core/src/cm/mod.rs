//! rdmacm.
pub(crate) mod ffi;
