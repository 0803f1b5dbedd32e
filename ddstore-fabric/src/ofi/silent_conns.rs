//! Accepted connections that never proved anything: the owner's defence
//! against descriptor exhaustion by connections that send nothing.
//!
//! The provider (tcp under rxm, sockets) accepts every connection to an
//! endpoint's port and keeps it, one descriptor each, until the peer
//! speaks or goes away; nobody needs the job's token to open one. This
//! process cannot ask the provider which connection carried an
//! authenticated request, but the kernel says how many bytes each socket
//! received and how long ago (`TCP_INFO`). A reader's provider sends its
//! connection request (at least [`PROVEN_BYTES`]) as soon as it is
//! connected. So a sweep over this process's descriptors (by a thread of
//! its own) finds the sockets accepted on the port of one of this
//! process's endpoints ([`GuardedPort`]) that received fewer bytes than
//! that, and shuts down (`shutdown`, never `close`: the descriptor stays
//! the provider's, which reads EOF and tears the connection down through
//! its own path) those older than [`SILENT_DEADLINE`], and the oldest
//! beyond [`SILENT_CAP`] at once. Legitimate connections send their
//! connection request on connecting, so only during a flood can one be
//! caught before it did (its provider then sees the connection fail).
//!
//! Each socket is checked and shut down through a `dup` of its descriptor
//! (one open file, so the checks and the shutdown act on the same socket
//! even if the provider closes the number meanwhile and it is reused);
//! with the descriptor table full the number itself is used, checked just
//! before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// How long an accepted connection may stay silent (below [`PROVEN_BYTES`]).
pub const SILENT_DEADLINE: Duration = Duration::from_secs(2);
/// Silent accepted connections kept at once: beyond them the oldest are
/// shut down without waiting for the deadline.
pub const SILENT_CAP: usize = 64;
/// Bytes a connection must have received to count as speaking: the header
/// of the tcp provider's connection request (`struct ofi_ctrl_hdr`), which
/// a peer's provider sends as soon as it is connected. A legitimate
/// connection has always sent it; one that has not is not a reader yet.
pub const PROVEN_BYTES: u64 = 32;
/// Time between sweeps; a sweep also waits 20 times its own duration, so
/// sweeping a large descriptor table costs at most 5% of a core (outside
/// a flood).
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Time between sweeps while silent connections arrive faster than the cap
/// allows (a flood), and between the counts of descriptors that start a
/// sweep early when a burst appears: the provider accepts hundreds in 50 ms.
const SWEEP_FLOODED: Duration = Duration::from_millis(10);

/// What the kernel says about one socket.
struct Seen {
    /// Its local port (host order).
    port: u16,
    /// Whether it listens.
    listening: bool,
    /// Bytes it received.
    received: u64,
    /// Milliseconds since it last received data (or was established).
    quiet_ms: u32,
}

/// Endpoint ports guarded at once (more are not swept).
const GUARDED_PORTS: usize = 256;

/// The ports of this process's endpoints (0: a free slot). Atomics, not a
/// lock: a process may fork while the sweeper reads them, and a child
/// must never inherit a held lock it then waits on.
static GUARDED: [AtomicU16; GUARDED_PORTS] = [const { AtomicU16::new(0) }; GUARDED_PORTS];

/// The guarded ports (with repeats where endpoints share one).
fn guarded() -> Vec<u16> {
    GUARDED
        .iter()
        .map(|p| p.load(Ordering::Relaxed))
        .filter(|&p| p != 0)
        .collect()
}

/// An endpoint's port (its slot in the table), swept while this lives.
pub struct GuardedPort(usize);

