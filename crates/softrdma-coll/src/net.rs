//! The transport under the collectives: one RC QP per peer, and on each a
//! reliable byte stream made of RDMA WRITE_WITH_IMM into the peer's slots.
//!
//! Every rank registers a receive region with `depth` slots of `chunk`
//! bytes per peer (slot `k` of sender `i` at `(i·depth + k)·chunk`). A
//! sender copies up to `chunk` bytes into its staging slot and writes them,
//! with the length as immediate data, into the next slot at the peer; it
//! may do so while it holds a credit (a slot the peer has emptied) and
//! fewer than `depth` writes are unacknowledged. The receiver copies each
//! arrived slot into the peer's inbox and gives the slot back with a
//! zero-length SEND_WITH_IMM carrying the number of slots freed. Sends
//! are queued (never block) and receives drain the inbox, so a collective
//! written as "send to A, receive from B" cannot deadlock on slots.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, ConnectOptions, Context, Cq, Mr, Pd, Qp, QpEndpoint, QpType, RecvWr, RemoteRegion,
    SendOp, SendWr, WcOpcode, WorkCompletion,
};

use crate::Error;

const KIND_DATA: u64 = 1;
const KIND_CREDIT: u64 = 2;

/// One peer's queue pair and stream state.
struct Link {
    qp: Qp,
    /// The peer's receive area for this rank.
    remote: RemoteRegion,
    /// Slots free at the peer.
    credits: usize,
    /// Unacknowledged WRITEs (staging slots in use).
    inflight: usize,
    /// Unacknowledged credit SENDs.
    ctrl_inflight: usize,
    /// Next slot index to write (mod depth).
    send_seq: u64,
    /// Queued outgoing bytes: chunks and the offset already sent of the first.
    out: VecDeque<Vec<u8>>,
    out_off: usize,
    /// Next slot expected from the peer (mod depth).
    recv_seq: u64,
    /// Arrived bytes not yet taken.
    inbox: VecDeque<Vec<u8>>,
    in_off: usize,
    /// Slots emptied and not yet returned.
    owed: u32,
}

/// The per-rank transport: device, regions, CQs and one link per peer.
pub(crate) struct Net {
    pub rank: usize,
    pub size: usize,
    pub chunk: usize,
    pub depth: usize,
    pub timeout: Duration,
    links: Vec<Option<Link>>,
    scq: Cq,
    rcq: Cq,
    send_mr: Mr,
    recv_mr: Mr,
    wcs: Vec<WorkCompletion>,
    broken: Option<String>,
    _pd: Pd,
    _ctx: Context,
}

/// What a rank tells the others at bootstrap.
pub(crate) struct Hello {
    pub rank: usize,
    pub size: usize,
    pub chunk: usize,
    pub depth: usize,
    pub region: RemoteRegion,
    /// Its QP for each peer (None at its own index).
    pub endpoints: Vec<Option<QpEndpoint>>,
}

impl Hello {
    pub fn to_line(&self) -> String {
        let mut s = format!(
            "softrdma-coll/1 rank={} size={} chunk={} depth={}|{}",
            self.rank, self.size, self.chunk, self.depth, self.region
        );
        for e in &self.endpoints {
            match e {
                Some(e) => s.push_str(&format!("|{e}")),
                None => s.push_str("|-"),
            }
        }
        s
    }

    /// Parses and checks a peer's line: every field present and in range.
    pub fn parse(line: &str, size: usize) -> Result<Hello, Error> {
        let bad = |why: String| Error::Bootstrap(format!("bad hello {line:?}: {why}"));
        let fields: Vec<&str> = line.trim_end().split('|').collect();
        if fields.len() != size + 2 {
            return Err(bad(format!(
                "{} fields, want {} for a world of {size}",
                fields.len(),
                size + 2
            )));
        }
        let mut head = fields[0].split_whitespace();
        if head.next() != Some("softrdma-coll/1") {
            return Err(bad("not a softrdma-coll/1 hello".into()));
        }
        let mut vals = [None; 4];
        for kv in head {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("{kv:?}")))?;
            let i = match k {
                "rank" => 0,
                "size" => 1,
                "chunk" => 2,
                "depth" => 3,
                _ => return Err(bad(format!("unknown field {k}"))),
            };
            vals[i] = Some(v.parse::<usize>().map_err(|_| bad(format!("{k}={v:?}")))?);
        }
        let get = |i: usize, n: &str| vals[i].ok_or_else(|| bad(format!("no {n}")));
        let (rank, sz, chunk, depth) = (
            get(0, "rank")?,
            get(1, "size")?,
            get(2, "chunk")?,
            get(3, "depth")?,
        );
        if sz != size {
            return Err(bad(format!("world size {sz}, this rank has {size}")));
        }
        if rank >= size {
            return Err(bad(format!("rank {rank} outside 0..{size}")));
        }
        let region: RemoteRegion = fields[1].parse().map_err(|e| bad(format!("region: {e}")))?;
        let mut endpoints = Vec::with_capacity(size);
        for (j, f) in fields[2..].iter().enumerate() {
            if j == rank {
                if *f != "-" {
                    return Err(bad(format!("an endpoint for itself: {f:?}")));
                }
                endpoints.push(None);
            } else {
                endpoints.push(Some(
                    f.parse().map_err(|e| bad(format!("endpoint {j}: {e}")))?,
                ));
            }
        }
        Ok(Hello {
            rank,
            size,
            chunk,
            depth,
            region,
            endpoints,
        })
    }
}

