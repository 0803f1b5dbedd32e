//! A reader of remote shares: one-sided reads (`fi_read`) posted in a
//! window and completed with a deadline, and gathers from owners that serve
//! the gather path ([`super::gather::client`]), through an endpoint of the
//! domain's [`EndpointPool`] lent for each call.

use std::os::raw::c_void;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_core::row_map::RowMap;
use ddstore_core::transport::{RaggedRequest, RaggedRows, ReaderTimes, RemoteRead, ShareReader};
use libfabric_sys as sys;

use super::gather::client::{self, Client};
use super::gather::plan::{self, Limits, Plan, PlanScratch, RaggedOwner};
use super::gather::replies;
use super::gather::wire::MacKey;
use super::pool::{warn_bounded, EndpointPool};
use super::record::{PeerShare, Peers};
use super::window::{
    naming_peer, post_retrying, reap, InFlight, Landing, Live, Op, Posted, Stopped,
};
use crate::error::{FabricError, FabricResult};

/// The longest single read of an owner that
/// [`ReaderSettings::few_reads_one_sided`] sends one-sided. Measured on
/// tcp;ofi_rxm with every rank reading (`python -m pyddstore.benchmarks.paths`,
/// both paths alternated round by round): one row from an owner costs one
/// round trip either way, and the provider's own read response is cheaper
/// than a request and a reply (3 KB: 31 vs 57 µs, 256 KiB: 144 vs 405 µs,
/// 1 MiB: about equal, 4 MiB: gathered 1.5x faster).
pub const ONE_SIDED_SINGLE_MAX: usize = 1 << 20;

/// An owner asked for at most this many reads, each shorter than
/// [`ONE_SIDED_FEW_MAX`], gets them one-sided too: two 3 KB rows from one
/// owner cost about the same either way on a quiet node (0.98x) and 1.35x
/// as long gathered beside 8 busy processes (the owner's thread wakes for a
/// request, then the reply; the provider answers both reads in one wake).
/// From three rows on, or two rows of 256 KiB and more, one gathered request
/// wins (3 rows of 3 KB: 0.70x quiet, 1.05x loaded; 8 rows: 0.46x, 0.77x).
pub const ONE_SIDED_FEW: usize = 2;

/// The longest read counted among an owner's [`ONE_SIDED_FEW`] reads.
pub const ONE_SIDED_FEW_MAX: usize = 64 << 10;

/// Bytes of the landing one-sided reads go through (at least the longest
/// read): a batch's reads are posted in rounds of at most this many bytes,
/// each copied out once it has completed, so an endpoint keeps at most this
/// much beyond its longest read.
pub const LANDING_BYTES: usize = 4 << 20;

