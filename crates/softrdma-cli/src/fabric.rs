//! `softrdma fabric`: runs fabric-simulator scenarios (docs/fabric.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use softrdma_fabric::{report::run_threads, Scenario};

/// Options of `softrdma fabric`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Scenario files (JSON, docs/fabric.md); each runs on its own.
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
    /// Write the results as one JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an HTML report (tables and SVG plots, one self-contained
    /// file) to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Sample switch queues every US microseconds of simulated time.
    #[arg(long, value_name = "US", default_value_t = 0)]
    sample_us: u64,
    /// Use up to N threads (default: one per CPU): N scenarios at once,
    /// or one scenario's parts side by side (its `partitions`). The
    /// results do not depend on N.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Override the seed of every scenario.
    #[arg(long)]
    seed: Option<u64>,
    /// Override every scenario's `partitions` (1 runs it whole; the
    /// results differ from a split only in the order of simultaneous
    /// events).
    #[arg(long, value_name = "P")]
    partitions: Option<usize>,
}

pub fn run(args: &Args) -> ExitCode {
    let mut scenarios = Vec::new();
    for p in &args.scenarios {
        let text = match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("softrdma fabric: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        };
        match Scenario::from_json(&text) {
            Ok(mut s) => {
                if let Some(seed) = args.seed {
                    s.seed = seed;
                }
                if let Some(p) = args.partitions {
                    s.partitions = p;
                }
                if s.name.is_empty() {
                    s.name = p.display().to_string();
                }
                scenarios.push(s);
            }
            Err(e) => {
                eprintln!("softrdma fabric: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cpus).clamp(1, 64);
    let mut results = vec![None; scenarios.len()];
    for (chunk_s, chunk_r) in scenarios.chunks(threads).zip(results.chunks_mut(threads)) {
        // Threads left over when fewer scenarios than threads run at once
        // go to their parts.
        let each = threads / chunk_s.len();
        std::thread::scope(|sc| {
            for (s, r) in chunk_s.iter().zip(chunk_r.iter_mut()) {
                sc.spawn(move || *r = Some(run_threads(s, args.sample_us, each)));
            }
        });
    }
    let mut ok = Vec::new();
    let mut failed = false;
    for (s, r) in scenarios.iter().zip(results) {
        match r.expect("every scenario ran") {
            Ok(rep) => {
                print!("{}", rep.summary());
                failed |= !rep.completed;
                ok.push(rep);
            }
            Err(e) => {
                eprintln!("softrdma fabric: {}: {e}", s.name);
                return ExitCode::from(2);
            }
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&ok).expect("reports serialise");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("softrdma fabric: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if let Some(path) = &args.report {
        if let Err(e) = std::fs::write(path, softrdma_fabric::html::html(&ok)) {
            eprintln!("softrdma fabric: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
