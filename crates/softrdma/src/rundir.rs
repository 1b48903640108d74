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
pub fn prepare() -> Result<PathBuf, RunDirError> {
    let dir = run_dir();
    let is_default = dir == default_run_dir();
    prepare_at(&dir, is_default)?;
    Ok(dir)
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
