//! Creating variables: the collective agreement of `init`/`add` and
//! attaching a variable another job published (method 2).

use std::sync::Arc;

use crate::dtype::DType;
use crate::external::ExternalShare;
use crate::layout::Layout;
use crate::memory::Memory;
use crate::profile::Counters;
use crate::reader_pool::ReaderPool;
use crate::region::{map_node_peers_watched, NodeLocator};
use crate::transport::{ExposeOptions, Exposed, Prepared, RemoteShares, Transport, WrapShare};
use crate::{Error, Result};

use super::variable::NodeWatch;
use super::{Element, Store, VarInfo, Variable};

/// What every rank announces when a variable is created, to agree or fail together.
#[derive(serde::Serialize, serde::Deserialize, PartialEq)]
struct InitRecord {
    /// Where a same-node process maps this rank's share (shares the
    /// transport prepared before the exchange, see [`Transport::prepare`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    locator: Option<NodeLocator>,
    /// A number the caller gathers along (a ragged variable's longest row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    along: Option<u64>,
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

impl Store {
    /// Collective: creates `name` with `rows` rows on this rank. Every rank
    /// checks every rank's announcement, so a mismatch fails everywhere
    /// with the same message instead of hanging.
    pub fn init(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        element: impl Into<Element>,
    ) -> Result<()> {
        self.init_spilling(name, rows, row_bytes, element, None)
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
        element: impl Into<Element>,
        share: ExternalShare,
    ) -> Result<()> {
        let want = (rows as u128) * (row_bytes as u128);
        let problem = (share.len() as u128 != want).then(|| {
            format!(
                "its external share has {} bytes, expected {rows} rows x {row_bytes} bytes = {want}",
                share.len()
            )
        });
        self.init_with(
            name,
            rows,
            row_bytes,
            element.into(),
            problem,
            |t, _, opts| t.expose_external(&self.comm, share, opts),
        )
    }

    pub(crate) fn init_with(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        element: Element,
        problem: Option<String>,
        expose: impl FnOnce(&Arc<dyn Transport>, usize, &ExposeOptions) -> Result<Exposed>,
    ) -> Result<()> {
        self.init_with_spill(
            name,
            rows,
            row_bytes,
            element,
            problem,
            (None, 0),
            Default::default(),
            expose,
        )
    }

