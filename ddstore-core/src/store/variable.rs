//! A variable: its shape, this rank's share, the routes to every other
//! share, and how a planned batch is carried out (memory copies of own and
//! same-node rows, transport reads of the rest).

use std::sync::Arc;
use std::time::Instant;

use crate::kinds::RaggedPart;
use crate::memory::Memory;
use crate::plan::Plan;
use crate::profile::Counters;
use crate::reader_pool::ReaderPool;
use crate::region::{process_alive, NodeLocator, ShareState};
use crate::spill::stage::Staged;
use crate::spill::store::{FileRead, Split};
use crate::transport::{RaggedRequest, RaggedRows, RemoteRead, RemoteShares};
use crate::{Error, Result};

use super::VarInfo;

/// What a read does with rows of this rank's own share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnRows {
    /// Copy them from memory (host shares).
    Copy,
    /// Leave their destination bytes untouched: the caller reads them itself
    /// (device shares, read with torch on the device).
    Skip,
    /// Read them through the transport like other ranks' rows (device
    /// shares in a forked process, which cannot use the device).
    Transport,
}

/// Bytes of same-node copies in one batch above which copies run on several threads.
/// Measured with `examples/copy_threshold.rs`: below this, threads cost more
/// than they save (6x slower at 256 KiB, even at 1-4 MiB on 2 cores).
pub const PARALLEL_COPY_BYTES: usize = 16 << 20;

/// One named variable: its shape, this rank's share and the routes to every other share.
pub struct Variable {
    /// The name it was added under.
    pub name: String,
    /// Its shape, agreed by every rank.
    pub info: VarInfo,
    /// This process's rank in the group, `None` for an attached extra job.
    pub(super) my_rank: Option<usize>,
    pub(super) local: Option<Arc<dyn Memory>>,
    pub(super) node_peers: Vec<Option<Arc<dyn Memory>>>,
    pub(crate) remote: Arc<dyn RemoteShares>,
    pub(super) node_locators: Vec<Option<NodeLocator>>,
    /// Extra jobs (one entry per core rank): the pid and state word of each
    /// share mapped here, checked around every copy so a stopped core, or a
    /// variable the core freed, is reported, never read from its corpse.
    pub(super) node_watch: Vec<Option<NodeWatch>>,
    /// Idle readers; a reading thread takes one (or opens one) and gives it
    /// back. Owned by one process: see [`crate::fork`].
    pub(super) readers: ReaderPool,
    /// Longest single read: `DDSTORE_MAX_READ_BYTES`, or less where the
    /// transport says so; the planner splits longer runs (the only split).
    pub(crate) max_read: usize,
    /// What reads of this variable did (`get_profile`).
    pub(crate) counters: Counters,
    /// Routes to spilled rows, when any rank's share spills (see [`crate::spill`]).
    pub(crate) spill: Option<crate::spill::store::VarSpill>,
}

impl Variable {
    /// Per-rank records another job passes to `Store::attach` (method 2),
    /// made from the routes kept (not kept themselves: per rank they repeat
    /// its address, which the transport keeps once per store).
    pub fn records(&self) -> Vec<Vec<u8>> {
        self.remote.records()
    }

    /// Per rank, where a same-node extra job maps its share (method 2).
    pub fn node_locators(&self) -> &[Option<NodeLocator>] {
        &self.node_locators
    }

    /// Whether `owner` is this process (its rows are in the local share).
    pub(crate) fn is_own(&self, owner: usize) -> bool {
        Some(owner) == self.my_rank
    }

    /// Whether rows of `owner` go through the transport (not a memory copy).
    pub(crate) fn is_remote(&self, owner: usize) -> bool {
        Some(owner) != self.my_rank && self.node_peers.get(owner).is_none_or(|p| p.is_none())
    }

    /// Carries out a plan: sorts its reads into memory copies and transport
    /// reads, reads, copies, fills repeats and counts.
    pub(crate) fn execute(
        &self,
        plan: &Plan,
        out: &mut [u8],
        nrows: usize,
        own: OwnRows,
    ) -> Result<()> {
        self.execute_counted(plan, out, nrows, own, true)
    }

