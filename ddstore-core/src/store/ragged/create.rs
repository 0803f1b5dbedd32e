//! Creating a ragged variable: its two parts, agreed collectively, from
//! values at hand ([`Store::add_ragged`]) or written by the caller in
//! between ([`Store::begin_ragged`], then [`Store::finish_ragged`]: the one
//! protocol, both ways); linking attached parts into one; finding it by name.

use std::sync::Arc;

use crate::dtype::DType;
use crate::kinds::RaggedPart;
use crate::profile::{Counters, Profile};
use crate::store::{Element, NewVar, Store};
use crate::{Error, Result};

use super::{RaggedInfo, RaggedVar, StagingPool, END_BYTES};

/// A ragged variable being created: its parts exist on every rank and its
/// row ends are written; this rank's values are written next, then
/// [`Store::finish_ragged`] makes it readable.
#[must_use = "a ragged variable is readable only once finish_ragged links it"]
pub struct NewRagged {
    name: String,
    /// This rank's longest row in bytes (bounds gathered replies).
    longest_row_bytes: u64,
    /// Writing the row ends failed here: every rank fails at `finish_ragged`.
    problem: Option<String>,
}

impl NewRagged {
    /// The name of the part this rank's values are written into.
    pub fn values_part(&self) -> String {
        RaggedPart::Values.of(&self.name)
    }
}

/// A ragged variable's shape on this rank, for creating its two parts.
struct Parts<'a> {
    lengths: &'a [u64],
    unit_bytes: usize,
    element: Element,
    request: Option<&'a crate::spill::SpillRequest>,
}

/// What each rank tells the others at [`Store::finish_ragged`].
#[derive(serde::Serialize, serde::Deserialize)]
struct FinishRecord {
    longest_row_bytes: u64,
    problem: Option<String>,
}

impl Store {
    /// Collective: creates the ragged variable `name` from this rank's rows:
    /// `lengths[i]` units of `unit_bytes` bytes each for row i, the rows'
    /// values concatenated in `data`. Returns once every rank's rows are
    /// readable. A bad argument on any rank fails every rank with its message.
    pub fn add_ragged(
        &self,
        name: &str,
        lengths: &[u64],
        unit_bytes: usize,
        element: impl Into<Element>,
        data: &[u8],
    ) -> Result<()> {
        self.add_ragged_spilling(name, lengths, unit_bytes, element, data, None)
    }

    /// As [`Store::add_ragged`], with the variable's own memory budget and
    /// spill directory where `request` gives them (values first, then row
    /// ends, take from the budget; see [`crate::spill`]).
    pub fn add_ragged_spilling(
        &self,
        name: &str,
        lengths: &[u64],
        unit_bytes: usize,
        element: impl Into<Element>,
        data: &[u8],
        request: Option<&crate::spill::SpillRequest>,
    ) -> Result<()> {
        let units: u64 = lengths.iter().sum();
        let problem = ((units as u128) * (unit_bytes as u128) != data.len() as u128).then(|| {
            format!(
                "the lengths sum to {units} units of {unit_bytes} bytes = {} bytes, but the values have {} bytes",
                units as u128 * unit_bytes as u128,
                data.len()
            )
        });
        let problem = self.ragged_problem(name, unit_bytes, problem);
        let longest = lengths.iter().max().copied().unwrap_or(0);
        let parts = Parts {
            lengths,
            unit_bytes,
            element: element.into(),
            request,
        };
        // Both parts, with their rows, in one exchange: a bad rank fails every rank, and every
        // rank's rows are readable when it returns (no barrier follows).
        let values = problem.is_none().then_some(data);
        let along = longest.saturating_mul(unit_bytes as u64);
        let mut alongs = self.create_parts(name, parts, values, problem, Some(along))?;
        self.link_ragged_with(name, Some(alongs.swap_remove(0)))
    }

    /// Collective: creates both parts of the ragged variable `name` in one
    /// exchange, the row ends written and the values too where given;
    /// `problem` fails every rank, `along` is the values' number every rank
    /// learns (see [`Store::create_many`]).
    fn create_parts(
        &self,
        name: &str,
        parts: Parts<'_>,
        values: Option<&[u8]>,
        problem: Option<String>,
        along: Option<u64>,
    ) -> Result<Vec<Vec<u64>>> {
        let ends = row_ends(parts.lengths);
        let (values_name, ends_name) = (RaggedPart::Values.of(name), RaggedPart::Ends.of(name));
        self.create_many(&[
            NewVar {
                name: &values_name,
                rows: parts.lengths.iter().sum(),
                row_bytes: parts.unit_bytes.max(1),
                element: parts.element,
                data: values,
                request: parts.request,
                problem,
                along,
            },
            NewVar {
                name: &ends_name,
                rows: parts.lengths.len() as u64,
                row_bytes: END_BYTES,
                element: DType::Int64.into(),
                data: Some(&ends),
                request: parts.request,
                problem: None,
                along: None,
            },
        ])
    }

    /// This rank's reason it cannot create the ragged variable `name` (the
    /// caller's `problem` first), or None.
    fn ragged_problem(
        &self,
        name: &str,
        unit_bytes: usize,
        problem: Option<String>,
    ) -> Option<String> {
        problem.or_else(|| {
            if unit_bytes == 0 {
                Some("units must be at least one byte wide".to_string())
            } else if self.has_var(name) {
                Some(format!("variable '{name}' already exists"))
            } else {
                None
            }
        })
    }

