//! Bootstrap frames are the first bytes read from any TCP peer (which may be a
//! port scanner, another job, or someone without the job secret), so decoding
//! must be total, and the MAC check must accept nothing that was not sealed with
//! the secret. The header is followed by its payload and, with the MAC flag, a
//! MAC; a `Table` payload is decoded too, as a rank would, and the node blob of a
//! `Rejoin` or `Readmit`, as rank 0 would.
//!
//! Two oracles on top of "never panics": a frame made from fuzzer bytes never
//! passes the MAC check of an end that holds the secret; and the same bytes
//! sealed as a payload on a real connection open on the other end, and fail to
//! open once any one byte of the frame is changed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_bootstrap::wire::{
    decode_frame, decode_header, decode_header_with_limit, decode_table, FrameKind, Seal,
    CHALLENGE_LEN, HEADER_LEN, MAX_PAYLOAD,
};
use rverbs_bootstrap::JobSecret;
use rverbs_core::wire::node::NodeBlob;

/// The payload limit the targets use; small enough that limit checks get exercised.
const LIMIT: u32 = 64 * 1024;

fn secret() -> JobSecret {
    JobSecret::new(b"the fuzzer's job secret, 32 byte").expect("long enough")
}

fuzz_target!(|data: &[u8]| {
    let unlimited = decode_header(data);
    let limited = decode_header_with_limit(data, LIMIT);
    if let Ok(header) = unlimited {
        assert!(header.payload_len <= MAX_PAYLOAD);
        // Only the first HEADER_LEN bytes are read, and they are canonical.
        assert_eq!(header.encode()[..], data[..HEADER_LEN]);
        assert_eq!(decode_header(&header.encode()), Ok(header));
        // The tighter limit only changes the verdict on the payload length.
        if header.payload_len <= LIMIT {
            assert_eq!(limited, Ok(header));
        } else {
            assert!(limited.is_err());
        }
    } else {
        assert!(limited.is_err());
    }
    if let Ok(frame) = decode_frame(data, LIMIT) {
        assert_eq!(frame.mac.is_some(), frame.header.mac);
        assert_eq!(frame.payload.len(), frame.header.payload_len as usize);
        match frame.header.kind {
            FrameKind::Table => {
                let _ = decode_table(frame.payload, LIMIT as usize);
            }
            // A restarted rank's hello and a survivor's part carry node blobs, which rank 0
            // decodes (and cuts) before it answers.
            FrameKind::Rejoin | FrameKind::Readmit => {
                if let Ok(blob) = NodeBlob::decode(frame.payload) {
                    let _ = NodeBlob::cut_for(frame.payload, blob.rank ^ 1);
                }
            }
            _ => {}
        }
        // Whatever it is, it is no forgery.
        let secret = secret();
        let mut with_secret = Seal::peer(Some(&secret), [1; CHALLENGE_LEN]);
        assert!(with_secret.open(&frame).is_err(), "forged: {frame:?}");
        let mut without = Seal::peer(None, [1; CHALLENGE_LEN]);
        if without.open(&frame).is_ok() {
            assert!(!frame.header.mac);
            assert_eq!(frame.header.kind, FrameKind::Challenge);
        }
    }

    // The same bytes as the payload of a sealed hello on a real connection.
    let secret = secret();
    let mut root = Seal::root(Some(&secret), [2; CHALLENGE_LEN]);
    let mut peer = Seal::peer(Some(&secret), [3; CHALLENGE_LEN]);
    let from_root = root.challenge_frame(7, 0, 2);
    let from_peer = peer.challenge_frame(7, 1, 2);
    peer.open(&decode_frame(&from_root, LIMIT).unwrap())
        .unwrap();
    root.open(&decode_frame(&from_peer, LIMIT).unwrap())
        .unwrap();
    let payload = &data[..data.len().min(LIMIT as usize)];
    // The opening frame of a first start or of a restarted rank, or a survivor's part.
    let kind = [FrameKind::Hello, FrameKind::Rejoin, FrameKind::Readmit][data.len() % 3];
    let hello = peer.encode(kind, 7, 1, 2, payload).unwrap();
    let frame = decode_frame(&hello, LIMIT).unwrap();
    assert_eq!(frame.payload, payload);
    assert!(root.clone().open(&frame).is_ok());
    if let Some(&pick) = data.first() {
        let mut tampered = hello.clone();
        let at = usize::from(pick) * 7919 % tampered.len();
        tampered[at] ^= 1 << (pick % 8);
        if let Ok(frame) = decode_frame(&tampered, LIMIT) {
            assert!(root.open(&frame).is_err(), "byte {at} changed unnoticed");
        }
    }
});
