//! Endpoint and remote-memory descriptors arrive from peers during the bootstrap
//! exchange, so their decoders must reject any bytes without panicking, and every
//! accepted encoding must be the one canonical form of the value it decodes to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::Endpoint;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Endpoint::decode(data) {
        let bytes = e.encode();
        assert_eq!(Endpoint::decode(&bytes), Ok(e));
        // Byte-exact: the decoder accepts no second spelling of the same endpoint.
        assert_eq!(bytes[..], data[..]);
    }
    if let Ok(r) = RemoteMemory::decode(data) {
        let bytes = r.encode();
        assert_eq!(RemoteMemory::decode(&bytes), Ok(r));
        assert_eq!(bytes[..], data[..]);
    }
});
