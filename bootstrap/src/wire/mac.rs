//! The MAC that proves a frame was sent by a holder of the job secret, on this
//! connection, in this order.
//!
//! Each end opens a connection with a `Challenge` frame of [`CHALLENGE_LEN`] fresh
//! random bytes, sent at once without waiting for the other's (so the connecting
//! end also speaks first, which a listen queue under SYN cookies needs to see the
//! connection at all). With a [`JobSecret`], the MAC of a frame is HMAC-SHA256
//! keyed with the secret over:
//!
//! | size | field                                                                |
//! |-----:|----------------------------------------------------------------------|
//! | 26   | the domain, the bytes `rverbs-bootstrap frame v2` and a zero byte    |
//! | 32   | rank 0's challenge                                                   |
//! | 32   | the connecting end's challenge                                       |
//! | 1    | the sender's end: 0 rank 0, 1 the connecting end ([`End`])          |
//! | 8    | `u64` little-endian: how many frames that end sent before this one   |
//! | 28   | the frame's header, MAC flag set                                     |
//! | len  | the frame's payload                                                  |
//!
//! An end's challenge frame is its frame 0, made before it has seen the other's,
//! so the other challenge counts as zeros there; every later frame covers both.
//! So a frame verifies only on the connection it was made for (a captured `Hello`
//! replayed to rank 0 meets a new challenge of rank 0's, a captured `Table`
//! replayed to a rank a new challenge of that rank's), in the direction it was
//! sent (rank 0's frames cannot be reflected back to it), and in its place in the
//! order (a frame cannot be dropped, repeated or moved). A challenge frame proves
//! that its sender holds the secret before the other end sends anything of its
//! own. Every kind, present and future, goes through [`Seal::seal`] and
//! [`Seal::open`]; the only rule about kinds is that each end's first frame is its
//! `Challenge` and no other frame is.
//!
//! Without a secret on an end, its frames carry no MAC and it refuses frames that do
//! ([`WireError::MacUnexpected`]); with one, it refuses frames without
//! ([`WireError::MacMissing`]): one side with a secret and one without never talk.

use core::fmt;

use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{decode_header, frame_header, Frame, FrameKind, Header, WireError, HEADER_LEN};
use crate::secret::JobSecret;

/// Bytes of the MAC that follows a payload.
pub const MAC_LEN: usize = 32;
/// Bytes of rank 0's challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Opens every MAC input, so no other use of the same secret can produce a valid frame.
const DOMAIN: &[u8] = b"rverbs-bootstrap frame v2\0";
/// Stands for the challenge an end has not seen yet, in its own challenge frame.
const UNSEEN: [u8; CHALLENGE_LEN] = [0; CHALLENGE_LEN];

/// The two ends of a bootstrap connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// Rank 0, which accepted the connection and sent the challenge.
    Root,
    /// The rank that connected to rank 0.
    Peer,
}

impl End {
    fn other(self) -> Self {
        match self {
            Self::Root => Self::Peer,
            Self::Peer => Self::Root,
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Root => 0,
            Self::Peer => 1,
        }
    }
}

/// One end's MAC state of one connection: the key (if any), both ends'
/// challenges (the other's once seen), and how many frames it has sent and received.
///
/// Every frame an end sends goes through [`seal`](Self::seal) and every frame it
/// receives through [`open`](Self::open), in order, starting with the challenge
/// frames; a frame that fails `open` ends the connection. Without a secret, the
/// same calls make and accept frames without a MAC, so the exchange has one path.
pub struct Seal {
    key: Option<Hmac<Sha256>>,
    end: End,
    /// Indexed by [`End::index`]: rank 0's, then the connecting end's.
    challenges: [[u8; CHALLENGE_LEN]; 2],
    sent: u64,
    received: u64,
    /// `received`, for a [`ByeCheck`] on another thread.
    received_shared: Arc<AtomicU64>,
}

impl Clone for Seal {
    /// An independent copy: it counts its own frames from here on.
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            end: self.end,
            challenges: self.challenges,
            sent: self.sent,
            received: self.received,
            received_shared: Arc::new(AtomicU64::new(self.received)),
        }
    }
}

/// A frame's header and MAC, made for a payload the caller still holds (so a large
/// table is not copied per connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// The header, MAC flag set if there is a MAC.
    pub header: [u8; HEADER_LEN],
    /// The MAC to send after the payload.
    pub mac: Option<[u8; MAC_LEN]>,
}

impl Seal {
    /// Rank 0's end of a connection it accepted, with a fresh random `challenge`.
    #[must_use]
    pub fn root(secret: Option<&JobSecret>, challenge: [u8; CHALLENGE_LEN]) -> Self {
        Self::new(End::Root, secret, challenge)
    }

    /// The connecting end, with a fresh random `challenge`.
    #[must_use]
    pub fn peer(secret: Option<&JobSecret>, challenge: [u8; CHALLENGE_LEN]) -> Self {
        Self::new(End::Peer, secret, challenge)
    }

