//! `softrdma perf`: perftest's latency and bandwidth tests (`ib_write_lat`,
//! `ib_write_bw`, `ib_read_lat`, …) on softrdma devices, with perftest's
//! options where they apply and its output format.
//!
//! Like perftest, a test has two ends: `--server` waits for a client, and a
//! client is given the server's host. Unlike perftest, the client sends its
//! parameters, so the server needs only the test name. With neither
//! `--server` nor a host, the command runs both ends itself: it starts
//! itself again as the server (a second process on a free port, whose
//! device gets its own loopback address) and runs the client against it.

mod clock;
mod ctrl;
pub mod report;
mod run;

use std::io::{BufRead, BufReader, IsTerminal};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::json;

use report::{AddrKind, Header, Row, BW_HEAD, BW_HEAD_G, LAT_DUR_HEAD, LAT_HEAD};

/// Default TCP port of the parameter exchange (perftest's).
pub const DEFAULT_PORT: u16 = 18515;
/// First line the server prints when started by the client itself.
const SPAWN_READY: &str = "softrdma-perf-port";
/// Magic word of the parameter line.
const MAGIC: &str = "softrdma-perf/1";

/// The test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Test {
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    #[value(name = "write_lat", alias = "ib_write_lat")]
    WriteLat,
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[value(name = "write_bw", alias = "ib_write_bw")]
    WriteBw,
    /// RDMA READ latency (ib_read_lat).
    #[value(name = "read_lat", alias = "ib_read_lat")]
    ReadLat,
    /// RDMA READ bandwidth (ib_read_bw).
    #[value(name = "read_bw", alias = "ib_read_bw")]
    ReadBw,
    /// SEND/RECV ping-pong latency (ib_send_lat).
    #[value(name = "send_lat", alias = "ib_send_lat")]
    SendLat,
    /// SEND bandwidth (ib_send_bw).
    #[value(name = "send_bw", alias = "ib_send_bw")]
    SendBw,
    /// Atomic latency (ib_atomic_lat).
    #[value(name = "atomic_lat", alias = "ib_atomic_lat")]
    AtomicLat,
    /// Atomic bandwidth (ib_atomic_bw).
    #[value(name = "atomic_bw", alias = "ib_atomic_bw")]
    AtomicBw,
}

/// The verb a test exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Write,
    Read,
    Send,
    Atomic,
}

impl Test {
    /// The verb.
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteLat | Test::WriteBw => Verb::Write,
            Test::ReadLat | Test::ReadBw => Verb::Read,
            Test::SendLat | Test::SendBw => Verb::Send,
            Test::AtomicLat | Test::AtomicBw => Verb::Atomic,
        }
    }
    /// A latency test.
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::WriteBw => "write_bw",
            Test::ReadLat => "read_lat",
            Test::ReadBw => "read_bw",
            Test::SendLat => "send_lat",
            Test::SendBw => "send_bw",
            Test::AtomicLat => "atomic_lat",
            Test::AtomicBw => "atomic_bw",
        }
    }
    /// Ping-pong tests, where both ends post and measure.
    pub fn ping_pong(self) -> bool {
        matches!(self, Test::WriteLat | Test::SendLat)
    }
    /// Tests whose server only serves one-sided operations.
    pub fn passive_server(self) -> bool {
        !self.ping_pong() && self != Test::SendBw
    }
    /// perftest divides the round trip by 2 for ping-pong tests only.
    pub fn rtt_factor(self) -> f64 {
        if self.ping_pong() {
            2.0
        } else {
            1.0
        }
    }
    /// The title line.
    pub fn title(self, atomic: AtomicOp) -> String {
        let verb = match self.verb() {
            Verb::Write => "RDMA_Write".to_string(),
            Verb::Read => "RDMA_Read".to_string(),
            Verb::Send => "Send".to_string(),
            Verb::Atomic => format!("Atomic {}", atomic.name()),
        };
        let kind = if self.is_lat() { "Latency" } else { "BW" };
        format!("{verb} {kind} Test")
    }
}

/// Transport service (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[value(rename_all = "UPPER")]
pub enum Conn {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl Conn {
    fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        }
    }
}

/// Atomic operation (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum AtomicOp {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add.
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicOp {
    fn name(self) -> &'static str {
        match self {
            AtomicOp::CmpAndSwap => "CMP_AND_SWAP",
            AtomicOp::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// The path between the two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// RoCEv2 over UDP sockets, even to a peer on this host.
    Udp,
    /// Shared memory with a peer on this host (no other peer is reachable).
    Shm,
    /// Shared memory when the peer is on this host, UDP otherwise.
    Auto,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Shm => "shm",
            Transport::Auto => "auto",
        }
    }
    fn lib(self) -> softrdma::shm::Transport {
        match self {
            Transport::Udp => softrdma::shm::Transport::Udp,
            Transport::Shm => softrdma::shm::Transport::Shm,
            Transport::Auto => softrdma::shm::Transport::Auto,
        }
    }
}

