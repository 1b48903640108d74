//! The run directory: where devices meet same-host peers (`dev-…` sockets)
//! and publish their counters (`stats-…` sockets).
//!
//! It is `$SOFTRDMA_RUN_DIR` when set, else `/tmp/softrdma-<uid>` — a
//! predictable name in a directory everyone can write, so another user may
//! have made it first to catch our connections. Before anything is bound or
//! connected in it, [`prepare`] makes sure that it is a real directory (not
//! a symbolic link), owned by this user, and that nobody else can create or
//! replace files in it; otherwise it refuses with an error that names the
//! path, its owner and its mode. Each link also checks its peer's user with
//! `SO_PEERCRED` (see `shm.rs`): this is the first of two locks.

use std::fs::{DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the run directory.
pub const RUN_DIR_ENV: &str = "SOFTRDMA_RUN_DIR";

/// The run directory: `$SOFTRDMA_RUN_DIR`, else `/tmp/softrdma-<uid>`.
pub fn run_dir() -> PathBuf {
    match std::env::var_os(RUN_DIR_ENV).filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => default_run_dir(),
    }
}

fn default_run_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/softrdma-{}", euid()))
}

/// This process's effective user.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why the run directory cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDirError {
    /// The directory.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for RunDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "run directory {}: {}; remove it or set {RUN_DIR_ENV} to a directory of your own (mode 0700)",
            self.path.display(),
            self.reason
        )
    }
}

/// Creates the run directory (mode 0700) if it is missing and checks that
/// only this user controls it. The default directory, when it is ours but
/// open to others (as older versions made it), is closed to 0700; a
/// directory named by `$SOFTRDMA_RUN_DIR` is never changed, only refused.
/// Then removes the sockets dead processes left in it ([`sweep_stale`]):
/// every device that starts calls this.
pub fn prepare() -> Result<PathBuf, RunDirError> {
    let dir = run_dir();
    let is_default = dir == default_run_dir();
    prepare_at(&dir, is_default)?;
    sweep_stale(&dir);
    Ok(dir)
}

/// The lock file that proves a same-host socket's owner alive.
fn lock_path(sock: &Path) -> PathBuf {
    sock.with_extension("lock")
}

/// Holds `dev-….lock` locked (`flock`) for as long as a device owns the
/// socket beside it: the kernel drops the lock when the process dies,
/// however it dies, which is what proves a socket stale. Dropping it
/// removes the lock file.
#[derive(Debug)]
pub(crate) struct OwnerLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl OwnerLock {
    /// Locks the lock file of socket `sock` (creating it, with this
    /// process's id in it for people). `None` when another live process
    /// holds it: a device at the same address in another network
    /// namespace; the socket is then only as safe as before (its file may
    /// outlive this process until that one ends).
    pub(crate) fn take(sock: &Path) -> Option<OwnerLock> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = lock_path(sock);
        // A sweeper may remove the file between our open and our lock:
        // then the locked file is not the one at `path`; try again.
        for _ in 0..4 {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .ok()?;
            match f.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return None,
                Err(std::fs::TryLockError::Error(_)) => return None,
            }
            let (Ok(held), Ok(named)) = (f.metadata(), std::fs::metadata(&path)) else {
                continue;
            };
            if (held.dev(), held.ino()) != (named.dev(), named.ino()) {
                continue;
            }
            let _ = f.set_len(0);
            let _ = writeln!(f, "{}", std::process::id());
            return Some(OwnerLock { path, _file: f });
        }
        None
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // Still locked: nobody else can be using this file.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// True when no process listens on the Unix socket at `path` any more:
/// connecting is refused (a socket file whose listener closed). Any other
/// outcome — connected, or a failure that proves nothing — is false.
fn nobody_listens(path: &Path) -> bool {
    matches!(
        std::os::unix::net::UnixStream::connect(path),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
    )
}

