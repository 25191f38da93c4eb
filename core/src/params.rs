//! Typed queue-pair knobs shared by every provider: path MTU, timers and retry counts.
//!
//! The InfiniBand specification encodes these as small integers with tables behind them;
//! here each is a type that can only hold a valid code and says what it means.

use core::fmt;
use core::time::Duration;

/// The checked constructor and the getter of a newtype that holds an integer code up to a
/// largest valid value: the one place each bound is kept (the types below are this idea).
macro_rules! bounded_code {
    (
        $ty:ident($int:ty) up to $max:expr;
        $(#[doc = $new_doc:literal])* fn $new:ident($v:ident);
        $(#[doc = $get_doc:literal])* fn $get:ident;
    ) => {
        impl $ty {
            $(#[doc = $new_doc])*
            #[inline]
            pub const fn $new($v: $int) -> Option<Self> {
                if $v <= $max {
                    Some(Self($v))
                } else {
                    None
                }
            }

            $(#[doc = $get_doc])*
            #[inline]
            pub const fn $get(self) -> $int {
                self.0
            }
        }
    };
}

/// Path MTU: the largest payload of one packet on the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    B256 = 1,
    /// 512 bytes.
    B512 = 2,
    /// 1024 bytes.
    B1024 = 3,
    /// 2048 bytes.
    B2048 = 4,
    /// 4096 bytes.
    B4096 = 5,
}

impl Mtu {
    /// The verbs code (1..=5).
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The MTU for a verbs code, or `None` for an invalid code.
    #[inline]
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::B256,
            2 => Self::B512,
            3 => Self::B1024,
            4 => Self::B2048,
            5 => Self::B4096,
            _ => return None,
        })
    }

    /// Size in bytes.
    #[inline]
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// Local ACK timeout: `4.096 us * 2^code`, code 0 meaning "wait forever" (1..=31).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AckTimeout(u8);

bounded_code! {
    AckTimeout(u8) up to 31;
    /// The timeout for a code, or `None` if `code > 31`.
    fn from_code(code);
    /// The verbs code.
    fn code;
}

impl AckTimeout {
    /// Never time out (not recommended: a dead peer then hangs the sender).
    pub const INFINITE: Self = Self(0);

    /// The smallest code whose timeout is at least `d` (saturating at code 31).
    pub fn at_least(d: Duration) -> Self {
        let ns = d.as_nanos();
        let mut code = 1u8;
        while code < 31 && 4096u128 << code < ns {
            code += 1;
        }
        Self(code)
    }

    /// The timeout, or `None` for infinite.
    pub const fn duration(self) -> Option<Duration> {
        if self.0 == 0 {
            None
        } else {
            Some(Duration::from_nanos(4096u64 << self.0))
        }
    }
}

impl Default for AckTimeout {
    /// About 67 ms (code 14), long enough for a congested fabric, short enough to notice a
    /// dead peer in well under a second with the default retry count on hardware. (On
    /// SoftRoCE the default count of 7 means "retry forever", see [`RetryCount`]; there a dead
    /// peer is noticed by the channel's timeout.)
    fn default() -> Self {
        Self(14)
    }
}

/// A retry count for transport errors (0..=7).
///
/// SoftRoCE (`rdma_rxe`) treats 7 as "retry forever" (its completer decrements the counter
/// only when it is not 7), so on rxe a send to a dead peer never fails with
/// `RetryExceeded` at the default; [`ChannelConfig::timeout`](crate::channel::ChannelConfig)
/// bounds the wait instead. rxe also spends these retries while a send waits for the peer's
/// receive (RNR), so a count below 7 there can fail a send to a live but slow receiver: keep 7
/// on rxe. Hardware counts 7 like any other value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RetryCount(u8);

bounded_code! {
    RetryCount(u8) up to 7;
    /// The count, or `None` if `n > 7`.
    fn new(n);
    /// The count.
    fn get;
}

impl Default for RetryCount {
    fn default() -> Self {
        Self(7)
    }
}

/// How often the sender retries after a receiver-not-ready NAK: 0..=6 times, or forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RnrRetry {
    /// Retry this many times (0..=6), then fail the work request.
    Times(u8),
    /// Retry until the receiver posts a buffer.
    Infinite,
}

impl RnrRetry {
    /// The verbs code (7 means infinite).
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            Self::Times(n) if n < 7 => n,
            Self::Times(_) => 6,
            Self::Infinite => 7,
        }
    }
}

impl Default for RnrRetry {
    fn default() -> Self {
        Self::Times(6)
    }
}

