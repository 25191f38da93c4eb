//! The rendezvous over the launcher's PMIx server: put, commit, fence, get.

use crate::error::{BootstrapError, ExchangeError, LaunchError, Result};
use core::ffi::CStr;
use core::time::Duration;
use std::ffi::CString;
use std::time::Instant;

use crate::exchange::{check_own_blob, ExchangeOptions, Personalize};

use super::env::LauncherEnv;
use super::ffi::{Client, Status};
use super::value::{self, EnvelopeError, PROTOCOL_VERSION};

/// How long the diagnosis after a fence timeout may spend asking which ranks never put
/// their value (one bounded get per rank, one second each at most).
const DIAGNOSIS_BUDGET: Duration = Duration::from_secs(10);

/// This process's place in a PMIx job, and the rounds run through the launcher's PMIx server:
/// the counterpart of [`Session`](crate::Session) when a PMIx launcher (mpirun, `srun
/// --mpi=pmix`) started the job and there is no cluster file.
///
/// Every round, the exchange as well as each [`allgather`](Self::allgather), is one
/// `PMIx_Put` of this rank's bytes under the round's key (`rverbs.r<n>`), `PMIx_Commit`, a
/// `PMIx_Fence` over the job that collects the data (with `PMIX_TIMEOUT`), and one
/// `PMIx_Get` per peer. Values carry a protocol version ([`PROTOCOL_VERSION`]); a peer of
/// another version is named, not waited for.
///
/// Keys cannot be deleted from PMIx, so every round leaves its values in the launcher's store
/// until the job ends: a round of `b` bytes costs the servers `N × b` bytes for the rest of
/// the job. Rounds are for setup and teardown, not for traffic.
#[derive(Debug)]
pub struct PmixSession {
    client: Client,
    rank: u32,
    world_size: u32,
    local_rank: u32,
    local_size: u32,
    launcher: LauncherEnv,
    options: ExchangeOptions,
    round: u64,
    version: u16,
    poisoned: bool,
}

