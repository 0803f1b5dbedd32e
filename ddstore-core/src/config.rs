//! Settings read from the environment once, when a store is created.
//!
//! One table ([`SETTINGS`]) lists every `DDSTORE_*` variable with what it
//! accepts and its default; [`Settings`] is one validated snapshot of them
//! (the environment plus a store constructor's arguments), taken once per
//! store, and [`Config`] the typed part the core and transports use. Nothing
//! below reads a `DDSTORE_*` variable on the read path.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{Error, Result};

/// Store settings from the environment, validated once per store (see [`SETTINGS`]).
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
    /// The libfabric provider asked for (`DDSTORE_FABRIC`; None: the default list).
    pub fabric: Option<String>,
    /// Per-local-rank NIC map (`DDSTORE_NIC_MAP`), unless the store's argument gives one.
    pub nic_map: Option<String>,
    /// Register every read destination (`DDSTORE_OFI_LOCAL_MR`; tests).
    pub ofi_local_mr: bool,
    /// Open the `FI_HMEM` domain even for host memory given as an external share
    /// (`DDSTORE_OFI_HMEM`; tests run the device path on a CPU with it).
    pub ofi_hmem: bool,
    /// Other jobs read this store's shares (a method-2 core job; set by the
    /// caller, not by a variable): freed shares keep their address range
    /// reserved (see [`crate::transport::ExposeOptions::keep_address`]).
    pub read_by_other_jobs: bool,
    /// Bytes of this rank's shares kept in memory; the rest spills (`DDSTORE_MEMORY_LIMIT`).
    pub memory_limit: Option<u64>,
    /// Where spill files go (`DDSTORE_SPILL_DIR`; None: `$TMPDIR/ddstore-spill-<uid>`).
    pub spill_dir: Option<std::path::PathBuf>,
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
            fabric: None,
            nic_map: None,
            ofi_local_mr: false,
            ofi_hmem: false,
            read_by_other_jobs: false,
            memory_limit: None,
            spill_dir: None,
        }
    }
}

impl Config {
    /// Reads every `DDSTORE_*` setting; a malformed value is an error naming it.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get` (tests pass a map).
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
            fabric: setting(&get, "DDSTORE_FABRIC")?,
            nic_map: setting(&get, "DDSTORE_NIC_MAP")?,
            ofi_local_mr: parse_flag(&get, "DDSTORE_OFI_LOCAL_MR")?.unwrap_or(d.ofi_local_mr),
            ofi_hmem: parse_flag(&get, "DDSTORE_OFI_HMEM")?.unwrap_or(d.ofi_hmem),
            read_by_other_jobs: d.read_by_other_jobs,
            memory_limit: setting(&get, "DDSTORE_MEMORY_LIMIT")?
                .map(|v| v.parse().expect("checked integer")),
            spill_dir: setting(&get, "DDSTORE_SPILL_DIR")?.map(std::path::PathBuf::from),
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
    Int {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
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
    ("DDSTORE_ABORT_ON_EXCEPTION", Kind::Flag),
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
    // Bytes of a rank's shares kept in memory (0: every row spills).
    (
        "DDSTORE_MEMORY_LIMIT",
        Kind::Int {
            min: 0,
            max: 1 << 53,
        },
    ),
    ("DDSTORE_SPILL_DIR", Kind::Text),
    (
        "DDSTORE_MPI_FAKE_NODE_SIZE",
        Kind::Int {
            min: 1,
            max: 1 << 20,
        },
    ),
];

/// One setting read from the process environment and checked against
/// `SETTINGS` (for the few read where no store exists yet: job and host ids,
/// test knobs); `None` when unset or empty.
pub fn env_setting(key: &str) -> Result<Option<String>> {
    setting(&|k| std::env::var(k).ok(), key)
}

/// The value of a flag or integer setting, checked against `SETTINGS`;
/// `None` when unset or empty. Unknown keys are an error (a typo in code).
pub fn setting(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<String>> {
    let kind = kind_of(key)?;
    let Some(raw) = get(key) else { return Ok(None) };
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    check_value(key, kind, raw).map(Some).map_err(|expected| {
        Error::invalid(format!(
            "environment variable {key}={raw:?} is not valid: expected {expected}"
        ))
    })
}

/// What `SETTINGS` says `key` accepts; an unknown key is an error (a typo in code).
fn kind_of(key: &str) -> Result<Kind> {
    SETTINGS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, kind)| *kind)
        .ok_or_else(|| Error::invalid(format!("{key} is not a pyddstore setting")))
}