/// Removes the socket files in `dir` whose owner is provably dead, and
/// nothing else:
///
/// * a same-host transport socket (`dev-<ip>-<port>.sock`) when its lock
///   file (`dev-<ip>-<port>.lock`, locked by the owner for its lifetime)
///   can be locked — no live process holds it — and connecting to the
///   socket is refused; the lock file goes with it;
/// * a statistics socket (`stats-<device>-<pid>-<n>.sock`) when process
///   `pid` does not exist and connecting is refused.
///
/// A socket without its lock file (made by an older softrdma), a live
/// owner, or one that still accepts connections is left alone: a live
/// peer's socket is never removed. Returns the paths removed.
pub fn sweep_stale(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return removed;
    };
    for entry in rd.filter_map(|e| e.ok()) {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.ends_with(".sock") {
            continue;
        }
        if name.starts_with("dev-") {
            let lock = lock_path(&path);
            // Only an existing lock file: creating one proves nothing.
            let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&lock)
            else {
                continue;
            };
            if f.try_lock().is_err() {
                continue; // its owner lives
            }
            // An owner removes its lock file before it lets go of the lock:
            // one locked after it was removed proves nothing.
            let (Ok(held), Ok(named)) = (f.metadata(), std::fs::metadata(&lock)) else {
                continue;
            };
            if (held.dev(), held.ino()) != (named.dev(), named.ino()) {
                continue;
            }
            if nobody_listens(&path) && std::fs::remove_file(&path).is_ok() {
                let _ = std::fs::remove_file(&lock);
                removed.push(path);
            }
            // Unlocked when `f` closes.
        } else if let Some(pid) = stats_pid(name) {
            if !Path::new(&format!("/proc/{pid}")).exists()
                && nobody_listens(&path)
                && std::fs::remove_file(&path).is_ok()
            {
                removed.push(path);
            }
        }
    }
    removed
}

/// The process id in a statistics socket's name (`stats-<device>-<pid>-<n>.sock`).
fn stats_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("stats-")?.strip_suffix(".sock")?;
    let mut it = rest.rsplitn(3, '-');
    it.next()?.parse::<u32>().ok()?;
    let pid = it.next()?.parse().ok()?;
    it.next()?;
    Some(pid)
}

/// [`prepare`] for a given directory.
pub fn prepare_at(dir: &Path, may_tighten: bool) -> Result<(), RunDirError> {
    let fail = |reason: String| RunDirError {
        path: dir.to_path_buf(),
        reason,
    };
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create it: {e}"))),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| fail(format!("cannot inspect it: {e}")))?;
    if m.file_type().is_symlink() {
        return Err(fail("it is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(fail("it is not a directory".into()));
    }
    let me = euid();
    if m.uid() != me {
        return Err(fail(format!(
            "it belongs to uid {} ({}), not to this user (uid {me})",
            m.uid(),
            user_name(m.uid()).unwrap_or_else(|| "no name".into())
        )));
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o022 != 0 {
        if !may_tighten {
            return Err(fail(format!(
                "its mode {mode:04o} lets other users create or replace files in it"
            )));
        }
        std::fs::set_permissions(dir, Permissions::from_mode(0o700)).map_err(|e| {
            fail(format!(
                "mode {mode:04o} is open to others and chmod failed: {e}"
            ))
        })?;
    }
    Ok(())
}

/// The name of user `uid`, from `/etc/passwd`.
fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?.parse::<u32>().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("softrdma-rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn a_new_directory_is_private() {
        let d = scratch("new");
        prepare_at(&d, false).unwrap();
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_open_directory_is_refused_or_closed() {
        let d = scratch("open");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, Permissions::from_mode(0o777)).unwrap();
        let e = prepare_at(&d, false).unwrap_err();
        assert!(e.to_string().contains("0777"), "{e}");
        assert!(e.to_string().contains(&d.display().to_string()), "{e}");
        prepare_at(&d, true).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_or_a_file_is_refused() {
        let d = scratch("link");
        let target = scratch("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, &d).unwrap();
        assert!(prepare_at(&d, true)
            .unwrap_err()
            .reason
            .contains("symbolic link"));
        std::fs::remove_file(&d).unwrap();
        std::fs::write(&d, b"x").unwrap();
        assert!(prepare_at(&d, true)
            .unwrap_err()
            .reason
            .contains("not a directory"));
        std::fs::remove_file(&d).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }
}
