//! Settings read from the environment once, when a store is created.

use std::time::Duration;

use crate::{Error, Result};

#[derive(Clone, Debug)]
pub struct Config {
    /// Longest single read; longer runs are split (`DDSTORE_MAX_READ_BYTES`).
    pub max_read_bytes: usize,
    /// Reads posted before waiting for completions (`DDSTORE_MAX_INFLIGHT`).
    pub max_inflight: usize,
    /// How long a read or handshake waits for a peer (`DDSTORE_TIMEOUT_S`).
    pub timeout: Duration,
    /// How long a joining job waits for published records (`DDSTORE_HANDSHAKE_TIMEOUT_S`).
    pub handshake_timeout: Duration,
    /// Same-node peers read each other's shares through shared memory (`DDSTORE_SHM`).
    pub node_sharing: bool,
    /// Every reading thread gets its own reader (`DDSTORE_THREAD_READERS`).
    pub thread_readers: bool,
    /// Remote batches through the owner-side gather path (`DDSTORE_REMOTE_GATHER`).
    pub remote_gather: RemoteGather,
}

/// `DDSTORE_REMOTE_GATHER`: how remote rows are read over libfabric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RemoteGather {
    /// The gather path where it is faster (tcp;ofi_rxm), one-sided reads
    /// elsewhere (cxi, verbs, efa, shm: the NIC or the kernel does them;
    /// sockets: measured no faster gathered).
    #[default]
    Auto,
    /// Always one-sided reads.
    Off,
    /// The gather path on any provider offering tagged messages.
    On,
}

impl RemoteGather {
    /// Parses `DDSTORE_REMOTE_GATHER` (auto, 0, 1); a bad value names the variable.
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<RemoteGather> {
        const KEY: &str = "DDSTORE_REMOTE_GATHER";
        match get(KEY).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "auto") => Ok(RemoteGather::Auto),
            Some(_) => Ok(match parse_flag(get, KEY) {
                Ok(Some(true)) => RemoteGather::On,
                Ok(_) => RemoteGather::Off,
                Err(_) => {
                    let raw = get(KEY).unwrap_or_default();
                    return Err(Error::invalid(format!(
                        "environment variable {KEY}={raw:?} is not valid: expected auto, 0 or 1"
                    )));
                }
            }),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_read_bytes: 64 << 20,
            max_inflight: 64,
            timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(300),
            node_sharing: true,
            thread_readers: true,
            remote_gather: RemoteGather::Auto,
        }
    }
}

impl Config {
    /// Reads every `DDSTORE_*` setting; a malformed value is an error naming it.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let d = Config::default();
        Ok(Config {
            max_read_bytes: parse_positive(&get, "DDSTORE_MAX_READ_BYTES")?
                .unwrap_or(d.max_read_bytes as f64) as usize,
            max_inflight: setting(&get, "DDSTORE_MAX_INFLIGHT")?
                .map_or(d.max_inflight, |v| v.parse().expect("checked integer")),
            timeout: parse_positive(&get, "DDSTORE_TIMEOUT_S")?
                .map(Duration::from_secs_f64)
                .unwrap_or(d.timeout),
            handshake_timeout: parse_positive(&get, "DDSTORE_HANDSHAKE_TIMEOUT_S")?
                .map(Duration::from_secs_f64)
                .unwrap_or(d.handshake_timeout),
            node_sharing: parse_flag(&get, "DDSTORE_SHM")?.unwrap_or(d.node_sharing),
            thread_readers: parse_flag(&get, "DDSTORE_THREAD_READERS")?.unwrap_or(d.thread_readers),
            remote_gather: RemoteGather::from_lookup(&get)?,
        })
        .and_then(|c| {
            check_env(&get)?;
            Ok(c)
        })
    }
}

/// What a `DDSTORE_*` variable accepts.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Exactly `0`, `1`, `true` or `false`.
    Flag,
    /// An integer in `min..=max`.
    Int { min: i64, max: i64 },
    /// A positive number (count or bytes) up to 2^53.
    Positive,
    /// Seconds, 0.001 to a year.
    Seconds,
    /// One of these words (lower case).
    Choice(&'static [&'static str]),
    /// Free text (paths, ids, tokens, maps), checked where used.
    Text,
    /// A libfabric provider name: `;`-separated parts, each a letter then letters,
    /// digits, `_` or `-` ("psm3", "tcp;ofi_rxm"); whether it exists here is
    /// checked by the transport.
    Provider,
}

