//! The out-of-band channel a connected rank keeps, whichever rendezvous made it.

use core::time::Duration;

use crate::error::Result;
use crate::exchange::Session;
#[cfg(feature = "pmix")]
use crate::pmix::PmixSession;

/// What [`connect_launch`](crate::connect_launch) leaves open beside the node for later
/// out-of-band rounds: the TCP [`Session`] of a cluster-file start, or the
/// [`PmixSession`](crate::pmix::PmixSession) of a start under a PMIx launcher.
///
/// Both give the same rounds under the same names, so code that only calls
/// [`allgather`](Self::allgather) and [`close`](Self::close) does not care how it was
/// started; code that needs one kind (the TCP connections, the PMIx local rank) matches.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutOfBand {
    /// The TCP session of the config-file rendezvous: one connection per peer on rank 0,
    /// one to rank 0 elsewhere.
    Tcp(Session),
    /// Rounds through the launcher's PMIx server (feature `pmix`).
    #[cfg(feature = "pmix")]
    Pmix(PmixSession),
}

impl OutOfBand {
    /// This process's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        match self {
            Self::Tcp(s) => s.rank(),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => s.rank(),
        }
    }

    /// Number of ranks.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        match self {
            Self::Tcp(s) => s.world_size(),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => s.world_size(),
        }
    }

    /// Sets the overall deadline of each later round.
    pub fn set_timeout(&mut self, timeout: Duration) {
        match self {
            Self::Tcp(s) => s.set_timeout(timeout),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => s.set_timeout(timeout),
        }
    }

    /// One round: every rank contributes `bytes` and receives everyone's contribution,
    /// indexed by rank; doubles as an out-of-band barrier. See [`Session::allgather`] and
    /// [`PmixSession::allgather`](crate::pmix::PmixSession::allgather).
    ///
    /// # Errors
    /// Those of the session's own `allgather`.
    pub fn allgather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self {
            Self::Tcp(s) => s.allgather(bytes),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => s.allgather(bytes),
        }
    }

    /// Closes the TCP connections, or finalizes PMIx.
    ///
    /// # Errors
    /// Those of the session's own `close`.
    pub fn close(self) -> Result<()> {
        match self {
            Self::Tcp(s) => s.close(),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => s.close(),
        }
    }

    /// Leaves because of an error: a TCP session's goodbye carries `reason`
    /// ([`Session::leave_on_error`]); a PMIx session is finalized (the launcher ends the job
    /// when the process exits with an error).
    ///
    /// # Errors
    /// Those of the session's own close.
    pub fn leave_on_error(self, reason: &str) -> Result<()> {
        match self {
            Self::Tcp(s) => s.leave_on_error(reason),
            #[cfg(feature = "pmix")]
            Self::Pmix(s) => {
                let _ = reason;
                s.close()
            }
        }
    }

    /// The TCP session, if the rank was started from a cluster file.
    #[must_use]
    pub fn as_tcp(&mut self) -> Option<&mut Session> {
        match self {
            Self::Tcp(s) => Some(s),
            #[cfg(feature = "pmix")]
            Self::Pmix(_) => None,
        }
    }
}

impl From<Session> for OutOfBand {
    fn from(session: Session) -> Self {
        Self::Tcp(session)
    }
}

#[cfg(feature = "pmix")]
impl From<PmixSession> for OutOfBand {
    fn from(session: PmixSession) -> Self {
        Self::Pmix(session)
    }
}
