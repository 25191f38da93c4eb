//! One call from a cluster configuration and a rank to a connected
//! [`Node`](rverbs_core::node::Node).

use crate::error::{BootstrapError, ExchangeError, RdmaError, Result};
use core::time::Duration;
use rverbs_core::node::Members;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::node::{Component, NodeConfig, NodeError, PreparedNode, SetupError, VerbsNode};
use rverbs_core::params::PsnSource;
use rverbs_core::verbs::{open_device, DeviceList, QpConfig};
use rverbs_std_shim::{Monotonic, StdBackoff, WaitPolicy, MONOTONIC, PSN_SOURCE};

use crate::config::ClusterConfig;
use crate::device_watch::{DeviceWatch, SeenEvent, WatchedNode};
use crate::exchange::{
    exchange, exchange_rejoin, Departure, ExchangeOptions, NodeBlobs, Watch, RANK_ZERO,
};
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
    /// Called with the rank and every asynchronous event of the device as the
    /// [device watch](Connected::device_watch) reads it (on the watch's thread): to print or
    /// log them as they happen. `None`: they are only kept in the watch's log.
    pub on_device_event: Option<fn(u32, &SeenEvent)>,
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
        Self::for_job(config.job_id())
    }

    /// The defaults, with `job_id` the job's.
    fn for_job(job_id: u64) -> Self {
        Self {
            exchange: ExchangeOptions {
                job_id,
                personalize: Some(&NodeBlobs),
                ..ExchangeOptions::default()
            },
            node: std_node_config(),
            wait: WaitPolicy::default(),
            first_barrier_timeout: Duration::from_secs(30),
            on_device_event: None,
        }
    }
}

/// The defaults of [`ConnectOptions::for_config`] with job id 0: what a start without a
/// cluster file uses (under PMIx the job is the launcher's namespace; the job id is unused).
impl Default for ConnectOptions {
    fn default() -> Self {
        Self::for_job(0)
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
    /// a PMIx launcher. Closing a TCP session tells the peers goodbye; a process that gives
    /// up ([`Connected::leave_on_error`], or a session dropped without being closed) tells
    /// them so and why; a rank whose process dies says nothing; either way the peers'
    /// watches report it.
    pub session: OutOfBand,
    /// After a cluster-file start, watches the TCP session's connections: when a rank's
    /// connection closes without a goodbye (its process died), it raises
    /// [`FailureCause::SessionClosed`] on the node's
    /// [failure alarm](rverbs_core::node::Node::failure_alarm), and when its goodbye says it
    /// gave up, [`FailureCause::LeftOnError`] (its words: [`Connected::departure`]); the
    /// node passes the news on, so every rank's next wait fails naming that rank. While this
    /// rank's own port (or the interface under it) is down, a departure is news of that
    /// instead: [`FailureCause::PortDown`] naming this rank, not the peer. Dropping it
    /// stops watching. `None` under PMIx (the launcher ends the job when a rank dies).
    pub watch: Option<Watch>,
    /// What ranks that gave up said, by rank (filled by the watch).
    departures: Departures,
    /// Reads the device's asynchronous events: a port of this rank's that goes down, the
    /// device failing, or a queue pair to a peer that the device moved to the error state is
    /// raised on the node's failure alarm at once (see [`crate::device_watch`]); every event
    /// is kept in its log. Dropping it stops watching. `None` only if the watch could not
    /// start (the node works as before; failures are seen when requests fail or time out).
    pub device_watch: Option<DeviceWatch>,
    /// The clock barriers and timeouts use (the same one every channel of the node keeps).
    pub clock: Monotonic,
    /// The settings the node's queue pairs were made with, for a readmitted rank's.
    qp: QpConfig,
    /// The device-event callback of the options the rank connected with.
    on_device_event: Option<fn(u32, &SeenEvent)>,
    /// The barrier algorithm the node was configured with: a new process's first barrier
    /// runs it, so the barrier closing a readmission does too.
    algorithm: BarrierAlgorithm,
}

/// What the ranks that gave up said, shared with the watch thread.
type Departures = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u32, String>>>;

impl Connected {
    /// What rank `rank` said when it left because of an error (its goodbye's reason, as its
    /// process wrote it, control characters replaced), if this rank's watch saw it leave so:
    /// the words behind a [`FailureCause::LeftOnError`]. Under PMIx, always `None`.
    #[must_use]
    pub fn departure(&self, rank: u32) -> Option<String> {
        self.departures
            .lock()
            .ok()
            .and_then(|d| d.get(&rank).cloned())
    }

