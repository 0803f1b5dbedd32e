//! The libfabric variables pyddstore defaults, set in one place.
//!
//! libfabric reads its variables once, when it initialises (the process's
//! first `fi_getinfo`), and `setenv` is not safe while another thread may
//! call `getenv`. So [`apply_libfabric_defaults`] runs once, before anything
//! else: the Python extension calls it when it is imported (before any
//! pyddstore or libfabric thread exists), and [`super::Info::query`] calls it
//! before the first `fi_getinfo` for programs that use this crate directly.
//! A variable the user set is never changed. Nothing else in pyddstore sets
//! an environment variable.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use ddstore_core::config::Settings;
use ddstore_core::Config;

use super::select;

/// The PSM libraries' variables that keep them from installing signal handlers,
/// set (to "1") unless the user set them. libinfinipath (PSM, TrueScale) and
/// libpsm2 before 11 install, from a load-time constructor, handlers for
/// SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT that write a `*.btr`
/// backtrace file into the working directory and `exit(1)`: Ctrl-C no longer
/// raises `KeyboardInterrupt`, SIGTERM and `abort()` end with status 1 instead of
/// 143 and 134, and `exit()` from a signal handler can deadlock. Only the variable's
/// presence counts. Debian's libfabric links them, so they load with the extension:
/// the Python package sets these before it loads it (`pyddstore/__init__.py`, the
/// same list); libfabric builds that load them as providers (`dl`) read them at the
/// first `fi_getinfo`. libpsm2 11 and libfabric's psm3 install none unless `HFI_BACKTRACE`
/// or `PSM3_BACKTRACE` is set (left alone). Open MPI's `MPI_Init` sets the same two.
pub const PROVIDER_SIGNAL_VARIABLES: [&str; 2] = ["IPATH_NO_BACKTRACE", "HFI_NO_BACKTRACE"];

/// rxm's receive buffer size for the (control-only) messages of a store.
pub(crate) const RXM_BUFFER_BYTES: usize = 1024;

/// What [`apply_libfabric_defaults`] did, for `python -m pyddstore info` and tests.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// (variable, value, set here: false when the user had set it).
    pub variables: Vec<(&'static str, String, bool)>,
}

static APPLIED: OnceLock<Applied> = OnceLock::new();

/// 0: no `fi_getinfo` yet; 1: the first one ran after the defaults; 2: before them.
static FIRST_QUERY: AtomicU8 = AtomicU8::new(0);

/// Over tcp, rxm gives each endpoint an internal completion queue of
/// 4096 (shared receive queue) + 128 (transmit depth) × `FI_UNIVERSE_SIZE`
/// entries, rounded up to a power of two; the universe defaults to 1024:
/// 262,144 entries of 48 bytes, 12 MiB per endpoint. Completions are
/// written round that ring, so every reader's resident memory climbs by
/// 48 bytes per completed read until all of it has been touched (measured:
/// +21 MiB, 7%, over 750,000 remote rows per rank). A reader keeps at most
/// `max_inflight` reads outstanding, so 128 × universe ≥ `max_inflight` is
/// enough (16: 8,192 entries, 384 KiB; an overflow would spill to
/// libfabric's overflow list, not fail).
pub(crate) fn universe_size_for(config: &Config) -> usize {
    const RXM_MSG_QUEUE_DEPTH: usize = 128;
    config.max_inflight.div_ceil(RXM_MSG_QUEUE_DEPTH).max(16)
}

