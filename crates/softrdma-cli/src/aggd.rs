//! `softrdma aggd`: the in-network aggregation service of softrdma-coll
//! (the ranks' `--aggd`/`SOFTRDMA_COLL_AGGD` and `--algo innetwork`).

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use softrdma_coll::{serve_aggd, AggdConfig};

use crate::coll::Transport;

/// Options of `softrdma aggd`.
#[derive(Debug, Clone, Parser)]
pub struct Args {
    /// TCP address the ranks join at (port 0: any; the address is printed).
    #[arg(long, default_value = "127.0.0.1:18515")]
    pub listen: String,
    /// Bound on each wait for a rank, in milliseconds (a dead rank ends
    /// its job after it).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Polls before a waiting job yields its core.
    #[arg(long, default_value_t = 20_000)]
    pub spin: u32,
    /// Path to the ranks.
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Inject faults on receive, e.g. "loss=0.01,reorder=0.01".
    #[arg(long, value_name = "SPEC")]
    pub fault: Option<String>,
    /// A line per job on stderr.
    #[arg(short, long)]
    pub verbose: bool,
}

pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    let fail = |e: String| {
        eprintln!("softrdma aggd: {e}");
        ExitCode::from(2)
    };
    let mut dev = match crate::hosts::device(devices, None) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if let Some(t) = args.transport {
        dev = dev.transport(t.lib());
    }
    if let Some(f) = &args.fault {
        match f.parse() {
            Ok(f) => dev = dev.fault(f),
            Err(e) => return fail(format!("--fault: {e}")),
        }
    }
    let l = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", args.listen)),
    };
    match l.local_addr() {
        Ok(a) => println!("aggd listening on {a}"),
        Err(e) => return fail(e.to_string()),
    }
    let cfg = AggdConfig {
        device: dev,
        timeout: Duration::from_millis(args.timeout_ms.max(1)),
        spin: args.spin,
        verbose: args.verbose,
    };
    match serve_aggd(l, cfg, Arc::new(AtomicBool::new(false))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.to_string()),
    }
}