    fn new(end: End, secret: Option<&JobSecret>, challenge: [u8; CHALLENGE_LEN]) -> Self {
        let mut challenges = [UNSEEN; 2];
        challenges[end.index()] = challenge;
        Self {
            key: secret.map(JobSecret::hmac),
            end,
            challenges,
            sent: 0,
            received: 0,
            received_shared: Arc::default(),
        }
    }

    /// Which end this is.
    #[must_use]
    pub fn end(&self) -> End {
        self.end
    }

    /// Whether this end has a job secret (and so sends and demands MACs).
    #[must_use]
    pub fn has_secret(&self) -> bool {
        self.key.is_some()
    }

    /// This end's first frame on the connection: its challenge, from `sender`.
    #[must_use]
    pub fn challenge_frame(&mut self, job_id: u64, sender: u32, world_size: u32) -> Vec<u8> {
        let challenge = self.challenges[self.end.index()];
        // CHALLENGE_LEN bytes always frame.
        self.encode(FrameKind::Challenge, job_id, sender, world_size, &challenge)
            .expect("a challenge is far below the frame limit")
    }

    /// Whether `header` may open the next frame from the other end: its first
    /// frame must be its `Challenge`, and no later one may be. Checked by
    /// [`open`](Self::open) too; a reader calls it before taking the payload.
    ///
    /// # Errors
    /// [`WireError::ChallengeExpected`] or [`WireError::ChallengeRepeated`].
    pub fn check_order(&self, header: &Header) -> Result<(), WireError> {
        match (self.received == 0, header.kind == FrameKind::Challenge) {
            (true, false) => Err(WireError::ChallengeExpected { found: header.kind }),
            (false, true) => Err(WireError::ChallengeRepeated),
            _ => Ok(()),
        }
    }

    /// The header and MAC of this end's next frame, and counts it as sent.
    ///
    /// # Errors
    /// [`WireError::PayloadUnencodable`] if `payload` is longer than
    /// [`MAX_PAYLOAD`](super::MAX_PAYLOAD).
    pub fn seal(
        &mut self,
        kind: FrameKind,
        job_id: u64,
        sender: u32,
        world_size: u32,
        payload: &[u8],
    ) -> Result<Sealed, WireError> {
        let mut header = frame_header(kind, job_id, sender, world_size, payload)?;
        header.mac = self.key.is_some();
        let header = header.encode();
        let mac = self
            .mac_over(self.end, self.sent, &header, payload)
            .map(|mac| mac.finalize().into_bytes().into());
        self.sent = self.sent.wrapping_add(1);
        Ok(Sealed { header, mac })
    }

    /// This end's next frame whole: header, payload and MAC, if any.
    ///
    /// # Errors
    /// As [`seal`](Self::seal).
    pub fn encode(
        &mut self,
        kind: FrameKind,
        job_id: u64,
        sender: u32,
        world_size: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, WireError> {
        let sealed = self.seal(kind, job_id, sender, world_size, payload)?;
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + MAC_LEN);
        out.extend_from_slice(&sealed.header);
        out.extend_from_slice(payload);
        if let Some(mac) = sealed.mac {
            out.extend_from_slice(&mac);
        }
        Ok(out)
    }

    /// Checks the next frame received from the other end, in constant time, and
    /// counts it. The other end's first frame, its challenge, also sets the
    /// challenge that its later frames, and this end's, cover.
    ///
    /// # Errors
    /// [`WireError::MacMissing`], [`WireError::MacUnexpected`] or
    /// [`WireError::MacMismatch`]; [`WireError::ChallengeExpected`],
    /// [`WireError::ChallengeRepeated`] or [`WireError::ChallengeLength`] for
    /// challenges out of place or of the wrong size.
    pub fn open(&mut self, frame: &Frame<'_>) -> Result<(), WireError> {
        self.check_order(&frame.header)?;
        let sender = self.end.other();
        if self.received == 0 {
            self.challenges[sender.index()] =
                frame
                    .payload
                    .try_into()
                    .map_err(|_| WireError::ChallengeLength {
                        len: frame.header.payload_len,
                    })?;
        }
        match (self.has_secret(), frame.mac) {
            (false, None) => {}
            (false, Some(_)) => return Err(WireError::MacUnexpected),
            (true, None) => return Err(WireError::MacMissing),
            (true, Some(tag)) => {
                let mac = self
                    .mac_over(sender, self.received, &frame.header.encode(), frame.payload)
                    .ok_or(WireError::MacMismatch)?;
                mac.verify_slice(tag).map_err(|_| WireError::MacMismatch)?;
            }
        }
        self.received = self.received.wrapping_add(1);
        self.received_shared.store(self.received, Ordering::Release);
        Ok(())
    }

    /// What a watcher on another thread needs to tell whether the last frame on this
    /// connection is the other end's goodbye (see [`ByeCheck`]). Call it once the
    /// challenges are exchanged.
    #[must_use]
    pub fn bye_check(&self) -> ByeCheck {
        ByeCheck {
            seal: self.clone(),
            received: Arc::clone(&self.received_shared),
        }
    }

