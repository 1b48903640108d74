//! `softrdma stat`: the counters of every softrdma device open in a running
//! process on this host (for this user).
//!
//! Each open device publishes a JSON document on a Unix socket in the run
//! directory (see `softrdma::stats`); this command reads them all, drops
//! sockets of processes that are gone, and prints device, driver and
//! per-QP counters.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::{json, Value};

/// Options of `softrdma stat`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Print one JSON object (per round with --watch) instead of text.
    #[arg(long)]
    json: bool,
    /// Repeat every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    /// Also print counters that are zero.
    #[arg(short, long)]
    all: bool,
    /// Run directory to look in (default: $SOFTRDMA_RUN_DIR or /tmp/softrdma-$UID).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
}

/// Reads every live device's document.
fn gather(dir: &std::path::Path) -> Vec<Value> {
    softrdma::stats::collect(dir, Duration::from_secs(2))
        .into_iter()
        .map(|(p, r)| {
            let parsed = r
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str::<Value>(&s).map_err(|e| e.to_string()));
            match parsed {
                Ok(v) => v,
                Err(e) => json!({
                    "device": p.device,
                    "pid": p.pid,
                    "socket": p.path.display().to_string(),
                    "error": e,
                }),
            }
        })
        .collect()
}

/// `name value` pairs of a counters object, in the library's order (then
/// any other key); zeros skipped unless `all` (packets and bytes always shown).
fn pairs(v: &Value, all: bool) -> String {
    let mut order: Vec<&str> = softrdma::Counters::default()
        .fields()
        .iter()
        .map(|(k, _)| *k)
        .collect();
    order.extend(
        softrdma::stats::driver_fields(&Default::default())
            .iter()
            .map(|(k, _)| *k),
    );
    order.extend(
        softrdma::stats::shm_fields(&Default::default())
            .iter()
            .map(|(k, _)| *k),
    );
    order.extend(
        softrdma::stats::congestion_fields(&Default::default())
            .iter()
            .map(|(k, _)| *k),
    );
    let mut o = String::new();
    let Some(m) = v.as_object() else {
        return o;
    };
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(usize::MAX));
    for k in keys {
        let n = &m[k];
        let always = k.ends_with("_packets") || k.ends_with("_bytes");
        if all || always || n.as_u64() != Some(0) {
            let _ = write!(o, " {k} {n}");
        }
    }
    o
}

fn text(devs: &[Value], all: bool) -> String {
    let mut o = String::new();
    for d in devs {
        let s = |k: &str| d[k].as_str().unwrap_or("?").to_string();
        if let Some(e) = d["error"].as_str() {
            let _ = writeln!(
                o,
                "{} pid {}: cannot read {}: {e}",
                s("device"),
                d["pid"],
                s("socket")
            );
            continue;
        }
        let _ = writeln!(
            o,
            "{} pid {} ({}) addr {} up {:.1}s",
            s("device"),
            d["pid"],
            s("program"),
            s("addr"),
            d["uptime_s"].as_f64().unwrap_or(0.0)
        );
        let _ = writeln!(o, "    device:{}", pairs(&d["counters"], all));
        let _ = writeln!(o, "    driver:{}", pairs(&d["driver"], all));
        let shm_used = d["shm"]
            .as_object()
            .is_some_and(|m| m.values().any(|v| v.as_u64().is_some_and(|n| n > 0)));
        if all || shm_used {
            let _ = writeln!(o, "    shm:{}", pairs(&d["shm"], all));
        }
        for q in d["qps"].as_array().into_iter().flatten() {
            // Selective repeat (ECE-negotiated) is named; go-back-N is the default.
            let sr = if q["selective_repeat"] == true {
                " selective-repeat"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "    qp {:#08x} {} {}{sr}:{}{}",
                q["qpn"].as_u64().unwrap_or(0),
                q["type"].as_str().unwrap_or("?"),
                q["state"].as_str().unwrap_or("?"),
                pairs(&q["counters"], all),
                pairs(&q["congestion"], all)
            );
        }
    }
    o
}

/// Runs `softrdma stat`.
///
/// With `--device`, only the devices it names are shown (their counters
/// are those of the processes that have them open).
pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    let only: Option<Vec<String>> = if devices.is_empty() {
        None
    } else {
        match crate::hosts::devices(devices) {
            Ok(l) => Some(l.into_iter().map(|d| d.name).collect()),
            Err(e) => {
                eprintln!("softrdma stat: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let dir = args
        .run_dir
        .clone()
        .unwrap_or_else(softrdma::stats::run_dir);
    if let Some(w) = args.watch {
        if !(w > 0.0 && w.is_finite()) {
            eprintln!("softrdma stat: --watch needs a positive number of seconds");
            return ExitCode::from(2);
        }
    }
    loop {
        let mut devs = gather(&dir);
        if let Some(names) = &only {
            devs.retain(|d| {
                d.get("device")
                    .and_then(Value::as_str)
                    .is_some_and(|n| names.iter().any(|x| x == n))
            });
        }
        if args.json {
            let v = json!({
                "run_dir": dir.display().to_string(),
                "time_unix_s": std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
                "devices": devs,
            });
            println!("{v}");
        } else {
            if args.watch.is_some() {
                println!("--- {} ---", clock());
            }
            if devs.is_empty() {
                println!(
                    "no softrdma devices open in running processes (run directory {})",
                    dir.display()
                );
            } else {
                print!("{}", text(&devs, args.all));
            }
        }
        match args.watch {
            Some(w) => std::thread::sleep(Duration::from_secs_f64(w)),
            None => return ExitCode::SUCCESS,
        }
    }
}

/// Wall-clock time of day (UTC) as HH:MM:SS.
fn clock() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_nonzero_counters_and_traffic() {
        let d = json!({
            "device": "srx0", "pid": 7, "program": "x", "addr": "127.0.0.1:4791",
            "uptime_s": 1.0,
            "counters": {"tx_packets": 0, "rx_packets": 3, "retransmits": 0, "timeouts": 2},
            "driver": {"send_errors": 0},
            "qps": [{"qpn": 17, "type": "RC", "state": "RTS", "counters": {"tx_packets": 1}}],
        });
        let t = text(&[d], false);
        assert!(
            t.contains("device: tx_packets 0 rx_packets 3 timeouts 2\n"),
            "{t}"
        );
        assert!(!t.contains("retransmits"), "{t}");
        assert!(t.contains("qp 0x000011 RC RTS: tx_packets 1"), "{t}");
    }
}
