//! `softrdma`: the one user-facing command of softrdma.
//!
//! Each subcommand lives in its own module with an `Args` struct (clap
//! derive) and a `run` function returning the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod decode;
mod devinfo;
mod perf;
mod stat;

/// softrdma: RDMA (InfiniBand verbs, RoCEv2 on the wire) in userspace Rust.
#[derive(Debug, Parser)]
#[command(name = "softrdma", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode the RoCEv2 frames of a capture file and check their ICRCs.
    ///
    /// Prints one line per RoCEv2 frame (UDP port 4791): frame number,
    /// endpoints, transport and opcode, destination QP, PSN, AckReq, the
    /// opcode's extension headers, and whether the invariant CRC is right.
    /// Exit status: 0 when every frame is well formed with a good ICRC,
    /// 1 when any is not, 2 when the file cannot be read.
    Decode(decode::Args),
    /// Show softrdma devices and their attributes, like ibv_devinfo.
    ///
    /// Opens each configured device (binding its UDP address) just long
    /// enough to query it. -v adds the device limits and port details.
    Devinfo(devinfo::Args),
    /// Show the counters of softrdma devices open in running processes.
    ///
    /// Every open device publishes its device, driver and per-QP counters on
    /// a Unix socket in $SOFTRDMA_RUN_DIR (default /tmp/softrdma-$UID);
    /// this reads them all.
    Stat(stat::Args),
    /// Run a perftest-style benchmark (write_lat, write_bw, read_lat, read_bw,
    /// send_lat, send_bw, atomic_lat, atomic_bw).
    ///
    /// `--server` waits for a client; `HOST` connects to a server. With
    /// neither, both ends run on this machine: a server process is started
    /// automatically. Output follows perftest (ib_write_lat, …).
    Perf(perf::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Devinfo(args) => devinfo::run(args),
        Command::Stat(args) => stat::run(args),
        Command::Perf(args) => perf::run(args),
    }
}