    /// Says that this rank's own port is down, if it is: `"port 1 of rxe0 is down (state
    /// DOWN)"`. For an error message: a local completion error (`WcStatus::is_local`) or a
    /// peer that stopped answering is this rank's own fault when its port went down. Queries
    /// the device (not for the data path).
    #[must_use]
    pub fn port_note(&self) -> Option<String> {
        let ctx = self.node.pd().context();
        port_down(ctx, self.qp.port).map(|state| {
            format!(
                "port {} of {} is down (state {state})",
                self.qp.port,
                ctx.name()
            )
        })
    }

    /// The device port the node's queue pairs use (for its counters:
    /// `rverbs_std_shim::counters::PortCounters::read`).
    #[must_use]
    pub fn port(&self) -> u8 {
        self.qp.port
    }

    /// Leaves the job because of an error: tells every connected rank `reason` in the
    /// session's goodbye, so each peer's watch raises [`FailureCause::LeftOnError`] naming
    /// this rank and every peer's next wait fails at once (instead of at its timeout, as it
    /// would if it took this for a normal exit), then drops the node. It returns once every
    /// peer acknowledged the goodbye, or after [`ExchangeOptions::goodbye_linger`] (10 s by
    /// default): a goodbye written while this rank's own link is down crosses as soon as the
    /// link is back. [`OutOfBand::close`] is the normal exit. Under PMIx the session is finalized (the launcher ends the job
    /// when the process exits with an error).
    ///
    /// # Errors
    /// Those of the session's close.
    pub fn leave_on_error(self, reason: &str) -> Result<()> {
        let Self {
            node,
            session,
            watch,
            ..
        } = self;
        // The goodbye first: stopping the watch waits for its thread's next tick (up to
        // 100 ms), and the peers should not wait for that. The session marks itself closing
        // before it says goodbye, so its own watch does not take the shutdown for news.
        let r = session.leave_on_error(reason);
        drop(watch);
        drop(node);
        r
    }

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
    /// [`ExchangeError::Readmit`] when it cannot work, saying why: `rank` is 0 (the
    /// rendezvous died with it), the job was started under a PMIx launcher (no rendezvous),
    /// or the node was built without readmission ([`BootstrapError::Rdma`] with
    /// [`NodeError::NotBuiltWith`]; choose it in `NodeConfig::components`); the errors of the exchange when the new process or a survivor does
    /// not come in time (rank 0's names them); [`BootstrapError::Rdma`] for the queue pairs
    /// and the closing barrier. After an error the node stays poisoned and the session is
    /// poisoned: restart every rank.
    pub fn readmit(&mut self, rank: u32, timeout: Duration) -> Result<()> {
        let me = self.node.rank();
        let refuse = |reason: &str| {
            BootstrapError::Exchange(ExchangeError::Readmit {
                rank: me,
                rejoiner: rank,
                reason: reason.to_owned(),
            })
        };
        if rank == 0 {
            return Err(refuse(RANK_ZERO));
        }
        let device = self.node.pd().context().name().to_owned();
        let rdma = |source| {
            BootstrapError::Rdma(RdmaError::Node {
                rank: me,
                device: device.clone(),
                source: Box::new(source),
            })
        };
        let Some(session) = self.session.as_tcp() else {
            return Err(refuse(
                "the job was started under a PMIx launcher, which ends the job when a rank \
                 dies: there is no rendezvous for a new process to rejoin through",
            ));
        };
        // News about the failed rank's old connection must not reach the world it rejoins.
        self.watch = None;
        // The watch names queue pairs by a table taken at start: the new one is not in it.
        self.device_watch = None;
        let (node, qp, algorithm) = (&mut self.node, &self.qp, self.algorithm);
        let result = (|| {
            let (prepared, blob) = node.readmit_prepare(rank, qp).map_err(rdma)?;
            let theirs = session.readmit(rank, &blob, timeout)?;
            node.readmit_connect(prepared, &theirs).map_err(rdma)?;
            // Nobody starts a barrier before every rank has reset its counters. The round
            // waits `timeout` like every other step here, not the session's own timeout
            // (which was set for the start and may be much longer).
            let kept = session.options().timeout;
            session.set_timeout(timeout);
            let gathered = session.allgather(b"readmitted");
            session.set_timeout(kept);
            gathered?;
            // A list of every rank, not `Members::World`: the same barrier every rank runs
            // after readmission, whatever its node's own algorithm setting.
            let members: Vec<u32> = (0..node.world_size()).collect();
            let alg = node.algorithm();
            node.set_algorithm(algorithm);
            let r = node.barrier_timeout(&members, timeout).map_err(rdma);
            node.set_algorithm(alg);
            r
        })();
        self.device_watch = watch_device(&self.node, self.qp.port, self.on_device_event);
        let probe = crate::device_watch::link_probe(self.node.pd().context(), self.qp.port);
        let watch = watch_session(&self.session, &self.node, &self.departures, probe);
        match watch {
            Ok(w) => self.watch = w,
            Err(e) if result.is_ok() => return Err(e),
            Err(_) => {}
        }
        result
    }
}

/// The state of `port` of `ctx` by name, if the port is not active (or cannot be queried:
/// then "unknown").
fn port_down(ctx: &rverbs_core::verbs::Context, port: u8) -> Option<&'static str> {
    match ctx.query_port(port) {
        Ok(p) if p.active => None,
        Ok(p) => Some(match p.state {
            0 => "NOP",
            1 => "DOWN",
            2 => "INIT",
            3 => "ARMED",
            5 => "ACTIVE_DEFER",
            _ => "unknown",
        }),
        Err(_) => Some("unknown (the port query failed)"),
    }
}

