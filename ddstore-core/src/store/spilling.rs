//! Variables past their memory budget (see [`crate::spill`]): creating
//! one whose share spills, reading its spilled rows ahead of use, and
//! telling every rank's read-ahead stage which rows were updated.
//!
//! Updates reach staged rows: `write_local` drops this process's staged
//! copies of the rows it wrote at once and notes them; `barrier` (when any
//! variable spills) gathers every rank's notes after the barrier proper, so
//! every rank drops its staged copies of every updated row before it
//! returns. Only a rank's own process stages rows: a forked child's stage
//! is empty, and attached stores (spawned workers, method-2 extra jobs)
//! have none, so no other copy exists.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::direct_io;
use crate::kinds::RaggedPart;
use crate::plan::Plan;
use crate::spill::read::read_ahead_depth;
use crate::spill::run_all;
use crate::spill::stage::Reserved;
use crate::spill::store::{Split, VarSpill};
use crate::transport::RemoteRead;
use crate::{Error, Result};

use super::{Element, NewVar, OwnRows, Store, Variable};

impl Store {
    /// Collective barrier over the store's group, bounded by
    /// `DDSTORE_TIMEOUT_S` (`Error::Timeout` naming the ranks that did not
    /// arrive). When any variable spills, every rank then learns the rows
    /// every rank updated (`write_local`, file loads) since the last
    /// barrier and drops its read-ahead stage's copies of them: a read
    /// after the barrier returns never gets a row older than the update.
    pub fn barrier(&self) -> Result<()> {
        self.comm.barrier_timeout(self.config.timeout)?;
        // Whether a variable spills is agreed when it is added: every rank
        // takes the same branch.
        let spilling = self
            .vars
            .read()
            .unwrap()
            .values()
            .any(|v| v.spill.is_some());
        if !spilling {
            return Ok(());
        }
        let mine = self.updates.take();
        let record = serde_json::to_vec(&mine).expect("update notes serialise");
        let all = match self.comm.allgather(&record) {
            Ok(all) => all,
            Err(e) => {
                self.updates.put_back(mine);
                return Err(e);
            }
        };
        for (rank, raw) in all.iter().enumerate() {
            let theirs: BTreeMap<String, Vec<(u64, u64)>> = serde_json::from_slice(raw)
                .map_err(|e| Error::Comm(format!("bad update record from rank {rank}: {e}")))?;
            for (name, ranges) in theirs {
                let Some(var) = self.vars.read().unwrap().get(&name).cloned() else {
                    continue; // freed meanwhile
                };
                for (a, b) in ranges {
                    self.forget_staged(&var, a..b);
                }
            }
        }
        Ok(())
    }

    /// Global rows `rows` of `var` were written here: this process's staged
    /// copies go now, and every rank's at the next [`Store::barrier`].
    pub(crate) fn note_update(&self, var: &Variable, rows: Range<u64>) {
        if var.spill.is_none() || rows.is_empty() {
            return;
        }
        self.updates.note(&var.name, rows.clone());
        self.forget_staged(var, rows);
    }

    /// Drops the staged copies of `var`'s global rows `rows`. A ragged
    /// variable's stage (in its values part) holds whole ragged rows, which
    /// a part's rows do not name: all of it goes.
    fn forget_staged(&self, var: &Variable, rows: Range<u64>) {
        if let Some(ragged) = RaggedPart::owner(&var.name) {
            let found = self.ragged.read().unwrap().get(ragged).cloned();
            if let Some(spill) = found.as_ref().and_then(|r| r.values.spill.as_ref()) {
                spill.stage.invalidate(0..u64::MAX);
            }
        } else if let Some(spill) = &var.spill {
            spill.stage.invalidate(rows);
        }
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
        element: impl Into<Element>,
        request: Option<&crate::spill::SpillRequest>,
    ) -> Result<()> {
        self.init_spilling_with(name, rows, row_bytes, element.into(), request, None)
    }

    /// As [`Store::init_spilling`]; `problem` is this rank's reason it
    /// cannot create the variable (every rank then fails with it).
    pub(crate) fn init_spilling_with(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        element: Element,
        request: Option<&crate::spill::SpillRequest>,
        problem: Option<String>,
    ) -> Result<()> {
        self.create_many(&[NewVar {
            name,
            rows,
            row_bytes,
            element,
            data: None,
            request,
            problem,
            along: None,
        }])
        .map(drop)
    }

    /// Collective: creates `name` from this rank's rows (`data`, `rows`
    /// rows of `row_bytes` bytes) with one allgather (see
    /// [`Store::create_many`]); every rank's rows are readable on return.
    pub fn add(
        &self,
        name: &str,
        rows: u64,
        row_bytes: usize,
        element: impl Into<Element>,
        data: &[u8],
        request: Option<&crate::spill::SpillRequest>,
    ) -> Result<()> {
        self.create_many(&[NewVar {
            name,
            rows,
            row_bytes,
            element: element.into(),
            data: Some(data),
            request,
            problem: None,
            along: None,
        }])
        .map(drop)
    }