/// `raw` (trimmed, not empty) checked as a value of `key`: its normalised
/// form (flags "0"/"1", words lower case), or what was expected instead.
fn check_value(key: &str, kind: Kind, raw: &str) -> std::result::Result<String, String> {
    match kind {
        Kind::Flag => match raw.to_ascii_lowercase().as_str() {
            "1" | "true" => Ok("1".into()),
            "0" | "false" => Ok("0".into()),
            _ => Err("0, 1, true or false".into()),
        },
        Kind::Int { min, max } => match raw.parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v.to_string()),
            _ => Err(format!("an integer from {min} to {max}")),
        },
        Kind::Positive | Kind::Seconds => positive(key, raw).map(|v| v.to_string()),
        Kind::Choice(words) => {
            let low = raw.to_ascii_lowercase();
            if words.contains(&low.as_str()) {
                Ok(low)
            } else {
                Err(format!("one of {}", words.join(", ")))
            }
        }
        Kind::Text => Ok(raw.to_string()),
        Kind::Provider => {
            let low = raw.to_ascii_lowercase();
            let part_ok = |p: &str| {
                p.len() <= 32
                    && p.starts_with(|c: char| c.is_ascii_alphabetic())
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            };
            if low.split(';').all(part_ok) {
                Ok(low)
            } else {
                Err("a libfabric provider name such as cxi, verbs, efa, opx, psm3, ucx, tcp, shm or \
                     tcp;ofi_rxm"
                    .into())
            }
        }
    }
}

/// A positive number: seconds (`*_S`, 0.001 to a year) or a count (1 to 2^53).
fn positive(key: &str, raw: &str) -> std::result::Result<f64, String> {
    // Durations up to a year, counts up to 2^53: beyond that a value is a typo, not a setting.
    let seconds = key.ends_with("_S");
    let max = if seconds {
        365.0 * 86400.0
    } else {
        (1u64 << 53) as f64
    };
    match raw.parse::<f64>() {
        Ok(v) if v.is_finite() && v <= max && (v >= 1.0 || (seconds && v >= 1e-3)) => Ok(v),
        _ => Err("a positive number".into()),
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

/// Defaults of the settings that have one (what an unset variable means);
/// the others are "unset" (None) and their users decide.
pub const DEFAULTS: &[(&str, &str)] = &[
    ("DDSTORE_MPI", "1"),
    ("DDSTORE_HANDSHAKE_TIMEOUT_S", "300"),
    ("DDSTORE_N_CORE", "0"),
    ("DDSTORE_MAX_READ_BYTES", "67108864"),
    ("DDSTORE_MAX_INFLIGHT", "64"),
    ("DDSTORE_TIMEOUT_S", "60"),
    ("DDSTORE_ABORT_ON_EXCEPTION", "0"),
    ("DDSTORE_SHM", "1"),
    ("DDSTORE_THREAD_READERS", "1"),
    ("DDSTORE_BATCH_GET", "1"),
    ("DDSTORE_FAST_COLLATE", "1"),
    ("DDSTORE_AFFINITY_WIDTH", "0"),
    ("DDSTORE_AFFINITY_OFFSET", "0"),
    ("DDSTORE_CORE_GROUP", "0"),
    ("DDSTORE_MPI_THREAD_LEVEL", "multiple"),
    ("DDSTORE_REMOTE_GATHER", "auto"),
    ("DDSTORE_LOAD_TIMEOUT_S", "600"),
];

/// What a setting of `kind` is once checked, for typed access.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A switch.
    Flag(bool),
    /// An integer (`Int`, and `Positive` counts and bytes).
    Int(i64),
    /// Seconds.
    Seconds(f64),
    /// A word, text or provider name.
    Text(String),
}

/// One validated snapshot of every `DDSTORE_*` setting: the environment,
/// read once, with the values a store's constructor arguments give on top
/// (an argument wins over its variable). Each value was checked against
/// [`SETTINGS`]; a bad one is an error naming the variable (or the argument).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// Checked, normalised values of the settings that are set (flags as "0"/"1").
    values: BTreeMap<&'static str, String>,
}

