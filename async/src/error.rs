//! Errors of the async operations.

use core::fmt;

use rverbs_core::channel::ChannelError;

/// Why an async operation failed. The buffer comes back with the error either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncError {
    /// The channel failed (names the peer's rank where the channel knows it).
    Channel(ChannelError),
    /// The range is not inside the buffer (nothing was posted).
    OutOfBounds {
        /// Start of the range asked for.
        start: usize,
        /// End of the range asked for.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// The operation writes the buffer, which lacks local write access (nothing was posted).
    NoLocalWrite,
    /// An atomic's result word at this offset is not 8-aligned inside the buffer.
    Misaligned {
        /// The offset given.
        offset: usize,
    },
}

impl fmt::Display for AsyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Channel(e) => write!(f, "{e}"),
            Self::OutOfBounds { start, end, len } => {
                write!(f, "range {start}..{end} is outside the buffer of {len} bytes (nothing was posted)")
            }
            Self::NoLocalWrite => f.write_str(
                "the operation writes the buffer, which was registered without LOCAL_WRITE (nothing was posted)",
            ),
            Self::Misaligned { offset } => {
                write!(f, "an atomic's result word at offset {offset} is not 8-aligned in the buffer")
            }
        }
    }
}

impl core::error::Error for AsyncError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Channel(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ChannelError> for AsyncError {
    fn from(e: ChannelError) -> Self {
        Self::Channel(e)
    }
}
