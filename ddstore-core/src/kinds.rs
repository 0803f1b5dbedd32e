//! The kinds that cross into Python as numbers or names: the method a store
//! reads with, the communicator its group runs on, and the two parts a
//! ragged variable is stored as. Each is spelled and checked here only; the
//! binding hands these tables to Python (`pyddstore.Method`, `CommKind`).

use crate::{Error, Result};

/// How a store reads rows of other ranks (`PyDDStore(method=...)`). Users
/// pass the number (`method=1`), as with upstream pyddstore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Method {
    /// 0: MPI one-sided reads (`MPI_Get` on windows).
    MpiRma = 0,
    /// 1: libfabric reads between the ranks of one job.
    Libfabric = 1,
    /// 2: libfabric, with the shares also read by other jobs (extra jobs
    /// attach to what a core job publishes).
    LibfabricExtraJobs = 2,
}

impl Method {
    /// Every method, by number.
    pub const ALL: [Method; 3] = [
        Method::MpiRma,
        Method::Libfabric,
        Method::LibfabricExtraJobs,
    ];

    /// The method numbered `value`: the one check of a method number.
    pub fn from_number(value: i64) -> Result<Method> {
        Method::ALL
            .into_iter()
            .find(|m| m.number() as i64 == value)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "method={value} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric)"
                ))
            })
    }

    /// The method named `name` (`"LIBFABRIC"`, `"libfabric"`, `"mpi_rma"`: a
    /// `pyddstore.Method` name, any case), the one check of a method name.
    pub fn from_name(name: &str) -> Result<Method> {
        Method::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| {
                let names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
                Error::invalid(format!(
                    "method={name:?} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric), \
                     or a pyddstore.Method name ({}, any case)",
                    names.join(", ")
                ))
            })
    }

    /// Its number, as users pass it.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// Its name as a Python constant (`pyddstore.Method.LIBFABRIC`).
    pub fn name(self) -> &'static str {
        match self {
            Method::MpiRma => "MPI_RMA",
            Method::Libfabric => "LIBFABRIC",
            Method::LibfabricExtraJobs => "LIBFABRIC_EXTRA_JOBS",
        }
    }

    /// Whether other jobs read this store's shares (a method-2 core job).
    pub fn read_by_other_jobs(self) -> bool {
        self == Method::LibfabricExtraJobs
    }
}

/// Which communicator a store's group runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommKind {
    /// An MPI communicator.
    Mpi,
    /// Files in a shared directory (`FileComm`).
    File,
    /// torch.distributed, through Python callbacks.
    Torch,
    /// A group of one process.
    Single,
}

impl CommKind {
    /// Every kind.
    pub const ALL: [CommKind; 4] = [
        CommKind::Mpi,
        CommKind::File,
        CommKind::Torch,
        CommKind::Single,
    ];

    /// The names of the kinds `DDSTORE_COMM` may force (a group of one is never forced), in
    /// [`CommKind::ALL`]'s order: the setting's choices.
    pub const FORCEABLE: [&'static str; 3] = [
        CommKind::Mpi.name(),
        CommKind::File.name(),
        CommKind::Torch.name(),
    ];

    /// Its name in messages and for Python (`store.comm_kind`).
    pub const fn name(self) -> &'static str {
        match self {
            CommKind::Mpi => "mpi",
            CommKind::File => "file",
            CommKind::Torch => "torch",
            CommKind::Single => "single",
        }
    }
}

/// One of the two variables a ragged variable `x` is stored as (see
/// `store/ragged/`): its values (`x#values`) and its row ends (`x#ends`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RaggedPart {
    /// The rows' units, concatenated.
    Values,
    /// One u64 per row: where it ends in its owner's values.
    Ends,
}

impl RaggedPart {
    /// Both parts, values first.
    pub const ALL: [RaggedPart; 2] = [RaggedPart::Values, RaggedPart::Ends];

    /// What the part's name adds to the ragged variable's.
    pub fn suffix(self) -> &'static str {
        match self {
            RaggedPart::Values => "#values",
            RaggedPart::Ends => "#ends",
        }
    }

    /// The name of this part of ragged variable `name`.
    pub fn of(self, name: &str) -> String {
        format!("{name}{}", self.suffix())
    }

    /// The ragged variable `part_name` is a part of, if it names a part.
    pub fn owner(part_name: &str) -> Option<&str> {
        RaggedPart::ALL
            .into_iter()
            .find_map(|p| part_name.strip_suffix(p.suffix()))
    }

    /// The name a user gave, for messages: a part (`x#values`, `x#ends`) is
    /// its ragged variable `x`; any other name is itself.
    pub fn user_name(name: &str) -> &str {
        RaggedPart::owner(name).unwrap_or(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_their_numbers_and_nothing_else_is_one() {
        for m in Method::ALL {
            assert_eq!(Method::from_number(m.number().into()).unwrap(), m);
        }
        for bad in [-1, 3, 256] {
            let e = Method::from_number(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("method={bad} is not valid")), "{e}");
        }
    }

    #[test]
    fn methods_are_their_names_in_any_case() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()).unwrap(), m);
            assert_eq!(Method::from_name(&m.name().to_lowercase()).unwrap(), m);
        }
        let e = Method::from_name("fabric").unwrap_err().to_string();
        assert!(
            e.contains("method=\"fabric\" is not valid") && e.contains("LIBFABRIC"),
            "{e}"
        );
    }

    #[test]
    fn ragged_parts_name_and_find_their_variable() {
        assert_eq!(RaggedPart::Values.of("g"), "g#values");
        assert_eq!(RaggedPart::owner("g#ends"), Some("g"));
        assert_eq!(RaggedPart::owner("g"), None);
        assert_eq!(RaggedPart::user_name("g#values"), "g");
        assert_eq!(RaggedPart::user_name("g"), "g");
        assert_ne!(RaggedPart::Values.of("x"), RaggedPart::Ends.of("x"));
    }
}
