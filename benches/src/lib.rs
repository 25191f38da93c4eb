//! Criterion benchmarks for rverbs; the benchmarks themselves live in `benches/`:
//! - `wire`: endpoint encode/decode and node blob decode (world 64);
//! - `engine`: the [`Channel`](rverbs_core::channel::Channel) engine over the in-memory
//!   provider, per operation and per work request;
//! - `library` (feature `instant`): rverbs beside hand-written raw verbs on the instant
//!   device, timed by criterion;
//! - `cost` (feature `instant`): the same comparison in instructions per operation, counted
//!   by callgrind: run it through `tools/cost` (docs/benchmarks.md).
//!
//! They need no RDMA device (`library` and `cost` link libibverbs, the others do not). The
//! engine numbers are the engine's own cost plus the in-memory model's bookkeeping and
//! copies: use them to compare engine changes and posting styles, never as device
//! latencies.
//!
//! ```sh
//! cargo bench -p rverbs-benches
//! ```
