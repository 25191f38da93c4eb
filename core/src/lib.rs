#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]
//! rverbs-core: an RDMA verbs engine for one busy-polling thread per node.
//!
//! `#![no_std]`, and no heap use on the data path once connected.
//!
//! # The posting contract
//!
//! Every `unsafe` posting function in rverbs has the same contract, stated here once:
//! **every buffer named by a work request stays valid, and is not accessed by the CPU in a way
//! that conflicts with the device (no writes to a buffer the device reads, no access at all to
//! one it writes), until that request's completion has been polled** (or the completion of a
//! later signaled request on the same send queue, which implies it). Dropping or reusing a
//! buffer earlier is undefined behaviour: the device reads or writes it by DMA regardless of
//! what Rust believes.
//!
//! The blocking and scoped APIs uphold it for you with borrows.

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod channel;
pub mod completion;
pub mod params;
pub mod poll;
pub mod provider;
pub mod sge;
#[cfg(feature = "verbs")]
pub mod verbs;
pub mod wire;
pub mod wr;
