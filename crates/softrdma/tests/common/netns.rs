//! Network namespaces for tests that need two "hosts": made with unique
//! names, joined by veth pairs, removed on drop — and namespaces left by
//! a test process that was killed are removed by the next one.
//!
//! Self-contained (std only), so that the `softrdma` command's tests
//! include this same file (`#[path]`) instead of a second copy.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Every namespace of these tests starts with this.
const PREFIX: &str = "srdma";

/// Network namespaces (and whatever lives in them) removed on drop.
pub struct Netns {
    pub names: Vec<String>,
    /// Unique tag of this set (`<pid>-<n>`), also used for veth names.
    tag: String,
}

/// `ip ARGS`' output; Err(stdout+stderr) when it fails or hangs (30 s).
pub fn ip_try(args: &[&str]) -> Result<String, String> {
    let mut child = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("ip {} did not finish in 30 s", args.join(" ")));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("ip {}: {}", args.join(" "), text.trim()))
    }
}

/// Runs `ip ARGS`, panicking with its output on failure.
pub fn ip(args: &[&str]) {
    if let Err(e) = ip_try(args) {
        panic!("{e}");
    }
}

/// A name no other namespace set of any test process has: the PID (unique
/// among live processes) and a per-process counter (unique among the sets
/// of one process, whose tests run in parallel threads).
fn unique_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the namespaces of test processes that are gone (killed before
/// their drop ran), so names and addresses never pile up.
fn remove_stale() {
    let Ok(list) = ip_try(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        // <PREFIX><kind>-<pid>-<n><suffix>
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let mut parts = rest.split('-');
        let pid = parts.nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = ip_try(&["netns", "del", name]);
            }
        }
    }
}

impl Netns {
    /// Creates namespaces named `srdma<kind>-<pid>-<n><suffix>` for each suffix.
    pub fn new(kind: &str, suffixes: &[&str]) -> Netns {
        remove_stale();
        let tag = unique_tag();
        let mut ns = Netns {
            names: Vec::new(),
            tag: tag.clone(),
        };
        for s in suffixes {
            let name = format!("{PREFIX}{kind}-{tag}{s}");
            if let Err(e) = ip_try(&["netns", "add", &name]) {
                // Our PID and counter: only a dead process that had this
                // PID before can have made it. Remove it and make ours.
                assert!(e.contains("exists"), "{e}");
                ip(&["netns", "del", &name]);
                ip(&["netns", "add", &name]);
            }
            ns.names.push(name.clone());
            ip(&["-n", &name, "link", "set", "lo", "up"]);
        }
        ns
    }

    /// The unique tag of this set (`<pid>-<n>`).
    #[allow(dead_code)]
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The names [`Netns::veth`] gives its two ends.
    #[allow(dead_code)]
    pub fn veth_names(&self) -> (String, String) {
        let t = self.tag.replace('-', "");
        (format!("sr{t}a"), format!("sr{t}b"))
    }

    /// A command run inside namespace `i`.
    pub fn exec(&self, i: usize, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[i]]).arg(prog);
        c
    }

    /// Joins namespaces `a` and `b` with a veth pair of `mtu`, addressed
    /// `addr_a`/`addr_b` (with prefix length) inside the namespaces only.
    pub fn veth(&self, a: usize, b: usize, mtu: u32, addr_a: &str, addr_b: &str) {
        // Interface names have at most 15 characters: "sr<pid><n>a".
        let (va, vb) = self.veth_names();
        let mtu = mtu.to_string();
        ip(&[
            "link",
            "add",
            &va,
            "netns",
            &self.names[a],
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &vb,
            "netns",
            &self.names[b],
            "mtu",
            &mtu,
        ]);
        for (ns, dev, addr) in [(a, &va, addr_a), (b, &vb, addr_b)] {
            let n = &self.names[ns];
            let fam = if addr.contains(':') { "-6" } else { "-4" };
            let mut args = vec![fam, "-n", n, "addr", "add", addr, "dev", dev];
            if fam == "-6" {
                args.push("nodad");
            }
            ip(&args);
            ip(&["-n", n, "link", "set", dev, "up"]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            // Deleting a namespace also deletes the veth end inside it.
            let _ = ip_try(&["netns", "del", n]);
        }
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn find_ip() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join("ip"))
        .find(|p| p.is_file());
    found
}

/// Why namespace tests cannot run here, if they cannot. Probed once per
/// process, with a uniquely named probe namespace.
pub fn netns_unavailable() -> Option<String> {
    static PROBED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(probe_netns).clone()
}

fn probe_netns() -> Option<String> {
    if !running_as_root() {
        return Some("needs root to create network namespaces".into());
    }
    if find_ip().is_none() {
        return Some("the `ip` command (iproute2) is not installed".into());
    }
    // Root without CAP_SYS_ADMIN (some containers) cannot make namespaces.
    let probe = format!("{PREFIX}probe-{}", unique_tag());
    if let Err(e) = ip_try(&["netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace here: {e}"));
    }
    let _ = ip_try(&["netns", "del", &probe]);
    None
}
