//! How a rank finds its world. The entry point is [`Launch::detect`] (feature `verbs`): a
//! cluster file and a rank, or the launcher's PMIx server and the host's own RDMA device;
//! [`connect_launch`] then connects. Below it, [`resolve`] answers "which rank am I, and how
//! many are we?" from flags or the launcher's environment.
//!
//! Sources, first match wins: explicit values (command-line flags), then
//! `RVERBS_RANK`/`RVERBS_WORLD_SIZE`, Slurm's `SLURM_PROCID`/`SLURM_NTASKS`,
//! Open MPI's `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`, and PMI's
//! `PMI_RANK`/`PMI_SIZE`. A source counts as present when either of its two
//! values is set; a half-set pair is an error rather than a reason to fall
//! through to the next source, since it almost always means a typo.

use crate::error::LaunchError;
use core::fmt;

#[cfg(feature = "verbs")]
mod start;
#[cfg(feature = "verbs")]
pub use start::{connect_launch, HostDevice, Launch, DEVICE_VAR};

/// Where the rank and world size came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LaunchSource {
    /// Values passed by the caller (flags).
    Explicit,
    /// `RVERBS_RANK` / `RVERBS_WORLD_SIZE`.
    Rverbs,
    /// `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
    /// `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
    /// `PMI_RANK` / `PMI_SIZE`.
    Pmi,
}

impl LaunchSource {
    /// The names of the rank and world-size values of this source.
    #[must_use]
    pub const fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::Explicit => ("explicit rank", "explicit world size"),
            Self::Rverbs => ("RVERBS_RANK", "RVERBS_WORLD_SIZE"),
            Self::Slurm => ("SLURM_PROCID", "SLURM_NTASKS"),
            Self::OpenMpi => ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            Self::Pmi => ("PMI_RANK", "PMI_SIZE"),
        }
    }
}

impl fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (rank, size) = self.names();
        write!(f, "{rank}/{size}")
    }
}

/// The environment sources, in priority order.
const ENV_SOURCES: [LaunchSource; 4] = [
    LaunchSource::Rverbs,
    LaunchSource::Slurm,
    LaunchSource::OpenMpi,
    LaunchSource::Pmi,
];

/// This process's place in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchInfo {
    /// This process's rank, below `world_size`.
    pub rank: u32,
    /// Number of processes in the job, at least 1.
    pub world_size: u32,
    /// Where the values came from.
    pub source: LaunchSource,
}

/// Resolves rank and world size from explicit values or the process environment.
///
/// # Errors
/// As [`resolve_with`].
pub fn resolve(rank: Option<u32>, world_size: Option<u32>) -> Result<LaunchInfo, LaunchError> {
    resolve_with(rank, world_size, |name| {
        std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
    })
}

/// Resolves rank and world size from explicit values or the environment that
/// `env` looks up (tests pass a map instead of touching the process environment).
///
/// # Errors
/// [`LaunchError::Incomplete`] for a half-set pair,
/// [`LaunchError::NotNumeric`], [`LaunchError::ZeroWorld`],
/// [`LaunchError::RankOutOfRange`] (each names the variable), and
/// [`LaunchError::Unset`] when no source is present.
pub fn resolve_with<F>(
    rank: Option<u32>,
    world_size: Option<u32>,
    env: F,
) -> Result<LaunchInfo, LaunchError>
where
    F: Fn(&str) -> Option<String>,
{
    if rank.is_some() || world_size.is_some() {
        return finish(LaunchSource::Explicit, rank, world_size);
    }
    for source in ENV_SOURCES {
        let (rank_name, size_name) = source.names();
        let rank = env(rank_name);
        let size = env(size_name);
        if rank.is_none() && size.is_none() {
            continue;
        }
        let rank = rank.map(|value| parse(rank_name, &value)).transpose()?;
        let size = size.map(|value| parse(size_name, &value)).transpose()?;
        return finish(source, rank, size);
    }
    Err(LaunchError::Unset)
}

fn parse(variable: &'static str, value: &str) -> Result<u32, LaunchError> {
    value.trim().parse().map_err(|_| LaunchError::NotNumeric {
        variable,
        value: value.to_owned(),
    })
}

