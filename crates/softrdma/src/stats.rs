//! Counters of running processes, for `softrdma stat`.
//!
//! Every open device publishes its counters on a Unix stream socket, so an
//! operator can look at a running program's devices and QPs from outside,
//! like `rdma statistic` does for kernel devices. The socket lives in the
//! run directory: `$SOFTRDMA_RUN_DIR` when set, else `/tmp/softrdma-<uid>`
//! (see `rundir.rs`: created with mode 0700; when it exists but is not a
//! directory that only this user controls, nothing is published). Each device gets
//! `stats-<device>-<pid>-<n>.sock`, `n` counting the devices the process
//! opened (the same-host transport keeps its `dev-…` sockets there too).
//!
//! Protocol: connect, read until end of file. The answer is one JSON object
//! (one line) with the device's counters, its driver and shared-memory
//! transport counters, and every QP's counters; see `docs/tools.md`. A small thread per device serves it: it
//! sleeps in `poll` on the listening socket (waking twice a second to notice
//! that the device is gone, then it exits). The socket file is removed when
//! the device closes; files left by processes that died without closing
//! their devices are removed by [`collect`]. `SOFTRDMA_STATS=0` turns
//! publishing off.

use softrdma_engine::Qpn;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use softrdma_engine::Counters;

use crate::device::{Device, DriverCounters};
use crate::sys;

pub use crate::rundir::RUN_DIR_ENV;
/// Environment variable that turns publishing off when set to `0`.
pub const STATS_ENV: &str = "SOFTRDMA_STATS";
/// Version of the JSON document (its `softrdma_stats` field).
pub const FORMAT_VERSION: u32 = 1;

static SEQ: AtomicU32 = AtomicU32::new(0);
/// Socket files of this process's open devices, by device address in memory.
static PUBLISHED: Mutex<Vec<(usize, PathBuf)>> = Mutex::new(Vec::new());

pub use crate::rundir::run_dir;

/// Starts publishing `dev`'s counters (called once per opened device).
/// Failures are silent: statistics must never stop a device from opening.
pub(crate) fn publish(dev: &Arc<Device>) {
    if std::env::var(STATS_ENV).is_ok_and(|v| v.trim() == "0") {
        return;
    }
    let Ok(dir) = crate::rundir::prepare() else {
        return;
    };
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(
        "stats-{}-{}-{seq}.sock",
        dev.name,
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let Ok(listener) = UnixListener::bind(&path) else {
        return;
    };
    if listener.set_nonblocking(true).is_err() {
        let _ = std::fs::remove_file(&path);
        return;
    }
    let weak = Arc::downgrade(dev);
    let started = std::time::Instant::now();
    let p = path.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("softrdma-stats-{}", dev.name))
        .spawn(move || serve(listener, p, weak, started));
    match spawned {
        Ok(_) => PUBLISHED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Arc::as_ptr(dev) as usize, path)),
        Err(_) => {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Removes the socket file of `dev` (called when the device closes).
pub(crate) fn unpublish(dev: &Arc<Device>) {
    let key = Arc::as_ptr(dev) as usize;
    let mut list = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(k, path)| {
        if *k == key {
            let _ = std::fs::remove_file(path);
        }
        *k != key
    });
}

fn serve(listener: UnixListener, path: PathBuf, dev: Weak<Device>, started: std::time::Instant) {
    let fd = listener.as_raw_fd();
    loop {
        let [ready] = sys::wait_readable([fd], Some(Duration::from_millis(500)));
        let Some(dev) = dev.upgrade() else { break };
        if !path.exists() {
            break; // unpublished: the device closed
        }
        if !ready {
            continue;
        }
        while let Ok((mut s, _)) = listener.accept() {
            let _ = s.set_nonblocking(false);
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let doc = snapshot(&dev, started.elapsed());
            let _ = s.write_all(doc.as_bytes());
        }
    }
}

fn counters_json(out: &mut String, c: &Counters) {
    out.push('{');
    for (i, (k, v)) in c.fields().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{k}\":{v}");
    }
    out.push('}');
}