/// How one-sided reads of a batch are posted.
struct ReadTarget {
    /// The landing's local descriptor (null where the provider needs none).
    desc: *mut c_void,
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`), not offsets.
    virt_addr: bool,
}

pub struct ReaderSettings {
    pub window: usize,
    pub timeout: Duration,
    pub max_read_bytes: usize,
    /// Register the landing and pass its descriptor even when the provider
    /// does not require FI_MR_LOCAL (always legal; tests the cxi/verbs path).
    pub force_local_mr: bool,
    /// Read from owners whose record offers it through the gather path
    /// (the domain has tagged messages).
    pub gather: bool,
    /// With the gather path on: an owner asked for one read of at most
    /// [`ONE_SIDED_SINGLE_MAX`] bytes, or for at most [`ONE_SIDED_FEW`]
    /// reads shorter than [`ONE_SIDED_FEW_MAX`], gets them one-sided instead
    /// (`DDSTORE_REMOTE_GATHER=auto`; `1` gathers every read).
    pub few_reads_one_sided: bool,
    /// The key gather requests are MACed under (`None`: no gather requests).
    pub mac_key: Option<MacKey>,
    /// Where discarded replies are counted (the variable's profile).
    pub discarded: Arc<AtomicU64>,
}

/// Reads remote shares, through an endpoint of [`EndpointPool`] lent for
/// each call; one per thread.
pub struct OfiReader {
    /// The endpoint lent for the current call.
    live: Option<Live>,
    pool: Arc<EndpointPool>,
    broken: Option<String>,
    peers: Arc<Peers>,
    settings: ReaderSettings,
    /// Longest gather reply message.
    chunk: usize,
    /// Longest one-sided read the provider takes (`max_msg_size`); the store
    /// plans no longer reads, so a read is always one `fi_read`.
    max_msg: usize,
    virt_addr: bool,
    local_mr: bool,
    /// The lent endpoint's name: owners address their replies to it.
    name: Vec<u8>,
    /// Time spent in the endpoints lent to earlier calls (the lent one keeps
    /// its own until it is given back).
    times: ReaderTimes,
    /// Gather replies are received from their owner's address only.
    directed: bool,
    /// The gather planner's maps, kept between batches.
    plan_scratch: PlanScratch,
}

impl OfiReader {
    /// A reader of the shares `peers` describe, through endpoints of `pool`.
    pub fn open(
        pool: &Arc<EndpointPool>,
        peers: Arc<Peers>,
        settings: ReaderSettings,
    ) -> FabricResult<OfiReader> {
        let domain = pool.domain();
        // The gather path needs a receive and the request's send in flight at once.
        let window = settings.window.max(if settings.gather { 2 } else { 1 });
        // Checked before any queue is sized from it: past the provider's
        // transmit queue, fi_enable or a later post would fail obscurely.
        let tx_size = domain.info().tx_size();
        if tx_size > 0 && window > tx_size {
            return Err(FabricError::Invalid(format!(
                "DDSTORE_MAX_INFLIGHT={window} is more than the {} provider's transmit queue of \
                 {tx_size} entries: set DDSTORE_MAX_INFLIGHT to at most {tx_size}",
                domain.info().provider()
            )));
        }
        let info = domain.info();
        let max_msg = info.max_msg_size().max(1);
        let mut reader = OfiReader {
            live: None,
            pool: pool.clone(),
            name: Vec::new(),
            times: ReaderTimes::default(),
            directed: info.caps() & sys::FI_DIRECTED_RECV != 0,
            plan_scratch: PlanScratch::default(),
            broken: None,
            chunk: max_msg.min(settings.max_read_bytes.max(1)),
            max_msg,
            virt_addr: domain.requires(sys::FI_MR_VIRT_ADDR),
            local_mr: domain.requires(sys::FI_MR_LOCAL) || settings.force_local_mr,
            peers,
            settings: ReaderSettings { window, ..settings },
        };
        // Opening one now reports an unusable provider here, not at the first read.
        reader.check_out()?;
        reader.check_in();
        Ok(reader)
    }

    /// Borrows an endpoint from the pool for one call.
    fn check_out(&mut self) -> FabricResult<()> {
        let peers = self.peers.len();
        let mut live = self
            .pool
            .take(self.settings.window, self.settings.gather, peers)?;
        if let Err(e) = live.resolve(&self.peers.addrs) {
            self.pool.give_back(live);
            return Err(e);
        }
        self.name.clone_from(&live.name);
        live.times = ReaderTimes::default();
        live.discarded = self.settings.discarded.clone();
        self.live = Some(live);
        Ok(())
    }

    /// Returns the lent endpoint (a failure that left operations in flight
    /// has already taken it out of use: see `break_reader`).
    fn check_in(&mut self) {
        if let Some(mut live) = self.live.take() {
            self.times = self.times.plus(live.times);
            let bounded = live.release_between_calls
                && live.max_connections < self.peers.len().saturating_sub(1);
            if live.in_flight() {
                self.pool.quarantine(live);
            } else if bounded && live.disconnect_all().is_err() {
                // Its AV refused a removal: out of use rather than a set past its bound.
                self.pool.quarantine(live);
            } else {
                self.pool.give_back(live);
            }
        }
    }

    fn validate(&self, reads: &[RemoteRead], dst_len: usize) -> ddstore_core::Result<()> {
        use ddstore_core::Error;
        for r in reads {
            let peer = self.peers.get(r.owner).ok_or_else(|| {
                Error::IndexOutOfRange(format!(
                    "read from rank {} but only {} ranks expose this share",
                    r.owner,
                    self.peers.len()
                ))
            })?;
            let inside = matches!(r.offset.checked_add(r.len as u64), Some(e) if e <= peer.len);
            if !inside {
                return Err(Error::IndexOutOfRange(format!(
                    "read of {} bytes at offset {} is outside rank {}'s share of {} bytes",
                    r.len, r.offset, r.owner, peer.len
                )));
            }
            if r.len > self.max_msg && !(self.settings.gather && peer.gather) {
                return Err(Error::InvalidArgument(format!(
                    "read of {} bytes from rank {} is longer than the provider's longest \
                     message ({} bytes): split it (the store plans reads no longer)",
                    r.len, r.owner, self.max_msg
                )));
            }
            if !matches!(r.dst_offset.checked_add(r.len), Some(e) if e <= dst_len) {
                return Err(Error::IndexOutOfRange(format!(
                    "read of {} bytes to offset {} overflows a destination of {dst_len} bytes",
                    r.len, r.dst_offset
                )));
            }
        }
        Ok(())
    }

    /// One-sided reads: each read is posted as one `fi_read` (the store
    /// planned them no longer than the provider's longest message) into the
    /// endpoint's [`Landing`], up to the window in flight and as many bytes as
    /// it holds; once a round has completed, its reads are copied into `dst`.
    /// A read given up on a timeout thus never writes into `dst`.
    fn do_reads(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> FabricResult<()> {
        let total: usize = reads.iter().map(|r| r.len).sum();
        let longest = reads.iter().map(|r| r.len).max().unwrap_or(0);
        let live = self.live.as_mut().expect("checked by read_many");
        let started = Instant::now();
        let want = total.min(LANDING_BYTES.max(longest));
        live.landing
            .reserve(&live.ep, want, LANDING_BYTES, self.local_mr)?;
        live.times.mr_ns += started.elapsed().as_nanos() as u64;
        let target = ReadTarget {
            desc: live.landing.desc(),
            virt_addr: self.virt_addr,
        };
        let mut first_error: Option<FabricError> = None;
        // This round's reads: (offset in the landing, read).
        let mut round: Vec<(usize, &RemoteRead)> = Vec::new();
        let mut used = 0;
        for r in reads.iter().filter(|r| r.len > 0) {
            if used + r.len > live.landing.len() {
                // The landing is full: complete this round, copy it out, reuse it.
                live.drain(self.settings.timeout, &mut first_error);
                if live.in_flight() || first_error.is_some() {
                    break;
                }
                copy_out(&live.landing, &round, dst);
                round.clear();
                used = 0;
            }
            let posted = live
                .take_slot(self.settings.timeout, &mut first_error)
                .and_then(|slot| {
                    post_read(
                        live,
                        slot,
                        r,
                        used,
                        &self.peers[r.owner],
                        &target,
                        self.settings.timeout,
                        &mut first_error,
                    )
                });
            if posted.is_err() {
                break;
            }
            round.push((used, r));
            used += r.len;
        }
        // Complete everything posted, even after an error, so the landing is
        // free again; a timeout here breaks the reader (its endpoint, with
        // the landing, is quarantined or closed).
        live.drain(self.settings.timeout, &mut first_error);
        if live.in_flight() {
            let why = first_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default();
            self.break_reader(why);
        } else if first_error.is_none() {
            copy_out(&live.landing, &round, dst);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Operations may still be in flight: take the endpoint out of use
    /// (quarantined or closed, so nothing lands in the caller's memory
    /// later) and refuse further use of this reader.
    fn break_reader(&mut self, why: String) {
        if let Some(live) = self.live.take() {
            self.times = self.times.plus(live.times);
            self.pool.quarantine(live);
        }
        self.broken = Some(why);
    }
}

/// Copies a completed round of reads from the landing into `dst`.
fn copy_out(landing: &Landing, round: &[(usize, &RemoteRead)], dst: &mut [u8]) {
    for &(at, r) in round {
        dst[r.dst_offset..r.dst_offset + r.len].copy_from_slice(landing.landed(at, r.len));
    }
}

/// Posts `r` in `slot`, landing at `at` in the endpoint's landing, retrying
/// while the provider says `FI_EAGAIN` (reaping meanwhile) up to the
/// timeout. On failure the slot is freed.
#[allow(clippy::too_many_arguments)]
fn post_read(
    live: &mut Live,
    slot: usize,
    r: &RemoteRead,
    at: usize,
    peer: &PeerShare,
    target: &ReadTarget,
    timeout: Duration,
    first_error: &mut Option<FabricError>,
) -> Result<(), Stopped> {
    let remote_base = if target.virt_addr { peer.base } else { 0 };
    let posted = post_retrying(
        live,
        timeout,
        r.owner,
        "fi_read kept returning FI_EAGAIN",
        |live| {
            let land = live.landing.at(at, r.len);
            // SAFETY: the bytes lie inside the landing, which does not move
            // until every read completed, and is abandoned with the endpoint
            // (never freed) otherwise; the context slot is reserved until its
            // completion is reaped.
            unsafe {
                live.ep.post_read(
                    land,
                    r.len,
                    target.desc,
                    live.peers_fi[r.owner],
                    remote_base + r.offset,
                    peer.key,
                    live.contexts.ptr(slot),
                )
            }
        },
        |live| {
            if let Err(e) = reap(live, timeout, first_error) {
                first_error.get_or_insert(e);
            }
            if first_error.is_some() {
                return Err(Stopped);
            }
            // Nothing of ours in flight: the provider is busy (e.g. still
            // connecting); do not spin flat out.
            if live.free.len() + 1 == live.slots.len() {
                std::thread::sleep(Duration::from_micros(20));
            }
            Ok(())
        },
    );
    let failed = match posted {
        Posted::Yes => {
            live.slots[slot] = Some(InFlight {
                peer: r.owner,
                posted: Instant::now(),
                op: Op::Read,
            });
            return Ok(());
        }
        Posted::Stopped => None,
        Posted::Failed(e) => Some(naming_peer(e, "read from", r.owner)),
    };
    live.free.push(slot);
    if let Some(e) = failed {
        first_error.get_or_insert(e);
    }
    Err(Stopped)
}

impl OfiReader {
    /// The gather path: one request per owner (more when the batch exceeds a
    /// request or the window), every reply's receive posted before its request
    /// is sent; replies land in the bounce buffer, copied into `dst` as each completes.
    fn do_gather(
        &mut self,
        reads: &[(usize, u64, usize, usize)],
        dst: &mut [u8],
    ) -> FabricResult<()> {
        let limits = self.gather_limits();
        let plan = plan::plan_with(reads, limits, &mut self.plan_scratch);
        self.exchange(&plan, dst, false, &mut Vec::new())
    }

    /// What gather plans of this reader respect.
    fn gather_limits(&self) -> Limits {
        let window = self.live.as_ref().map_or(2, |l| l.slots.len());
        Limits {
            chunk: self.chunk,
            msgs_per_request: window - 1,
            name_len: self.name.len(),
        }
    }

    /// Runs a planned batch ([`client::exchange`]) on the lent endpoint
    /// (`dst_owned`: replies may land in `dst` directly); a batch that may
    /// have left operations in flight, or got a reply that did not match
    /// its receive, breaks the reader.
    fn exchange(
        &mut self,
        plan: &Plan,
        dst: &mut [u8],
        dst_owned: bool,
        got: &mut Vec<usize>,
    ) -> FabricResult<()> {
        let Some(mac_key) = self.settings.mac_key.as_ref() else {
            return Err(FabricError::Unavailable(
                "gather requests need the job's key, which this reader was not given".into(),
            ));
        };
        let live = self.live.as_mut().expect("checked by read_many");
        let client = Client {
            mac_key,
            name: &self.name,
            peers: &self.peers.shares,
            directed: self.directed,
            timeout: self.settings.timeout,
        };
        live.times.gather_requests += plan.requests.len() as u64;
        let done = client::exchange(live, &client, plan, dst, dst_owned, got);
        done.map_err(|failed| {
            if failed.break_reader {
                self.break_reader(failed.error.to_string());
            }
            failed.error
        })
    }
}

impl ShareReader for OfiReader {
    fn times(&self) -> ReaderTimes {
        self.live
            .as_ref()
            .map_or(self.times, |l| self.times.plus(l.times))
    }

    fn read_many(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> ddstore_core::Result<()> {
        if let Some(why) = &self.broken {
            return Err(ddstore_core::Error::Transport(format!(
                "this reader is unusable after an earlier failure ({why}); open a new one"
            )));
        }
        self.validate(reads, dst.len())?;
        if reads.iter().all(|r| r.len == 0) {
            return Ok(());
        }
        self.check_out()?;
        let read = self.read_checked_out(reads, dst);
        self.check_in();
        read
    }

    fn read_ragged_rows(
        &mut self,
        unit_bytes: usize,
        requests: &[RaggedRequest<'_>],
        staging: Vec<u8>,
    ) -> ddstore_core::Result<Option<RaggedRows>> {
        if let Some(why) = &self.broken {
            return Err(ddstore_core::Error::Transport(format!(
                "this reader is unusable after an earlier failure ({why}); open a new one"
            )));
        }
        let served = |r: &RaggedRequest<'_>| self.peers.get(r.owner).is_some_and(|p| p.gather);
        if !self.settings.gather || !requests.iter().all(served) {
            return Ok(None);
        }
        self.check_out()?;
        let read = self.gather_ragged(unit_bytes, requests, staging);
        self.check_in();
        read
    }
}

impl OfiReader {
    /// [`ShareReader::read_many`] once an endpoint is lent: the owners of a
    /// batch are read at most the endpoint's bounded set at a time.
    fn read_checked_out(
        &mut self,
        reads: &[RemoteRead],
        dst: &mut [u8],
    ) -> ddstore_core::Result<()> {
        let max = self.live.as_ref().expect("checked out").max_connections;
        let mut owners: Vec<usize> = reads.iter().map(|r| r.owner).collect();
        owners.sort_unstable();
        owners.dedup();
        if owners.len() <= max {
            self.admit(&owners)?;
            return self.read_admitted(reads, dst);
        }
        for group in owners.chunks(max) {
            let part: Vec<RemoteRead> = reads
                .iter()
                .filter(|r| group.binary_search(&r.owner).is_ok())
                .copied()
                .collect();
            self.admit(group)?;
            self.read_admitted(&part, dst)?;
        }
        Ok(())
    }

    /// Makes `owners` the lent endpoint's live connections ([`Live::admit`]).
    fn admit(&mut self, owners: &[usize]) -> FabricResult<()> {
        let live = self.live.as_mut().expect("checked out");
        let before = live.evictions;
        live.admit(owners)?;
        if live.evictions > before {
            warn_bounded(live.max_connections, self.peers.len().saturating_sub(1));
        }
        Ok(())
    }

    /// Reads of owners admitted to the lent endpoint's live connections.
    fn read_admitted(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> ddstore_core::Result<()> {
        if !self.settings.gather {
            return Ok(self.do_reads(reads, dst)?);
        }
        // Whatever arrives unasked lands in the trash receive, also on an
        // endpoint that only reads one-sided.
        self.live.as_mut().expect("checked out").post_trash();
        // Owners that serve the gather path get requests, except those
        // asked for one or two short reads; any other owner (a record
        // without the gather path) is read one-sided.
        let singles = self.one_sided_owners(reads);
        let (gathered, direct): (Vec<&RemoteRead>, Vec<&RemoteRead>) = reads
            .iter()
            .partition(|r| self.peers[r.owner].gather && singles.binary_search(&r.owner).is_err());
        if !gathered.is_empty() {
            let list: Vec<(usize, u64, usize, usize)> = gathered
                .iter()
                .map(|r| (r.owner, r.offset, r.len, r.dst_offset))
                .collect();
            self.do_gather(&list, dst)?;
        }
        if !direct.is_empty() {
            if let Some(why) = &self.broken {
                return Err(ddstore_core::Error::Transport(why.clone()));
            }
            let direct: Vec<RemoteRead> = direct.into_iter().copied().collect();
            self.do_reads(&direct, dst)?;
        }
        Ok(())
    }

    /// Owners whose reads in `reads` are few and short enough to go
    /// one-sided ([`ReaderSettings::few_reads_one_sided`]), all of them
    /// inside the owner's registered memory (sorted).
    fn one_sided_owners(&self, reads: &[RemoteRead]) -> Vec<usize> {
        if !self.settings.few_reads_one_sided {
            return Vec::new();
        }
        // Per owner: (reads, longest, furthest end), without sorting the batch.
        let mut by_owner: RowMap<usize, (usize, usize, u64)> = RowMap::default();
        for r in reads {
            let o = by_owner.entry(r.owner).or_insert((0, 0, 0));
            o.0 += 1;
            o.1 = o.1.max(r.len);
            o.2 = o.2.max(r.offset + r.len as u64);
        }
        let mut owners = Vec::new();
        for (owner, (n, longest, end)) in by_owner {
            let few = match n {
                1 => longest <= ONE_SIDED_SINGLE_MAX.min(self.max_msg),
                n => n <= ONE_SIDED_FEW && longest < ONE_SIDED_FEW_MAX,
            };
            if few && end <= self.peers[owner].registered_len() {
                owners.push(owner);
            }
        }
        owners.sort_unstable();
        owners
    }

    /// The ragged gather: plans [`plan::plan_ragged`] requests, lands every
    /// reply in a staging buffer this call owns (never the caller's memory:
    /// the reply sizes are only known once they arrive) and checks each
    /// reply stream against its rows.
    fn gather_ragged(
        &mut self,
        unit_bytes: usize,
        requests: &[RaggedRequest<'_>],
        staging: Vec<u8>,
    ) -> ddstore_core::Result<Option<RaggedRows>> {
        let owners: Vec<RaggedOwner<'_>> = requests
            .iter()
            .map(|r| RaggedOwner {
                owner: r.owner,
                ends_key: r.ends_key,
                rows: r.rows,
                max_row_bytes: r.max_row_bytes,
                share_bytes: self.peers[r.owner].len,
            })
            .collect();
        let staging_buf = staging;
        // More owners than live connections: the caller reads them in groups instead.
        let live = self.live.as_ref().expect("checked out");
        if owners.len() > live.max_connections {
            return Ok(None);
        }
        let owner_ranks: Vec<usize> = owners.iter().map(|o| o.owner).collect();
        self.admit(&owner_ranks)?;
        let Some((plan, slots, staging)) =
            plan::plan_ragged(&owners, unit_bytes, self.gather_limits())
        else {
            return Ok(None);
        };
        // A reused buffer is only zeroed where it grows; every byte read back was received.
        let mut data = staging_buf;
        if data.len() < staging {
            data.resize(staging, 0);
        }
        let mut got = Vec::new();
        // The staging is this call's own: replies land there directly.
        let result = self.exchange(&plan, &mut data[..staging], true, &mut got);
        if self.broken.is_some() {
            // Receives may still target it (the endpoint may outlive us in a
            // bound MR): never free it under the provider.
            std::mem::forget(data);
            result?;
            return Err(ddstore_core::Error::Transport(
                "the reader broke during a ragged gather".into(),
            ));
        }
        result?;
        let rows = replies::ragged_rows(&owners, unit_bytes, &plan, &slots, &got, &data)?;
        Ok(Some(RaggedRows { data, rows }))
    }
}