/// The transport before connection: objects made, endpoints known.
pub(crate) struct Pending {
    net: Net,
    qps: Vec<Option<Qp>>,
}

pub(crate) fn connect_options() -> ConnectOptions {
    ConnectOptions {
        // 4.096 µs × 2^12 ≈ 17 ms per try, 7 retries: a dead peer is
        // noticed within about 150 ms of traffic towards it.
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    }
}

impl Pending {
    pub fn new(
        ctx: Context,
        rank: usize,
        size: usize,
        chunk: usize,
        depth: usize,
        timeout: Duration,
    ) -> Result<Pending, Error> {
        if size == 0 || rank >= size {
            return Err(Error::Invalid(format!("rank {rank} of world size {size}")));
        }
        if chunk == 0 || chunk >= 1 << 30 || depth == 0 || depth > 1024 {
            return Err(Error::Invalid(format!("chunk {chunk} / depth {depth}")));
        }
        let pd = ctx.alloc_pd()?;
        let area = (size * depth * chunk).max(4096);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let send_mr = pd.alloc_mr(area, AccessFlags::LOCAL_WRITE)?;
        let recv_mr = pd.alloc_mr(area, access)?;
        let per = (2 * depth + 4) as u32;
        let cqd = (per as usize * size.max(2)) as u32;
        let scq = ctx.create_cq(cqd)?;
        let rcq = ctx.create_cq(cqd)?;
        let opts = connect_options();
        let mut qps = Vec::with_capacity(size);
        for j in 0..size {
            if j == rank {
                qps.push(None);
                continue;
            }
            let qp = pd
                .create_qp(QpType::Rc, &scq, &rcq)
                .max_send_wr(per)
                .max_recv_wr(per)
                .max_send_sge(1)
                .max_recv_sge(1)
                .build()?;
            qp.init(&opts)?;
            for _ in 0..per {
                qp.post_recv(&RecvWr {
                    wr_id: j as u64,
                    sg_list: vec![],
                })?;
            }
            qps.push(Some(qp));
        }
        let net = Net {
            rank,
            size,
            chunk,
            depth,
            timeout,
            links: (0..size).map(|_| None).collect(),
            scq,
            rcq,
            send_mr,
            recv_mr,
            wcs: Vec::with_capacity(64),
            broken: None,
            _pd: pd,
            _ctx: ctx,
        };
        Ok(Pending { net, qps })
    }

    pub fn hello(&self) -> Hello {
        Hello {
            rank: self.net.rank,
            size: self.net.size,
            chunk: self.net.chunk,
            depth: self.net.depth,
            region: self.net.recv_mr.remote(),
            endpoints: self
                .qps
                .iter()
                .map(|q| q.as_ref().map(|q| q.endpoint()))
                .collect(),
        }
    }

