//! A node blob is what every other rank publishes during bootstrap (its endpoints, flag
//! array and window), whole or cut down to what one addressee needs: the decoder must
//! reject any bytes without panicking, an accepted blob of either form must re-encode to
//! exactly the same bytes, and the addressed form cut out of an accepted full blob must
//! decode to the same endpoint and descriptors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::wire::node::{node_blob_len, NodeBlob};

fuzz_target!(|data: &[u8]| {
    let Ok(b) = NodeBlob::decode(data) else {
        // Cutting only reads the header, one slot and the descriptors; it must stay total
        // on bytes the full decoder refuses.
        if let Some(&to) = data.first() {
            if let Ok(a) = NodeBlob::cut_for(data, u32::from(to)) {
                assert!(NodeBlob::decode(&a).is_ok());
            }
        }
        return;
    };
    if let Some(to) = b.addressee() {
        let endpoint = b
            .endpoint_for(to)
            .expect("decode validated the addressee's slot");
        let encoded = NodeBlob::encode_addressed(b.rank, b.world, to, endpoint, b.flags, b.window)
            .expect("a decoded addressed blob re-encodes");
        assert_eq!(encoded[..], data[..]);
        return;
    }
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
    for to in (0..b.world).filter(|&r| r != b.rank) {
        let a = NodeBlob::cut_for(data, to).expect("a valid full blob cuts for every peer");
        let d = NodeBlob::decode(&a).expect("a cut blob decodes");
        assert_eq!(
            (d.rank, d.world, d.addressee()),
            (b.rank, b.world, Some(to))
        );
        assert_eq!((d.flags, d.window), (b.flags, b.window));
        assert_eq!(d.endpoint_for(to), b.endpoint_for(to));
        assert_eq!(d.endpoint_for(b.rank), None);
    }
});
