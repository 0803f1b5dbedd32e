//! File descriptors: the soft `RLIMIT_NOFILE` raised to the hard limit once
//! per process (as MPI libraries do), the pre-flight check of what a
//! connection-oriented provider (tcp;ofi_rxm, verbs;ofi_rxm) will need, and
//! the size of the bounded set of live connections a reader endpoint keeps
//! where the limit is below one connection per peer (and, by default, in
//! jobs of more than [`DEFAULT_MAX_CONNECTIONS`] remote ranks).

use std::sync::OnceLock;

/// The soft limit before and after [`raise_soft_limit`], and the hard limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit this process started with.
    pub before: u64,
    /// The soft limit now.
    pub after: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

static RAISED: OnceLock<Option<Raised>> = OnceLock::new();

fn get() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and has no other effect.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some((lim.rlim_cur, lim.rlim_max))
}

/// Raises the soft descriptor limit to the hard one (capped by the kernel's
/// `fs.nr_open`), once per process; later calls return what the first did.
/// None when the limits could not be read or set (the check below then
/// works from the limit as it is).
pub fn raise_soft_limit() -> Option<Raised> {
    *RAISED.get_or_init(|| {
        let (soft, hard) = get()?;
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        let target = hard.min(nr_open);
        if soft < target {
            let lim = libc::rlimit {
                rlim_cur: target,
                rlim_max: hard,
            };
            // SAFETY: setrlimit reads the struct we pass; raising the soft
            // limit up to the hard one needs no privilege.
            let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
            if rc != 0 {
                return None;
            }
        }
        let (after, hard) = get()?;
        Some(Raised {
            before: soft,
            after,
            hard,
        })
    })
}

/// Descriptors this process has open now (entries of /proc/self/fd).
pub fn open_now() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Descriptors the fabric, domain and serving endpoint of tcp;ofi_rxm hold
/// (measured: `python tests/scripts/scale_fds.py`).
pub const PER_PROCESS: u64 = 10;
/// Descriptors each reader endpoint holds besides its connections.
pub const PER_ENDPOINT: u64 = 10;
/// Descriptors one remote peer costs: this rank's connection to it, and its
/// reader's connection to this rank.
pub const PER_PEER: u64 = 2;
/// Descriptors left free for the application beside the bounded set.
pub const SPARE: u64 = 4;
/// The fewest live connections a reader endpoint works with (the bounded
/// set's floor: below it the pre-flight check fails).
pub const MIN_CONNECTIONS: u64 = 2;

/// Descriptors a rank of a job of `ranks` ranks needs on a connection-
/// oriented provider to keep one connection per peer: `open` + 10 + T x
/// (10 + 2R), with one reader endpoint (T = 1) and R the ranks it reaches
/// over the network (`ranks` - 1, less its `node_peers` when they are read
/// through shared memory). Each reader endpoint keeps a connection to every
/// owner it read from, and each owner one accepted connection per remote
/// reader endpoint.
pub fn need(open: u64, ranks: usize, node_peers: usize) -> u64 {
    let remote = ranks.saturating_sub(1).saturating_sub(node_peers) as u64;
    open + PER_PROCESS + PER_ENDPOINT + PER_PEER * remote
}

/// Hard descriptor limits below this may leave a job with fewer descriptors
/// than one connection per peer: the bounded set of live connections can
/// then be needed (and rxm must close a connection at `fi_av_remove`).
pub const LOW_HARD_LIMIT: u64 = 8192;

/// Whether this process's hard `RLIMIT_NOFILE` is below [`LOW_HARD_LIMIT`].
pub fn hard_limit_is_low() -> bool {
    get().is_some_and(|(_, hard)| hard < LOW_HARD_LIMIT)
}

/// Live connections a reader endpoint keeps at most by default: each one
/// holds the provider's buffers (about 20-25 KiB on tcp;ofi_rxm with
/// libfabric 1.x, more with 2.x), and a peer's reader holds one back, so a
/// job of more ranks than this bounds its per-peer memory (about 50 MiB)
/// and descriptors at this set, reconnecting idle peers as reads need them.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Live connections a reader endpoint opened now may keep (its bounded
/// set): `setting` (`DDSTORE_MAX_CONNECTIONS`) when given, else as many as
/// the soft limit leaves room for beside the `open` descriptors, at least 1
/// and at most [`DEFAULT_MAX_CONNECTIONS`].
pub fn connections_allowed(setting: usize) -> usize {
    if setting > 0 {
        return setting;
    }
    let Some((soft, _)) = get() else {
        return DEFAULT_MAX_CONNECTIONS;
    };
    let free = soft.saturating_sub(open_now() + PER_ENDPOINT + SPARE);
    usize::try_from(free / PER_PEER)
        .unwrap_or(usize::MAX)
        .clamp(1, DEFAULT_MAX_CONNECTIONS)
}

