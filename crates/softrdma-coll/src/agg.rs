//! In-network aggregation: the service that plays the switch (`aggd`, as
//! SHARP's aggregation nodes and SwitchML's switch program do) and the
//! ranks' side of it.
//!
//! **Joining.** After the mesh is up, rank 0 draws a job id and
//! broadcasts it; every rank opens a TCP control connection to the
//! service and sends `softrdma-agg/1 job=J rank=R size=N\t<hello>`, the
//! hello of a two-party transport (`net.rs`, the rank at index 0 and the
//! service at index 1: one RC QP, a slot region each way). When all N
//! ranks of job J have joined, the service connects one QP per rank and
//! answers each with `ok\t<its hello>`; the rank connects its QP. The
//! control connection stays open for the life of the communicator: its
//! close ends the job at the service.
//!
//! **An all-reduce.** Each rank streams a 24-byte header (magic, data
//! type, operator, sequence number, element count) and its vector over
//! its QP. The service checks that every rank's header agrees, then for
//! each chunk of the vector receives the chunk from rank 0, 1, …, N−1 in
//! that order, folding each into an accumulator (`acc = acc op x_r`,
//! the reference's order: results are bit-identical run to run and to a
//! left fold over the ranks), and streams the reduced chunk back to every
//! rank. Chunks pipeline: a rank keeps up to `depth` chunks ahead of the
//! results it has taken. Each rank's link carries its vector once each
//! way, against 2(N−1)/N of it each way for a ring.
//!
//! **Loss.** The streams are RC: a lost packet is retransmitted by the
//! transport, a duplicate dropped by its sequence check, so no
//! contribution is counted twice or lost; a header naming the wrong
//! sequence number ends the job.
//!
//! **Failure.** Every in-network all-reduce ends with an agreement round
//! on the host mesh (a one-byte all-reduce of "my result is complete").
//! If any rank's stream to the service failed (the service died, timed
//! out or refused), all ranks drop the service and run the host
//! algorithm on their original input, so the result is still correct. A
//! dead rank makes the service time out and close the job, and the
//! other ranks' agreement round fails with the mesh's error: an error,
//! not a hang.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use softrdma::{Context, DeviceConfig};

use crate::bytes::{as_bytes, as_bytes_mut};
use crate::elem::{reduce_into, DataType, Element, ReduceOp};
use crate::net::{Hello, Net, Pending};
use crate::{Error, Result};

const MAGIC: u32 = 0x4147_4731; // "AGG1"
const HDR: usize = 24;
const MAX_LINE: u64 = 1 << 16;
/// Ranks one job may have at the service.
pub const MAX_JOB_RANKS: usize = 1024;

/// One all-reduce's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpHeader {
    dtype: DataType,
    op: ReduceOp,
    seq: u64,
    count: u64,
}

impl OpHeader {
    fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = DataType::ALL
            .iter()
            .position(|d| *d == self.dtype)
            .unwrap_or(0) as u8;
        b[5] = ReduceOp::ALL
            .iter()
            .position(|o| *o == self.op)
            .unwrap_or(0) as u8;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// Checks every field of a header read from a rank.
    fn decode(b: &[u8; HDR]) -> std::result::Result<OpHeader, String> {
        let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#x}"));
        }
        let dtype = *DataType::ALL
            .get(b[4] as usize)
            .ok_or_else(|| format!("data type code {}", b[4]))?;
        let op = *ReduceOp::ALL
            .get(b[5] as usize)
            .ok_or_else(|| format!("operator code {}", b[5]))?;
        if op == ReduceOp::Avg {
            return Err("avg reaches the service as sum".into());
        }
        if b[6] != 0 || b[7] != 0 {
            return Err("reserved bytes set".into());
        }
        let seq = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let count = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
        if count == 0 || count.checked_mul(dtype.size() as u64).is_none() {
            return Err(format!("element count {count}"));
        }
        Ok(OpHeader {
            dtype,
            op,
            seq,
            count,
        })
    }
}

fn read_line(r: &mut BufReader<TcpStream>, what: &str) -> Result<String> {
    let mut s = String::new();
    let n = r
        .by_ref()
        .take(MAX_LINE)
        .read_line(&mut s)
        .map_err(|e| Error::Bootstrap(format!("aggregation service: reading {what}: {e}")))?;
    if n == 0 || !s.ends_with('\n') {
        return Err(Error::Bootstrap(format!(
            "aggregation service: {what}: connection closed or line too long"
        )));
    }
    s.pop();
    Ok(s)
}

/// A rank's link to the service.
pub(crate) struct AggLink {
    net: Net,
    seq: u64,
    /// Its close tells the service the job is over.
    _ctl: TcpStream,
}

