//! Collectives over softrdma: a communicator of ranks joined by a full mesh
//! of RC queue pairs, and `all_reduce`, `reduce_scatter`, `all_gather`,
//! `broadcast`, `reduce`, `all_to_all` and `barrier` on it.
//!
//! ```no_run
//! use softrdma_coll::{Communicator, Config, ReduceOp};
//! // Under mpirun, torchrun, or SOFTRDMA_COLL_RANK/_SIZE/_ADDR:
//! let mut comm = Communicator::from_env(Config::default()).unwrap();
//! let mut grad = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grad, ReduceOp::Sum).unwrap();
//! ```
//!
//! Built on the public `softrdma` API only: RC QPs, registered regions and
//! RDMA WRITE_WITH_IMM into slots of the peer's region (see `net.rs`).
//! Every algorithm receives from named peers in program order, so a
//! result never depends on arrival timing: with the same algorithm, size
//! and world, float results are bit-identical run to run.
//! [`Config::deterministic`] also fixes the algorithm choice (otherwise it
//! follows α and β measured at start-up, which vary).

#![warn(missing_docs)]

pub mod agg;
mod algo;
mod bootstrap;
mod bytes;
pub mod capi;
pub mod cost;
mod elem;
mod net;

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use agg::{serve as serve_aggd, AggdConfig};
pub use bootstrap::{Launch, Rendezvous, MAX_RANKS};
pub use cost::{Algorithm, Collective, CostModel};
pub use elem::{DataType, Element, ReduceOp};
pub use half::{bf16, f16};
pub use softrdma::{Context, DeviceConfig};