/// The defaults for an environment (`get`), as (variable, value):
///
/// - [`PROVIDER_SIGNAL_VARIABLES`] = 1: the PSM libraries install no signal handlers.
/// - `FI_CXI_DISABLE_HOST_REGISTER=1`: skips GPU-runtime registration of CXI
///   host buffers, which fails after fork.
/// - `DDSTORE_FORK_WORKERS=1`: `FI_MR_CACHE_MONITOR=memhooks` (kdreg2, Frontier's
///   default, does not work in forked processes; memhooks does at the same speed),
///   replacing an unset or `kdreg2` value.
/// - rxm providers (`DDSTORE_FABRIC` tcp, hsn, verbs or `*;ofi_rxm`):
///   `FI_UNIVERSE_SIZE` (see [`universe_size_for`]; only for rxm: other
///   providers size peer tables from it, cxi's address vectors) and
///   `FI_OFI_RXM_BUFFER_SIZE` (rxm posts thousands of 16 KiB receive buffers
///   for unexpected messages; reads and gather replies never use them: 1 KiB
///   cut a 4-rank tcp process from 290 to 80 MiB resident at the same speed)
///   and, where the bounded set of live connections can be needed
///   (`DDSTORE_MAX_CONNECTIONS` set, a hard `ulimit -n` below
///   `fd_limit::LOW_HARD_LIMIT`, or a job of more ranks than
///   `fd_limit::DEFAULT_MAX_CONNECTIONS`, as its launcher says; see
///   `pool.rs`), `FI_AV_REMOVE_CLEANUP=1` (`fi_av_remove` closes the peer's
///   connection: a reader's eviction frees its descriptors and memory; the
///   gather server removes only a stalled reader's address, whose
///   connection it means to close).
/// - over tcp, `FI_OFI_RXM_EAGER_LIMIT` = `DDSTORE_MAX_READ_BYTES`: gather
///   replies go eager, straight into the reader's posted buffer (1 x 3 KB
///   rows 130 -> 60 µs, measured with `python -m pyddstore.bench`; libfabric
///   1.x: 2.x has no such variable), and `FI_TCP_MAX_RX_SIZE=1024` (libfabric
///   2.x: tcp's buffers, in a pool of 1,024 per domain and its receives, 16 KiB
///   each by default: 234 -> 80 MiB per 4-rank process; 1.x has no such variable).
///
/// With `DDSTORE_FABRIC` unset the provider is chosen later, among cxi, efa,
/// opx, verbs and tcp: on a machine with no such NIC ([`rdma_nic_present`])
/// that is tcp, so its defaults apply as if `DDSTORE_FABRIC=tcp` were set.
///
/// Invalid `DDSTORE_*` values count as unset here: the store reports them.
pub fn defaults_for(get: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let low_limit = ddstore_core::fd_limit::hard_limit_is_low();
    defaults_for_machine(get, rdma_nic_present(), low_limit)
}

/// Whether this machine has a NIC a provider before tcp in the default order
/// would use: an RDMA device (verbs, efa, opx: `/sys/class/infiniband`) or a
/// Slingshot NIC (cxi).
pub fn rdma_nic_present() -> bool {
    let any_entry = |dir: &str| {
        std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    };
    any_entry("/sys/class/infiniband")
        || any_entry("/sys/class/cxi")
        || std::path::Path::new("/dev/cxi0").exists()
}

