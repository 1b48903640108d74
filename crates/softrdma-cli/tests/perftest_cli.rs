//! `softrdma perf` with perftest's command lines as scripts write them:
//! the common options of `ib_write_lat --help` / `ib_write_bw --help`,
//! perftest's defaults and clamping, options with no meaning accepted and
//! named as ignored; and the error messages of bad options, each naming
//! the value and what to do. Runs are serialised (each keeps two
//! processes busy).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{one_at_a_time, perf_rows as rows, softrdma_bounded, Run};

/// Runs `softrdma ARGS` (split on spaces), one at a time, killing it
/// after 90 s.
fn run(line: &str) -> Run {
    softrdma_bounded(&line.split_whitespace().collect::<Vec<_>>())
}

fn ok(line: &str) -> Run {
    let r = run(line);
    assert_eq!(
        r.code, 0,
        "softrdma {line}\nstdout:\n{}\nstderr:\n{}",
        r.stdout, r.stderr
    );
    r
}

/// `--output` prints one number per size, perftest's `%lf`, and nothing else.
fn one_number(r: &Run) -> f64 {
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{}", r.stdout);
    let (int, frac) = lines[0]
        .split_once('.')
        .unwrap_or_else(|| panic!("{:?}", lines[0]));
    assert!(
        frac.len() == 6 && int.bytes().all(|b| b.is_ascii_digit()),
        "%lf: {:?}",
        lines[0]
    );
    lines[0].parse().unwrap()
}

#[test]
fn ib_write_bw_common_options_with_output() {
    // The command line of the issue, word for word.
    let r =
        ok("perf write_bw -x 0 -m 1024 -b -F --report_gbits -s 65536 -n 1000 --output=bandwidth");
    let gbits = one_number(&r);
    // Both directions, in Gb/s: more than nothing, less than 10 times
    // what one host's memory moves (a MB/s figure would be ~1000 times more).
    assert!(gbits > 0.0 && gbits < 2000.0, "{gbits}");
    let r = ok("perf write_bw -x 0 -m 1024 -b -F -s 65536 -n 1000 --output=bandwidth");
    let mbytes = one_number(&r);
    let ratio = mbytes / (gbits * 1e9 / 8.0 / (1u64 << 20) as f64);
    assert!(
        ratio > 0.1 && ratio < 10.0,
        "-b in MB/s ({mbytes}) and in Gb/s ({gbits}) are the same order: {ratio}"
    );
    assert!(
        r.stderr.contains("ignoring -F/--CPU-freq"),
        "-F is named as ignored: {}",
        r.stderr
    );
    let r = ok("perf write_bw -x 0 -m 1024 -F -s 65536 -n 1000 --output=message_rate");
    let mpps = one_number(&r);
    assert!(mpps > 0.0 && mpps < 100.0, "{mpps}");
    let r = ok("perf write_lat -x 0 -m 1024 -F -s 2 -n 1000 --output=latency");
    let usec = one_number(&r);
    assert!(usec > 0.0 && usec < 100_000.0, "{usec}");
}

#[test]
fn ib_write_bw_common_options_full_report() {
    let line = "perf write_bw -x 0 -m 1024 -b -F --report_gbits -s 65536 -n 1000 -S 0 -u 14 -l 1 -z -R -N -i 1 --retry_count 7 --pkey_index 0";
    let r = ok(line);
    let out = &r.stdout;
    assert!(
        out.contains(" Mtu             : 1024[B]"),
        "-m 1024:\n{out}"
    );
    assert!(out.contains(" GID index       : 0"), "{out}");
    let (head, rows) = rows(out);
    assert!(
        head.contains("BW peak[Gb/sec]") && head.contains("BW average[Gb/sec]"),
        "--report_gbits: {head}"
    );
    assert_eq!(rows.len(), 1, "{out}");
    let row = &rows[0];
    assert_eq!(
        (row[0], row[1]),
        (65536.0, 1000.0),
        "-s 65536 -n 1000: {row:?}"
    );
    assert_eq!(row[2], 0.0, "-N: no peak: {row:?}");
    assert!(row[3] > 0.0 && row[4] > 0.0, "{row:?}");
    assert!(out.contains(" rdma_cm QPs\t : ON"), "-R:\n{out}");
    for o in ["-z/--com_rdma_cm", "-m with -R", "-F/--CPU-freq"] {
        assert!(
            r.stderr.contains(&format!("ignoring {o}")),
            "{o}: {}",
            r.stderr
        );
    }
    // Meaningless options are accepted and each named once.
    let r =
        ok("perf write_bw -n 200 --odp --use_hugepages -H --rate_limit 5 --cpu_util --mr_per_qp");
    for o in [
        "--odp",
        "--use_hugepages",
        "--rate_limit",
        "--cpu_util",
        "--mr_per_qp",
    ] {
        assert_eq!(
            r.stderr.matches(&format!("ignoring {o}:")).count(),
            1,
            "{o}: {}",
            r.stderr
        );
    }
}