    /// As [`Store::init_with`]; `mem_rows` (with the read-ahead stage's
    /// bytes) is what this rank keeps in memory when its share spills, and
    /// `own_spill` where the transport's wrap of it left this rank's
    /// spilled share (see [`crate::spill::store`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn init_with_spill(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        element: Element,
        problem: Option<String>,
        (mem_rows, stage_bytes): (Option<u64>, u64),
        own_spill: crate::spill::store::MadeShare,
        expose: impl FnOnce(&Arc<dyn Transport>, usize, &ExposeOptions) -> Result<Exposed>,
    ) -> Result<()> {
        self.check_live()?;
        let dtype = element.dtype;
        // Every rank learns of a rank that cannot hold its connections, and fails now.
        let problem = problem.or_else(|| {
            crate::fd_limit::preflight(
                &self.transport_name,
                self.comm.size(),
                self.config.node_sharing,
                self.config.max_connections,
            )
        });
        let mine = InitRecord {
            locator: None,
            along: None,
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
        check_agreed(&all, name, row_bytes, dtype)?;
        let len = usize::try_from(rows)
            .ok()
            .and_then(|r| r.checked_mul(row_bytes))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "variable '{name}': {rows} rows of {row_bytes} bytes is too large"
                ))
            })?;
        let opts = self.expose_options(name, None);
        let transport = self.transport()?;
        let exposed = expose(&transport, len, &opts)?;
        let own = own_spill.lock().unwrap().clone();
        self.install(
            name,
            element,
            row_bytes,
            &all,
            exposed,
            own,
            (stage_bytes, false),
        )
    }

    fn expose_options(&self, name: &str, lens: Option<Vec<u64>>) -> ExposeOptions {
        ExposeOptions {
            name: name.to_string(),
            node_sharing: self.config.node_sharing,
            keep_address: self.config.read_by_other_jobs,
            lens,
        }
    }

    /// Makes the variable `name` agreed in `all` (every rank's announcement)
    /// from this rank's `exposed` share; when any rank spills, first tells
    /// every rank where the spilled rows are (collective: every rank knows).
    /// Where this rank has a memory budget for it (`budgeted`), it reads
    /// same-node peers' shares with `pread`, not through mappings whose
    /// pages would count in its resident size (see [`crate::region::PeerFile`]).
    #[allow(clippy::too_many_arguments)]
    fn install(
        &self,
        name: &str,
        element: Element,
        row_bytes: usize,
        all: &[InitRecord],
        mut exposed: Exposed,
        own_spill: Option<Arc<crate::spill::SpilledShare>>,
        (stage_bytes, budgeted): (u64, bool),
    ) -> Result<()> {
        if budgeted {
            crate::region::read_node_peers_by_file(&mut exposed.node_peers, &exposed.node_locators);
        }
        let counts: Vec<u64> = all.iter().map(|r| r.rows).collect();
        let spill_rows: Vec<Option<u64>> = all.iter().map(|r| r.mem_rows).collect();
        let spill = if spill_rows.iter().any(Option::is_some) {
            Some(crate::spill::store::connect(
                self.comm.as_ref(),
                &mut exposed,
                own_spill,
                &spill_rows,
                &counts,
                row_bytes,
                &self.config,
                self.remote_path == "gather",
                stage_bytes,
            )?)
        } else {
            None
        };
        let var = Variable {
            name: name.to_string(),
            info: VarInfo {
                dtype: element.dtype,
                itemsize: element.itemsize,
                row_bytes,
                layout: Layout::new(&counts),
            },
            my_rank: Some(self.comm.rank()),
            local: Some(exposed.local),
            node_peers: exposed.node_peers,
            max_read: self.max_read(&*exposed.remote),
            remote: exposed.remote,
            node_locators: exposed.node_locators,
            node_watch: Vec::new(),
            readers: self.reader_pool(),
            counters: Counters::default(),
            spill,
        };
        self.insert(var);
        Ok(())
    }

    /// Collective: creates every variable of `vars`, in order, with one
    /// allgather in all (where the transport prepares shares before the
    /// exchange: libfabric; MPI RMA windows are created collectively after
    /// it). Every rank announces every variable with its share's record, and
    /// every rank checks every announcement, so a mismatch or a rank's
    /// problem fails every rank with the same message. Rows given in `data`
    /// are written before the exchange, so every rank's rows are readable
    /// when this returns (a barrier follows only where rows are written
    /// after it: a spilling share, a collective transport). Returns per
    /// variable every rank's [`NewVar::along`] (0 where not given).
    pub fn create_many(&self, vars: &[NewVar<'_>]) -> Result<Vec<Vec<u64>>> {
        self.check_live()?;
        let transport = self.transport()?;
        transport.ready(&self.comm)?;
        // Every rank learns of a rank that cannot hold its connections, and fails now.
        let preflight = crate::fd_limit::preflight(
            &self.transport_name,
            self.comm.size(),
            self.config.node_sharing,
            self.config.max_connections,
        );
        let mut locals: Vec<LocalVar> = vars
            .iter()
            .map(|v| self.prepare_var(&transport, v, preflight.clone()))
            .collect();
        let mut mine = Vec::new();
        for (v, local) in vars.iter().zip(&mut locals) {
            let prepared = local.prepared.as_mut();
            let record = InitRecord {
                locator: prepared.as_ref().and_then(|p| p.locator.clone()),
                along: v.along,
                name: v.name.to_string(),
                rows: v.rows,
                row_bytes: v.row_bytes,
                dtype: v.element.dtype,
                exists: self.has_var(v.name),
                problem: local.problem.clone(),
                mem_rows: local.pending.as_ref().map(|p| p.mem_rows),
            };
            let json = serde_json::to_vec(&record).expect("record serialises");
            let share = prepared.map(|p| std::mem::take(&mut p.record));
            push_frame(&mut mine, &json);
            push_frame(&mut mine, share.as_deref().unwrap_or_default());
        }
        let gathered = self.comm.allgather(&mine);
        let agreed = gathered.and_then(|all| agree_many(&all, vars));
        let mut agreed = match agreed {
            Ok(a) => a,
            Err(e) => {
                self.release(&locals);
                // Every rank fails; this rank with its own error (its class: access, I/O).
                return Err(locals.into_iter().find_map(|l| l.own_error).unwrap_or(e));
            }
        };
        // Rows written after the exchange must be readable on return: a barrier.
        let mut late_rows = false;
        let mut alongs = Vec::with_capacity(vars.len());
        let mut locals = locals.into_iter();
        for (i, v) in vars.iter().enumerate() {
            let mut local = locals.next().expect("one per variable");
            let (all, records) = std::mem::take(&mut agreed[i]);
            alongs.push(all.iter().map(|r| r.along.unwrap_or(0)).collect());
            let spills = all.iter().any(|r| r.mem_rows.is_some());
            late_rows |= v.data.is_some() && (local.prepared.is_none() || spills);
            let made = self.create_agreed(&transport, v, &mut local, all, records);
            let made = made.and_then(|()| match (v.data, local.written) {
                (Some(data), false) => self.write_local(v.name, 0, data),
                _ => Ok(()),
            });
            if let Err(e) = made {
                self.spill.release(&local.pending);
                self.release(&locals.collect::<Vec<_>>());
                return Err(e);
            }
        }
        if late_rows {
            // Bounded: a rank that never arrives is named, not waited for forever.
            self.comm.barrier_timeout(self.config.timeout)?;
        }
        Ok(alongs)
    }

    /// Gives back the memory budget that `locals` reserved.
    fn release(&self, locals: &[LocalVar]) {
        for l in locals {
            self.spill.release(&l.pending);
        }
    }

    /// This rank's side of a new variable before the exchange: its spill
    /// budget, and its share where the transport prepares one, with the
    /// rows written. Anything wrong becomes the rank's announced problem.
    fn prepare_var<'a>(
        &self,
        transport: &Arc<dyn Transport>,
        v: &NewVar<'a>,
        preflight: Option<String>,
    ) -> LocalVar {
        let mut local = LocalVar::default();
        let len = usize::try_from(v.rows)
            .ok()
            .and_then(|r| r.checked_mul(v.row_bytes));
        local.problem = v
            .problem
            .clone()
            .or(preflight)
            .or_else(|| match (len, v.data) {
                (None, _) => Some(format!(
                    "{} rows of {} bytes is too large",
                    v.rows, v.row_bytes
                )),
                (Some(len), Some(d)) if d.len() != len => Some(format!(
                    "{} bytes of rows given for {} rows of {} bytes",
                    d.len(),
                    v.rows,
                    v.row_bytes
                )),
                _ => None,
            });
        if local.problem.is_some() {
            return local;
        }
        let len = len.unwrap_or(0);
        local.budgeted = crate::spill::store::budget_of(&self.config, v.request).is_some();
        match self.spill.prepare(
            &self.config,
            self.comm.rank(),
            v.name,
            v.rows,
            v.row_bytes,
            v.request,
        ) {
            Ok((pending, stage)) => (local.pending, local.stage) = (pending, stage),
            Err(e) => {
                local.problem = Some(e.to_string());
                local.own_error = Some(e);
                return local;
            }
        }
        let (wrap, own) =
            crate::spill::store::wrapper(&local.pending, len, self.config.max_inflight);
        local.own = own;
        let mem_len = local
            .pending
            .as_ref()
            .map(|p| p.mem_rows as usize * v.row_bytes);
        let opts = self.expose_options(v.name, None);
        let spilled = mem_len.map(|_| (len, &wrap as WrapShare<'_>));
        match transport.prepare(&self.comm, mem_len.unwrap_or(len), &opts, spilled) {
            Ok(Some(p)) => {
                if let (Some(data), None) = (v.data, &local.pending) {
                    match p.local.write_at(0, data) {
                        Ok(()) => local.written = true,
                        Err(e) => local.problem = Some(e.to_string()),
                    }
                }
                local.prepared = Some(p);
            }
            Ok(None) => {}
            Err(e) => local.problem = Some(e.to_string()),
        }
        local
    }

    /// The variable `v` once every rank agreed on it (`all`, and every
    /// rank's transport record): connected from the share prepared before
    /// the exchange, or exposed now (collective) by a transport that does
    /// not prepare shares.
    fn create_agreed(
        &self,
        transport: &Arc<dyn Transport>,
        v: &NewVar<'_>,
        local: &mut LocalVar,
        all: Vec<InitRecord>,
        records: Vec<Vec<u8>>,
    ) -> Result<()> {
        let len = v.rows as usize * v.row_bytes;
        let (exposed, own) = match local.prepared.take() {
            Some(prepared) => {
                let share = prepared.local.clone();
                let locators: Vec<Option<NodeLocator>> =
                    all.iter().map(|r| r.locator.clone()).collect();
                let remote = transport.connect(prepared, &records)?;
                let (node_peers, node_locators) = if self.config.node_sharing {
                    let views = crate::region::map_node_peers(&locators, Some(self.comm.rank()));
                    let publishes = self.config.read_by_other_jobs && self.comm.rank() == 0;
                    let kept = if publishes {
                        locators
                    } else {
                        crate::region::same_host_only(locators)
                    };
                    (views, kept)
                } else {
                    ((0..all.len()).map(|_| None).collect(), Vec::new())
                };
                let exposed = Exposed {
                    local: share,
                    node_peers,
                    remote,
                    records,
                    node_locators,
                };
                (exposed, local.own.lock().unwrap().clone())
            }
            None => {
                let spills = all.iter().any(|r| r.mem_rows.is_some());
                let lens = (!spills).then(|| {
                    all.iter()
                        .map(|r| r.rows.saturating_mul(v.row_bytes as u64))
                        .collect()
                });
                let opts = self.expose_options(v.name, lens);
                let (wrap, own) =
                    crate::spill::store::wrapper(&local.pending, len, self.config.max_inflight);
                let exposed = match local.pending.as_ref() {
                    Some(p) => {
                        let mem_len = p.mem_rows as usize * v.row_bytes;
                        transport.expose_spilled(&self.comm, mem_len, len, &opts, &wrap)?
                    }
                    None => transport.expose(&self.comm, len, &opts)?,
                };
                let own = own.lock().unwrap().clone();
                (exposed, own)
            }
        };
        self.install(
            v.name,
            v.element,
            v.row_bytes,
            &all,
            exposed,
            own,
            (local.stage, local.budgeted),
        )
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
        // The core ranks' shares are read over the network (same-node ones mapped).
        if let Some(problem) = crate::fd_limit::preflight(
            &self.transport_name,
            records.len() + 1,
            self.config.node_sharing,
            self.config.max_connections,
        ) {
            return Err(Error::invalid(problem));
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
        let counts = info.layout.counts();
        let (node_peers, node_watch) = mapped
            .into_iter()
            .zip(node_locators.iter().chain(std::iter::repeat(&None)))
            .enumerate()
            .map(|(r, (m, loc))| match (m, loc) {
                // A share shorter than its rows spills (see crate::spill): its
                // owner serves it whole through the transport instead.
                (Some(m), Some(_))
                    if (m.memory.len() as u64)
                        < counts[r].saturating_mul(info.row_bytes as u64) =>
                {
                    (None, None)
                }
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
            node_locators: Vec::new(),
            node_watch,
            readers: self.reader_pool(),
            counters: Counters::default(),
            spill: None,
        };
        self.insert(var);
        Ok(())
    }
}

/// A variable to create with [`Store::create_many`].
pub struct NewVar<'a> {
    /// Its name, new in this store.
    pub name: &'a str,
    /// Rows on this rank.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: usize,
    /// What the rows are made of.
    pub element: Element,
    /// This rank's rows (`rows * row_bytes` bytes); `None`: zeros, written
    /// later (`Store::write_local`).
    pub data: Option<&'a [u8]>,
    /// Its own memory budget and spill directory (see [`crate::spill`]).
    pub request: Option<&'a crate::spill::SpillRequest>,
    /// Why this rank cannot create it: every rank then fails with it.
    pub problem: Option<String>,
    /// A number every rank learns along (a ragged variable's longest row).
    pub along: Option<u64>,
}

/// This rank's side of a variable being created (see `Store::prepare_var`).
#[derive(Default)]
struct LocalVar {
    problem: Option<String>,
    /// The error behind `problem` where it has a class of its own (access, I/O).
    own_error: Option<Error>,
    pending: Option<crate::spill::store::PendingSpill>,
    stage: u64,
    /// This rank has a memory budget for the variable (see [`Store::install`]).
    budgeted: bool,
    own: crate::spill::store::MadeShare,
    prepared: Option<Prepared>,
    /// Its rows are in the prepared share already.
    written: bool,
}

/// Appends `part` to `out` with its length first (4 bytes, little-endian).
fn push_frame(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(&(part.len() as u32).to_le_bytes());
    out.extend_from_slice(part);
}

/// The parts [`push_frame`] put in `rank`'s record.
fn frames(rank: usize, mut bytes: &[u8]) -> Result<Vec<&[u8]>> {
    let mut parts = Vec::new();
    while !bytes.is_empty() {
        let bad = || Error::Comm(format!("rank {rank} sent a truncated init record"));
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(bad)?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(bad());
        }
        parts.push(&rest[..len]);
        bytes = &rest[len..];
    }
    Ok(parts)
}

/// Of one variable: every rank's announcement and its share's transport record.
type Agreed = (Vec<InitRecord>, Vec<Vec<u8>>);

/// Per variable of `vars`, every rank's announcement and transport record
/// from the exchanged records `all`, each checked ([`check_agreed`]).
fn agree_many(all: &[Vec<u8>], vars: &[NewVar<'_>]) -> Result<Vec<Agreed>> {
    let mut agreed: Vec<Agreed> = vars
        .iter()
        .map(|_| (Vec::with_capacity(all.len()), Vec::with_capacity(all.len())))
        .collect();
    for (r, raw) in all.iter().enumerate() {
        let parts = frames(r, raw)?;
        if parts.len() != 2 * vars.len() {
            return Err(Error::invalid(format!(
                "collective mismatch: rank {r} created {} variables at once while this rank \
                 created {}: every rank must add the same variables in the same order",
                parts.len() / 2,
                vars.len()
            )));
        }
        for (i, pair) in parts.chunks(2).enumerate() {
            let rec: InitRecord = serde_json::from_slice(pair[0])
                .map_err(|e| Error::Comm(format!("bad init record from rank {r}: {e}")))?;
            agreed[i].0.push(rec);
            agreed[i].1.push(pair[1].to_vec());
        }
    }
    for (v, (records, _)) in vars.iter().zip(&agreed) {
        check_agreed(records, v.name, v.row_bytes, v.element.dtype)?;
    }
    Ok(agreed)
}

/// Every rank's announcement of `name` agrees with this rank's: the same
/// variable, new everywhere, rows of one shape; a rank's problem fails all.
fn check_agreed(all: &[InitRecord], name: &str, row_bytes: usize, dtype: DType) -> Result<()> {
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
    Ok(())
}

/// A row's size as people count it: "8 float32 values (32 bytes)", or "32 bytes" of raw rows.
fn row_size(row_bytes: usize, dtype: DType) -> String {
    if dtype == DType::Bytes {
        return format!("{row_bytes} bytes");
    }
    let values = row_bytes / dtype.itemsize();
    format!("{values} {} values ({row_bytes} bytes)", dtype.name())
}