/// Every `DDSTORE_*` variable pyddstore reads, in one table: `check_env`
/// validates all of them at store creation (Rust and Python read the same
/// table). To add a setting, add its row here.
pub const SETTINGS: &[(&str, Kind)] = &[
    ("DDSTORE_METHOD", Kind::Int { min: 0, max: 2 }),
    ("DDSTORE_COMM", Kind::Choice(&["mpi", "torch", "file"])),
    ("DDSTORE_MPI", Kind::Flag),
    ("DDSTORE_HANDSHAKE_DIR", Kind::Text),
    ("DDSTORE_HANDSHAKE_TIMEOUT_S", Kind::Seconds),
    (
        "DDSTORE_N_CORE",
        Kind::Int {
            min: 0,
            max: 1 << 24,
        },
    ),
    ("DDSTORE_MAX_READ_BYTES", Kind::Positive),
    (
        "DDSTORE_MAX_INFLIGHT",
        Kind::Int {
            min: 1,
            max: 1 << 20,
        },
    ),
    ("DDSTORE_TIMEOUT_S", Kind::Seconds),
    ("DDSTORE_SHM", Kind::Flag),
    ("DDSTORE_THREAD_READERS", Kind::Flag),
    // Any libfabric provider name (efa, opx, psm3, ucx, ...), not only the known ones.
    ("DDSTORE_FABRIC", Kind::Provider),
    ("DDSTORE_NIC_MAP", Kind::Text),
    ("DDSTORE_FORK_WORKERS", Kind::Flag),
    ("DDSTORE_BATCH_GET", Kind::Flag),
    ("DDSTORE_FAST_COLLATE", Kind::Flag),
    (
        "DDSTORE_AFFINITY_WIDTH",
        Kind::Int {
            min: 0,
            max: 1 << 16,
        },
    ),
    (
        "DDSTORE_AFFINITY_OFFSET",
        Kind::Int {
            min: 0,
            max: 1 << 16,
        },
    ),
    ("DDSTORE_PROFILE", Kind::Flag),
    ("DDSTORE_QUIET", Kind::Flag),
    // debug, info, warning, error or a number: checked by pyddstore's logging set-up.
    ("DDSTORE_LOG_LEVEL", Kind::Text),
    ("DDSTORE_LOAD_THREADS", Kind::Int { min: 1, max: 1024 }),
    ("DDSTORE_LOAD_DEPTH", Kind::Int { min: 1, max: 1024 }),
    ("DDSTORE_LOAD_DIRECT", Kind::Flag),
    ("DDSTORE_LOAD_TIMEOUT_S", Kind::Seconds),
    (
        "DDSTORE_CORE_GROUP",
        Kind::Int {
            min: 0,
            max: 1 << 24,
        },
    ),
    ("DDSTORE_OFI_LOCAL_MR", Kind::Flag),
    ("DDSTORE_OFI_HMEM", Kind::Flag),
    ("DDSTORE_TEST_HOST_AS_DEVICE", Kind::Flag),
    (
        "DDSTORE_MPI_THREAD_LEVEL",
        Kind::Choice(&["single", "funneled", "serialized", "multiple"]),
    ),
    ("DDSTORE_JOB_ID", Kind::Text),
    ("DDSTORE_JOB_TOKEN", Kind::Text),
    ("DDSTORE_REMOTE_GATHER", Kind::Choice(&["auto", "0", "1"])),
    ("DDSTORE_TEST_LONG", Kind::Flag),
    ("DDSTORE_VCLUSTER_HARNESS", Kind::Text),
    ("DDSTORE_HOST_ID", Kind::Text),
    (
        "DDSTORE_MPI_FAKE_NODE_SIZE",
        Kind::Int {
            min: 1,
            max: 1 << 20,
        },
    ),
];