impl AggLink {
    /// Joins job `job` of `size` ranks at the service at `addr`.
    #[allow(clippy::too_many_arguments)]
    pub fn join(
        ctx: Context,
        addr: SocketAddr,
        job: u64,
        rank: usize,
        size: usize,
        chunk: usize,
        depth: usize,
        timeout: Duration,
        spin: u32,
    ) -> Result<AggLink> {
        let pending = Pending::new(ctx, 0, 2, chunk, depth, timeout)?;
        let mine = pending.hello().to_line();
        let s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
            .map_err(|e| Error::Bootstrap(format!("aggregation service at {addr}: {e}")))?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(timeout))
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        let mut r = BufReader::new(s);
        r.get_mut()
            .write_all(
                format!("softrdma-agg/1 job={job:x} rank={rank} size={size}\t{mine}\n").as_bytes(),
            )
            .map_err(|e| Error::Bootstrap(format!("aggregation service at {addr}: {e}")))?;
        let line = read_line(&mut r, "its answer")?;
        let Some(theirs) = line.strip_prefix("ok\t") else {
            return Err(Error::Bootstrap(format!(
                "aggregation service at {addr} refused: {line:?}"
            )));
        };
        let theirs = Hello::parse(theirs, 2)?;
        if theirs.rank != 1 {
            return Err(Error::Bootstrap(format!(
                "aggregation service answered as party {}",
                theirs.rank
            )));
        }
        let table = [Hello::parse(&mine, 2)?, theirs];
        let mut net = pending.connect(&table)?;
        net.spin = spin;
        // Connected: the service writes only after this rank's first header.
        r.get_mut()
            .set_read_timeout(None)
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        Ok(AggLink {
            net,
            seq: 0,
            _ctl: r.into_inner(),
        })
    }

    /// Streams `src` to the service and its reduction (by `op`, which is
    /// not Avg) into `out`.
    pub fn all_reduce<T: Element>(&mut self, src: &[T], out: &mut [T], op: ReduceOp) -> Result<()> {
        self.stream(src, out, op).map_err(|e| {
            Error::Service(match e {
                Error::Peer { why, .. } => why,
                Error::Timeout(_) => "no result within the wait (dead or stuck)".into(),
                e => e.to_string(),
            })
        })
    }

    fn stream<T: Element>(&mut self, src: &[T], out: &mut [T], op: ReduceOp) -> Result<()> {
        debug_assert_eq!(src.len(), out.len());
        self.seq += 1;
        let h = OpHeader {
            dtype: T::DTYPE,
            op,
            seq: self.seq,
            count: src.len() as u64,
        };
        let pb = self.net.chunk;
        let (src, out) = (as_bytes(src), as_bytes_mut(out));
        if HDR + src.len() <= pb {
            // Small: header and vector in one slot (one WRITE pair, not two).
            let mut one = [0u8; 4096];
            if HDR + src.len() <= one.len() {
                one[..HDR].copy_from_slice(&h.encode());
                one[HDR..HDR + src.len()].copy_from_slice(src);
                self.net.send(1, &one[..HDR + src.len()])?;
                self.net.recv(1, out)?;
                return self.net.flush();
            }
        }
        self.net.send(1, &h.encode())?;
        let ahead = self.net.depth.max(1);
        let n = src.len().div_ceil(pb);
        let mut got = 0;
        for k in 0..n {
            let (a, b) = (k * pb, ((k + 1) * pb).min(src.len()));
            self.net.send(1, &src[a..b])?;
            if k + 1 >= ahead {
                let (a, b) = (got * pb, ((got + 1) * pb).min(out.len()));
                self.net.recv(1, &mut out[a..b])?;
                got += 1;
            }
        }
        while got < n {
            let (a, b) = (got * pb, ((got + 1) * pb).min(out.len()));
            self.net.recv(1, &mut out[a..b])?;
            got += 1;
        }
        self.net.flush()
    }
}

/// How the service runs.
#[derive(Debug, Clone)]
pub struct AggdConfig {
    /// Its device (default: the loopback scheme, with the environment:
    /// `SOFTRDMA_FAULT` and the others apply).
    pub device: DeviceConfig,
    /// Bound on every wait for a rank (a dead rank ends its job after it).
    pub timeout: Duration,
    /// Polls before a waiting job yields its core.
    pub spin: u32,
    /// Print a line per job to stderr.
    pub verbose: bool,
}

impl Default for AggdConfig {
    fn default() -> Self {
        AggdConfig {
            device: DeviceConfig::default_loopback().with_env(),
            timeout: Duration::from_secs(10),
            spin: 20_000,
            verbose: false,
        }
    }
}

