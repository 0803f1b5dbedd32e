//! Settings read from the environment once, when a store is created.
//!
//! One table ([`SETTINGS`]) lists every `DDSTORE_*` variable with what it
//! accepts and what an unset variable means; one parser ([`Kind::parse`])
//! checks a value against its row. [`Settings`] is one validated snapshot
//! (the environment plus a store constructor's arguments), taken once per
//! store, each variable checked once; [`Config`] is the typed part the core
//! and transports use, built from a snapshot without parsing again. Nothing
//! below reads a `DDSTORE_*` variable on the read path.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::kinds::CommKind;
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
    /// Live connections a reader endpoint keeps on connection-oriented
    /// providers; past it idle peers are disconnected (`DDSTORE_MAX_CONNECTIONS`;
    /// 0: as many as the descriptor limit allows, at most
    /// [`crate::fd_limit::DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Remote batches through the owner-side gather path (`DDSTORE_REMOTE_GATHER`).
    pub remote_gather: RemoteGather,
    /// Reader endpoints an owner's gather path serves at once; past them a
    /// request is answered "busy" and retried (`DDSTORE_GATHER_READERS`).
    pub gather_readers: usize,
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
    /// Rows a spilling variable's read-ahead stage holds at least, within
    /// half its budget (`DDSTORE_STAGE_ROWS`; see [`crate::spill::stage::stage_bytes`]).
    pub stage_rows: u64,
}

/// `DDSTORE_REMOTE_GATHER`: how remote rows are read over libfabric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RemoteGather {
    /// The gather path where it is faster (tcp;ofi_rxm), one-sided reads
    /// elsewhere (cxi, verbs, efa, shm: the NIC or the kernel does them;
    /// sockets: measured no faster gathered); where it gathers, an owner
    /// asked for one short read in a batch gets it one-sided.
    #[default]
    Auto,
    /// Always one-sided reads.
    Off,
    /// Every remote read through the gather path, on any provider offering
    /// tagged messages.
    On,
}

impl Default for Config {
    /// What every variable unset means (the table's defaults).
    fn default() -> Self {
        Settings::default().config()
    }
}

impl Config {
    /// Reads every `DDSTORE_*` setting; a malformed value is an error naming it.
    pub fn from_env() -> Result<Config> {
        Ok(Settings::from_env()?.config())
    }

