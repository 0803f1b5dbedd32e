//! The read-ahead stage: spilled rows a reader will need soon, read ahead
//! of use (see `Store::prefetch`) into a bounded cache inside the budget, so
//! that the batch that needs them copies them from memory.
//!
//! A read ahead first reserves its rows ([`Stage::reserve`]: they are
//! *pending*), then fills them. A read that needs a pending row waits for
//! it instead of reading it a second time (the read-ahead and the loader's
//! workers never read the same row twice, and a row reserved is never
//! pushed out by later ones). A row leaves the stage when a read takes it
//! (an epoch reads each sample once); a staged row that no read took while
//! [`stale_after`] other spilled rows were read (an epoch ended or was left,
//! a sampler changed its order) is dropped when its room is needed.
//!
//! Updates ([`Stage::invalidate`]): a staged row whose owner updated it is
//! dropped, and a pending one is *doomed*: its read may have read the old
//! bytes, so its fill is thrown away and a read that needs it reads it
//! itself. `Store::write_local` invalidates the rows it wrote in this
//! process's stage at once, and `Store::barrier` every rank's updated rows
//! in every rank's stage (see `Store::barrier`).
//!
//! Buffers: a row's bytes are read straight into its buffer (a direct
//! read's aligned span, see [`Stage::buffer`]). A taken row keeps its room
//! until its bytes are copied out ([`Staged`] dropped); its buffer then goes
//! back to the stage's pool while the pool and the rows held fit in the
//! stage's capacity, so the next row reserved in that room is read into it:
//! a stage reused batch after batch reads into memory already faulted in,
//! with no new allocation, and holds no more than its capacity.
//!
//! Fork safety (see [`crate::fork`]): the stage belongs to the process that
//! made it. In a forked child it is empty and stages nothing, so the child
//! never takes its lock, which a thread of the parent (the read-ahead) may
//! have held at the fork.

use std::collections::{HashMap, VecDeque};
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::fork::CreatedBy;

/// Most bytes the byte rule of [`stage_bytes`] gives a stage (its row rule
/// may give more).
pub const STAGE_MAX: u64 = 64 << 20;

/// Longest a read waits for a pending row before reading it itself (a read
/// ahead normally fills its rows within milliseconds).
const PENDING_WAIT: Duration = Duration::from_secs(30);

/// The part of a spilling variable's budget its stage holds: room for
/// `min_rows` rows of `row_bytes` (`DDSTORE_STAGE_ROWS`: a loader's next
/// batches however large the rows), and at least an eighth of the budget up
/// to [`STAGE_MAX`] (many small rows); never more than half the budget, so
/// that the memory part keeps the rest.
pub fn stage_bytes(budget: u64, row_bytes: u64, min_rows: u64) -> u64 {
    let by_rows = min_rows.saturating_mul(row_bytes);
    (budget / 8).min(STAGE_MAX).max(by_rows).min(budget / 2)
}

/// Spilled rows read after a row was staged beyond which the row counts as
/// stale: four stages full of rows, and at least 256 (a loader's batches in
/// flight, past which the read-ahead stages, are read well within that:
/// `(num_workers * prefetch_factor + 4)` batches).
pub fn stale_after(cap_rows: usize) -> u64 {
    (4 * cap_rows as u64).max(256)
}

/// Staged rows of one variable, by global row.
pub struct Stage {
    cap: usize,
    /// Rows staged or pending now.
    held: AtomicUsize,
    /// Spilled rows read (taken or not) so far: the clock of staleness.
    reads: AtomicU64,
    /// Buffers allocated afresh by [`Stage::buffer`] (not from the pool).
    allocated: AtomicU64,
    created: CreatedBy,
    inner: Mutex<Inner>,
    filled: Condvar,
}

impl Default for Stage {
    fn default() -> Stage {
        Stage::new(0)
    }
}

enum Slot {
    /// Reserved by a read ahead that has not filled it yet.
    Pending,
    /// Its bytes (`storage[range]`), staged when the read clock was at
    /// `at`; `reuse`: `storage` came from [`Stage::buffer`] and goes back
    /// to the pool once taken.
    Ready {
        storage: Vec<u8>,
        range: Range<usize>,
        at: u64,
        reuse: bool,
    },
    /// Reserved, then updated by its owner before its read ahead filled it:
    /// the fill may hold the old bytes and is dropped.
    Doomed,
}