/// Starts the watch over a TCP session's connections (none under PMIx): a rank whose
/// connection closes without a deliberate goodbye is raised on the node's failure alarm,
/// and the words of one that gave up are kept in `departures`; while this rank's own port
/// (or the interface under it) is down, as `probe` says, the news names this rank's port
/// instead (see [`departure_news`]).
fn watch_session(
    session: &OutOfBand,
    node: &VerbsNode<StdBackoff>,
    departures: &Departures,
    probe: impl Fn() -> Option<FailureCause> + Send + 'static,
) -> Result<Option<Watch>> {
    match session {
        OutOfBand::Tcp(tcp) => {
            let alarm = node.failure_alarm();
            let watch = watch_departures(tcp, node.rank(), departures, probe, move |f| {
                alarm.raise(f);
            })?;
            Ok(Some(watch))
        }
        #[allow(unreachable_patterns)] // without feature `pmix`, TCP is the only session
        _ => Ok(None),
    }
}

/// The session watch of rank `me` over `tcp`: every departure becomes [`departure_news`]
/// (asking `probe` about this rank's own port at that moment), handed to `raise`; the words
/// of a rank that gave up are kept in `departures`.
fn watch_departures(
    tcp: &crate::Session,
    me: u32,
    departures: &Departures,
    probe: impl Fn() -> Option<FailureCause> + Send + 'static,
    raise: impl Fn(Failure) + Send + 'static,
) -> Result<Watch> {
    let departures = std::sync::Arc::clone(departures);
    tcp.watch(move |lost, how| {
        if let Departure::GaveUp(why) = &how {
            if let Ok(mut d) = departures.lock() {
                d.insert(lost, why.clone());
            }
        }
        raise(departure_news(me, lost, &how, probe()));
    })
}

