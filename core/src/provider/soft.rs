//! The in-memory RC model (being written; see the module docs of [`crate::provider`]).

use core::cell::RefCell;

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::provider::{Provider, ProviderError};
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

/// Shared state of two connected in-memory queue pairs.
#[derive(Debug)]
pub struct SoftFabric {
    caps: QpCaps,
    _state: RefCell<()>,
}

/// One end of a [`SoftFabric`].
#[derive(Debug)]
pub struct SoftEnd<'f> {
    fabric: &'f SoftFabric,
    side: usize,
}

impl SoftFabric {
    /// A fabric whose queue pairs have `caps`.
    pub const fn new(caps: QpCaps) -> Self {
        Self {
            caps,
            _state: RefCell::new(()),
        }
    }

    /// The two ends.
    pub fn ends(&self) -> (SoftEnd<'_>, SoftEnd<'_>) {
        (
            SoftEnd {
                fabric: self,
                side: 0,
            },
            SoftEnd {
                fabric: self,
                side: 1,
            },
        )
    }
}

impl Provider for SoftEnd<'_> {
    fn caps(&self) -> QpCaps {
        let _ = self.side;
        self.fabric.caps
    }
    unsafe fn post_send(&mut self, _wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        Err(PostFailure {
            posted: 0,
            errno: 38,
        })
    }
    unsafe fn post_recv(&mut self, _wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        Err(PostFailure {
            posted: 0,
            errno: 38,
        })
    }
    fn poll_send(&mut self, _out: &mut [Completion]) -> Result<usize, ProviderError> {
        Ok(0)
    }
    fn poll_recv(&mut self, _out: &mut [Completion]) -> Result<usize, ProviderError> {
        Ok(0)
    }
    fn set_error(&mut self) -> Result<(), ProviderError> {
        Ok(())
    }
}