/// Minimum RNR NAK timer: how long a sender waits before retrying after an RNR NAK.
///
/// The 5-bit code indexes a non-linear table (IBA vol. 1, table 45); this type holds the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RnrTimer(u8);

/// The delay of each RNR timer code, in units of 10 microseconds.
const RNR_TABLE_10US: [u32; 32] = [
    65_536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

bounded_code! {
    RnrTimer(u8) up to 31;
    /// The timer for a code, or `None` if `code > 31`.
    fn from_code(code);
    /// The code.
    fn code;
}

impl RnrTimer {
    /// The smallest code whose delay is at least `d`.
    pub fn at_least(d: Duration) -> Self {
        let want = d.as_micros();
        let mut best = 0u8; // 655.36 ms, the largest delay
        let mut best_val = u128::MAX;
        for (code, &v) in RNR_TABLE_10US.iter().enumerate() {
            let v = u128::from(v) * 10;
            if v >= want && v < best_val {
                best_val = v;
                best = code as u8;
            }
        }
        Self(best)
    }

    /// The delay this code stands for.
    pub fn duration(self) -> Duration {
        Duration::from_nanos(u64::from(RNR_TABLE_10US[usize::from(self.0 & 31)]) * 10_000)
    }
}

impl Default for RnrTimer {
    /// 0.64 ms (code 12): short enough that a receiver that is a little late costs little.
    fn default() -> Self {
        Self(12)
    }
}

/// A 24-bit packet sequence number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Psn(u32);

bounded_code! {
    Psn(u32) up to 0x00ff_ffff;
    /// The PSN, or `None` if it does not fit in 24 bits.
    fn new(v);
    /// The value.
    fn get;
}

impl Psn {
    /// The PSN taken modulo 2^24.
    #[inline]
    pub const fn wrapping(v: u32) -> Self {
        Self(v & 0x00ff_ffff)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// Where a queue pair's first packet sequence number (the PSN it sends first, and so the one
/// its peer expects) comes from.
///
/// A receiver executes a request only at the PSN it expects next. RoCE packets carry no
/// authentication, so that PSN and the queue pair number are all that stand between a
/// forged RDMA WRITE and a registered window whose rkey the forger knows: a first PSN
/// nobody can predict is what makes blind injection miss (see docs/security.md, and the
/// injection test `bootstrap/tests/device_inject.rs`). Core has no randomness of its own;
/// its caller brings it. Every std path of rverbs (`rverbs-bootstrap`'s `connect`,
/// `rejoin` and readmission, `rverbs-perf`) uses [`PsnSource::Draw`] with
/// `rverbs_std_shim::random_psn`, 24 bits from the operating system's CSPRNG per queue pair.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub enum PsnSource {
    /// Derived from the queue pair's own number ([`PsnSource::predictable`]): anyone who
    /// sees or guesses the number (small and sequential on most devices) knows it. The
    /// default only because core cannot draw random bits: for tests and the software model,
    /// never for queue pairs reachable from a network others share.
    #[default]
    Predictable,
    /// This PSN, for every queue pair made with the configuration (the caller drew it).
    Fixed(Psn),
    /// A fresh PSN for every queue pair from this function, which returns `None` when it
    /// has no random bits to give (creating the queue pair then fails rather than fall
    /// back to a predictable PSN).
    Draw(fn() -> Option<Psn>),
}

impl PsnSource {
    /// What [`PsnSource::Predictable`] gives the queue pair numbered `qpn`: a fixed function of
    /// the number (a multiplicative hash), the same on every run.
    #[inline]
    pub const fn predictable(qpn: u32) -> Psn {
        Psn::wrapping(qpn.wrapping_mul(0x9e37_79b1) >> 8)
    }

    /// The first PSN of the queue pair numbered `qpn`, or `None` if a [`PsnSource::Draw`]
    /// function had no random bits.
    pub fn first_psn(self, qpn: u32) -> Option<Psn> {
        match self {
            Self::Predictable => Some(Self::predictable(qpn)),
            Self::Fixed(psn) => Some(psn),
            Self::Draw(draw) => draw(),
        }
    }

    /// Whether the PSNs this source gives are unpredictable to whoever knows the queue pair
    /// number ([`PsnSource::Draw`]; a [`PsnSource::Fixed`] PSN is as good as the caller's
    /// choice, which this cannot judge, so it answers `false`).
    pub const fn is_drawn(self) -> bool {
        matches!(self, Self::Draw(_))
    }
}

/// Two sources are equal when they are the same variant with the same PSN; two `Draw`
/// sources are equal whatever their functions (function addresses are not stable enough to
/// compare: the compiler may merge or duplicate functions).
impl PartialEq for PsnSource {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Predictable, Self::Predictable) | (Self::Draw(_), Self::Draw(_)) => true,
            (Self::Fixed(a), Self::Fixed(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for PsnSource {}

/// What the device granted a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
}

impl QpCaps {
    /// Queues `send` and `recv` deep, one scatter/gather entry per request and 64 bytes of
    /// inline data: what a queue pair of the software model or the instant device is
    /// usually built with.
    ///
    /// ```
    /// use rverbs_core::params::QpCaps;
    /// let caps = QpCaps::queues(16, 16).with_sges(2);
    /// assert_eq!((caps.max_send_wr, caps.max_send_sge, caps.max_inline_data), (16, 2, 64));
    /// ```
    pub const fn queues(send: u32, recv: u32) -> Self {
        Self {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }

    /// The same with `sges` scatter/gather entries per send and per receive.
    pub const fn with_sges(self, sges: u32) -> Self {
        Self {
            max_send_sge: sges,
            max_recv_sge: sges,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_round_trip() {
        for code in 1..=5 {
            let m = Mtu::from_code(code).unwrap();
            assert_eq!(m.code(), code);
        }
        assert_eq!(Mtu::B4096.bytes(), 4096);
        assert_eq!(Mtu::B256.bytes(), 256);
        assert!(Mtu::from_code(0).is_none());
        assert!(Mtu::from_code(6).is_none());
    }

    #[test]
    fn ack_timeout_codes_map_to_4096_ns_times_two_to_the_code_and_at_least_rounds_up() {
        assert_eq!(
            AckTimeout::from_code(14).unwrap().duration(),
            Some(Duration::from_nanos(4096 << 14))
        );
        assert_eq!(AckTimeout::INFINITE.duration(), None);
        assert!(AckTimeout::from_code(32).is_none());
        let t = AckTimeout::at_least(Duration::from_millis(1));
        assert!(t.duration().unwrap() >= Duration::from_millis(1));
        assert!(
            AckTimeout::from_code(t.code() - 1)
                .unwrap()
                .duration()
                .unwrap()
                < Duration::from_millis(1)
        );
    }

    #[test]
    fn rnr_timer_codes_follow_the_spec_table_and_at_least_rounds_up() {
        assert_eq!(
            RnrTimer::from_code(0).unwrap().duration(),
            Duration::from_micros(655_360)
        );
        assert_eq!(
            RnrTimer::from_code(1).unwrap().duration(),
            Duration::from_nanos(10_000)
        );
        let t = RnrTimer::at_least(Duration::from_micros(100));
        assert!(t.duration() >= Duration::from_micros(100));
        assert_eq!(t.code(), 7); // 0.12 ms, the first code of at least 0.1 ms
    }

    #[test]
    fn psn_is_24_bits() {
        assert!(Psn::new(1 << 24).is_none());
        assert_eq!(Psn::wrapping(0x1ff_ffff).get(), 0xff_ffff);
    }

    #[test]
    fn each_psn_source_gives_its_first_psn_and_drawn_sources_compare_equal() {
        // The predictable PSN is the one rverbs derived before PSNs were drawn: a forger who
        // knows a queue pair number knows it (the injection test's positive control uses it).
        assert_eq!(
            PsnSource::predictable(0x11).get(),
            (0x11u32.wrapping_mul(0x9e37_79b1) >> 8) & 0xff_ffff
        );
        assert_eq!(
            PsnSource::default().first_psn(0x11),
            Some(PsnSource::predictable(0x11))
        );
        assert_eq!(
            PsnSource::Fixed(Psn::wrapping(5)).first_psn(0x11),
            Some(Psn::wrapping(5))
        );
        assert_eq!(PsnSource::Draw(|| Psn::new(7)).first_psn(0x11), Psn::new(7));
        assert_eq!(PsnSource::Draw(|| None).first_psn(0x11), None);
        assert!(PsnSource::Draw(|| None).is_drawn() && !PsnSource::Predictable.is_drawn());
        assert_eq!(PsnSource::Draw(|| None), PsnSource::Draw(|| Psn::new(1)));
        assert_ne!(
            PsnSource::Fixed(Psn::wrapping(1)),
            PsnSource::Fixed(Psn::wrapping(2))
        );
    }

    #[test]
    fn rnr_retry_infinite_is_code_7_and_counts_cap_at_6() {
        assert_eq!(RnrRetry::Infinite.code(), 7);
        assert_eq!(RnrRetry::Times(3).code(), 3);
        assert_eq!(RnrRetry::Times(9).code(), 6);
    }
}
