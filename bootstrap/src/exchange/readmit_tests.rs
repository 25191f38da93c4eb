//! The rejoin protocol on loopback, with node blobs but no device: a world of four exchanges,
//! rank 2's process dies (its connection closes without a goodbye), a new process rejoins
//! while the survivors readmit it, and each side gets exactly the endpoints made for it; then
//! the session's rounds include the new process. What cannot work is refused, saying why.

use crate::error::{BootstrapError, ExchangeError};
use core::time::Duration;
use std::net::{Shutdown, TcpListener};
use std::thread;

use rverbs_core::params::{Mtu, Psn};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::node::{node_blob_len, NodeBlob};
use rverbs_core::wire::Endpoint;

use crate::config::{ClusterConfig, RankConfig};

use super::session::{Link, Session};
use super::{exchange, exchange_at, exchange_rejoin, ExchangeOptions, NodeBlobs, Rendezvous};

const WORLD: u32 = 4;
const GONE: u32 = 2;

fn options() -> ExchangeOptions {
    ExchangeOptions {
        job_id: 0x5e55,
        timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(2),
        retry_interval: Duration::from_millis(20),
        progress: false,
        personalize: Some(&NodeBlobs),
        ..ExchangeOptions::default()
    }
}

/// Rank `rank`'s full node blob in its life `life`: every endpoint and descriptor names
/// both, so a misplaced one is caught.
fn full_blob(rank: u32, life: u32) -> Vec<u8> {
    let mut out = vec![0; node_blob_len(WORLD)];
    NodeBlob::encode_into(
        &mut out,
        rank,
        WORLD,
        |peer| endpoint(rank, peer, life),
        RemoteMemory {
            addr: 0x1000 * u64::from(rank + 1) + u64::from(life),
            len: 16 * u64::from(WORLD) + 8,
            rkey: 7,
        },
        RemoteMemory {
            addr: 0x9000 + u64::from(life),
            len: 64,
            rkey: 9,
        },
    )
    .unwrap();
    out
}

fn endpoint(rank: u32, peer: u32, life: u32) -> Endpoint {
    Endpoint {
        qpn: 0x100 + rank * 64 + peer * 8 + life,
        psn: Psn::new(peer + 1).unwrap(),
        lid: 1,
        gid: [0; 16],
        global: false,
        mtu: Mtu::B1024,
    }
}

/// What survivor `rank` sends for the new process of `GONE`.
fn part(rank: u32) -> Vec<u8> {
    NodeBlob::cut_for(&full_blob(rank, 1), GONE)
        .unwrap()
        .to_vec()
}

fn config(port: u16) -> ClusterConfig {
    let ranks = (0..WORLD)
        .map(|r| RankConfig {
            rank: r,
            host: "127.0.0.1".into(),
            port: port + r as u16,
            device: "none".into(),
            ib_port: 1,
            gid_index: None,
            comment: None,
        })
        .collect();
    ClusterConfig::new("readmit", Some("readmit".into()), ranks).unwrap()
}

/// A connected world of [`WORLD`] sessions, by rank, and its config.
fn world() -> (Vec<Session>, ClusterConfig) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = config(port);
    let mut opts = options();
    opts.job_id = config.job_id();
    let handles: Vec<_> = (0..WORLD)
        .map(|r| {
            let (config, opts) = (config.clone(), opts.clone());
            let listener = (r == 0).then(|| listener.try_clone().unwrap());
            thread::spawn(move || {
                let blob = full_blob(r, 0);
                match listener {
                    Some(l) => exchange_at(Rendezvous::Listener(l), 0, WORLD, &blob, &opts),
                    None => exchange(&config, r, &blob, &opts),
                }
                .unwrap()
                .0
            })
        })
        .collect();
    let sessions = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (sessions, config)
}

/// The process behind `session` dies: its connection closes with no goodbye.
fn die(session: Session) {
    if let Link::Peer(link) = &session.link {
        link.stream.shutdown(Shutdown::Both).unwrap();
    }
    drop(session);
}