#[derive(Default)]
struct Inner {
    rows: HashMap<u64, (Slot, usize)>,
    /// Rows in the order they were reserved (taken ones are skipped).
    order: VecDeque<u64>,
    /// Bytes of staged and pending rows.
    bytes: usize,
    /// Buffers of taken rows, for the next fills, with the bytes of the
    /// row each held (what it counts against the capacity).
    pool: Vec<(Vec<u8>, usize)>,
    /// Row bytes of `pool`.
    pooled: usize,
}

impl Inner {
    /// Forgets the entries of taken rows in `order`: those at its front at
    /// once, the rest when they outnumber the rows held (a stage that never
    /// fills up never drops stale rows, and `order` would grow by a row per
    /// row staged for as long as the store lives).
    fn trim_order(&mut self) {
        while self
            .order
            .front()
            .is_some_and(|r| !self.rows.contains_key(r))
        {
            self.order.pop_front();
        }
        if self.order.len() > 2 * self.rows.len() + 1024 {
            let rows = &self.rows;
            self.order.retain(|r| rows.contains_key(r));
        }
    }

    fn remove(&mut self, row: u64) -> Option<Slot> {
        let (slot, len) = self.rows.remove(&row)?;
        self.bytes -= len;
        Some(slot)
    }
}

impl Stage {
    /// A stage of at most `cap` bytes (0: no read-ahead).
    pub fn new(cap: usize) -> Stage {
        Stage {
            cap,
            held: AtomicUsize::new(0),
            reads: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            created: CreatedBy::this_process(),
            inner: Mutex::default(),
            filled: Condvar::new(),
        }
    }

    /// Its capacity in bytes (0 in a forked child: it stages nothing there).
    pub fn capacity(&self) -> usize {
        if self.created.is_this_process() {
            self.cap
        } else {
            0
        }
    }