/// Options of `softrdma perf` (perftest's letters where they exist).
#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// The test: write_lat, write_bw, read_lat, read_bw, send_lat, send_bw,
    /// atomic_lat, atomic_bw.
    pub test: Test,
    /// Server to connect to (client mode). Without it and without --server,
    /// both ends run here: a server process is started automatically.
    pub host: Option<String>,
    /// Wait for a client (server mode).
    #[arg(long, conflicts_with = "host")]
    pub server: bool,
    /// Message size in bytes (default 2 for latency, 65536 for bandwidth).
    #[arg(short, long)]
    pub size: Option<u64>,
    /// Run every size from 2 to 2^23 bytes (see --max-size).
    #[arg(short, long)]
    pub all: bool,
    /// With -a: stop at this size (softrdma addition).
    #[arg(long, value_name = "BYTES", requires = "all")]
    pub max_size: Option<u64>,
    /// Iterations (default 1000 for latency, 5000 for bandwidth).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Connection type.
    #[arg(
        short = 'c',
        long = "connection",
        value_enum,
        default_value = "RC",
        ignore_case = true
    )]
    pub conn: Conn,
    /// Device (default: the first of SOFTRDMA_DEVICES, or srx0).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,
    /// TCP port of the parameter exchange.
    #[arg(short, long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Send queue depth: outstanding WRs per QP (default 1 for latency, 128 for bandwidth).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (send tests; default 512).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Bandwidth tests: one signaled completion every this many WRs.
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    pub cq_mod: u32,
    /// Atomic operation.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    pub atomic: AtomicOp,
    /// Largest message sent inline (default 0, as perftest on a generic device).
    #[arg(short = 'I', long = "inline_size")]
    pub inline: Option<u32>,
    /// Sleep on CQ events (a completion channel) instead of polling.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Report bandwidth in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Accepted for perftest compatibility (no CPU frequency is used).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Print one JSON object instead of perftest's text.
    #[arg(long)]
    pub json: bool,
    /// Path between the ends (default: SOFTRDMA_TRANSPORT, else auto:
    /// shared memory to a peer on this host, UDP otherwise).
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Record this end's packets to a pcap file.
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Inject faults on receive, e.g. "loss=0.01,seed=7" (see SOFTRDMA_FAULT).
    #[arg(long, value_name = "SPEC")]
    pub fault: Option<String>,
    /// Verify the data moved (patterns compared at the end of each size).
    #[arg(long)]
    pub check: bool,
    /// GID index: softrdma devices have one GID, index 0 (their IP address).
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active
    /// MTU; a larger one falls back to it, as in perftest).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Bidirectional bandwidth: both ends run the test at once and the sum
    /// is reported (write_bw, read_bw, atomic_bw).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
    /// Connect the RC QPs through the connection manager (IB CM over
    /// RoCEv2, as rdma_cm does); the addresses and keys still go over the
    /// TCP exchange.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Accepted: parameters go over this command's TCP exchange.
    #[arg(short = 'z', long = "com_rdma_cm")]
    pub com_rdma_cm: bool,
    /// Print only one number per size: bandwidth or message_rate (bandwidth
    /// tests), latency (latency tests: the average).
    #[arg(long = "output", value_enum, value_name = "UNITS")]
    pub output: Option<OutputKind>,
    /// Service level 0..15 (accepted; RoCEv2 over UDP carries none).
    #[arg(short = 'S', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Type of service 0..255 (accepted; the IP header's is not set).
    #[arg(short = 'T', long = "tos")]
    pub tos: Option<u16>,
    /// QP timeout exponent: 4.096 µs × 2^TIMEOUT (0..31).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// RC retry count (0..7).
    #[arg(long = "retry_count", default_value_t = 7)]
    pub retry_count: u8,
    /// Outstanding READs/atomics per QP (1..16; default 16, the device's maximum).
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u8>,
    /// Post lists of this many send WRs (accepted; WRs are posted one by one).
    #[arg(short = 'l', long = "post_list")]
    pub post_list: Option<u32>,
    /// Post lists of receive WRs (accepted; posted one by one).
    #[arg(long = "recv_post_list")]
    pub recv_post_list: Option<u32>,
    /// Repeat the timed run (-D, default 5 s) forever, one row per run.
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Port of the device (softrdma devices have port 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// P_Key index (softrdma devices have index 0).
    #[arg(long = "pkey_index", default_value_t = 0)]
    pub pkey_index: u16,
    /// The address of this host for the test: the device's IP (as
    /// `--device NAME=IP`, keeping the device's name and UDP port).
    #[arg(long = "source_ip", value_name = "IP")]
    pub source_ip: Option<std::net::IpAddr>,
    /// No peak bandwidth (printed as 0).
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Also write the JSON report to a file (--out_json_file, default perftest_out.json).
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// The file of --out_json.
    #[arg(long = "out_json_file", value_name = "FILE")]
    pub out_json_file: Option<PathBuf>,
    /// Wait this many seconds before releasing the resources at the end.
    #[arg(long = "wait_destroy", value_name = "SECONDS")]
    pub wait_destroy: Option<u64>,
    /// perftest options with no meaning on softrdma: accepted, reported as ignored.
    #[command(flatten)]
    pub ignored: Ignored,
    /// Internal: server started by a client of this command.
    #[arg(long, hide = true)]
    pub spawned: bool,
}

/// `--output`: one number per size instead of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputKind {
    /// Average bandwidth.
    Bandwidth,
    /// Message rate (Mpps).
    #[value(name = "message_rate")]
    MessageRate,
    /// Average latency (µs).
    Latency,
}

/// Whether an ignored option was given.
trait Given {
    fn given(&self) -> bool;
}
impl Given for bool {
    fn given(&self) -> bool {
        *self
    }
}
impl<T> Given for Option<T> {
    fn given(&self) -> bool {
        self.is_some()
    }
}