    /// The HMAC over a frame `sender` sent as its frame number `counter`, before
    /// finalizing; `None` without a secret.
    fn mac_over(
        &self,
        sender: End,
        counter: u64,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Option<Hmac<Sha256>> {
        let mut mac = self.key.clone()?;
        mac.update(DOMAIN);
        for (end, challenge) in [End::Root, End::Peer].into_iter().zip(&self.challenges) {
            // Frame 0 is the sender's challenge, made before it saw the other one.
            let seen = counter > 0 || end == sender;
            mac.update(if seen { challenge } else { &UNSEEN });
        }
        mac.update(&[sender.index() as u8]);
        mac.update(&counter.to_le_bytes());
        mac.update(header);
        mac.update(payload);
        Some(mac)
    }
}

/// Tells, from another thread and without reading, whether a hung-up connection's last
/// frame is the other end's `Bye`, proven by its MAC when the job has a secret: so a
/// forged goodbye (no secret) or a stale one (another connection's, or one out of its place
/// on this one) cannot make a crash look like a clean leave. Made by [`Seal::bye_check`];
/// follows how many frames the connection's reader has taken.
pub struct ByeCheck {
    /// The key and both challenges (its counters are unused).
    seal: Seal,
    /// Frames the connection's reader has taken from the other end.
    received: Arc<AtomicU64>,
}

impl fmt::Debug for ByeCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByeCheck")
            .field("seal", &self.seal)
            .field("received", &self.received.load(Ordering::Relaxed))
            .finish()
    }
}

impl ByeCheck {
    /// Frames the connection's reader has taken from the other end so far.
    #[must_use]
    pub fn frames_received(&self) -> u64 {
        self.received.load(Ordering::Acquire)
    }

    /// What `unread`, every byte of the connection not yet read (peeked after the other
    /// end hung up), ends with, when `received` frames had been read before them: the other
    /// end's `Bye` (empty: a deliberate close; with a reason: it gave up), or nothing of the
    /// kind. `None` if `unread` does not split into whole frames (the reader was in the
    /// middle of one: look again once it is done).
    ///
    /// Without a secret a `Bye` carries no MAC and the header is all there is to check.
    /// With one, its MAC (over the reason too) must verify as the other end's frame number
    /// `received` + the frames ahead of it in `unread`: a goodbye verifies only on its own
    /// connection, in its own place. A reason is the other end's text: it is cut to
    /// [`MAX_REASON`] bytes and its control characters are replaced before anyone prints it.
    #[must_use]
    pub fn last_word(&self, unread: &[u8], received: u64) -> Option<LastWord> {
        let mut at = 0;
        let mut ahead = 0u64;
        loop {
            let header = unread.get(at..)?;
            let h = decode_header(header).ok()?;
            let end = at.checked_add(h.frame_len())?;
            let frame = unread.get(at..end)?;
            if end < unread.len() {
                at = end;
                ahead += 1;
                continue;
            }
            let mac = self.seal.has_secret();
            if h.kind != FrameKind::Bye || h.mac != mac {
                return Some(LastWord::Nothing);
            }
            let (header, rest) = frame.split_at(HEADER_LEN);
            let (payload, tag) = rest.split_at(h.payload_len as usize);
            if mac {
                let header: &[u8; HEADER_LEN] = header.try_into().ok()?;
                let sender = self.seal.end.other();
                let n = received.checked_add(ahead)?;
                let proven = self
                    .seal
                    .mac_over(sender, n, header, payload)
                    .is_some_and(|m| m.verify_slice(tag).is_ok());
                if !proven {
                    return Some(LastWord::Nothing);
                }
            }
            return Some(if payload.is_empty() {
                LastWord::Goodbye
            } else {
                LastWord::GaveUp(printable_reason(payload))
            });
        }
    }
}

/// Most bytes of a reason a `Bye` carries (longer ones are cut on a character boundary by
/// the sender, and by the reader whatever the sender did).
pub const MAX_REASON: usize = 512;

/// What the last frame of a hung-up connection said (see [`ByeCheck::last_word`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastWord {
    /// No goodbye (or one that did not verify): the process died or its connection broke.
    Nothing,
    /// A goodbye: the session was closed on purpose.
    Goodbye,
    /// A goodbye that says the process left because of an error, and why (the other end's
    /// words, cut to [`MAX_REASON`] bytes, control characters replaced).
    GaveUp(String),
}

/// `reason` cut to at most [`MAX_REASON`] bytes on a character boundary: what a `Bye` of a
/// process that gives up carries.
#[must_use]
pub fn bye_reason(reason: &str) -> &str {
    let mut cut = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    &reason[..cut]
}

/// A peer's reason made safe to print: lossy UTF-8, at most [`MAX_REASON`] bytes, control
/// characters (a terminal's escape sequences, line breaks) replaced.
fn printable_reason(bytes: &[u8]) -> String {
    super::printable(bytes, MAX_REASON)
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seal")
            .field("end", &self.end)
            .field("secret", &self.key.as_ref().map(|_| "<redacted>"))
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}