    /// Rows staged or pending now (0 in a forked child).
    pub fn len(&self) -> usize {
        if self.created.is_this_process() {
            self.held.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Whether no row is staged or pending (a read then skips the stage).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, s: &Inner) {
        self.held.store(s.rows.len(), Ordering::Relaxed);
    }

    /// Whether `row` is staged or pending.
    pub fn contains(&self, row: u64) -> bool {
        !self.is_empty() && self.lock().rows.contains_key(&row)
    }

    /// Reserves the first of `rows` (in their order; rows of `row_bytes`
    /// bytes) that are not staged or pending yet, while they fit beside the
    /// rows held; stale rows make room. Returns the rows reserved, which
    /// the caller fills ([`Stage::fill`]) or gives up ([`Stage::cancel`]).
    pub fn reserve(&self, rows: &[u64], row_bytes: usize) -> Vec<u64> {
        let sized: Vec<(u64, usize)> = rows.iter().map(|&r| (r, row_bytes)).collect();
        self.reserve_sized(&sized)
    }

    /// As [`Stage::reserve`] for rows of their own sizes, `(row, bytes)`
    /// (a ragged variable's rows); empty rows are skipped.
    pub fn reserve_sized(&self, rows: &[(u64, usize)]) -> Vec<u64> {
        let cap = self.capacity();
        let sized: u64 = rows.iter().map(|r| r.1 as u64).sum();
        if cap == 0 || sized == 0 {
            return Vec::new();
        }
        // Rows of the mean size the stage holds: the staleness clock's unit.
        let mean = (sized / rows.len() as u64).max(1) as usize;
        let now = self.reads.load(Ordering::Relaxed);
        let stale = stale_after(cap / mean);
        let mut s = self.lock();
        s.trim_order();
        let mut got = Vec::new();
        for &(row, row_bytes) in rows {
            if row_bytes == 0 || row_bytes > cap || s.rows.contains_key(&row) {
                continue;
            }
            while s.bytes + row_bytes > cap && self.drop_stale(&mut s, now, stale) {}
            if s.bytes + row_bytes > cap {
                break;
            }
            s.bytes += row_bytes;
            s.rows.insert(row, (Slot::Pending, row_bytes));
            s.order.push_back(row);
            got.push(row);
        }
        self.publish(&s);
        got
    }

    /// Drops the oldest row if it is stale (or already taken); whether one went.
    fn drop_stale(&self, s: &mut Inner, now: u64, stale: u64) -> bool {
        while let Some(&front) = s.order.front() {
            match s.rows.get(&front) {
                None => {
                    s.order.pop_front(); // taken: its entry goes now
                }
                Some((Slot::Ready { at, .. }, _)) if now.saturating_sub(*at) > stale => {
                    s.order.pop_front();
                    s.remove(front);
                    return true;
                }
                _ => return false,
            }
        }
        false
    }

    /// Fills the reserved `row` with its bytes (a row not reserved is
    /// ignored); they are freed once taken.
    pub fn fill(&self, row: u64, bytes: Vec<u8>) {
        let len = bytes.len();
        self.fill_with(row, bytes, 0..len, false);
    }

    /// Fills the reserved `row` with `storage[range]`, keeping `storage`
    /// (a buffer from [`Stage::buffer`] that a read landed in) as the
    /// row's buffer, back to the pool once taken.
    pub fn fill_in(&self, row: u64, storage: Vec<u8>, range: Range<usize>) {
        self.fill_with(row, storage, range, true);
    }

    fn fill_with(&self, row: u64, storage: Vec<u8>, range: Range<usize>, reuse: bool) {
        if !self.created.is_this_process() {
            return;
        }
        let at = self.reads.load(Ordering::Relaxed);
        let mut s = self.lock();
        let mut unused = Some(storage);
        let len = range.len();
        match s.rows.get_mut(&row) {
            Some((slot @ Slot::Pending, len)) if *len == range.len() => {
                let storage = unused.take().expect("not used yet");
                *slot = Slot::Ready {
                    storage,
                    range,
                    at,
                    reuse,
                };
            }
            Some((Slot::Doomed, _)) => {
                // Its owner updated it while it was read: the bytes may be old.
                s.remove(row);
                self.publish(&s);
            }
            _ => {}
        }
        if let (Some(storage), true) = (unused, reuse) {
            self.pool_or_free(&mut s, storage, len);
        }
        drop(s);
        self.filled.notify_all();
    }

    /// A buffer of at least `len` bytes for a row's read: one of the pool's
    /// (already faulted in) where one is long enough, else a new one. Its
    /// bytes are whatever a read left there.
    pub fn buffer(&self, len: usize) -> Vec<u8> {
        if self.created.is_this_process() {
            let mut s = self.lock();
            if let Some(i) = s.pool.iter().position(|b| b.0.len() >= len) {
                let (b, counted) = s.pool.swap_remove(i);
                s.pooled -= counted;
                return b;
            }
        }
        self.allocated.fetch_add(1, Ordering::Relaxed);
        vec![0u8; len]
    }

    /// Buffers [`Stage::buffer`] allocated afresh so far (the rest came
    /// from the pool).
    pub fn buffers_allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Keeps `storage`, the buffer of a row of `row_bytes`, in the pool
    /// while the pool and the rows held fit in the capacity, counted in row
    /// bytes (the stage's memory stays within it, up to the alignment slack
    /// of [`crate::direct_io::storage_for`] per buffer); frees it otherwise.
    fn pool_or_free(&self, s: &mut Inner, storage: Vec<u8>, row_bytes: usize) {
        if row_bytes > 0 && s.bytes + s.pooled + row_bytes <= self.cap {
            s.pooled += row_bytes;
            s.pool.push((storage, row_bytes));
        }
    }

    /// A taken row's bytes were copied out (see [`Staged`]): its room is
    /// free, and its buffer goes to the pool (`reuse`) or is freed.
    fn give_back(&self, storage: Vec<u8>, row_bytes: usize, reuse: bool) {
        if self.created.is_this_process() {
            let mut s = self.lock();
            s.bytes -= row_bytes;
            if reuse {
                self.pool_or_free(&mut s, storage, row_bytes);
            }
        }
    }

    /// Gives up reserved rows that were not filled (their read failed):
    /// reads waiting for them read them themselves.
    pub fn cancel(&self, rows: &[u64]) {
        if rows.is_empty() || !self.created.is_this_process() {
            return;
        }
        let mut s = self.lock();
        for &row in rows {
            if matches!(s.rows.get(&row), Some((Slot::Pending | Slot::Doomed, _))) {
                s.remove(row);
            }
        }
        self.publish(&s);
        drop(s);
        self.filled.notify_all();
    }

    /// Takes `row` out of the stage if it is there; a pending row is waited
    /// for (up to [`PENDING_WAIT`]; then the caller reads it itself). Its
    /// buffer goes back to the pool when the [`Staged`] is dropped.
    pub fn take(&self, row: u64) -> Option<Staged<'_>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.is_empty() {
            return None;
        }
        let mut s = self.lock();
        let deadline = std::time::Instant::now() + PENDING_WAIT;
        loop {
            match s.rows.get(&row) {
                // Doomed: updated since its read ahead began; read it afresh.
                None | Some((Slot::Doomed, _)) => return None,
                Some((Slot::Ready { .. }, _)) => break,
                Some((Slot::Pending, _)) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    s = self
                        .filled
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        let Some(Slot::Ready {
            storage,
            range,
            reuse,
            ..
        }) = s.remove(row)
        else {
            unreachable!("checked above")
        };
        // Its room stays taken until its bytes are copied out (see `Staged`);
        // its entry in `order` goes when it reaches the front.
        s.bytes += range.len();
        self.publish(&s);
        Some(Staged {
            stage: self,
            storage,
            range,
            reuse,
        })
    }
}

/// A row taken from the stage: its bytes (`Deref`). Its room in the stage
/// is free, and its buffer back in the stage's pool, when this is dropped.
pub struct Staged<'a> {
    stage: &'a Stage,
    storage: Vec<u8>,
    range: Range<usize>,
    reuse: bool,
}

