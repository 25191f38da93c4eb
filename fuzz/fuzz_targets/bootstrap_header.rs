//! Bootstrap frame headers are the first bytes read from any TCP peer (which may
//! be a port scanner or another job), so decoding must be total. The header is
//! followed by its payload; a `Table` payload is decoded too, as rank 0 would.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_bootstrap::wire::{
    decode_header, decode_header_with_limit, decode_table, FrameKind, HEADER_LEN, MAX_PAYLOAD,
};

/// The payload limit the targets use; small enough that limit checks get exercised.
const LIMIT: u32 = 64 * 1024;

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
    if let Ok(header) = limited {
        assert!(header.payload_len <= LIMIT);
        let payload = &data[HEADER_LEN..];
        if header.kind == FrameKind::Table && payload.len() == header.payload_len as usize {
            let _ = decode_table(payload, LIMIT as usize);
        }
    }
});
