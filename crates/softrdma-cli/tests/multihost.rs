//! docs/multihost.md, command for command, on two "hosts" made of network
//! namespaces joined by a veth pair (MTU 1500): every line of the doc's
//! `host-a` and `host-b` blocks runs in its namespace, with the device
//! given by `--device` only (SOFTRDMA_DEVICES and the other device
//! variables are removed from the environment). Lines with `--server` run
//! in the background; each must exit 0. The client's report must show
//! both hosts' GIDs and the UDP path; a loopback device facing the remote
//! client must fail with the doc's message.
//!
//! Needs root and iproute2; skipped (saying why) otherwise, which fails
//! under SOFTRDMA_STRICT_TESTS (CI).

#[path = "../../softrdma/tests/common/netns.rs"]
mod netns;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use netns::{netns_unavailable, Netns};

const DOC: &str = include_str!("../../../docs/multihost.md");
/// The addresses the doc gives host A and host B.
const HOST_A: &str = "10.0.0.1";
const HOST_B: &str = "10.0.0.2";

fn skip(why: &str) {
    assert!(
        std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
        "multihost cannot run ({why}), and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
    );
    eprintln!("SKIPPED multihost: {why}");
    println!("SKIPPED multihost: {why}");
}

/// The doc's steps: each a (host, lines) block, in the doc's order.
fn steps(doc: &str) -> Vec<(char, Vec<String>)> {
    let mut v = Vec::new();
    let mut cur: Option<(char, Vec<String>)> = None;
    for line in doc.lines() {
        match (&mut cur, line.trim_end()) {
            (None, "```sh host-a") => cur = Some(('a', Vec::new())),
            (None, "```sh host-b") => cur = Some(('b', Vec::new())),
            (Some(_), "```") => v.push(cur.take().unwrap()),
            (Some((_, lines)), l) if !l.trim().is_empty() => lines.push(l.trim().to_string()),
            _ => {}
        }
    }
    assert!(cur.is_none(), "an unclosed host block in docs/multihost.md");
    v
}

/// A running command whose output is collected.
struct Proc {
    what: String,
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

impl Proc {
    fn start(ns: &Netns, host: usize, run_dir: &Path, line: &str) -> Proc {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words[0], "softrdma",
            "a doc line that is not softrdma: {line}"
        );
        let mut c = ns.exec(host, env!("CARGO_BIN_EXE_softrdma"));
        c.args(&words[1..]);
        for v in [
            "SOFTRDMA_DEVICES",
            "SOFTRDMA_FAULT",
            "SOFTRDMA_CAPTURE",
            "SOFTRDMA_TRANSPORT",
        ] {
            c.env_remove(v);
        }
        // Two hosts have two /tmp: no shared-memory path between them.
        c.env("SOFTRDMA_RUN_DIR", run_dir);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("start ip netns exec softrdma");
        let out = reader(child.stdout.take().unwrap());
        let err = reader(child.stderr.take().unwrap());
        Proc {
            what: format!("host {}: {line}", if host == 0 { 'A' } else { 'B' }),
            child: Some(child),
            out: Some(out),
            err: Some(err),
        }
    }