impl Deref for Staged<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.storage[self.range.clone()]
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        let storage = std::mem::take(&mut self.storage);
        self.stage.give_back(storage, self.range.len(), self.reuse);
    }
}

impl Stage {
    /// Forgets the staged copies of global rows `rows` (their owner updated
    /// them): staged ones are dropped, pending ones doomed (their fill is
    /// thrown away; a read waiting for one reads it itself). Returns the
    /// rows forgotten.
    pub fn invalidate(&self, rows: std::ops::Range<u64>) -> usize {
        if self.is_empty() || rows.is_empty() {
            return 0;
        }
        let mut s = self.lock();
        let hit: Vec<u64> = s
            .rows
            .keys()
            .copied()
            .filter(|r| rows.contains(r))
            .collect();
        for &row in &hit {
            if matches!(s.rows.get(&row), Some((Slot::Ready { .. }, _))) {
                s.remove(row);
            } else if let Some((slot, _)) = s.rows.get_mut(&row) {
                *slot = Slot::Doomed;
            }
        }
        self.publish(&s);
        drop(s);
        self.filled.notify_all();
        hit.len()
    }
}

/// Cancels the rows of a read ahead that did not fill them (an error, or a
/// panic, on the way), so that no read waits for them.
pub struct Reserved<'a> {
    stage: &'a Stage,
    /// The rows reserved, in order.
    pub rows: Vec<u64>,
}

