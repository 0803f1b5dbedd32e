//! How the store uses the spill tier: the budget, the spill file a new
//! variable needs, and the routes to every owner's spilled rows.
//!
//! Budgets: `DDSTORE_MEMORY_LIMIT` is what the store's shares of this rank
//! may hold in memory together, taken by variables in the order they are
//! added (a ragged variable's values, then its row ends); a `memory_limit`
//! given for one variable (`add(..., memory_limit=)`) is that variable's
//! own. Rows past a budget go to the spill file, in row order: a share keeps
//! its first rows in memory.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{rows_in_budget, SpillDir, SpillFile, SpillLocator, SpilledShare};
use crate::comm::Comm;
use crate::kinds::RaggedPart;
use crate::memory::Memory;
use crate::region::host_id;
use crate::transport::{Exposed, RemoteRead};
use crate::{Config, Error, Result};

/// A variable's own budget and spill directory (arguments of `add`).
#[derive(Clone, Debug, Default)]
pub struct SpillRequest {
    /// Bytes of the share kept in memory (`None`: the store's budget).
    pub memory_limit: Option<u64>,
    /// Where its spill file goes (`None`: the store's directory).
    pub spill_dir: Option<PathBuf>,
}

/// The store's part: the budget used so far and its open spill directories.
#[derive(Default)]
pub(crate) struct StoreSpill {
    used: AtomicU64,
    dirs: Mutex<Vec<(PathBuf, Arc<SpillDir>)>>,
}

/// A share of this rank that spills: its rows in memory and its file.
pub(crate) struct PendingSpill {
    /// Rows kept in memory.
    pub mem_rows: u64,
    /// The file of the rest.
    pub file: Arc<SpillFile>,
    /// Bytes taken from the store's budget (given back if creation fails).
    reserved: u64,
}

/// Bytes of read-ahead stage a reader without a budget of its own uses
/// when other ranks' shares spill.
pub(crate) const UNBUDGETED_STAGE: u64 = 16 << 20;

impl StoreSpill {
    fn dir(&self, path: PathBuf) -> Result<Arc<SpillDir>> {
        let mut dirs = self.dirs.lock().unwrap();
        if let Some((_, d)) = dirs.iter().find(|(p, _)| *p == path) {
            return Ok(d.clone());
        }
        let d = SpillDir::open(&path)?;
        dirs.push((path, d.clone()));
        Ok(d)
    }

