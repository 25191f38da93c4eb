//! One call from a cluster configuration and a rank to a connected [`Node`].

use core::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::node::{NodeConfig, NodeError, PreparedNode, ReadmitError, Receive, VerbsNode};
use rverbs_core::params::PsnSource;
use rverbs_core::verbs::{open_device, DeviceList, QpConfig};
use rverbs_std_shim::{Monotonic, StdBackoff, WaitPolicy, MONOTONIC, PSN_SOURCE};

use crate::config::ClusterConfig;
use crate::error::{BootstrapError, Result};
use crate::exchange::{exchange, exchange_rejoin, ExchangeOptions, NodeBlobs, Watch, RANK_ZERO};
use crate::oob::OutOfBand;
use crate::secret::JobSecret;

/// Settings for [`connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The TCP exchange (job id, timeouts). The job id defaults to the config's. Its
    /// `personalize` is always [`NodeBlobs`]: each rank receives only the endpoint every peer
    /// made for it, O(world) bytes instead of O(world²).
    pub exchange: ExchangeOptions,
    /// The node (queue pairs, window, barrier algorithm). Port and GID index come from the
    /// rank's config entry. Every queue pair draws its first PSN from the OS
    /// ([`rverbs_std_shim::PSN_SOURCE`]), including those of a readmission: a
    /// [`PsnSource::Predictable`] left here (by a `NodeConfig::default()`) is replaced by it,
    /// so that no std path builds queue pairs a forged packet could predict
    /// (docs/security.md). [`PsnSource::Fixed`] is kept as given.
    pub node: NodeConfig,
    /// What waits do between empty polls: [`WaitPolicy::Spin`] on dedicated cores, the
    /// default `Sleep { spins: 64, pause: 20 µs }` when ranks may outnumber cores, or
    /// [`WaitPolicy::Block`], which turns on the node's completion events
    /// ([`NodeConfig::completion_events`]) and sleeps on them (see
    /// [`rverbs_std_shim::backoff`]).
    pub wait: WaitPolicy,
    /// Deadline of the first barrier, which proves every connection works.
    pub first_barrier_timeout: Duration,
}

impl ConnectOptions {
    /// Defaults for `config`: its job id, 60 s exchange timeout, 30 s first barrier, and
    /// [`WaitPolicy::default()`] (spin 64 empty polls, then sleep 20 µs on each further one),
    /// the policy the README recommends for VMs and oversubscribed machines:
    ///
    /// ```
    /// use std::time::Duration;
    /// use rverbs_bootstrap::{ClusterConfig, ConnectOptions};
    /// use rverbs_std_shim::WaitPolicy;
    ///
    /// let cfg = ClusterConfig::from_json_str(
    ///     r#"{"ranks": [{"rank": 0, "host": "127.0.0.1", "port": 17000, "device": "rxe0"}]}"#,
    ///     "inline",
    /// )?;
    /// let mut opts = ConnectOptions::for_config(&cfg);
    /// assert_eq!(opts.wait, WaitPolicy::Sleep { spins: 64, pause: Duration::from_micros(20) });
    /// opts.wait = WaitPolicy::Spin; // on dedicated cores
    /// # Ok::<(), rverbs_bootstrap::BootstrapError>(())
    /// ```
    pub fn for_config(config: &ClusterConfig) -> Self {
        Self {
            exchange: ExchangeOptions {
                job_id: config.job_id(),
                personalize: Some(&NodeBlobs),
                ..ExchangeOptions::default()
            },
            node: std_node_config(),
            wait: WaitPolicy::default(),
            first_barrier_timeout: Duration::from_secs(30),
        }
    }
}

/// The defaults of [`ConnectOptions::for_config`] with job id 0: what a start without a
/// cluster file uses (under PMIx the job is the launcher's namespace; the job id is unused).
impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            exchange: ExchangeOptions {
                personalize: Some(&NodeBlobs),
                ..ExchangeOptions::default()
            },
            node: std_node_config(),
            wait: WaitPolicy::default(),
            first_barrier_timeout: Duration::from_secs(30),
        }
    }
}

