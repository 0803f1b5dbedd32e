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
use crate::transport::{ExposeOptions, Exposed, RemoteShares, Transport};
use crate::{Error, Result};

use super::variable::NodeWatch;
use super::{Element, Store, VarInfo, Variable};

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
            )
        });
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
                itemsize: element.itemsize,
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
}

/// A row's size as people count it: "8 float32 values (32 bytes)", or "32 bytes" of raw rows.
fn row_size(row_bytes: usize, dtype: DType) -> String {
    if dtype == DType::Bytes {
        return format!("{row_bytes} bytes");
    }
    let values = row_bytes / dtype.itemsize();
    format!("{values} {} values ({row_bytes} bytes)", dtype.name())
}
