//! The store: named variables, each split across the ranks of a group.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::comm::Comm;
use crate::dtype::DType;
use crate::external::ExternalShare;
use crate::fork::ReaderPool;
use crate::layout::Layout;
use crate::plan::{validate_rows, Plan};
use crate::profile::{Counters, Profile};
use crate::ragged::{ends_name, values_name, RaggedVar};
use crate::region::{map_node_peers_watched, process_alive, Memory, NodeLocator, ShareState};
use crate::spill::store::{FileRead, Split};
use crate::transport::{
    ExposeOptions, Exposed, RaggedRequest, RaggedRows, RemoteRead, RemoteShares, Transport,
};
use crate::{Config, Error, Result};

/// Bytes of same-node copies in one batch above which copies run on several threads.
/// Measured with `examples/copy_threshold.rs`: below this, threads cost more
/// than they save (6x slower at 256 KiB, even at 1-4 MiB on 2 cores).
pub const PARALLEL_COPY_BYTES: usize = 16 << 20;

/// Shape of a variable, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarInfo {
    /// Element type of the rows.
    pub dtype: DType,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Rows per rank.
    pub layout: Layout,
}

/// One named variable: its shape, this rank's share and the routes to every other share.
pub struct Variable {
    /// The name it was added under.
    pub name: String,
    /// Its shape, agreed by every rank.
    pub info: VarInfo,
    /// This process's rank in the group, `None` for an attached extra job.
    my_rank: Option<usize>,
    local: Option<Arc<dyn Memory>>,
    node_peers: Vec<Option<Arc<dyn Memory>>>,
    pub(crate) remote: Arc<dyn RemoteShares>,
    records: Vec<Vec<u8>>,
    node_locators: Vec<Option<NodeLocator>>,
    /// Extra jobs (one entry per core rank): the pid and state word of each
    /// share mapped here, checked around every copy so a stopped core, or a
    /// variable the core freed, is reported, never read from its corpse.
    node_watch: Vec<Option<NodeWatch>>,
    /// Idle readers; a reading thread takes one (or opens one) and gives it
    /// back. Owned by one process: see [`crate::fork`].
    readers: ReaderPool,
    /// Longest single read: `DDSTORE_MAX_READ_BYTES`, or less where the
    /// transport says so; the planner splits longer runs (the only split).
    pub(crate) max_read: usize,
    /// What reads of this variable did (`get_profile`).
    pub(crate) counters: Counters,
    /// Routes to spilled rows, when any rank's share spills (see [`crate::spill`]).
    pub(crate) spill: Option<crate::spill::store::VarSpill>,
}

/// Named variables shared by the ranks of one group, read through one transport.
pub struct Store {
    comm: Arc<dyn Comm>,
    /// Released by `free()`: fabric objects and progress threads go with it.
    transport: RwLock<Option<Arc<dyn Transport>>>,
    transport_name: String,
    /// The transport's [`Transport::remote_path`].
    remote_path: &'static str,
    /// A peer stopped answering: `free()` then skips its barrier (it would wait for the dead).
    peer_lost: AtomicBool,
    config: Config,
    /// Ordered so teardown (collective for MPI windows) runs in the same order on every rank.
    vars: RwLock<BTreeMap<String, Arc<Variable>>>,
    /// Ragged variables by name; their values and ends live in `vars`.
    pub(crate) ragged: RwLock<BTreeMap<String, Arc<RaggedVar>>>,
    freed: AtomicBool,
    /// The memory budget used so far and the spill directories (see [`crate::spill`]).
    spill: crate::spill::store::StoreSpill,
}

/// What every rank announces when a variable is created, to agree or fail together.
#[derive(serde::Serialize, serde::Deserialize, PartialEq)]
struct InitRecord {
    name: String,
    rows: u64,
    row_bytes: usize,
    dtype: DType,
    exists: bool,
    /// Why this rank cannot create the variable (reported by every rank).
    #[serde(default)]
    problem: Option<String>,
    /// Rows this rank keeps in memory when its share spills (None: all).
    #[serde(default)]
    mem_rows: Option<u64>,
}

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