/// [`NodeConfig::default()`] with queue pairs whose first PSNs are drawn from the OS.
fn std_node_config() -> NodeConfig {
    let mut node = NodeConfig::default();
    node.qp.send_psn = PSN_SOURCE;
    node
}

/// A connected rank: the node, the bootstrap session (for out-of-band rounds) and a clock.
#[derive(Debug)]
pub struct Connected {
    /// The node.
    pub node: VerbsNode<StdBackoff>,
    /// The out-of-band session, still open (use it for out-of-band all-gathers or close it):
    /// the TCP [`Session`](crate::Session) after a cluster-file start, the PMIx session under
    /// a PMIx launcher. Closing or dropping a TCP session tells the peers goodbye; a rank
    /// whose process dies never does, and its peers' watches report it.
    pub session: OutOfBand,
    /// After a cluster-file start, watches the TCP session's connections: when a rank's
    /// connection closes without a goodbye (its process died), it raises
    /// [`FailureCause::SessionClosed`] on the node's
    /// [failure alarm](rverbs_core::node::Node::failure_alarm); the node passes the news on,
    /// so every rank's next wait fails naming that rank. Dropping it stops watching. `None`
    /// under PMIx (the launcher ends the job when a rank dies).
    pub watch: Option<Watch>,
    /// The clock barriers and timeouts use (the same one every channel of the node keeps).
    pub clock: Monotonic,
    /// The settings the node's queue pairs were made with, for a readmitted rank's.
    qp: QpConfig,
    /// The barrier algorithm the node was configured with: a new process's first barrier
    /// runs it, so the barrier closing a readmission does too.
    algorithm: BarrierAlgorithm,
}

impl Connected {
    /// Readmits rank `rank`, which failed and was started again with the same configuration
    /// ([`rejoin`]): every surviving rank calls it at the same time (once its node knows of
    /// the failure, or as soon as the job decides to; a barrier in progress is abandoned).
    /// Returns once every rank, the new process included, has passed a barrier over the
    /// whole world (with the algorithm the node was configured with, [`NodeConfig::algorithm`],
    /// as the new process's first barrier): from then on barriers run as before, every count
    /// having started again from zero. Every wait is bounded by `timeout` (rank 0 waits that long for the new
    /// process and every survivor).
    ///
    /// What happens (see `rverbs_core::node`'s "When a rank rejoins"): the node settles its
    /// queue pairs and makes a new one for the new process; rank 0 collects every survivor's
    /// endpoint for it and takes the new process's hello on the rendezvous listener it kept;
    /// every survivor connects its new queue pair and resets its barrier counters and flag
    /// array; an all-gather round and a barrier close it. The session watch is stopped
    /// meanwhile and started again with the new process's connection.
    ///
    /// # Errors
    /// [`BootstrapError::Readmit`] when it cannot work, saying why: `rank` is 0 (the
    /// rendezvous died with it), the job was started under a PMIx launcher (no rendezvous),
    /// or the node uses messaging or barrier wake-ups ([`BootstrapError::Rdma`] with
    /// [`ReadmitError`]); the errors of the exchange when the new process or a survivor does
    /// not come in time (rank 0's names them); [`BootstrapError::Rdma`] for the queue pairs
    /// and the closing barrier. After an error the node stays poisoned and the session is
    /// poisoned: restart every rank.
    pub fn readmit(&mut self, rank: u32, timeout: Duration) -> Result<()> {
        let me = self.node.rank();
        let refuse = |reason: &str| BootstrapError::Readmit {
            rank: me,
            rejoiner: rank,
            reason: reason.to_owned(),
        };
        if rank == 0 {
            return Err(refuse(RANK_ZERO));
        }
        let device = self.node.pd().context().name().to_owned();
        let rdma = |source| BootstrapError::Rdma {
            rank: me,
            device: device.clone(),
            source,
        };
        let Some(session) = self.session.as_tcp() else {
            return Err(refuse(
                "the job was started under a PMIx launcher, which ends the job when a rank \
                 dies: there is no rendezvous for a new process to rejoin through",
            ));
        };
        // News about the failed rank's old connection must not reach the world it rejoins.
        self.watch = None;
        let (node, qp, clock, algorithm) = (&mut self.node, &self.qp, &self.clock, self.algorithm);
        let result = (|| {
            let (prepared, blob) = node.readmit_prepare(rank, qp).map_err(rdma)?;
            let theirs = session.readmit(rank, &blob, timeout)?;
            node.readmit_connect(prepared, &theirs).map_err(rdma)?;
            // Nobody starts a barrier before every rank has reset its counters.
            session.allgather(b"readmitted")?;
            let members: Vec<u32> = (0..node.world_size()).collect();
            node.barrier_group(&members, algorithm, clock, timeout)
                .map_err(rdma)
        })();
        let watch = watch_session(&self.session, &self.node);
        match watch {
            Ok(w) => self.watch = w,
            Err(e) if result.is_ok() => return Err(e),
            Err(_) => {}
        }
        result
    }
}

