//! The store: named variables, each split across the ranks of a group.
//!
//! This file: the store itself, its lookups and its teardown. Creating
//! variables (collective agreement, attaching another job's) is in
//! `create.rs`, writing and reading rows by name in `rows.rs`, and a
//! variable with its read execution (routes, memory copies) in `variable.rs`,
//! ragged variables (their types, creation and reads) in `ragged/`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::comm::Comm;
use crate::kinds::RaggedPart;
use crate::profile::Profile;
use crate::transport::Transport;
use crate::{Config, Error, Result};

mod create;
mod info;
mod ragged;
mod rows;
mod spilling;
mod updates;
mod variable;

pub use create::NewVar;
pub use info::{Element, VarInfo};
use ragged::RaggedVar;
pub use ragged::{NewRagged, RaggedBatch, RaggedInfo, END_BYTES, END_GAP_ROWS};
pub use variable::{OwnRows, Variable, PARALLEL_COPY_BYTES};

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
    /// Rows of spilling variables updated here since the last barrier.
    updates: updates::Updates,
}

impl Store {
    /// A store of no variables over `comm`, reading through `transport`.
    /// Raises the soft descriptor limit to the hard one first (once per
    /// process, see [`crate::fd_limit`]).
    pub fn new(comm: Arc<dyn Comm>, transport: Arc<dyn Transport>, config: Config) -> Store {
        crate::fd_limit::raise_soft_limit();
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
            updates: Default::default(),
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
            .flat_map(|n| RaggedPart::ALL.map(|p| p.of(n)))
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

    /// Maps the memory this process copies rows of `names` from (its own
    /// shares, same-node peers' mappings) into its page tables ahead of
    /// reads, at most `max_bytes` of it (a share that would pass the bound is
    /// left out): for a forked reader (a loader's worker process), which
    /// inherits no page tables of shared mappings and would otherwise fault
    /// them in during its reads. A ragged variable counts both its parts.
    /// Returns the bytes populated (see [`crate::memory::Memory::populate_read`]).
    pub fn populate_node_shares(&self, names: &[String], max_bytes: usize) -> Result<usize> {
        let mut vars = Vec::new();
        for name in names {
            if self.is_ragged(name) {
                for part in RaggedPart::ALL {
                    vars.push(self.var(&part.of(name))?);
                }
            } else {
                vars.push(self.var(name)?);
            }
        }
        let (mut left, mut done) = (max_bytes, 0);
        for var in vars {
            let (tried, populated) = var.populate_node_shares(left);
            left -= tried;
            done += populated;
        }
        Ok(done)
    }

    /// Releases every variable; later calls fail with `Error::Freed`.
    /// Collective: every rank of the group calls it, and no rank tears its
    /// shares down before every rank has stopped reading them. The barrier is
    /// bounded by `DDSTORE_TIMEOUT_S`: when a rank does not arrive in time this
    /// returns `Error::Timeout` naming it, and this rank's shares are left
    /// mapped and registered (leaked until the process exits) instead of torn
    /// down, so a late peer still reading them reads valid rows, and no
    /// collective teardown (MPI windows) waits for a rank that is not there.
    /// Otherwise every share and transport object is closed, and a close
    /// that fails (libfabric, MPI) is returned once all were attempted.
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
        // Variables first (their shares' registrations or windows), then the
        // transport's own objects; every close is attempted, the first
        // failure reported.
        let mut closed = Ok(());
        for (_, var) in vars {
            let remote = var.remote.clone();
            drop(var);
            closed = closed.and(remote.close());
        }
        if let Some(transport) = transport {
            closed = closed.and(transport.close());
        }
        synced.and(closed)
    }

    /// Whether `free()` was called.
    pub fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }
}