fn defaults_for_machine(
    get: impl Fn(&str) -> Option<String>,
    nic_present: bool,
    low_fd_limit: bool,
) -> Vec<(&'static str, String)> {
    let settings = Settings::from_lookup(&get).unwrap_or_default();
    let config = settings.config();
    let mut out: Vec<(&'static str, String)> = PROVIDER_SIGNAL_VARIABLES
        .iter()
        .map(|&name| (name, "1".to_string()))
        .collect();
    out.push(("FI_CXI_DISABLE_HOST_REGISTER", "1".to_string()));
    if settings.flag("DDSTORE_FORK_WORKERS")
        && matches!(
            get("FI_MR_CACHE_MONITOR").as_deref(),
            None | Some("" | "kdreg2")
        )
    {
        out.push(("FI_MR_CACHE_MONITOR", "memhooks".into()));
    }
    let provider = match config.fabric.as_deref() {
        None if !nic_present => Some("tcp;ofi_rxm".to_string()),
        fabric => select::provider_candidates(fabric)
            .ok()
            .filter(|c| c.len() == 1)
            .map(|mut c| c.remove(0)),
    };
    if let Some(p) = provider.filter(|p| p.contains("ofi_rxm")) {
        out.push(("FI_UNIVERSE_SIZE", universe_size_for(&config).to_string()));
        out.push(("FI_OFI_RXM_BUFFER_SIZE", RXM_BUFFER_BYTES.to_string()));
        let large_job = ddstore_core::launcher::detect(&get)
            .ok()
            .flatten()
            .is_some_and(|l| l.size > ddstore_core::fd_limit::DEFAULT_MAX_CONNECTIONS + 1);
        if low_fd_limit || config.max_connections > 0 || large_job {
            out.push(("FI_AV_REMOVE_CLEANUP", "1".into()));
        }
        if p.starts_with("tcp") {
            out.push(("FI_OFI_RXM_EAGER_LIMIT", config.max_read_bytes.to_string()));
            // libfabric 2.x tcp's buffers (each domain's pool of 1,024 transfers, and
            // its receives): rxm's size, as rxm posts the receives.
            out.push(("FI_TCP_MAX_RX_SIZE", RXM_BUFFER_BYTES.to_string()));
        }
    }
    out
}

/// Why pyddstore sets `name` (one of [`defaults_for`]'s variables), in a line, for
/// `python -m pyddstore info` and the debug log.
pub fn reason(name: &str) -> &'static str {
    match name {
        "IPATH_NO_BACKTRACE" | "HFI_NO_BACKTRACE" => {
            "PSM (libinfinipath) and PSM2 before 11: no signal handlers of theirs (Ctrl-C, \
             SIGTERM and abort() would exit 1 and write a .btr file into the working directory)"
        }
        "FI_CXI_DISABLE_HOST_REGISTER" => {
            "cxi: skip the GPU runtime's registration of host buffers, which fails after fork"
        }
        "FI_MR_CACHE_MONITOR" => {
            "DDSTORE_FORK_WORKERS=1: memhooks works in forked DataLoader workers, kdreg2 does not"
        }
        "FI_UNIVERSE_SIZE" => {
            "rxm: sizes each endpoint's completion ring (12 MiB at the default, resident memory \
             climbing 48 B per read); max(16, DDSTORE_MAX_INFLIGHT/128) covers the read window"
        }
        "FI_OFI_RXM_BUFFER_SIZE" => {
            "rxm: its receive buffers carry control messages only (290 -> 80 MiB per 4-rank tcp \
             process, same read speed)"
        }
        "FI_AV_REMOVE_CLEANUP" => {
            "rxm: fi_av_remove closes the peer's connection, so a reader endpoint keeps a \
             bounded set of live connections where `ulimit -n` is below one per peer, or the \
             job has more ranks than the set (DDSTORE_MAX_CONNECTIONS)"
        }
        "FI_OFI_RXM_EAGER_LIMIT" => {
            "tcp (libfabric 1.x): gather replies up to DDSTORE_MAX_READ_BYTES go eager, \
             straight into the reader's buffer (1 x 3 KB rows 130 -> 60 us)"
        }
        "FI_TCP_MAX_RX_SIZE" => {
            "tcp (libfabric 2.x): its transfer pools and receives hold buffers of this size, \
             16 KiB each by default (234 -> 80 MiB per 4-rank process, same read speed)"
        }
        _ => "",
    }
}

/// Sets the libfabric variables pyddstore defaults (see [`defaults_for`]),
/// once per process; later calls return what the first did. Call it before
/// any thread that may read the environment exists.
pub fn apply_libfabric_defaults() -> &'static Applied {
    apply_libfabric_defaults_after(&[])
}

/// [`apply_libfabric_defaults`] where the loader set `preset` (some of
/// [`PROVIDER_SIGNAL_VARIABLES`], to "1") before loading libfabric: they count
/// as set by pyddstore, not by the user. Other names are ignored.
pub fn apply_libfabric_defaults_after(preset: &[String]) -> &'static Applied {
    APPLIED.get_or_init(|| {
        let mut variables = Vec::new();
        for (name, value) in defaults_for(|k| std::env::var(k).ok()) {
            let forced = name == "FI_MR_CACHE_MONITOR"; // replaces kdreg2, see defaults_for
            let ours_already = PROVIDER_SIGNAL_VARIABLES.contains(&name)
                && preset.iter().any(|p| p == name)
                && std::env::var(name).ok().as_deref() == Some(value.as_str());
            if ours_already {
                variables.push((name, value, true));
                continue;
            }
            // Only a variable's presence counts for the PSM libraries: an empty one is the user's.
            let user = std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty() || PROVIDER_SIGNAL_VARIABLES.contains(&name));
            if user.is_some() && !forced {
                variables.push((name, user.unwrap_or_default(), false));
                continue;
            }
            // glibc's setenv never frees an environment a concurrent getenv may
            // be reading; this runs once, before pyddstore or libfabric starts threads.
            std::env::set_var(name, &value);
            variables.push((name, value, true));
        }
        Applied { variables }
    })
}

