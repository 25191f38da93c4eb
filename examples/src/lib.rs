//! Runnable rverbs programs live in `src/bin`.