    /// As [`Variable::execute`]; `counted: false` is a read ahead of use
    /// (see `Store::prefetch`): it leaves the read counters and the stage
    /// (whose rows it fills) alone, and reads spilled rows at the read
    /// ahead's depth.
    pub(crate) fn execute_counted(
        &self,
        plan: &Plan,
        out: &mut [u8],
        nrows: usize,
        own: OwnRows,
        counted: bool,
    ) -> Result<()> {
        let routes = self.route(plan, own, counted)?;
        self.check_core_alive(&routes.copies)?;
        if !routes.remote.is_empty() {
            let started = Instant::now();
            self.read_remote(&routes.remote, out)?;
            Counters::add(
                &self.counters.remote_ns,
                started.elapsed().as_nanos() as u64,
            );
            Counters::add(&self.counters.remote_reads, routes.remote.len() as u64);
        }
        let started = Instant::now();
        copy_segments(&routes.copies, out, routes.local_bytes + routes.node_bytes)?;
        if let Some(spill) = &self.spill {
            let threads = if counted {
                crate::spill::read::MAX_READ_THREADS
            } else {
                crate::spill::read::MAX_READ_AHEAD_THREADS
            };
            self.read_spilled(spill, &routes.files, out, threads)?;
            for (at, bytes) in &routes.staged {
                out[*at..*at + bytes.len()].copy_from_slice(bytes);
            }
        }
        if let Err(e) = self.check_not_freed(&routes.copies) {
            // The copy may have raced with the free: none of it is returned.
            out.fill(0);
            return Err(e);
        }
        for r in &plan.repeats {
            out.copy_within(r.from..r.from + r.len, r.to);
        }
        if counted {
            Counters::add(&self.counters.copy_ns, started.elapsed().as_nanos() as u64);
            self.count(&routes, nrows);
        }
        Ok(())
    }

    /// Which reads of `plan` are memory copies (own share, same-node peers),
    /// which go through the transport, and which are left to the caller.
    /// `staged`: rows the read-ahead stage holds are taken from it.
    fn route<'a>(&'a self, plan: &'a Plan, own: OwnRows, staged: bool) -> Result<Routes<'a>> {
        let mut routes = Routes::default();
        let mut pieces = Vec::new();
        for seg in &plan.segments {
            pieces.clear();
            if staged {
                self.take_staged(seg, &mut routes, &mut pieces);
            } else {
                pieces.push(*seg);
            }
            for seg in &pieces {
                self.route_one(seg, own, &mut routes)?;
            }
        }
        Ok(routes)
    }

