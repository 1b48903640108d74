//! rdma-core's own verbs test suite on the drop-in library.
//!
//! Debian's `python3-pyverbs` ships rdma-core's Python bindings (pyverbs,
//! a Cython layer over libibverbs) and, under /usr/share/doc/rdma-core/tests,
//! the test suite rdma-core runs on every provider. Here it runs unmodified
//! on this library (LD_LIBRARY_PATH), over UDP and over the same-host
//! (shared-memory) transport, without its vendor modules (mlx5, efa, cuda):
//! `tests/pyverbs/runner.py` runs the whole suite in one Python process,
//! gives each test a deadline (a hang ends the process, and the runner
//! starts again after the test that hung), and reports every test on one
//! line, which this test parses.
//!
//! Every test must pass or skip: a failure, an error or a hang fails this
//! test, unless it is in [`KNOWN_FAILURES`], whose entries must still fail
//! (so fixing one forces its removal). Every skip must be accounted for in
//! docs/ibverbs.md ("rdma-core's test suite"): the test's class or the test
//! itself is named there with the reason.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const PYTHON: &str = "/usr/bin/python3";
const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Seconds one test may take before it counts as a hang (the suite's
/// tests take well under a second each here; a loaded 2-core machine
/// gets a wide margin).
const TEST_TIMEOUT_S: u32 = 60;

/// Tests that fail today, with why; each must still fail on every
/// transport. Empty is the goal.
const KNOWN_FAILURES: &[(&str, &str)] = &[];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    Skip(String),
    Fail(String),
    Error(String),
    Hang,
    /// expectedFailure / unexpected success: the suite marks none; either
    /// counts as a failure here.
    Other(String),
}

impl Outcome {
    fn failed(&self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Skip(_))
    }
}

/// The installed suite, or why it cannot run (python3-pyverbs missing).
fn suite() -> Option<&'static Path> {
    let ok = Path::new(SUITE).join("run_tests.py").is_file()
        && Command::new(PYTHON)
            .args(["-c", "import pyverbs.device"])
            .output()
            .is_ok_and(|o| o.status.success());
    if ok {
        return Some(Path::new(SUITE));
    }
    assert!(
        std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
        "rdma-core's test suite ({SUITE}, pyverbs for {PYTHON}) is missing, and \
         SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
    );
    eprintln!("SKIPPED: rdma-core's test suite is not installed (Debian: apt-get install python3-pyverbs)");
    None
}

fn runner() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyverbs/runner.py")
}

/// Runs the whole suite on `transport`: test id → outcome, in the suite's
/// order, and the runner's stderr of the rounds that hung.
fn run_suite(suite: &Path, transport: &str) -> (BTreeMap<String, Outcome>, String) {
    let work = std::env::temp_dir().join(format!(
        "softrdma-pyverbs-{}-{transport}",
        std::process::id()
    ));
    std::fs::create_dir_all(&work).expect("work dir");
    let mut results = BTreeMap::new();
    let mut hung_logs = String::new();
    let mut after: Option<String> = None;
    // Each round ends at DONE or at a hang; a hang restarts after the test
    // that hung. Bounded: no more rounds than there can be hangs.
    for _round in 0..20 {
        let mut c = softrdma_cmd(PYTHON, &[], Load::LibraryPath, transport);
        c.arg(runner())
            .arg(suite)
            .arg(&work)
            .arg(TEST_TIMEOUT_S.to_string())
            // The suite's own RDMA device choice: the first, srx0.
            .env_remove("PYTHONPATH")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if let Some(a) = &after {
            c.args(["--after", a]);
        }
        let out = run(c, Duration::from_secs(600));
        let mut started: Option<String> = None;
        let mut done = false;
        for line in out.stdout.lines() {
            let mut w = line.splitn(4, ' ');
            match (w.next(), w.next(), w.next()) {
                (Some("START"), Some(id), _) => started = Some(id.to_string()),
                (Some("RESULT"), Some(id), Some(kind)) => {
                    let why = w.next().unwrap_or("").to_string();
                    let o = match kind {
                        "ok" => Outcome::Ok,
                        "skip" => Outcome::Skip(why),
                        "fail" => Outcome::Fail(why),
                        "error" => Outcome::Error(why),
                        k => Outcome::Other(format!("{k} {why}")),
                    };
                    // A test with a failing subtest reports it before
                    // its own outcome: the first failure stands.
                    let e = results.entry(id.to_string()).or_insert(o.clone());
                    if !e.failed() {
                        *e = o;
                    }
                    started = None;
                }
                (Some("DONE"), _, _) => done = true,
                _ => {}
            }
        }
        if done {
            return (results, hung_logs);
        }
        let Some(hung) = started else {
            panic!(
                "{transport}: the suite's runner ended before its first test or between tests \
                 (code {:?}, timed out {})\n---- stdout\n{}\n---- stderr\n{}",
                out.code, out.timed_out, out.stdout, out.stderr
            );
        };
        hung_logs.push_str(&format!(
            "---- {transport}: {hung} hung; the runner's last output:\n{}\n",
            tail(&out.stderr, 40)
        ));
        results.insert(hung.clone(), Outcome::Hang);
        after = Some(hung);
    }
    panic!("{transport}: too many hangs\n{hung_logs}");
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The docs' section that accounts for every skip.
fn skip_doc() -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ibverbs.md"),
    )
    .expect("docs/ibverbs.md");
    let start = doc
        .find("## rdma-core's test suite")
        .expect("docs/ibverbs.md has a section \"## rdma-core's test suite\"");
    let rest = &doc[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |e| e);
    rest[..end].to_string()
}

