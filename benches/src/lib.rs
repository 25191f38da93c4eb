//! Criterion benchmarks for rverbs; the benchmarks themselves live in `benches/`:
//! - `wire`: endpoint encode/decode and node blob decode (world 64);
//! - `engine`: the [`Channel`](rverbs_core::channel::Channel) engine over the in-memory
//!   provider, per operation and per work request.
//!
//! They need no RDMA device and no libibverbs. The engine numbers are the engine's own
//! cost plus the in-memory model's bookkeeping and copies: use them to compare engine
//! changes and posting styles, never as device latencies.
//!
//! ```sh
//! cargo bench -p rverbs-benches
//! ```