    /// What a new variable of `rows` rows of `rb` bytes keeps in memory and
    /// spills on this rank: `None` when it fits (no file), and the bytes of
    /// its read-ahead stage (for the rows of other ranks' spilled shares
    /// too). A share that spills keeps [`super::stage::stage_bytes`] of its
    /// budget for the stage. The spill file is created with its room
    /// reserved, so a full disk fails here.
    pub(crate) fn prepare(
        &self,
        config: &Config,
        rank: usize,
        name: &str,
        rows: u64,
        rb: usize,
        request: Option<&SpillRequest>,
    ) -> Result<(Option<PendingSpill>, u64)> {
        let own_limit = request.and_then(|r| r.memory_limit);
        let Some(limit) = budget_of(config, request) else {
            return Ok((None, UNBUDGETED_STAGE));
        };
        super::share::bound_heap_growth(limit); // a budget: freed buffers must not stay resident
        let budget = if own_limit.is_some() {
            limit
        } else {
            limit.saturating_sub(self.used.load(Ordering::Relaxed))
        };
        let share = rows.saturating_mul(rb as u64);
        let stage = if share <= budget {
            super::stage::stage_bytes(budget - share, rb as u64, config.stage_rows)
        } else {
            super::stage::stage_bytes(budget, rb as u64, config.stage_rows)
        };
        let mem_rows = if share <= budget {
            rows
        } else {
            rows_in_budget(rows, rb, budget - stage)
        };
        let mem_bytes = mem_rows * rb as u64;
        let reserved = if own_limit.is_some() {
            0
        } else {
            mem_bytes + if mem_rows < rows { stage } else { 0 }
        };
        self.used.fetch_add(reserved, Ordering::Relaxed);
        if mem_rows == rows {
            return Ok((None, stage));
        }
        let path = request
            .and_then(|r| r.spill_dir.clone())
            .or_else(|| config.spill_dir.clone())
            .unwrap_or_else(SpillDir::default_path);
        let made = self.dir(path).and_then(|dir| {
            let spilled = (rows - mem_rows) * rb as u64;
            let what = format!(
                "the {} spilled rows of '{}' on rank {rank}",
                rows - mem_rows,
                RaggedPart::user_name(name)
            );
            SpillFile::create(&dir, &dir.file_name(name), spilled, &what)
        });
        match made {
            Ok(file) => Ok((
                Some(PendingSpill {
                    mem_rows,
                    file: Arc::new(file),
                    reserved,
                }),
                stage,
            )),
            Err(e) => {
                self.used.fetch_sub(reserved, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Gives back the budget of a variable whose creation failed after `prepare`.
    pub(crate) fn release(&self, pending: &Option<PendingSpill>) {
        if let Some(p) = pending {
            self.used.fetch_sub(p.reserved, Ordering::Relaxed);
        }
    }
}

/// A new variable's memory budget on this rank: its own (`request`), else
/// the store's (`DDSTORE_MEMORY_LIMIT`); `None` without one.
pub(crate) fn budget_of(config: &Config, request: Option<&SpillRequest>) -> Option<u64> {
    request.and_then(|r| r.memory_limit).or(config.memory_limit)
}

/// What each rank tells the others about its spilled share.
#[derive(serde::Serialize, serde::Deserialize)]
struct SpillRecord {
    host: String,
    file: Option<SpillLocator>,
}

/// One owner's spilled share as this process sees it.
pub(crate) struct OwnerSpill {
    /// Bytes of the share in memory.
    pub mem_len: usize,
    /// Memory plus file, where this process reads the file (own, same node).
    pub share: Option<Arc<SpilledShare>>,
}

/// A variable's routes to spilled rows, per owner (`None`: all in memory).
pub(crate) struct VarSpill {
    pub owners: Vec<Option<OwnerSpill>>,
    /// Remote owners serve spilled rows (the gather path).
    pub remote_serves: bool,
    /// Spilled reads in flight (`DDSTORE_MAX_INFLIGHT`).
    pub inflight: usize,
    /// Spilled rows read ahead of use (`Store::prefetch`).
    pub stage: super::Stage,
}

/// Where [`wrapper`] leaves the spilled share it made (for the routes).
pub(crate) type MadeShare = Arc<Mutex<Option<Arc<SpilledShare>>>>;

/// Wraps this rank's exposed region with its spill file (the share of
/// `len` bytes), keeping a handle for the routes.
pub(crate) fn wrapper(
    pending: &Option<PendingSpill>,
    len: usize,
    inflight: usize,
) -> (impl Fn(Arc<dyn Memory>) -> Arc<dyn Memory>, MadeShare) {
    let made: MadeShare = Arc::default();
    let keep = made.clone();
    let file = pending.as_ref().map(|p| p.file.clone());
    let wrap = move |region: Arc<dyn Memory>| -> Arc<dyn Memory> {
        let Some(file) = &file else { return region };
        // One reply's reads at a batch's depth (the owner answers several at once).
        let depth = inflight.min(super::read::MAX_READ_THREADS);
        let share =
            Arc::new(SpilledShare::new(region, Some(file.clone()), len).with_inflight(depth));
        *keep.lock().unwrap() = Some(share.clone());
        share
    };
    (wrap, made)
}

/// Collective (when any rank spills): tells every rank where this rank's
/// spill file is, opens same-node owners' files and wraps their mappings,
/// and returns the routes. `mem_rows[r]` is `Some` for the ranks that spill.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect(
    comm: &dyn Comm,
    exposed: &mut Exposed,
    own: Option<Arc<SpilledShare>>,
    mem_rows: &[Option<u64>],
    counts: &[u64],
    rb: usize,
    config: &Config,
    gather: bool,
    stage_bytes: u64,
) -> Result<VarSpill> {
    let me = comm.rank();
    let mine = SpillRecord {
        host: host_id(),
        file: own
            .as_ref()
            .and_then(|s| s.file())
            .and_then(|f| f.locator()),
    };
    let all = comm.allgather(&serde_json::to_vec(&mine).expect("record serialises"))?;
    let mut owners = Vec::with_capacity(all.len());
    for (r, raw) in all.iter().enumerate() {
        let rec: SpillRecord = serde_json::from_slice(raw)
            .map_err(|e| Error::Comm(format!("bad spill record from rank {r}: {e}")))?;
        let Some(rows) = mem_rows.get(r).copied().flatten() else {
            owners.push(None);
            continue;
        };
        let mem_len = rows as usize * rb;
        let share = if r == me {
            own.clone()
        } else {
            let peer = exposed.node_peers.get(r).cloned().flatten();
            match (peer, &rec.file) {
                (Some(mem), Some(loc)) if rec.host == mine.host => {
                    let file = Arc::new(SpillFile::open_peer(loc)?);
                    let share =
                        Arc::new(SpilledShare::new(mem, Some(file), counts[r] as usize * rb));
                    exposed.node_peers[r] = Some(share.clone());
                    Some(share)
                }
                _ => None,
            }
        };
        owners.push(Some(OwnerSpill { mem_len, share }));
    }
    Ok(VarSpill {
        owners,
        remote_serves: gather,
        inflight: config.max_inflight,
        stage: super::Stage::new(stage_bytes as usize),
    })
}

/// A read of an owner's spilled rows: the file, its data offset, where it lands and how long.
pub(crate) struct FileRead<'a> {
    pub file: &'a SpillFile,
    pub offset: u64,
    pub dst_offset: usize,
    pub len: usize,
}

/// Where one planned read goes, for a spilled owner.
pub(crate) enum Split<'a> {
    /// Not spilled here: route as usual.
    Unchanged,
    /// Its memory part (if any, from this memory) and its file part.
    Parts(Option<(RemoteRead, &'a dyn Memory)>, FileRead<'a>),
}

impl VarSpill {
    /// Bytes a read ahead reads at once (its buffer beside the stage,
    /// outside the budget): enough rows to keep its reads in flight, far
    /// less than a stage (up to 64 MiB). Fixed and ragged read-aheads alike.
    pub(crate) const PREFETCH_PIECE: usize = 4 << 20;

    /// Whether a read ahead stages the bytes `probe` names: they lie (partly)
    /// in the owner's spill file and this process can get them, from the
    /// file here (own or same-node owner) or from a remote owner that serves
    /// spilled rows. `name`: the variable, for messages.
    pub(crate) fn read_ahead_reads(&self, probe: &RemoteRead, name: &str) -> bool {
        matches!(self.split(probe, name), Ok(Split::Parts(..)))
            || (self.remote_serves && self.spilled_part(probe).is_some())
    }

    /// The part of `seg` in its owner's spill file (`None`: all in memory, or the owner does not spill).
    pub(crate) fn spilled_part(&self, seg: &RemoteRead) -> Option<(usize, usize)> {
        let o = self.owners.get(seg.owner)?.as_ref()?;
        let (start, end) = (seg.offset as usize, seg.offset as usize + seg.len);
        (end > o.mem_len).then(|| (start.max(o.mem_len), end))
    }

    /// Splits `seg` at the owner's memory boundary when this process reads
    /// the owner's file; a remote owner's spilled rows go to the transport
    /// when the owner serves them, else this is an error naming the rows.
    pub(crate) fn split<'a>(&'a self, seg: &RemoteRead, name: &str) -> Result<Split<'a>> {
        let Some(Some(o)) = self.owners.get(seg.owner) else {
            return Ok(Split::Unchanged);
        };
        let end = seg.offset as usize + seg.len;
        if end <= o.mem_len {
            return Ok(Split::Unchanged);
        }
        let Some(share) = &o.share else {
            if self.remote_serves {
                return Ok(Split::Unchanged);
            }
            return Err(Error::Unsupported(format!(
                "'{}': rows of rank {} are in its spill file, and remote ranks read spilled rows \
                 only through the owner-side gather path (libfabric with tagged messages: \
                 DDSTORE_REMOTE_GATHER=1); this transport reads one-sided",
                RaggedPart::user_name(name),
                seg.owner
            )));
        };
        let file = share
            .file()
            .expect("a reachable spilled share has its file");
        let (in_mem, at) = share.split(seg.offset as usize, seg.len);
        let head = (in_mem > 0).then(|| {
            (
                RemoteRead {
                    len: in_mem,
                    ..*seg
                },
                &**share.memory(),
            )
        });
        Ok(Split::Parts(
            head,
            FileRead {
                file,
                offset: at.unwrap_or(0),
                dst_offset: seg.dst_offset + in_mem,
                len: seg.len - in_mem,
            },
        ))
    }
}

/// Carries out `reads` into `out` (disjoint destinations) with up to `inflight` in flight.
pub(crate) fn read_files(reads: &[FileRead<'_>], out: &mut [u8], inflight: usize) -> Result<()> {
    let mut sorted: Vec<&FileRead<'_>> = reads.iter().collect();
    sorted.sort_unstable_by_key(|r| r.dst_offset);
    let mut jobs = Vec::with_capacity(sorted.len());
    let mut rest: &mut [u8] = out;
    let mut consumed = 0;
    for r in sorted {
        let (_, tail) = rest.split_at_mut(r.dst_offset - consumed);
        let (dst, tail) = tail.split_at_mut(r.len);
        jobs.push(super::SpillRead {
            file: r.file,
            offset: r.offset,
            dst,
        });
        rest = tail;
        consumed = r.dst_offset + r.len;
    }
    super::read_all(jobs, inflight)
}