/// Starts the watch over a TCP session's connections (none under PMIx): a rank whose
/// connection closes without a goodbye is raised on the node's failure alarm.
fn watch_session(session: &OutOfBand, node: &VerbsNode<StdBackoff>) -> Result<Option<Watch>> {
    match session {
        OutOfBand::Tcp(tcp) => {
            let alarm = node.failure_alarm();
            let rank = node.rank();
            Ok(Some(tcp.watch(move |lost| {
                alarm.raise(Failure {
                    rank: lost,
                    cause: FailureCause::SessionClosed,
                    reporter: rank,
                });
            })?))
        }
        #[allow(unreachable_patterns)] // without feature `pmix`, TCP is the only session
        _ => Ok(None),
    }
}

/// Opens this rank's device, builds its node, exchanges endpoints with every rank over TCP,
/// connects every queue pair, waits until all ranks are connected, and runs a first barrier.
///
/// To start without a cluster file under mpirun or srun, see [`connect_launch`](crate::connect_launch).
pub fn connect(config: &ClusterConfig, rank: u32, opts: &ConnectOptions) -> Result<Connected> {
    start(config, rank, opts, false)
}

/// [`connect`] for a rank started again after it failed, while the other ranks still run:
/// the same configuration and options as its first start, and its survivors call
/// [`Connected::readmit`] for it at the same time. Rank 0 takes this process's hello in
/// place of the old one's (refusing it while the old process is still connected) and sends
/// it every survivor's endpoint; then it connects, joins an all-gather round and passes a
/// barrier with every rank, like [`connect`].
///
/// # Errors
/// Those of [`connect`], and [`BootstrapError::Readmit`] for rank 0 (the rendezvous died
/// with it: restart every rank) and for options a survivor cannot readmit (barrier
/// wake-ups, a shared receive queue). A rank 0 that turns the hello away says why
/// ([`BootstrapError::Rejected`]: another job, another world size, the old process still
/// connected, ...); one whose survivors do not readmit this rank in time leaves it with a
/// timeout.
pub fn rejoin(config: &ClusterConfig, rank: u32, opts: &ConnectOptions) -> Result<Connected> {
    let refuse = |reason: String| BootstrapError::Readmit {
        rank,
        rejoiner: rank,
        reason,
    };
    if rank == 0 {
        return Err(refuse(RANK_ZERO.to_owned()));
    }
    if opts.node.barrier_wakeups {
        return Err(refuse(ReadmitError::Wakeups.to_string()));
    }
    if matches!(opts.node.receive, Receive::Shared { .. }) {
        return Err(refuse(ReadmitError::SharedReceive.to_string()));
    }
    start(config, rank, opts, true)
}