impl GuardedPort {
    /// For the endpoint named `name`: None unless it is a socket address
    /// with a port (other providers accept no connections).
    pub fn new(name: &[u8]) -> Option<GuardedPort> {
        let port = inet_port(name).filter(|&p| p != 0)?;
        let slot = GUARDED.iter().position(|s| {
            s.compare_exchange(0, port, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        })?;
        start_sweeper();
        Some(GuardedPort(slot))
    }
}

/// The port of a socket address given as bytes (family in native order,
/// then the port in network order, at the same place for IPv4 and IPv6);
/// None for other families.
fn inet_port(addr: &[u8]) -> Option<u16> {
    let family = i32::from(u16::from_ne_bytes([*addr.first()?, *addr.get(1)?]));
    let port = u16::from_be_bytes([*addr.get(2)?, *addr.get(3)?]);
    (family == libc::AF_INET || family == libc::AF_INET6).then_some(port)
}

impl Drop for GuardedPort {
    fn drop(&mut self) {
        GUARDED[self.0].store(0, Ordering::Relaxed);
    }
}

/// Starts the process's sweeper thread (once): it sweeps while ports are
/// guarded, on its own so that it keeps up while a progress thread is
/// inside the provider (accepting a burst of connections, say).
fn start_sweeper() {
    // A flag, not a `Once`: nothing a forked child could inherit half-held.
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("ddstore-silent".into())
        .spawn(|| Sweeper::default().run());
    // Without a thread (none can be made now) nothing is swept: the
    // provider's own limits apply, as before.
    drop(spawned);
}

/// The sweeps of this process's endpoint ports.
struct Sweeper {
    /// A descriptor kept in reserve: with the table full (the flood this
    /// is against), it is given up so that the sweep can list the table.
    reserve: Option<std::fs::File>,
}

impl Default for Sweeper {
    fn default() -> Self {
        Sweeper {
            reserve: std::fs::File::open("/dev/null").ok(),
        }
    }
}

impl Sweeper {
    /// Every [`SWEEP_FLOODED`] counts the descriptors; sweeps when the last
    /// sweep says so, or at once when more than half [`SILENT_CAP`]
    /// descriptors appeared since the last count (a burst of connections is
    /// accepted faster than [`SWEEP_EVERY`]). The count is one `stat` where
    /// the kernel gives it ([`open_fd_count`]); a listing costs time in
    /// proportion to the descriptors (0.8 ms at 2,100), so where counting
    /// lists, it waits 20 times the listing's duration at least.
    fn run(mut self) {
        let (mut next, mut count, mut wait) = (Instant::now(), 0, SWEEP_FLOODED);
        loop {
            std::thread::sleep(wait);
            let ports = guarded();
            if ports.is_empty() {
                continue;
            }
            let counting = Instant::now();
            let (open, listed) = match open_fd_count() {
                Some(n) => (n, None),
                None => {
                    let fds = self.list();
                    wait = SWEEP_FLOODED.max(counting.elapsed() * 20);
                    (fds.len(), Some(fds))
                }
            };
            let burst = open > count + SILENT_CAP / 2;
            count = open;
            if burst || Instant::now() >= next {
                let fds = listed.unwrap_or_else(|| self.list());
                next = Instant::now() + self.sweep(ports, fds);
            }
        }
    }

    /// This process's descriptors, giving up the reserve to list a full table.
    fn list(&mut self) -> Vec<RawFd> {
        let fds = listed_fds().unwrap_or_else(|| {
            self.reserve = None;
            listed_fds().unwrap_or_default()
        });
        if self.reserve.is_none() {
            self.reserve = std::fs::File::open("/dev/null").ok();
        }
        fds
    }

    /// One sweep of `fds` for `ports`; returns how long to wait before the
    /// next: [`SWEEP_EVERY`] and at least 20 times the sweep's own
    /// duration, or while more than [`SILENT_CAP`] silent connections were
    /// found (a flood), [`SWEEP_FLOODED`] and the sweep's duration.
    fn sweep(&mut self, ports: Vec<u16>, fds: Vec<RawFd>) -> Duration {
        let started = Instant::now();
        let silent = Sweep { ports }.run(fds);
        if silent > SILENT_CAP {
            // A flood: keep up with the provider's accepts, whatever it costs.
            SWEEP_FLOODED.max(started.elapsed())
        } else {
            SWEEP_EVERY.max(started.elapsed() * 20)
        }
    }
}

/// One sweep over the descriptor table, for these ports.
struct Sweep {
    ports: Vec<u16>,
}

impl Sweep {
    /// Shuts down what is silent among `fds`; returns how many were silent.
    fn run(&self, fds: Vec<RawFd>) -> usize {
        // (descriptor, quiet ms) of the silent connections on the ports.
        let mut silent: Vec<(RawFd, u32)> = Vec::new();
        for fd in fds {
            if !is_socket(fd) {
                continue;
            }
            if let Some(s) = self.silent(fd) {
                silent.push((fd, s));
            }
        }
        // Longest silent first: past the deadline, or beyond the cap.
        silent.sort_by_key(|&(_, quiet)| std::cmp::Reverse(quiet));
        let deadline = SILENT_DEADLINE.as_millis() as u32;
        for (i, &(fd, quiet)) in silent.iter().enumerate() {
            let over_cap = silent.len() - i > SILENT_CAP;
            if quiet >= deadline || over_cap {
                self.shut_down(fd);
            }
        }
        silent.len()
    }

