//! A verified private directory (`handshake_dir`): the one place where
//! pyddstore touches files other processes could also reach.
//!
//! The directory is opened once with `O_DIRECTORY|O_NOFOLLOW` and checked on
//! that descriptor (owned by this user, not writable by group or others);
//! every later operation is relative to the descriptor (`openat`-style), so
//! the path cannot be swapped underneath. Writes go through a fresh
//! `O_CREAT|O_EXCL|O_NOFOLLOW` 0600 file with a random name, renamed into
//! place; reads open with `O_NOFOLLOW|O_NONBLOCK` and accept only a regular
//! file owned by this user, of bounded size. Locks are `flock`s the kernel
//! releases when the holder dies.
//!
//! All `unsafe` of this crate's file handling lives here: `PrivateDir` owns
//! the directory descriptor, `NameLock` the lock file's descriptor.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Largest file `read` accepts unless told otherwise: records and rounds are small.
pub const DEFAULT_READ_CAP: usize = 64 << 20;

/// An open, verified, owner-only directory.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(name: &str) -> Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Error::invalid(format!(
            "{name:?} is not a plain file name inside handshake_dir"
        )));
    }
    CString::new(name)
        .map_err(|_| Error::invalid(format!("file name {name:?} contains a NUL byte")))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn fstat(fd: i32) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fd` is an open descriptor and `st` points to a writable stat buffer.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(unsafe { st.assume_init() })
}

fn owner_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
            })
        })
        .map(|n| format!("{n} (uid {uid})"))
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// 16 random hex digits, for temporary names nobody can predict.
pub fn random_hex() -> String {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a writable buffer of the given length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // getrandom only fails on ancient kernels; the pid and clock still differ per call.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        b = (t ^ ((std::process::id() as u64) << 32)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl PrivateDir {
    /// Opens `path` (creating it 0700, with its parents, when `create`), then
    /// checks it: a directory (not a symlink) owned by this user that group
    /// and others cannot write. Anything else is `Error::Access` naming the
    /// owner, the mode and the fix.
    pub fn open(path: &Path, create: bool) -> Result<PrivateDir> {
        Self::open_as(path, create, "handshake_dir")
    }

    /// As [`PrivateDir::open`], naming the directory `label` in messages
    /// (e.g. "spill_dir").
    pub fn open_as(path: &Path, create: bool, label: &str) -> Result<PrivateDir> {
        let fix_hint = |msg: String| msg.replace("handshake_dir", label);
        Self::open_checked_dir(path, create).map_err(|e| match e {
            Error::Access(m) => Error::Access(fix_hint(m)),
            Error::InvalidArgument(m) => Error::InvalidArgument(fix_hint(m)),
            Error::Io { context, source } => Error::Io {
                context: fix_hint(context),
                source,
            },
            other => other,
        })
    }

    fn open_checked_dir(path: &Path, create: bool) -> Result<PrivateDir> {
        if path.as_os_str().is_empty() {
            return Err(Error::invalid(
                "handshake_dir is empty: pass handshake_dir= or set DDSTORE_HANDSHAKE_DIR",
            ));
        }
        if create {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parent.exists() {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        Error::io(
                            format!("creating the parents of handshake_dir {}", path.display()),
                            e,
                        )
                    })?;
                }
            }
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new().mode(0o700).create(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("creating handshake_dir {}", path.display()),
                        e,
                    ))
                }
            }
        }
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid("handshake_dir contains a NUL byte"))?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `c` is a NUL-terminated path; open has no other preconditions.
        let raw = unsafe { libc::open(c.as_ptr(), flags) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            let why = match e.raw_os_error() {
                _ if is_link => "it is a symbolic link".to_string(),
                Some(libc::ENOTDIR) => "it exists and is not a directory".to_string(),
                _ => e.to_string(),
            };
            return Err(Error::Access(format!(
                "handshake_dir {} cannot be used: {why}; give a directory of your own (mkdir -m 700 DIR)",
                path.display()
            )));
        }
        // SAFETY: `raw` is a descriptor open() just returned; we own it from here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let st = fstat(fd.as_raw_fd()).map_err(|e| Error::io("fstat of handshake_dir", e))?;
        let mode = st.st_mode & 0o7777;
        if st.st_uid != euid() || mode & 0o022 != 0 {
            return Err(Error::Access(format!(
                "handshake_dir {} is not private: owned by {}, mode {mode:04o}; pyddstore needs a \
                 directory owned by you that group and others cannot write (e.g. mkdir -m 700 DIR, \
                 or chmod go-w DIR if it is yours)",
                path.display(),
                owner_name(st.st_uid),
            )));
        }
        Ok(PrivateDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The path the directory was opened under (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn show(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// Writes `data` as `name` atomically: a fresh 0600 temporary file with a
    /// random name (`O_EXCL|O_NOFOLLOW`), then `renameat`. The temporary file
    /// is removed on every error path.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        let target = cstr(name)?;
        let ctx = |e| Error::io(format!("writing {}", self.show(name)), e);
        let tmp_name = format!(".{}.tmp-{}", name.get(..200).unwrap_or(name), random_hex());
        let tmp = cstr(&tmp_name)?;
        let mut file = self.open_new(&tmp, libc::O_WRONLY).map_err(ctx)?;
        let written = {
            use std::io::Write;
            file.write_all(data).and_then(|_| file.sync_data())
        };
        drop(file);
        let renamed = written.and_then(|_| {
            // SAFETY: both names are NUL-terminated and relative to our open directory.
            let rc = unsafe {
                libc::renameat(
                    self.fd.as_raw_fd(),
                    tmp.as_ptr(),
                    self.fd.as_raw_fd(),
                    target.as_ptr(),
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
        if let Err(e) = renamed {
            let _ = self.unlink_c(&tmp);
            return Err(ctx(e));
        }
        Ok(())
    }

    /// Creates `name` for reading and writing: a fresh 0600 file of this
    /// user (`O_CREAT|O_EXCL|O_NOFOLLOW`, relative to the verified directory).
    pub fn create_exclusive(&self, name: &str) -> Result<std::fs::File> {
        let c = cstr(name)?;
        self.open_new(&c, libc::O_RDWR)
            .map_err(|e| Error::io(format!("creating {}", self.show(name)), e))
    }

    /// Opens `name` as a new 0600 file (`O_CREAT|O_EXCL|O_NOFOLLOW`, relative
    /// to the verified directory) with `access` (`O_WRONLY` or `O_RDWR`).
    fn open_new(&self, name: &CStr, access: libc::c_int) -> io::Result<std::fs::File> {
        let flags = access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: the directory descriptor is open and `name` is NUL-terminated.
        let raw = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                flags,
                0o600 as libc::c_uint,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor openat just returned; the File owns and closes it.
        Ok(unsafe { std::fs::File::from_raw_fd(raw) })
    }

    fn unlink_c(&self, name: &CStr) -> io::Result<()> {
        // SAFETY: the directory descriptor is open and `name` is NUL-terminated.
        let rc = unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Removes `name` if it is there; a missing file is not an error.
    pub fn remove(&self, name: &str) -> Result<()> {
        match self.unlink_c(&cstr(name)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", self.show(name)), e)),
        }
    }

    /// Opens `name` for reading the safe way; `None` when it does not exist.
    fn open_checked(&self, name: &str, flags: i32) -> Result<Option<OwnedFd>> {
        let c = cstr(name)?;
        let flags = flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
        // SAFETY: the directory descriptor is open and `c` is NUL-terminated.
        let raw = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags,
                0o600 as libc::c_uint,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                Some(libc::ELOOP) => Err(Error::Access(format!(
                    "{} is a symbolic link: refused (pyddstore only reads files it wrote)",
                    self.show(name)
                ))),
                Some(libc::EISDIR) => Err(Error::Access(format!(
                    "{} is a directory, not a file pyddstore wrote: refused",
                    self.show(name)
                ))),
                _ => Err(Error::io(format!("opening {}", self.show(name)), e)),
            };
        }
        // SAFETY: a descriptor openat just returned; we own it from here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let st = fstat(fd.as_raw_fd())
            .map_err(|e| Error::io(format!("fstat of {}", self.show(name)), e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::Access(format!(
                "{} is not a regular file (a FIFO, device, socket or directory): refused",
                self.show(name)
            )));
        }
        if st.st_uid != euid() || st.st_mode & 0o022 != 0 {
            return Err(Error::Access(format!(
                "{} is owned by {} with mode {:04o}: refused (pyddstore only reads owner-only files of this user)",
                self.show(name),
                owner_name(st.st_uid),
                st.st_mode & 0o7777
            )));
        }
        Ok(Some(fd))
    }

    /// The bytes of `name`, `None` when it does not exist. Refuses symlinks,
    /// anything but a regular file of this user, and files over `cap` bytes.
    pub fn read(&self, name: &str, cap: usize) -> Result<Option<Vec<u8>>> {
        let Some(fd) = self.open_checked(name, libc::O_RDONLY)? else {
            return Ok(None);
        };
        let mut file = std::fs::File::from(fd);
        let mut data = Vec::new();
        use std::io::Read;
        (&mut file)
            .take(cap as u64 + 1)
            .read_to_end(&mut data)
            .map_err(|e| Error::io(format!("reading {}", self.show(name)), e))?;
        if data.len() > cap {
            return Err(Error::invalid(format!(
                "{} is larger than the {cap} bytes pyddstore accepts for it: refused",
                self.show(name)
            )));
        }
        Ok(Some(data))
    }

    /// Polls for `name` with backoff until it exists or `deadline` passes
    /// (`Ok(None)`). Whatever sits at the path, this returns by the deadline.
    pub fn wait_for(&self, name: &str, deadline: Instant, cap: usize) -> Result<Option<Vec<u8>>> {
        let mut pause = Duration::from_micros(200);
        loop {
            if let Some(data) = self.read(name, cap)? {
                return Ok(Some(data));
            }
            crate::interrupt::check()?;
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Names of the entries in the directory (not `.`/`..`).
    pub fn list(&self) -> Result<Vec<String>> {
        let fd = self.fd.as_raw_fd();
        let rd = std::fs::read_dir(format!("/proc/self/fd/{fd}"))
            .map_err(|e| Error::io(format!("listing {}", self.path.display()), e))?;
        Ok(rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    /// Takes the lock `name` (a lock file held with `flock` for the life of
    /// the returned value; the kernel releases it if the process dies).
    /// `holder` is written into the file for the message a second job gets.
    /// `Ok(Err(text))` when a live process holds it: `text` is what it wrote.
    pub fn try_lock(
        &self,
        name: &str,
        holder: &str,
    ) -> Result<std::result::Result<NameLock, String>> {
        let c = cstr(name)?;
        loop {
            let flags = libc::O_RDWR
                | libc::O_CREAT
                | libc::O_NOFOLLOW
                | libc::O_CLOEXEC
                | libc::O_NONBLOCK;
            // SAFETY: the directory descriptor is open and `c` is NUL-terminated.
            let raw = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    flags,
                    0o600 as libc::c_uint,
                )
            };
            if raw < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ELOOP) {
                    return Err(Error::Access(format!(
                        "lock file {} is a symbolic link: refused",
                        self.show(name)
                    )));
                }
                return Err(Error::io(
                    format!("opening lock file {}", self.show(name)),
                    e,
                ));
            }
            // SAFETY: a descriptor openat just returned; we own it from here.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let st = fstat(fd.as_raw_fd()).map_err(|e| Error::io("fstat of a lock file", e))?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != euid() {
                return Err(Error::Access(format!(
                    "lock file {} is not a regular file of this user: refused",
                    self.show(name)
                )));
            }
            // SAFETY: `fd` is open; flock has no memory preconditions.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    let mut text = String::new();
                    use std::io::Read;
                    let _ = std::fs::File::from(fd).take(4096).read_to_string(&mut text);
                    return Ok(Err(text.trim().to_string()));
                }
                return Err(Error::io(format!("locking {}", self.show(name)), e));
            }
            // The previous holder may have unlinked the file between our open and
            // flock: only a lock on the file still at `name` counts.
            let mut now = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: directory descriptor open, `c` NUL-terminated, `now` writable.
            let rc = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    now.as_mut_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            // SAFETY: fstatat filled the buffer when rc == 0.
            if rc != 0 || unsafe { now.assume_init() }.st_ino != st.st_ino {
                continue;
            }
            let mut file = std::fs::File::from(fd);
            {
                use std::io::{Seek, Write};
                let _ = file.set_len(0);
                let _ = file.seek(std::io::SeekFrom::Start(0));
                let _ = file.write_all(holder.as_bytes());
            }
            return Ok(Ok(NameLock {
                file,
                name: name.to_string(),
                dir_fd: self
                    .fd
                    .try_clone()
                    .map_err(|e| Error::io("dup of handshake_dir", e))?,
            }));
        }
    }
}

/// A held lock file; dropping it removes the file, then releases the lock.
#[derive(Debug)]
pub struct NameLock {
    file: std::fs::File,
    name: String,
    dir_fd: OwnedFd,
}

impl Drop for NameLock {
    fn drop(&mut self) {
        if let Ok(c) = CString::new(self.name.as_str()) {
            // SAFETY: the directory descriptor is open and `c` is NUL-terminated.
            // Unlinking while still holding the lock: a job that opened the old
            // file sees its inode is gone and retries.
            unsafe { libc::unlinkat(self.dir_fd.as_raw_fd(), c.as_ptr(), 0) };
        }
        let _ = &self.file; // closing the file releases the flock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn refuses_open_dirs_symlinks_and_special_files() {
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = PrivateDir::open(&open, false).unwrap_err().to_string();
        assert!(e.contains("mode 0777") && e.contains("mkdir -m 700"), "{e}");
        let link = base.path().join("link");
        std::os::unix::fs::symlink(base.path(), &link).unwrap();
        let e = PrivateDir::open(&link, true).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");

        let d = PrivateDir::open(&base.path().join("hs"), true).unwrap();
        d.write("rec", b"hello").unwrap();
        assert_eq!(d.read("rec", 100).unwrap().unwrap(), b"hello");
        assert!(d.read("rec", 3).is_err());
        assert_eq!(d.read("none", 10).unwrap(), None);
        std::os::unix::fs::symlink("/dev/zero", base.path().join("hs/zero")).unwrap();
        assert!(matches!(d.read("zero", 10), Err(Error::Access(_))));
        std::fs::create_dir(base.path().join("hs/sub")).unwrap();
        assert!(matches!(d.read("sub", 10), Err(Error::Access(_))));
        let fifo = CString::new(base.path().join("hs/fifo").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let t0 = Instant::now();
        assert!(matches!(
            d.wait_for("fifo", t0 + Duration::from_secs(1), 10),
            Err(Error::Access(_))
        ));
        assert!(t0.elapsed() < Duration::from_secs(1));
        // Writing through a planted symlink replaces the link, never the target.
        let outside = base.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, base.path().join("hs/rec2")).unwrap();
        d.write("rec2", b"new").unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        let mut names = d.list().unwrap();
        names.sort();
        assert_eq!(names, ["fifo", "rec", "rec2", "sub", "zero"]);
    }

    #[test]
    fn a_lock_is_exclusive_and_goes_with_its_holder() {
        let base = tempfile::tempdir().unwrap();
        let d = PrivateDir::open(&base.path().join("hs"), true).unwrap();
        let held = d.try_lock("v.lock", "job A").unwrap().unwrap();
        assert_eq!(d.try_lock("v.lock", "job B").unwrap().unwrap_err(), "job A");
        drop(held);
        assert!(d.list().unwrap().is_empty());
        let again = d.try_lock("v.lock", "job B").unwrap();
        assert!(again.is_ok());
    }
}