    /// Collective, the first step of creating the ragged variable `name`
    /// whose values the caller writes itself (without a contiguous copy of
    /// them first): creates both parts for this rank's rows (`lengths[i]`
    /// units of `unit_bytes` bytes for row i) and writes the row ends. The
    /// caller then writes this rank's values into [`NewRagged::values_part`]
    /// (`write_local`) and hands the outcome to [`Store::finish_ragged`].
    /// `problem`: this rank's reason it cannot create the variable; a
    /// problem on any rank fails every rank with its message.
    pub fn begin_ragged(
        &self,
        name: &str,
        lengths: &[u64],
        unit_bytes: usize,
        element: impl Into<Element>,
        request: Option<&crate::spill::SpillRequest>,
        problem: Option<String>,
    ) -> Result<NewRagged> {
        let problem = self.ragged_problem(name, unit_bytes, problem);
        let parts = Parts {
            lengths,
            unit_bytes,
            element: element.into(),
            request,
        };
        // Both parts in one exchange, agreed first so that a bad rank fails every rank; the row
        // ends are written before it, the values after (finish_ragged's barrier covers them).
        self.create_parts(name, parts, None, problem, None)?;
        let longest = lengths.iter().max().copied().unwrap_or(0);
        Ok(NewRagged {
            name: name.to_string(),
            longest_row_bytes: longest * unit_bytes as u64,
            problem: None,
        })
    }

    /// Collective, the last step of creating a ragged variable (see
    /// [`Store::begin_ragged`]): every rank learns whether every rank wrote
    /// its values (`problem`: this rank's reason it did not) and each rank's
    /// longest row; returns once every rank's rows are readable. A problem
    /// on any rank fails every rank, naming it.
    pub fn finish_ragged(&self, new: NewRagged, problem: Option<String>) -> Result<()> {
        let mine = FinishRecord {
            longest_row_bytes: new.longest_row_bytes,
            problem: new.problem.or(problem),
        };
        let all = self
            .comm()
            .allgather(&serde_json::to_vec(&mine).expect("record serialises"))?;
        let mut max_row_bytes = Vec::with_capacity(all.len());
        for (r, raw) in all.iter().enumerate() {
            let rec: FinishRecord = serde_json::from_slice(raw)
                .map_err(|e| Error::Comm(format!("bad ragged record from rank {r}: {e}")))?;
            if let Some(p) = rec.problem {
                return Err(Error::invalid(format!(
                    "ragged variable '{}': rank {r}: {p}",
                    new.name
                )));
            }
            max_row_bytes.push(rec.longest_row_bytes);
        }
        self.link_ragged_with(&new.name, Some(max_row_bytes))?;
        self.comm().barrier()
    }

    /// Registers `name` as ragged once its two variables exist here (after
    /// `add_ragged`, or after a method-2 extra job attached both).
    pub fn link_ragged(&self, name: &str) -> Result<()> {
        self.link_ragged_with(name, None)
    }

    fn link_ragged_with(&self, name: &str, max_row_bytes: Option<Vec<u64>>) -> Result<()> {
        let values = self.var(&RaggedPart::Values.of(name))?;
        let ends = self.var(&RaggedPart::Ends.of(name))?;
        if ends.info.row_bytes != END_BYTES
            || ends.info.layout.nranks() != values.info.layout.nranks()
        {
            return Err(Error::invalid(format!(
                "'{name}': its ends and values variables do not describe one ragged variable"
            )));
        }
        let info = RaggedInfo {
            dtype: values.info.dtype,
            itemsize: values.info.itemsize,
            unit_bytes: values.info.row_bytes,
            rows: ends.info.layout.clone(),
            units: values.info.layout.clone(),
        };
        let var = RaggedVar {
            info,
            values,
            ends,
            max_row_bytes,
            staging: StagingPool::default(),
            counters: Counters::default(),
        };
        self.ragged
            .write()
            .unwrap()
            .insert(name.to_string(), Arc::new(var));
        Ok(())
    }

    /// The shape of ragged variable `name`.
    pub fn ragged_info(&self, name: &str) -> Result<RaggedInfo> {
        Ok(self.ragged_var(name)?.info.clone())
    }

    pub(in crate::store) fn ragged_var(&self, name: &str) -> Result<Arc<RaggedVar>> {
        self.check_live()?;
        let found = self.ragged.read().unwrap().get(name).cloned();
        // The lock is released before the error looks at every name.
        found.ok_or_else(|| self.unknown_variable(name))
    }

    /// Read counters of ragged variable `name`: calls, rows (ragged rows),
    /// bytes (values) and the local / same-node / remote row split counted
    /// per batch; transport reads and times summed over its two parts.
    pub(crate) fn ragged_profile(&self, name: &str) -> Result<Profile> {
        let var = self.ragged_var(name)?;
        let mut p = var.counters.snapshot();
        for part in [&var.ends, &var.values] {
            let q = part.counters.snapshot();
            p.remote_reads += q.remote_reads;
            p.remote_ns += q.remote_ns;
            p.copy_ns += q.copy_ns;
            p.cq_ns += q.cq_ns;
            p.mr_ns += q.mr_ns;
            p.lock_ns += q.lock_ns;
            p.rejected_replies += part.remote.rejected_replies();
        }
        Ok(p)
    }

    /// Whether `name` is a ragged variable.
    pub fn is_ragged(&self, name: &str) -> bool {
        self.ragged.read().unwrap().contains_key(name)
    }
}

/// The row ends of rows of `lengths` units: row i ends at the sum of the
/// first i + 1 lengths (little-endian u64s).
fn row_ends(lengths: &[u64]) -> Vec<u8> {
    let mut ends = Vec::with_capacity(lengths.len() * END_BYTES);
    let mut end = 0u64;
    for &l in lengths {
        end += l;
        ends.extend_from_slice(&end.to_le_bytes());
    }
    ends
}