/// Declares the ignored perftest options and why each has no meaning here.
macro_rules! ignored_options {
    ($( $(#[$m:meta])* $field:ident : $ty:ty => $why:literal; )*) => {
        /// perftest options accepted for compatibility; each is reported as
        /// ignored (on stderr) when given.
        #[derive(Debug, Clone, Default, ClapArgs)]
        #[command(next_help_heading = "perftest options accepted and ignored")]
        pub struct Ignored {
            $( $(#[$m])* pub $field: $ty, )*
        }
        impl Ignored {
            /// `(option, why)` of every ignored option given.
            pub fn given(&self) -> Vec<(String, &'static str)> {
                let mut v = Vec::new();
                $( if Given::given(&self.$field) {
                    v.push((ignored_name(stringify!($field)), $why));
                } )*
                v
            }
        }
    };
}

/// `--name` of an ignored option's field (perftest's spelling where it differs).
fn ignored_name(field: &str) -> String {
    let n = match field {
        "margin" => "-f/--margin",
        "report_cycles" => "-C/--report-cycles",
        "report_histogram" => "-H/--report-histogram",
        "report_unsorted" => "-U/--report-unsorted",
        "dualport" => "-O/--dualport",
        "limit_bw" => "-w/--limit_bw",
        "limit_msgrate" => "-y/--limit_msgrate",
        "report_counters" => "-W/--report-counters",
        "vector" => "-X/--vector",
        "mcg" => "-g/--mcg",
        "mgid" => "-M/--MGID",
        "hop_limit" => "-L/--hop_limit",
        "force_link" => "--force-link",
        "report_both" => "--report-both",
        "report_per_port" => "--report-per-port",
        "mmap_offset" => "--mmap-offset",
        "use_srq" => "--use-srq",
        other => return format!("--{other}"),
    };
    n.to_string()
}

ignored_options! {
    /// Measure within margins (duration mode).
    #[arg(short = 'f', long = "margin", value_name = "SECONDS")]
    margin: Option<String> => "results cover the whole run";
    /// Report times in CPU cycles.
    #[arg(short = 'C', long = "report-cycles")]
    report_cycles: bool => "times are measured in nanoseconds, reported in µs";
    /// Print every result.
    #[arg(short = 'H', long = "report-histogram")]
    report_histogram: bool => "only the summary is printed";
    /// Unsorted results.
    #[arg(short = 'U', long = "report-unsorted")]
    report_unsorted: bool => "only the summary is printed";
    /// Dual-port mode.
    #[arg(short = 'O', long = "dualport")]
    dualport: bool => "softrdma devices have one port";
    /// Verifier limit for bandwidth.
    #[arg(short = 'w', long = "limit_bw", value_name = "VALUE")]
    limit_bw: Option<String> => "no limit is verified";
    /// Verifier limit for message rate.
    #[arg(short = 'y', long = "limit_msgrate", value_name = "VALUE")]
    limit_msgrate: Option<String> => "no limit is verified";
    /// Performance counters to report.
    #[arg(short = 'W', long = "report-counters", value_name = "LIST")]
    report_counters: Option<String> => "see `softrdma stat` for the counters";
    /// Multicast group.
    #[arg(short = 'g', long = "mcg")]
    mcg: bool => "there is no multicast: messages go to the one peer";
    /// Multicast GID.
    #[arg(short = 'M', long = "MGID", value_name = "GID")]
    mgid: Option<String> => "there is no multicast";
    /// Completion vector for events.
    #[arg(short = 'X', long = "vector", value_name = "VECTOR")]
    vector: Option<String> => "softrdma devices have one completion vector";
    /// Hop limit.
    #[arg(short = 'L', long = "hop_limit", value_name = "HOPS")]
    hop_limit: Option<String> => "packets carry hop limit 64";
    /// Traffic class in the GRH.
    #[arg(long = "tclass", value_name = "VALUE")]
    tclass: Option<String> => "packets carry traffic class 0";
    /// CPU utilization.
    #[arg(long = "cpu_util")]
    cpu_util: bool => "no CPU utilization is measured";
    /// Destination LID.
    #[arg(long = "dlid", value_name = "LID")]
    dlid: Option<String> => "RoCE addresses by GID, not LID";
    /// Do not exchange versions and MTU.
    #[arg(long = "dont_xchg_versions")]
    dont_xchg_versions: bool => "both ends always exchange their parameters";
    /// Force the link type.
    #[arg(long = "force-link", value_name = "TYPE")]
    force_link: Option<String> => "the link layer is always Ethernet (RoCEv2)";
    /// IPv6 GID.
    #[arg(long = "ipv6")]
    ipv6: bool => "the GID is the device's address: give an IPv6 address with --device";
    /// mmap'd buffer.
    #[arg(long = "mmap", value_name = "FILE")]
    mmap: Option<String> => "buffers are anonymous memory";
    /// Offset in the mmap'd buffer.
    #[arg(long = "mmap-offset", value_name = "OFFSET")]
    mmap_offset: Option<String> => "buffers are anonymous memory";
    /// One MR per QP.
    #[arg(long = "mr_per_qp")]
    mr_per_qp: bool => "one MR serves every QP";
    /// On-demand paging.
    #[arg(long = "odp")]
    odp: bool => "memory is registered up front";
    /// Old post send flow.
    #[arg(long = "use_old_post_send")]
    use_old_post_send: bool => "there is one post path";
    /// Warm-up iterations.
    #[arg(long = "perform_warm_up")]
    perform_warm_up: bool => "buffers are touched before the run anyway";
    /// RX and TX separately for -b.
    #[arg(long = "report-both")]
    report_both: bool => "-b reports the sum";
    /// Per-port results.
    #[arg(long = "report-per-port")]
    report_per_port: bool => "softrdma devices have one port";
    /// Server sends to client.
    #[arg(long = "reversed")]
    reversed: bool => "the client always sends";
    /// Huge pages.
    #[arg(long = "use_hugepages")]
    use_hugepages: bool => "buffers use normal pages";
    /// PCIe relaxed ordering.
    #[arg(long = "disable_pcie_relaxed")]
    disable_pcie_relaxed: bool => "there is no PCIe";
    /// Rate limiter burst size.
    #[arg(long = "burst_size", value_name = "SIZE")]
    burst_size: Option<String> => "there is no rate limiter";
    /// Rate limiter packet size.
    #[arg(long = "typical_pkt_size", value_name = "BYTES")]
    typical_pkt_size: Option<String> => "there is no rate limiter";
    /// Rate limit.
    #[arg(long = "rate_limit", value_name = "RATE")]
    rate_limit: Option<String> => "there is no rate limiter";
    /// Rate limit units.
    #[arg(long = "rate_units", value_name = "UNITS")]
    rate_units: Option<String> => "there is no rate limiter";
    /// Rate limiter type.
    #[arg(long = "rate_limit_type", value_name = "TYPE")]
    rate_limit_type: Option<String> => "there is no rate limiter";
    /// Delay between posts (latency tests).
    #[arg(long = "latency_gap", value_name = "DELAY")]
    latency_gap: Option<String> => "posts follow each other without a gap";
    /// Inline receive.
    #[arg(long = "inline_recv", value_name = "SIZE")]
    inline_recv: Option<String> => "received data is always copied to the buffer";
    /// Shared receive queue.
    #[arg(long = "use-srq")]
    use_srq: bool => "each QP has its own receive queue here";
    /// DC streams.
    #[arg(long = "log_dci_streams", value_name = "N")]
    log_dci_streams: Option<String> => "there is no DC transport";
    /// Active DC streams.
    #[arg(long = "log_active_dci_streams", value_name = "N")]
    log_active_dci_streams: Option<String> => "there is no DC transport";
    /// AES-XTS encryption.
    #[arg(long = "aes_xts")]
    aes_xts: bool => "there is no crypto offload";
    /// Encrypt on TX.
    #[arg(long = "encrypt_on_tx")]
    encrypt_on_tx: bool => "there is no crypto offload";
    /// Signature before encryption.
    #[arg(long = "sig_before")]
    sig_before: bool => "there is no crypto offload";
    /// AES block size.
    #[arg(long = "aes_block_size", value_name = "SIZE")]
    aes_block_size: Option<String> => "there is no crypto offload";
    /// Number of data encryption keys.
    #[arg(long = "data_enc_keys_number", value_name = "N")]
    data_enc_keys_number: Option<String> => "there is no crypto offload";
    /// Key encryption key file.
    #[arg(long = "kek_path", value_name = "FILE")]
    kek_path: Option<String> => "there is no crypto offload";
    /// Credentials file.
    #[arg(long = "credentials_path", value_name = "FILE")]
    credentials_path: Option<String> => "there is no crypto offload";
    /// Data encryption key app.
    #[arg(long = "data_enc_key_app_path", value_name = "FILE")]
    data_enc_key_app_path: Option<String> => "there is no crypto offload";
}

/// What the client tells the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    pub test: Test,
    pub sizes: Vec<u64>,
    pub iters: u64,
    pub duration: Option<f64>,
    pub conn: Conn,
    pub qps: u32,
    pub tx_depth: u32,
    pub rx_depth: u32,
    pub cq_mod: u32,
    pub atomic: AtomicOp,
    pub inline: u32,
    pub check: bool,
    /// Path MTU asked for (-m); None: the port's.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Both ends run the test (-b).
    #[serde(default)]
    pub bidir: bool,
    /// Timed runs repeat until the client stops (--run_infinitely).
    #[serde(default)]
    pub forever: bool,
    /// QP timeout exponent (-u).
    #[serde(default = "default_timeout")]
    pub qp_timeout: u8,
    /// RC retry count (--retry_count).
    #[serde(default = "default_retry")]
    pub retry_count: u8,
    /// Outstanding READs/atomics (-o).
    #[serde(default = "default_outs")]
    pub outs: u8,
    /// The client reports in Gb/s (--report_gbits): the units of a -b
    /// server's row in its report.
    #[serde(default)]
    pub gbits: bool,
    /// RC QPs are connected through the connection manager (-R), the
    /// server listening on `cm_port` of rdma_cm's TCP port space.
    #[serde(default)]
    pub rdma_cm: bool,
    #[serde(default)]
    pub cm_port: u16,
}

fn default_timeout() -> u8 {
    14
}
fn default_retry() -> u8 {
    7
}
fn default_outs() -> u8 {
    16
}

/// The MTUs -m accepts.
const MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Default -D of --run_infinitely (perftest's).
const INFINITE_DURATION: f64 = 5.0;

/// Largest size of `-a`.
const MAX_SIZE: u64 = 1 << 23;

impl Args {
    /// The parameters of the run; `active_mtu` is the port's (known once
    /// the device is open), which clamps UD sizes as perftest does.
    fn params(&self, active_mtu: Option<u32>) -> Result<Params, String> {
        let t = self.test;
        let lat = t.is_lat();
        if let Some(x) = self.gid_index.filter(|&x| x != 0) {
            return Err(format!(
                "-x {x}: there is no GID index {x}; a softrdma device has one GID, index 0 (its IP address, see `softrdma devinfo`): use -x 0 or leave -x out"
            ));
        }
        if self.ib_port != 1 {
            return Err(format!(
                "-i {}: softrdma devices have one port, port 1",
                self.ib_port
            ));
        }
        if self.pkey_index != 0 {
            return Err(format!(
                "--pkey_index {}: softrdma devices have one P_Key, index 0",
                self.pkey_index
            ));
        }
        if let Some(m) = self.mtu {
            if !MTUS.contains(&m) {
                return Err(format!(
                    "-m {m}: the MTU must be 256, 512, 1024, 2048 or 4096"
                ));
            }
        }
        if self.sl > 15 {
            return Err(format!("-S {}: the service level must be 0..15", self.sl));
        }
        if let Some(tos) = self.tos.filter(|&v| v > 255) {
            return Err(format!("-T {tos}: the type of service must be 0..255"));
        }
        if self.qp_timeout > 31 {
            return Err(format!(
                "-u {}: the QP timeout exponent must be 0..31",
                self.qp_timeout
            ));
        }
        if self.retry_count > 7 {
            return Err(format!(
                "--retry_count {}: the retry count must be 0..7",
                self.retry_count
            ));
        }
        if let Some(o) = self.outs.filter(|o| !(1..=16).contains(o)) {
            return Err(format!(
                "-o {o}: outstanding READs/atomics must be 1..16 (the device's maximum)"
            ));
        }
        if self.bidir && lat {
            return Err(
                "-b: bidirectional is only available in bandwidth tests (as in perftest)".into(),
            );
        }
        if self.bidir && t == Test::SendBw {
            return Err("-b: softrdma runs bidirectional write_bw, read_bw and atomic_bw; send_bw -b is not supported".into());
        }
        if self.bidir && self.check {
            return Err("--check does not work with -b (both ends write the same buffers)".into());
        }
        if let Some(o) = self.output {
            match (lat, o) {
                (true, OutputKind::Latency) | (false, OutputKind::Bandwidth | OutputKind::MessageRate) => {}
                (true, _) => return Err("--output: for a latency test it can be: latency (as in perftest)".into()),
                (false, _) => return Err("--output: for a bandwidth test it can be: bandwidth, message_rate (as in perftest)".into()),
            }
        }
        if let Some(l) = self.post_list.filter(|&l| l == 0) {
            return Err(format!("-l {l}: the post list size must be at least 1"));
        }
        let duration = match (self.duration, self.run_infinitely) {
            (None, true) => Some(INFINITE_DURATION),
            (d, _) => d,
        };
        if self.run_infinitely && (self.all || self.iters.is_some()) {
            return Err("--run_infinitely repeats a timed run (-D): not with -a or -n".into());
        }
        if self.conn == Conn::Ud && t.verb() != Verb::Send {
            return Err(format!(
                "-c UD works only with the send tests ({} needs RC{})",
                t.name(),
                if t.verb() == Verb::Write {
                    " or UC"
                } else {
                    ""
                }
            ));
        }
        if self.conn == Conn::Uc && matches!(t.verb(), Verb::Read | Verb::Atomic) {
            return Err(format!(
                "{} needs -c RC (UC has no READ or atomics)",
                t.name()
            ));
        }
        if self.events && t.verb() == Verb::Write {
            return Err("events (-e) are not available on WRITE tests (as in perftest)".into());
        }
        if duration.is_some() && self.all {
            return Err("duration mode (-D) does not run all sizes (-a)".into());
        }
        if duration.is_some() && self.events {
            return Err("duration mode (-D) does not work with events (-e)".into());
        }
        if self.duration.is_some() && self.iters.is_some() {
            return Err("give either -n or -D, not both".into());
        }
        if let Some(d) = duration {
            if !(d > 0.0 && d.is_finite()) {
                return Err("-D needs a positive number of seconds".into());
            }
        }
        if lat && self.qps != 1 {
            return Err("multiple QPs (-q) only work with bandwidth tests".into());
        }
        if self.qps == 0 || self.qps > 1024 {
            return Err("-q must be 1..1024".into());
        }
        let mut sizes = if t.verb() == Verb::Atomic {
            if self.size.is_some_and(|s| s != 8) || self.all {
                return Err("atomics are always 8 bytes (-s and -a do not apply)".into());
            }
            vec![8]
        } else if self.all {
            let max = self.max_size.unwrap_or(MAX_SIZE).min(MAX_SIZE);
            (1..=23).map(|i| 1u64 << i).filter(|&s| s <= max).collect()
        } else {
            vec![self.size.unwrap_or(if lat { 2 } else { 65536 })]
        };
        if self.conn == Conn::Ud {
            // UD messages fit one packet: perftest's -a stops at the MTU, and
            // its default size is clamped to it; a size asked for with -s
            // that does not fit is an error.
            let mtu = u64::from(self.mtu.unwrap_or(4096).min(active_mtu.unwrap_or(4096)));
            if self.all {
                sizes.retain(|&s| s <= mtu);
            } else if sizes[0] > mtu && self.size.is_none() {
                // Said by the client once its MTU is known (`ud_clamp_note`).
                sizes[0] = mtu;
            } else if sizes[0] > mtu {
                return Err(format!(
                    "-s {}: UD messages must fit one MTU ({mtu} bytes); give -s {mtu} or less",
                    sizes[0]
                ));
            }
        }
        if sizes.is_empty() || sizes.iter().any(|&s| s == 0 || s > MAX_SIZE) {
            return Err(format!("message sizes must be 1..={MAX_SIZE} bytes"));
        }
        let iters = self.iters.unwrap_or(if lat { 1000 } else { 5000 });
        if duration.is_none() && lat && iters < 5 {
            return Err("latency tests need at least 5 iterations (-n)".into());
        }
        if iters == 0 {
            return Err("-n must be positive".into());
        }
        let tx_depth = self.tx_depth.unwrap_or(if lat { 1 } else { 128 });
        if tx_depth == 0 || tx_depth > 8192 {
            return Err("-t must be 1..8192".into());
        }
        let rx_depth = self.rx_depth.unwrap_or(512).clamp(1, 8192);
        // perftest gives a device with vendor id 0 no inline data by default.
        let inline = self.inline.unwrap_or(0);
        if inline > 256 {
            return Err("-I: softrdma sends at most 256 bytes inline".into());
        }
        Ok(Params {
            test: t,
            sizes,
            iters,
            duration,
            conn: self.conn,
            qps: self.qps,
            tx_depth,
            rx_depth,
            cq_mod: self.cq_mod.clamp(1, tx_depth),
            atomic: self.atomic,
            inline,
            check: self.check,
            mtu: self.mtu,
            bidir: self.bidir,
            forever: self.run_infinitely,
            qp_timeout: self.qp_timeout,
            retry_count: self.retry_count,
            outs: self.outs.unwrap_or(16),
            gbits: self.report_gbits,
            rdma_cm: self.rdma_cm && self.conn == Conn::Rc,
            cm_port: self.port,
        })
    }

    /// perftest's note when the default size of a UD test was clamped.
    fn ud_clamp_note(&self, p: &Params) -> Option<String> {
        let default = if self.test.is_lat() { 2 } else { 65536 };
        (p.conn == Conn::Ud && !self.all && self.size.is_none() && p.sizes[0] < default).then(
            || {
                format!(
                    " Max msg size in UD is MTU {}\n Changing to this MTU",
                    p.sizes[0]
                )
            },
        )
    }

    /// What the options accepted without effect are, said once on stderr.
    fn report_ignored(&self) {
        if self.spawned || self.json {
            return;
        }
        let mut v = self.ignored.given();
        let mut add = |on: bool, name: &str, why: &'static str| {
            if on {
                v.push((name.to_string(), why));
            }
        };
        add(
            self.rdma_cm && self.conn != Conn::Rc,
            "-R/--rdma_cm",
            "softrdma's connection manager connects RC QPs; UC and UD QPs are set up from the TCP exchange",
        );
        add(
            self.rdma_cm && self.mtu.is_some(),
            "-m with -R",
            "the connection manager settles the path MTU (the smaller active MTU)",
        );
        add(
            self.com_rdma_cm,
            "-z/--com_rdma_cm",
            "parameters go over the TCP exchange",
        );
        add(
            self.sl != 0,
            "-S/--sl",
            "RoCEv2 over UDP carries no service level",
        );
        add(
            self.tos.is_some(),
            "-T/--tos",
            "the IP header's type of service is not set",
        );
        add(
            self.post_list.is_some_and(|l| l > 1),
            "-l/--post_list",
            "WRs are posted one by one (the same traffic)",
        );
        add(
            self.recv_post_list.is_some_and(|l| l > 1),
            "--recv_post_list",
            "receives are posted one by one",
        );
        add(self.cpu_freq, "-F/--CPU-freq", "no CPU frequency is used");
        for (name, why) in v {
            eprintln!("softrdma perf: ignoring {name}: {why}");
        }
    }

    fn device_config(&self, devices: &[String]) -> Result<softrdma::DeviceConfig, String> {
        let mut cfg = crate::hosts::device(devices, self.device.as_deref())?;
        if let Some(ip) = self.source_ip {
            let port = match cfg.bind {
                softrdma::config::Bind::Addr(a) => a.port(),
                softrdma::config::Bind::AutoLoopback { port } => port,
            };
            cfg.bind = softrdma::config::Bind::Addr(SocketAddr::new(ip, port));
        }
        if let Some(t) = self.transport {
            cfg = cfg.transport(t.lib());
        }
        if let Some(c) = &self.capture {
            cfg = cfg.capture(c);
        }
        if let Some(f) = &self.fault {
            let spec: softrdma::FaultSpec = f.parse().map_err(|e| format!("--fault: {e}"))?;
            cfg = cfg.fault(spec);
        }
        Ok(cfg)
    }
}

/// Where output goes: perftest text (stdout), JSON, or nothing (spawned server).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Out {
    Text,
    Json,
    Quiet,
}

/// Runs `softrdma perf`.
pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    args.report_ignored();
    let r = if args.server {
        run::server(args, devices)
    } else if let Some(h) = &args.host {
        run::client(args, devices, h, args.port)
    } else {
        both(args, devices)
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("softrdma perf: {e}");
            ExitCode::from(2)
        }
    }
}