impl<'a> Reserved<'a> {
    /// `rows` reserved in `stage`.
    pub fn new(stage: &'a Stage, rows: Vec<u64>) -> Reserved<'a> {
        Reserved { stage, rows }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.stage.cancel(&self.rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_is_bounded_and_rows_leave_when_taken() {
        let s = Stage::new(100);
        let got = s.reserve(&[0, 1, 2, 3, 4], 30);
        assert_eq!(got, vec![0, 1, 2], "only 3 rows of 30 bytes fit in 100");
        for &r in &got {
            s.fill(r, vec![r as u8; 30]);
        }
        assert!(s.contains(0) && !s.contains(4));
        assert_eq!(
            s.reserve(&[3, 4], 30),
            Vec::<u64>::new(),
            "rows held are not pushed out"
        );
        assert_eq!(s.take(2).as_deref(), Some(&vec![2u8; 30][..]));
        assert!(s.take(2).is_none());
        assert_eq!(
            s.reserve(&[0, 3, 4], 30),
            vec![3],
            "0 is held; 3 takes 2's room"
        );
        s.cancel(&[3]);
        assert!(!s.contains(3) && s.take(3).is_none());
        assert!(s.reserve(&[9], 200).is_empty(), "larger than the stage");
        assert_eq!(stage_bytes(800 << 20, 1 << 10, 32), 64 << 20);
        assert_eq!(stage_bytes(80, 1, 0), 10);
        // Large rows: 32 rows of 14 MiB (448 MiB) within a 1 GiB budget.
        assert_eq!(stage_bytes(1 << 30, 14 << 20, 32), 448 << 20);
        // Never more than half the budget.
        assert_eq!(stage_bytes(512 << 20, 14 << 20, 32), 256 << 20);
    }

    #[test]
    fn buffers_of_taken_rows_are_reused_within_the_capacity() {
        let row = 100_000;
        let size = crate::direct_io::storage_for(row);
        let s = Stage::new(4 * row);
        // Batch after batch of 4 rows: staged in buffers from the pool, taken, copied out.
        for batch in 0..20u64 {
            let rows: Vec<u64> = (4 * batch..4 * batch + 4).collect();
            assert_eq!(s.reserve(&rows, row), rows);
            for &r in &rows {
                let mut b = s.buffer(size);
                b[7..7 + row].fill(r as u8);
                s.fill_in(r, b, 7..7 + row);
            }
            for &r in &rows {
                let got = s.take(r).expect("staged");
                assert_eq!((got.len(), got[0], got[row - 1]), (row, r as u8, r as u8));
            }
        }
        assert_eq!(
            s.buffers_allocated(),
            4,
            "the first batch's buffers, reused since"
        );
        assert_eq!(s.lock().pooled, 4 * row);
        // The pool and the rows held stay within the capacity: with 4 rows held
        // (one pending, for the one pooled buffer), a taken row's buffer is freed.
        assert_eq!(s.reserve(&[100, 101, 102, 103], row).len(), 4);
        for r in 100..103 {
            s.fill_in(r, s.buffer(size), 0..row);
        }
        drop(s.take(100));
        let inner = s.lock();
        assert_eq!((inner.pool.len(), inner.bytes + inner.pooled), (1, 4 * row));
        drop(inner);
        assert_eq!(s.buffers_allocated(), 4);
        // A taken row keeps its room until its bytes are copied out.
        assert_eq!(s.reserve(&[200], row), vec![200], "the room of 100");
        let copying = s.take(101).expect("staged");
        assert!(s.reserve(&[201], row).is_empty(), "101 is being copied");
        drop(copying);
        assert_eq!(s.reserve(&[201], row), vec![201]);
    }

    #[test]
    fn a_stage_that_never_fills_keeps_no_trail_of_taken_rows() {
        let s = Stage::new(1 << 20);
        // Row 0 is staged and never read: it stays at the front of the order.
        assert_eq!(s.reserve(&[0], 10), vec![0]);
        s.fill(0, vec![0; 10]);
        // Without the trim, `order` would end 5,000 long (the bound is 1,030); more rows only
        // slow scripts/check-memory.sh down (12 s of CPU under valgrind at 100,000).
        for row in 1..5_000u64 {
            assert_eq!(s.reserve(&[row], 10), vec![row]);
            s.fill(row, vec![row as u8; 10]);
            assert_eq!(s.take(row).as_deref(), Some(&vec![row as u8; 10][..]));
        }
        let inner = s.lock();
        assert_eq!(inner.rows.len(), 1);
        assert!(
            inner.order.len() <= 1030,
            "{} entries for 1 row",
            inner.order.len()
        );
    }

    #[test]
    fn rows_of_their_own_sizes_fill_the_stage_in_order() {
        let s = Stage::new(100);
        // Empty rows and rows larger than the stage are skipped; the rest go,
        // in order, until one does not fit (the soonest needed go first).
        let got = s.reserve_sized(&[(1, 0), (2, 40), (3, 150), (4, 50), (5, 20), (6, 5)]);
        assert_eq!(got, vec![2, 4], "5 does not fit beside 2 and 4");
        s.fill(2, vec![2; 40]);
        s.fill(4, vec![4; 49]); // not its reserved size: ignored, stays pending
        s.cancel(&[4]);
        assert_eq!(s.take(2).as_deref(), Some(&vec![2; 40][..]));
        assert!(s.take(4).is_none() && s.is_empty());
    }

    #[test]
    fn a_read_waits_for_a_pending_row_and_stale_rows_make_room() {
        let s = Stage::new(100);
        assert_eq!(s.reserve(&[7], 50), vec![7]);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| s.take(7).map(|b| b.to_vec()));
            std::thread::sleep(Duration::from_millis(20));
            s.fill(7, vec![7; 50]);
            assert_eq!(reader.join().unwrap(), Some(vec![7; 50]));
        });
        let kept = s.reserve(&[1, 2], 50);
        kept.iter().for_each(|&r| s.fill(r, vec![1; 50]));
        assert!(s.reserve(&[3], 50).is_empty(), "full of fresh rows");
        for _ in 0..=stale_after(2) {
            s.take(99); // other rows read: 1 and 2 grow stale
        }
        assert_eq!(s.reserve(&[3], 50), vec![3], "a stale row made room");
        assert!(!s.contains(1) && s.contains(2));
        let guard = Reserved::new(&s, s.reserve(&[4], 50));
        assert_eq!(guard.rows, vec![4]);
        drop(guard);
        assert!(
            !s.contains(4),
            "a read ahead that did not fill its rows gives them up"
        );
    }