    /// Connects every QP with the table of all ranks' hellos (index = rank).
    pub fn connect(mut self, table: &[Hello]) -> Result<Net, Error> {
        let (me, n) = (self.net.rank, self.net.size);
        if table.len() != n {
            return Err(Error::Bootstrap(format!(
                "{} hellos for {n} ranks",
                table.len()
            )));
        }
        let need = (n * self.net.depth * self.net.chunk) as u64;
        for (j, h) in table.iter().enumerate() {
            if h.rank != j || h.size != n {
                return Err(Error::Bootstrap(format!(
                    "hello {j} is for rank {} of {}",
                    h.rank, h.size
                )));
            }
            if h.chunk != self.net.chunk || h.depth != self.net.depth {
                return Err(Error::Bootstrap(format!(
                    "rank {j} uses chunk {} depth {}, this rank {} {}",
                    h.chunk, h.depth, self.net.chunk, self.net.depth
                )));
            }
            if j == me {
                continue;
            }
            if h.region.len < need {
                return Err(Error::Bootstrap(format!(
                    "rank {j} offers a {}-byte region, {need} needed",
                    h.region.len
                )));
            }
            let ep = h.endpoints[me]
                .ok_or_else(|| Error::Bootstrap(format!("rank {j} has no QP for rank {me}")))?;
            let qp = self.qps[j].take().expect("a QP per peer");
            qp.connect(&ep, &connect_options())?;
            let area = (me * self.net.depth * self.net.chunk) as u64;
            self.net.links[j] = Some(Link {
                qp,
                remote: RemoteRegion {
                    addr: h.region.at(area),
                    rkey: h.region.rkey,
                    len: (self.net.depth * self.net.chunk) as u64,
                },
                credits: self.net.depth,
                inflight: 0,
                ctrl_inflight: 0,
                send_seq: 0,
                out: VecDeque::new(),
                out_off: 0,
                recv_seq: 0,
                inbox: VecDeque::new(),
                in_off: 0,
                owed: 0,
            });
        }
        Ok(self.net)
    }
}

impl Net {
    pub fn context(&self) -> &Context {
        &self._ctx
    }

