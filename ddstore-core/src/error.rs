//! The one error type of ddstore-core; every crate above converts into it
//! and the Python binding maps each variant to one exception class.

use std::time::Duration;

/// A result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the store and its transports. The binding maps each
/// variant to one Python class (`pyddstore/src/errors.rs`); `call`, `code`
/// and `peer` say which libfabric or MPI call failed, how, and for which rank.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument value (maps to `ValueError`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A row or sample index outside the valid range (maps to `IndexError`).
    #[error("{0}")]
    IndexOutOfRange(String),
    /// A buffer of the wrong dtype or kind (maps to `TypeError`).
    #[error("{0}")]
    WrongType(String),
    /// A variable name that is not in the store (maps to `KeyError`); `hint`
    /// names the closest existing one, if any is close (see [`Error::unknown_variable`]).
    #[error("unknown variable '{name}'{hint}: call add() or init() on every rank first")]
    UnknownVariable {
        /// The name asked for.
        name: String,
        /// `" (did you mean 'x'?)"`, or empty.
        hint: String,
    },
    /// `add`/`init` of a name that already exists.
    #[error("variable '{0}' already exists: use update() to change its rows, or a new name")]
    AlreadyExists(String),
    /// A buffer whose memory another call in progress is using (another
    /// thread's read into the same array or an overlapping view).
    #[error("{0}")]
    Borrowed(String),
    /// Any call after `free()`.
    #[error("the store was freed; create a new PyDDStore to read again")]
    Freed,
    /// A peer did not answer in time.
    #[error("{}", timeout_message(*peer, *waited, what))]
    Timeout {
        /// The rank that did not answer.
        peer: usize,
        /// How long it was waited for (zero: known gone without waiting).
        waited: Duration,
        /// What was waited for.
        what: String,
    },
    /// A wait on this process's own resources (not a peer) ran past its
    /// deadline: a file load whose reads made no progress for
    /// `DDSTORE_LOAD_TIMEOUT_S` (maps to `DDStoreTimeoutError`).
    #[error("file load timed out: no read returned for {waited:.1?}: {what}")]
    Stalled {
        /// How long nothing moved.
        waited: Duration,
        /// What was waited for, and what to do.
        what: String,
    },
    /// A signal handler asked the wait to stop (Ctrl-C: the binding raises
    /// what the handler raised, `KeyboardInterrupt`; see [`crate::interrupt`]).
    #[error("interrupted by a signal")]
    Interrupted,
    /// Collective or handshake failures.
    #[error("communicator: {0}")]
    Comm(String),
    /// Transport failures that name no single call (a malformed reply).
    #[error("transport: {0}")]
    Transport(String),
    /// A libfabric or MPI call failed: the call (`fi_read`, `MPI_Get`), its
    /// return code, the provider's or MPI's message, and the peer rank the
    /// call was for where there is one.
    #[error("transport: {call} failed{}: {message} (code {code})", peer_part(*peer))]
    Call {
        /// The failing call, e.g. `fi_read`, `MPI_Get`.
        call: &'static str,
        /// Its return code (libfabric: negative `FI_E*`; MPI: the error code).
        code: i64,
        /// `fi_strerror` or `MPI_Error_string`, with context.
        message: String,
        /// The rank the call was for, where there is one.
        peer: Option<usize>,
    },
    /// A peer refused a read: a memory key it never issued or no longer
    /// serves (a freed variable), a range outside its share, or a request
    /// it could not serve. The class follows `reason`, whichever path (a
    /// one-sided read or an owner-side gather request) met the refusal.
    #[error("{message}")]
    Refused {
        /// The rank that refused.
        peer: usize,
        /// What it refused; decides the Python class.
        reason: RefusedFor,
        /// The call the refusal came back on, where one did (one-sided reads).
        call: Option<&'static str>,
        /// That call's return code.
        code: Option<i64>,
        /// What was refused and why.
        message: String,
    },
    /// A read of a share whose owner freed it (a method-2 core job freed the
    /// variable, or freed it and added another under the same name) from a
    /// process that attached to it: this handle reads nothing more; attach
    /// again (maps to `DDStoreStaleError`).
    #[error("{message}")]
    Stale {
        /// The rank whose share was freed.
        peer: usize,
        /// Which variable, and what to do.
        message: String,
    },
    /// Refused for safety: an untrusted directory or file, a wrong token, a name
    /// another live job holds (maps to `DDStoreAccessError`).
    #[error("{0}")]
    Access(String),
    /// The operation is not possible in this configuration.
    #[error("{0}")]
    Unsupported(String),
    /// A source file that cannot be used as it is: a symbolic link where
    /// none is followed, not a regular file, truncated or longer than
    /// described, changed while it was opened, or corrupt (a checksum
    /// mismatch). Maps to `DDStoreFileError`, like [`Error::Io`].
    #[error("{0}")]
    File(String),
    /// A file or shared-memory operation failed (maps to `DDStoreFileError`,
    /// `FileNotFoundError` and `PermissionError` subclasses by the error's kind).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and to which file.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

fn timeout_message(peer: usize, waited: Duration, what: &str) -> String {
    if waited.is_zero() {
        format!("rank {peer} is unreachable: {what}")
    } else {
        format!("timed out after {waited:.1?} waiting for rank {peer}: {what}")
    }
}

/// Why a peer refused a read ([`Error::Refused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusedFor {
    /// The memory key is not one the peer serves: never issued, or its
    /// variable was freed (maps to `DDStoreAccessError`).
    Key,
    /// A range outside the peer's share (maps to `DDStoreIndexError`).
    Range,
    /// A malformed request, or no route back to the reader (maps to `DDStoreError`).
    Other,
}

fn peer_part(peer: Option<usize>) -> String {
    peer.map(|p| format!(" for rank {p}")).unwrap_or_default()
}

impl Error {
    /// The failing libfabric or MPI call (`fi_read`, `MPI_Get`), where one failed.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Error::Call { call, .. } => Some(call),
            Error::Refused { call, .. } => *call,
            _ => None,
        }
    }

    /// The failing call's return code, where a call failed.
    pub fn code(&self) -> Option<i64> {
        match self {
            Error::Call { code, .. } => Some(*code),
            Error::Refused { code, .. } => *code,
            _ => None,
        }
    }

    /// The peer rank involved (a read's owner, a rank that timed out), where there is one.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Call { peer, .. } => *peer,
            Error::Timeout { peer, .. }
            | Error::Refused { peer, .. }
            | Error::Stale { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// An [`Error::UnknownVariable`] for `name`, suggesting the closest of
    /// `known` when it is a likely typo (at most a third of the name's letters
    /// apart, rounded up).
    pub fn unknown_variable<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Self {
        let limit = name.chars().count().div_ceil(3);
        let hint = known
            .into_iter()
            .map(|k| (edit_distance(name, k), k))
            .filter(|(d, _)| *d <= limit)
            .min()
            .map(|(_, k)| format!(" (did you mean '{k}'?)"))
            .unwrap_or_default();
        Error::UnknownVariable {
            name: name.to_string(),
            hint,
        }
    }

    /// An [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    /// An [`Error::Io`] with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Levenshtein distance between two names, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_variable_suggests_a_close_name() {
        let known = ["train", "valid", "graphs/x"];
        let typo = Error::unknown_variable("trian", known).to_string();
        assert!(
            typo.contains("unknown variable 'trian' (did you mean 'train'?)"),
            "{typo}"
        );
        let far = Error::unknown_variable("labels", known).to_string();
        assert!(!far.contains("did you mean"), "{far}");
        assert_eq!(edit_distance("graphs/y", "graphs/x"), 1);
    }
}