#[test]
fn bidirectional_reports_both_directions() {
    // -b adds the server's own run: the JSON of both ends shows it ran.
    let r = ok("perf read_bw -b -s 4096 -n 500 --json");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    // Both ends link over shared memory at once: neither refuses the other
    // (a stream socket once delivered two link messages in one read).
    assert_eq!(v["path"], "shm", "{v}");
    assert!(!r.stderr.contains("link refused"), "{}", r.stderr);
    let res = &v["results"][0];
    let srv = &v["bidirectional_server_results"][0];
    assert_eq!(
        (&res["bytes"], &srv["bytes"]),
        (&4096.into(), &4096.into()),
        "{v}"
    );
    assert_eq!(
        srv["iterations"], 500,
        "the server ran its own 500 READs: {v}"
    );
    let (sum, theirs) = (
        res["bw_average"].as_f64().unwrap(),
        srv["bw_average"].as_f64().unwrap(),
    );
    assert!(
        theirs > 0.0 && sum > theirs,
        "the sum includes both ends: {v}"
    );
}

#[test]
fn rdma_cm_connects_the_qps() {
    // -R: the RC QPs go through the connection manager (REQ/REP/RTU on
    // QP1), on shared memory and over UDP; the data is checked.
    for line in [
        "perf write_bw -R -q 2 -n 500 --check",
        "perf read_lat -R -n 200 --transport udp --check",
        "perf send_lat -R -n 200 --transport udp --check",
    ] {
        let r = ok(line);
        assert!(
            r.stdout.contains(" rdma_cm QPs\t : ON"),
            "{line}:\n{}",
            r.stdout
        );
        assert!(
            r.stdout.contains(" Data check      : passed"),
            "{line}:\n{}",
            r.stdout
        );
        assert!(!r.stderr.contains("ignoring -R"), "{line}: {}", r.stderr);
    }
    // UD has no connection: accepted and named as ignored.
    let r = ok("perf send_bw -R -c UD -n 100");
    assert!(r.stdout.contains(" rdma_cm QPs\t : OFF"), "{}", r.stdout);
    assert!(r.stderr.contains("ignoring -R/--rdma_cm"), "{}", r.stderr);
}

#[test]
fn ud_default_size_is_clamped_to_the_mtu() {
    let r = ok("perf send_bw -c UD -n 200");
    assert_eq!(
        r.stderr
            .matches("Max msg size in UD is MTU 4096\n Changing to this MTU")
            .count(),
        1,
        "{}",
        r.stderr
    );
    let (_, rows) = rows(&r.stdout);
    assert_eq!(rows[0][0], 4096.0, "{}", r.stdout);
    // A size asked for that does not fit stays an error, naming the value.
    let r = run("perf send_bw -c UD -s 8192 -n 200");
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("-s 8192: UD messages must fit one MTU (4096 bytes)"),
        "{}",
        r.stderr
    );
}

#[test]
fn run_infinitely_prints_a_row_per_duration() {
    let _one = one_at_a_time();
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args("perf write_bw --run_infinitely -D 0.3 -s 4096".split(' '))
        .env_remove("SOFTRDMA_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rows = 0;
    while rows < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with(" 4096 ") => rows += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(rows, 3, "three timed rows within 60 s");
    assert!(still_running, "--run_infinitely keeps running");
}

#[test]
fn out_json_writes_the_report_file() {
    let f = std::env::temp_dir().join(format!("softrdma-out-{}.json", std::process::id()));
    let r = ok(&format!(
        "perf write_lat -n 100 --out_json --out_json_file {}",
        f.display()
    ));
    assert!(r.stdout.contains(" #bytes"), "the text report as well");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let _ = std::fs::remove_file(&f);
    assert_eq!(v["test"], "write_lat");
    assert_eq!(v["results"][0]["iterations"], 100);
}

#[test]
fn bad_values_are_named_with_what_to_do() {
    for (line, msg) in [
        (
            "perf write_bw -x 1",
            "-x 1: there is no GID index 1; a softrdma device has one GID, index 0",
        ),
        ("perf write_bw -m 1500", "-m 1500: the MTU must be 256, 512, 1024, 2048 or 4096"),
        ("perf write_lat -b", "bidirectional is only available in bandwidth tests"),
        ("perf write_lat --output=bandwidth", "for a latency test it can be: latency"),
        ("perf write_bw -i 2", "-i 2: softrdma devices have one port"),
        (
            "perf write_lat -d mlx5_0",
            "no softrdma device named \"mlx5_0\"; the devices here are: srx0 (",
        ),
        (
            "perf write_bw --fault loss=0.1;seed=3",
            "--fault: fault spec loss=0.1;seed=3: items are separated by commas, e.g. loss=0.1,seed=3",
        ),
        (
            "perf write_bw --fault loss=2",
            "--fault: fault spec loss=2: 2 is not a probability (give 0 to 1",
        ),
        (
            "--device srx0 perf write_lat",
            "--device \"srx0\" is not name=address",
        ),
    ] {
        let r = run(line);
        assert_eq!(r.code, 2, "{line}: {}", r.stderr);
        assert!(r.stderr.contains(msg), "{line}: {}", r.stderr);
        // Said once, by the command, not again by a server it started.
        assert_eq!(r.stderr.lines().count(), 1, "{line}: {}", r.stderr);
    }
    // A client with no server names the address and the time it tried.
    let r = run("perf write_lat -p 1 127.0.0.1");
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("cannot connect to the server at 127.0.0.1:1 (127.0.0.1:1) after trying for")
            && r.stderr.contains("Connection refused"),
        "{}",
        r.stderr
    );
}

