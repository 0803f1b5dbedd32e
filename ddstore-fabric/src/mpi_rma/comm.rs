//! `MpiComm`: a private duplicate of an MPI communicator (ours or mpi4py's)
//! implementing `ddstore_core::comm::Comm`.

use ddstore_core::fork::CreatedBy;
use std::any::Any;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_core::comm::Comm;
use mpi::ffi;

use super::init::{check, ensure_initialized_at, is_usable, serialize};
use crate::error::{report_failed_close, FabricError, FabricResult};

/// An MPI communicator this process owns: freed on drop while MPI is usable.
pub struct MpiComm {
    handle: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// The process that created the handle; a forked child must not free it.
    pid: CreatedBy,
    /// Freed already (by `close`).
    freed: bool,
    /// A bounded barrier gave up: messages may still be in flight, so later
    /// collectives refuse instead of matching stale ones.
    broken: AtomicBool,
    /// Bound of `allgather` and `barrier` (`DDSTORE_HANDSHAKE_TIMEOUT_S`): each
    /// first meets the others in a bounded barrier, so a rank that never comes
    /// is named instead of waited for.
    timeout: Duration,
}

/// Tag of the bounded barrier's messages (this communicator is our private dup).
const BARRIER_TAG: c_int = 0x0dd5;
/// How much longer than rank 0 the other ranks wait, so rank 0's verdict
/// (which ranks did not arrive) reaches them before they give up.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// One nonblocking request and the buffer it uses; a request still pending
/// when its owner gives up is cancelled and the buffer leaked (MPI may still
/// write it).
struct Pending {
    req: ffi::MPI_Request,
    buf: Box<[u8]>,
    done: bool,
}

impl Pending {
    /// Posts a receive of `len` bytes from `peer`, or a send of `data` to it.
    fn post(
        comm: ffi::MPI_Comm,
        peer: usize,
        recv_len: Option<usize>,
        data: &[u8],
    ) -> FabricResult<Pending> {
        let mut p = Pending {
            // SAFETY: reading a link-time constant exported by the MPI shim.
            req: unsafe { ffi::RSMPI_REQUEST_NULL },
            buf: match recv_len {
                Some(n) => vec![0u8; n.max(1)].into_boxed_slice(),
                None => data.to_vec().into_boxed_slice(),
            },
            done: false,
        };
        let _g = serialize();
        // SAFETY: `p.buf` lives in a Box that is kept (or leaked) until the
        // request completes or is cancelled; the handle is valid.
        let rc = unsafe {
            match recv_len {
                Some(n) => ffi::MPI_Irecv(
                    p.buf.as_mut_ptr() as *mut c_void,
                    n as c_int,
                    ffi::RSMPI_UINT8_T,
                    peer as c_int,
                    BARRIER_TAG,
                    comm,
                    &mut p.req,
                ),
                None => ffi::MPI_Isend(
                    p.buf.as_ptr() as *const c_void,
                    p.buf.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    peer as c_int,
                    BARRIER_TAG,
                    comm,
                    &mut p.req,
                ),
            }
        };
        check(
            if recv_len.is_some() {
                "MPI_Irecv"
            } else {
                "MPI_Isend"
            },
            rc,
        )?;
        Ok(p)
    }

    fn test(&mut self) -> FabricResult<bool> {
        if !self.done {
            let mut flag: c_int = 0;
            let _g = serialize();
            // SAFETY: `req` is a request we posted and have not completed.
            let rc = unsafe { ffi::MPI_Test(&mut self.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            check("MPI_Test", rc)?;
            self.done = flag != 0;
        }
        Ok(self.done)
    }

    /// Gives up on a request: cancelled and freed, its buffer leaked.
    fn abandon(self) {
        if self.done {
            return;
        }
        let mut req = self.req;
        let _g = serialize();
        // SAFETY: a pending request of ours; after MPI_Request_free MPI may
        // still use the buffer, which is therefore leaked, never freed.
        unsafe {
            ffi::MPI_Cancel(&mut req);
            ffi::MPI_Request_free(&mut req);
        }
        std::mem::forget(self.buf);
    }
}

/// Polls `pending` until all complete or `deadline` passes; false on timeout.
/// Spins (yielding) for the first moments, as a barrier usually completes in
/// microseconds, then sleeps with backoff so a long wait costs no CPU.
fn poll_all(pending: &mut [Pending], deadline: Instant) -> FabricResult<bool> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        let mut all = true;
        for p in pending.iter_mut() {
            all &= p.test()?;
        }
        if all {
            return Ok(true);
        }
        crate::error::check_interrupt()?;
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        if now - start < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

// SAFETY: an MPI_Comm is an opaque handle to MPI-internal state. Every call
// we make on it goes through `serialize()`, which holds the process-wide lock
// unless MPI provides MPI_THREAD_MULTIPLE, so moving or sharing the handle
// across threads never breaks MPI's threading contract.
unsafe impl Send for MpiComm {}
// SAFETY: see Send; `&MpiComm` only exposes calls that go through `serialize()`.
unsafe impl Sync for MpiComm {}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiComm(rank {} of {})", self.rank, self.size)
    }
}

