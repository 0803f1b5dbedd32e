//! Target-side progress for providers with manual data progress
//! (tcp;ofi_rxm, shm, sockets, udp;ofi_rxd): reads of a share only advance
//! while its owner calls into libfabric, so a thread does that for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::cq::Cq;
use super::endpoint::Endpoint;
use super::error::OpenedBy;
use super::gather::server::{self, Server};
use crate::error::{FabricError, FabricResult};

/// How long one blocking wait lasts before the stop flag is checked again.
const WAIT_MS: i32 = 100;
/// Polling interval bounds when the CQ has no wait object.
const MIN_SLEEP: Duration = Duration::from_micros(5);
const MAX_SLEEP: Duration = Duration::from_micros(200);
/// A poll this long did real work (served a transfer); shorter ones are
/// indistinguishable from scheduling noise.
const BUSY_POLL: Duration = Duration::from_micros(20);
/// How long to keep polling without sleeping after a poll that did work.
const HOT: Duration = Duration::from_millis(2);

pub struct Progress {
    stop: Arc<AtomicBool>,
    cq: Arc<Cq>,
    handle: Option<JoinHandle<()>>,
    opened_by: OpenedBy,
}

impl Progress {
    /// Starts polling `endpoint`'s CQ; the thread keeps the endpoint open.
    /// With `server`, the thread also answers gather requests (`gather/server/`).
    pub fn start(endpoint: Arc<Endpoint>, server: Option<Server>) -> FabricResult<Progress> {
        let stop = Arc::new(AtomicBool::new(false));
        let cq = endpoint.cq().clone();
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("ddstore-ofi-progress".into())
            .spawn(move || match server {
                Some(server) => server::run(server, &flag),
                None => run(&endpoint, &flag),
            })
            .map_err(|e| FabricError::Unavailable(format!("cannot start progress thread: {e}")))?;
        Ok(Progress {
            stop,
            cq,
            handle: Some(handle),
            opened_by: OpenedBy::this_process(),
        })
    }
}

fn run(endpoint: &Endpoint, stop: &AtomicBool) {
    let cq = endpoint.cq();
    let mut entries = [sys::fi_cq_entry::default(); 16];
    let mut blocking = cq.has_wait();
    let mut sleep = MIN_SLEEP;
    // Running average of how long a poll takes when there is nothing to do.
    let mut idle_poll = Duration::from_micros(1);
    let mut hot_until = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if blocking {
            // Sleeps in the provider's wait set (sockets, eventfds) and
            // progresses whenever a peer's request arrives.
            let waited = cq.wait_read(&mut entries, WAIT_MS);
            match waited {
                Ok(_) => {}
                Err(FabricError::Ofi { code, .. }) if code == -(sys::FI_ENOSYS as i64) => {
                    blocking = false
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        } else {
            // Reads of our share leave no completion here, but serving one
            // makes the poll take longer than an idle poll: stay hot while
            // that happens, back off to MAX_SLEEP between polls otherwise.
            let start = Instant::now();
            let _ = cq.poll(&mut entries);
            let took = start.elapsed();
            if took > (idle_poll * 8).max(BUSY_POLL) {
                hot_until = start + HOT;
                sleep = MIN_SLEEP;
            } else {
                idle_poll = (idle_poll * 7 + took) / 8;
            }
            if Instant::now() < hot_until {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(MAX_SLEEP);
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        if !self.opened_by.is_this_process() {
            // A forked child has no such thread: joining would wait forever.
            std::mem::forget(handle);
            return;
        }
        self.stop.store(true, Ordering::Release);
        self.cq.signal();
        let _ = handle.join();
    }
}
