//! CPU lists are read from sysfs and from users (pinning options); the parser
//! promises to be total and linear, and `Display` promises to print a list it
//! reads back as the same set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_std_shim::affinity::parse_cpulist;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = core::str::from_utf8(data) else {
        return;
    };
    match parse_cpulist(text) {
        Ok(set) => {
            let printed = set.to_string();
            assert_eq!(parse_cpulist(&printed).as_ref(), Ok(&set), "{printed:?}");
            assert_eq!(set.iter().count(), set.len());
        }
        Err(err) => assert!(err.offset() <= text.len()),
    }
});