    /// As [`Config::from_env`], reading variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        Ok(Settings::from_lookup(get)?.config())
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

/// What a setting is once checked, for typed access.
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

/// A checked value: its normalised spelling (flags "0"/"1", words lower
/// case), which snapshots keep and pickle, and its typed value.
#[derive(Clone, Debug, PartialEq)]
struct Checked {
    text: String,
    value: Value,
}

impl Kind {
    /// The one parser: `raw` (trimmed, not empty) as a value of this kind,
    /// or what was expected instead.
    fn parse(self, raw: &str) -> std::result::Result<Checked, String> {
        let checked = |text: String, value| Ok(Checked { text, value });
        match self {
            Kind::Flag => match raw.to_ascii_lowercase().as_str() {
                "1" | "true" => checked("1".into(), Value::Flag(true)),
                "0" | "false" => checked("0".into(), Value::Flag(false)),
                _ => Err("0, 1, true or false".into()),
            },
            Kind::Int { min, max } => match raw.parse::<i64>() {
                Ok(v) if (min..=max).contains(&v) => checked(v.to_string(), Value::Int(v)),
                _ => Err(format!("an integer from {min} to {max}")),
            },
            // Counts up to 2^53, durations up to a year: beyond that a value is a typo.
            Kind::Positive => match raw.parse::<f64>() {
                Ok(v) if v.is_finite() && (1.0..=(1u64 << 53) as f64).contains(&v) => {
                    checked(v.to_string(), Value::Int(v as i64))
                }
                _ => Err("a positive number".into()),
            },
            Kind::Seconds => match raw.parse::<f64>() {
                Ok(v) if v.is_finite() && (1e-3..=365.0 * 86400.0).contains(&v) => {
                    checked(v.to_string(), Value::Seconds(v))
                }
                _ => Err("a positive number".into()),
            },
            Kind::Choice(words) => {
                let low = raw.to_ascii_lowercase();
                if words.contains(&low.as_str()) {
                    checked(low.clone(), Value::Text(low))
                } else {
                    Err(format!("one of {}", words.join(", ")))
                }
            }
            Kind::Text => checked(raw.to_string(), Value::Text(raw.to_string())),
            Kind::Provider => {
                let low = raw.to_ascii_lowercase();
                let part_ok = |p: &str| {
                    p.len() <= 32
                        && p.starts_with(|c: char| c.is_ascii_alphabetic())
                        && p.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                };
                if low.split(';').all(part_ok) {
                    checked(low.clone(), Value::Text(low))
                } else {
                    Err(
                        "a libfabric provider name such as cxi, verbs, efa, opx, psm3, ucx, \
                         tcp, shm or tcp;ofi_rxm"
                            .into(),
                    )
                }
            }
        }
    }
}

/// One `DDSTORE_*` variable: what it accepts and what leaving it unset means.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The variable's name.
    pub key: &'static str,
    /// What it accepts.
    pub kind: Kind,
    /// What an unset variable means, spelled as the variable would be; None:
    /// unset has a meaning of its own, decided where it is used.
    pub default: Option<&'static str>,
    /// An older name of this variable, read when this one is unset.
    pub older: Option<&'static str>,
}

impl Setting {
    const fn new(key: &'static str, kind: Kind, default: Option<&'static str>) -> Setting {
        Setting {
            key,
            kind,
            default,
            older: None,
        }
    }

    /// The row itself, or an error (a typo in code) for a name that is no setting.
    pub fn of(key: &str) -> Result<&'static Setting> {
        SETTINGS
            .iter()
            .find(|s| s.key == key)
            .ok_or_else(|| Error::invalid(format!("{key} is not a pyddstore setting")))
    }

    /// `raw` (trimmed, not empty) checked as the variable's value.
    fn check_env(&self, raw: &str) -> Result<Checked> {
        self.kind.parse(raw).map_err(|expected| {
            Error::invalid(format!(
                "environment variable {}={raw:?} is not valid: expected {expected}",
                self.key
            ))
        })
    }

    /// `raw` (trimmed, not empty) checked as the value of the argument `source`.
    fn check_arg(&self, raw: &str, source: &str) -> Result<Checked> {
        self.kind.parse(raw).map_err(|expected| {
            Error::invalid(format!(
                "{source}={raw:?} ({}) is not valid: expected {expected}",
                self.key
            ))
        })
    }
}

