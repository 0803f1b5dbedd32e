//! `MpiComm`: a private duplicate of an MPI communicator (ours or mpi4py's)
//! implementing `ddstore_core::comm::Comm`.

use ddstore_core::fork::CreatedBy;
use std::any::Any;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// A bounded collective gave up: it may still be in flight, so later
    /// collectives refuse instead of matching stale ones.
    broken: AtomicBool,
    /// Bounded collectives started so far: numbers the tags that name the
    /// absent ranks of one (every rank makes the same sequence of calls).
    collectives: AtomicU64,
    /// Bound of `allgather` and `barrier` (`DDSTORE_HANDSHAKE_TIMEOUT_S`): a
    /// rank that never comes is named instead of waited for.
    timeout: Duration,
}

/// Tags of the messages that name absent ranks once a collective timed out
/// (this communicator is our private dup, so nobody else's messages share
/// them): rank 0's probe, a rank's answer "present", rank 0's verdict, and
/// the notice of a rank that gave up without hearing from rank 0. Each
/// collective has its own four (its number modulo `TAG_ROUNDS`; a probe also
/// carries the full number), so a late message of one never answers another.
const TAG_BASE: c_int = 1024;
/// Collectives before the tags repeat (MPI guarantees tags up to 32,767).
const TAG_ROUNDS: u64 = 7_000;
const PROBE: c_int = 0;
const PRESENT: c_int = 1;
const VERDICT: c_int = 2;
const GAVE_UP: c_int = 3;
/// First byte of a verdict: the collective completed / rank 0 gave up on it.
const COMPLETED: u8 = 0;
const GIVEN_UP: u8 = 1;
/// How much longer than rank 0 the other ranks wait, so rank 0's probe and
/// verdict (which ranks did not arrive) reach them before they give up.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

fn tag(seq: u64, which: c_int) -> c_int {
    TAG_BASE + 4 * (seq % TAG_ROUNDS) as c_int + which
}

/// Sends `data` to `peer` and lets the send go on without us (`MPI_Isend`,
/// then `MPI_Request_free`: the message is still delivered). The buffer is
/// leaked, as MPI may read it later: only the few messages of a collective
/// that timed out go this way.
fn send_and_forget(comm: ffi::MPI_Comm, peer: usize, tag: c_int, data: &[u8]) -> FabricResult<()> {
    let buf: &'static mut [u8] = Box::leak(data.to_vec().into_boxed_slice());
    // SAFETY: reading a link-time constant exported by the MPI shim.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    let _g = serialize();
    // SAFETY: `buf` is leaked, so it outlives the send; the handle is valid.
    let rc = unsafe {
        ffi::MPI_Isend(
            buf.as_ptr() as *const c_void,
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            peer as c_int,
            tag,
            comm,
            &mut req,
        )
    };
    check("MPI_Isend", rc)?;
    // SAFETY: a request we just posted; freeing it leaves the send to complete.
    check("MPI_Request_free", unsafe {
        ffi::MPI_Request_free(&mut req)
    })
}

/// Whether `req` completed (MPI_Test; a completed request becomes null).
fn test_request(req: &mut ffi::MPI_Request) -> FabricResult<bool> {
    let mut flag: c_int = 0;
    let _g = serialize();
    // SAFETY: `req` is a request we posted and have not completed.
    let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    check("MPI_Test", rc)?;
    Ok(flag != 0)
}

/// The message `peer` sent with `tag`, of at most `len` bytes, if one has
/// arrived (MPI_Iprobe, then the receive of what it found), else None.
fn take_message(
    comm: ffi::MPI_Comm,
    peer: usize,
    tag: c_int,
    len: usize,
) -> FabricResult<Option<Vec<u8>>> {
    take_from(comm, peer as c_int, tag, len)
}

