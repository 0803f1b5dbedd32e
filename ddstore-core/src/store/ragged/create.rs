//! Creating a ragged variable (its two parts, agreed collectively),
//! linking attached parts into one, and finding it by name.

use std::sync::Arc;

use crate::comm::gather_u64;
use crate::dtype::DType;
use crate::kinds::RaggedPart;
use crate::profile::{Counters, Profile};
use crate::store::{Element, Store};
use crate::{Error, Result};

use super::{RaggedInfo, RaggedVar, StagingPool, END_BYTES};

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
        let mut problem = None;
        if unit_bytes == 0 {
            problem = Some("units must be at least one byte wide".to_string());
        } else if (units as u128) * (unit_bytes as u128) != data.len() as u128 {
            problem = Some(format!(
                "the lengths sum to {units} units of {unit_bytes} bytes = {} bytes, but the values have {} bytes",
                units as u128 * unit_bytes as u128,
                data.len()
            ));
        } else if self.has_var(name) {
            problem = Some(format!("variable '{name}' already exists"));
        }
        // Agreed first so that a bad rank fails every rank, not only itself.
        self.init_spilling_with(
            &RaggedPart::Values.of(name),
            units,
            unit_bytes.max(1),
            element.into(),
            request,
            problem,
        )?;
        self.init_spilling(
            &RaggedPart::Ends.of(name),
            lengths.len() as u64,
            END_BYTES,
            DType::Int64,
            request,
        )?;
        let mut ends = Vec::with_capacity(lengths.len() * END_BYTES);
        let mut end = 0u64;
        for &l in lengths {
            end += l;
            ends.extend_from_slice(&end.to_le_bytes());
        }
        self.write_local(&RaggedPart::Ends.of(name), 0, &ends)?;
        self.write_local(&RaggedPart::Values.of(name), 0, data)?;
        let longest = lengths.iter().max().copied().unwrap_or(0);
        let max_row_bytes = gather_u64(self.comm().as_ref(), longest * unit_bytes as u64)?;
        self.link_ragged_with(name, Some(max_row_bytes))?;
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
