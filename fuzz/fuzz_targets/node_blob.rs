//! A node blob is what every other rank publishes during bootstrap (its endpoints, flag
//! array and window): the decoder must reject any bytes without panicking, and an accepted
//! blob must re-encode to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::wire::node::{node_blob_len, NodeBlob};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = NodeBlob::decode(data) {
        let mut out = vec![0u8; node_blob_len(b.world)];
        let encoded = NodeBlob::encode_into(
            &mut out,
            b.rank,
            b.world,
            |r| b.endpoint_for(r).expect("decode validated every peer slot"),
            b.flags,
            b.window,
        );
        assert!(encoded.is_ok());
        assert_eq!(out[..], data[..]);
    }
});