    /// Takes the rows of `seg` that the read-ahead stage holds out of it
    /// (into `routes.staged`); the rest of `seg` goes to `pieces`.
    fn take_staged<'a>(
        &'a self,
        seg: &RemoteRead,
        routes: &mut Routes<'a>,
        pieces: &mut Vec<RemoteRead>,
    ) {
        // A ragged part's stage holds whole ragged rows (see `Store::prefetch_ragged`).
        let spill = match &self.spill {
            Some(s) if !s.stage.is_empty() && RaggedPart::owner(&self.name).is_none() => s,
            _ => return pieces.push(*seg),
        };
        let Some((first, end)) = spill.spilled_part(seg) else {
            return pieces.push(*seg);
        };
        let rb = self.info.row_bytes;
        let base = self.info.layout.start(seg.owner);
        let at = |off: usize| seg.dst_offset + (off - seg.offset as usize);
        let mut run = seg.offset as usize; // start of the bytes not staged yet
        let push = |from: usize, to: usize, pieces: &mut Vec<RemoteRead>| {
            if to > from {
                pieces.push(RemoteRead {
                    offset: from as u64,
                    len: to - from,
                    dst_offset: at(from),
                    ..*seg
                });
            }
        };
        let mut off = first;
        while off < end {
            if let Some(bytes) = spill.stage.take(base + (off / rb) as u64) {
                push(run, off, pieces);
                routes.staged.push((at(off), bytes));
                run = off + rb;
                if Some(seg.owner) == self.my_rank {
                    routes.local_bytes += rb;
                } else if self.node_peers.get(seg.owner).is_some_and(|p| p.is_some()) {
                    routes.node_bytes += rb;
                } else {
                    routes.staged_remote_bytes += rb;
                }
            }
            off += rb;
        }
        push(run, end, pieces);
    }

    /// Routes one read (or a part of one the stage did not hold).
    fn route_one<'a>(
        &'a self,
        seg: &RemoteRead,
        own: OwnRows,
        routes: &mut Routes<'a>,
    ) -> Result<()> {
        {
            let is_own = Some(seg.owner) == self.my_rank;
            if let Some(spill) = &self.spill {
                if own != OwnRows::Skip || !is_own {
                    if let Split::Parts(head, file) = spill.split(seg, &self.name)? {
                        if let Some((head, mem)) = head {
                            routes.copies.push((head, mem));
                        }
                        // Spilled rows still count as own or same-node rows.
                        if is_own {
                            routes.local_bytes += seg.len;
                        } else {
                            routes.node_bytes += seg.len;
                        }
                        routes.files.push(file);
                        return Ok(());
                    }
                }
            }
            if is_own && own == OwnRows::Skip {
                routes.skipped_bytes += seg.len;
            } else if is_own && own == OwnRows::Copy {
                let local = self.local.as_deref().expect("a member has a local share");
                routes.copies.push((*seg, local));
                routes.local_bytes += seg.len;
            } else if let Some(peer) = self.node_peers.get(seg.owner).and_then(|p| p.as_deref()) {
                routes.copies.push((*seg, peer));
                routes.node_bytes += seg.len;
            } else {
                routes.remote.push(*seg);
            }
        }
        Ok(())
    }

    /// Adds a batch of `nrows` rows, routed as `routes`, to the counters.
    fn count(&self, routes: &Routes<'_>, nrows: usize) {
        let rb = self.info.row_bytes;
        let c = &self.counters;
        Counters::add(&c.calls, 1);
        Counters::add(&c.rows, nrows as u64);
        Counters::add(&c.bytes, (nrows * rb) as u64);
        // Skipped rows are own rows the caller copies.
        Counters::add(
            &c.local_rows,
            ((routes.local_bytes + routes.skipped_bytes) / rb) as u64,
        );
        Counters::add(&c.node_rows, (routes.node_bytes / rb) as u64);
        let remote_bytes: usize = routes.remote.iter().map(|r| r.len).sum();
        Counters::add(
            &c.remote_rows,
            ((remote_bytes + routes.staged_remote_bytes) / rb) as u64,
        );
        let file_bytes: usize = routes.files.iter().map(|r| r.len).sum();
        Counters::add(&c.spilled_rows, (file_bytes / rb) as u64);
        Counters::add(&c.spilled_reads, routes.files.len() as u64);
        Counters::add(
            &c.memory_rows,
            ((routes.local_bytes + routes.node_bytes + routes.skipped_bytes
                - file_bytes
                - (routes.staged.len() * rb - routes.staged_remote_bytes))
                / rb) as u64,
        );
        Counters::add(&c.prefetch_hits, routes.staged.len() as u64);
    }

    /// Extra jobs only, before copying: the owners of mapped shares must
    /// still be running and must not have freed them.
    fn check_core_alive(&self, copies: &[(RemoteRead, &dyn Memory)]) -> Result<()> {
        self.each_watched_owner(copies, |owner, watch| {
            if !process_alive(watch.pid) {
                return Err(Error::Timeout {
                    peer: owner,
                    waited: std::time::Duration::ZERO,
                    what: format!(
                        "core rank {owner} (pid {}) has stopped serving '{}'",
                        watch.pid, self.name
                    ),
                });
            }
            self.live_or_stale(owner, watch)
        })
    }

    /// Extra jobs only, after copying: a share freed meanwhile fails the
    /// batch (a copy that completed before the free is returned; one that
    /// raced with it is not, and no byte from after a free ever is).
    fn check_not_freed(&self, copies: &[(RemoteRead, &dyn Memory)]) -> Result<()> {
        self.each_watched_owner(copies, |owner, watch| self.live_or_stale(owner, watch))
    }

    /// Runs `check` once per distinct owner of `copies` that is watched (an
    /// extra job's mapped core share); nothing for a member of the group.
    fn each_watched_owner(
        &self,
        copies: &[(RemoteRead, &dyn Memory)],
        mut check: impl FnMut(usize, &NodeWatch) -> Result<()>,
    ) -> Result<()> {
        if self.node_watch.is_empty() {
            return Ok(());
        }
        let mut checked: Vec<usize> = Vec::new();
        for (seg, _) in copies {
            if checked.contains(&seg.owner) {
                continue;
            }
            checked.push(seg.owner);
            if let Some(watch) = &self.node_watch[seg.owner] {
                check(seg.owner, watch)?;
            }
        }
        Ok(())
    }

    fn live_or_stale(&self, owner: usize, watch: &NodeWatch) -> Result<()> {
        if watch.state.is_live() {
            return Ok(());
        }
        let name = RaggedPart::user_name(&self.name);
        Err(Error::Stale {
            peer: owner,
            message: format!(
                "'{name}': core rank {owner} (pid {}) freed this variable (or freed it and added \
                 another under the same name): this handle no longer reads it; attach again \
                 (join('{name}') on a new PyDDStore, or a new DistDatasetReader) to read what the \
                 core job publishes now",
                watch.pid
            ),
        })
    }

    /// `owner`'s share where this process reads it by memory copy (its own,
    /// or a same-node peer's mapping); `None` for remote owners and in extra
    /// jobs (whose mapped owners are checked alive on every planned read).
    pub(crate) fn mapped(&self, owner: usize) -> Option<&dyn Memory> {
        if !self.node_watch.is_empty() {
            return None;
        }
        if Some(owner) == self.my_rank {
            return self.local.as_deref();
        }
        self.node_peers.get(owner).and_then(|p| p.as_deref())
    }

    /// Populates this process's page tables for the memory its copies read
    /// (its own share, same-node peers' mappings), each while the bytes
    /// attempted stay within `budget`; returns (bytes attempted, bytes
    /// populated). See [`Memory::populate_read`].
    pub(crate) fn populate_node_shares(&self, budget: usize) -> (usize, usize) {
        let (mut tried, mut done) = (0usize, 0usize);
        for mem in self.local.iter().chain(self.node_peers.iter().flatten()) {
            let len = mem.mapped_len();
            if len == 0 || tried + len > budget {
                continue;
            }
            tried += len;
            done += mem.populate_read();
        }
        (tried, done)
    }

    /// The gather key `owner` serves this share under (`None`: one-sided).
    pub(crate) fn gather_key(&self, owner: usize) -> Option<u64> {
        self.remote.gather_key(owner)
    }

    /// Whole ragged rows through a pooled reader (see
    /// [`ShareReader::read_ragged_rows`]); `Ok(None)` when it cannot.
    pub(crate) fn read_ragged_rows(
        &self,
        unit_bytes: usize,
        requests: &[RaggedRequest<'_>],
        staging: Vec<u8>,
    ) -> Result<Option<RaggedRows>> {
        let started = Instant::now();
        let rows = self.readers.read(self.remote.as_ref(), |reader| {
            let before = reader.times();
            let rows = reader.read_ragged_rows(unit_bytes, requests, staging);
            self.counters.add_reader_times(reader.times().since(before));
            rows
        })?;
        Counters::add(
            &self.counters.remote_ns,
            started.elapsed().as_nanos() as u64,
        );
        if rows.is_some() {
            // One request per owner (more only past a request's limits).
            Counters::add(&self.counters.remote_reads, requests.len() as u64);
        }
        Ok(rows)
    }

    /// Reads the spilled rows of a batch from their files, many in flight.
    fn read_spilled(
        &self,
        spill: &crate::spill::store::VarSpill,
        files: &[FileRead<'_>],
        out: &mut [u8],
        threads: usize,
    ) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        crate::spill::store::read_files(files, out, spill.inflight.min(threads))?;
        Counters::add(&self.counters.spill_ns, started.elapsed().as_nanos() as u64);
        Ok(())
    }

    pub(super) fn read_remote(&self, reads: &[RemoteRead], out: &mut [u8]) -> Result<()> {
        self.readers.read(self.remote.as_ref(), |reader| {
            let before = reader.times();
            let read = reader.read_many(reads, out);
            self.counters.add_reader_times(reader.times().since(before));
            read
        })
    }
}