struct Member {
    rank: usize,
    hello: Hello,
    ctl: BufReader<TcpStream>,
}

struct Forming {
    size: usize,
    members: Vec<Member>,
    since: Instant,
}

type Registry = Arc<Mutex<HashMap<u64, Forming>>>;

/// Serves jobs on `listener` until `stop` is set: each job in a thread of
/// its own, any number of ops per job.
pub fn serve(listener: TcpListener, cfg: AggdConfig, stop: Arc<AtomicBool>) -> Result<()> {
    let ctx = Context::open_with(&cfg.device)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Bootstrap(e.to_string()))?;
    let reg: Registry = Arc::new(Mutex::new(HashMap::new()));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, peer)) => {
                let (ctx, cfg, reg, stop) = (ctx.clone(), cfg.clone(), reg.clone(), stop.clone());
                std::thread::spawn(move || {
                    if let Err(e) = admit(s, &ctx, &cfg, &reg, &stop) {
                        if cfg.verbose {
                            eprintln!("aggd: {peer}: {e}");
                        }
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::Bootstrap(format!("aggd: accept: {e}"))),
        }
    }
    Ok(())
}

/// Reads a join line; the member completing its job runs the job.
fn admit(
    s: TcpStream,
    ctx: &Context,
    cfg: &AggdConfig,
    reg: &Registry,
    stop: &AtomicBool,
) -> Result<()> {
    s.set_nonblocking(false)
        .map_err(|e| Error::Bootstrap(e.to_string()))?;
    s.set_read_timeout(Some(cfg.timeout))
        .map_err(|e| Error::Bootstrap(e.to_string()))?;
    let _ = s.set_nodelay(true);
    let mut r = BufReader::new(s);
    let line = read_line(&mut r, "a join")?;
    let refuse = |r: &mut BufReader<TcpStream>, why: String| -> Result<()> {
        let _ = r.get_mut().write_all(format!("err {why}\n").as_bytes());
        Err(Error::Bootstrap(why))
    };
    let (head, hello) = match line.split_once('\t') {
        Some(x) => x,
        None => return refuse(&mut r, "no hello".into()),
    };
    let mut f = head.split_whitespace();
    if f.next() != Some("softrdma-agg/1") {
        return refuse(&mut r, format!("not a softrdma-agg/1 join: {head:?}"));
    }
    let (mut job, mut rank, mut size) = (None, None, None);
    for kv in f {
        match kv.split_once('=') {
            Some(("job", v)) => job = u64::from_str_radix(v, 16).ok(),
            Some(("rank", v)) => rank = v.parse::<usize>().ok(),
            Some(("size", v)) => size = v.parse::<usize>().ok(),
            _ => return refuse(&mut r, format!("bad field {kv:?}")),
        }
    }
    let (Some(job), Some(rank), Some(size)) = (job, rank, size) else {
        return refuse(&mut r, format!("join needs job, rank, size: {head:?}"));
    };
    if !(1..=MAX_JOB_RANKS).contains(&size) || rank >= size {
        return refuse(&mut r, format!("rank {rank} of {size}"));
    }
    let hello = match Hello::parse(hello, 2) {
        Ok(h) if h.rank == 0 => h,
        Ok(h) => return refuse(&mut r, format!("hello of party {}", h.rank)),
        Err(e) => return refuse(&mut r, e.to_string()),
    };
    let members = {
        let mut m = reg
            .lock()
            .map_err(|_| Error::Protocol("registry poisoned".into()))?;
        m.retain(|_, f| f.since.elapsed() < cfg.timeout * 2);
        let f = m.entry(job).or_insert_with(|| Forming {
            size,
            members: Vec::new(),
            since: Instant::now(),
        });
        if f.size != size || f.members.iter().any(|x| x.rank == rank) {
            drop(m);
            return refuse(
                &mut r,
                format!("job {job:x}: rank {rank} of {size} conflicts"),
            );
        }
        f.members.push(Member {
            rank,
            hello,
            ctl: r,
        });
        if f.members.len() < size {
            return Ok(());
        }
        let mut f = m.remove(&job).expect("present");
        f.members.sort_by_key(|x| x.rank);
        f.members
    };
    if cfg.verbose {
        eprintln!("aggd: job {job:x}: {size} ranks joined");
    }
    let res = run_job(ctx, cfg, members, stop);
    if cfg.verbose {
        match &res {
            Ok(ops) => eprintln!("aggd: job {job:x}: ended after {ops} all-reduces"),
            Err(e) => eprintln!("aggd: job {job:x}: {e}"),
        }
    }
    res.map(|_| ())
}

