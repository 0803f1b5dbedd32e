//! What the launcher that started this process says about the job: this
//! process's rank, the number of ranks, its rank and the number of ranks on
//! its node, and an id every rank of the job shares.
//!
//! One table ([`LAUNCHERS`]) names each launcher's variables; every reader
//! (the file communicator's rank, size and job id, the NIC a rank picks by
//! its local rank, and Python's `comm=None` and sampler through
//! `_native.launcher`) goes through [`detect`]. The first row whose
//! variables are set wins: launchers started inside another one come first
//! (torchrun under srun, `mpirun` or Hydra's `mpiexec` inside a Slurm job,
//! which leave the outer launcher's variables in the environment).

use crate::{Error, Result};

/// The variables one launcher sets.
#[derive(Clone, Copy, Debug)]
pub struct LauncherVars {
    /// A short name: the prefix of its job ids ("slurm", "ompi").
    pub key: &'static str,
    /// How messages name it ("srun", "mpirun (Open MPI)").
    pub name: &'static str,
    /// This process's rank in the job.
    pub rank: &'static str,
    /// The number of ranks.
    pub size: &'static str,
    /// This process's rank among the ranks of its node.
    pub local_rank: Option<&'static str>,
    /// The number of ranks on this node.
    pub local_size: Option<&'static str>,
    /// The job's id, and a part appended after a dot (Slurm's step), where
    /// the launcher exports one unique to each launch.
    pub job_id: Option<(&'static str, Option<&'static str>)>,
    /// Other variables that must be set too (they tell this launcher from
    /// stray variables of another one).
    pub requires: &'static [&'static str],
    /// It starts MPI jobs: MPI is usable in its processes.
    pub mpi: bool,
}

/// Every launcher pyddstore knows, inner launchers first (see the module doc).
pub const LAUNCHERS: &[LauncherVars] = &[
    // Under srun, torchrun's WORLD_SIZE counts processes while SLURM_NTASKS counts agents.
    // Its run id is not unique per launch (often "none"): the id comes from the next rows.
    LauncherVars {
        key: "torchrun",
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: Some("LOCAL_RANK"),
        local_size: Some("LOCAL_WORLD_SIZE"),
        job_id: None,
        requires: &["LOCAL_WORLD_SIZE"],
        mpi: false,
    },
    LauncherVars {
        key: "ompi",
        name: "mpirun (Open MPI)",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
        // Open MPI 4 (ORTE); Open MPI 5 (PRRTE) exports PMIX_NAMESPACE instead.
        job_id: Some(("OMPI_MCA_ess_base_jobid", None)),
        requires: &[],
        mpi: true,
    },
    LauncherVars {
        key: "mv2",
        name: "mpirun_rsh (MVAPICH2)",
        rank: "MV2_COMM_WORLD_RANK",
        size: "MV2_COMM_WORLD_SIZE",
        local_rank: Some("MV2_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("MV2_COMM_WORLD_LOCAL_SIZE"),
        job_id: None,
        requires: &[],
        mpi: true,
    },
    // Cray PALS (mpiexec on HPE/Cray systems) exports PMI_* as well, with its own local rank.
    LauncherVars {
        key: "pals",
        name: "mpiexec (Cray PALS)",
        rank: "PALS_RANKID",
        size: "PMI_SIZE",
        local_rank: Some("PALS_LOCAL_RANKID"),
        local_size: Some("PMI_LOCAL_SIZE"),
        job_id: Some(("PALS_APID", None)),
        requires: &[],
        mpi: true,
    },
    // MPICH's and Intel MPI's Hydra (also srun --mpi=pmi2, whose ranks match Slurm's).
    LauncherVars {
        key: "pmi",
        name: "mpiexec (PMI)",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: Some("MPI_LOCALRANKID"),
        local_size: Some("MPI_LOCALNRANKS"),
        job_id: None,
        requires: &[],
        mpi: true,
    },
    LauncherVars {
        key: "pmix",
        name: "mpiexec (PMIx)",
        rank: "PMIX_RANK",
        size: "PMIX_SIZE",
        local_rank: None,
        local_size: None,
        job_id: Some(("PMIX_NAMESPACE", None)),
        requires: &[],
        mpi: true,
    },
    LauncherVars {
        key: "slurm",
        name: "srun",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: Some("SLURM_LOCALID"),
        local_size: Some("SLURM_NTASKS_PER_NODE"),
        job_id: Some(("SLURM_JOB_ID", Some("SLURM_STEP_ID"))),
        requires: &[],
        mpi: false,
    },
];

/// What the launcher of this process says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    /// The launcher's name ([`LauncherVars::name`]).
    pub name: &'static str,
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// This process's rank on its node, where the launcher says.
    pub local_rank: Option<usize>,
    /// The number of ranks on this node, where the launcher says.
    pub local_size: Option<usize>,
    /// The launcher's id of this job, where it exports one.
    pub job_id: Option<String>,
    /// The variables rank and size came from, for messages ("RANK=1, WORLD_SIZE=4").
    pub source: String,
}