#[test]
fn a_restarted_rank_rejoins_and_every_side_gets_its_endpoints() {
    let (mut sessions, config) = world();
    die(sessions.remove(GONE as usize));
    let mut opts = options();
    opts.job_id = config.job_id();
    let newcomer = {
        let (config, opts) = (config.clone(), opts.clone());
        thread::spawn(move || exchange_rejoin(&config, GONE, &full_blob(GONE, 1), &opts))
    };
    let survivors: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            thread::spawn(move || {
                let got = s.readmit(GONE, &part(s.rank()), Duration::from_secs(20));
                (s, got)
            })
        })
        .collect();
    let (newcomer, blobs) = newcomer.join().unwrap().unwrap();
    // The new process: each survivor's endpoint for it, and its own blob.
    for (r, b) in (0u32..).zip(&blobs) {
        if r == GONE {
            assert_eq!(b, &full_blob(GONE, 1));
        } else {
            assert_eq!(b, &part(r), "the part of survivor {r}");
        }
    }
    let mut sessions = Vec::new();
    for h in survivors {
        let (s, got) = h.join().unwrap();
        let want = NodeBlob::cut_for(&full_blob(GONE, 1), s.rank()).unwrap();
        assert_eq!(got.unwrap(), want.to_vec(), "rank {}", s.rank());
        sessions.push(s);
    }
    // Rounds over the session include the new process: rank 0's connection to it took the
    // old one's place.
    sessions.insert(GONE as usize, newcomer);
    let rounds: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            thread::spawn(move || {
                let me = s.rank();
                let table = s.allgather(&[me as u8; 3]).unwrap();
                (me, table)
            })
        })
        .collect();
    for h in rounds {
        let (me, table) = h.join().unwrap();
        let want: Vec<Vec<u8>> = (0..WORLD).map(|r| vec![r as u8; 3]).collect();
        assert_eq!(table, want, "rank {me}");
    }
}

#[test]
fn what_cannot_rejoin_is_refused_saying_why() {
    let (mut sessions, config) = world();
    let mut opts = options();
    opts.job_id = config.job_id();

    // Rank 0 holds the rendezvous.
    let e = sessions[1]
        .readmit(0, &part(1), Duration::from_secs(1))
        .unwrap_err();
    assert!(
        matches!(&e, BootstrapError::Exchange(ExchangeError::Readmit { rank: 1, rejoiner: 0, reason }) if reason.contains("rank 0 holds the rendezvous")),
        "{e}"
    );
    let e = exchange_rejoin(&config, 0, &full_blob(0, 1), &opts).unwrap_err();
    assert!(e.to_string().contains("rank 0 holds the rendezvous"), "{e}");
    let e = sessions[1]
        .readmit(1, &part(1), Duration::from_secs(1))
        .unwrap_err();
    assert!(e.to_string().contains("does not readmit itself"), "{e}");

    // Rank 2's process is alive: a second process for it is refused; then one that calls
    // connect() is refused too; then the real newcomer gets in. Rank 0 alone is enough to
    // see rank 0's answers: the survivors' parts come afterwards.
    let quick = ExchangeOptions {
        timeout: Duration::from_secs(3),
        ..opts.clone()
    };
    let root = {
        let mut s0 = sessions.remove(0);
        thread::spawn(move || {
            let got = s0.readmit(GONE, &part(0), Duration::from_secs(4));
            (s0, got)
        })
    };
    let e = exchange_rejoin(&config, GONE, &full_blob(GONE, 1), &quick).unwrap_err();
    assert!(
        e.to_string()
            .contains("previous process is still connected"),
        "{e}"
    );
    let e = exchange(&config, GONE, &full_blob(GONE, 1), &quick).unwrap_err();
    assert!(
        e.to_string().contains("calls rejoin(), not connect()"),
        "{e}"
    );
    // Nobody rejoins in time: rank 0 names the new process it waited for.
    let (_s0, got) = root.join().unwrap();
    let e = got.unwrap_err();
    assert!(
        matches!(&e, BootstrapError::Exchange(ExchangeError::Timeout { rank: 0, missing, .. }) if missing == &vec![GONE]),
        "{e}"
    );
    assert!(e.to_string().contains("still connected"), "{e}");
}