use agg::AggLink;
use net::{Net, Pending};

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// The verbs layer refused something.
    Verbs(softrdma::Error),
    /// Bootstrap failed (rendezvous, a peer's hello, launcher variables).
    Bootstrap(String),
    /// A peer broke the slot protocol.
    Protocol(String),
    /// A wait ran out of time (a peer is gone or stuck).
    Timeout(String),
    /// A peer's QP failed (it died or is unreachable).
    Peer {
        /// The peer.
        rank: usize,
        /// What the completion said.
        why: String,
    },
    /// The communicator failed before and cannot be used again.
    Broken(String),
    /// A bad argument (buffer lengths, root, algorithm for this collective).
    Invalid(String),
    /// The in-network aggregation service failed (died, timed out,
    /// refused): the in-network all-reduce falls back to the host.
    Service(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Verbs(e) => write!(f, "verbs: {e}"),
            Error::Bootstrap(s) => write!(f, "bootstrap: {s}"),
            Error::Protocol(s) => write!(f, "protocol: {s}"),
            Error::Timeout(s) => write!(f, "timeout: {s}"),
            Error::Peer { rank, why } => write!(f, "rank {rank} failed: {why}"),
            Error::Broken(s) => write!(f, "communicator failed earlier: {s}"),
            Error::Invalid(s) => write!(f, "invalid argument: {s}"),
            Error::Service(s) => write!(f, "aggregation service: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<softrdma::Error> for Error {
    fn from(e: softrdma::Error) -> Self {
        Error::Verbs(e)
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// How a communicator is made.
#[derive(Debug, Clone)]
pub struct Config {
    /// The device (default: the loopback scheme, with the environment).
    pub device: DeviceConfig,
    /// Slot size in bytes (the largest single WRITE, and the ring's
    /// pipeline piece). None: by the device's transport, see
    /// [`Config::chunk_bytes`]. Every rank must use the same.
    pub chunk: Option<usize>,
    /// Slots per peer.
    pub depth: usize,
    /// Bound on every wait (bootstrap and each collective).
    pub timeout: Duration,
    /// Pin the algorithm choice to the fixed default cost model, so that
    /// float results are bit-identical between runs.
    pub deterministic: bool,
    /// α, β, γ to use instead of measuring them.
    pub cost: Option<CostModel>,
    /// Force one algorithm wherever it applies.
    pub algorithm: Option<Algorithm>,
    /// Polls a waiting rank makes before it starts yielding its core
    /// (spinning is what small-message latency needs; ranks that share
    /// cores, such as threads in one test, want few).
    pub spin: u32,
    /// The in-network aggregation service to join (`softrdma aggd`);
    /// [`Algorithm::InNetwork`] uses it.
    pub aggd: Option<SocketAddr>,
    /// Bound on each wait for the service (joining, each chunk of a
    /// result): how long a dead service delays the fallback.
    pub agg_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            device: DeviceConfig::default_loopback().with_env(),
            chunk: None,
            depth: 8,
            timeout: Duration::from_secs(60),
            deterministic: false,
            cost: None,
            algorithm: None,
            spin: 20_000,
            aggd: None,
            agg_timeout: Duration::from_secs(5),
        }
    }
}

/// The slot size over the same-host path, and over UDP (or when either
/// may carry the ranks' traffic). Measured with 2 ranks, medians of five
/// alternating runs, same-host busbw at 1, 2 and 4 MiB: 6.72, 7.19 and
/// 5.83 GB/s with 128 KiB against 5.68, 6.49 and 4.71 with 256 KiB (and
/// no worse from 8 to 64 MiB); over UDP 128 KiB lost at 1 MiB (0.28–0.54
/// against 0.67–0.84 GB/s). docs/collectives.md.
const SHM_CHUNK: usize = 128 << 10;
const CHUNK: usize = 256 << 10;

impl Config {
    /// The slot size this configuration uses: `chunk`, else 128 KiB when
    /// the device's transport is the same-host path only, else 256 KiB.
    pub fn chunk_bytes(&self) -> usize {
        match (self.chunk, self.device.transport) {
            (Some(c), _) => c,
            (None, softrdma::shm::Transport::Shm) => SHM_CHUNK,
            (None, _) => CHUNK,
        }
    }

    /// Applies `SOFTRDMA_COLL_ALGO`, `SOFTRDMA_COLL_DETERMINISTIC`,
    /// `SOFTRDMA_COLL_TIMEOUT_MS`, `SOFTRDMA_COLL_CHUNK`, `SOFTRDMA_COLL_DEPTH`,
    /// `SOFTRDMA_COLL_SPIN`, `SOFTRDMA_COLL_AGGD` (HOST:PORT of the
    /// aggregation service), `SOFTRDMA_COLL_AGG_TIMEOUT_MS`
    /// and the cost overrides (`SOFTRDMA_COLL_ALPHA_US`, `_BW_GBPS`,
    /// `_REDUCE_GBPS`).
    pub fn with_env(mut self) -> Result<Self> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let bad = |k: &str, v: &str| Error::Invalid(format!("{k}={v:?}"));
        if let Some(v) = get("SOFTRDMA_COLL_ALGO") {
            self.algorithm = Some(v.parse().map_err(|e: String| Error::Invalid(e))?);
        }
        if let Some(v) = get("SOFTRDMA_COLL_DETERMINISTIC") {
            self.deterministic = v != "0";
        }
        if let Some(v) = get("SOFTRDMA_COLL_TIMEOUT_MS") {
            let ms: u64 = v.parse().map_err(|_| bad("SOFTRDMA_COLL_TIMEOUT_MS", &v))?;
            self.timeout = Duration::from_millis(ms.max(1));
        }
        if let Some(v) = get("SOFTRDMA_COLL_CHUNK") {
            self.chunk = Some(v.parse().map_err(|_| bad("SOFTRDMA_COLL_CHUNK", &v))?);
        }
        if let Some(v) = get("SOFTRDMA_COLL_SPIN") {
            self.spin = v.parse().map_err(|_| bad("SOFTRDMA_COLL_SPIN", &v))?;
        }
        if let Some(v) = get("SOFTRDMA_COLL_DEPTH") {
            self.depth = v.parse().map_err(|_| bad("SOFTRDMA_COLL_DEPTH", &v))?;
        }
        if let Some(v) = get("SOFTRDMA_COLL_AGGD") {
            use std::net::ToSocketAddrs;
            let a = v
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| bad("SOFTRDMA_COLL_AGGD", &v))?;
            self.aggd = Some(a);
        }
        if let Some(v) = get("SOFTRDMA_COLL_AGG_TIMEOUT_MS") {
            let ms: u64 = v
                .parse()
                .map_err(|_| bad("SOFTRDMA_COLL_AGG_TIMEOUT_MS", &v))?;
            self.agg_timeout = Duration::from_millis(ms.max(1));
        }
        self.cost = CostModel::from_env(self.cost)?;
        Ok(self)
    }
}