/// An extra job's watch on a mapped core share: the owner's pid and the
/// share's state word.
pub(super) struct NodeWatch {
    pub(super) pid: u32,
    pub(super) state: ShareState,
}

/// The reads of one batch by route (see [`Variable::execute`]).
#[derive(Default)]
struct Routes<'a> {
    /// Memory copies: a read and the memory it copies from.
    copies: Vec<(RemoteRead, &'a dyn Memory)>,
    /// Reads of spill files (own and same-node owners' spilled rows).
    files: Vec<FileRead<'a>>,
    /// Rows taken from the read-ahead stage: destination offset and bytes
    /// (their buffers go back to the stage's pool once copied).
    staged: Vec<(usize, Staged<'a>)>,
    /// Bytes of `staged` whose owners are remote.
    staged_remote_bytes: usize,
    /// Reads through the transport.
    remote: Vec<RemoteRead>,
    local_bytes: usize,
    node_bytes: usize,
    /// Own rows left for the caller (`OwnRows::Skip`).
    skipped_bytes: usize,
}

/// Memory copies of a batch; large batches are split across threads.
fn copy_segments(copies: &[(RemoteRead, &dyn Memory)], out: &mut [u8], total: usize) -> Result<()> {
    if total < PARALLEL_COPY_BYTES || copies.len() < 2 {
        for (seg, mem) in copies {
            mem.read_at(
                seg.offset as usize,
                &mut out[seg.dst_offset..seg.dst_offset + seg.len],
            )?;
        }
        return Ok(());
    }
    // Hand each copy its own disjoint slice of `out`, then copy in parallel.
    let mut sorted: Vec<&(RemoteRead, &dyn Memory)> = copies.iter().collect();
    sorted.sort_unstable_by_key(|(s, _)| s.dst_offset);
    let mut jobs = Vec::with_capacity(sorted.len());
    let mut rest: &mut [u8] = out;
    let mut consumed = 0;
    for (seg, mem) in sorted {
        let (_, tail) = rest.split_at_mut(seg.dst_offset - consumed);
        let (dst, tail) = tail.split_at_mut(seg.len);
        jobs.push((seg.offset as usize, *mem, dst));
        rest = tail;
        consumed = seg.dst_offset + seg.len;
    }
    copy_in_threads(jobs)
}

/// One memory copy of a batch: source offset, source memory, destination.
type CopyJob<'a> = (usize, &'a dyn Memory, &'a mut [u8]);

/// Most threads one large batch copy uses.
const MAX_COPY_THREADS: usize = 8;

/// Copies `jobs` (source offset, memory, destination) on a few threads spawned
/// for this batch and joined before it returns. Fork safety: no thread pool
/// outlives a call, so a process forked after a large read (a DataLoader
/// forking workers after validation in its main process) copies as its parent
/// did; a pool started before a fork has no threads in the child and hangs it
/// (the rule: [`crate::fork`]).
/// Spawning costs microseconds against the milliseconds of a 16 MiB copy.
fn copy_in_threads(jobs: Vec<CopyJob<'_>>) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_COPY_THREADS)
        .min(jobs.len());
    // Balance bytes: each job goes to the thread with the least to copy so far.
    let mut groups: Vec<Vec<CopyJob<'_>>> = (0..threads).map(|_| Vec::new()).collect();
    let mut loads = vec![0usize; threads];
    for job in jobs {
        let k = (0..threads).min_by_key(|&k| loads[k]).unwrap_or(0);
        loads[k] += job.2.len();
        groups[k].push(job);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| {
                scope.spawn(move || {
                    group
                        .into_iter()
                        .try_for_each(|(src, mem, dst)| mem.read_at(src, dst))
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}
