//! Watching the session's connections for a rank that dies: its kernel closes its sockets,
//! so the hang-up reaches rank 0 (which holds a connection to every rank) and every rank
//! (which holds one to rank 0) at once, long before any RDMA timeout.
//!
//! A rank that closes its session on purpose ([`Session::close`]) sends a `Bye` frame
//! first; a hang-up after a `Bye` is a goodbye and is not reported. A rank that gives up
//! ([`Session::leave_on_error`], or dropping its session without closing it) sends a `Bye`
//! that carries its reason, and is reported as [`Departure::GaveUp`] with it; a hang-up with
//! no goodbye at all is [`Departure::Crashed`]. With a job secret the `Bye`'s MAC (over the
//! reason too) must prove it ([`ByeCheck`]): a forged or stale goodbye is a crash like any
//! other hang-up.

use crate::error::{BootstrapError, ExchangeError, Result};
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use rverbs_std_shim::hangup::{wait_for_hangup, PollSet};

use crate::wire::{ByeCheck, LastWord};

use super::session::{Link, Session};

/// How often the watcher looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);
/// Most bytes looked at after a hang-up while looking for the goodbye: more than any frame
/// a session sends (tables are O(world) bytes).
const TAIL_LIMIT: usize = 4 << 20;
/// Peeks at a hung-up connection while a round is reading it, before giving up on a goodbye.
const GOODBYE_TRIES: u32 = 50;
/// Time for the round to finish the frame it is reading before the next peek.
const GOODBYE_RETRY: Duration = Duration::from_millis(10);

/// How a watched rank left, other than by closing its session on purpose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Departure {
    /// Its connection closed without a goodbye: the process died (or the connection broke).
    Crashed,
    /// It said it gives up, and why (its words, made safe to print).
    GaveUp(String),
}

/// A thread that watches a [`Session`]'s connections and calls back with the rank of every
/// one that closes without a deliberate goodbye, and how it left. Stops (and joins) when
/// dropped.
#[derive(Debug)]
pub struct Watch {
    _thread: WatchThread,
}

/// The thread of a watch (this module's, and the device watch's): it runs `body` with its
/// stop flag, which dropping this sets before it joins the thread. Started only once the
/// thread runs, so that whatever starting a thread allocates happens before: the watches
/// run beside a node that must not allocate once connected (and counts every thread).
#[derive(Debug)]
pub(crate) struct WatchThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WatchThread {
    /// Starts the thread `name` running `body`, and returns once it runs.
    pub(crate) fn start(
        name: String,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let started = Arc::new(std::sync::Barrier::new(2));
        let go = Arc::clone(&started);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            go.wait();
            drop(go);
            body(&flag);
        })?;
        started.wait();
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for WatchThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Session {
    /// Starts a thread that calls `lost(rank, how)` once for each rank whose connection
    /// closes without a deliberate goodbye: on rank 0 any other rank, elsewhere rank 0. The
    /// session stays usable for rounds meanwhile: the watcher reads nothing until a
    /// connection hangs up.
    ///
    /// # Errors
    /// [`ExchangeError::Io`] if a connection cannot be duplicated for the watcher or the
    /// thread cannot start.
    pub fn watch(&self, mut lost: impl FnMut(u32, Departure) + Send + 'static) -> Result<Watch> {
        let links: Vec<(u32, &TcpStream, &str, ByeCheck)> = match &self.link {
            Link::Alone => Vec::new(),
            Link::Root(peers) => peers
                .iter()
                .map(|p| (p.rank, &p.stream, p.addr.as_str(), p.seal.bye_check()))
                .collect(),
            Link::Peer(p) => vec![(p.rank, &p.stream, p.addr.as_str(), p.seal.bye_check())],
        };
        let mut watched = Vec::with_capacity(links.len());
        for (rank, stream, addr, check) in links {
            let copy = stream.try_clone().map_err(|source| {
                BootstrapError::Exchange(ExchangeError::Io {
                    rank: self.rank(),
                    peer: Some(rank),
                    addr: addr.to_owned(),
                    op: "watch (duplicate the connection)",
                    source,
                })
            })?;
            watched.push((rank, copy, check));
        }
        // This session closing on purpose shuts its connections down too: not a failure.
        let closing = Arc::clone(&self.closing);
        // Everything the thread needs is allocated here, and `watch` returns only once the
        // thread runs: a node beside it proves it allocates nothing after connecting, and
        // counts every thread.
        let mut hung = vec![false; watched.len()];
        let mut set = PollSet::with_capacity(watched.len());
        let thread = WatchThread::start(format!("rverbs-watch-{}", self.rank()), move |stop| {
            let ending = || stop.load(Ordering::Acquire) || closing.load(Ordering::Acquire);
            while !ending() && !watched.is_empty() {
                hung.fill(false);
                let fds = watched.iter().map(|(_, s, _)| s.as_fd());
                // No allocation per tick: the watch runs beside a node that must not.
                match wait_for_hangup(&mut set, fds, TICK, &mut hung) {
                    Ok(0) => continue,
                    Ok(_) => {}
                    // A failing poll(2) is not a rank's failure: try again next tick.
                    Err(_) => {
                        std::thread::sleep(TICK);
                        continue;
                    }
                }
                if ending() {
                    break;
                }
                let mut i = 0;
                watched.retain(|(rank, stream, check)| {
                    let gone = hung[i];
                    i += 1;
                    if gone {
                        match last_word(stream, check) {
                            LastWord::Goodbye => {}
                            LastWord::Nothing => lost(*rank, Departure::Crashed),
                            LastWord::GaveUp(why) => lost(*rank, Departure::GaveUp(why)),
                        }
                    }
                    !gone
                });
            }
        })
        .map_err(|source| {
            BootstrapError::Exchange(ExchangeError::Io {
                rank: self.rank(),
                peer: None,
                addr: String::new(),
                op: "watch (start the thread)",
                source,
            })
        })?;
        Ok(Watch { _thread: thread })
    }
}

/// What the bytes left unread on a hung-up connection end with: the other end's `Bye` (its
/// MAC checked when the job has a secret: a bad one is no goodbye), with or without a
/// reason, or nothing of the kind. Only peeks: a round
/// of the session's own may still be reading the frames before it. (After the peer's
/// hang-up every byte it sent has arrived, so the peek sees them all.) A peek can race the
/// round: the count of frames read changes, the round is in the middle of a frame, or it
/// has taken a frame it has not counted yet (the goodbye then seems one frame off). So a
/// "no" stands only when two peeks a moment apart, with the same count, both say it; one
/// that never settles is no goodbye.
fn last_word(stream: &TcpStream, check: &ByeCheck) -> LastWord {
    let mut tail = vec![0u8; TAIL_LIMIT];
    let mut refused_at = None;
    for _ in 0..GOODBYE_TRIES {
        let before = check.frames_received();
        let n = stream.peek(&mut tail).unwrap_or(0);
        if check.frames_received() == before {
            match check.last_word(&tail[..n], before) {
                Some(LastWord::Nothing) if refused_at == Some(before) => return LastWord::Nothing,
                Some(LastWord::Nothing) => refused_at = Some(before),
                Some(word) => return word,
                None => {}
            }
        }
        std::thread::sleep(GOODBYE_RETRY);
    }
    LastWord::Nothing
}