    fn check(&self) -> Result<(), Error> {
        match &self.broken {
            Some(why) => Err(Error::Broken(why.clone())),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: Error) -> Result<T, Error> {
        if self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
        Err(e)
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link, Error> {
        self.links
            .get_mut(peer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| Error::Invalid(format!("no link to rank {peer}")))
    }

    /// Queues `data` for `peer` (never blocks; sent as slots allow).
    pub fn send(&mut self, peer: usize, data: &[u8]) -> Result<(), Error> {
        self.check()?;
        if data.is_empty() {
            return Ok(());
        }
        let chunk = self.chunk;
        let l = self.link(peer)?;
        for c in data.chunks(chunk.max(1 << 16)) {
            l.out.push_back(c.to_vec());
        }
        self.pump(peer)
    }

    /// Fills `dst` with the next bytes from `peer`, waiting up to the timeout.
    pub fn recv(&mut self, peer: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.check()?;
        let mut got = 0;
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            let l = self.link(peer)?;
            while got < dst.len() {
                let Some(front) = l.inbox.front() else { break };
                let n = (front.len() - l.in_off).min(dst.len() - got);
                dst[got..got + n].copy_from_slice(&front[l.in_off..l.in_off + n]);
                got += n;
                l.in_off += n;
                if l.in_off == front.len() {
                    l.inbox.pop_front();
                    l.in_off = 0;
                }
            }
            if got == dst.len() {
                return Ok(());
            }
            if self.progress()? {
                idle = 0;
                continue;
            }
            if start.elapsed() > self.timeout {
                let e = Error::Timeout(format!(
                    "rank {} waited {:?} for {} bytes from rank {peer} (got {got})",
                    self.rank,
                    self.timeout,
                    dst.len()
                ));
                return self.fail(e);
            }
            idle = backoff(idle);
        }
    }

    /// Waits until every queued byte has been posted.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.check()?;
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            let pending = self.links.iter().flatten().any(|l| !l.out.is_empty());
            if !pending {
                return Ok(());
            }
            if self.progress()? {
                idle = 0;
                continue;
            }
            if start.elapsed() > self.timeout {
                let e = Error::Timeout(format!(
                    "rank {} could not send its queued data within {:?}",
                    self.rank, self.timeout
                ));
                return self.fail(e);
            }
            idle = backoff(idle);
        }
    }

    /// Polls both CQs and posts what can go. True when anything happened.
    fn progress(&mut self) -> Result<bool, Error> {
        let mut did = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let r = self.rcq.poll(&mut wcs, 64);
        if let Err(e) = r {
            return self.fail(e.into());
        }
        let mut res = Ok(());
        for wc in wcs.drain(..) {
            did = true;
            if res.is_ok() {
                res = self.on_recv(&wc);
            }
        }
        if let Err(e) = res {
            self.wcs = wcs;
            return self.fail(e);
        }
        let r = self.scq.poll(&mut wcs, 64);
        if let Err(e) = r {
            return self.fail(e.into());
        }
        for wc in wcs.drain(..) {
            did = true;
            if res.is_ok() {
                res = self.on_send(&wc);
            }
        }
        if let Err(e) = res {
            self.wcs = wcs;
            return self.fail(e);
        }
        self.wcs = wcs;
        for p in 0..self.size {
            if self.links[p].is_some() {
                if let Err(e) = self.pump(p) {
                    return self.fail(e);
                }
            }
        }
        Ok(did)
    }

    fn on_recv(&mut self, wc: &WorkCompletion) -> Result<(), Error> {
        let peer = wc.wr_id as usize;
        if !wc.status.is_ok() {
            return Err(Error::Peer {
                rank: peer,
                why: format!("receive completed with {:?}", wc.status),
            });
        }
        let (depth, chunk, me) = (self.depth, self.chunk, self.rank);
        let l = self
            .links
            .get_mut(peer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| Error::Protocol(format!("a receive for unknown peer {peer}")))?;
        l.qp.post_recv(&RecvWr {
            wr_id: peer as u64,
            sg_list: vec![],
        })?;
        match wc.opcode {
            WcOpcode::Recv => {
                // A credit return: slots the peer has emptied.
                let n = wc.imm_data as usize;
                if n == 0 || l.credits + n > depth {
                    return Err(Error::Protocol(format!(
                        "rank {peer} returned {n} slots, {} of {depth} already free",
                        l.credits
                    )));
                }
                l.credits += n;
            }
            WcOpcode::RecvRdmaWithImm => {
                let len = wc.imm_data as usize;
                if len == 0 || len > chunk {
                    return Err(Error::Protocol(format!(
                        "rank {peer} wrote a {len}-byte slot (chunk {chunk})"
                    )));
                }
                let slot = (l.recv_seq % depth as u64) as usize;
                let off = (peer * depth + slot) * chunk;
                let mut v = vec![0u8; len];
                self.recv_mr.read(off, &mut v)?;
                l.inbox.push_back(v);
                l.recv_seq += 1;
                l.owed += 1;
            }
            other => {
                return Err(Error::Protocol(format!(
                    "rank {me}: unexpected completion {other:?} from rank {peer}"
                )))
            }
        }
        Ok(())
    }

    fn on_send(&mut self, wc: &WorkCompletion) -> Result<(), Error> {
        let peer = (wc.wr_id >> 8) as usize;
        let kind = wc.wr_id & 0xff;
        if !wc.status.is_ok() {
            return Err(Error::Peer {
                rank: peer,
                why: format!("send completed with {:?}", wc.status),
            });
        }
        let l = self
            .links
            .get_mut(peer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| Error::Protocol(format!("a send completion for peer {peer}")))?;
        match kind {
            KIND_DATA => l.inflight = l.inflight.saturating_sub(1),
            KIND_CREDIT => l.ctrl_inflight = l.ctrl_inflight.saturating_sub(1),
            _ => return Err(Error::Protocol(format!("send completion kind {kind}"))),
        }
        Ok(())
    }

    /// Posts queued data while slots and staging allow, and owed credits.
    fn pump(&mut self, peer: usize) -> Result<(), Error> {
        let (depth, chunk) = (self.depth, self.chunk);
        let Some(l) = self.links[peer].as_mut() else {
            return Ok(());
        };
        while l.credits > 0 && l.inflight < depth {
            let Some(front) = l.out.front() else { break };
            let n = (front.len() - l.out_off).min(chunk);
            let slot = (l.send_seq % depth as u64) as usize;
            let off = (peer * depth + slot) * chunk;
            self.send_mr.write(off, &front[l.out_off..l.out_off + n])?;
            let op = SendOp::WriteWithImm {
                remote_addr: l.remote.at((slot * chunk) as u64),
                rkey: l.remote.rkey,
                imm: n as u32,
            };
            let wr = SendWr::new(
                ((peer as u64) << 8) | KIND_DATA,
                op,
                vec![self.send_mr.sge(off as u64, n as u32)],
            );
            l.qp.post_send(&wr)?;
            l.send_seq += 1;
            l.credits -= 1;
            l.inflight += 1;
            l.out_off += n;
            if l.out_off == front.len() {
                l.out.pop_front();
                l.out_off = 0;
            }
        }
        if l.owed > 0 && l.ctrl_inflight < depth {
            let wr = SendWr::new(
                ((peer as u64) << 8) | KIND_CREDIT,
                SendOp::SendWithImm { imm: l.owed },
                vec![],
            );
            l.qp.post_send(&wr)?;
            l.owed = 0;
            l.ctrl_inflight += 1;
        }
        Ok(())
    }
}

/// Spins a little, then naps: waiting ranks must not starve the others on
/// a machine with fewer cores than ranks.
fn backoff(idle: u32) -> u32 {
    if idle > 64 {
        std::thread::sleep(Duration::from_micros(20));
    } else {
        std::thread::yield_now();
    }
    idle + 1
}
