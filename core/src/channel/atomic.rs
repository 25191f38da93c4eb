//! Remote atomics (compare-and-swap, fetch-and-add) in every posting style. The request is
//! made in one place ([`WorkRequest::atomic`], which checks it); each style only says how it
//! is posted and waited for.
//!
//! The prior value lands in an 8-byte, 8-aligned scatter entry ([`SgeMut`]) of a registered
//! region, as an RDMA read's destination does: the device writes it, so it is the device's
//! until the request completed (the blocking and scoped styles hold the borrow that long),
//! and is read afterwards with the region's [`load_u64`](crate::memory::Region::load_u64).

use super::batch::Batch;
use super::scope::Scope;
use super::{as_gather, Channel, ChannelError, Ticket};
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::{RemoteMemory, SgeMut};
use crate::wr::{AtomicOp, WorkRequest};

/// The work request of `op` on `remote`, its prior value landing in `result`: what every
/// style posts.
#[inline]
fn atomic_wr<'s>(
    op: AtomicOp,
    result: &'s mut SgeMut<'_>,
    remote: RemoteMemory,
) -> Result<WorkRequest<'s>, ChannelError> {
    // One entry in, one entry out.
    let entry = &as_gather(core::slice::from_mut(result))[0];
    WorkRequest::atomic(op, entry, remote).map_err(ChannelError::InvalidAtomic)
}

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// Compare-and-swap on the peer's 8 bytes at `remote` (8-aligned, granting
    /// [`REMOTE_ATOMIC`](crate::memory::AccessFlags::REMOTE_ATOMIC)): if they hold `compare`
    /// they become `swap`. Waits; the value they held before lands in `result` (8 bytes,
    /// 8-aligned), whether or not the swap happened. Misalignment or a wrong length is
    /// refused before posting ([`ChannelError::InvalidAtomic`]); a region without remote
    /// atomic access fails the request at the peer (a [`WcStatus::RemoteAccess`] completion,
    /// which breaks the channel). Does not allocate.
    ///
    /// ```
    /// #![forbid(unsafe_code)]
    /// use rverbs_core::channel::{Channel, ChannelConfig};
    /// use rverbs_core::memory::AccessFlags;
    /// use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
    /// use rverbs_core::poll::StepClock;
    /// use rverbs_core::model::{Side, SoftFabric};
    ///
    /// static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    /// #[repr(align(8))]
    /// struct Words([u8; 16]);
    /// let (mut mine, mut theirs) = (Words([0; 16]), Words([0; 16]));
    /// let caps = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1,
    ///                     max_inline_data: 0 };
    /// let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
    /// let mut result = fabric.register(Side::A, &mut mine.0, AccessFlags::LOCAL_WRITE).unwrap();
    /// let lock = fabric
    ///     .register(Side::B, &mut theirs.0, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
    ///     .unwrap();
    /// let (a, _b) = fabric.ends().unwrap();
    /// let mut chan = Channel::new(a, ChannelConfig::default(), &CLOCK);
    /// let word = lock.remote().slice(8, 8).unwrap();
    ///
    /// // Take the lock: 0 -> 7. It was free, so the prior value is 0.
    /// chan.compare_swap(&mut result.sge_mut(0..8).unwrap(), word, 0, 7).unwrap();
    /// assert_eq!(result.load_u64(0), Some(0));
    /// assert_eq!(lock.load_u64(8), Some(7));
    /// // A second attempt loses, and learns who holds it.
    /// chan.compare_swap(&mut result.sge_mut(0..8).unwrap(), word, 0, 9).unwrap();
    /// assert_eq!(result.load_u64(0), Some(7));
    /// assert_eq!(lock.load_u64(8), Some(7));
    ///
    /// // Fetch-and-add on the word beside it: the prior value comes back.
    /// let counter = lock.remote().slice(0, 8).unwrap();
    /// chan.fetch_add(&mut result.sge_mut(0..8).unwrap(), counter, 40).unwrap();
    /// chan.fetch_add(&mut result.sge_mut(0..8).unwrap(), counter, 2).unwrap();
    /// assert_eq!(result.load_u64(0), Some(40));
    /// assert_eq!(lock.load_u64(0), Some(42));
    /// ```
    ///
    /// [`WcStatus::RemoteAccess`]: crate::completion::WcStatus::RemoteAccess
    pub fn compare_swap(
        &mut self,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<(), ChannelError> {
        let op = AtomicOp::CompareSwap { compare, swap };
        self.run_one(atomic_wr(op, result, remote)?)
    }

    /// Fetch-and-add on the peer's 8 bytes at `remote` (8-aligned, granting
    /// [`REMOTE_ATOMIC`](crate::memory::AccessFlags::REMOTE_ATOMIC)): adds `add`, wrapping.
    /// Waits; the value they held before lands in `result` (8 bytes, 8-aligned). Refused and
    /// failed as [`Channel::compare_swap`] is, whose example shows both. Does not allocate.
    pub fn fetch_add(
        &mut self,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<(), ChannelError> {
        self.run_one(atomic_wr(AtomicOp::FetchAdd(add), result, remote)?)
    }

    /// Posts a compare-and-swap (see [`Channel::compare_swap`]) and returns its ticket; the
    /// prior value is in `result` once [`Channel::wait`] returned for it. Refused before
    /// posting as `compare_swap` is. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the device writes `result` until
    /// [`Channel::wait`] returned for the ticket (or a later one); nobody may touch it before.
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_compare_swap(
        &mut self,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<Ticket, ChannelError> {
        let op = AtomicOp::CompareSwap { compare, swap };
        let wr = atomic_wr(op, result, remote)?;
        // SAFETY: forwarded to the caller.
        unsafe { self.post_wr(wr) }
    }

    /// Posts a fetch-and-add (see [`Channel::fetch_add`]) and returns its ticket. Does not
    /// allocate.
    ///
    /// # Safety
    /// As for [`Channel::post_compare_swap`].
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_fetch_add(
        &mut self,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<Ticket, ChannelError> {
        let wr = atomic_wr(AtomicOp::FetchAdd(add), result, remote)?;
        // SAFETY: forwarded to the caller.
        unsafe { self.post_wr(wr) }
    }
}

impl<'b, P: Provider, B: Backoff, const R: usize> Batch<'_, 'b, P, B, R> {
    /// Adds a compare-and-swap (see [`Channel::compare_swap`]); refused (nothing added) if
    /// misaligned or of the wrong length.
    pub fn compare_swap(
        &mut self,
        result: &'b mut SgeMut<'b>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<&mut Self, ChannelError> {
        let op = AtomicOp::CompareSwap { compare, swap };
        self.push_wr(atomic_wr(op, result, remote)?)
    }

    /// Adds a fetch-and-add (see [`Channel::fetch_add`]); refused as `compare_swap` is.
    pub fn fetch_add(
        &mut self,
        result: &'b mut SgeMut<'b>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<&mut Self, ChannelError> {
        self.push_wr(atomic_wr(AtomicOp::FetchAdd(add), result, remote)?)
    }
}

impl<'env, P: Provider, B: Backoff, const R: usize> Scope<'_, 'env, P, B, R> {
    /// Posts a compare-and-swap (see [`Channel::compare_swap`]); the prior value is in
    /// `result` once the ticket was waited for, or the scope ended.
    pub fn compare_swap(
        &mut self,
        result: &'env mut SgeMut<'env>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<Ticket, ChannelError> {
        let op = AtomicOp::CompareSwap { compare, swap };
        self.post(atomic_wr(op, result, remote)?)
    }

    /// Posts a fetch-and-add (see [`Channel::fetch_add`]).
    pub fn fetch_add(
        &mut self,
        result: &'env mut SgeMut<'env>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<Ticket, ChannelError> {
        self.post(atomic_wr(AtomicOp::FetchAdd(add), result, remote)?)
    }
}
