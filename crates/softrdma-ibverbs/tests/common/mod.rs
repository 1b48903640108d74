//! Running real programs on softrdma's libibverbs.
//!
//! The library under test is the `libibverbs.so` cargo built next to the
//! test binary (`target/<profile>/`). Programs find it through
//! `LD_LIBRARY_PATH` pointing at a private directory holding it under its
//! SONAME, `libibverbs.so.1` (and as `libibverbs.so`, for linking C tests),
//! or through `LD_PRELOAD`.
//!
//! Server/client pairs start the server, wait until its TCP port listens
//! (read from /proc/net/tcp{,6}, so the probe is not itself a client),
//! start the client, and kill both when they overrun their deadline. Pair
//! tests of one test binary run one at a time (2-CPU machines).

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Where cargo put the library. `cargo test` builds it (the crate is also
/// an rlib, so the tests depend on it) into `deps/` beside the test binary
/// without copying it up to `target/<profile>/`, so `deps/` comes first:
/// the copy in the profile directory may be from an older `cargo build`.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let fresh = deps.join("libibverbs.so");
    if fresh.exists() {
        return fresh;
    }
    let profile_dir = deps.parent().expect("target/<profile>/deps/<test>");
    let lib = profile_dir.join("libibverbs.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo builds it with the tests of softrdma-ibverbs",
        lib.display()
    );
    lib
}

/// A directory with `libibverbs.so.1` and `libibverbs.so` → the built library.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = built_library();
        let dir = std::env::temp_dir().join(format!(
            "softrdma-ibverbs-test-{}-{}",
            std::process::id(),
            lib.metadata().map(|m| m.len()).unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for name in ["libibverbs.so.1", "libibverbs.so"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).expect("symlink the library");
        }
        dir
    })
}

/// The full path of `tool` on PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// True when every tool is installed; otherwise prints why the test is
/// skipped (CI installs them: ibverbs-utils, perftest, libibverbs-dev, valgrind).
pub fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| which(t).is_none())
        .collect();
    if missing.is_empty() {
        true
    } else {
        assert!(std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(), "an outside tool or file this test needs is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping");
        eprintln!(
            "SKIPPED: {} not installed (Debian: apt-get install ibverbs-utils perftest libibverbs-dev valgrind)",
            missing.join(", ")
        );
        false
    }
}

/// Serialises the tests of one binary that run program pairs.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a program finds the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// LD_LIBRARY_PATH=<dir with libibverbs.so.1>.
    LibraryPath,
    /// LD_PRELOAD=<target/…/libibverbs.so>.
    Preload,
}

/// A command running `tool` on softrdma: the default device `srx0` over
/// the UDP transport (`transport` overrides), the library found per `load`.
pub fn softrdma_cmd(tool: &str, args: &[&str], load: Load, transport: &str) -> Command {
    let mut c = Command::new(tool);
    c.args(args)
        .env_remove("SOFTRDMA_DEVICES")
        .env_remove("SOFTRDMA_FAULT")
        .env_remove("SOFTRDMA_CAPTURE")
        .env("SOFTRDMA_TRANSPORT", transport);
    match load {
        Load::LibraryPath => {
            c.env("LD_LIBRARY_PATH", lib_dir()).env_remove("LD_PRELOAD");
        }
        Load::Preload => {
            c.env("LD_PRELOAD", built_library())
                .env_remove("LD_LIBRARY_PATH");
        }
    }
    c
}

