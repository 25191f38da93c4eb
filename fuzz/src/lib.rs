//! What the fuzz targets share: the check that a decoder of peer bytes has one spelling per
//! value.

/// Where `<$ty>::decode($data)` accepts, the value it decodes to encodes back to exactly
/// those bytes (`$data[$range]`; all of `$data` when no range is given) and decodes again to
/// itself: byte-exact, the decoder accepts no second spelling of the same value. Evaluates
/// to the decoded value, if any, for the target's further checks.
#[macro_export]
macro_rules! canonical {
    ($ty:ty, $data:expr) => {
        $crate::canonical!($ty, $data, ..)
    };
    ($ty:ty, $data:expr, $range:expr) => {
        <$ty>::decode($data).ok().inspect(|value| {
            let bytes = value.encode();
            assert_eq!(<$ty>::decode(&bytes), Ok(value.clone()));
            assert_eq!(bytes[..], $data[$range]);
        })
    };
}