/// Driver counters as name/value pairs.
pub fn driver_fields(d: &DriverCounters) -> [(&'static str, u64); 6] {
    [
        ("send_errors", d.send_errors),
        ("faults_injected", d.faults_injected),
        ("background_wakeups", d.background_wakeups),
        ("direct_ops", d.direct_ops),
        ("gso_sends", d.gso_sends),
        ("gro_buffers", d.gro_buffers),
    ]
}

/// A QP's congestion-controller counters as `softrdma stat` shows them
/// (`rate_bps` 0: a controller without a rate, the default fixed window).
pub fn congestion_fields(c: &softrdma_engine::CcCounters) -> [(&'static str, u64); 3] {
    [
        ("rate_cuts", c.rate_cuts),
        ("rate_bps", c.rate_bps),
        ("cnps_asked", c.cnps_asked),
    ]
}

/// Shared-memory transport counters as name/value pairs.
pub fn shm_fields(c: &crate::shm::ShmCounters) -> [(&'static str, u64); 6] {
    [
        ("tx_packets", c.tx_packets),
        ("rx_packets", c.rx_packets),
        ("ring_full", c.ring_full),
        ("wakeups_sent", c.wakeups_sent),
        ("links", c.links),
        ("links_refused", c.links_refused),
    ]
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn program() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The JSON document for one device (one line, with a final newline).
fn snapshot(dev: &Device, uptime: Duration) -> String {
    let (dc, drv) = dev.counters();
    type QpRow = (
        Qpn,
        String,
        String,
        Counters,
        bool,
        softrdma_engine::CcCounters,
    );
    let (shm, qps): (_, Vec<QpRow>) = {
        let st = dev.lock();
        let e = &st.engine;
        let rows = e
            .qp_numbers()
            .into_iter()
            .map(|q| {
                let ty = e
                    .query_qp(q)
                    .map(|(_, init)| init.qp_type.to_string())
                    .unwrap_or_default();
                let state = e.qp_state(q).map(|s| s.to_string()).unwrap_or_default();
                (
                    q,
                    ty,
                    state,
                    e.qp_counters(q).copied().unwrap_or_default(),
                    e.qp_selective_repeat(q).unwrap_or(false),
                    e.qp_congestion(q).unwrap_or_default(),
                )
            })
            .collect();
        (st.shm().counters, rows)
    };
    let mut o = String::with_capacity(1024 + qps.len() * 512);
    let _ = write!(
        o,
        "{{\"softrdma_stats\":{FORMAT_VERSION},\"pid\":{},\"program\":",
        std::process::id()
    );
    json_str(&mut o, &program());
    o.push_str(",\"device\":");
    json_str(&mut o, &dev.name);
    let _ = write!(
        o,
        ",\"addr\":\"{}\",\"gid\":\"{}\",\"uptime_s\":{:.3},\"counters\":",
        dev.addr,
        std::net::Ipv6Addr::from(softrdma_engine::Gid::from_ip(dev.addr.ip()).0),
        uptime.as_secs_f64()
    );
    counters_json(&mut o, &dc);
    o.push_str(",\"driver\":{");
    for (i, (k, v)) in driver_fields(&drv).iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "\"{k}\":{v}");
    }
    o.push_str("},\"shm\":{");
    for (i, (k, v)) in shm_fields(&shm).iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "\"{k}\":{v}");
    }
    o.push_str("},\"qps\":[");
    for (i, (q, ty, state, c, sr, cc)) in qps.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{{\"qpn\":{q},\"type\":");
        json_str(&mut o, ty);
        o.push_str(",\"state\":");
        json_str(&mut o, state);
        let _ = write!(o, ",\"selective_repeat\":{sr},\"counters\":");
        counters_json(&mut o, c);
        o.push_str(",\"congestion\":{");
        for (i, (k, v)) in congestion_fields(cc).iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let _ = write!(o, "\"{k}\":{v}");
        }
        o.push_str("}}");
    }
    o.push_str("]}\n");
    o
}

/// One published socket found in the run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The socket's path.
    pub path: PathBuf,
    /// Device name (from the file name).
    pub device: String,
    /// Process id (from the file name).
    pub pid: u32,
}

fn parse_name(path: &Path) -> Option<Published> {
    let name = path
        .file_name()?
        .to_str()?
        .strip_prefix("stats-")?
        .strip_suffix(".sock")?;
    let mut it = name.rsplitn(3, '-');
    let _seq: u32 = it.next()?.parse().ok()?;
    let pid: u32 = it.next()?.parse().ok()?;
    let device = it.next()?.to_string();
    Some(Published {
        path: path.to_path_buf(),
        device,
        pid,
    })
}

/// Reads one socket's document.
pub fn query(path: &Path, timeout: Duration) -> io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Queries every live published device in `dir` (sorted by pid, then
/// name), removing sockets whose process is gone or that refuse
/// connections. Returns each socket with its JSON document or the error
/// that made it unreadable.
pub fn collect(dir: &Path, timeout: Duration) -> Vec<(Published, io::Result<String>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<Published> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| parse_name(&e.path()))
        .collect();
    found.sort_by(|a, b| (a.pid, &a.path).cmp(&(b.pid, &b.path)));
    let mut out = Vec::new();
    for p in found {
        if !Path::new(&format!("/proc/{}", p.pid)).exists() {
            let _ = std::fs::remove_file(&p.path);
            continue;
        }
        match query(&p.path, timeout) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ) =>
            {
                if e.kind() == io::ErrorKind::ConnectionRefused {
                    let _ = std::fs::remove_file(&p.path);
                }
            }
            r => out.push((p, r)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_socket_names() {
        let p = parse_name(Path::new("/x/stats-my-dev-1234-7.sock")).unwrap();
        assert_eq!((p.device.as_str(), p.pid), ("my-dev", 1234));
        assert!(parse_name(Path::new("/x/stats-srx0-12.sock")).is_none());
        assert!(parse_name(Path::new("/x/stats-srx0-1-2.txt")).is_none());
        assert!(parse_name(Path::new("/x/dev-127.0.0.1-4791.sock")).is_none());
    }

    #[test]
    fn escapes_json_strings() {
        let mut s = String::new();
        json_str(&mut s, "a\"b\\c\n");
        assert_eq!(s, "\"a\\\"b\\\\c\\u000a\"");
    }
}