/// [`connect`], or [`rejoin`] with `again`.
fn start(
    config: &ClusterConfig,
    rank: u32,
    opts: &ConnectOptions,
    again: bool,
) -> Result<Connected> {
    let world = config.world_size();
    let entry = config.get(rank).ok_or(BootstrapError::RankOutOfRange {
        rank,
        world_size: world,
    })?;
    // Without a secret in the options, RVERBS_JOB_SECRET_FILE or RVERBS_JOB_SECRET may
    // give one; a bad one fails before the device is opened.
    let secret = match &opts.exchange.secret {
        Some(secret) => Some(secret.clone()),
        None => JobSecret::from_env()?,
    };
    if let Ok(list) = DeviceList::new() {
        let names: Vec<&str> = list.iter().map(|d| d.name()).collect();
        config.validate_local_device(rank, &names)?;
    }
    let place = Placement {
        rank,
        world,
        device: entry.device.clone(),
        port: entry.ib_port,
        gid_index: entry.gid_index,
    };
    establish(&place, opts, |blob, exchange_opts| {
        let exchange_opts = ExchangeOptions {
            secret,
            ..exchange_opts.clone()
        };
        let (session, blobs) = if again {
            exchange_rejoin(config, rank, blob, &exchange_opts)?
        } else {
            exchange(config, rank, blob, &exchange_opts)?
        };
        Ok((OutOfBand::Tcp(session), blobs))
    })
}

/// Where a rank runs: what [`establish`] needs besides the options and the rendezvous.
pub(crate) struct Placement {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) device: String,
    pub(crate) port: u8,
    pub(crate) gid_index: Option<u8>,
}

/// Everything after choosing the device: node, rendezvous (`rendezvous` gets this rank's node
/// blob and the exchange options, returns the session and the blobs, addressed for this
/// rank), handshake, an out-of-band round and the first barrier.
pub(crate) fn establish<F>(
    place: &Placement,
    opts: &ConnectOptions,
    rendezvous: F,
) -> Result<Connected>
where
    F: FnOnce(&[u8], &ExchangeOptions) -> Result<(OutOfBand, Vec<Vec<u8>>)>,
{
    let rank = place.rank;
    let rdma = |source: NodeError| BootstrapError::Rdma {
        rank,
        device: place.device.clone(),
        source,
    };
    let ctx = open_device(&place.device).map_err(|e| rdma(NodeError::Verbs(e)))?;
    let mut node_cfg = opts.node;
    if node_cfg.qp.send_psn == PsnSource::Predictable {
        node_cfg.qp.send_psn = PSN_SOURCE;
    }
    node_cfg.qp.port = place.port;
    if let Some(g) = place.gid_index {
        node_cfg.qp.gid_index = Some(g);
    }
    // A blocking policy sleeps on completion events: the queues must raise them.
    if matches!(opts.wait, WaitPolicy::Block { .. }) {
        node_cfg.completion_events = true;
    }
    let backoff: StdBackoff = opts.wait.backoff();
    let prepared =
        PreparedNode::new(&ctx, rank, place.world, node_cfg, backoff, &MONOTONIC).map_err(rdma)?;
    // The blob is a node blob whatever the caller left in `personalize`.
    let exchange_opts = ExchangeOptions {
        personalize: Some(&NodeBlobs),
        ..opts.exchange.clone()
    };
    let (mut session, blobs) = rendezvous(&prepared.blob(), &exchange_opts)?;
    let mut node = prepared.handshake(&blobs).map_err(rdma)?;
    // Nobody writes before every queue pair in the world is ready to receive.
    session.allgather(b"connected")?;
    let clock = MONOTONIC;
    node.barrier(&clock, opts.first_barrier_timeout)
        .map_err(rdma)?;
    let watch = watch_session(&session, &node)?;
    Ok(Connected {
        node,
        session,
        watch,
        clock,
        qp: node_cfg.qp,
        algorithm: node_cfg.algorithm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_paths_draw_first_psns() {
        // Every way to get options for connect, rejoin and readmission draws PSNs from the OS.
        assert!(ConnectOptions::default().node.qp.send_psn.is_drawn());
        let cfg = ClusterConfig::from_json_str(
            r#"{"ranks": [{"rank": 0, "host": "127.0.0.1", "port": 17000, "device": "rxe0"}]}"#,
            "inline",
        )
        .unwrap();
        assert!(ConnectOptions::for_config(&cfg).node.qp.send_psn.is_drawn());
        // Two drawn PSNs in a row are not the same one (chance of a false failure: 2^-24).
        let draw = |s: PsnSource| s.first_psn(0x11).unwrap();
        assert_ne!(draw(PSN_SOURCE), draw(PSN_SOURCE));
    }
}
