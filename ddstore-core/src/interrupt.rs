//! Signals during long native waits. The binding installs a check of its
//! host's pending signals ([`install`]: Python's handlers, so Ctrl-C raises
//! `KeyboardInterrupt`); every wait loop (reads, collectives, joins, file
//! loads) calls [`check`], which runs that check at most every
//! [`CHECK_EVERY`] per thread and, once it fired, fails every later wait of
//! the thread at once until the binding [`take`]s the interruption.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often a waiting thread runs the installed check (the bound is 200 ms).
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

static HOOK: OnceLock<fn() -> bool> = OnceLock::new();

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    static FIRED: Cell<bool> = const { Cell::new(false) };
}

/// Installs `hook`: true when a signal handler asks the current wait to stop
/// (the binding keeps what to raise). The first install wins.
pub fn install(hook: fn() -> bool) {
    let _ = HOOK.set(hook);
}

/// `Err(Error::Interrupted)` when a signal handler asked this thread's wait to
/// stop; cheap enough for every turn of a polling loop.
pub fn check() -> Result<()> {
    if FIRED.with(Cell::get) {
        return Err(Error::Interrupted);
    }
    let Some(hook) = HOOK.get() else {
        return Ok(());
    };
    let now = Instant::now();
    let due = LAST.with(|l| match l.get() {
        Some(at) if now.duration_since(at) < CHECK_EVERY => false,
        _ => {
            l.set(Some(now));
            true
        }
    });
    if due && hook() {
        FIRED.with(|f| f.set(true));
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Whether this thread was interrupted since the last call; clears it (the
/// binding calls this when it raises the interruption).
pub fn take() -> bool {
    FIRED.with(|f| f.replace(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        // Per thread: other tests of this binary run their waits on other threads.
        static ASK: Cell<bool> = const { Cell::new(false) };
    }

    #[test]
    fn a_fired_check_fails_every_wait_until_taken() {
        install(|| ASK.with(|a| a.replace(false)));
        assert!(check().is_ok());
        ASK.with(|a| a.set(true));
        // A wait polling check() stops within CHECK_EVERY of the signal.
        let t0 = Instant::now();
        let waited = loop {
            if let Err(e) = check() {
                break e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "the check never fired"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(matches!(waited, Error::Interrupted), "{waited:?}");
        assert!(matches!(check(), Err(Error::Interrupted)));
        assert!(take());
        assert!(check().is_ok() && !take());
    }
}