/// Records the first `fi_getinfo` (after making sure the defaults are set).
pub(crate) fn before_first_query() {
    let before = APPLIED.get().is_some();
    let _ = FIRST_QUERY.compare_exchange(
        0,
        if before { 1 } else { 2 },
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    apply_libfabric_defaults();
}

/// Whether libfabric started after the defaults were set: None when it has
/// not started in this process.
pub fn started_after_defaults() -> Option<bool> {
    match FIRST_QUERY.load(Ordering::SeqCst) {
        0 => None,
        v => Some(v == 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(env: &[(&str, &str)]) -> Vec<(&'static str, String)> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        defaults_for_machine(
            move |k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            true,
            true,
        )
    }

    #[test]
    fn av_removal_closes_connections_where_the_bounded_set_can_be_needed() {
        let cleanup = |size: &str, max_connections: &str| {
            let env = [
                ("DDSTORE_FABRIC", "tcp"),
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", size),
                ("DDSTORE_MAX_CONNECTIONS", max_connections),
            ];
            let get = |k: &str| {
                env.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            defaults_for_machine(get, true, false)
                .iter()
                .any(|(k, v)| *k == "FI_AV_REMOVE_CLEANUP" && v == "1")
        };
        // A job of more ranks than the default set, or a set asked for.
        assert!(!cleanup("64", "0"));
        assert!(!cleanup("1025", "0"));
        assert!(cleanup("1026", "0"));
        assert!(cleanup("16384", "0"));
        assert!(cleanup("64", "8"));
    }

    #[test]
    fn defaults_follow_the_provider_and_settings() {
        let plain = names(&[]);
        assert_eq!(
            plain,
            vec![
                ("IPATH_NO_BACKTRACE", "1".into()),
                ("HFI_NO_BACKTRACE", "1".into()),
                ("FI_CXI_DISABLE_HOST_REGISTER", "1".into())
            ]
        );
        let tcp = names(&[
            ("DDSTORE_FABRIC", "tcp"),
            ("DDSTORE_MAX_READ_BYTES", "4096"),
        ]);
        assert!(tcp.contains(&("FI_UNIVERSE_SIZE", "16".into())));
        assert!(tcp.contains(&("FI_OFI_RXM_BUFFER_SIZE", "1024".into())));
        assert!(tcp.contains(&("FI_AV_REMOVE_CLEANUP", "1".into())));
        assert!(tcp.contains(&("FI_OFI_RXM_EAGER_LIMIT", "4096".into())));
        assert!(tcp.contains(&("FI_TCP_MAX_RX_SIZE", "1024".into())));
        let verbs = names(&[("DDSTORE_FABRIC", "verbs")]);
        assert!(verbs.iter().any(|(k, _)| *k == "FI_UNIVERSE_SIZE"));
        assert!(!verbs.iter().any(|(k, _)| *k == "FI_OFI_RXM_EAGER_LIMIT"));
        assert!(!verbs.iter().any(|(k, _)| *k == "FI_TCP_MAX_RX_SIZE"));
        let fork = names(&[
            ("DDSTORE_FORK_WORKERS", "1"),
            ("FI_MR_CACHE_MONITOR", "kdreg2"),
        ]);
        assert!(fork.contains(&("FI_MR_CACHE_MONITOR", "memhooks".into())));
        let user = names(&[
            ("DDSTORE_FORK_WORKERS", "1"),
            ("FI_MR_CACHE_MONITOR", "uffd"),
        ]);
        assert!(!user.iter().any(|(k, _)| *k == "FI_MR_CACHE_MONITOR"));
        // A bad setting counts as unset here (the store names it).
        let bad = names(&[("DDSTORE_FABRIC", "tcp"), ("DDSTORE_MAX_INFLIGHT", "lots")]);
        assert_eq!(bad, plain);
        // Every variable set here says why.
        for (name, _) in names(&[("DDSTORE_FABRIC", "tcp"), ("DDSTORE_FORK_WORKERS", "1")]) {
            assert!(!reason(name).is_empty(), "{name} has no reason");
        }
        // Unset on a machine without an RDMA or Slingshot NIC: tcp will be chosen.
        let no_nic = defaults_for_machine(|_| None, false, false);
        assert!(no_nic.contains(&("FI_OFI_RXM_EAGER_LIMIT", (64usize << 20).to_string())));
        assert!(no_nic.contains(&("FI_OFI_RXM_BUFFER_SIZE", "1024".into())));
    }

    #[test]
    fn universe_covers_the_read_window_and_stays_small() {
        let with = |max_inflight| Config {
            max_inflight,
            ..Config::default()
        };
        // Default window: 4096 + 16 × 128 → 8,192 CQ entries, 384 KiB.
        assert_eq!(universe_size_for(&Config::default()), 16);
        assert_eq!(universe_size_for(&with(1)), 16);
        // rxm's ring has room for 128 × universe transmit completions: at least the window.
        for w in [2048, 4096, 100_000] {
            assert!(universe_size_for(&with(w)) * 128 >= w, "window {w}");
        }
    }
}