/// What a finished (or killed) program printed.
#[derive(Debug)]
pub struct Output {
    pub ok: bool,
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

struct Running {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

fn spawn(mut c: Command) -> Running {
    // A process group of its own: a program that forks (rdma-core's test
    // suite runs rdma_cm tests in forked processes) is ended with
    // everything it started, and nothing left behind holds the output
    // pipes open (the readers below would wait for their end for good).
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    Running { child, out, err }
}

impl Running {
    /// Waits until `deadline`, then kills the child; either way, then
    /// kills what is left of its process group.
    fn finish(mut self, deadline: Instant) -> Output {
        let mut timed_out = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() >= deadline => {
                    timed_out = true;
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        kill_group(self.child.id());
        Output {
            ok: !timed_out && status.is_some_and(|s| s.success()),
            code: status.and_then(|s| s.code()),
            timed_out,
            stdout: self.out.join().unwrap_or_default(),
            stderr: self.err.join().unwrap_or_default(),
        }
    }
}

/// Sends SIGKILL to process group `pgid` (the group a spawned program
/// leads): its leftovers, such as forked children still running.
fn kill_group(pgid: u32) {
    let Ok(pgid) = i32::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals a process group and
    // touches no memory of this process.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// Runs one program to completion (killed after `timeout`).
pub fn run(c: Command, timeout: Duration) -> Output {
    spawn(c).finish(Instant::now() + timeout)
}

/// True when something listens on TCP `port` (IPv4 or IPv6).
pub fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                // "sl local_address rem_address st ...": "0100007F:4918 ... 0A"
                let cols: Vec<&str> = l.split_whitespace().collect();
                let local_port = cols
                    .get(1)
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                local_port == Some(port) && cols.get(3) == Some(&"0A")
            })
        })
    })
}

/// Runs a server and then, once it listens on `port`, its client; both
/// are killed at `timeout`. Returns (server, client).
pub fn run_pair(
    server: Command,
    client: Command,
    port: u16,
    timeout: Duration,
) -> (Output, Output) {
    let deadline = Instant::now() + timeout;
    let s = spawn(server);
    let ready_by = Instant::now() + Duration::from_secs(20).min(timeout);
    while !listening(port) && Instant::now() < ready_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = spawn(client);
    let client = c.finish(deadline);
    // The server finishes right after its client; give it a moment.
    let server = s.finish(deadline.max(Instant::now() + Duration::from_secs(5)));
    (server, client)
}

/// Runs `tool args` as server and `tool args 127.0.0.1` as client.
pub fn pair(
    tool: &str,
    args: &[&str],
    port: u16,
    transport: &str,
    timeout: Duration,
) -> (Output, Output) {
    let mut cargs: Vec<&str> = args.to_vec();
    cargs.push("127.0.0.1");
    run_pair(
        softrdma_cmd(tool, args, Load::LibraryPath, transport),
        softrdma_cmd(tool, &cargs, Load::LibraryPath, transport),
        port,
        timeout,
    )
}

/// Panics with both programs' output unless both succeeded.
pub fn assert_both_ok(what: &str, s: &Output, c: &Output) {
    assert!(
        s.ok && c.ok,
        "{what}: server ok={} code={:?} timed_out={}, client ok={} code={:?} timed_out={}\n\
         ---- server stdout\n{}\n---- server stderr\n{}\n---- client stdout\n{}\n---- client stderr\n{}",
        s.ok,
        s.code,
        s.timed_out,
        c.ok,
        c.code,
        c.timed_out,
        s.stdout,
        s.stderr,
        c.stdout,
        c.stderr
    );
}

/// Runs `server`, waits (at most 20 s) until `ready`, then runs the
/// client `client()` makes to completion — again while `again` says its
/// output shows it came too early (at most 5 times, a second apart); the
/// server gets `grace` more to finish before it is killed (a server that
/// serves forever, as cmtime's, is killed then). Both are killed at
/// `timeout`. Returns (server, last client).
pub fn run_client_of(
    server: Command,
    mut client: impl FnMut() -> Command,
    ready: impl Fn() -> bool,
    again: impl Fn(&Output) -> bool,
    timeout: Duration,
    grace: Duration,
) -> (Output, Output) {
    let deadline = Instant::now() + timeout;
    let s = spawn(server);
    let ready_by = Instant::now() + Duration::from_secs(20).min(timeout);
    while !ready() && Instant::now() < ready_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = spawn(client()).finish(deadline);
    for _ in 1..5 {
        if !again(&out) || Instant::now() + Duration::from_secs(1) >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        out = spawn(client()).finish(deadline);
    }
    let server = s.finish(deadline.min(Instant::now() + grace));
    (server, out)
}