/// As [`take_message`], from `source` (a rank or `MPI_ANY_SOURCE`).
fn take_from(
    comm: ffi::MPI_Comm,
    source: c_int,
    tag: c_int,
    len: usize,
) -> FabricResult<Option<Vec<u8>>> {
    let peer = source;
    let mut flag: c_int = 0;
    let _g = serialize();
    // SAFETY: a valid communicator; MPI writes the flag.
    let rc = unsafe { ffi::MPI_Iprobe(peer, tag, comm, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    check("MPI_Iprobe", rc)?;
    if flag == 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; len.max(1)];
    // SAFETY: the probed message is there, so this receive completes at once;
    // `buf` holds `len` bytes (a longer message is MPI's truncation error).
    let rc = unsafe {
        ffi::MPI_Recv(
            buf.as_mut_ptr() as *mut c_void,
            len as c_int,
            ffi::RSMPI_UINT8_T,
            peer,
            tag,
            comm,
            ffi::RSMPI_STATUS_IGNORE,
        )
    };
    check("MPI_Recv", rc)?;
    buf.truncate(len);
    Ok(Some(buf))
}

/// Calls `done` until it says true (then true) or `deadline` passes (false).
/// Spins (yielding) for the first moments, as a collective usually completes
/// in microseconds, then sleeps with backoff so a long wait costs no CPU;
/// a signal (Ctrl-C) ends the wait with `FabricError::Interrupted`.
fn poll_until(
    deadline: Instant,
    mut done: impl FnMut() -> FabricResult<bool>,
) -> FabricResult<bool> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        if done()? {
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

/// How a bounded wait for a nonblocking collective ended without completing.
enum Unfinished {
    /// These ranks did not arrive (rank 0's verdict), or rank 0 never
    /// probed (`[0]`: it did not arrive or did not release the others).
    Absent(Vec<usize>, &'static str),
    /// MPI failed or a signal interrupted the wait.
    Failed(FabricError),
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
            collectives: AtomicU64::new(0),
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

    /// Every rank's bytes, in rank order: the lengths (`MPI_Iallgather`), then
    /// the records (`MPI_Iallgatherv`), each polled against the deadline
    /// ([`MpiComm::wait_collective`]).
    fn allgather_within(
        &self,
        mine: &[u8],
        timeout: Duration,
    ) -> ddstore_core::Result<Vec<Vec<u8>>> {
        self.check_usable()?;
        // Buffers MPI reads or writes until the collective completes: kept in
        // boxes that are leaked if the wait gives up.
        let (len, mut lens) = (
            Box::new(mine.len() as u64),
            vec![0u64; self.size].into_boxed_slice(),
        );
        // SAFETY: reading a link-time constant exported by the MPI shim.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = {
            let _g = serialize();
            // SAFETY: one u64 sent, `size` u64 received into `lens`; both
            // boxes live until the request completes or are leaked.
            unsafe {
                ffi::MPI_Iallgather(
                    &*len as *const u64 as *const c_void,
                    1,
                    ffi::RSMPI_UINT64_T,
                    lens.as_mut_ptr() as *mut c_void,
                    1,
                    ffi::RSMPI_UINT64_T,
                    self.handle,
                    &mut req,
                )
            }
        };
        check("MPI_Iallgather", rc)?;
        let (_, lens) = self.finish(&mut req, "allgather", timeout, (len, lens))?;
        // Every rank sees the same lengths, so every rank takes the same branch.
        let total: u64 = lens.iter().sum();
        if total > c_int::MAX as u64 {
            return Err(FabricError::Invalid(format!(
                "allgather of {total} bytes in all exceeds MPI's count limit of {} bytes",
                c_int::MAX
            ))
            .into());
        }
        let counts: Box<[c_int]> = lens.iter().map(|&l| l as c_int).collect();
        let mut displs = Vec::with_capacity(counts.len());
        let mut at: c_int = 0;
        for &c in counts.iter() {
            displs.push(at);
            at += c;
        }
        let displs = displs.into_boxed_slice();
        let send: Box<[u8]> = mine.into();
        // One spare byte keeps the pointers valid when every record is empty.
        let mut recv = vec![0u8; total as usize + 1].into_boxed_slice();
        let rc = {
            let _g = serialize();
            // SAFETY: `send` holds counts[rank] bytes; `recv` holds `total`
            // bytes laid out by `displs`; all four boxes live until the
            // request completes or are leaked.
            unsafe {
                ffi::MPI_Iallgatherv(
                    send.as_ptr() as *const c_void,
                    send.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    recv.as_mut_ptr() as *mut c_void,
                    counts.as_ptr(),
                    displs.as_ptr(),
                    ffi::RSMPI_UINT8_T,
                    self.handle,
                    &mut req,
                )
            }
        };
        check("MPI_Iallgatherv", rc)?;
        let (_, recv, counts, displs) =
            self.finish(&mut req, "allgather", timeout, (send, recv, counts, displs))?;
        Ok(counts
            .iter()
            .zip(displs.iter())
            .map(|(&c, &d)| recv[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn check_usable(&self) -> FabricResult<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(FabricError::Invalid(
                "this communicator gave up on a collective (a rank did not arrive in time, or a \
                 signal such as Ctrl-C interrupted it); its collectives can no longer be used"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A barrier bounded by `timeout` (`MPI_Ibarrier` polled): every rank
    /// that waited in vain raises `Error::Timeout` naming the ranks that did
    /// not arrive.
    pub fn barrier_within(&self, timeout: Duration) -> ddstore_core::Result<()> {
        self.check_usable()?;
        if self.size == 1 {
            return Ok(());
        }
        // SAFETY: reading a link-time constant exported by the MPI shim.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = {
            let _g = serialize();
            // SAFETY: a valid communicator; MPI writes the request.
            unsafe { ffi::MPI_Ibarrier(self.handle, &mut req) }
        };
        check("MPI_Ibarrier", rc)?;
        self.finish(&mut req, "barrier", timeout, ())
    }

    /// Waits for the nonblocking collective `req` (see `wait_collective`) and
    /// hands back `buffers`, the memory it uses. When the wait gives up, the
    /// request and `buffers` are leaked (MPI may still use them) and later
    /// collectives are refused (the ranks no longer agree on which comes next).
    fn finish<B>(
        &self,
        req: &mut ffi::MPI_Request,
        what: &str,
        timeout: Duration,
        buffers: B,
    ) -> ddstore_core::Result<B> {
        let seq = self.collectives.fetch_add(1, Ordering::Relaxed);
        let unfinished = match self.wait_collective(req, seq, timeout) {
            Ok(()) => return Ok(buffers),
            Err(unfinished) => unfinished,
        };
        self.broken.store(true, Ordering::Release);
        std::mem::forget(buffers);
        Err(match unfinished {
            Unfinished::Failed(e) => e.into(),
            Unfinished::Absent(missing, how) if missing.is_empty() => {
                ddstore_core::Error::Timeout {
                    peer: 0,
                    waited: timeout,
                    what: format!(
                        "every MPI rank arrived at the {what} but it did not complete in time \
                     (DDSTORE_TIMEOUT_S sets the wait; {how})"
                    ),
                }
            }
            Unfinished::Absent(missing, how) => ddstore_core::Error::Timeout {
                peer: missing[0],
                waited: timeout,
                what: format!(
                    "MPI ranks {missing:?} {how} the {what} (stopped or dead; DDSTORE_TIMEOUT_S \
                     sets the wait)"
                ),
            },
        })
    }

    /// Polls the nonblocking collective `req` (this communicator's collective
    /// number `seq`) until it completes or `timeout` passes. Nothing but the
    /// collective itself is sent while it completes in time. When it does
    /// not, rank 0 decides: it probes every other rank, the ranks waiting
    /// answer "present", and rank 0 sends every rank its verdict (completed
    /// after all, or the ranks that did not arrive). A rank that arrives after
    /// the others gave up finds the probe, or (rank 0) another rank's notice,
    /// and fails too instead of going on alone. Every wait is bounded and a
    /// signal ends it.
    fn wait_collective(
        &self,
        req: &mut ffi::MPI_Request,
        seq: u64,
        timeout: Duration,
    ) -> Result<(), Unfinished> {
        let start = Instant::now();
        let h = self.handle;
        let failed = Unfinished::Failed;
        if self.rank == 0 {
            if poll_until(start + timeout, || test_request(req)).map_err(failed)? {
                // SAFETY: reading a link-time constant exported by the MPI shim.
                let any = unsafe { ffi::RSMPI_ANY_SOURCE };
                return match take_from(h, any, tag(seq, GAVE_UP), 0).map_err(failed)? {
                    None => Ok(()),
                    Some(_) => Err(Unfinished::Absent(
                        vec![0],
                        "came after the others gave up on",
                    )),
                };
            }
            return self.name_the_absent(req, seq);
        }
        let probe = |h| -> FabricResult<bool> {
            Ok(take_message(h, 0, tag(seq, PROBE), 8)?.is_some_and(|p| p == seq.to_le_bytes()))
        };
        let mut probed = false;
        let mut completed = false;
        poll_until(start + timeout + RELEASE_GRACE, || {
            completed = test_request(req)?;
            probed = probe(h)?;
            Ok(completed || probed)
        })
        .map_err(failed)?;
        if !probed {
            if completed {
                return Ok(());
            }
            // Rank 0 never asked: tell it, should it come later, and name it.
            let _ = send_and_forget(h, 0, tag(seq, GAVE_UP), &[]);
            return Err(Unfinished::Absent(
                vec![0],
                "did not release the others from",
            ));
        }
        send_and_forget(h, 0, tag(seq, PRESENT), &[1]).map_err(failed)?;
        let mut verdict = None;
        poll_until(Instant::now() + 3 * RELEASE_GRACE, || {
            // A verdict of another collective (tags repeat) is dropped.
            verdict = take_message(h, 0, tag(seq, VERDICT), self.size + 9)?
                .filter(|v| v[1..9] == seq.to_le_bytes());
            Ok(verdict.is_some())
        })
        .map_err(failed)?;
        match verdict {
            Some(v) if v[0] == COMPLETED => {
                // Everyone came: this rank's part completes too (its buffers are then filled).
                let done = completed
                    || poll_until(Instant::now() + RELEASE_GRACE, || test_request(req))
                        .map_err(failed)?;
                match done {
                    true => Ok(()),
                    false => Err(Unfinished::Absent(Vec::new(), "rank 0 saw everyone at")),
                }
            }
            Some(v) => Err(Unfinished::Absent(
                (0..self.size).filter(|&r| v[r + 9] != 0).collect(),
                "did not arrive (as rank 0 saw) at",
            )),
            None => Err(Unfinished::Absent(
                vec![0],
                "did not release the others from",
            )),
        }
    }

    /// Rank 0's side once `req` timed out: probes every other rank, collects
    /// the answers of those waiting (while the collective may still complete:
    /// everyone came after all), and sends every rank the verdict: a status
    /// byte, the collective's number, then a byte per rank (1: absent).
    fn name_the_absent(&self, req: &mut ffi::MPI_Request, seq: u64) -> Result<(), Unfinished> {
        let h = self.handle;
        let failed = Unfinished::Failed;
        for peer in 1..self.size {
            send_and_forget(h, peer, tag(seq, PROBE), &seq.to_le_bytes()).map_err(failed)?;
        }
        let mut present = vec![false; self.size];
        present[0] = true;
        let mut completed = false;
        poll_until(Instant::now() + RELEASE_GRACE, || {
            completed = test_request(req)?;
            for (peer, here) in present.iter_mut().enumerate().skip(1) {
                if !*here && take_message(h, peer, tag(seq, PRESENT), 1)?.is_some() {
                    *here = true;
                }
            }
            Ok(completed || present.iter().all(|&p| p))
        })
        .map_err(failed)?;
        if !completed && present.iter().all(|&p| p) {
            // Everyone answered: they are all in this collective, give it the grace to end.
            completed =
                poll_until(Instant::now() + RELEASE_GRACE, || test_request(req)).map_err(failed)?;
        }
        let mut verdict = vec![if completed { COMPLETED } else { GIVEN_UP }];
        verdict.extend_from_slice(&seq.to_le_bytes());
        verdict.extend(present.iter().map(|&p| u8::from(!p && !completed)));
        for peer in 1..self.size {
            send_and_forget(h, peer, tag(seq, VERDICT), &verdict).map_err(failed)?;
        }
        if completed {
            return Ok(());
        }
        let missing = (0..self.size).filter(|&r| !present[r]).collect();
        Err(Unfinished::Absent(missing, "did not arrive at"))
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
        // A collective given up may still be in flight, and MPI would go on
        // progressing it on a freed communicator (Open MPI's libnbc crashes in
        // MPI_Finalize): such a communicator is left to MPI_Finalize.
        if self.broken.load(Ordering::Acquire) {
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
        self.allgather_within(mine, self.timeout)
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
