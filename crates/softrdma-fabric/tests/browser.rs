//! The HTML report (`softrdma fabric --report FILE`, src/html.rs) opened
//! in a real browser: headless Chromium loads a written report, dumps its
//! DOM and takes a screenshot, and the test checks that nothing the report
//! holds was dropped or left undrawn.
//!
//! Needs Debian's chromium-headless-shell (or chromium); SOFTRDMA_BROWSER
//! names another binary. Without one the test says so and passes, unless
//! SOFTRDMA_STRICT_TESTS is set (CI), where it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use softrdma_fabric::{report::run_with, Report, Scenario};

/// The bound on one browser run (each took 0.24–1.14 s here).
const TIMEOUT: Duration = Duration::from_secs(120);
/// The screenshot's viewport.
const WIDTH: u32 = 1200;
const HEIGHT: u32 = 3000;

fn missing(what: &str) {
    assert!(
        std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
        "{what}, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
    );
    eprintln!("skipping: {what}");
}

/// What a bounded run of the browser left.
struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
    took: Duration,
}

/// The live (not zombie) processes of process group `pgid`, with their
/// command lines.
fn group_members(pgid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            out.push(format!("{} {}", e.file_name().to_string_lossy(), cmd));
        }
    }
    out
}

fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Runs `browser args` in a process group of its own with stdout and
/// stderr in files under `dir`, killing the group after TIMEOUT; then
/// waits (10 s at most) for every process it started to be gone.
fn run_bounded(browser: &Path, args: &[String], dir: &Path, name: &str) -> Result<Run, String> {
    let (out, err) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let t0 = Instant::now();
    let mut child = Command::new(browser)
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{}: {e}", browser.display()))?;
    let pgid = child.id();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > TIMEOUT {
            kill_group(pgid);
            let _ = child.wait();
            return Err(format!(
                "{} {name} did not finish in {TIMEOUT:?} (killed; output in {})",
                browser.display(),
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    // Chromium's zygotes and helpers end shortly after the browser.
    let t1 = Instant::now();
    loop {
        let left = group_members(pgid);
        if left.is_empty() {
            break;
        }
        if t1.elapsed() > Duration::from_secs(10) {
            kill_group(pgid);
            return Err(format!(
                "{name}: the browser left processes running 10 s after it exited \
                 (killed): {left:#?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Run {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: String::from_utf8_lossy(&std::fs::read(&err).unwrap()).into_owned(),
        took,
    })
}

/// The browser: SOFTRDMA_BROWSER if set, else chromium-headless-shell or
/// chromium on PATH, else Debian's chromium-headless-shell binary; the
/// first that answers `--version`.
fn browser(dir: &Path) -> Result<(PathBuf, String), String> {
    let named = std::env::var_os("SOFTRDMA_BROWSER").map(PathBuf::from);
    let candidates: Vec<PathBuf> = match &named {
        Some(b) => vec![b.clone()],
        None => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut c = Vec::new();
            for name in ["chromium-headless-shell", "chromium"] {
                c.extend(std::env::split_paths(&path).map(|d| d.join(name)));
            }
            c.push("/usr/lib/chromium/chromium-headless-shell".into());
            c
        }
    };
    let mut failed = Vec::new();
    for b in candidates.into_iter().filter(|b| b.is_file()) {
        match run_bounded(&b, &["--version".into()], dir, "version") {
            Ok(r) if r.status.success() => {
                return Ok((b, String::from_utf8_lossy(&r.stdout).trim().to_string()))
            }
            Ok(r) => failed.push(format!("{}: --version {}", b.display(), r.status)),
            Err(e) => failed.push(e),
        }
    }
    let failed = if failed.is_empty() {
        "no such file".to_string()
    } else {
        failed.join("; ")
    };
    Err(match named {
        Some(b) => format!(
            "the browser SOFTRDMA_BROWSER names ({}) cannot run ({failed})",
            b.display()
        ),
        None => format!(
            "no headless browser: neither chromium-headless-shell nor chromium runs ({failed}; \
             Debian: apt-get install chromium-headless-shell; or set SOFTRDMA_BROWSER)"
        ),
    })
}

/// Headless, as root (no sandbox), no GPU, a profile of its own, the
/// page's console on stderr.
fn browser_args(dir: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--user-data-dir={}", dir.join("profile").display())])
    .collect()
}

fn file_url(p: &Path) -> String {
    let s = p.display().to_string();
    let s = s
        .replace('%', "%25")
        .replace(' ', "%20")
        .replace('#', "%23");
    format!("file://{}", s.replace('?', "%3F"))
}

/// How often each element name opens in `html` (`<svg`, `<table`, ...).
fn tags(html: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    let b = html.as_bytes();
    for (i, _) in html.match_indices('<') {
        let name: String = b[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'-')
            .map(|&c| c as char)
            .collect();
        if name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            *m.entry(name).or_insert(0) += 1;
        }
    }
    m
}

/// The page's console messages and uncaught errors in the browser's log.
fn console(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect()
}

/// The loss sweep of validation.rs's html test (a small training step on
/// two link layers, three loss rates each), with switch queues sampled
/// every 10 µs so that every kind of plot is in the report.
fn loss_sweep() -> Vec<Report> {
    let mut reports = Vec::new();
    for kind in ["pfc", "ib_credit"] {
        for q in [0.0, 0.001, 0.01] {
            let json = format!(
                r#"{{"name":"{kind} {q}","topology":{{"tiers":2,"k":4,"link_gbps":100}},
                    "link_layer":{{"kind":"{kind}","loss":{{"rate":{q}}}}},
                    "workload":{{"kind":"training","steps":2,"compute_us":50,
                                 "gradient_bytes":262144,"algorithm":"halving_doubling"}}}}"#
            );
            let s = Scenario::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
            let r = run_with(&s, 10).unwrap();
            assert!(r.completed, "did not complete:\n{}", r.summary());
            reports.push(r);
        }
    }
    reports
}

/// The screenshot's pixels as RGB, after checking the signature and
/// IHDR's size by hand.
fn rgb_pixels(png_bytes: &[u8]) -> Vec<[u8; 3]> {
    assert!(
        png_bytes.len() > 33 && png_bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG"
    );
    assert_eq!(&png_bytes[12..16], b"IHDR", "the first chunk is IHDR");
    let be = |i: usize| u32::from_be_bytes(png_bytes[i..i + 4].try_into().unwrap());
    assert_eq!((be(16), be(20)), (WIDTH, HEIGHT), "IHDR width, height");
    let mut d = png::Decoder::new(std::io::Cursor::new(png_bytes));
    d.set_transformations(png::Transformations::normalize_to_color8());
    let mut r = d.read_info().expect("a decodable PNG");
    let mut buf = vec![0; r.output_buffer_size().expect("a sane size")];
    let info = r.next_frame(&mut buf).expect("a decodable PNG");
    assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
    let n = info.color_type.samples();
    buf[..info.buffer_size()]
        .chunks_exact(n)
        .map(|p| match n {
            1 | 2 => [p[0]; 3],
            _ => [p[0], p[1], p[2]],
        })
        .collect()
}

#[test]
fn html_report_renders_in_a_headless_browser() {
    let dir = std::env::temp_dir().join(format!("softrdma-fabric-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (browser, version) = match browser(&dir) {
        Ok(b) => b,
        Err(why) => {
            let _ = std::fs::remove_dir_all(&dir);
            return missing(&why);
        }
    };
    eprintln!("browser: {} ({version})", browser.display());
    let args = browser_args(&dir);
    let t0 = Instant::now();

    // The console check below is not vacuous: this browser reports a
    // page's console messages in its log, and --dump-dom shows the DOM
    // after the page's scripts ran.
    let canary = dir.join("canary.html");
    std::fs::write(
        &canary,
        "<!DOCTYPE html><html><body><p>canary</p><script>\
         document.body.setAttribute('data-ran','yes');console.error('softrdma-canary')\
         </script></body></html>",
    )
    .unwrap();
    let mut a = args.clone();
    a.extend(["--dump-dom".into(), file_url(&canary)]);
    let c = run_bounded(&browser, &a, &dir, "canary").unwrap_or_else(|e| panic!("{e}"));
    assert!(c.status.success(), "canary: {}\n{}", c.status, c.stderr);
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("data-ran=\"yes\""),
        "--dump-dom shows the DOM after scripts"
    );
    assert!(
        console(&c.stderr)
            .iter()
            .any(|l| l.contains("softrdma-canary")),
        "the browser's log carries the page's console:\n{}",
        c.stderr
    );

    let reports = loss_sweep();
    let html = softrdma_fabric::html::html(&reports);
    let page = dir.join("report.html");
    std::fs::write(&page, &html).unwrap();
    // No script: the DOM the browser builds is the parsed source (a
    // script added to the report needs its effect checked here).
    assert!(!html.contains("<script"));
    let src = tags(&html);
    assert_eq!(
        src["table"],
        1 + reports.len(),
        "the scenarios' table, and one of links per scenario"
    );
    assert!(src["svg"] >= 2 + 2 * reports.len(), "{src:?}");
    assert_eq!(src["svg"], html.matches("</svg>").count());

    // The DOM the browser parsed: every element of the source is
    // there (a parse error drops or moves elements); the parser's only
    // addition is each table's implied <tbody>.
    let mut a = args.clone();
    a.extend(["--dump-dom".into(), file_url(&page)]);
    let d = run_bounded(&browser, &a, &dir, "dom").unwrap_or_else(|e| panic!("{e}"));
    assert!(d.status.success(), "--dump-dom: {}\n{}", d.status, d.stderr);
    let dom = String::from_utf8(d.stdout).expect("UTF-8 DOM");
    assert!(dom.starts_with("<!DOCTYPE html>") && dom.contains("</html>"));
    let got = tags(&dom);
    for (tag, n) in &src {
        assert_eq!(got.get(tag), Some(n), "<{tag}> in the source and the DOM");
    }
    let extra: BTreeSet<_> = got.keys().filter(|t| !src.contains_key(*t)).collect();
    assert_eq!(extra, BTreeSet::from([&"tbody".to_string()]), "{got:?}");
    assert_eq!(got["tbody"], src["table"]);
    assert_eq!(dom.matches("</svg>").count(), src["svg"]);
    assert_eq!(
        dom.matches("<svg width=\"720\" height=\"380\"").count(),
        src["svg"],
        "every plot keeps its size"
    );
    for r in &reports {
        assert!(
            dom.contains(&format!(">{}</td>", r.name)),
            "row of {}",
            r.name
        );
        assert!(
            dom.contains(&format!("<h2>{}</h2>", r.name)),
            "section of {}",
            r.name
        );
    }
    for title in [
        "Step time against loss per link",
        "Message completion times",
        "Goodput reaching the hosts over time",
        "Switch queues over time",
        "Time of each step",
    ] {
        assert!(dom.contains(title), "plot {title}");
    }
    assert!(
        dom.contains("ib_credit go-back-n halving_doubling"),
        "a series per link layer"
    );
    assert!(
        console(&d.stderr).is_empty(),
        "console: {:#?}",
        console(&d.stderr)
    );

    // The screenshot: a PNG of the requested size, drawn: the table's
    // header cells in their #eee (the stylesheet applied), and the plots'
    // first two series colours (the step-time plot's ib_credit and pfc
    // lines, the queue plot's two).
    let shot = dir.join("report.png");
    let mut a = args.clone();
    a.extend([
        format!("--screenshot={}", shot.display()),
        format!("--window-size={WIDTH},{HEIGHT}"),
        file_url(&page),
    ]);
    let s = run_bounded(&browser, &a, &dir, "screenshot").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        s.status.success(),
        "--screenshot: {}\n{}",
        s.status,
        s.stderr
    );
    assert!(
        console(&s.stderr).is_empty(),
        "console: {:#?}",
        console(&s.stderr)
    );
    let bytes = std::fs::read(&shot).expect("the screenshot was written");
    let px = rgb_pixels(&bytes);
    let count = |c: [u8; 3]| px.iter().filter(|&&p| p == c).count();
    let white = count([255, 255, 255]);
    let colours: BTreeSet<[u8; 3]> = px.iter().copied().collect();
    let (header, blue, red) = (
        count([0xee, 0xee, 0xee]),
        count([31, 119, 180]),
        count([214, 39, 40]),
    );
    eprintln!(
        "canary {:?}, DOM {:?}, screenshot {:?} ({} B): {} tags, {} <svg>, {} <table>; \
         {} colours, {:.1} % not white, header {header} px, series blue {blue} px, red {red} px",
        c.took,
        d.took,
        s.took,
        bytes.len(),
        src.values().sum::<usize>(),
        src["svg"],
        src["table"],
        colours.len(),
        100.0 * (px.len() - white) as f64 / px.len() as f64,
    );
    assert!(colours.len() > 16, "not blank: {} colours", colours.len());
    assert!(
        px.len() - white > px.len() / 100,
        "not blank: {white} white pixels"
    );
    assert!(header > 1000, "the table's header, {header} px of #eee");
    assert!(blue > 200 && red > 200, "plotted series: {blue}, {red} px");
    eprintln!("three browser runs and the sweep: {:?}", t0.elapsed());
    std::fs::remove_dir_all(&dir).unwrap();
}