/// `tests.test_mr.MWTest.test_mw_type1` is accounted for when the docs name
/// `test_mr.MWTest` or `test_mr.MWTest.test_mw_type1` (in backquotes).
fn documented(doc: &str, id: &str) -> bool {
    let id = id.strip_prefix("tests.").unwrap_or(id);
    let class = id.rsplit_once('.').map_or(id, |(c, _)| c);
    doc.contains(&format!("`{id}`")) || doc.contains(&format!("`{class}`"))
}

/// A process forked from one that has the device open gets a soft HCA of
/// its own (`tests/pyverbs/fork_child.py`): the parent's HCA has no
/// progress thread in the child, and its locks may be held by parent
/// threads that do not exist there. A child that used it hung in
/// `ibv_query_device_ex` (the suite's rdma_cm tests fork, once in CI).
/// Over UDP and the same-host path, 20 children each.
#[test]
fn a_forked_child_opens_its_own_hca() {
    if suite().is_none() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyverbs/fork_child.py");
    for transport in ["udp", "shm"] {
        let mut c = softrdma_cmd(PYTHON, &[], Load::LibraryPath, transport);
        c.arg(&script).args(["srx0", "20"]);
        let o = run(c, Duration::from_secs(120));
        assert!(
            o.ok && o.stdout.contains("ALL OK") && !o.stdout.contains("FAIL"),
            "{transport}: code {:?}, timed out {}\n---- stdout\n{}\n---- stderr\n{}",
            o.code,
            o.timed_out,
            o.stdout,
            o.stderr
        );
        let children = o
            .stdout
            .lines()
            .filter(|l| l.starts_with("ok child"))
            .count();
        assert_eq!(children, 20, "{transport}: {}", o.stdout);
    }
}

#[test]
fn rdma_core_test_suite() {
    let Some(suite) = suite() else { return };
    let _g = serial();
    let doc = skip_doc();
    let mut problems = Vec::new();
    let mut by_transport = Vec::new();
    for transport in ["udp", "shm"] {
        let (results, hung_logs) = run_suite(suite, transport);
        let count = |f: fn(&Outcome) -> bool| results.values().filter(|o| f(o)).count();
        let (ok, skip) = (
            count(|o| *o == Outcome::Ok),
            count(|o| matches!(o, Outcome::Skip(_))),
        );
        let (fail, error, hang) = (
            count(|o| matches!(o, Outcome::Fail(_) | Outcome::Other(_))),
            count(|o| matches!(o, Outcome::Error(_))),
            count(|o| *o == Outcome::Hang),
        );
        eprintln!(
            "pyverbs over {transport}: {} tests: {ok} passed, {fail} failed, {error} errors, \
             {hang} hung, {skip} skipped",
            results.len()
        );
        for (id, o) in &results {
            match o {
                Outcome::Ok => {}
                Outcome::Skip(why) => {
                    eprintln!("  skip  {id}: {why}");
                    if !documented(&doc, id) {
                        problems.push(format!(
                            "{transport}: {id} skips ({why}) but docs/ibverbs.md's \
                             \"rdma-core's test suite\" section does not account for it"
                        ));
                    }
                }
                o => {
                    eprintln!("  FAIL  {id}: {o:?}");
                    if !KNOWN_FAILURES.iter().any(|(k, _)| k == id) {
                        problems.push(format!("{transport}: {id}: {o:?}"));
                    }
                }
            }
        }
        for (id, why) in KNOWN_FAILURES {
            match results.get(*id) {
                Some(o) if o.failed() => {}
                o => problems.push(format!(
                    "{transport}: {id} is a known failure ({why}) but now gives {o:?}: \
                     take it off KNOWN_FAILURES"
                )),
            }
        }
        if !hung_logs.is_empty() {
            eprintln!("{hung_logs}");
        }
        by_transport.push((transport, results.len(), ok));
    }
    for (t, n, ok) in &by_transport {
        assert!(
            *ok > 0 && *n > 100,
            "{t}: only {n} tests ran, {ok} passed: the suite did not really run"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
