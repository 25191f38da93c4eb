//! What arrives with a datagram comes from whoever sent it: the network header a device
//! writes in front of it (from the packet's IP header), the sequence header a publisher
//! stamps, and the endpoint a peer publishes. Their decoders must reject any bytes without
//! panicking; rverbs' own formats must have one canonical encoding per value. A
//! `SequenceTracker` fed any sequence of headers (and the last sequence number a peer
//! announces) must not panic and must count every datagram of its stream exactly once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_core::datagram::SequenceTracker;
use rverbs_core::wire::{DatagramEndpoint, NetworkHeader, NetworkKind, SequenceHeader};

fuzz_target!(|data: &[u8]| {
    if let Some(e) = rverbs_fuzz::canonical!(DatagramEndpoint, data) {
        assert!(e.qpn < 0xff_ffff && e.qkey & 0x8000_0000 == 0);
    }
    if let Ok((h, rest)) = SequenceHeader::decode(data) {
        assert_eq!(h.encode()[..], data[..16]);
        assert_eq!(rest, &data[16..]);
    }
    // The bytes as 9-byte records (stream 0 or 1, sequence number), near one another
    // (small steps from the last one) or anywhere, as a sender, a stranger or garbage would
    // give them.
    let mut t = SequenceTracker::for_stream(0);
    let (mut last, mut mine, mut theirs) = (0u64, 0u64, 0u64);
    for r in data.chunks_exact(9) {
        let raw = u64::from_le_bytes(r[1..9].try_into().unwrap());
        let sequence = if r[0] & 2 == 0 {
            last.wrapping_add(raw % 7).wrapping_sub(2)
        } else {
            raw
        };
        last = sequence;
        let stream = u32::from(r[0] & 1);
        let h = SequenceHeader { stream, sequence }.encode();
        let (got, _) = t.observe(&h).unwrap();
        assert_eq!(got.sequence, sequence);
        if stream == 0 {
            mine += 1;
        } else {
            theirs += 1;
        }
        let c = t.counts();
        assert_eq!(c.received + c.duplicates + c.stale + c.out_of_range, mine);
        assert_eq!(c.foreign, theirs);
        assert!(c.reordered <= c.received && c.restarts <= c.received);
        assert!(c.first <= c.highest);
        let _ = t.missing_through(raw);
        assert!(t.missing_through(u64::MAX) >= t.missing_through(sequence));
    }
    let _ = t.observe(data);
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
