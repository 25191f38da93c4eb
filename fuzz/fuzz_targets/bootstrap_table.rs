//! Rank 0 sends every rank the table of all endpoint blobs; a rank decodes it
//! from bytes it cannot trust. Decoding must be total, must not allocate more
//! than the payload justifies, and an accepted table must re-encode to the same
//! bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_bootstrap::wire::{decode_table, encode_table};

const MAX_BLOB: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = decode_table(data, MAX_BLOB) {
        assert!(!table.is_empty());
        let bytes = encode_table(&table).expect("a decoded table re-encodes");
        assert_eq!(bytes[..], data[..]);
        assert_eq!(decode_table(&bytes, MAX_BLOB), Ok(table));
    }
});