/// The failure news rank `me` raises when its session watch sees rank `lost` leave `how`,
/// `local` being what its link probe says about its own port at that moment.
///
/// With its own port up: a crash is [`FailureCause::SessionClosed`] and a goodbye with a
/// reason [`FailureCause::LeftOnError`], both naming `lost`. With its own port (or the
/// interface under it) down, the news names this rank and its port instead: a connection that
/// closed while this rank was cut off closed because of it (the outage broke it, or the peer
/// gave up waiting for this rank), and blaming the peer would send whoever reads the log to
/// the wrong host. The peer's words, if it gave any, are still kept ([`Connected::departure`]).
fn departure_news(me: u32, lost: u32, how: &Departure, local: Option<FailureCause>) -> Failure {
    match (local, how) {
        (Some(cause), _) => Failure {
            rank: me,
            cause,
            reporter: me,
        },
        (None, Departure::Crashed) => Failure {
            rank: lost,
            cause: FailureCause::SessionClosed,
            reporter: me,
        },
        (None, Departure::GaveUp(_)) => Failure {
            rank: lost,
            cause: FailureCause::LeftOnError,
            reporter: me,
        },
    }
}

/// Starts the watch over the device's asynchronous events for `node`, whose queue pairs use
/// `port`; `None` if it cannot start (the node then learns of failures from its requests).
fn watch_device(
    node: &VerbsNode<StdBackoff>,
    port: u8,
    on_event: Option<fn(u32, &SeenEvent)>,
) -> Option<DeviceWatch> {
    let events = node.pd().context().async_events().ok()?;
    let rank = node.rank();
    let watched = WatchedNode {
        rank,
        port,
        qp_ranks: node.qp_ranks(),
        alarm: node.failure_alarm(),
    };
    DeviceWatch::start(events, watched, move |e| {
        if let Some(f) = on_event {
            f(rank, e);
        }
    })
    .ok()
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
/// Those of [`connect`], and [`ExchangeError::Readmit`] for rank 0 (the rendezvous died
/// with it: restart every rank) and for options that do not choose readmission
/// (`NodeConfig::components`, as every rank of a world that readmits). A rank 0 that turns the hello away says why
/// ([`ExchangeError::Rejected`]: another job, another world size, the old process still
/// connected, ...); one whose survivors do not readmit this rank in time leaves it with a
/// timeout.
pub fn rejoin(config: &ClusterConfig, rank: u32, opts: &ConnectOptions) -> Result<Connected> {
    let refuse = |reason: String| {
        BootstrapError::Exchange(ExchangeError::Readmit {
            rank,
            rejoiner: rank,
            reason,
        })
    };
    if rank == 0 {
        return Err(refuse(RANK_ZERO.to_owned()));
    }
    if !opts.node.components.readmission {
        // The survivors were built with readmission (or they refuse to readmit), and every
        // rank chooses its components alike; so is this one, to be readmitted again.
        return Err(refuse(
            NodeError::NotBuiltWith(Component::Readmission).to_string(),
        ));
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
    let entry =
        config
            .get(rank)
            .ok_or(BootstrapError::Exchange(ExchangeError::RankOutOfRange {
                rank,
                world_size: world,
            }))?;
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
    let rdma = |source: SetupError| {
        BootstrapError::Rdma(RdmaError::Setup {
            rank,
            device: place.device.clone(),
            source: Box::new(source),
        })
    };
    let ctx = open_device(&place.device).map_err(|e| rdma(SetupError::Verbs(e)))?;
    // A step that fails while this rank's own port is down failed because of it: say so
    // (the peers it could not reach are not at fault).
    let ours = |e: BootstrapError| match port_down(&ctx, place.port) {
        Some(state) => BootstrapError::Rdma(RdmaError::LocalPortDown {
            rank,
            device: place.device.clone(),
            port: place.port,
            state,
            source: Box::new(e),
        }),
        None => e,
    };
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
    let prepared = PreparedNode::new(&ctx, rank, place.world, node_cfg, backoff, &MONOTONIC)
        .map_err(|e| ours(rdma(e)))?;
    // The blob is a node blob whatever the caller left in `personalize`.
    let exchange_opts = ExchangeOptions {
        personalize: Some(&NodeBlobs),
        ..opts.exchange.clone()
    };
    let (mut session, blobs) = rendezvous(&prepared.blob(), &exchange_opts).map_err(ours)?;
    let mut node = prepared.handshake(&blobs).map_err(|e| ours(rdma(e)))?;
    // A request that fails while the link is being taken down names the port, not the peer.
    node.set_link_probe(crate::device_watch::link_probe(&ctx, place.port));
    // Nobody writes before every queue pair in the world is ready to receive.
    session.allgather(b"connected").map_err(ours)?;
    let clock = MONOTONIC;
    node.barrier_timeout(Members::World, opts.first_barrier_timeout)
        .map_err(|e| {
            ours(BootstrapError::Rdma(RdmaError::Node {
                rank,
                device: place.device.clone(),
                source: Box::new(e),
            }))
        })?;
    let departures = Departures::default();
    let watch = watch_session(
        &session,
        &node,
        &departures,
        crate::device_watch::link_probe(&ctx, place.port),
    )?;
    let device_watch = watch_device(&node, node_cfg.qp.port, opts.on_device_event);
    Ok(Connected {
        node,
        session,
        watch,
        departures,
        device_watch,
        clock,
        qp: node_cfg.qp,
        on_device_event: opts.on_device_event,
        algorithm: node_cfg.algorithm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::{exchange_at, Rendezvous};
    use std::sync::mpsc;

    /// Two sessions over 127.0.0.1, rank 0's and rank 1's.
    fn pair() -> (crate::Session, crate::Session) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let options = ExchangeOptions {
            timeout: Duration::from_secs(20),
            retry_interval: Duration::from_millis(20),
            progress: false,
            ..ExchangeOptions::default()
        };
        let o1 = options.clone();
        let one = std::thread::spawn(move || {
            let at = Rendezvous::Address {
                host: "127.0.0.1".into(),
                port,
            };
            exchange_at(at, 1, 2, b"1", &o1).unwrap().0
        });
        let zero = exchange_at(Rendezvous::Listener(listener), 0, 2, b"0", &options)
            .unwrap()
            .0;
        (zero, one.join().unwrap())
    }

    /// What rank 0's session watch raises when rank 1 leaves by `leave`, its link probe
    /// saying `local`; and the words it kept for rank 1.
    fn news_of(
        local: Option<FailureCause>,
        leave: impl FnOnce(crate::Session),
    ) -> (Failure, Option<String>) {
        let (zero, one) = pair();
        let departures = Departures::default();
        let (tx, rx) = mpsc::channel();
        let watch = watch_departures(
            &zero,
            0,
            &departures,
            move || local,
            move |f| {
                let _ = tx.send(f);
            },
        )
        .unwrap();
        leave(one);
        let news = rx.recv_timeout(Duration::from_secs(10)).expect("no news");
        drop(watch);
        let words = departures.lock().unwrap().get(&1).cloned();
        (news, words)
    }

    fn crash(session: crate::Session) {
        let r = std::thread::spawn(move || {
            let _held = session;
            panic!("simulated crash");
        })
        .join();
        assert!(r.is_err());
    }

    #[test]
    fn a_departure_names_the_peer_while_this_ranks_port_is_up() {
        let (news, words) = news_of(None, crash);
        let want = Failure {
            rank: 1,
            cause: FailureCause::SessionClosed,
            reporter: 0,
        };
        assert_eq!((news, words), (want, None));
        let (news, words) = news_of(None, |s| s.leave_on_error("its link went down").unwrap());
        let want = Failure {
            rank: 1,
            cause: FailureCause::LeftOnError,
            reporter: 0,
        };
        assert_eq!((news, words.as_deref()), (want, Some("its link went down")));
    }

    #[test]
    fn a_departure_while_this_ranks_port_is_down_names_this_ranks_port() {
        let down = Some(FailureCause::PortDown { port: 1 });
        let ours = Failure {
            rank: 0,
            cause: FailureCause::PortDown { port: 1 },
            reporter: 0,
        };
        let (news, words) = news_of(down, crash);
        assert_eq!((news, words), (ours, None));
        assert_eq!(
            ours.to_string(),
            "rank 0 failed: its device's port 1 went down (seen by rank 0)"
        );
        // The peer gave up (waiting for this rank, say): still this rank's port, and its
        // words are kept.
        let (news, words) = news_of(down, |s| {
            s.leave_on_error("timed out waiting for rank 0").unwrap()
        });
        assert_eq!(
            (news, words.as_deref()),
            (ours, Some("timed out waiting for rank 0"))
        );
    }

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