/// The main job: start a server process, run the client against it.
fn both(args: &Args, devices: &[String]) -> Result<bool, String> {
    // Validate here so a bad option fails (once) before a process is started.
    args.params(None)?;
    args.device_config(devices)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("perf")
        .arg(args.test.name())
        .args(["--server", "--spawned", "--port", "0"]);
    if let Some(t) = args.transport {
        cmd.args(["--transport", t.name()]);
    }
    if let Some(d) = &args.device {
        cmd.args(["--ib-dev", d]);
    }
    // The same devices as this end (as SOFTRDMA_DEVICES is inherited);
    // --source_ip is this end's address alone (two processes cannot bind
    // one address), so the server keeps its default.
    for d in devices {
        cmd.args(["--device", d]);
    }
    if let Some(f) = &args.fault {
        cmd.args(["--fault", f]);
    }
    if args.events {
        cmd.arg("--events");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the server process: {e}"))?;
    let stdout = child.stdout.take();
    let guard = ChildGuard(Some(child));
    let port = read_spawn_port(stdout)?;
    let r = run::client(args, devices, "127.0.0.1", port);
    let status = guard.finish(Duration::from_secs(5));
    match (r, status) {
        (Err(e), _) => Err(e),
        (Ok(ok), Ok(())) => Ok(ok),
        (Ok(_), Err(e)) => Err(e),
    }
}

/// Reads the port line of a spawned server.
fn read_spawn_port(out: Option<std::process::ChildStdout>) -> Result<u16, String> {
    let out = out.ok_or("the server process has no stdout")?;
    let mut r = BufReader::new(out);
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("reading the server's port: {e}"))?;
    let port = line
        .trim()
        .strip_prefix(SPAWN_READY)
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| {
            if line.is_empty() {
                "the server process exited before it was ready".to_string()
            } else {
                format!("unexpected first line from the server process: {line:?}")
            }
        })?;
    // Keep draining its stdout (it prints nothing more when spawned).
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut r, &mut sink);
    });
    Ok(port)
}