/// An integer setting's range.
const fn range(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

/// Every `DDSTORE_*` variable pyddstore reads, in one table, with its
/// default: [`Settings`] validates all of them at store creation (Rust and
/// Python read the same table, Python as `pyddstore.Settings`). To add a
/// setting, add its row here (and to docs/guides/tuning.md).
pub const SETTINGS: &[Setting] = &[
    Setting::new("DDSTORE_METHOD", range(0, 2), None),
    Setting::new("DDSTORE_COMM", Kind::Choice(&CommKind::FORCEABLE), None),
    Setting::new("DDSTORE_MPI", Kind::Flag, Some("1")),
    Setting::new("DDSTORE_HANDSHAKE_DIR", Kind::Text, None),
    Setting::new("DDSTORE_HANDSHAKE_TIMEOUT_S", Kind::Seconds, Some("300")),
    Setting::new("DDSTORE_N_CORE", range(0, 1 << 24), Some("0")),
    Setting::new("DDSTORE_MAX_READ_BYTES", Kind::Positive, Some("67108864")),
    Setting::new("DDSTORE_MAX_INFLIGHT", range(1, 1 << 20), Some("64")),
    Setting::new("DDSTORE_TIMEOUT_S", Kind::Seconds, Some("60")),
    Setting::new("DDSTORE_ABORT_ON_EXCEPTION", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_SHM", Kind::Flag, Some("1")),
    Setting::new("DDSTORE_THREAD_READERS", Kind::Flag, Some("1")),
    Setting::new("DDSTORE_MAX_CONNECTIONS", range(0, 1 << 24), Some("0")),
    // Any libfabric provider name (efa, opx, psm3, ucx, ...), not only the known ones.
    Setting::new("DDSTORE_FABRIC", Kind::Provider, None),
    Setting::new("DDSTORE_NIC_MAP", Kind::Text, None),
    Setting::new("DDSTORE_FORK_WORKERS", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_BATCH_GET", Kind::Flag, Some("1")),
    Setting::new("DDSTORE_FAST_COLLATE", Kind::Flag, Some("1")),
    Setting::new("DDSTORE_AFFINITY_WIDTH", range(0, 1 << 16), Some("0")),
    Setting::new("DDSTORE_AFFINITY_OFFSET", range(0, 1 << 16), Some("0")),
    Setting::new("DDSTORE_PROFILE", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_QUIET", Kind::Flag, Some("0")),
    // debug, info, warning, error or a number: checked by pyddstore's logging set-up.
    Setting::new("DDSTORE_LOG_LEVEL", Kind::Text, None),
    Setting {
        older: Some("DDSTORE_LOAD_THREADS"),
        ..Setting::new("DDSTORE_LOAD_DEPTH", range(1, 1024), Some("32"))
    },
    Setting::new("DDSTORE_LOAD_THREADS", range(1, 1024), None),
    Setting::new("DDSTORE_LOAD_DIRECT", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_LOAD_TIMEOUT_S", Kind::Seconds, Some("600")),
    Setting::new("DDSTORE_CORE_GROUP", range(0, 1 << 24), Some("0")),
    Setting::new("DDSTORE_OFI_LOCAL_MR", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_OFI_HMEM", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_TEST_HOST_AS_DEVICE", Kind::Flag, Some("0")),
    Setting::new(
        "DDSTORE_MPI_THREAD_LEVEL",
        Kind::Choice(&["single", "funneled", "serialized", "multiple"]),
        Some("multiple"),
    ),
    Setting::new("DDSTORE_JOB_ID", Kind::Text, None),
    Setting::new("DDSTORE_JOB_TOKEN", Kind::Text, None),
    Setting::new(
        "DDSTORE_REMOTE_GATHER",
        Kind::Choice(&["auto", "0", "1"]),
        Some("auto"),
    ),
    Setting::new("DDSTORE_GATHER_READERS", range(1, 1 << 24), Some("4096")),
    Setting::new("DDSTORE_TEST_LONG", Kind::Flag, Some("0")),
    Setting::new("DDSTORE_VCLUSTER_HARNESS", Kind::Text, None),
    Setting::new("DDSTORE_HOST_ID", Kind::Text, None),
    Setting::new("DDSTORE_MPI_FAKE_NODE_SIZE", range(1, 1 << 20), None),
    // Bytes of a rank's shares kept in memory (0: every row spills); unset: all in memory.
    Setting::new("DDSTORE_MEMORY_LIMIT", range(0, 1 << 53), None),
    Setting::new("DDSTORE_SPILL_DIR", Kind::Text, None),
    // Rows a spilling variable's read-ahead stage holds at least (k batches of large rows).
    Setting::new("DDSTORE_STAGE_ROWS", range(0, 1 << 32), Some("32")),
    // Batches ThreadDataLoader's read-ahead stages past those handed to its workers.
    Setting::new("DDSTORE_READ_AHEAD_BATCHES", range(1, 1 << 16), Some("4")),
];

/// One setting read from the process environment and checked against
/// `SETTINGS` (for the few read where no store exists yet: job and host ids,
/// test knobs); `None` when unset or empty.
pub fn env_setting(key: &str) -> Result<Option<String>> {
    setting(&|k| std::env::var(k).ok(), key)
}

/// The checked, normalised value of `key` read through `get`; `None` when
/// unset or empty. Unknown keys are an error (a typo in code).
pub fn setting(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<String>> {
    let row = Setting::of(key)?;
    Ok(read(row, get)?.map(|c| c.text))
}

/// `row`'s variable read through `get` and checked; None when unset or empty.
fn read(row: &Setting, get: &impl Fn(&str) -> Option<String>) -> Result<Option<Checked>> {
    let Some(raw) = get(row.key) else {
        return Ok(None);
    };
    match raw.trim() {
        "" => Ok(None),
        raw => row.check_env(raw).map(Some),
    }
}

/// One validated snapshot of every `DDSTORE_*` setting: the environment,
/// read once, with the values a store's constructor arguments give on top
/// (an argument wins over its variable). Each value was checked against
/// [`SETTINGS`] once; a bad one is an error naming the variable (or the argument).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// Checked values of the settings that are set.
    values: BTreeMap<&'static str, Checked>,
}

impl Settings {
    /// Reads and checks every `DDSTORE_*` variable of the process environment.
    pub fn from_env() -> Result<Settings> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Settings::from_env`] with the environment given by `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        let mut values = BTreeMap::new();
        for row in SETTINGS {
            if let Some(v) = read(row, &get)? {
                values.insert(row.key, v);
            }
        }
        Ok(Settings { values })
    }

    /// These settings with `key` set to `value` (a constructor argument:
    /// `source` names it in the error, e.g. "method"). An empty value unsets it.
    pub fn with(&self, key: &str, value: &str, source: &str) -> Result<Settings> {
        let row = Setting::of(key)?;
        let mut values = self.values.clone();
        match value.trim() {
            "" => values.remove(row.key),
            raw => values.insert(row.key, row.check_arg(raw, source)?),
        };
        Ok(Settings { values })
    }

    /// The checked value of `key` as set (flags "0"/"1"), None when unset.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|c| c.text.as_str())
    }

    /// Whether `key` was set (in the environment or by an argument).
    pub fn is_set(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The value of `key`, else of its older name, else its default, typed
    /// by its kind; None when unset without a default.
    pub fn value(&self, key: &str) -> Result<Option<Value>> {
        let row = Setting::of(key)?;
        let set = self
            .values
            .get(row.key)
            .or_else(|| row.older.and_then(|k| self.values.get(k)));
        if let Some(c) = set {
            return Ok(Some(c.value.clone()));
        }
        match row.default {
            None => Ok(None),
            Some(d) => Ok(Some(row.check_arg(d, "the default")?.value)),
        }
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

    /// The typed settings the core and the transports use (no parsing: the
    /// values were checked when the snapshot was taken).
    pub fn config(&self) -> Config {
        let int = |k| match self.value(k) {
            Ok(Some(Value::Int(v))) => v,
            other => unreachable!("{k} is an integer with a default in SETTINGS: {other:?}"),
        };
        let seconds = |k| match self.value(k) {
            Ok(Some(Value::Seconds(v))) => Duration::from_secs_f64(v),
            other => unreachable!("{k} is seconds with a default in SETTINGS: {other:?}"),
        };
        let text = |k| self.raw(k).map(str::to_string);
        Config {
            max_read_bytes: int("DDSTORE_MAX_READ_BYTES") as usize,
            max_inflight: int("DDSTORE_MAX_INFLIGHT") as usize,
            timeout: seconds("DDSTORE_TIMEOUT_S"),
            handshake_timeout: seconds("DDSTORE_HANDSHAKE_TIMEOUT_S"),
            node_sharing: self.flag("DDSTORE_SHM"),
            thread_readers: self.flag("DDSTORE_THREAD_READERS"),
            max_connections: int("DDSTORE_MAX_CONNECTIONS") as usize,
            remote_gather: match self.raw("DDSTORE_REMOTE_GATHER") {
                Some("1") => RemoteGather::On,
                Some("0") => RemoteGather::Off,
                _ => RemoteGather::Auto,
            },
            gather_readers: int("DDSTORE_GATHER_READERS") as usize,
            fabric: text("DDSTORE_FABRIC"),
            nic_map: text("DDSTORE_NIC_MAP"),
            ofi_local_mr: self.flag("DDSTORE_OFI_LOCAL_MR"),
            ofi_hmem: self.flag("DDSTORE_OFI_HMEM"),
            read_by_other_jobs: false,
            memory_limit: match self.value("DDSTORE_MEMORY_LIMIT") {
                Ok(Some(Value::Int(v))) => Some(v as u64),
                _ => None,
            },
            spill_dir: text("DDSTORE_SPILL_DIR").map(std::path::PathBuf::from),
            stage_rows: int("DDSTORE_STAGE_ROWS") as u64,
        }
    }

    /// Every setting that is set, as (variable, checked value).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.values.iter().map(|(k, c)| (*k, c.text.as_str()))
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
    fn defaults_come_from_the_table() {
        let c = Config::default();
        assert_eq!((c.max_read_bytes, c.max_inflight), (64 << 20, 64), "{c:?}");
        assert_eq!(c.timeout, Duration::from_secs(60));
        assert_eq!(c.handshake_timeout, Duration::from_secs(300));
        assert!(c.node_sharing && c.thread_readers && !c.ofi_local_mr && !c.ofi_hmem);
        assert_eq!(c.remote_gather, RemoteGather::Auto);
        assert_eq!((c.fabric, c.nic_map), (None, None));
        // Every default is a valid value of its row, and every switch has one.
        for row in SETTINGS {
            if let Some(d) = row.default {
                assert!(row.kind.parse(d).is_ok(), "{} default {d:?}", row.key);
            }
            if matches!(row.kind, Kind::Flag) {
                assert!(
                    row.default.is_some(),
                    "{} is a flag without a default",
                    row.key
                );
            }
            if let Some(older) = row.older {
                assert!(Setting::of(older).is_ok(), "{older} has no row");
            }
        }
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
            err.contains("DDSTORE_REMOTE_GATHER") && err.contains("one of auto, 0, 1"),
            "{err}"
        );
    }

    #[test]
    fn an_older_name_counts_when_the_new_one_is_unset() {
        let s = |pairs: &'static [(&str, &str)]| {
            Settings::from_lookup(move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
            .unwrap()
        };
        let depth = |s: Settings| s.value("DDSTORE_LOAD_DEPTH").unwrap();
        assert_eq!(depth(s(&[])), Some(Value::Int(32)));
        assert_eq!(
            depth(s(&[("DDSTORE_LOAD_THREADS", "5")])),
            Some(Value::Int(5))
        );
        const BOTH: &[(&str, &str)] = &[("DDSTORE_LOAD_THREADS", "5"), ("DDSTORE_LOAD_DEPTH", "8")];
        assert_eq!(depth(s(BOTH)), Some(Value::Int(8)));
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
        let c = s.config();
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
            err.contains("method=\"7\" (DDSTORE_METHOD)") && err.contains("from 0 to 2"),
            "{err}"
        );
        assert!(s.with("NOT_A_SETTING", "1", "x").is_err());
        assert!(!s
            .with("DDSTORE_SHM", "", "shm")
            .unwrap()
            .is_set("DDSTORE_SHM"));
        // A bad value anywhere names its variable.
        let err = Settings::from_lookup(|k| (k == "DDSTORE_QUIET").then(|| "yes".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DDSTORE_QUIET=\"yes\""), "{err}");
    }
}