/// A group of ranks joined by RC queue pairs.
pub struct Communicator {
    net: Net,
    cost: CostModel,
    algorithm: Option<Algorithm>,
    deterministic: bool,
    agg: Option<AggLink>,
    agg_note: String,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.net.rank)
            .field("size", &self.net.size)
            .field("cost", &self.cost)
            .field("aggd", &self.agg_note)
            .finish()
    }
}

impl Communicator {
    /// Joins `size` ranks meeting at `rendezvous` (rank 0 listens there).
    pub fn new(rank: usize, size: usize, rendezvous: Rendezvous, cfg: Config) -> Result<Self> {
        if size == 0 || size > MAX_RANKS || rank >= size {
            return Err(Error::Invalid(format!("rank {rank} of world size {size}")));
        }
        let ctx = Context::open_with(&cfg.device)?;
        let chunk = cfg.chunk_bytes();
        let pending = Pending::new(ctx.clone(), rank, size, chunk, cfg.depth, cfg.timeout)?;
        let mine = pending.hello();
        let (table, exchange) = bootstrap::Exchange::run(rendezvous, &mine, cfg.timeout)?;
        let mut net = pending.connect(&table)?;
        net.spin = cfg.spin;
        exchange.finish()?;
        let mut comm = Communicator {
            net,
            cost: cfg.cost.unwrap_or_default(),
            algorithm: cfg.algorithm,
            deterministic: cfg.deterministic,
            agg: None,
            agg_note: "no service configured".into(),
        };
        if cfg.cost.is_none() && !cfg.deterministic && size > 1 {
            comm.cost = comm.measure()?;
        }
        if size > 1 {
            comm.join_aggd(ctx, &cfg)?;
        }
        Ok(comm)
    }

