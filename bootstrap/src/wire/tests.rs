//! Unit tests of the parent module.

use super::*;

fn sample() -> Header {
    Header {
        kind: FrameKind::Hello,
        job_id: 0x0102_0304_0506_0708,
        sender: 3,
        world_size: 8,
        payload_len: 5,
        mac: false,
    }
}

#[test]
fn header_round_trips_with_documented_layout() {
    let bytes = sample().encode();
    assert_eq!(&bytes[0..4], b"RVB1");
    assert_eq!(&bytes[4..6], &[2, 0]);
    assert_eq!(bytes[6], 1);
    assert_eq!(bytes[7], 0);
    assert_eq!(&bytes[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(&bytes[16..20], &[3, 0, 0, 0]);
    assert_eq!(&bytes[20..24], &[8, 0, 0, 0]);
    assert_eq!(&bytes[24..28], &[5, 0, 0, 0]);
    assert_eq!(decode_header(&bytes), Ok(sample()));
}

#[test]
fn every_kind_round_trips() {
    for kind in [
        FrameKind::Hello,
        FrameKind::Table,
        FrameKind::Reject,
        FrameKind::Sync,
        FrameKind::Challenge,
        FrameKind::Bye,
        FrameKind::Rejoin,
        FrameKind::Readmit,
    ] {
        assert_eq!(FrameKind::from_u8(kind.to_u8()), Some(kind));
    }
    assert_eq!(FrameKind::from_u8(0), None);
    assert_eq!(FrameKind::from_u8(9), None);
}

#[test]
fn a_header_cut_short_at_any_length_is_refused_as_truncated() {
    let bytes = sample().encode();
    for len in 0..HEADER_LEN {
        assert_eq!(
            decode_header(&bytes[..len]),
            Err(WireError::Truncated {
                needed: HEADER_LEN,
                got: len
            })
        );
    }
}

#[test]
fn a_header_with_foreign_magic_is_refused_showing_the_bytes() {
    let mut bytes = sample().encode();
    bytes[0..4].copy_from_slice(b"GET ");
    assert_eq!(
        decode_header(&bytes),
        Err(WireError::BadMagic { found: *b"GET " })
    );
}

#[test]
fn a_header_with_an_unknown_version_is_refused() {
    let mut bytes = sample().encode();
    for version in [1u8, 3] {
        bytes[4] = version;
        assert_eq!(
            decode_header(&bytes),
            Err(WireError::UnsupportedVersion {
                found: version.into()
            })
        );
    }
}

#[test]
fn a_header_with_an_unknown_frame_kind_is_refused() {
    let mut bytes = sample().encode();
    for kind in [0u8, 9, 0xff] {
        bytes[6] = kind;
        assert_eq!(
            decode_header(&bytes),
            Err(WireError::UnknownKind { found: kind })
        );
    }
}

#[test]
fn rejects_unknown_flags_and_reads_the_mac_flag() {
    let mut bytes = sample().encode();
    bytes[7] = 9;
    assert_eq!(
        decode_header(&bytes),
        Err(WireError::UnknownFlags { found: 9 })
    );
    bytes[7] = FLAG_MAC;
    let header = decode_header(&bytes).unwrap();
    assert!(header.mac);
    assert_eq!(header.frame_len(), HEADER_LEN + 5 + MAC_LEN);
    assert_eq!(header.encode(), bytes);
}

#[test]
fn rejects_payload_over_limit() {
    let mut header = sample();
    header.payload_len = 65;
    assert_eq!(
        decode_header_with_limit(&header.encode(), 64),
        Err(WireError::PayloadTooLarge { len: 65, limit: 64 })
    );
    header.payload_len = u32::MAX;
    assert_eq!(
        decode_header(&header.encode()),
        Err(WireError::PayloadTooLarge {
            len: u32::MAX,
            limit: MAX_PAYLOAD
        })
    );
}

#[test]
fn a_table_of_blobs_decodes_to_the_same_blobs_within_its_limit() {
    let blobs = vec![vec![1u8, 2, 3], Vec::new(), vec![9u8; 100]];
    let payload = encode_table(&blobs).unwrap();
    assert_eq!(decode_table(&payload, 100).unwrap(), blobs);
    assert!(payload.len() <= table_payload_limit(3, 100) as usize);
}

#[test]
fn table_built_entry_by_entry_matches() {
    let blobs = vec![vec![1u8, 2, 3], Vec::new(), vec![9u8; 100]];
    let built = encode_table_with(3, 0, |rank, out| {
        out.extend_from_slice(&blobs[rank as usize]);
    })
    .unwrap();
    assert_eq!(built, encode_table(&blobs).unwrap());
}

#[test]
fn table_rejects_empty_and_short() {
    assert_eq!(
        decode_table(&[], 10),
        Err(WireError::Truncated { needed: 4, got: 0 })
    );
    assert_eq!(decode_table(&[0, 0, 0, 0], 10), Err(WireError::TableEmpty));
}

#[test]
fn table_rejects_huge_count_before_allocating() {
    let payload = u32::MAX.to_le_bytes();
    assert_eq!(
        decode_table(&payload, 10),
        Err(WireError::TableCountTooLarge {
            count: u32::MAX,
            remaining: 0
        })
    );
}

#[test]
fn table_rejects_out_of_order_rank() {
    let mut payload = encode_table(&[[1u8], [2u8]]).unwrap();
    // Second entry's rank sits after count (4) + first entry (8 + 1).
    payload[13] = 7;
    assert_eq!(
        decode_table(&payload, 10),
        Err(WireError::TableRankOutOfOrder { index: 1, rank: 7 })
    );
}

#[test]
fn table_rejects_oversized_and_truncated_entries() {
    let payload = encode_table(&[vec![0u8; 20]]).unwrap();
    assert_eq!(
        decode_table(&payload, 19),
        Err(WireError::TableEntryTooLarge {
            index: 0,
            len: 20,
            limit: 19
        })
    );
    assert_eq!(
        decode_table(&payload[..payload.len() - 1], 64),
        Err(WireError::TableEntryTruncated {
            index: 0,
            len: 20,
            remaining: 19
        })
    );
    let mut two = encode_table(&[vec![1u8; 20], vec![2u8]]).unwrap();
    // Count, the whole first entry, and only the rank of the second.
    two.truncate(4 + 28 + 4);
    assert_eq!(
        decode_table(&two, 64),
        Err(WireError::TableTruncated { index: 1 })
    );
}

#[test]
fn table_rejects_trailing_bytes() {
    let mut payload = encode_table(&[[1u8]]).unwrap();
    payload.push(0);
    assert_eq!(
        decode_table(&payload, 10),
        Err(WireError::TableTrailingBytes { extra: 1 })
    );
}

#[test]
fn decoders_survive_arbitrary_bytes() {
    // A cheap stand-in for the fuzz target: a deterministic byte stream.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::new();
    for round in 0..2000 {
        buf.clear();
        for _ in 0..(round % 64) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            buf.push(state as u8);
        }
        if round % 3 == 0 && buf.len() >= 8 {
            buf[..4].copy_from_slice(&MAGIC);
            buf[4..6].copy_from_slice(&VERSION.to_le_bytes());
        }
        let _ = decode_header(&buf);
        let _ = decode_table(&buf, 16);
    }
}

// ---- MACs: every frame proven, bound to its connection, direction and place ----

fn secret(byte: u8) -> crate::JobSecret {
    crate::JobSecret::new(&[byte; 32]).unwrap()
}

/// Rank 0's and a peer's seals of one connection, after both challenges
/// (`challenge` and its complement).
fn connection(root_secret: Option<u8>, peer_secret: Option<u8>, challenge: u8) -> (Seal, Seal) {
    let (root_secret, peer_secret) = (root_secret.map(secret), peer_secret.map(secret));
    let mut root = Seal::root(root_secret.as_ref(), [challenge; CHALLENGE_LEN]);
    let mut peer = Seal::peer(peer_secret.as_ref(), [!challenge; CHALLENGE_LEN]);
    // Both speak first; neither waits for the other.
    let from_root = root.challenge_frame(7, 0, 2);
    let from_peer = peer.challenge_frame(7, 1, 2);
    for (seal, bytes) in [(&mut peer, &from_root), (&mut root, &from_peer)] {
        let decoded = decode_frame(bytes, MAX_PAYLOAD).unwrap();
        assert_eq!(decoded.header.kind, FrameKind::Challenge);
        assert_eq!(seal.open(&decoded), Ok(()));
    }
    (root, peer)
}

fn open(seal: &mut Seal, bytes: &[u8]) -> Result<(), WireError> {
    seal.open(&decode_frame(bytes, MAX_PAYLOAD)?)
}

#[test]
fn sealed_frames_open_on_their_connection_in_order() {
    let (mut root, mut peer) = connection(Some(1), Some(1), 0xaa);
    for round in 0..3u8 {
        let hello = peer.encode(FrameKind::Hello, 7, 1, 2, &[round; 9]).unwrap();
        let frame = decode_frame(&hello, MAX_PAYLOAD).unwrap();
        assert!(frame.header.mac && frame.mac.is_some());
        assert_eq!(frame.payload, &[round; 9]);
        assert_eq!(hello.len(), frame.header.frame_len());
        assert_eq!(root.open(&frame), Ok(()));
        let table = root.encode(FrameKind::Table, 7, 0, 2, b"table").unwrap();
        assert_eq!(open(&mut peer, &table), Ok(()));
    }
}

#[test]
fn frames_replayed_on_another_connection_are_refused() {
    let (mut root, mut peer) = connection(Some(1), Some(1), 0xaa);
    let hello = peer.encode(FrameKind::Hello, 7, 1, 2, b"blob").unwrap();
    let table = root.encode(FrameKind::Table, 7, 0, 2, b"table").unwrap();
    let (mut other_root, mut other_peer) = connection(Some(1), Some(1), 0xbb);
    assert_eq!(open(&mut other_root, &hello), Err(WireError::MacMismatch));
    assert_eq!(open(&mut other_peer, &table), Err(WireError::MacMismatch));
    // A recorded challenge replayed to a rank opens (it proves only the secret),
    // but then rank 0's recorded table does not: it covered the old challenge.
    let mut root = Seal::root(Some(&secret(1)), [0xcc; CHALLENGE_LEN]);
    let mut first = Seal::peer(Some(&secret(1)), [0x22; CHALLENGE_LEN]);
    let old_challenge = root.challenge_frame(7, 0, 2);
    assert_eq!(open(&mut root, &first.challenge_frame(7, 1, 2)), Ok(()));
    assert_eq!(open(&mut first, &old_challenge), Ok(()));
    let hello = first.encode(FrameKind::Hello, 7, 1, 2, b"blob").unwrap();
    assert_eq!(open(&mut root, &hello), Ok(()));
    let recorded_table = root.encode(FrameKind::Table, 7, 0, 2, b"table").unwrap();
    let mut victim = Seal::peer(Some(&secret(1)), [0x11; CHALLENGE_LEN]);
    let _ = victim.challenge_frame(7, 1, 2);
    assert_eq!(open(&mut victim, &old_challenge), Ok(()));
    let _ = victim.encode(FrameKind::Hello, 7, 1, 2, b"blob").unwrap();
    assert_eq!(
        open(&mut victim, &recorded_table),
        Err(WireError::MacMismatch)
    );
}

#[test]
fn repeated_dropped_or_reflected_frames_are_refused() {
    let (mut root, mut peer) = connection(Some(1), Some(1), 0xaa);
    let first = peer.encode(FrameKind::Sync, 7, 1, 2, b"one").unwrap();
    let second = peer.encode(FrameKind::Sync, 7, 1, 2, b"two").unwrap();
    // Dropping the first: the second is in the wrong place.
    assert_eq!(
        open(&mut root.clone(), &second),
        Err(WireError::MacMismatch)
    );
    assert_eq!(open(&mut root, &first), Ok(()));
    // Repeating the first.
    assert_eq!(open(&mut root, &first), Err(WireError::MacMismatch));
    // Rank 0's own frame sent back to it.
    let table = root.encode(FrameKind::Table, 7, 0, 2, b"t").unwrap();
    let (mut fresh_root, _) = connection(Some(1), Some(1), 0xaa);
    assert_eq!(open(&mut fresh_root, &table), Err(WireError::MacMismatch));
    // The peer takes it once, in its place, and not again.
    assert_eq!(open(&mut peer, &table), Ok(()));
    assert_eq!(open(&mut peer, &table), Err(WireError::MacMismatch));
}

#[test]
fn every_flipped_bit_is_caught() {
    let (mut root, _) = connection(Some(1), Some(1), 0xaa);
    let (_, mut peer) = connection(Some(1), Some(1), 0xaa);
    let frame = peer.encode(FrameKind::Hello, 7, 1, 2, b"payload").unwrap();
    for byte in 0..frame.len() {
        for bit in 0..8 {
            let mut tampered = frame.clone();
            tampered[byte] ^= 1 << bit;
            assert!(
                open(&mut root.clone(), &tampered).is_err(),
                "byte {byte} bit {bit} went unnoticed"
            );
        }
    }
    assert_eq!(open(&mut root, &frame), Ok(()));
}

#[test]
fn secrets_must_match_or_be_absent_on_both_ends() {
    let cases = [
        (
            Some(1),
            Some(2),
            WireError::MacMismatch,
            WireError::MacMismatch,
        ),
        (
            Some(1),
            None,
            WireError::MacUnexpected,
            WireError::MacMissing,
        ),
        (
            None,
            Some(1),
            WireError::MacMissing,
            WireError::MacUnexpected,
        ),
    ];
    for (root_secret, peer_secret, at_peer, at_root) in cases {
        let (root_secret, peer_secret) = (root_secret.map(secret), peer_secret.map(secret));
        let mut root = Seal::root(root_secret.as_ref(), [3; CHALLENGE_LEN]);
        let mut peer = Seal::peer(peer_secret.as_ref(), [4; CHALLENGE_LEN]);
        // Each end finds out from the other's first frame, before sending more.
        assert_eq!(
            open(&mut peer, &root.challenge_frame(7, 0, 2)),
            Err(at_peer)
        );
        assert_eq!(
            open(&mut root, &peer.challenge_frame(7, 1, 2)),
            Err(at_root)
        );
    }
    // Without a secret anywhere, frames carry no MAC at all.
    let (mut root, mut peer) = connection(None, None, 0xaa);
    let hello = peer.encode(FrameKind::Hello, 7, 1, 2, b"blob").unwrap();
    assert_eq!(hello.len(), HEADER_LEN + 4);
    assert_eq!(hello[7], 0);
    assert_eq!(open(&mut root, &hello), Ok(()));
    assert!(!format!("{root:?} {:?}", secret(0x41)).contains("AAAA"));
}

#[test]
fn challenges_come_first_once_and_in_one_size() {
    let mut peer = Seal::peer(None, [0; CHALLENGE_LEN]);
    let short = encode_frame(FrameKind::Challenge, 7, 0, 2, &[0; 31]).unwrap();
    assert_eq!(
        open(&mut peer, &short),
        Err(WireError::ChallengeLength { len: 31 })
    );
    let table = encode_frame(FrameKind::Table, 7, 0, 2, b"t").unwrap();
    assert_eq!(
        open(&mut peer, &table),
        Err(WireError::ChallengeExpected {
            found: FrameKind::Table
        })
    );
    let (mut root, _) = connection(None, None, 1);
    let again = encode_frame(FrameKind::Challenge, 7, 1, 2, &[0; CHALLENGE_LEN]).unwrap();
    assert_eq!(open(&mut root, &again), Err(WireError::ChallengeRepeated));
}

#[test]
fn decode_frame_wants_the_whole_frame() {
    let (_, mut peer) = connection(Some(1), Some(1), 0xaa);
    let frame = peer.encode(FrameKind::Hello, 7, 1, 2, b"abc").unwrap();
    assert_eq!(
        decode_frame(&frame[..frame.len() - 1], MAX_PAYLOAD),
        Err(WireError::Truncated {
            needed: frame.len(),
            got: frame.len() - 1
        })
    );
}
