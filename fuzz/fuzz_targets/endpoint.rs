//! Endpoint and remote-memory descriptors arrive from peers during the bootstrap
//! exchange, rdmacm connect data in a connection request or reply, and failure notices are written into our flag array by peers, so their
//! decoders must reject any bytes without panicking, and every accepted encoding must be
//! the one canonical form of the value it decodes to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::{notice, ConnectData, Endpoint, CONNECT_DATA_LEN};

fuzz_target!(|data: &[u8]| {
    rverbs_fuzz::canonical!(Endpoint, data);
    rverbs_fuzz::canonical!(RemoteMemory, data);
    // The one spelling, then the zero padding the connection manager adds.
    if rverbs_fuzz::canonical!(ConnectData, data, ..CONNECT_DATA_LEN).is_some() {
        assert!(data[CONNECT_DATA_LEN..].iter().all(|&b| b == 0));
    }
    if let Ok(word) = <[u8; 8]>::try_from(data) {
        let word = u64::from_le_bytes(word);
        if let Some((failure, life)) = notice::decode(word) {
            assert_eq!(notice::encode(&failure, life), Some(word));
        }
    }
});