    /// Joins the aggregation service: rank 0 draws the job id, every rank
    /// joins, and a host round makes them agree on whether all did (a
    /// service one rank cannot reach is used by none).
    fn join_aggd(&mut self, ctx: Context, cfg: &Config) -> Result<()> {
        // First agree that every rank has a service configured: a rank
        // without one must not take the others' job id for data.
        let mut all = [cfg.aggd.is_some() as u8];
        let alg = self.host_algorithm(Collective::AllReduce, 1);
        self.host_all_reduce(&mut all, ReduceOp::Min, alg)?;
        self.net.flush()?;
        let Some(addr) = cfg.aggd else {
            return Ok(());
        };
        if all[0] == 0 {
            self.agg_note = format!("{addr}: not configured on every rank");
            return Ok(());
        }
        let mut job = [0i64];
        if self.net.rank == 0 {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let h = (t ^ ((std::process::id() as u64) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            job[0] = h as i64;
        }
        self.bcast_binomial(&mut job, 0)?;
        let joined = AggLink::join(
            ctx,
            addr,
            job[0] as u64,
            self.net.rank,
            self.net.size,
            self.net.chunk,
            self.net.depth,
            cfg.agg_timeout,
            self.net.spin,
        );
        let mut ok = [joined.is_ok() as u8];
        let alg = self.host_algorithm(Collective::AllReduce, 1);
        self.host_all_reduce(&mut ok, ReduceOp::Min, alg)?;
        self.net.flush()?;
        match (joined, ok[0]) {
            (Ok(l), 1) => {
                self.agg = Some(l);
                self.agg_note = format!("joined {addr}");
            }
            (Ok(_), _) => self.agg_note = format!("{addr}: another rank could not join"),
            (Err(e), _) => self.agg_note = format!("{addr}: {e}"),
        }
        Ok(())
    }

    /// Whether in-network all-reduces go to a service now (false when none
    /// was configured or joined, or after one failed).
    pub fn in_network(&self) -> bool {
        self.agg.is_some()
    }

    /// What became of the aggregation service: joined, or why not, or how
    /// it failed.
    pub fn aggd_status(&self) -> &str {
        &self.agg_note
    }

    /// Joins the job a launcher started (see [`Launch::from_env`]).
    pub fn from_env(cfg: Config) -> Result<Self> {
        let l = Launch::from_env()?.ok_or_else(|| {
            Error::Bootstrap(
                "no launcher variables (OMPI_COMM_WORLD_RANK/SIZE, RANK/WORLD_SIZE/MASTER_ADDR, \
                 or SOFTRDMA_COLL_RANK/SIZE/ADDR)"
                    .into(),
            )
        })?;
        Self::new(l.rank, l.size, Rendezvous::Addr(l.rendezvous), cfg)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.net.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.net.size
    }

    /// The device this rank's QPs live on (counters, address).
    pub fn context(&self) -> &Context {
        self.net.context()
    }

    /// The α-β-γ model the automatic choice uses.
    pub fn cost_model(&self) -> CostModel {
        self.cost
    }

    /// Forces an algorithm (None: choose by the cost model).
    pub fn set_algorithm(&mut self, a: Option<Algorithm>) {
        self.algorithm = a;
    }

    /// Sets the bound on each wait.
    pub fn set_timeout(&mut self, t: Duration) {
        self.net.timeout = t;
    }

    /// The model the choices use: the measured one, or in deterministic
    /// mode the fixed default (so that every run chooses alike).
    pub(crate) fn model(&self) -> CostModel {
        if self.deterministic {
            CostModel::default()
        } else {
            self.cost
        }
    }

    /// The algorithm a collective of `bytes` bytes runs with now.
    pub fn algorithm_for(&self, c: Collective, bytes: usize) -> Algorithm {
        let model = self.model();
        match self.algorithm {
            Some(Algorithm::InNetwork) if c == Collective::AllReduce && self.agg.is_some() => {
                Algorithm::InNetwork
            }
            Some(a) if a != Algorithm::InNetwork && a.applies(c) => a,
            _ => model.choose(c, self.net.size, bytes),
        }
    }

    /// The host algorithm a collective of `bytes` bytes would run with
    /// (the fallback of the in-network one).
    pub(crate) fn host_algorithm(&self, c: Collective, bytes: usize) -> Algorithm {
        match self.algorithm_for(c, bytes) {
            Algorithm::InNetwork => self.model().choose(c, self.net.size, bytes),
            a => a,
        }
    }

    /// α from 8-byte round trips and β from 1 MiB ones between ranks 0
    /// and 1, γ from a local f32 sum on rank 0; rank 0's figures are
    /// broadcast so that every rank chooses alike.
    fn measure(&mut self) -> Result<CostModel> {
        let mut vals = [0f64; 3];
        let (r, small, big) = (self.net.rank, 8usize, 1usize << 20);
        let mut buf = vec![0u8; big];
        let rounds = |net: &mut Net, len: usize, k: usize, buf: &mut [u8]| -> Result<f64> {
            let t = Instant::now();
            for _ in 0..k {
                if r == 0 {
                    net.send(1, &buf[..len])?;
                    net.recv(1, &mut buf[..len])?;
                } else if r == 1 {
                    net.recv(0, &mut buf[..len])?;
                    net.send(0, &buf[..len])?;
                }
                net.flush()?;
            }
            Ok(t.elapsed().as_secs_f64() / k as f64 / 2.0)
        };
        if r <= 1 {
            rounds(&mut self.net, small, 5, &mut buf)?; // warm-up
            let a = rounds(&mut self.net, small, 20, &mut buf)?;
            let b = rounds(&mut self.net, big, 3, &mut buf)?;
            vals[0] = a;
            vals[1] = ((b - a) / big as f64).max(1e-12);
        }
        if r == 0 {
            let mut x = vec![1.0f32; 1 << 18];
            let y = vec![2.0f32; 1 << 18];
            let t = Instant::now();
            for _ in 0..4 {
                elem::reduce_into(ReduceOp::Sum, &mut x, &y);
            }
            vals[2] = (t.elapsed().as_secs_f64() / 4.0 / (4 << 18) as f64).max(1e-13);
            std::hint::black_box(&x);
        }
        self.bcast_binomial(&mut vals, 0)?;
        let m = CostModel {
            alpha: vals[0],
            beta: vals[1],
            gamma: vals[2],
        };
        if !(m.alpha.is_finite() && m.beta.is_finite() && m.gamma.is_finite()) {
            return Err(Error::Protocol(format!("measured cost model {m:?}")));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma::shm::Transport;

    #[test]
    fn the_slot_size_follows_the_transport_unless_set() {
        let with = |t| Config {
            device: DeviceConfig::default_loopback().transport(t),
            ..Config::default()
        };
        assert_eq!(with(Transport::Shm).chunk_bytes(), 128 << 10);
        assert_eq!(with(Transport::Udp).chunk_bytes(), 256 << 10);
        assert_eq!(with(Transport::Auto).chunk_bytes(), 256 << 10);
        let set = Config {
            chunk: Some(4096),
            ..with(Transport::Shm)
        };
        assert_eq!(set.chunk_bytes(), 4096);
    }
}