    /// Waits (bounded) for the exit; returns (exit code, stdout, stderr).
    fn finish(mut self, limit: Duration) -> (i32, String, String) {
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not finish in {limit:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (
            status.code().unwrap_or(-1),
            self.out.take().unwrap().join().unwrap(),
            self.err.take().unwrap().join().unwrap(),
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// perftest's GID text of an IPv4 address (`…:255:255:10:00:00:01`).
fn gid_text(ip: &str) -> String {
    let o: Vec<String> = ip
        .split('.')
        .map(|b| format!("{:02}", b.parse::<u8>().unwrap()))
        .collect();
    format!("255:255:{}", o.join(":"))
}

struct Dirs(Vec<PathBuf>);
impl Drop for Dirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn two_hosts_follow_docs_multihost_md() {
    if let Some(why) = netns_unavailable() {
        return skip(&why);
    }
    let steps = steps(DOC);
    assert!(
        steps.len() >= 4 && steps.iter().any(|s| s.0 == 'a') && steps.iter().any(|s| s.0 == 'b'),
        "docs/multihost.md has host-a and host-b blocks: {steps:?}"
    );
    let ns = Netns::new("host", &["a", "b"]);
    ns.veth(0, 1, 1500, &format!("{HOST_A}/24"), &format!("{HOST_B}/24"));
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("multihost-{}", std::process::id()));
    let dirs = Dirs(vec![base.join("a"), base.join("b")]);
    for d in &dirs.0 {
        std::fs::create_dir_all(d).unwrap();
    }

    let limit = Duration::from_secs(120);
    let mut servers: Vec<Proc> = Vec::new();
    let mut ran = 0;
    let mut client_reports = Vec::new();
    for (host, lines) in &steps {
        let h = if *host == 'a' { 0 } else { 1 };
        for line in lines {
            let p = Proc::start(&ns, h, &dirs.0[h], line);
            ran += 1;
            if line.contains("--server") {
                servers.push(p);
                continue;
            }
            let what = p.what.clone();
            let (code, out, err) = p.finish(limit);
            eprintln!("--- {what}\n{out}{err}");
            assert_eq!(code, 0, "{what} failed:\n{out}\n{err}");
            if line.contains(" perf ") {
                client_reports.push((line.clone(), out));
                // The client is done: so must its server be, cleanly.
                for s in servers.drain(..) {
                    let what = s.what.clone();
                    let (code, out, err) = s.finish(Duration::from_secs(30));
                    eprintln!("--- {what}\n{out}{err}");
                    assert_eq!(code, 0, "{what} failed:\n{out}\n{err}");
                }
            }
        }
    }
    assert!(servers.is_empty(), "a server line with no client after it");
    assert!(client_reports.len() >= 2, "the doc runs two client tests");
    for (line, out) in &client_reports {
        let gids: Vec<&str> = out.lines().filter(|l| l.starts_with(" GID:")).collect();
        assert!(
            gids.len() == 2
                && gids[0].ends_with(&gid_text(HOST_B))
                && gids[1].ends_with(&gid_text(HOST_A)),
            "{line}: the client's local GID is host B's and the remote one host A's:\n{out}"
        );
        assert!(out.contains(" Path used       : udp"), "{line}:\n{out}");
        assert!(
            out.contains(" Mtu             : 1024[B]"),
            "{line}: MTU 1024 on a 1500-byte veth:\n{out}"
        );
    }
    eprintln!("multihost: {ran} doc lines ran on two namespace hosts");

    // A loopback device facing a remote client: the doc's error.
    let server = Proc::start(
        &ns,
        0,
        &dirs.0[0],
        "softrdma --device srx0=127.0.0.1 perf write_lat --server",
    );
    let client = Proc::start(
        &ns,
        1,
        &dirs.0[1],
        &format!("softrdma --device srx0={HOST_B} perf write_lat -n 100 {HOST_A}"),
    );
    let (ccode, cout, cerr) = client.finish(limit);
    let (scode, sout, serr) = server.finish(Duration::from_secs(30));
    let want = format!(
        "device srx0 is on 127.0.0.1:4791, a loopback address, but the peer {HOST_B} is on another host: it could not reach that GID. Give the address of this host that {HOST_B} reaches: --device srx0={HOST_A}"
    );
    assert!(
        scode != 0 && serr.contains(&want),
        "the server refuses to advertise a loopback GID:\n{sout}\n{serr}"
    );
    assert!(
        DOC.contains(&want),
        "docs/multihost.md shows the message as it is: {want}"
    );
    assert!(
        ccode != 0 && cerr.contains("the other side failed") && cerr.contains("loopback address"),
        "the client reports the server's refusal:\n{cout}\n{cerr}"
    );
}
