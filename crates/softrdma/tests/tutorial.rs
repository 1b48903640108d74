//! docs/tutorial.md is tested: every ```console block is run, command by
//! command (the lines that start with `$ `), in one bash session from the
//! workspace root (so `export`s carry over, as for a reader typing them),
//! and each command's output (stdout and stderr) is compared with the
//! lines the page shows under it.
//!
//! The comparison: whitespace runs count as one space, and every number —
//! decimal, with a fraction, hex `0x…`, or a hex group that starts with a
//! digit (`7f00:12b6` in a GUID) — matches any number, so timings,
//! keys, QPNs, PSNs, ports and counts may vary; every word, field name,
//! status and line may not. A line `...` on the page stands for any number
//! of lines (headers perftest prints, say). Each command must exit 0.
//!
//! The page's commands use `cargo run -q --release` for the examples and
//! `$T/softrdma` (T is the target's release directory) for the tools; the
//! test sets CARGO_TARGET_DIR to its own target directory and builds the
//! command-line tool and the drop-in libibverbs first (a `cargo test
//! --workspace --release` has built them already). The drop-in commands
//! need perftest and ibverbs-utils: without them the test fails under
//! SOFTRDMA_STRICT_TESTS and skips otherwise, saying so.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One command of the page and the output it shows.
struct Step {
    line: usize,
    cmd: String,
    want: Vec<String>,
}

fn steps(page: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut pending: Option<Step> = None;
    let lines: Vec<&str> = page.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if !in_block {
            in_block = l.trim_end() == "```console";
            continue;
        }
        if l.trim_end() == "```" {
            in_block = false;
            out.extend(pending.take());
            continue;
        }
        if let Some(c) = l.strip_prefix("$ ") {
            out.extend(pending.take());
            let mut cmd = c.to_string();
            let start = i;
            while cmd.ends_with('\\') && i < lines.len() {
                cmd.pop();
                cmd.push_str(lines[i].trim_start());
                i += 1;
            }
            pending = Some(Step {
                line: start,
                cmd,
                want: Vec::new(),
            });
        } else if let Some(s) = pending.as_mut() {
            s.want.push(l.to_string());
        }
    }
    out
}

/// A line with whitespace collapsed and numbers replaced by `#`.
fn normalize(l: &str) -> String {
    let mut out = String::new();
    let b: Vec<char> = l.chars().collect();
    let mut i = 0;
    let mut prev_alnum = false;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            while i < b.len() && b[i].is_whitespace() {
                i += 1;
            }
            if !out.is_empty() && i < b.len() {
                out.push(' ');
            }
            prev_alnum = false;
            continue;
        }
        // A minus sign belongs to the number after it.
        if c == '-' && !prev_alnum && b.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() && !prev_alnum {
            if c == '0' && b.get(i + 1) == Some(&'x') {
                i += 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
            } else {
                // Digits, hex letters (GUID and GID groups like `12b6`),
                // and a fraction.
                while i < b.len()
                    && (b[i].is_ascii_hexdigit()
                        || b[i] == '.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
                {
                    i += 1;
                }
            }
            out.push('#');
            prev_alnum = false;
            continue;
        }
        prev_alnum = c.is_alphanumeric() || c == '_';
        out.push(c);
        i += 1;
    }
    out
}

/// Whether `got` matches `want` (with `...` lines as wildcards).
fn matches(want: &[String], got: &[String]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((w, rest)) if w.trim() == "..." => (0..=got.len()).any(|k| matches(rest, &got[k..])),
        Some((w, rest)) => match got.split_first() {
            Some((g, grest)) => normalize(w) == normalize(g) && matches(rest, grest),
            None => false,
        },
    }
}

fn trimmed(mut v: Vec<String>) -> Vec<String> {
    while v.last().is_some_and(|l| l.trim().is_empty()) {
        v.pop();
    }
    v
}

fn target_dir() -> PathBuf {
    // <target>/<profile>/deps/tutorial-<hash>
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .expect("target directory")
        .to_path_buf()
}

fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
            "an outside tool or file this test needs is missing ({tool}), and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
        );
        eprintln!("SKIPPED: {tool} is not installed (Debian: perftest, ibverbs-utils)");
    }
    ok
}

const MARK: &str = "@@tutorial-step-done";

#[test]
fn tutorial_commands_show_what_the_page_shows() {
    if !(have("ib_write_bw") && have("ib_write_lat") && have("ibv_devinfo")) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/tutorial.md")).expect("docs/tutorial.md");
    let steps = steps(&page);
    assert!(steps.len() >= 10, "only {} commands found", steps.len());
    let target = target_dir();
    // The tools the page runs, built as the workspace test run builds them.
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "softrdma-cli",
            "-p",
            "softrdma-ibverbs",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&root)
        .status()
        .expect("cargo build runs");
    assert!(st.success(), "building the tools failed");

    let mut sh = Command::new("bash")
        .args(["--noprofile", "--norc"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("SOFTRDMA_DEVICES")
        .env_remove("SOFTRDMA_FAULT")
        .env_remove("SOFTRDMA_CAPTURE")
        .env_remove("SOFTRDMA_TRANSPORT")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("bash starts");
    let mut stdin = sh.stdin.take().unwrap();
    let stdout = sh.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    writeln!(stdin, "exec 2>&1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut failures = Vec::new();
    for s in &steps {
        writeln!(stdin, "{}\nprintf '\\n{MARK} %d\\n' $?", s.cmd).unwrap();
        stdin.flush().unwrap();
        let mut got = Vec::new();
        let code = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_secs(120))) {
                Ok(l) => match l.strip_prefix(MARK) {
                    Some(c) => break c.trim().parse::<i32>().unwrap_or(-1),
                    None => got.push(l),
                },
                Err(_) => {
                    let _ = sh.kill();
                    panic!(
                        "docs/tutorial.md line {}: `{}` did not finish; output so far:\n{}",
                        s.line,
                        s.cmd,
                        got.join("\n")
                    );
                }
            }
        };
        let (want, got) = (trimmed(s.want.clone()), trimmed(got));
        if code != 0 || !matches(&want, &got) {
            failures.push(format!(
                "docs/tutorial.md line {}: `{}` exit {code}\n--- the page shows:\n{}\n--- it printed:\n{}",
                s.line,
                s.cmd,
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    drop(stdin);
    let _ = sh.wait();
    let _ = reader.join();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_matcher_lets_numbers_vary_and_nothing_else() {
    let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(matches(
        &w(&["QP 0x3a8486: Rts", "...", " 65536   1000   9.87"]),
        &w(&["QP 0x11: Rts", "a", "b", "65536 2000 10.1"])
    ));
    assert!(!matches(&w(&["QP 0x1: Rts"]), &w(&["QP 0x1: Err"])));
    assert!(!matches(
        &w(&["WRITE: Success"]),
        &w(&["WRITE: Success", "extra"])
    ));
    assert!(matches(&w(&["srx0 up 9.7s"]), &w(&["srx0 up 12.25s"])));
    assert!(matches(&w(&["lost -58%"]), &w(&["lost 5%"])));
    assert!(!matches(&w(&["a -> b"]), &w(&["a - b"])));
    assert!(!matches(&w(&["srx0"]), &w(&["srx1x"])));
    assert_eq!(normalize("rkey=0x6226e0e2 psn=11689084"), "rkey=# psn=#");
    assert_eq!(
        normalize("0250:56ff:7f00:12b6"),
        normalize("0250:56ff:7f00:02a1")
    );
}