/// A set, non-empty variable.
fn set(get: &impl Fn(&str) -> Option<String>, key: &str) -> Option<String> {
    get(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// A variable that must be a count or index when set.
fn number(
    get: &impl Fn(&str) -> Option<String>,
    key: &str,
    launcher: &str,
) -> Result<Option<usize>> {
    match set(get, key) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            Error::invalid(format!(
                "environment variable {key}={v:?} is not a number (read as {launcher}'s)"
            ))
        }),
    }
}

/// A row's job id, when its variables are set.
fn job_id_of(row: &LauncherVars, get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let (id, part) = row.job_id?;
    let id = set(get, id)?;
    Some(match part {
        None => format!("{}{id}", row.key),
        Some(p) => format!("{}{id}.{}", row.key, set(get, p).unwrap_or_default()),
    })
}

/// The launcher whose variables `get` serves, if any: the first row of
/// [`LAUNCHERS`] with its rank, size and required variables set. A set
/// variable of that row that is not a number is an error naming it.
pub fn detect(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Launcher>> {
    let Some(row) = LAUNCHERS.iter().find(|row| {
        [row.rank, row.size]
            .iter()
            .chain(row.requires)
            .all(|k| set(get, k).is_some())
    }) else {
        return Ok(None);
    };
    let count = |key| number(get, key, row.name);
    let (rank, size) = (count(row.rank)?, count(row.size)?);
    let (rank, size) = (rank.unwrap_or_default(), size.unwrap_or_default());
    Ok(Some(Launcher {
        name: row.name,
        rank,
        size,
        local_rank: row.local_rank.map(count).transpose()?.flatten(),
        local_size: row.local_size.map(count).transpose()?.flatten(),
        job_id: job_id_of(row, get),
        source: format!("{}={rank}, {}={size}", row.rank, row.size),
    }))
}

/// [`detect`] in this process's environment.
pub fn detect_env() -> Result<Option<Launcher>> {
    detect(&|k| std::env::var(k).ok())
}

/// Whether a launcher of MPI jobs started this process (some of its variables are set).
pub fn mpi_launched(get: &impl Fn(&str) -> Option<String>) -> bool {
    LAUNCHERS
        .iter()
        .filter(|row| row.mpi)
        .any(|row| set(get, row.rank).is_some())
}

/// This process's rank on its node (0 where the launcher does not say).
pub fn local_rank_env() -> Result<usize> {
    Ok(detect_env()?.and_then(|l| l.local_rank).unwrap_or(0))
}

/// The id every rank of this job shares: the launcher's, else the first one
/// [`LAUNCHERS`] finds set (torchrun under srun: Slurm's job and step),
/// else `parent` (what ties processes started by one launcher process).
pub fn job_id(
    get: &impl Fn(&str) -> Option<String>,
    parent: impl FnOnce() -> String,
) -> Result<String> {
    if let Some(id) = detect(get)?.and_then(|l| l.job_id) {
        return Ok(id);
    }
    Ok(LAUNCHERS
        .iter()
        .find_map(|row| job_id_of(row, get))
        .unwrap_or_else(parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn name(pairs: &[(&str, &str)]) -> Option<&'static str> {
        detect(&env(pairs)).unwrap().map(|l| l.name)
    }

    const SRUN: [(&str, &str); 6] = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "4"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "2"),
    ];

    #[test]
    fn each_launcher_gives_rank_size_local_rank_and_job() {
        let l = detect(&env(&SRUN)).unwrap().unwrap();
        assert_eq!(
            (l.name, l.rank, l.size, l.local_rank, l.local_size),
            ("srun", 5, 8, Some(1), Some(4))
        );
        assert_eq!(l.job_id.as_deref(), Some("slurm77.2"));
        assert_eq!(l.source, "SLURM_PROCID=5, SLURM_NTASKS=8");
        let pals = [
            ("PALS_RANKID", "3"),
            ("PALS_LOCAL_RANKID", "1"),
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "4"),
            ("PMI_LOCAL_SIZE", "2"),
            ("PALS_APID", "ab-12"),
        ];
        let l = detect(&env(&pals)).unwrap().unwrap();
        assert_eq!((l.name, l.rank, l.size), ("mpiexec (Cray PALS)", 3, 4));
        assert_eq!((l.local_rank, l.local_size), (Some(1), Some(2)));
        assert_eq!(l.job_id.as_deref(), Some("palsab-12"));
        assert_eq!(name(&[]), None);
    }

    #[test]
    fn inner_launchers_win_over_outer_ones() {
        let mut torchrun_in_srun = SRUN.to_vec();
        torchrun_in_srun.extend([
            ("RANK", "9"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "3"),
            ("LOCAL_WORLD_SIZE", "4"),
        ]);
        let l = detect(&env(&torchrun_in_srun)).unwrap().unwrap();
        assert_eq!(
            (l.name, l.rank, l.size, l.local_rank),
            ("torchrun", 9, 16, Some(3))
        );
        // torchrun has no id of its own: Slurm's job and step.
        let get = env(&torchrun_in_srun);
        assert_eq!(job_id(&get, || "parent".into()).unwrap(), "slurm77.2");
        // Hydra's mpiexec inside a Slurm step: the processes inherit the step's variables.
        let mut hydra_in_srun = SRUN.to_vec();
        hydra_in_srun.extend([
            ("PMI_RANK", "6"),
            ("PMI_SIZE", "32"),
            ("MPI_LOCALRANKID", "2"),
        ]);
        let l = detect(&env(&hydra_in_srun)).unwrap().unwrap();
        assert_eq!(
            (l.name, l.rank, l.local_rank),
            ("mpiexec (PMI)", 6, Some(2))
        );
        // Open MPI 5 inside a batch job: its PMIx namespace, not the batch step.
        let ompi5 = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMIX_RANK", "1"),
            ("PMIX_NAMESPACE", "prterun-n1-42@1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "77"),
        ];
        assert_eq!(name(&ompi5), Some("mpirun (Open MPI)"));
        let id = job_id(&env(&ompi5), || "parent".into()).unwrap();
        assert_eq!(id, "pmixprterun-n1-42@1");
    }

    #[test]
    fn required_variables_tell_launchers_from_stray_ones() {
        // Rank without size is no launcher.
        assert_eq!(name(&[("SLURM_PROCID", "0")]), None);
        // RANK and WORLD_SIZE alone are too common to mean torchrun.
        assert_eq!(name(&[("RANK", "0"), ("WORLD_SIZE", "2")]), None);
        // Empty means unset.
        assert_eq!(name(&[("PMI_RANK", ""), ("PMI_SIZE", "2")]), None);
        assert!(mpi_launched(&env(&[("PMIX_RANK", "0")])));
        assert!(!mpi_launched(&env(&SRUN)));
        assert_eq!(job_id(&env(&[]), || "ppid1-2".into()).unwrap(), "ppid1-2");
    }

    #[test]
    fn a_malformed_value_names_its_variable() {
        let bad = [
            ("OMPI_COMM_WORLD_RANK", "one"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ];
        let err = detect(&env(&bad)).unwrap_err().to_string();
        assert!(err.contains("OMPI_COMM_WORLD_RANK=\"one\""), "{err}");
        let bad_local = [
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "x"),
        ];
        let err = detect(&env(&bad_local)).unwrap_err().to_string();
        assert!(
            err.contains("MPI_LOCALRANKID") && err.contains("(PMI)"),
            "{err}"
        );
    }
}
