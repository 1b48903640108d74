//! `softrdma-aggd [--listen HOST:PORT] [--timeout-ms N] [--spin N] [-v]`:
//! the in-network aggregation service of softrdma-coll (the same as
//! `softrdma aggd`). Prints `aggd listening on ADDR` when ready; the
//! device comes from the environment (SOFTRDMA_DEVICES, SOFTRDMA_FAULT, …).

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use softrdma_coll::{serve_aggd, AggdConfig};

fn main() -> ExitCode {
    let mut cfg = AggdConfig::default();
    let mut listen = "127.0.0.1:18515".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("softrdma-aggd: {name} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--listen" => listen = val("--listen"),
            "--timeout-ms" => match val("--timeout-ms").parse::<u64>() {
                Ok(ms) => cfg.timeout = Duration::from_millis(ms.max(1)),
                Err(_) => return usage("--timeout-ms takes milliseconds"),
            },
            "--spin" => match val("--spin").parse() {
                Ok(n) => cfg.spin = n,
                Err(_) => return usage("--spin takes a count"),
            },
            "-v" | "--verbose" => cfg.verbose = true,
            "-h" | "--help" => {
                println!(
                    "usage: softrdma-aggd [--listen HOST:PORT] [--timeout-ms N] [--spin N] [-v]"
                );
                return ExitCode::SUCCESS;
            }
            _ => return usage(&format!("unknown argument {a:?}")),
        }
    }
    let l = match TcpListener::bind(&listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma-aggd: cannot listen on {listen}: {e}");
            return ExitCode::from(2);
        }
    };
    match l.local_addr() {
        Ok(a) => println!("aggd listening on {a}"),
        Err(e) => {
            eprintln!("softrdma-aggd: {e}");
            return ExitCode::from(2);
        }
    }
    match serve_aggd(l, cfg, Arc::new(AtomicBool::new(false))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma-aggd: {e}");
            ExitCode::from(2)
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("softrdma-aggd: {why}");
    ExitCode::from(2)
}