    /// Whether any rank's share of `name` spills (see [`crate::spill`]).
    pub fn is_spilled(&self, name: &str) -> Result<bool> {
        if self.is_ragged(name) {
            let var = self.ragged_var(name)?;
            return Ok(var.values.spill.is_some() || var.ends.spill.is_some());
        }
        Ok(self.var(name)?.spill.is_some())
    }

    /// Bytes of `name`'s read-ahead stage (0 when it stages nothing: no
    /// rank's share spills, or this is a forked child); a ragged variable's
    /// is its values' stage.
    pub fn stage_capacity(&self, name: &str) -> Result<usize> {
        if self.is_ragged(name) {
            let var = self.ragged_var(name)?;
            return Ok(var.values.spill.as_ref().map_or(0, |s| s.stage.capacity()));
        }
        Ok(self
            .var(name)?
            .spill
            .as_ref()
            .map_or(0, |s| s.stage.capacity()))
    }

    /// Reads ahead: stages the spilled rows among global `rows` (rows soon
    /// read by this process; others and out-of-range ones are skipped) in
    /// the variable's read-ahead stage, up to its capacity, so a read that
    /// needs them copies them from memory. Returns the rows staged. Not
    /// counted as reads (`get_profile`'s `prefetch_hits` counts the rows
    /// later reads found staged).
    /// A ragged variable's rows are staged whole ([`Store::prefetch_ragged`]);
    /// its parts stage nothing by themselves.
    pub fn prefetch(&self, name: &str, rows: &[i64]) -> Result<usize> {
        if self.is_ragged(name) {
            return self.prefetch_ragged(name, rows);
        }
        let var = self.var(name)?;
        if RaggedPart::owner(&var.name).is_some() {
            return Ok(0);
        }
        let Some(spill) = &var.spill else {
            return Ok(0);
        };
        let rb = var.info.row_bytes;
        let layout = &var.info.layout;
        let room = spill.stage.capacity() / rb.max(1);
        let total = layout.total();
        // The spilled rows among `rows`, in order, up to a stage full of them.
        let mut spilled: Vec<u64> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &r in rows {
            if spilled.len() >= room {
                break;
            }
            if r < 0 || r as u64 >= total || !seen.insert(r) {
                continue;
            }
            let (owner, local) = layout.locate_valid(r as u64);
            let probe = RemoteRead {
                owner,
                offset: local * rb as u64,
                len: rb,
                dst_offset: 0,
            };
            if spill.read_ahead_reads(&probe, &var.name) {
                spilled.push(r as u64);
            }
        }
        // Reserved rows are pending: a read that needs one waits for it
        // rather than reading it again; the guard gives up what is not filled.
        let reserved = Reserved::new(&spill.stage, spill.stage.reserve(&spilled, rb));
        if reserved.rows.is_empty() {
            return Ok(0);
        }
        // Rows whose file this process reads: each read into its own buffer
        // and staged as soon as it is in (a read waiting for it goes on
        // then), up to the read-ahead's depth in flight.
        let mut served = Vec::new();
        let mut direct = Vec::new();
        for &r in &reserved.rows {
            let (owner, local) = layout.locate_valid(r);
            let probe = RemoteRead {
                owner,
                offset: local * rb as u64,
                len: rb,
                dst_offset: 0,
            };
            match spill.split(&probe, &var.name)? {
                Split::Parts(None, file) => direct.push((r, file)),
                _ => served.push(r),
            }
        }
        // Each row lands in its stage buffer (pooled: already faulted in),
        // with no bounce copy; few enough in flight that the soonest needed
        // rows come in first.
        let depth = read_ahead_depth(spill.inflight, rb);
        let read = run_all(direct, depth, |(row, file), _| {
            let mut storage = spill.stage.buffer(direct_io::storage_for(file.len));
            let at = file
                .file
                .read_in_place(file.offset, file.len, &mut storage)?;
            spill.stage.fill_in(row, storage, at);
            Ok(())
        });
        self.watch(read)?;
        // Rows their owners serve (the gather path), in pieces of
        // PREFETCH_PIECE bytes: the buffer beside the stage stays small.
        let per_piece = (VarSpill::PREFETCH_PIECE / rb).max(1);
        let mut buf = Vec::new();
        for piece in served.chunks(per_piece) {
            let want: Vec<i64> = piece.iter().map(|&r| r as i64).collect();
            buf.clear();
            buf.resize(want.len() * rb, 0u8);
            let plan = Plan::build(layout, &want, rb, var.max_read, |o| var.is_remote(o))?;
            self.watch(var.execute_counted(&plan, &mut buf, want.len(), OwnRows::Copy, false))?;
            for (r, bytes) in piece.iter().zip(buf.chunks_exact(rb)) {
                spill.stage.fill(*r, bytes.to_vec());
            }
        }
        Ok(reserved.rows.len())
    }
}
