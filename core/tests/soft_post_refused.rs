//! A post the provider refuses with nothing taken leaves the channel as it was: healthy, and
//! with its signaling count unchanged, so the requests posted after it still get a signaled
//! one within every `signal_every` and a later post never waits for room that no completion
//! will free.
#![allow(clippy::std_instead_of_core)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::completion::Completion;
use rverbs_core::memory::AccessFlags;
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::{StaticClock, StepClock};
use rverbs_core::provider::soft::{Side, SoftEnd, SoftFabric};
use rverbs_core::provider::{Provider, ProviderError, QueuePair};
use rverbs_core::wr::{PostFailure, RecvRequest, WorkRequest};

macro_rules! clock {
    () => {{
        static CLOCK: StepClock = StepClock::new(Duration::from_millis(1));
        &CLOCK as StaticClock
    }};
}

/// The model's end, refusing the next send post (taking nothing, `ENOMEM`) when told to:
/// what a device does with a request it cannot take at the head of a chain.
struct Refusing<'f> {
    end: SoftEnd<'f>,
    refuse: Rc<Cell<bool>>,
}

impl QueuePair for Refusing<'_> {
    fn caps(&self) -> QpCaps {
        self.end.caps()
    }
    fn qp_num(&self) -> u32 {
        QueuePair::qp_num(&self.end)
    }
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        if self.refuse.replace(false) {
            return Err(PostFailure {
                posted: 0,
                errno: 12,
            });
        }
        // SAFETY: forwarded posting contract.
        unsafe { self.end.post_send(wrs) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.end.post_recv(wrs) }
    }
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.end.set_error()
    }
}

impl Provider for Refusing<'_> {
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.end.poll_send(out)
    }
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.end.poll_recv(out)
    }
}

#[test]
fn a_refused_post_does_not_count_toward_the_signaling_interval() {
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let mut mem = [0u8; 64];
    let f = SoftFabric::new(caps, RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let dst = f
        .register(
            Side::B,
            &mut mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let refuse = Rc::new(Cell::new(false));
    let end = Refusing {
        end: ea,
        refuse: refuse.clone(),
    };
    let mut a = Channel::new(
        end,
        ChannelConfig::with_timeout(Duration::from_millis(200)),
        clock!(),
    );
    let k = a.signal_every() as usize;
    let max_post = a.max_post();
    // The geometry this test needs: the unsignaled requests a wrong count lets through
    // (almost 2k) plus a full batch exceed the send queue.
    assert!(2 * (k - 1) + max_post > 31, "k {k}, max_post {max_post}");
    let at = |i: usize| dst.remote().slice((i % 8 * 8) as u64, 8).unwrap();

    // k - 1 unsignaled requests: the next one is signaled.
    for i in 0..k - 1 {
        a.post_write_inline(&[1; 8], at(i)).unwrap();
    }
    // That one is refused, nothing taken: the channel stays healthy.
    refuse.set(true);
    let e = a.post_write_inline(&[2; 8], at(0)).unwrap_err();
    assert_eq!(e, ChannelError::Post { errno: 12 });
    assert_eq!(a.failure(), None);
    assert_eq!(a.outstanding_sends(), (k - 1) as u64);

    // k - 1 more: if the refused one counted as signaled, none of these is.
    for i in 0..k - 1 {
        a.post_write_inline(&[3; 8], at(i)).unwrap();
    }
    // A full batch needs room only a signaled completion frees.
    let data = [4u8; 8];
    let mut batch = a.batch();
    for i in 0..max_post {
        batch.write_inline(&data, at(i)).unwrap();
    }
    batch.run().unwrap();
    a.wait_all().unwrap();
    assert_eq!(a.outstanding_sends(), 0);
    let mut got = [0u8; 8];
    assert!(dst.read_into(0, &mut got));
    assert_eq!(got, data);
}