/// How long a collective waits for peers unless the caller says
/// ([`MpiComm::with_timeout`]): `DDSTORE_HANDSHAKE_TIMEOUT_S`'s default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl MpiComm {
    /// Duplicates the communicator mpi4py hands over as `comm.py2f()`, so our
    /// traffic never mixes with the user's. Collective over that communicator.
    pub fn from_fortran(handle: i64) -> FabricResult<MpiComm> {
        if !is_usable() {
            return Err(FabricError::Unavailable(
                "an MPI communicator handle was given but MPI is not initialised in this process"
                    .into(),
            ));
        }
        let fint = c_int::try_from(handle).map_err(|_| {
            FabricError::Invalid(format!("{handle} is not a Fortran MPI communicator handle"))
        })?;
        let comm = {
            let _g = serialize();
            // SAFETY: MPI is initialised; f2c returns MPI_COMM_NULL for unknown handles.
            unsafe { ffi::MPI_Comm_f2c(fint) }
        };
        // SAFETY: reading a link-time constant exported by the MPI shim.
        if comm == unsafe { ffi::RSMPI_COMM_NULL } {
            return Err(FabricError::Invalid(format!(
                "Fortran handle {handle} is MPI_COMM_NULL or not a communicator"
            )));
        }
        Self::dup_of(comm)
    }

    /// A duplicate of `MPI_COMM_WORLD`, initialising MPI first if nobody did.
    pub fn world() -> FabricResult<MpiComm> {
        Self::world_at(None)
    }

    /// As [`MpiComm::world`], asking for thread `level` if this call initialises
    /// MPI (see [`super::ensure_initialized_at`]).
    pub fn world_at(level: Option<&str>) -> FabricResult<MpiComm> {
        ensure_initialized_at(level)?;
        // SAFETY: reading a link-time constant exported by the MPI shim.
        Self::dup_of(unsafe { ffi::RSMPI_COMM_WORLD })
    }

    fn dup_of(comm: ffi::MPI_Comm) -> FabricResult<MpiComm> {
        let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: `comm` is a valid communicator; MPI writes the new handle.
            unsafe { ffi::MPI_Comm_dup(comm, dup.as_mut_ptr()) }
        };
        check("MPI_Comm_dup", rc)?;
        // SAFETY: MPI_Comm_dup succeeded, so it wrote the handle.
        Self::adopt(unsafe { dup.assume_init() })
    }

    /// Takes ownership of a fresh communicator: sets MPI_ERRORS_RETURN and
    /// caches rank and size. Frees it again on error.
    fn adopt(handle: ffi::MPI_Comm) -> FabricResult<MpiComm> {
        let mut comm = MpiComm {
            handle,
            rank: 0,
            size: 1,
            pid: CreatedBy::this_process(),
            freed: false,
            broken: AtomicBool::new(false),
            timeout: DEFAULT_TIMEOUT,
        };
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        let _g = serialize();
        // SAFETY: `handle` is a valid communicator we own; the out-pointers are valid.
        unsafe {
            check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(handle, ffi::RSMPI_ERRORS_RETURN),
            )?;
            check("MPI_Comm_rank", ffi::MPI_Comm_rank(handle, &mut rank))?;
            check("MPI_Comm_size", ffi::MPI_Comm_size(handle, &mut size))?;
        }
        comm.rank = rank as usize;
        comm.size = size as usize;
        Ok(comm)
    }

    /// The ranks of this communicator that share memory with this one
    /// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`), in this communicator's order.
    /// Collective.
    pub fn split_node(&self) -> FabricResult<MpiComm> {
        let mut node = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: our handle is valid; MPI writes the new handle.
            unsafe {
                ffi::MPI_Comm_split_type(
                    self.handle,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    self.rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    node.as_mut_ptr(),
                )
            }
        };
        check("MPI_Comm_split_type", rc)?;
        // SAFETY: the split succeeded and every rank has a color, so the handle is set.
        Self::adopt(unsafe { node.assume_init() }).map(|c| c.with_timeout(self.timeout))
    }

    /// Splits by small non-negative color and key (both already dense). Collective.
    pub(crate) fn split_raw(&self, color: c_int, key: c_int) -> FabricResult<MpiComm> {
        let mut out = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: our handle is valid; MPI writes the new handle.
            unsafe { ffi::MPI_Comm_split(self.handle, color, key, out.as_mut_ptr()) }
        };
        check("MPI_Comm_split", rc)?;
        // SAFETY: the split succeeded with a defined color, so the handle is set.
        Self::adopt(unsafe { out.assume_init() }).map(|c| c.with_timeout(self.timeout))
    }

    /// This communicator with its barriers and allgathers bounded by `timeout`
    /// (the store's `DDSTORE_HANDSHAKE_TIMEOUT_S`; default 300 s).
    pub fn with_timeout(mut self, timeout: Duration) -> MpiComm {
        self.timeout = timeout;
        self
    }

    /// The raw handle, for windows created over this communicator. It stays
    /// valid as long as `self` lives.
    pub fn as_raw(&self) -> ffi::MPI_Comm {
        self.handle
    }

    /// Every rank's value of a u64, in rank order (plain MPI_Allgather).
    fn allgather_u64(&self, value: u64) -> FabricResult<Vec<u64>> {
        let mut all = vec![0u64; self.size];
        let _g = serialize();
        // SAFETY: one u64 sent, `size` u64 received into a buffer of that size.
        let rc = unsafe {
            ffi::MPI_Allgather(
                &value as *const u64 as *const c_void,
                1,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr() as *mut c_void,
                1,
                ffi::RSMPI_UINT64_T,
                self.handle,
            )
        };
        check("MPI_Allgather", rc)?;
        Ok(all)
    }

    fn allgather_bytes(&self, mine: &[u8]) -> FabricResult<Vec<Vec<u8>>> {
        let lens = self.allgather_u64(mine.len() as u64)?;
        // Every rank sees the same lengths, so every rank takes the same branch.
        let total: u64 = lens.iter().sum();
        if total > c_int::MAX as u64 {
            return Err(FabricError::Invalid(format!(
                "allgather of {total} bytes in all exceeds MPI's count limit of {} bytes",
                c_int::MAX
            )));
        }
        let counts: Vec<c_int> = lens.iter().map(|&l| l as c_int).collect();
        let mut displs = Vec::with_capacity(counts.len());
        let mut at: c_int = 0;
        for &c in &counts {
            displs.push(at);
            at += c;
        }
        // One spare byte keeps the pointers valid when every record is empty.
        let mut recv = vec![0u8; total as usize + 1];
        let rc = {
            let _g = serialize();
            // SAFETY: `mine` holds counts[rank] bytes; `recv` holds `total` bytes
            // laid out by `displs`; all buffers outlive the blocking call.
            unsafe {
                ffi::MPI_Allgatherv(
                    mine.as_ptr() as *const c_void,
                    mine.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    recv.as_mut_ptr() as *mut c_void,
                    counts.as_ptr(),
                    displs.as_ptr(),
                    ffi::RSMPI_UINT8_T,
                    self.handle,
                )
            }
        };
        check("MPI_Allgatherv", rc)?;
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| recv[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn check_usable(&self) -> FabricResult<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(FabricError::Invalid(
                "this communicator gave up on a barrier (a rank did not arrive in time, or a \
                 signal such as Ctrl-C interrupted it); its collectives can no longer be used"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Leaves a barrier that failed (`why`: an MPI error or a signal): its
    /// requests are abandoned and later collectives refused (the ranks no
    /// longer agree on which collective comes next).
    fn give_up(
        &self,
        pending: impl IntoIterator<Item = Pending>,
        why: FabricError,
    ) -> ddstore_core::Error {
        self.broken.store(true, Ordering::Release);
        pending.into_iter().for_each(Pending::abandon);
        why.into()
    }

    /// A barrier bounded by `timeout`: every rank reports to rank 0, which
    /// releases them with the list of ranks that did not arrive; every rank
    /// that waited raises `Error::Timeout` naming them.
    pub fn barrier_within(&self, timeout: Duration) -> ddstore_core::Result<()> {
        self.check_usable()?;
        let start = Instant::now();
        let absent = |missing: Vec<usize>, what: &str| ddstore_core::Error::Timeout {
            peer: missing.first().copied().unwrap_or(0),
            waited: timeout,
            what: format!(
                "MPI ranks {missing:?} {what} (stopped or dead; DDSTORE_TIMEOUT_S sets the wait)"
            ),
        };
        if self.size == 1 {
            return Ok(());
        }
        if self.rank == 0 {
            let mut arrivals = (1..self.size)
                .map(|peer| Pending::post(self.handle, peer, Some(1), &[]))
                .collect::<FabricResult<Vec<_>>>()?;
            let all = match poll_all(&mut arrivals, start + timeout) {
                Ok(all) => all,
                Err(e) => return Err(self.give_up(arrivals, e)),
            };
            let missing: Vec<usize> = arrivals
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.done)
                .map(|(i, _)| i + 1)
                .collect();
            let mut verdict = vec![0u8; self.size];
            for &m in &missing {
                verdict[m] = 1;
            }
            let mut sends = (1..self.size)
                .filter(|p| !missing.contains(p))
                .map(|peer| Pending::post(self.handle, peer, None, &verdict))
                .collect::<FabricResult<Vec<_>>>()?;
            let sent = match poll_all(&mut sends, Instant::now() + RELEASE_GRACE) {
                Ok(sent) => sent,
                Err(e) => return Err(self.give_up(arrivals.into_iter().chain(sends), e)),
            };
            if all && sent {
                return Ok(());
            }
            self.broken.store(true, Ordering::Release);
            arrivals.into_iter().chain(sends).for_each(Pending::abandon);
            return Err(absent(missing, "did not arrive at the barrier"));
        }
        let arrive = Pending::post(self.handle, 0, None, &[1])?;
        let release = Pending::post(self.handle, 0, Some(self.size), &[])?;
        let mut both = [arrive, release];
        let ok = match poll_all(&mut both, start + timeout + RELEASE_GRACE) {
            Ok(ok) => ok,
            Err(e) => return Err(self.give_up(both, e)),
        };
        let [arrive, release] = both;
        if !ok {
            self.broken.store(true, Ordering::Release);
            arrive.abandon();
            release.abandon();
            return Err(absent(vec![0], "did not release the barrier"));
        }
        let missing: Vec<usize> = (0..self.size).filter(|&r| release.buf[r] != 0).collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.broken.store(true, Ordering::Release);
        Err(absent(
            missing,
            "did not arrive at the barrier (as rank 0 saw)",
        ))
    }
}

impl MpiComm {
    /// Frees the communicator now (`MPI_Comm_free`), reporting MPI's answer.
    /// Dropping it frees it too, but can only log a failure.
    pub fn close(mut self) -> FabricResult<()> {
        self.free_now()
    }

    /// Frees the handle once (a forked child or a finalised MPI leaves it alone).
    fn free_now(&mut self) -> FabricResult<()> {
        if std::mem::replace(&mut self.freed, true) || !self.pid.is_this_process() || !is_usable() {
            return Ok(());
        }
        let _g = serialize();
        // SAFETY: we own the handle (a dup or split result) and MPI is usable;
        // freed once (the flag above).
        check("MPI_Comm_free", unsafe {
            ffi::MPI_Comm_free(&mut self.handle)
        })
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        report_failed_close("MPI communicator", self.free_now());
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn allgather(&self, mine: &[u8]) -> ddstore_core::Result<Vec<Vec<u8>>> {
        // Everyone is known to be there once the bounded barrier passes, so
        // the blocking MPI_Allgatherv that follows cannot wait for an absent rank.
        self.barrier_within(self.timeout)?;
        Ok(self.allgather_bytes(mine)?)
    }
    fn barrier(&self) -> ddstore_core::Result<()> {
        self.barrier_within(self.timeout)
    }
    fn barrier_timeout(&self, timeout: Duration) -> ddstore_core::Result<()> {
        self.barrier_within(timeout)
    }
    /// Colors and keys may be any usize: one allgather turns them into the
    /// dense values MPI_Comm_split accepts, with the same grouping and order.
    fn split(&self, color: usize, key: usize) -> ddstore_core::Result<Arc<dyn Comm>> {
        let pairs: Vec<(u64, u64, usize)> = ddstore_core::comm::gather_split(self, color, key)?
            .into_iter()
            .enumerate()
            .map(|(rank, (c, k))| (c, k, rank))
            .collect();
        let mut colors: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        colors.sort_unstable();
        colors.dedup();
        let dense_color = colors
            .binary_search(&(color as u64))
            .expect("own color gathered");
        let mut order: Vec<(u64, usize)> = pairs.iter().map(|p| (p.1, p.2)).collect();
        order.sort_unstable();
        let dense_key = order
            .binary_search(&(key as u64, self.rank))
            .expect("own key gathered");
        Ok(Arc::new(
            self.split_raw(dense_color as c_int, dense_key as c_int)?,
        ))
    }
    fn kind(&self) -> ddstore_core::kinds::CommKind {
        ddstore_core::kinds::CommKind::Mpi
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
