//! The out-of-band exchange over TCP, as perftest's `-p` port: the server listens, the
//! client connects, each sends one fixed-size hello (the test's settings, its queue pair's
//! endpoint and its buffer), and both check that they run the same test.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "rvperf01"
//!      8     1  test
//!      9     1  path MTU code asked with -m (0: automatic)
//!     10     2  reserved, zero
//!     12     4  requests per post (-l)
//!     16     8  message size (-s)
//!     24     8  iterations (-n)
//!     32     4  inline size (-I)
//!     36     4  completion every (-Q)
//!     40     4  send queue depth (-t)
//!     44     4  reserved, zero
//!     48    32  endpoint (rverbs_core::wire::Endpoint)
//!     80    24  buffer (rverbs_core::sge::RemoteMemory)
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::{Endpoint, ENDPOINT_LEN, REMOTE_MEMORY_LEN};

use crate::Res;

const MAGIC: &[u8; 8] = b"rvperf01";
const HELLO_LEN: usize = 48 + ENDPOINT_LEN + REMOTE_MEMORY_LEN;

/// The settings both sides must share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) test: u8,
    pub(crate) mtu: u8,
    pub(crate) post_list: u32,
    pub(crate) size: u64,
    pub(crate) iters: u64,
    pub(crate) inline: u32,
    pub(crate) cq_mod: u32,
    pub(crate) tx_depth: u32,
}

/// One side's hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) settings: Settings,
    pub(crate) endpoint: Endpoint,
    pub(crate) memory: RemoteMemory,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let s = &self.settings;
        let mut b = [0u8; HELLO_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8] = s.test;
        b[9] = s.mtu;
        b[12..16].copy_from_slice(&s.post_list.to_le_bytes());
        b[16..24].copy_from_slice(&s.size.to_le_bytes());
        b[24..32].copy_from_slice(&s.iters.to_le_bytes());
        b[32..36].copy_from_slice(&s.inline.to_le_bytes());
        b[36..40].copy_from_slice(&s.cq_mod.to_le_bytes());
        b[40..44].copy_from_slice(&s.tx_depth.to_le_bytes());
        b[48..48 + ENDPOINT_LEN].copy_from_slice(&self.endpoint.encode());
        b[48 + ENDPOINT_LEN..].copy_from_slice(&self.memory.encode());
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> Res<Self> {
        if &b[0..8] != MAGIC {
            return Err("the peer is not an rverbs-perf of this version".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(Self {
            settings: Settings {
                test: b[8],
                mtu: b[9],
                post_list: u32_at(12),
                size: u64_at(16),
                iters: u64_at(24),
                inline: u32_at(32),
                cq_mod: u32_at(36),
                tx_depth: u32_at(40),
            },
            endpoint: Endpoint::decode(&b[48..48 + ENDPOINT_LEN])?,
            memory: RemoteMemory::decode(&b[48 + ENDPOINT_LEN..])?,
        })
    }
}

/// The TCP connection to the peer.
#[derive(Debug)]
pub(crate) struct Link {
    stream: TcpStream,
}

impl Link {
    /// The server side: waits for one client on `port`.
    pub(crate) fn accept(port: u16) -> Res<Self> {
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
        let (stream, _) = listener.accept()?;
        Self::from_stream(stream)
    }

    /// The client side: connects to `host:port`, retrying for `patience` (the server may
    /// still be starting).
    pub(crate) fn connect(host: &str, port: u16, patience: Duration) -> Res<Self> {
        let start = Instant::now();
        loop {
            match TcpStream::connect((host, port)) {
                Ok(s) => return Self::from_stream(s),
                Err(e) if start.elapsed() >= patience => {
                    return Err(format!("cannot connect to {host}:{port}: {e}").into())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn from_stream(stream: TcpStream) -> Res<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(Self { stream })
    }

    /// Sends ours, receives theirs, and checks that both run the same test.
    pub(crate) fn exchange(&mut self, mine: &Hello) -> Res<Hello> {
        self.stream.write_all(&mine.encode())?;
        let mut b = [0u8; HELLO_LEN];
        self.stream
            .read_exact(&mut b)
            .map_err(|e| format!("reading the peer's hello: {e}"))?;
        let theirs = Hello::decode(&b)?;
        if theirs.settings != mine.settings {
            return Err(format!(
                "the peer runs other settings: ours {:?}, theirs {:?} (give both sides the same flags)",
                mine.settings, theirs.settings
            )
            .into());
        }
        Ok(theirs)
    }

    /// Waits until the peer reached the same point.
    pub(crate) fn sync(&mut self) -> Res<()> {
        self.stream.write_all(&[1])?;
        let mut b = [0u8; 1];
        self.stream
            .read_exact(&mut b)
            .map_err(|e| format!("waiting for the peer: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rverbs_core::params::{Mtu, Psn};

    #[test]
    fn a_hello_decodes_to_the_settings_endpoint_and_memory_sent() {
        let h = Hello {
            settings: Settings {
                test: 3,
                mtu: 5,
                post_list: 32,
                size: 4096,
                iters: 1 << 40,
                inline: 220,
                cq_mod: 100,
                tx_depth: 128,
            },
            endpoint: Endpoint {
                qpn: 0x12_3456,
                psn: Psn::new(77).unwrap(),
                lid: 0,
                gid: [9; 16],
                global: true,
                mtu: Mtu::B1024,
            },
            memory: RemoteMemory {
                addr: 0xdead_beef_0000,
                len: 8192,
                rkey: 42,
            },
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'x';
        assert!(Hello::decode(&bad).is_err());
    }
}