impl PmixSession {
    /// Connects to the PMIx server of the launcher that started this process and reads rank,
    /// job size, local rank and local size from it. `options` gives the timeout of every
    /// round and the blob limit of [`allgather`](Self::allgather) (job id, I/O timeout, retry
    /// interval and progress lines are TCP matters and unused here).
    ///
    /// # Errors
    /// [`LaunchError::NoLauncher`] when the environment names no PMIx server;
    /// [`LaunchError::Pmix`] when `PMIx_Init` or a query fails.
    pub fn init(options: &ExchangeOptions) -> Result<Self> {
        let launcher = LauncherEnv::detect();
        if let Some(reason) = launcher.why_no_pmix() {
            return Err(BootstrapError::Launch(LaunchError::NoLauncher { reason }));
        }
        let client = Client::init().map_err(|status| {
            BootstrapError::Launch(LaunchError::Pmix {
                rank: None,
                peer: None,
                launcher: launcher.to_string(),
                op: "PMIx_Init (connect to the launcher's PMIx server)",
                status: status.to_string(),
            })
        })?;
        let rank = client.rank();
        let query = |op: &'static str, got: core::result::Result<Option<u32>, Status>| {
            let fail = |status: String| {
                BootstrapError::Launch(LaunchError::Pmix {
                    rank: Some(rank),
                    peer: None,
                    launcher: launcher.to_string(),
                    op,
                    status,
                })
            };
            match got {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(fail("value of an unexpected type".to_owned())),
                Err(status) => Err(fail(status.to_string())),
            }
        };
        let world_size = query("PMIx_Get(PMIX_JOB_SIZE)", client.job_size())?;
        let local_rank = query("PMIx_Get(PMIX_LOCAL_RANK)", client.local_rank())?;
        let local_size = query("PMIx_Get(PMIX_LOCAL_SIZE)", client.local_size())?;
        if rank >= world_size || local_rank >= local_size {
            return Err(BootstrapError::Launch(LaunchError::Pmix {
                rank: Some(rank),
                peer: None,
                launcher: launcher.to_string(),
                op: "PMIx_Init",
                status: format!(
                    "inconsistent job: rank {rank} of {world_size}, local rank {local_rank} of {local_size}"
                ),
            }));
        }
        Ok(Self {
            client,
            rank,
            world_size,
            local_rank,
            local_size,
            launcher,
            options: options.clone(),
            round: 0,
            version: PROTOCOL_VERSION,
            poisoned: false,
        })
    }

    crate::exchange::session_accessors!();

    /// This process's rank among the job's processes on this host.
    #[must_use]
    pub fn local_rank(&self) -> u32 {
        self.local_rank
    }

    /// Number of the job's processes on this host.
    #[must_use]
    pub fn local_size(&self) -> u32 {
        self.local_size
    }

    /// The launcher, as errors name it.
    #[must_use]
    pub fn launcher(&self) -> &LauncherEnv {
        &self.launcher
    }

    /// Sets the deadline of each later round: the fence and the gets after it share it
    /// (each call rounded up to whole seconds: `PMIX_TIMEOUT` counts seconds).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.options.timeout = timeout;
    }

    /// Makes this rank put values of another protocol version, to test that peers refuse
    /// them. Not for production use.
    #[doc(hidden)]
    pub fn set_protocol_version_for_tests(&mut self, version: u16) {
        self.version = version;
    }

    /// The first round: every rank puts `blob` and receives every other rank's, indexed by
    /// rank (entry `rank` is `blob` itself). With a [`Personalize`] each rank checks every
    /// blob with it and keeps only the [`cut`](Personalize::cut) meant for itself, so it
    /// holds O(N) bytes afterwards although it reads every full blob once from its local
    /// PMIx server (which holds them all anyway).
    ///
    /// # Errors
    /// [`ExchangeError::BlobTooLarge`] and [`ExchangeError::InvalidArgument`] for this
    /// rank's own blob; otherwise as [`allgather`](Self::allgather), plus
    /// [`LaunchError::PmixValue`] for a peer blob the personalization refuses.
    pub fn exchange(
        &mut self,
        blob: &[u8],
        personalize: Option<&dyn Personalize>,
    ) -> Result<Vec<Vec<u8>>> {
        let limit = personalize.map_or(self.options.max_blob_size, |p| {
            p.blob_limit(self.world_size)
        });
        check_own_blob(self.rank, self.world_size, blob, limit, personalize)?;
        self.round_trip(blob, limit, personalize)
    }

    /// One more round: every rank contributes `bytes` and receives everyone's contribution,
    /// indexed by rank. All ranks must call it the same number of times; it doubles as an
    /// out-of-band barrier. After a failed round the session is poisoned.
    ///
    /// # Errors
    /// [`ExchangeError::BlobTooLarge`] if `bytes` exceeds the blob limit (the session stays
    /// usable); [`ExchangeError::Poisoned`]; [`ExchangeError::Timeout`] when the fence
    /// times out, naming the ranks that had not put their value; [`LaunchError::Pmix`]
    /// for a failed PMIx call; [`LaunchError::PmixVersion`] for a peer of another
    /// protocol version; [`LaunchError::PmixValue`] for a peer value over the limit.
    pub fn allgather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        if bytes.len() > self.options.max_blob_size {
            return Err(BootstrapError::Exchange(ExchangeError::BlobTooLarge {
                rank: self.rank,
                len: bytes.len(),
                limit: self.options.max_blob_size,
            }));
        }
        self.round_trip(bytes, self.options.max_blob_size, None)
    }

    /// Finalizes PMIx for this session (dropping it does the same).
    ///
    /// # Errors
    /// None today; the signature matches [`Session::close`](crate::Session::close).
    pub fn close(self) -> Result<()> {
        drop(self);
        Ok(())
    }

    fn round_trip(
        &mut self,
        bytes: &[u8],
        limit: usize,
        personalize: Option<&dyn Personalize>,
    ) -> Result<Vec<Vec<u8>>> {
        if self.poisoned {
            return Err(BootstrapError::Exchange(ExchangeError::Poisoned {
                rank: self.rank,
            }));
        }
        let outcome = self.round_inner(bytes, limit, personalize);
        if outcome.is_err() {
            self.poisoned = true;
        }
        outcome
    }

    fn round_inner(
        &mut self,
        bytes: &[u8],
        limit: usize,
        personalize: Option<&dyn Personalize>,
    ) -> Result<Vec<Vec<u8>>> {
        let key = CString::new(format!("rverbs.r{}", self.round)).expect("no NUL in the key");
        self.round += 1;
        let started = Instant::now();
        let secs = timeout_secs(self.options.timeout);
        self.client
            .put(&key, &value::wrap(self.version, bytes))
            .map_err(|s| self.pmix_error(None, "PMIx_Put", s))?;
        self.client
            .commit()
            .map_err(|s| self.pmix_error(None, "PMIx_Commit", s))?;
        if let Err(status) = self.client.fence(secs) {
            return Err(if status == Status::TIMEOUT {
                self.fence_timeout(&key, started)
            } else {
                self.pmix_error(None, "PMIx_Fence", status)
            });
        }
        let mut out = Vec::with_capacity(self.world_size as usize);
        for peer in 0..self.world_size {
            if peer == self.rank {
                out.push(bytes.to_vec());
                continue;
            }
            // The gets share the round's deadline with the fence: each waits what is left
            // (PMIx counts whole seconds, so the round may run up to a second over), and
            // none starts once it is gone, so a slow server cannot make a round take the
            // timeout once per peer.
            let left = self.options.timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(self.pmix_error(Some(peer), "PMIx_Get", Status::TIMEOUT));
            }
            let value = self
                .client
                .get_bytes(peer, &key, timeout_secs(left))
                .map_err(|s| self.pmix_error(Some(peer), "PMIx_Get", s))?
                .ok_or_else(|| self.version_error(peer, EnvelopeError::NotOurs))?;
            let payload = value::unwrap(&value).map_err(|e| self.version_error(peer, e))?;
            if payload.len() > limit {
                return Err(self.value_error(
                    peer,
                    format!("{} bytes, above the limit of {limit}", payload.len()),
                ));
            }
            match personalize {
                None => out.push(payload.to_vec()),
                Some(p) => {
                    p.check(peer, self.world_size, payload)
                        .map_err(|reason| self.value_error(peer, reason))?;
                    let mut cut = Vec::with_capacity(p.entry_limit(self.world_size));
                    p.cut(self.rank, peer, payload, &mut cut);
                    out.push(cut);
                }
            }
        }
        Ok(out)
    }

    /// After a fence timeout: which ranks had not put their value? One bounded get per
    /// rank, within [`DIAGNOSIS_BUDGET`]; a rank whose value arrives had reached the fence
    /// (it commits just before), one whose get times out had not.
    fn fence_timeout(&self, key: &CStr, started: Instant) -> BootstrapError {
        let waited = started.elapsed();
        let probe_start = Instant::now();
        let mut missing = Vec::new();
        let mut unprobed = 0u32;
        for peer in (0..self.world_size).filter(|&p| p != self.rank) {
            if probe_start.elapsed() >= DIAGNOSIS_BUDGET {
                unprobed += 1;
                continue;
            }
            if self.client.get_bytes(peer, key, 1).is_err() {
                missing.push(peer);
            }
        }
        let mut detail = format!(
            "PMIx fence of round {} under {}",
            self.round - 1,
            self.launcher
        );
        if missing.is_empty() && unprobed == 0 {
            detail.push_str(
                "; every rank had put its value, so some rank stopped between its commit and \
                 the fence, or the launcher lost one",
            );
        } else {
            detail.push_str("; the ranks listed had not put their value");
        }
        if unprobed > 0 {
            detail.push_str(&format!(
                "; {unprobed} further ranks not checked within {DIAGNOSIS_BUDGET:?}"
            ));
        }
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: self.rank,
            missing,
            waited,
            detail,
        })
    }

    fn pmix_error(&self, peer: Option<u32>, op: &'static str, status: Status) -> BootstrapError {
        BootstrapError::Launch(LaunchError::Pmix {
            rank: Some(self.rank),
            peer,
            launcher: self.launcher.to_string(),
            op,
            status: status.to_string(),
        })
    }

    fn version_error(&self, peer: u32, error: EnvelopeError) -> BootstrapError {
        BootstrapError::Launch(LaunchError::PmixVersion {
            rank: self.rank,
            peer,
            launcher: self.launcher.to_string(),
            ours: PROTOCOL_VERSION,
            theirs: match error {
                EnvelopeError::Version(v) => Some(v),
                EnvelopeError::NotOurs => None,
            },
        })
    }

    fn value_error(&self, peer: u32, reason: String) -> BootstrapError {
        BootstrapError::Launch(LaunchError::PmixValue {
            rank: self.rank,
            peer,
            launcher: self.launcher.to_string(),
            reason,
        })
    }
}

/// `PMIX_TIMEOUT` counts whole seconds and takes 0 as "never": round up, at least 1.
fn timeout_secs(timeout: Duration) -> i32 {
    let secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up_to_whole_seconds() {
        assert_eq!(timeout_secs(Duration::ZERO), 1);
        assert_eq!(timeout_secs(Duration::from_millis(1)), 1);
        assert_eq!(timeout_secs(Duration::from_millis(1500)), 2);
        assert_eq!(timeout_secs(Duration::from_secs(60)), 60);
        assert_eq!(timeout_secs(Duration::MAX), i32::MAX);
    }
}