impl Settings {
    /// Reads and checks every `DDSTORE_*` variable of the process environment.
    pub fn from_env() -> Result<Settings> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Settings::from_env`] with the environment given by `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        let mut values = BTreeMap::new();
        for (key, _) in SETTINGS {
            if let Some(v) = setting(&get, key)? {
                values.insert(*key, v);
            }
        }
        let settings = Settings { values };
        settings.config()?; // the typed part parses too (one error, naming the variable)
        Ok(settings)
    }

    /// These settings with `key` set to `value` (a constructor argument:
    /// `source` names it in the error, e.g. "method"). An empty value unsets it.
    pub fn with(&self, key: &str, value: &str, source: &str) -> Result<Settings> {
        let key = Self::known(key)?;
        let mut values = self.values.clone();
        let raw = value.trim();
        if raw.is_empty() {
            values.remove(key);
        } else {
            let v = check_value(key, kind_of(key)?, raw).map_err(|expected| {
                Error::invalid(format!(
                    "{source}={raw:?} ({key}) is not valid: expected {expected}"
                ))
            })?;
            values.insert(key, v);
        }
        let settings = Settings { values };
        settings.config()?;
        Ok(settings)
    }

    fn known(key: &str) -> Result<&'static str> {
        SETTINGS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(k, _)| *k)
            .ok_or_else(|| Error::invalid(format!("{key} is not a pyddstore setting")))
    }

    /// The checked value of `key` as set (flags "0"/"1"), None when unset.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// Whether `key` was set (in the environment or by an argument).
    pub fn is_set(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The value of `key`, else its default ([`DEFAULTS`]; flags default to
    /// off), typed by its kind; None when unset without a default.
    pub fn value(&self, key: &str) -> Result<Option<Value>> {
        let key = Self::known(key)?;
        let kind = SETTINGS.iter().find(|(k, _)| *k == key).expect("known").1;
        let raw = self
            .raw(key)
            .or_else(|| DEFAULTS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v));
        let Some(raw) = raw else {
            return Ok(matches!(kind, Kind::Flag).then_some(Value::Flag(false)));
        };
        let bad = || Error::invalid(format!("{key}={raw:?} does not parse as its kind"));
        Ok(Some(match kind {
            Kind::Flag => Value::Flag(raw == "1"),
            Kind::Int { .. } => Value::Int(raw.parse().map_err(|_| bad())?),
            Kind::Positive => Value::Int(raw.parse::<f64>().map_err(|_| bad())? as i64),
            Kind::Seconds => Value::Seconds(raw.parse().map_err(|_| bad())?),
            Kind::Choice(_) | Kind::Text | Kind::Provider => Value::Text(raw.to_string()),
        }))
    }

    /// A switch's value (its default when unset).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.value(key), Ok(Some(Value::Flag(true))))
    }

    /// A lookup serving the snapshot for `DDSTORE_*` names and the process
    /// environment for anything else (launcher and libfabric variables).
    pub fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |k: &str| {
            if k.starts_with("DDSTORE_") {
                self.raw(k).map(str::to_string)
            } else {
                std::env::var(k).ok()
            }
        }
    }

    /// The typed settings the core and the transports use.
    pub fn config(&self) -> Result<Config> {
        Config::from_lookup(|k| self.raw(k).map(str::to_string))
    }

    /// Every setting that is set, as (variable, checked value).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }
}

fn parse_positive(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<f64>> {
    let Some(raw) = get(key) else { return Ok(None) };
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    positive(key, raw).map(Some).map_err(|expected| {
        Error::invalid(format!(
            "environment variable {key}={raw:?} is not valid: expected {expected}"
        ))
    })
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

    #[test]
    fn settings_snapshot_and_arguments() {
        let s = Settings::from_lookup(|k| match k {
            "DDSTORE_SHM" => Some("false".into()),
            "DDSTORE_TIMEOUT_S" => Some("2.5".into()),
            "DDSTORE_FABRIC" => Some("TCP".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.raw("DDSTORE_SHM"), Some("0"));
        assert!(!s.flag("DDSTORE_SHM"));
        assert!(s.flag("DDSTORE_THREAD_READERS"), "default on");
        assert!(!s.flag("DDSTORE_QUIET"), "flags default off");
        assert_eq!(
            s.value("DDSTORE_TIMEOUT_S").unwrap(),
            Some(Value::Seconds(2.5))
        );
        assert_eq!(
            s.value("DDSTORE_MAX_INFLIGHT").unwrap(),
            Some(Value::Int(64))
        );
        assert_eq!(s.value("DDSTORE_N_CORE").unwrap(), Some(Value::Int(0)));
        assert_eq!(s.value("DDSTORE_JOB_ID").unwrap(), None);
        let c = s.config().unwrap();
        assert_eq!(c.fabric.as_deref(), Some("tcp"));
        assert!(!c.node_sharing);
        // An argument wins over the variable, and is checked with its name.
        let s2 = s.with("DDSTORE_METHOD", "2", "method").unwrap();
        assert_eq!(s2.value("DDSTORE_METHOD").unwrap(), Some(Value::Int(2)));
        let err = s
            .with("DDSTORE_METHOD", "7", "method")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("method=") && err.contains("DDSTORE_METHOD"),
            "{err}"
        );
        assert!(s.with("NOT_A_SETTING", "1", "x").is_err());
        // A bad value anywhere names its variable.
        let err = Settings::from_lookup(|k| (k == "DDSTORE_QUIET").then(|| "yes".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DDSTORE_QUIET=\"yes\""), "{err}");
    }
}