    #[test]
    fn updated_rows_leave_the_stage_and_an_old_fill_is_dropped() {
        let s = Stage::new(1000);
        assert_eq!(s.reserve(&[1, 2, 3, 10], 10), vec![1, 2, 3, 10]);
        s.fill(1, vec![1; 10]);
        s.fill(10, vec![10; 10]);
        // Rows 0..5 are updated while the reads of 2 and 3 are in flight.
        assert_eq!(s.invalidate(0..5), 3);
        assert!(!s.contains(1), "a staged copy of an updated row is dropped");
        assert_eq!(
            s.take(2).as_deref(),
            None,
            "a doomed row is read afresh, not waited for"
        );
        s.fill(2, vec![0; 10]); // its read ahead's (maybe old) bytes arrive
        assert!(!s.contains(2), "and are thrown away");
        assert!(
            s.reserve(&[3], 10).is_empty(),
            "doomed until its read ahead ends"
        );
        s.cancel(&[3]);
        assert_eq!(
            s.reserve(&[1, 2, 3], 10),
            vec![1, 2, 3],
            "staged again afresh"
        );
        assert_eq!(
            s.take(10).as_deref(),
            Some(&[10u8; 10][..]),
            "rows outside the update stay"
        );
        // A read waiting for a pending row is woken by the update and reads it itself.
        assert_eq!(s.reserve(&[7], 10), vec![7]);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| s.take(7).map(|b| b.to_vec()));
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(s.invalidate(7..8), 1);
            assert_eq!(reader.join().unwrap(), None);
        });
        s.fill(7, vec![7; 10]);
        assert!(!s.contains(7));
        assert_eq!(s.invalidate(100..200), 0);
    }

    #[test]
    fn a_forked_child_never_uses_its_parents_stage() {
        let s = Stage::new(100);
        assert_eq!(s.reserve(&[1], 10), vec![1]);
        s.fill(1, vec![1; 10]);
        let held = s.inner.lock().unwrap(); // as a parent thread mid-read at the fork
                                            // SAFETY: the child uses only the stage (atomics, no lock) and _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let ok = s.is_empty()
                && s.take(1).is_none()
                && s.reserve(&[2], 10).is_empty()
                && !s.contains(1);
            s.fill(2, vec![0; 10]);
            s.cancel(&[2]);
            // SAFETY: leaves the child at once, running no test-harness code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        drop(held);
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert_eq!(s.take(1).as_deref(), Some(&vec![1; 10][..]));
    }
}
