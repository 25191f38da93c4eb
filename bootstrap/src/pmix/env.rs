//! Which launcher started this process, and does it serve PMIx? Answers from the
//! environment alone, so they are there with or without the `pmix` feature.

use core::fmt;

/// The kind of launcher, as far as its environment variables tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LauncherKind {
    /// Open MPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_SIZE` or `OMPI_MCA_*` set).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_JOB_ID` or `SLURM_PROCID` set).
    Slurm,
    /// A PMI-1/PMI-2 launcher such as MPICH's Hydra (`PMI_RANK` set, no PMIx).
    Pmi,
    /// Something that set `PMIX_NAMESPACE` but none of the above (PRRTE's `prterun`,
    /// Flux, ...).
    OtherPmix,
    /// No launcher variables at all.
    None,
}

/// What the environment says about the launcher: its kind and, when it serves PMIx, the
/// namespace and rank it gave this process.
///
/// ```
/// use rverbs_bootstrap::pmix::{LauncherEnv, LauncherKind};
///
/// let env = LauncherEnv::detect_with(|name| match name {
///     "PMIX_NAMESPACE" => Some("3141.1".to_owned()),
///     "PMIX_RANK" => Some("2".to_owned()),
///     "OMPI_COMM_WORLD_SIZE" => Some("4".to_owned()),
///     _ => None,
/// });
/// assert_eq!(env.kind, LauncherKind::OpenMpi);
/// assert!(env.serves_pmix());
/// assert_eq!(env.to_string(), "Open MPI mpirun (PMIx namespace 3141.1)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LauncherEnv {
    /// Who started the process.
    pub kind: LauncherKind,
    /// `PMIX_NAMESPACE`, the job's name in the PMIx server, when set.
    pub pmix_namespace: Option<String>,
    /// `PMIX_RANK`, when set.
    pub pmix_rank: Option<String>,
    /// Slurm's job and step (`SLURM_JOB_ID`, `SLURM_STEP_ID`), for messages.
    pub slurm_job: Option<(String, Option<String>)>,
}

impl LauncherEnv {
    /// Reads the process environment.
    #[must_use]
    pub fn detect() -> Self {
        Self::detect_with(|name| {
            std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
        })
    }

    /// Reads the environment that `env` looks up (tests pass a map).
    pub fn detect_with<F>(env: F) -> Self
    where
        F: Fn(&str) -> Option<String>,
    {
        let set = |name: &str| env(name).filter(|value| !value.is_empty());
        let slurm_job = set("SLURM_JOB_ID").map(|job| (job, set("SLURM_STEP_ID")));
        let pmix_namespace = set("PMIX_NAMESPACE");
        let kind = if slurm_job.is_some() || set("SLURM_PROCID").is_some() {
            LauncherKind::Slurm
        } else if set("OMPI_COMM_WORLD_SIZE").is_some() || set("OMPI_COMMAND").is_some() {
            LauncherKind::OpenMpi
        } else if pmix_namespace.is_some() {
            LauncherKind::OtherPmix
        } else if set("PMI_RANK").is_some() || set("PMI_FD").is_some() {
            LauncherKind::Pmi
        } else {
            LauncherKind::None
        };
        Self {
            kind,
            pmix_namespace,
            pmix_rank: set("PMIX_RANK"),
            slurm_job,
        }
    }

    /// Whether the launcher left what `PMIx_Init` needs: a namespace and a rank.
    #[must_use]
    pub fn serves_pmix(&self) -> bool {
        self.pmix_namespace.is_some() && self.pmix_rank.is_some()
    }