/// Whether the limit leaves room for one more reader endpoint that may
/// connect to `peers` peers (a pool opens more than one only then).
pub fn room_for_endpoint(peers: usize) -> bool {
    get()
        .is_none_or(|(soft, _)| open_now() + PER_ENDPOINT + PER_PEER * peers as u64 + SPARE <= soft)
}

/// Why this rank cannot hold the connections of a job of `ranks` ranks on
/// `transport` (e.g. "ofi:tcp;ofi_rxm"), or None: the pre-flight check of a
/// variable's creation (method 2 extra jobs: of a join). Only rxm providers
/// keep a connection per peer; `node_sharing`: same-node peers are read
/// through shared memory (the launcher says how many there are);
/// `max_connections`: `DDSTORE_MAX_CONNECTIONS` (0: as many as fit). Below
/// one connection per peer a bounded set of live connections keeps the job
/// working (idle peers are disconnected, reconnected on their next read):
/// this fails only when even the smallest set does not fit.
pub fn preflight(
    transport: &str,
    ranks: usize,
    node_sharing: bool,
    max_connections: usize,
) -> Option<String> {
    if !transport.contains("ofi_rxm") {
        return None;
    }
    let (soft, _) = get()?;
    let node_peers = if node_sharing {
        crate::launcher::detect_env()
            .ok()
            .flatten()
            .and_then(|l| l.local_size)
            .unwrap_or(1)
            .saturating_sub(1)
    } else {
        0
    };
    let remote = ranks.saturating_sub(1).saturating_sub(node_peers) as u64;
    let open = open_now();
    let full = need(open, ranks, node_peers);
    let set = match max_connections as u64 {
        0 => MIN_CONNECTIONS,
        n => n,
    }
    .min(remote);
    let needed = (open + PER_PROCESS + PER_ENDPOINT + PER_PEER * set + SPARE).min(full);
    if needed <= soft {
        return None;
    }
    let at_least = if needed < full {
        format!(" (at least `ulimit -n {needed}`)")
    } else {
        String::new()
    };
    let setting = match max_connections {
        0 => String::new(),
        n => format!("={n}"),
    };
    Some(format!(
        "this job of {ranks} ranks on {} needs at least {needed} file descriptors per rank \
         even with a bounded set of {set} live connections (DDSTORE_MAX_CONNECTIONS{setting}; \
         {open} open now + 10 + a reader endpoint's 10 + 2 x {set} + {SPARE} spare), and \
         {full} for one connection to each of its {remote} remote ranks, but the limit is \
         {soft} (`ulimit -n`, already raised to the hard limit): raise it with `ulimit -n \
         {full}`{at_least} before the job starts (the hard limit too: \
         `ulimit -Hn`, the launcher's or limits.conf's setting), or run fewer ranks",
        transport.trim_start_matches("ofi:"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_grows_with_remote_ranks_and_the_check_skips_connectionless_providers() {
        assert_eq!(need(20, 1, 0), 40);
        assert_eq!(need(20, 16, 0), 20 + 10 + 10 + 30);
        assert_eq!(need(20, 16, 7), 20 + 10 + 10 + 16);
        assert_eq!(preflight("ofi:cxi", 1 << 20, false, 0), None);
        assert_eq!(preflight("mpi-rma", 1 << 20, false, 0), None);
        // Past the limit the bounded set works: only a set too large for it fails.
        assert_eq!(preflight("ofi:tcp;ofi_rxm", 1 << 40, false, 0), None);
        let big = preflight("ofi:tcp;ofi_rxm", 1 << 40, false, 1 << 40).expect("fires");
        assert!(
            big.contains("ulimit -n")
                && big.contains("tcp;ofi_rxm")
                && big.contains("DDSTORE_MAX_CONNECTIONS="),
            "{big}"
        );
        assert_eq!(preflight("ofi:tcp;ofi_rxm", 2, false, 0), None);
        assert_eq!(connections_allowed(7), 7);
        assert_eq!(connections_allowed(1 << 20), 1 << 20); // explicit: as asked
        assert!((1..=DEFAULT_MAX_CONNECTIONS).contains(&connections_allowed(0)));
    }
}
