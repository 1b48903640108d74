//! `softrdma`: the one user-facing command of softrdma.
//!
//! Each subcommand lives in its own module with an `Args` struct (clap
//! derive) and a `run` function returning the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod decode;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode(args) => decode::run(args),
    }
}