impl Store {
    /// A store of no variables over `comm`, reading through `transport`.
    pub fn new(comm: Arc<dyn Comm>, transport: Arc<dyn Transport>, config: Config) -> Store {
        Store {
            comm,
            transport_name: transport.name(),
            remote_path: transport.remote_path(),
            transport: RwLock::new(Some(transport)),
            peer_lost: AtomicBool::new(false),
            config,
            vars: RwLock::new(BTreeMap::new()),
            ragged: RwLock::new(BTreeMap::new()),
            freed: AtomicBool::new(false),
            spill: Default::default(),
        }
    }

    /// The group's communicator.
    pub fn comm(&self) -> &Arc<dyn Comm> {
        &self.comm
    }
    /// The settings this store was created with.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// The transport's name (kept after `free()` for messages).
    pub fn transport_name(&self) -> String {
        self.transport_name.clone()
    }
    /// "one-sided" or "gather": how remote rows are read.
    pub fn remote_path(&self) -> &'static str {
        self.remote_path
    }

    fn transport(&self) -> Result<Arc<dyn Transport>> {
        self.transport.read().unwrap().clone().ok_or(Error::Freed)
    }

    /// Notes a lost peer on the way out of a read.
    pub(crate) fn watch<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Timeout { .. }) = &result {
            self.peer_lost.store(true, Ordering::Release);
        }
        result
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.freed.load(Ordering::Acquire) {
            Err(Error::Freed)
        } else {
            Ok(())
        }
    }

    /// The variable `name`, or `Error::UnknownVariable`.
    pub fn var(&self, name: &str) -> Result<Arc<Variable>> {
        self.check_live()?;
        if let Some(v) = self.vars.read().unwrap().get(name) {
            return Ok(v.clone());
        }
        if self.is_ragged(name) {
            return Err(Error::WrongType(format!(
                "'{name}' is a ragged variable: read it with get_batch(name, indices) (values and offsets)"
            )));
        }
        Err(self.unknown_variable(name))
    }

    /// `Error::UnknownVariable` for `name`, suggesting a close variable of this store.
    pub(crate) fn unknown_variable(&self, name: &str) -> Error {
        let vars = self.vars.read().unwrap();
        let ragged = self.ragged.read().unwrap();
        // A ragged variable's parts (`x#values`, `x#ends`) are not names users give.
        let known = vars
            .keys()
            .filter(|k| !k.contains('#'))
            .chain(ragged.keys());
        Error::unknown_variable(name, known.map(String::as_str))
    }

    /// Whether a fixed-row or ragged variable `name` exists here.
    pub(crate) fn has_var(&self, name: &str) -> bool {
        self.vars.read().unwrap().contains_key(name) || self.is_ragged(name)
    }

    /// Every variable by the name it was added with (a ragged variable once,
    /// not its two parts), sorted.
    pub fn names(&self) -> Vec<String> {
        let ragged = self.ragged.read().unwrap();
        let parts: Vec<String> = ragged
            .keys()
            .flat_map(|n| [values_name(n), ends_name(n)])
            .collect();
        let mut v: Vec<String> = self
            .vars
            .read()
            .unwrap()
            .keys()
            .filter(|n| !parts.contains(n))
            .cloned()
            .chain(ragged.keys().cloned())
            .collect();
        v.sort();
        v
    }

    /// Collective: creates `name` with `rows` rows on this rank. Every rank
    /// checks every rank's announcement, so a mismatch fails everywhere
    /// with the same message instead of hanging.
    pub fn init(&self, name: &str, rows: u64, row_bytes: usize, dtype: DType) -> Result<()> {
        self.init_spilling(name, rows, row_bytes, dtype, None)
    }

    /// Collective: as [`Store::init`], with this variable's own memory budget
    /// and spill directory where `request` gives them (else the store's,
    /// `DDSTORE_MEMORY_LIMIT`, `DDSTORE_SPILL_DIR`): rows past the budget go
    /// to a spill file (see [`crate::spill`]).
    pub fn init_spilling(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        dtype: DType,
        request: Option<&crate::spill::SpillRequest>,
    ) -> Result<()> {
        self.init_spilling_with(name, rows, row_bytes, dtype, request, None)
    }

    /// As [`Store::init_spilling`]; `problem` is this rank's reason it
    /// cannot create the variable (every rank then fails with it).
    pub(crate) fn init_spilling_with(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        dtype: DType,
        request: Option<&crate::spill::SpillRequest>,
        problem: Option<String>,
    ) -> Result<()> {
        if problem.is_some() {
            return self.init_with(name, rows, row_bytes, dtype, problem, |t, len, opts| {
                t.expose(&self.comm, len, opts)
            });
        }
        let pending = self.spill.prepare(
            &self.config,
            self.comm.rank(),
            name,
            rows,
            row_bytes,
            request,
        );
        let (problem, pending, stage, own_error) = match pending {
            Ok((p, stage)) => (None, p, stage, None),
            Err(e) => (Some(e.to_string()), None, 0, Some(e)),
        };
        let len = (rows as usize).saturating_mul(row_bytes);
        let mem_len = pending.as_ref().map(|p| p.mem_rows as usize * row_bytes);
        let (wrap, own) = crate::spill::store::wrapper(&pending, len);
        let mem_rows = pending.as_ref().map(|p| p.mem_rows);
        let made = self.init_with_spill(
            name,
            rows,
            row_bytes,
            dtype,
            problem,
            (mem_rows, stage),
            own,
            |t, len, opts| match mem_len {
                Some(m) => t.expose_spilled(&self.comm, m, len, opts, &wrap),
                None => t.expose(&self.comm, len, opts),
            },
        );
        if made.is_err() {
            self.spill.release(&pending);
        }
        // Every rank fails; this rank with its own error (its class: access, I/O).
        match own_error {
            Some(e) => Err(e),
            None => made,
        }
    }

    /// Collective: as [`Store::init`], with this rank's share in `share`
    /// (caller-owned memory, e.g. a GPU buffer of exactly `rows * row_bytes`
    /// bytes). Rows of such a share are written and, on a device, read by
    /// the caller; other ranks read them through the transport.
    pub fn init_external(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        dtype: DType,
        share: ExternalShare,
    ) -> Result<()> {
        let want = (rows as u128) * (row_bytes as u128);
        let problem = (share.len() as u128 != want).then(|| {
            format!(
                "its external share has {} bytes, expected {rows} rows x {row_bytes} bytes = {want}",
                share.len()
            )
        });
        self.init_with(name, rows, row_bytes, dtype, problem, |t, _, opts| {
            t.expose_external(&self.comm, share, opts)
        })
    }

    pub(crate) fn init_with(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        dtype: DType,
        problem: Option<String>,
        expose: impl FnOnce(&Arc<dyn Transport>, usize, &ExposeOptions) -> Result<Exposed>,
    ) -> Result<()> {
        self.init_with_spill(
            name,
            rows,
            row_bytes,
            dtype,
            problem,
            (None, 0),
            Default::default(),
            expose,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn init_with_spill(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        dtype: DType,
        problem: Option<String>,
        (mem_rows, stage_bytes): (Option<u64>, u64),
        own_spill: crate::spill::store::MadeShare,
        expose: impl FnOnce(&Arc<dyn Transport>, usize, &ExposeOptions) -> Result<Exposed>,
    ) -> Result<()> {
        self.check_live()?;
        let mine = InitRecord {
            name: name.to_string(),
            rows,
            row_bytes,
            dtype,
            exists: self.has_var(name),
            problem,
            mem_rows,
        };
        let all = self
            .comm
            .allgather(&serde_json::to_vec(&mine).expect("record serialises"))?;
        let all: Vec<InitRecord> = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice(b)
                    .map_err(|e| Error::Comm(format!("bad init record from rank {r}: {e}")))
            })
            .collect::<Result<_>>()?;
        for (r, rec) in all.iter().enumerate() {
            if rec.name != name {
                return Err(Error::invalid(format!(
                    "collective mismatch: rank {r} created variable '{}' while this rank created '{name}': \
                     every rank must add the same variables in the same order",
                    rec.name
                )));
            }
            if rec.exists {
                return Err(Error::AlreadyExists(name.to_string()));
            }
            if let Some(p) = &rec.problem {
                return Err(Error::invalid(format!("variable '{name}': rank {r}: {p}")));
            }
            if rec.row_bytes != row_bytes || rec.dtype != dtype {
                return Err(Error::invalid(format!(
                    "variable '{name}': rank {r} has rows of {}, this rank rows of {}: \
                     every rank must add rows of the same shape and dtype",
                    row_size(rec.row_bytes, rec.dtype),
                    row_size(row_bytes, dtype)
                )));
            }
        }
        if row_bytes == 0 {
            return Err(Error::invalid(format!(
                "variable '{name}': rows must be at least one byte wide"
            )));
        }
        let counts: Vec<u64> = all.iter().map(|r| r.rows).collect();
        let len = usize::try_from(rows)
            .ok()
            .and_then(|r| r.checked_mul(row_bytes))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "variable '{name}': {rows} rows of {row_bytes} bytes is too large"
                ))
            })?;
        let opts = ExposeOptions {
            name: name.to_string(),
            node_sharing: self.config.node_sharing,
            keep_address: self.config.read_by_other_jobs,
        };
        let transport = self.transport()?;
        let mut exposed = expose(&transport, len, &opts)?;
        let spill_rows: Vec<Option<u64>> = all.iter().map(|r| r.mem_rows).collect();
        let spill = if spill_rows.iter().any(Option::is_some) {
            let own = own_spill.lock().unwrap().clone();
            Some(crate::spill::store::connect(
                self.comm.as_ref(),
                &mut exposed,
                own,
                &spill_rows,
                &counts,
                row_bytes,
                &self.config,
                transport.remote_path() == "gather",
                stage_bytes,
            )?)
        } else {
            None
        };
        let var = Variable {
            name: name.to_string(),
            info: VarInfo {
                dtype,
                row_bytes,
                layout: Layout::new(&counts),
            },
            my_rank: Some(self.comm.rank()),
            local: Some(exposed.local),
            node_peers: exposed.node_peers,
            max_read: self.max_read(&*exposed.remote),
            remote: exposed.remote,
            records: exposed.records,
            node_locators: exposed.node_locators,
            node_watch: Vec::new(),
            readers: self.reader_pool(),
            counters: Counters::default(),
            spill,
        };
        self.insert(var);
        Ok(())
    }

    fn insert(&self, var: Variable) {
        self.vars
            .write()
            .unwrap()
            .insert(var.name.clone(), Arc::new(var));
    }

    /// Longest single read of a variable read through `remote`.
    fn max_read(&self, remote: &dyn RemoteShares) -> usize {
        let limit = remote.max_read_len().unwrap_or(usize::MAX);
        self.config.max_read_bytes.min(limit).max(1)
    }

    /// Readers of a new variable; serialised when threads share one (`DDSTORE_THREAD_READERS=0`).
    fn reader_pool(&self) -> ReaderPool {
        ReaderPool::new(!self.config.thread_readers)
    }

    /// Method 2 extra job: reads a variable another job published; shares
    /// of core ranks on this node (`node_locators`) are mapped and copied.
    pub fn attach(
        &self,
        name: &str,
        info: VarInfo,
        records: &[Vec<u8>],
        node_locators: &[Option<NodeLocator>],
    ) -> Result<()> {
        self.check_live()?;
        if self.has_var(name) {
            return Err(Error::AlreadyExists(name.to_string()));
        }
        let remote = self.transport()?.attach(records)?;
        if let Some(lens) = remote.share_lens() {
            let counts = info.layout.counts();
            let bad = (0..counts.len()).find(|&r| {
                lens.get(r)
                    .is_none_or(|&len| counts[r].saturating_mul(info.row_bytes as u64) > len)
            });
            if let Some(r) = bad {
                return Err(Error::invalid(format!(
                    "'{name}': the record's counts give rank {r} {} rows of {} bytes, more than its share's {} bytes",
                    counts[r],
                    info.row_bytes,
                    lens.get(r).copied().unwrap_or(0)
                )));
            }
        }
        let mut mapped = if self.config.node_sharing {
            map_node_peers_watched(node_locators, None)
        } else {
            Vec::new()
        };
        mapped.resize_with(info.layout.nranks(), || None);
        let (node_peers, node_watch) = mapped
            .into_iter()
            .zip(node_locators.iter().chain(std::iter::repeat(&None)))
            .map(|(m, loc)| match (m, loc) {
                (Some(m), Some(loc)) => (
                    Some(Arc::new(m.memory) as Arc<dyn Memory>),
                    Some(NodeWatch {
                        pid: loc.pid,
                        state: m.state,
                    }),
                ),
                _ => (None, None),
            })
            .unzip();
        let var = Variable {
            name: name.to_string(),
            node_peers,
            info,
            my_rank: None,
            local: None,
            max_read: self.max_read(&*remote),
            remote,
            records: records.to_vec(),
            node_locators: Vec::new(),
            node_watch,
            readers: self.reader_pool(),
            counters: Counters::default(),
            spill: None,
        };
        self.insert(var);
        Ok(())
    }

    /// Writes rows `[first_row, first_row + n)` of this rank's share.
    pub fn write_local(&self, name: &str, first_row: u64, data: &[u8]) -> Result<()> {
        let var = self.var(name)?;
        let (local, rank) = match (&var.local, var.my_rank) {
            (Some(l), Some(r)) => (l, r),
            _ => {
                return Err(Error::Unsupported(format!(
                    "variable '{name}' is attached read-only here"
                )))
            }
        };
        let rb = var.info.row_bytes;
        if !data.len().is_multiple_of(rb) {
            return Err(Error::invalid(format!(
                "update of '{name}': {} bytes is not a whole number of {rb}-byte rows",
                data.len()
            )));
        }
        let n = (data.len() / rb) as u64;
        let count = var.info.layout.count(rank);
        if first_row.checked_add(n).is_none_or(|end| end > count) {
            return Err(Error::IndexOutOfRange(format!(
                "update of '{name}': rows {first_row}..{} do not fit this rank's {count} rows",
                first_row.saturating_add(n)
            )));
        }
        local.write_at(first_row as usize * rb, data)
    }

    /// This rank's writable share of `name` (loading from files fills it
    /// without a copy through Python).
    pub(crate) fn local_share(&self, name: &str) -> Result<Arc<dyn Memory>> {
        let var = self.var(name)?;
        match (&var.local, var.my_rank) {
            (Some(l), Some(_)) => Ok(l.clone()),
            _ => Err(Error::Unsupported(format!(
                "variable '{name}' is attached read-only here"
            ))),
        }
    }

    /// Reads global rows (any order, repeats) into `out`, row i at `i * row_bytes`.
    /// Every index is checked before a byte moves.
    pub fn read_rows(&self, name: &str, rows: &[i64], out: &mut [u8]) -> Result<()> {
        self.read_rows_with(name, rows, out, OwnRows::Copy)
    }

    /// As [`Store::read_rows`], with rows of this rank's share handled as `own` says.
    pub fn read_rows_with(
        &self,
        name: &str,
        rows: &[i64],
        out: &mut [u8],
        own: OwnRows,
    ) -> Result<()> {
        let var = self.var(name)?;
        self.read_var(&var, rows, out, own)
    }

    /// The read path of `get_batch` for a variable already looked up (one
    /// lookup per batch; callers check `out` against `var.info` first and
    /// pass the same `Arc`): plans the batch, which checks every index once
    /// and splits long runs once, then copies and reads.
    pub fn read_var(
        &self,
        var: &Variable,
        rows: &[i64],
        out: &mut [u8],
        own: OwnRows,
    ) -> Result<()> {
        self.check_live()?;
        let rb = var.info.row_bytes;
        if out.len() != rows.len() * rb {
            return Err(Error::invalid(format!(
                "output for '{}' has {} bytes, expected {} rows x {rb} bytes = {}",
                var.name,
                out.len(),
                rows.len(),
                rows.len() * rb
            )));
        }
        let plan = Plan::build(&var.info.layout, rows, rb, var.max_read, |o| {
            var.is_remote(o) || (own == OwnRows::Transport && var.my_rank == Some(o))
        })?;
        self.watch(var.execute(&plan, out, rows.len(), own))
    }

    /// Reads `out.len() / row_bytes` consecutive rows starting at `start`:
    /// one read (or memory copy) per owner the range spans. An empty `out`
    /// reads nothing and succeeds for any `0 <= start <= rows` (upstream's
    /// zero-length `get`, e.g. a graph without edges).
    pub fn get(&self, name: &str, start: i64, out: &mut [u8]) -> Result<()> {
        let var = self.var(name)?;
        let rb = var.info.row_bytes;
        if !out.len().is_multiple_of(rb) {
            return Err(Error::invalid(format!(
                "output for '{name}' has {} bytes, expected a multiple of the {rb}-byte row",
                out.len()
            )));
        }
        let n = (out.len() / rb) as u64;
        let layout = &var.info.layout;
        let total = layout.total();
        if start < 0 || (start as u64).checked_add(n).is_none_or(|end| end > total) {
            return Err(Error::IndexOutOfRange(format!(
                "get of '{name}': rows {start}..{} are out of range: the variable has {total} rows",
                start.saturating_add(n as i64)
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (start, end) = (start as u64, start as u64 + n);
        let mut plan = Plan::default();
        let mut row = start;
        while row < end {
            let (owner, local) = layout.locate(row)?;
            let take = (layout.start(owner) + layout.count(owner)).min(end) - row;
            plan.push_split(
                RemoteRead {
                    owner,
                    offset: local * rb as u64,
                    len: take as usize * rb,
                    dst_offset: (row - start) as usize * rb,
                },
                var.max_read,
            );
            row += take;
        }
        self.watch(var.execute(&plan, out, n as usize, OwnRows::Copy))
    }

    /// The transport's ceiling for benchmarks: one read per row straight
    /// through a reader, with no planning, coalescing or memory copies.
    pub fn read_rows_raw(&self, name: &str, rows: &[i64], out: &mut [u8]) -> Result<()> {
        let var = self.var(name)?;
        let rb = var.info.row_bytes;
        if out.len() != rows.len() * rb {
            return Err(Error::invalid(format!(
                "output has {} bytes, expected {}",
                out.len(),
                rows.len() * rb
            )));
        }
        let mut plan = Plan::default();
        for (i, row) in validate_rows(rows, var.info.layout.total())?
            .into_iter()
            .enumerate()
        {
            let (owner, local) = var.info.layout.locate_valid(row);
            let read = RemoteRead {
                owner,
                offset: local * rb as u64,
                len: rb,
                dst_offset: i * rb,
            };
            plan.push_split(read, var.max_read);
        }
        self.watch(var.read_remote(&plan.segments, out))
    }

    /// Whether any rank's share of `name` spills (see [`crate::spill`]).
    pub fn is_spilled(&self, name: &str) -> Result<bool> {
        Ok(self.var(name)?.spill.is_some())
    }

    /// Reads ahead: stages the spilled rows among global `rows` (rows soon
    /// read by this process; others and out-of-range ones are skipped) in
    /// the variable's read-ahead stage, up to its capacity, so a read that
    /// needs them copies them from memory. Returns the rows staged. Not
    /// counted as reads (`get_profile`'s `prefetch_hits` counts the rows
    /// later reads found staged).
    pub fn prefetch(&self, name: &str, rows: &[i64]) -> Result<usize> {
        let var = self.var(name)?;
        let Some(spill) = &var.spill else {
            return Ok(0);
        };
        let rb = var.info.row_bytes;
        let layout = &var.info.layout;
        let room = spill.stage.capacity() / rb;
        let total = layout.total();
        let mut want: Vec<i64> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &r in rows {
            if want.len() >= room {
                break;
            }
            if r < 0 || r as u64 >= total || spill.stage.contains(r as u64) || !seen.insert(r) {
                continue;
            }
            let (owner, local) = layout.locate_valid(r as u64);
            let probe = RemoteRead {
                owner,
                offset: local * rb as u64,
                len: rb,
                dst_offset: 0,
            };
            let readable = matches!(spill.split(&probe, &var.name), Ok(Split::Parts(..)))
                || (spill.remote_serves && spill.spilled_part(&probe).is_some());
            if readable {
                want.push(r);
            }
        }
        if want.is_empty() {
            return Ok(0);
        }
        let mut buf = vec![0u8; want.len() * rb];
        let plan = Plan::build(layout, &want, rb, var.max_read, |o| var.is_remote(o))?;
        self.watch(var.execute_counted(&plan, &mut buf, want.len(), OwnRows::Copy, false))?;
        for (r, bytes) in want.iter().zip(buf.chunks_exact(rb)) {
            spill.stage.insert(*r as u64, bytes.to_vec());
        }
        Ok(want.len())
    }

    /// Registers a destination buffer of `name`'s reads once, so reads into it skip registration.
    pub fn register_dst(&self, name: &str, addr: usize, len: usize) -> Result<()> {
        self.var(name)?.remote.register_dst(addr, len)
    }
    /// Undoes [`Store::register_dst`].
    pub fn unregister_dst(&self, name: &str, addr: usize, len: usize) -> Result<()> {
        self.var(name)?.remote.unregister_dst(addr, len)
    }

    /// Read counters of `name` (for a ragged variable, rows are its ragged
    /// rows and bytes its values: see `Store::ragged_profile`).
    pub fn profile(&self, name: &str) -> Result<Profile> {
        if self.is_ragged(name) {
            return self.ragged_profile(name);
        }
        let var = self.var(name)?;
        let mut p = var.counters.snapshot();
        p.rejected_replies = var.remote.rejected_replies();
        Ok(p)
    }

    /// Gives the transport the job's secret (a method-2 core job's token,
    /// which its extra jobs present): it keys what remote reads exchange.
    pub fn set_secret(&self, secret: &[u8]) -> Result<()> {
        self.transport()?.set_secret(secret);
        Ok(())
    }

    /// The job's secret the transport keys its requests with, if any (handed
    /// to this process's spawned workers only; never logged).
    pub fn secret(&self) -> Option<Vec<u8>> {
        self.transport().ok().and_then(|t| t.secret())
    }

    /// Requests from the network that this process's transport dropped
    /// unanswered (no proof of the job's secret, or beyond its bounds).
    pub fn rejected_requests(&self) -> u64 {
        self.transport().map_or(0, |t| t.rejected_requests())
    }

    /// Abandons readers and transport objects inherited across `fork()` now.
    /// Not needed: the first read of a forked child does the same for the
    /// variable it reads (see [`crate::fork`]); kept for callers that made it.
    pub fn fork_reader(&self) -> Result<()> {
        self.check_live()?;
        for var in self.vars.read().unwrap().values() {
            var.readers.forget_inherited(var.remote.as_ref())?;
        }
        Ok(())
    }

    /// Releases every variable; later calls fail with `Error::Freed`.
    /// Collective: every rank of the group calls it, and no rank tears its
    /// shares down before every rank has stopped reading them. The barrier is
    /// bounded by `DDSTORE_TIMEOUT_S`: when a rank does not arrive in time this
    /// returns `Error::Timeout` naming it, and this rank's shares are left
    /// mapped and registered (leaked until the process exits) instead of torn
    /// down, so a late peer still reading them reads valid rows, and no
    /// collective teardown (MPI windows) waits for a rank that is not there.
    pub fn free(&self) -> Result<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Always synchronise, even after a read timed out: the peer may be back
        // (a stall, not a death), and skipping here would leave it waiting.
        // Extra jobs (attached, not members) run on a group of their own.
        let synced = self.comm.barrier_timeout(self.config.timeout);
        self.ragged.write().unwrap().clear();
        let vars = std::mem::take(&mut *self.vars.write().unwrap());
        let transport = self.transport.write().unwrap().take();
        if synced.is_err() {
            std::mem::forget(vars);
            std::mem::forget(transport);
            return synced;
        }
        for (_, var) in vars {
            drop(var);
        }
        drop(transport);
        synced
    }

    /// Whether `free()` was called.
    pub fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }
}

impl Variable {
    /// Per-rank records another job passes to `Store::attach` (method 2).
    pub fn records(&self) -> &[Vec<u8>] {
        &self.records
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

    /// As [`Variable::execute`]; `counted: false` leaves the read counters
    /// alone (reads ahead of use, see `Store::prefetch`).
    pub(crate) fn execute_counted(
        &self,
        plan: &Plan,
        out: &mut [u8],
        nrows: usize,
        own: OwnRows,
        counted: bool,
    ) -> Result<()> {
        let routes = self.route(plan, own)?;
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
            self.read_spilled(spill, &routes.files, out)?;
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
    fn route<'a>(&'a self, plan: &'a Plan, own: OwnRows) -> Result<Routes<'a>> {
        let mut routes = Routes::default();
        let mut pieces = Vec::new();
        for seg in &plan.segments {
            pieces.clear();
            self.take_staged(seg, &mut routes, &mut pieces);
            for seg in &pieces {
                self.route_one(seg, own, &mut routes)?;
            }
        }
        Ok(routes)
    }

    /// Takes the rows of `seg` that the read-ahead stage holds out of it
    /// (into `routes.staged`); the rest of `seg` goes to `pieces`.
    fn take_staged(&self, seg: &RemoteRead, routes: &mut Routes<'_>, pieces: &mut Vec<RemoteRead>) {
        let spill = match &self.spill {
            Some(s) if !s.stage.is_empty() => s,
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
        let name = user_name(&self.name);
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
    ) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        crate::spill::store::read_files(files, out, spill.inflight)?;
        Counters::add(&self.counters.spill_ns, started.elapsed().as_nanos() as u64);
        Ok(())
    }

    fn read_remote(&self, reads: &[RemoteRead], out: &mut [u8]) -> Result<()> {
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
struct NodeWatch {
    pid: u32,
    state: ShareState,
}

/// The name a user gave: a ragged variable's part (`x#values`, `x#ends`) is
/// reported as `x`.
fn user_name(name: &str) -> &str {
    name.strip_suffix("#values")
        .or_else(|| name.strip_suffix("#ends"))
        .unwrap_or(name)
}

/// The reads of one batch by route (see [`Variable::execute`]).
#[derive(Default)]
struct Routes<'a> {
    /// Memory copies: a read and the memory it copies from.
    copies: Vec<(RemoteRead, &'a dyn Memory)>,
    /// Reads of spill files (own and same-node owners' spilled rows).
    files: Vec<FileRead<'a>>,
    /// Rows taken from the read-ahead stage: destination offset and bytes.
    staged: Vec<(usize, Vec<u8>)>,
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

/// A row's size as people count it: "8 float32 values (32 bytes)", or "32 bytes" of raw rows.
fn row_size(row_bytes: usize, dtype: DType) -> String {
    if dtype == DType::Bytes {
        return format!("{row_bytes} bytes");
    }
    let values = row_bytes / dtype.itemsize();
    format!("{values} {} values ({row_bytes} bytes)", dtype.name())
}
