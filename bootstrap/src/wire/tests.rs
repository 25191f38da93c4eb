//! Unit tests of the parent module.

use super::*;

fn sample() -> Header {
    Header {
        kind: FrameKind::Hello,
        job_id: 0x0102_0304_0506_0708,
        sender: 3,
        world_size: 8,
        payload_len: 5,
    }
}

#[test]
fn header_round_trips_with_documented_layout() {
    let bytes = sample().encode();
    assert_eq!(&bytes[0..4], b"RVB1");
    assert_eq!(&bytes[4..6], &[1, 0]);
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
    ] {
        assert_eq!(FrameKind::from_u8(kind.to_u8()), Some(kind));
    }
}

#[test]
fn rejects_truncated_header() {
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
fn rejects_bad_magic() {
    let mut bytes = sample().encode();
    bytes[0..4].copy_from_slice(b"GET ");
    assert_eq!(
        decode_header(&bytes),
        Err(WireError::BadMagic { found: *b"GET " })
    );
}

#[test]
fn rejects_unknown_version() {
    let mut bytes = sample().encode();
    bytes[4] = 2;
    assert_eq!(
        decode_header(&bytes),
        Err(WireError::UnsupportedVersion { found: 2 })
    );
}

#[test]
fn rejects_unknown_kind() {
    let mut bytes = sample().encode();
    for kind in [0u8, 6, 0xff] {
        bytes[6] = kind;
        assert_eq!(
            decode_header(&bytes),
            Err(WireError::UnknownKind { found: kind })
        );
    }
}

#[test]
fn rejects_nonzero_reserved() {
    let mut bytes = sample().encode();
    bytes[7] = 9;
    assert_eq!(
        decode_header(&bytes),
        Err(WireError::ReservedNonzero { found: 9 })
    );
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
fn table_round_trips() {
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