    /// What to tell a user whose launcher serves no PMIx, or `None` when it does.
    #[must_use]
    pub fn why_no_pmix(&self) -> Option<String> {
        if self.serves_pmix() {
            return None;
        }
        Some(match self.kind {
            LauncherKind::Slurm => format!(
                "{self} started this process without PMIx (PMIX_NAMESPACE/PMIX_RANK unset): \
                 run it with `srun --mpi=pmix` (see `srun --mpi=list`), or pass a cluster config"
            ),
            LauncherKind::OpenMpi => format!(
                "{self} started this process but serves no PMIx (PMIX_NAMESPACE/PMIX_RANK \
                 unset): use an Open MPI built with PMIx (4.x and later are), or pass a cluster config"
            ),
            LauncherKind::Pmi => format!(
                "{self} speaks PMI-1/PMI-2, not PMIx: start the job with a PMIx launcher \
                 (mpirun of Open MPI, srun --mpi=pmix), or pass a cluster config"
            ),
            LauncherKind::OtherPmix => format!(
                "{self} set PMIX_NAMESPACE but not PMIX_RANK: the launcher's PMIx support is \
                 incomplete; pass a cluster config"
            ),
            LauncherKind::None => "no cluster config was given and no launcher started this \
                 process (PMIX_NAMESPACE, SLURM_*, OMPI_* unset): pass a cluster config, or \
                 start it with mpirun or srun --mpi=pmix"
                .to_owned(),
        })
    }
}

impl fmt::Display for LauncherEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, &self.slurm_job) {
            (LauncherKind::Slurm, Some((job, Some(step)))) => {
                write!(f, "Slurm job {job} step {step}")?
            }
            (LauncherKind::Slurm, Some((job, None))) => write!(f, "Slurm job {job}")?,
            (LauncherKind::Slurm, None) => write!(f, "Slurm")?,
            (LauncherKind::OpenMpi, _) => write!(f, "Open MPI mpirun")?,
            (LauncherKind::Pmi, _) => write!(f, "a PMI launcher")?,
            (LauncherKind::OtherPmix, _) => write!(f, "a PMIx launcher")?,
            (LauncherKind::None, _) => write!(f, "no launcher")?,
        }
        if let Some(ns) = &self.pmix_namespace {
            write!(f, " (PMIx namespace {ns})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> LauncherEnv {
        LauncherEnv::detect_with(crate::launch::env(pairs))
    }

    #[test]
    fn open_mpi_with_pmix() {
        let e = env(&[
            ("PMIX_NAMESPACE", "413532161"),
            ("PMIX_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]);
        assert_eq!(e.kind, LauncherKind::OpenMpi);
        assert!(e.serves_pmix());
        assert_eq!(e.why_no_pmix(), None);
        assert_eq!(e.to_string(), "Open MPI mpirun (PMIx namespace 413532161)");
    }

    #[test]
    fn slurm_names_job_and_step() {
        let e = env(&[
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "3"),
            ("PMIX_NAMESPACE", "slurm.pmix.77.0"),
            ("PMIX_RANK", "3"),
        ]);
        assert_eq!(e.kind, LauncherKind::Slurm);
        assert!(e.serves_pmix());
        assert_eq!(
            e.to_string(),
            "Slurm job 77 step 0 (PMIx namespace slurm.pmix.77.0)"
        );
    }

    #[test]
    fn launchers_without_pmix_get_advice() {
        let slurm = env(&[("SLURM_JOB_ID", "77"), ("SLURM_PROCID", "0")]);
        assert!(!slurm.serves_pmix());
        assert!(slurm.why_no_pmix().unwrap().contains("srun --mpi=pmix"));
        let ompi = env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert_eq!(ompi.kind, LauncherKind::OpenMpi);
        assert!(ompi.why_no_pmix().unwrap().contains("Open MPI mpirun"));
        let pmi = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
        assert!(pmi.why_no_pmix().unwrap().contains("PMI-1/PMI-2"));
        let half = env(&[("PMIX_NAMESPACE", "x")]);
        assert_eq!(half.kind, LauncherKind::OtherPmix);
        assert!(half.why_no_pmix().unwrap().contains("PMIX_RANK"));
        let none = env(&[("PMIX_RANK", "")]);
        assert_eq!(none.kind, LauncherKind::None);
        assert!(none.why_no_pmix().unwrap().contains("cluster config"));
    }
}