fn finish(
    source: LaunchSource,
    rank: Option<u32>,
    size: Option<u32>,
) -> Result<LaunchInfo, LaunchError> {
    let (rank_name, size_name) = source.names();
    let (rank, world_size) = match (rank, size) {
        (Some(rank), Some(size)) => (rank, size),
        (Some(_), None) => {
            return Err(LaunchError::Incomplete {
                set: rank_name,
                missing: size_name,
            })
        }
        (None, _) => {
            return Err(LaunchError::Incomplete {
                set: size_name,
                missing: rank_name,
            })
        }
    };
    if world_size == 0 {
        return Err(LaunchError::ZeroWorld {
            variable: size_name,
        });
    }
    if rank >= world_size {
        return Err(LaunchError::RankOutOfRange {
            variable: rank_name,
            rank,
            world_size,
        });
    }
    Ok(LaunchInfo {
        rank,
        world_size,
        source,
    })
}

/// An environment of exactly these variables, for the tests of what reads one (this
/// module's [`resolve_with`], the PMIx launcher detection).
#[cfg(test)]
pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    move |name| {
        owned
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error resolving from these variables alone (no explicit rank or size) gives.
    fn env_refused(pairs: &[(&str, &str)]) -> LaunchError {
        resolve_with(None, None, env(pairs)).unwrap_err()
    }

    #[test]
    fn explicit_wins_over_environment() {
        let info = resolve_with(Some(1), Some(4), env(&[("RVERBS_RANK", "0")])).unwrap();
        assert_eq!(
            info,
            LaunchInfo {
                rank: 1,
                world_size: 4,
                source: LaunchSource::Explicit
            }
        );
    }

    #[test]
    fn each_environment_source_in_priority_order() {
        let all = [
            ("RVERBS_RANK", "1"),
            ("RVERBS_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "3"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMI_RANK", " 4 "),
            ("PMI_SIZE", "5"),
        ];
        let expected = [
            LaunchSource::Rverbs,
            LaunchSource::Slurm,
            LaunchSource::OpenMpi,
            LaunchSource::Pmi,
        ];
        for (skip, source) in expected.into_iter().enumerate() {
            let info = resolve_with(None, None, env(&all[skip * 2..])).unwrap();
            assert_eq!(info.source, source);
            assert_eq!(info.rank, skip as u32 + 1);
            assert_eq!(info.world_size, skip as u32 + 2);
        }
    }

    #[test]
    fn half_set_pairs_name_both_variables() {
        let err = resolve_with(Some(0), None, env(&[])).unwrap_err();
        assert!(matches!(
            err,
            LaunchError::Incomplete {
                set: "explicit rank",
                missing: "explicit world size"
            }
        ));
        let err = env_refused(&[("SLURM_NTASKS", "4")]);
        assert!(matches!(
            err,
            LaunchError::Incomplete {
                set: "SLURM_NTASKS",
                missing: "SLURM_PROCID"
            }
        ));
        // A half-set higher-priority pair does not fall through to a complete one.
        let err = env_refused(&[("RVERBS_RANK", "0"), ("PMI_RANK", "0"), ("PMI_SIZE", "1")]);
        assert!(err.to_string().contains("RVERBS_WORLD_SIZE"), "{err}");
    }

    #[test]
    fn non_numeric_names_variable() {
        let err = env_refused(&[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert!(matches!(
            &err,
            LaunchError::NotNumeric { variable: "OMPI_COMM_WORLD_RANK", value } if value == "x"
        ));
        let err = env_refused(&[("PMI_RANK", "0"), ("PMI_SIZE", "-1")]);
        assert!(err.to_string().contains("PMI_SIZE"), "{err}");
    }

    #[test]
    fn rank_out_of_range_and_zero_world() {
        let err = env_refused(&[("RVERBS_RANK", "4"), ("RVERBS_WORLD_SIZE", "4")]);
        assert!(matches!(
            err,
            LaunchError::RankOutOfRange {
                variable: "RVERBS_RANK",
                rank: 4,
                world_size: 4
            }
        ));
        let err = resolve_with(Some(0), Some(0), env(&[])).unwrap_err();
        assert!(matches!(
            err,
            LaunchError::ZeroWorld {
                variable: "explicit world size"
            }
        ));
    }

    #[test]
    fn no_launcher_variables_set_is_refused_as_unset() {
        let err = env_refused(&[]);
        assert!(matches!(err, LaunchError::Unset));
    }
}
