//! A rank that rejoins a running world: the restarted process's exchange (a `Rejoin` in
//! place of the `Hello`), and the survivors' round that readmits it (a `Readmit` in place of
//! a `Sync`). Rank 0 is the rendezvous for both, on the listener its exchange kept.

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;

use crate::config::ClusterConfig;
use crate::wire::FrameKind;

use super::node_blobs::NodeBlobs;
use super::peer::peer_round;
use super::progress::Progress;
use super::root::root_readmit;
use super::round_timer::RoundTimer;
use super::session::{Link, Session};
use super::{peer_session, ExchangeOptions};

/// Why a world cannot readmit its rank 0.
pub(crate) const RANK_ZERO: &str = "rank 0 holds the rendezvous (every rank's bootstrap \
    connection leads to it); a job whose rank 0 failed cannot readmit it: restart every rank";

impl Session {
    /// A survivor's part in readmitting `rejoiner`, a rank whose process failed and was
    /// started again ([`exchange_rejoin`]): sends rank 0 `own` (this rank's rverbs-core node
    /// blob addressed to the new process, see [`rverbs_core::wire::node`]) and returns the
    /// new process's node blob addressed to this rank. Every survivor calls it at the same
    /// time. Rank 0 first waits for every survivor's part and for the new process, all within
    /// `timeout`, on the listener its exchange kept; then its connection to the new process
    /// takes the place of the old one, and later rounds include it.
    /// [`Connected::readmit`](crate::Connected::readmit) is this round with the node's steps
    /// around it.
    ///
    /// # Errors
    /// [`ExchangeError::Readmit`] for rank 0 (the rendezvous died with it) and for a
    /// poisoned session; the errors of [`Session::allgather`] otherwise, rank 0's timeout
    /// naming the new process or the survivors that did not come. A failed round poisons the
    /// session.
    pub fn readmit(&mut self, rejoiner: u32, own: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let (rank, world_size) = (self.rank(), self.world_size());
        let refuse = |reason: &str| {
            BootstrapError::Exchange(ExchangeError::Readmit {
                rank,
                rejoiner,
                reason: reason.to_owned(),
            })
        };
        if rejoiner == 0 {
            return Err(refuse(RANK_ZERO));
        }
        if rejoiner >= world_size {
            return Err(BootstrapError::Exchange(ExchangeError::RankOutOfRange {
                rank: rejoiner,
                world_size,
            }));
        }
        if rejoiner == rank {
            return Err(refuse(
                "a rank does not readmit itself: its new process calls rejoin()",
            ));
        }
        if self.poisoned {
            return Err(refuse(
                "an earlier round of this rank's bootstrap session failed, so its connection \
                 to rank 0 cannot carry the readmission",
            ));
        }
        let clock = RoundTimer::start(timeout);
        let mut progress = Progress::new(self.options().progress, clock, timeout);
        let options = self.options().clone();
        let outcome = match (&mut self.link, &self.listener) {
            (Link::Root(peers), Some(listener)) => root_readmit(
                listener,
                peers,
                world_size,
                rejoiner,
                own,
                &options,
                clock,
                &mut progress,
            ),
            (Link::Root(_), None) => Err(refuse(
                "rank 0's rendezvous listener is closed (the session was not made by an \
                 exchange)",
            )),
            (Link::Peer(link), _) => peer_round(
                link,
                FrameKind::Readmit,
                Some(&NodeBlobs),
                rank,
                world_size,
                own,
                &options,
                clock,
                &mut progress,
            )
            .and_then(|mut blobs| {
                let theirs = core::mem::take(&mut blobs[rejoiner as usize]);
                if theirs.is_empty() {
                    return Err(BootstrapError::Exchange(ExchangeError::Unexpected {
                        rank,
                        peer: Some(0),
                        addr: link.addr.clone(),
                        reason: format!("the readmission table has no entry for rank {rejoiner}"),
                    }));
                }
                Ok(theirs)
            }),
            (Link::Alone, _) => Err(refuse("a world of one has nobody to readmit")),
        };
        if outcome.is_err() {
            self.poisoned = true;
        }
        outcome
    }
}

/// The exchange of a rank whose process failed and was started again while the others run:
/// like [`exchange`](super::exchange) for a rank other than 0 with node blobs
/// ([`NodeBlobs`]), but it opens with a `Rejoin`, which the rank 0 of a running world takes
/// while the survivors readmit this rank ([`Session::readmit`]), and it receives each
/// survivor's endpoint for it (this rank's own entry is `blob`). The session it returns is
/// an ordinary one: later rounds include every rank.
///
/// # Errors
/// [`ExchangeError::Readmit`] for rank 0; otherwise those of [`exchange`](super::exchange)
/// (rank 0 says why it refused the hello, for example that the old process is still
/// connected).
pub fn exchange_rejoin(
    config: &ClusterConfig,
    rank: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> Result<(Session, Vec<Vec<u8>>)> {
    let world_size = config.world_size();
    if rank >= world_size {
        return Err(BootstrapError::Exchange(ExchangeError::RankOutOfRange {
            rank,
            world_size,
        }));
    }
    if rank == 0 {
        return Err(BootstrapError::Exchange(ExchangeError::Readmit {
            rank,
            rejoiner: rank,
            reason: RANK_ZERO.to_owned(),
        }));
    }
    let root = config.rank(0);
    peer_session(
        &root.host,
        root.port,
        FrameKind::Rejoin,
        rank,
        world_size,
        blob,
        options,
    )
}
