//! Socket files of dead processes in the run directory are removed by the
//! next device that starts, and a live process's never are
//! (`rundir::sweep_stale`, docs/shm.md).

mod common;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{role, self_command_over, shm_loopback, Peer, TempDir};
use softrdma::Context;

const RUN_DIR_ENV: &str = "SOFTRDMA_RUN_DIR";

/// Entry point of the re-executed peers; returns at once in a normal run.
#[test]
fn peer() {
    let Some(role) = role() else { return };
    let ctx = Context::open_with(&shm_loopback()).unwrap();
    println!("ready {}", ctx.addr());
    match role.as_str() {
        // Holds its device until killed (at most a minute).
        "hold" => std::thread::sleep(Duration::from_secs(60)),
        // Opens a device and closes it again.
        "start" => drop(ctx),
        other => panic!("unknown role {other}"),
    }
}

/// Starts a peer with its run directory in `run` and waits for its device.
fn start(name: &str, role: &str, run: &Path, dir: &TempDir) -> (Peer, String) {
    let mut cmd = self_command_over("peer", role, "shm");
    cmd.env(RUN_DIR_ENV, run);
    let mut p = Peer::spawn(name, cmd, dir);
    let t = Instant::now();
    loop {
        // The test harness prints "test peer ... " first, on the same line.
        let log = p.log();
        if let Some(addr) = log
            .lines()
            .find_map(|l| l.split_once("ready ").map(|x| x.1))
        {
            let ip = addr.rsplit_once(':').unwrap().0.to_string();
            return (p, ip);
        }
        p.check_alive();
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name} never opened its device"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn files(run: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The run-directory files of the device at `ip` in process `pid`.
fn owned(ip: &str, pid: i32) -> [String; 3] {
    [
        format!("dev-{ip}-4791.sock"),
        format!("dev-{ip}-4791.lock"),
        format!("stats-srx0-{pid}-0.sock"),
    ]
}

#[test]
fn a_killed_process_sockets_go_with_the_next_device_and_a_live_one_stays() {
    if role().is_some() {
        return;
    }
    let dir = TempDir::new("stale");
    let run: PathBuf = dir.path("run");
    let (mut victim, victim_ip) = start("victim", "hold", &run, &dir);
    let (live, live_ip) = start("live", "hold", &run, &dir);
    assert_ne!(victim_ip, live_ip);
    let (victim_files, live_files) = (owned(&victim_ip, victim.pid()), owned(&live_ip, live.pid()));
    let all = files(&run);
    for f in victim_files.iter().chain(&live_files) {
        assert!(all.contains(f), "{f} missing from {all:?}");
    }
    // Both owners alive: a sweep takes nothing.
    assert_eq!(softrdma::rundir::sweep_stale(&run), Vec::<PathBuf>::new());

    // SIGKILL: no destructor runs, the files stay behind.
    victim.signal(libc::SIGKILL);
    victim.wait(Duration::from_secs(30));
    let all = files(&run);
    for f in &victim_files {
        assert!(
            all.contains(f),
            "{f} vanished before any device started: {all:?}"
        );
    }
    assert!(UnixStream::connect(run.join(&victim_files[0])).is_err());

    // The next device that starts removes the dead process's files only.
    let (mut next, _) = start("next", "start", &run, &dir);
    next.expect_success(Duration::from_secs(60));
    let all = files(&run);
    for f in &victim_files {
        assert!(
            !all.contains(f),
            "{f} of the killed process is still there: {all:?}"
        );
    }
    for f in &live_files {
        assert!(
            all.contains(f),
            "{f} of the live process was removed: {all:?}"
        );
    }
    // And the live device still answers on its socket.
    UnixStream::connect(run.join(&live_files[0])).expect("the live peer's socket works");
    drop(live);
}
