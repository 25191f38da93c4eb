//! The failure notice: 8 bytes a node writes into the last slot of every other rank's flag
//! array (and a [`FailureAlarm`](crate::node::FailureAlarm) holds) to say which rank
//! failed, why, and who saw it.
//!
//! One little-endian `u64`, written with a single 8-byte RDMA write:
//!
//! | bits   | field                                                                 |
//! |--------|-----------------------------------------------------------------------|
//! | 0..16  | reporter rank                                                         |
//! | 16..32 | failed rank                                                           |
//! | 32..40 | cause: 1 error completion, 2 timed out, 3 session closed, 4 port down, 5 queue pair failed, 6 device fatal, 7 gave up |
//! | 40..48 | detail: the completion status code (1), the port (4), the [`QpFault`] code (5), else 0 |
//! | 48..56 | incarnation of the failed rank: reserved for rejoining ranks, 0 today |
//! | 56..64 | [`MAGIC`]                                                             |
//!
//! 0 means "no notice". Ranks fit 16 bits because a world has at most
//! [`MAX_WORLD`](super::MAX_WORLD) ranks. A word that does not decode (another magic, an
//! unknown cause, a status code above 255) is ignored by the reader, as is (today) any
//! incarnation but 0.

use crate::completion::WcStatus;
use crate::failure::{Failure, FailureCause, QpFault};

/// The top byte of every notice.
pub const MAGIC: u8 = 0xFA;

/// Encodes `failure` about incarnation `incarnation` of the failed rank; `None` if a rank
/// does not fit 16 bits or a status code does not fit 8.
pub fn encode(failure: &Failure, incarnation: u8) -> Option<u64> {
    let reporter = u16::try_from(failure.reporter).ok()?;
    let rank = u16::try_from(failure.rank).ok()?;
    let (cause, detail) = match failure.cause {
        FailureCause::Completion(s) => (1u8, u8::try_from(s.code()).ok()?),
        FailureCause::TimedOut => (2, 0),
        FailureCause::SessionClosed => (3, 0),
        FailureCause::PortDown { port } => (4, port),
        FailureCause::QueuePairFailed(q) => (5, q.code()),
        FailureCause::DeviceFatal => (6, 0),
        FailureCause::LeftOnError => (7, 0),
    };
    Some(
        u64::from(reporter)
            | u64::from(rank) << 16
            | u64::from(cause) << 32
            | u64::from(detail) << 40
            | u64::from(incarnation) << 48
            | u64::from(MAGIC) << 56,
    )
}

/// Decodes a notice: the failure and the incarnation it is about, or `None` for 0 or any
/// word that is not a notice.
pub fn decode(word: u64) -> Option<(Failure, u8)> {
    let byte = |shift: u32| (word >> shift) as u8;
    if byte(56) != MAGIC {
        return None;
    }
    let cause = match (byte(32), byte(40)) {
        (1, code) => FailureCause::Completion(WcStatus::from_code(u32::from(code))),
        (2, 0) => FailureCause::TimedOut,
        (3, 0) => FailureCause::SessionClosed,
        (4, port) if port != 0 => FailureCause::PortDown { port },
        (5, code) => FailureCause::QueuePairFailed(QpFault::from_code(code)?),
        (6, 0) => FailureCause::DeviceFatal,
        (7, 0) => FailureCause::LeftOnError,
        _ => return None,
    };
    let failure = Failure {
        rank: u32::from((word >> 16) as u16),
        cause,
        reporter: u32::from(word as u16),
    };
    Some((failure, byte(48)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_cause_survives_a_notice_encode_and_decode() {
        for cause in [
            FailureCause::Completion(WcStatus::RetryExceeded),
            FailureCause::Completion(WcStatus::Flushed),
            FailureCause::TimedOut,
            FailureCause::SessionClosed,
            FailureCause::PortDown { port: 1 },
            FailureCause::PortDown { port: 255 },
            FailureCause::QueuePairFailed(QpFault::Fatal),
            FailureCause::QueuePairFailed(QpFault::InvalidRequest),
            FailureCause::QueuePairFailed(QpFault::AccessError),
            FailureCause::DeviceFatal,
            FailureCause::LeftOnError,
        ] {
            let f = Failure {
                rank: 4095,
                cause,
                reporter: 17,
            };
            let w = encode(&f, 3).unwrap();
            assert_eq!(decode(w), Some((f, 3)));
        }
    }

    #[test]
    fn zero_and_garbage_are_not_notices() {
        assert_eq!(decode(0), None);
        assert_eq!(decode(u64::MAX), None);
        let f = Failure {
            rank: 1,
            cause: FailureCause::TimedOut,
            reporter: 0,
        };
        let w = encode(&f, 0).unwrap();
        assert_eq!(
            decode(w | 1 << 40),
            None,
            "a detail byte on a cause without one"
        );
        assert_eq!(decode(w & !(0xFF << 32) | 9 << 32), None, "unknown cause");
        assert_eq!(
            decode(w & !(0xFF << 32) | 4 << 32),
            None,
            "port down on port 0"
        );
        assert_eq!(
            decode(w & !(0xFF << 32) | 5 << 32 | 9 << 40),
            None,
            "unknown queue pair fault"
        );
        assert_eq!(
            decode(w & !(0xFF << 32) | 6 << 32 | 1 << 40),
            None,
            "device fatal with a detail"
        );
    }

    #[test]
    fn ranks_beyond_sixteen_bits_do_not_encode() {
        let f = Failure {
            rank: 70_000,
            cause: FailureCause::TimedOut,
            reporter: 0,
        };
        assert_eq!(encode(&f, 0), None);
    }
}