#[test]
fn faults_act_on_the_shared_memory_path_too() {
    let r = ok("perf write_bw -n 300 -s 8192 --transport shm --fault loss=0.05,seed=3 --check");
    assert!(r.stdout.contains(" Path used       : shm"), "{}", r.stdout);
    let n: u64 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix(" Faults injected : "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a faults line:\n{}", r.stdout));
    assert!(
        n > 0,
        "5 % loss on 300 WRITEs of 8 KiB hit packets: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains(" Data check      : passed"),
        "{}",
        r.stdout
    );
}

/// Every option of perftest's help (`-x, --gid-index`, `--odp`, …) as
/// `(short, long)`, from `TOOL --help`; None when perftest is missing.
fn perftest_options(tool: &str) -> Option<Vec<(Option<String>, String)>> {
    let out = Command::new(tool).arg("--help").output().ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut v = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        let (short, rest) = match l.strip_prefix('-') {
            Some(r) if !r.starts_with('-') && r.chars().nth(1) == Some(',') => {
                (Some(format!("-{}", &r[..1])), r[2..].trim_start())
            }
            _ => (None, l),
        };
        let Some(long) = rest.strip_prefix("--") else {
            continue;
        };
        let name: String = long
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        if !name.is_empty() {
            v.push((short, format!("--{name}")));
        }
    }
    Some(v)
}

#[test]
fn every_perftest_help_option_is_accepted() {
    let tests = [
        ("ib_write_lat", "write_lat"),
        ("ib_write_bw", "write_bw"),
        ("ib_read_lat", "read_lat"),
        ("ib_read_bw", "read_bw"),
        ("ib_send_lat", "send_lat"),
        ("ib_send_bw", "send_bw"),
        ("ib_atomic_lat", "atomic_lat"),
        ("ib_atomic_bw", "atomic_bw"),
    ];
    let mut checked = 0;
    for (tool, test) in tests {
        let Some(opts) = perftest_options(tool) else {
            assert!(
                std::env::var_os("SOFTRDMA_STRICT_TESTS").is_none(),
                "{tool} (perftest) is missing, and SOFTRDMA_STRICT_TESTS (set by CI) forbids skipping"
            );
            println!("SKIPPED every_perftest_help_option_is_accepted: {tool} is not installed");
            return;
        };
        assert!(opts.len() > 40, "{tool} --help lists its options: {opts:?}");
        let help = run(&format!("perf {test} --help")).stdout;
        for (short, long) in &opts {
            let want = match short {
                Some(s) => format!("{s}, {long}"),
                None => long.clone(),
            };
            // Our help prints "-x, --gid-index <INDEX>" / "--odp".
            let found = help.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("{want} ")) || l == want
            });
            assert!(
                found,
                "{tool}'s {want} is an option of softrdma perf {test}"
            );
            checked += 1;
        }
    }
    eprintln!("{checked} perftest options found in softrdma perf's help");
}

#[test]
fn source_ip_is_this_ends_device_address() {
    let r = ok("perf write_lat --source_ip 127.0.0.199 -n 100 --transport udp");
    let gids: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with(" GID:"))
        .collect();
    assert!(
        gids.len() == 2 && gids[0].ends_with("255:255:127:00:00:199") && !gids[1].ends_with(":199"),
        "the local GID is --source_ip, the server keeps its own:\n{}",
        r.stdout
    );
}