/// The value of a flag or integer setting, checked against `SETTINGS`;
/// `None` when unset or empty. Unknown keys are an error (a typo in code).
pub fn setting(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<String>> {
    let kind = SETTINGS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, kind)| *kind)
        .ok_or_else(|| Error::invalid(format!("{key} is not a pyddstore setting")))?;
    let Some(raw) = get(key) else { return Ok(None) };
    let raw = raw.trim().to_string();
    if raw.is_empty() {
        return Ok(None);
    }
    let bad = |expected: String| {
        Err(Error::invalid(format!(
            "environment variable {key}={raw:?} is not valid: expected {expected}"
        )))
    };
    match kind {
        Kind::Flag => match raw.to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(Some("1".into())),
            "0" | "false" => Ok(Some("0".into())),
            _ => bad("0, 1, true or false".into()),
        },
        Kind::Int { min, max } => match raw.parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(Some(v.to_string())),
            _ => bad(format!("an integer from {min} to {max}")),
        },
        Kind::Positive | Kind::Seconds => {
            parse_positive(get, key).map(|v| v.map(|v| v.to_string()))
        }
        Kind::Choice(words) => {
            let low = raw.to_ascii_lowercase();
            if words.contains(&low.as_str()) {
                Ok(Some(low))
            } else {
                bad(format!("one of {}", words.join(", ")))
            }
        }
        Kind::Text => Ok(Some(raw)),
        Kind::Provider => {
            let low = raw.to_ascii_lowercase();
            let part_ok = |p: &str| {
                p.len() <= 32
                    && p.starts_with(|c: char| c.is_ascii_alphabetic())
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            };
            if low.split(';').all(part_ok) {
                Ok(Some(low))
            } else {
                bad("a libfabric provider name such as cxi, verbs, efa, opx, psm3, ucx, tcp, shm or \
                     tcp;ofi_rxm"
                    .into())
            }
        }
    }
}

/// Validates every `DDSTORE_*` setting that is set; the first bad one is an
/// error naming the variable and what it accepts.
pub fn check_env(get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    for (key, _) in SETTINGS {
        setting(get, key)?;
    }
    Ok(())
}

/// A flag setting from the process environment (`SETTINGS` rules).
pub fn env_flag(key: &str, default: bool) -> Result<bool> {
    Ok(setting(&|k| std::env::var(k).ok(), key)?.map_or(default, |v| v == "1"))
}

fn parse_positive(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<f64>> {
    let Some(raw) = get(key) else { return Ok(None) };
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    // Durations up to a year, counts up to 2^53: beyond that a value is a typo, not a setting.
    let max = if key.ends_with("_S") {
        365.0 * 86400.0
    } else {
        (1u64 << 53) as f64
    };
    match raw.parse::<f64>() {
        Ok(v) if v.is_finite() && v <= max && (v >= 1.0 || (key.ends_with("_S") && v >= 1e-3)) => {
            Ok(Some(v))
        }
        _ => Err(Error::invalid(format!(
            "environment variable {key}={raw:?} is not valid: expected a positive number"
        ))),
    }
}

/// Parses a switch: exactly `0`, `1`, `true` or `false`.
pub fn parse_flag(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<bool>> {
    let Some(raw) = get(key) else { return Ok(None) };
    match raw.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "1" | "true" => Ok(Some(true)),
        "0" | "false" => Ok(Some(false)),
        other => Err(Error::invalid(format!(
            "environment variable {key}={other:?} is not valid: expected 0, 1, true or false"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let c = Config::from_lookup(|k| match k {
            "DDSTORE_MAX_READ_BYTES" => Some("4096".into()),
            "DDSTORE_SHM" => Some("0".into()),
            "DDSTORE_TIMEOUT_S" => Some("0.5".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.max_read_bytes, 4096);
        assert!(!c.node_sharing);
        assert_eq!(c.timeout, Duration::from_millis(500));
        let bad = Config::from_lookup(|k| (k == "DDSTORE_MAX_INFLIGHT").then(|| "lots".into()));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("DDSTORE_MAX_INFLIGHT"));
    }

    #[test]
    fn remote_gather_values() {
        let with = |v: &'static str| {
            Config::from_lookup(move |k| (k == "DDSTORE_REMOTE_GATHER").then(|| v.to_string()))
        };
        assert_eq!(with("auto").unwrap().remote_gather, RemoteGather::Auto);
        assert_eq!(with(" AUTO ").unwrap().remote_gather, RemoteGather::Auto);
        assert_eq!(with("1").unwrap().remote_gather, RemoteGather::On);
        assert_eq!(with("0").unwrap().remote_gather, RemoteGather::Off);
        assert_eq!(with("").unwrap().remote_gather, RemoteGather::Auto);
        let err = with("fast").unwrap_err().to_string();
        assert!(
            err.contains("DDSTORE_REMOTE_GATHER") && err.contains("auto, 0 or 1"),
            "{err}"
        );
    }
}