    /// How long `fd` has been silent, if it is a connection accepted on the
    /// port that received fewer than [`PROVEN_BYTES`].
    fn silent(&self, fd: RawFd) -> Option<u32> {
        // Only a candidate: `shut_down` checks it again through a dup.
        let s = seen(fd)?;
        (self.ports.contains(&s.port) && !s.listening && s.received < PROVEN_BYTES)
            .then_some(s.quiet_ms)
    }

    /// Shuts `fd` down for reading and writing if it still is a silent
    /// connection accepted on the port (checked through a `dup` of it).
    fn shut_down(&self, fd: RawFd) -> bool {
        let own = dup(fd);
        let target = own.as_ref().map_or(fd, |o| o.as_raw_fd());
        let still = seen(target).is_some_and(|s| {
            self.ports.contains(&s.port) && !s.listening && s.received < PROVEN_BYTES
        });
        // SAFETY: shutdown neither closes nor frees the descriptor (the
        // provider still owns the number); `target` was checked just above
        // to be a silent connection accepted on the serving port (through
        // our own dup of it where one could be made).
        still && unsafe { libc::shutdown(target, libc::SHUT_RDWR) } == 0
    }
}

/// Whether `fd` is a socket now: one `fstat` (a `readlink` of its
/// `/proc/self/fd` entry took 5 times as long).
fn is_socket(fd: RawFd) -> bool {
    // SAFETY: stat is plain data (all zeroes valid).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`; a number closed meanwhile only makes it fail
    // (one reused is checked like any other).
    let rc = unsafe { libc::fstat(fd, &mut st) };
    rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

/// The number of descriptors this process has open, from one `stat` of
/// `/proc/self/fd` (Linux 6.2+ gives it as the size; `None` where the kernel
/// says 0): no listing, whatever the table's size.
fn open_fd_count() -> Option<usize> {
    let n = std::fs::metadata("/proc/self/fd").ok()?.len();
    (n > 0).then_some(n as usize)
}

/// This process's open descriptors (None when the listing cannot be opened).
fn listed_fds() -> Option<Vec<RawFd>> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
            .collect(),
    )
}

/// A descriptor of our own for the open file behind `fd` (None with the
/// table full, or `fd` closed).
fn dup(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads the table entry of `fd` (any
    // number: a closed one fails) and returns a new descriptor, owned here.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: `new` is a fresh descriptor nobody else holds.
    (new >= 0).then(|| unsafe { OwnedFd::from_raw_fd(new) })
}

/// The local port, listening state and `TCP_INFO` of socket `fd` (None when
/// it is not a TCP socket, or gone).
fn seen(fd: RawFd) -> Option<Seen> {
    let mut addr = [0u8; 128];
    let mut len = addr.len() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `addr`; `fd` is
    // only read (a number reused meanwhile is checked like any other).
    if unsafe { libc::getsockname(fd, addr.as_mut_ptr().cast(), &mut len) } != 0 {
        return None;
    }
    let port = inet_port(&addr[..(len as usize).min(addr.len())])?;
    let mut accepting: libc::c_int = 0;
    sockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, &mut accepting)?;
    // SAFETY: tcp_info is plain data (all zeroes valid).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let got = sockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    // Kernels before 4.1 give no tcpi_bytes_received: never silent then.
    let has_bytes = got
        >= std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    Some(Seen {
        port,
        listening: accepting != 0,
        received: if has_bytes {
            info.tcpi_bytes_received
        } else {
            u64::MAX
        },
        quiet_ms: info.tcpi_last_data_recv,
    })
}

/// getsockopt into `value`; the bytes the kernel wrote.
fn sockopt<T>(fd: RawFd, level: i32, name: i32, value: &mut T) -> Option<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value` (plain data).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            value as *mut T as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_counted_without_listing_them() {
        let Some(before) = open_fd_count() else {
            return; // a kernel before 6.2: the sweeper lists instead
        };
        let opened: Vec<_> = (0..300)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let after = open_fd_count().unwrap();
        let listed = listed_fds().unwrap().len();
        // Other tests of this binary open and close descriptors meanwhile.
        assert!(
            after.abs_diff(before + opened.len()) < 50,
            "{before} -> {after}"
        );
        assert!(
            after.abs_diff(listed) < 50,
            "{after} counted, {listed} listed"
        );
    }

    #[test]
    fn only_sockets_are_taken_for_sockets() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!is_socket(file.as_raw_fd()));
        assert!(is_socket(listener.as_raw_fd()));
        assert!(!is_socket(-1));
    }
}
