//! What arrives with a datagram comes from whoever sent it: the network header a device
//! writes in front of it (from the packet's IP header), the sequence header a publisher
//! stamps, and the endpoint a peer publishes. Their decoders must reject any bytes without
//! panicking; rverbs' own formats must have one canonical encoding per value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::wire::{DatagramEndpoint, NetworkHeader, NetworkKind, SequenceHeader};

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = DatagramEndpoint::decode(data) {
        let bytes = e.encode();
        assert_eq!(DatagramEndpoint::decode(&bytes), Ok(e));
        assert_eq!(bytes[..], data[..]);
        assert!(e.qpn < 0xff_ffff && e.qkey & 0x8000_0000 == 0);
    }
    if let Ok((h, rest)) = SequenceHeader::decode(data) {
        assert_eq!(h.encode()[..], data[..16]);
        assert_eq!(rest, &data[16..]);
    }
    if let Some(b) = data.first_chunk::<40>() {
        if let Ok(h) = NetworkHeader::decode(b) {
            if h.kind == NetworkKind::Ipv4 {
                // IPv4 addresses come out IPv4-mapped, and re-encoding them decodes the same.
                let (s, d) = (h.sgid.ipv4().unwrap(), h.dgid.ipv4().unwrap());
                let again = NetworkHeader::encode_ipv4(s, d, 0, h.hop_limit, h.traffic_class);
                let h2 = NetworkHeader::decode(&again).unwrap();
                assert_eq!((h2.sgid, h2.dgid), (h.sgid, h.dgid));
            }
        }
    }
});