/// Owns the spawned server: waits for it, or ends it by its PID.
pub(crate) struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn finish(mut self, wait: Duration) -> Result<(), String> {
        let Some(mut c) = self.0.take() else {
            return Ok(());
        };
        let start = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => return Err(format!("the server process failed ({s})")),
                Ok(None) if start.elapsed() < wait => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return Err("the server process did not finish; it was stopped".into());
                }
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Connects to the server, retrying while it starts.
fn connect(host: &str, port: u16, wait: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let start = Instant::now();
    loop {
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        if start.elapsed() > wait {
            return Err(format!(
                "cannot connect to the server at {host}:{port} ({}) after trying for {:.1} s: {} \
                 (is a `softrdma perf --server` running there, on port {port}?)",
                addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                start.elapsed().as_secs_f64(),
                last.map_or("no address".to_string(), |e| e.to_string()),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prints progress of long runs on stderr, only when it is a terminal.
pub(crate) struct Progress {
    on: bool,
    last: Instant,
}

impl Progress {
    pub(crate) fn new(enabled: bool) -> Progress {
        Progress {
            on: enabled && std::io::stderr().is_terminal(),
            last: Instant::now(),
        }
    }
    pub(crate) fn say(&mut self, msg: impl FnOnce() -> String) {
        if self.on && self.last.elapsed() >= Duration::from_millis(250) {
            self.last = Instant::now();
            eprint!("\r\x1b[K{}", msg());
        }
    }
    pub(crate) fn done(&mut self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// The text heading of the result table.
fn table_head(p: &Params, gbits: bool) -> &'static str {
    if p.test.is_lat() {
        if p.duration.is_some() {
            LAT_DUR_HEAD
        } else {
            LAT_HEAD
        }
    } else if gbits {
        BW_HEAD_G
    } else {
        BW_HEAD
    }
}

fn addr_kind(t: Test) -> AddrKind {
    match t.verb() {
        Verb::Write => AddrKind::Rdma,
        Verb::Read => AddrKind::Read,
        _ => AddrKind::Basic,
    }
}

/// The header block for these parameters.
fn header<'a>(
    p: &Params,
    device: &'a str,
    mtu: u32,
    events: bool,
    role_client: bool,
    transport: &'a str,
) -> Header<'a> {
    let t = p.test;
    let rd = matches!(t.verb(), Verb::Read | Verb::Atomic);
    Header {
        title: t.title(p.atomic),
        device,
        qps: p.qps,
        conn: p.conn.name(),
        tx_depth: (role_client || t.ping_pong()).then_some(p.tx_depth),
        rx_depth: (t.verb() == Verb::Send && (!role_client || t.ping_pong())).then_some(p.rx_depth),
        cq_mod: (!t.is_lat()).then_some(p.cq_mod),
        mtu,
        inline: (!rd).then_some(p.inline),
        out_reads: rd.then_some(u32::from(p.outs)),
        events,
        transport,
        duration: p.duration,
        rdma_cm: p.rdma_cm,
    }
}

/// JSON document of a run.
#[allow(clippy::too_many_arguments)]
fn json_doc(
    p: &Params,
    role: &str,
    device: &str,
    mtu: u32,
    gbits: bool,
    local: &[report::Addr],
    remote: &[report::Addr],
    rows: &[Row],
    check: Option<bool>,
    path: &str,
) -> serde_json::Value {
    let gid = |g: &[u8; 16]| std::net::Ipv6Addr::from(*g).to_string();
    let addr = |a: &report::Addr| {
        json!({"lid": a.lid, "qpn": a.qpn, "psn": a.psn, "rkey": a.rkey,
               "vaddr": a.vaddr, "gid": gid(&a.gid)})
    };
    let units = if p.test.is_lat() {
        "usec"
    } else if gbits {
        "Gb/sec"
    } else {
        "MB/sec"
    };
    json!({
        "test": p.test.name(),
        "title": p.test.title(p.atomic),
        "role": role,
        "device": device,
        "path": path,
        "connection": p.conn.name(),
        "qps": p.qps,
        "mtu": mtu,
        "tx_depth": p.tx_depth,
        "cq_mod": p.cq_mod,
        "inline": p.inline,
        "iterations": p.iters,
        "duration_s": p.duration,
        "bw_units": units,
        "local": local.iter().map(addr).collect::<Vec<_>>(),
        "remote": remote.iter().map(addr).collect::<Vec<_>>(),
        "results": rows,
        "check": check.map(|c| if c { "passed" } else { "failed" }),
    })
}

pub(crate) fn note_ud_clamp(args: &Args, p: &Params) {
    if let Some(n) = args.ud_clamp_note(p) {
        if args.output.is_none() && !args.json {
            eprintln!("{n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn params(argv: &[&str]) -> Result<Params, String> {
        let mut v = vec!["x"];
        v.extend_from_slice(argv);
        T::try_parse_from(v)
            .map_err(|e| e.to_string())?
            .a
            .params(None)
    }

    #[test]
    fn defaults_follow_perftest() {
        let p = params(&["write_lat"]).unwrap();
        assert_eq!((p.sizes.clone(), p.iters, p.tx_depth), (vec![2], 1000, 1));
        let p = params(&["write_bw"]).unwrap();
        assert_eq!(
            (p.sizes.clone(), p.iters, p.tx_depth),
            (vec![65536], 5000, 128)
        );
        let p = params(&["ib_send_lat", "-a", "-c", "ud"]).unwrap();
        assert_eq!(*p.sizes.last().unwrap(), 4096);
        let p = params(&["write_lat", "-a"]).unwrap();
        assert_eq!(
            (p.sizes[0], *p.sizes.last().unwrap(), p.sizes.len()),
            (2, 1 << 23, 23)
        );
        let p = params(&["write_lat", "-a", "--max-size", "64"]).unwrap();
        assert_eq!(p.sizes, vec![2, 4, 8, 16, 32, 64]);
    }

    #[test]
    fn rejects_what_perftest_rejects() {
        for bad in [
            &["read_lat", "-c", "UD"][..],
            &["atomic_bw", "-c", "UC"],
            &["write_bw", "-e"],
            &["send_lat", "-q", "2"],
            &["send_bw", "-D", "1", "-a"],
            &["send_lat", "-c", "UD", "-s", "8192"],
            &["write_lat", "-b"],
            &["write_lat", "--output=bandwidth"],
            &["write_bw", "--output=latency"],
            &["write_bw", "-x", "1"],
            &["write_bw", "-m", "1500"],
            &["write_bw", "-i", "2"],
            &["write_bw", "-u", "32"],
            &["write_bw", "-S", "16"],
            &["read_bw", "-o", "17"],
            &["send_bw", "-b"],
            &["write_bw", "--run_infinitely", "-n", "5"],
        ] {
            assert!(params(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn perftest_defaults_and_clamping() {
        // send_bw -c UD: the default 65536 is clamped to the MTU, as perftest does.
        let p = params(&["send_bw", "-c", "UD"]).unwrap();
        assert_eq!(p.sizes, vec![4096]);
        let p = params(&["send_bw", "-c", "UD", "-m", "1024"]).unwrap();
        assert_eq!(p.sizes, vec![1024]);
        let p = params(&[
            "write_bw", "-x", "0", "-m", "1024", "-b", "-F", "-u", "10", "-o", "4",
        ])
        .unwrap();
        assert_eq!(
            (p.mtu, p.bidir, p.qp_timeout, p.outs),
            (Some(1024), true, 10, 4)
        );
        let p = params(&["write_bw", "--run_infinitely"]).unwrap();
        assert_eq!((p.duration, p.forever), (Some(5.0), true));
        let p = params(&["write_bw", "--run_infinitely", "-D", "1"]).unwrap();
        assert_eq!(p.duration, Some(1.0));
    }

    #[test]
    fn options_without_meaning_are_accepted_and_named() {
        let v = vec![
            "x",
            "write_bw",
            "--odp",
            "-H",
            "--rate_limit",
            "5",
            "--use_hugepages",
            "-R",
        ];
        let a = T::try_parse_from(v).unwrap().a;
        let names: Vec<String> = a.ignored.given().into_iter().map(|g| g.0).collect();
        assert_eq!(
            names,
            [
                "-H/--report-histogram",
                "--odp",
                "--use_hugepages",
                "--rate_limit"
            ]
        );
        assert!(a.rdma_cm && a.params(None).is_ok());
    }

    #[test]
    fn names_and_titles() {
        assert_eq!(Test::WriteLat.name(), "write_lat");
        assert_eq!(
            Test::WriteLat.title(AtomicOp::FetchAndAdd),
            "RDMA_Write Latency Test"
        );
        assert_eq!(Test::SendBw.title(AtomicOp::FetchAndAdd), "Send BW Test");
        assert_eq!(
            Test::AtomicLat.title(AtomicOp::CmpAndSwap),
            "Atomic CMP_AND_SWAP Latency Test"
        );
    }
}