/// Connects a job's ranks and serves its all-reduces until a rank's
/// control connection closes or anything fails; returns the op count.
fn run_job(
    ctx: &Context,
    cfg: &AggdConfig,
    mut members: Vec<Member>,
    stop: &AtomicBool,
) -> Result<u64> {
    let mut nets = Vec::with_capacity(members.len());
    let mut piece = usize::MAX;
    for m in &mut members {
        let p = Pending::new(ctx.clone(), 1, 2, m.hello.chunk, m.hello.depth, cfg.timeout)?;
        let mine = p.hello().to_line();
        let table = [
            Hello::parse(&m.hello.to_line(), 2)?,
            Hello::parse(&mine, 2)?,
        ];
        let mut net = p.connect(&table)?;
        net.spin = cfg.spin;
        piece = piece.min(net.chunk);
        nets.push(net);
        m.ctl
            .get_mut()
            .write_all(format!("ok\t{mine}\n").as_bytes())
            .map_err(|e| Error::Bootstrap(format!("answering rank {}: {e}", m.rank)))?;
    }
    for m in &mut members {
        m.ctl
            .get_mut()
            .set_nonblocking(true)
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
    }
    let mut seq = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(seq);
        }
        if !nets[0].wait_data(0, Duration::from_millis(100))? {
            // Idle: has a rank left (its control connection closed)?
            for m in &mut members {
                let mut b = [0u8; 1];
                match m.ctl.get_mut().read(&mut b) {
                    Ok(_) => return Ok(seq),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return Ok(seq),
                }
            }
            continue;
        }
        seq += 1;
        let mut first = None;
        for (r, net) in nets.iter_mut().enumerate() {
            let mut b = [0u8; HDR];
            net.recv(0, &mut b)?;
            let h = OpHeader::decode(&b)
                .map_err(|e| Error::Protocol(format!("rank {r}'s header: {e}")))?;
            if h.seq != seq {
                return Err(Error::Protocol(format!(
                    "rank {r} sent op {}, expected {seq}",
                    h.seq
                )));
            }
            match first {
                None => first = Some(h),
                Some(f) if f != h => {
                    return Err(Error::Protocol(format!(
                        "rank {r} sent {h:?}, rank 0 {f:?}"
                    )))
                }
                _ => {}
            }
        }
        let h = first.expect("a job has ranks");
        let count =
            usize::try_from(h.count).map_err(|_| Error::Protocol(format!("count {}", h.count)))?;
        match h.dtype {
            DataType::F32 => reduce_stream::<f32>(&mut nets, count, h.op, piece)?,
            DataType::F64 => reduce_stream::<f64>(&mut nets, count, h.op, piece)?,
            DataType::F16 => reduce_stream::<f16>(&mut nets, count, h.op, piece)?,
            DataType::Bf16 => reduce_stream::<bf16>(&mut nets, count, h.op, piece)?,
            DataType::I32 => reduce_stream::<i32>(&mut nets, count, h.op, piece)?,
            DataType::I64 => reduce_stream::<i64>(&mut nets, count, h.op, piece)?,
            DataType::U8 => reduce_stream::<u8>(&mut nets, count, h.op, piece)?,
        }
    }
}

/// One all-reduce at the service: per chunk, rank 0's part, then ranks
/// 1… folded in order, and the result to every rank.
fn reduce_stream<T: Element>(
    nets: &mut [Net],
    count: usize,
    op: ReduceOp,
    piece: usize,
) -> Result<()> {
    let pe = (piece / std::mem::size_of::<T>()).max(1);
    let mut acc = vec![T::default(); pe.min(count)];
    let mut tmp = vec![T::default(); pe.min(count)];
    let mut a = 0;
    while a < count {
        let len = pe.min(count - a);
        let (acc, tmp) = (&mut acc[..len], &mut tmp[..len]);
        nets[0].recv(0, as_bytes_mut(acc))?;
        for net in nets[1..].iter_mut() {
            net.recv(0, as_bytes_mut(tmp))?;
            reduce_into(op, acc, tmp);
        }
        for net in nets.iter_mut() {
            net.send(0, as_bytes(acc))?;
        }
        a += len;
    }
    for net in nets.iter_mut() {
        net.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = OpHeader {
            dtype: DataType::Bf16,
            op: ReduceOp::Max,
            seq: 7,
            count: 1031,
        };
        assert_eq!(OpHeader::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(OpHeader::decode(&b).is_err());
        let mut b = h.encode();
        b[4] = 7;
        assert!(OpHeader::decode(&b).is_err());
        let mut b = h.encode();
        b[5] = 4; // avg
        assert!(OpHeader::decode(&b).is_err());
        let mut b = h.encode();
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        assert!(OpHeader::decode(&b).is_err());
        let mut b = h.encode();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(OpHeader::decode(&b).is_err());
    }
}
