//! `softrdma`: the one user-facing command of softrdma.
//!
//! Each subcommand lives in its own module with an `Args` struct (clap
//! derive) and a `run` function returning the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod aggd;
mod coll;
mod decode;
mod devinfo;
mod fabric;
mod hosts;
mod ibstat;
mod perf;
mod reg_mr;
mod stat;

/// softrdma: RDMA (InfiniBand verbs, RoCEv2 on the wire) in userspace Rust.
#[derive(Debug, Parser)]
#[command(name = "softrdma", version, propagate_version = true)]
struct Cli {
    /// Use this device: NAME=IP[:PORT], e.g. srx0=192.0.2.1 (the address
    /// other hosts reach this one at; it is the device's GID). Repeatable;
    /// replaces SOFTRDMA_DEVICES. Without it: SOFTRDMA_DEVICES, else srx0
    /// on the first free 127.0.0.N (reachable from this host only).
    #[arg(long = "device", global = true, value_name = "NAME=IP[:PORT]")]
    devices: Vec<String>,
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
    ///
    /// `softrdma perf reg_mr [--max-size SIZE] [--svg FILE]` measures memory
    /// registration instead: pinned, shared and ODP regions by size, ODP's
    /// first-touch cost, register-per-transfer against a reused pool.
    Perf(Box<perf::Args>),
    /// Run an nccl-tests-style collective benchmark (all_reduce_perf,
    /// reduce_scatter_perf, all_gather_perf, broadcast_perf, reduce_perf,
    /// alltoall_perf) over softrdma-coll.
    ///
    /// Ranks come from mpirun (OMPI_COMM_WORLD_*), torchrun (RANK,
    /// WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or SOFTRDMA_COLL_RANK/_SIZE/
    /// _ADDR; `--ranks N` starts N local processes instead. Options and
    /// columns follow nccl-tests (-b -e -f -n -w -c -d -o -r; -z 1 runs
    /// in place only).
    Coll(Box<coll::Args>),
    /// Run the in-network aggregation service (SHARP-style) for
    /// softrdma-coll's `--algo innetwork` all-reduces.
    ///
    /// Ranks join it at --listen (`softrdma coll --aggd HOST:PORT` or
    /// SOFTRDMA_COLL_AGGD), stream their vectors to it over RC queue pairs
    /// and get the reduction back, one reduction per chunk. Prints
    /// `aggd listening on ADDR`, then serves until killed.
    Aggd(aggd::Args),
    /// Show softrdma devices in the layout of infiniband-diags' ibstat.
    ///
    /// `softrdma ibstat [CA [PORT]]`; -l lists the CA names, -s leaves out
    /// the ports, -p lists the port GUIDs.
    Ibstat(ibstat::Args),
    /// Show the ports of softrdma devices like iproute2's `rdma link show`.
    Link(ibstat::LinkArgs),
    /// Simulate a cluster network whose hosts run softrdma's transport.
    ///
    /// Each scenario file (JSON, docs/fabric.md) names a fat-tree, a link
    /// layer (InfiniBand credits, lossy Ethernet, PFC, ECN, loss), the
    /// transport (go-back-N, selective repeat, DCQCN) and a workload; the
    /// run is deterministic for its seed. Prints step times, bandwidths,
    /// completion times, retransmissions, pauses, drops and cost.
    Fabric(fabric::Args),
}

fn main() -> ExitCode {
    // `perf reg_mr` is not a perftest test (no server, no peer): its own
    // options, parsed apart from perf's.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "perf") && argv.get(2).is_some_and(|a| a == "reg_mr") {
        let args = reg_mr::Args::parse_from(argv.iter().skip(2));
        return reg_mr::run(&args);
    }
    let cli = Cli::parse();
    let dev = &cli.devices;
    match &cli.command {
        // A capture names its own addresses: --device does not apply.
        Command::Decode(args) => decode::run(args),
        Command::Devinfo(args) => devinfo::run(args, dev),
        Command::Stat(args) => stat::run(args, dev),
        Command::Perf(args) => perf::run(args, dev),
        Command::Coll(args) => coll::run(args, dev),
        Command::Aggd(args) => aggd::run(args, dev),
        Command::Ibstat(args) => ibstat::run(args, dev),
        Command::Link(args) => ibstat::link(args, dev),
        Command::Fabric(args) => fabric::run(args),
    }
}
