//! Idle reader endpoints of one domain, shared by every reader there, and
//! the quarantine of endpoints a failed read left operations on.

use std::sync::{Arc, Mutex};

use super::domain::Domain;
use super::window::Live;
use crate::error::{close_all, FabricResult};

/// variable: a process holds one endpoint per concurrent read (and its
/// connections per peer), not one per variable and thread. An endpoint a
/// failed read left operations on is quarantined where the provider moves
/// data only while we poll (it is never polled again, so nothing lands in
/// the caller's memory, and a resumed peer still finds it open: shm crashes
/// a peer answering a closed endpoint); elsewhere it is closed.
pub struct EndpointPool {
    domain: Arc<Domain>,
    idle: Mutex<Vec<Live>>,
    quarantined: Mutex<Vec<Live>>,
}

/// Quarantined endpoints kept at most; past it the oldest is closed.
const MAX_QUARANTINED: usize = 16;

impl EndpointPool {
    /// A pool of reader endpoints in `domain`.
    pub fn new(domain: Arc<Domain>) -> Arc<EndpointPool> {
        Arc::new(EndpointPool {
            domain,
            idle: Mutex::new(Vec::new()),
            quarantined: Mutex::new(Vec::new()),
        })
    }

    /// The domain its endpoints are opened in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Endpoints held now: (idle, quarantined).
    pub fn counts(&self) -> (usize, usize) {
        (lock(&self.idle).len(), lock(&self.quarantined).len())
    }

    /// An idle endpoint of this window and CQ format, or a new one.
    pub(crate) fn take(&self, window: usize, tagged: bool) -> FabricResult<Live> {
        let reused = {
            let mut idle = lock(&self.idle);
            let at = idle
                .iter()
                .rposition(|l| l.tagged == tagged && l.slots.len() == window);
            at.map(|i| idle.swap_remove(i))
        };
        match reused {
            Some(live) => Ok(live),
            None => Live::open(&self.domain, window, tagged),
        }
    }

    /// Closes the idle endpoints now, reporting the first failure;
    /// quarantined ones are closed abandoning their buffers, as on drop.
    pub fn close(&self) -> FabricResult<()> {
        if !self.domain.usable_here() {
            return Ok(()); // inherited across fork(): the drop abandons them
        }
        let idle = std::mem::take(&mut *lock(&self.idle));
        let quarantined = std::mem::take(&mut *lock(&self.quarantined));
        quarantined.into_iter().for_each(close_abandoning);
        close_all(idle, Live::close)
    }

    /// Takes back an endpoint with nothing in flight.
    pub(crate) fn give_back(&self, mut live: Live) {
        live.arrived.clear();
        lock(&self.idle).push(live);
    }

    /// Takes an endpoint that may still have operations in flight out of use.
    pub(crate) fn quarantine(&self, live: Live) {
        if !self.domain.info().manual_data_progress() {
            // The provider may still write into the caller's memory on its
            // own: closing the endpoint is what stops it.
            close_abandoning(live);
            return;
        }
        let oldest = {
            let mut q = lock(&self.quarantined);
            q.push(live);
            (q.len() > MAX_QUARANTINED).then(|| q.remove(0))
        };
        if let Some(old) = oldest {
            close_abandoning(old);
        }
    }
}

impl Drop for EndpointPool {
    fn drop(&mut self) {
        // No locking: a forked child may inherit these locks held.
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|p| p.into_inner()));
        let quarantined = std::mem::take(
            self.quarantined
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if !self.domain.usable_here() {
            // Inherited across fork(): never call into the parent's objects.
            std::mem::forget(idle);
            std::mem::forget(quarantined);
            return;
        }
        drop(idle);
        quarantined.into_iter().for_each(close_abandoning);
    }
}

/// A poisoned lock holds a plain Vec: still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Cancels what is in flight on `live` and closes its endpoint; buffers the
/// provider may still reference (contexts, bounce, requests) are leaked.
fn close_abandoning(live: Live) {
    for (slot, state) in live.slots.iter().enumerate() {
        if state.is_some() {
            // SAFETY: the slot holds an operation posted on this endpoint.
            unsafe { live.ep.cancel(live.contexts.ptr(slot)) };
        }
    }
    if live.trash_posted {
        // SAFETY: the trash receive is posted on this endpoint.
        unsafe { live.ep.cancel(live.contexts.ptr(live.slots.len())) };
    }
    let Live {
        landing,
        ep,
        contexts,
        bounce,
        requests,
        trash,
        ..
    } = live;
    drop(ep);
    // Reads may still land there; the last Arc<Endpoint> may be held by its bound MR.
    landing.abandon();
    contexts.abandon();
    // Receives and sends may still reference these (the endpoint may
    // outlive us in a bound MR): never free them under the provider.
    std::mem::forget(bounce);
    std::mem::forget(requests);
    std::mem::forget(trash);
}
