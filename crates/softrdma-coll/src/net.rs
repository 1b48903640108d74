//! The transport under the collectives: one RC QP per peer, and on each a
//! reliable byte stream made of RDMA WRITEs into the peer's slots.
//!
//! Every rank registers a receive region laid out as
//! `[data: size × depth × chunk][headers: size × depth × 8][credits: size × 8]`.
//! Sender `i` copies up to `chunk` bytes into its staging slot, WRITEs them
//! into slot `k = seq mod depth` of its area at the peer, then WRITEs the
//! slot's 8-byte header (`(seq + 1) << 32 | len`). RC executes WRITEs in
//! order at the responder, so a header that names the expected sequence
//! number means the data is there. The receiver polls the header of the
//! next slot in its own memory (no receive completions, which on the
//! same-host path wait for the peer's progress thread), copies the bytes
//! out, and WRITEs the number of slots it has emptied into the sender's
//! credit word. A sender writes while fewer than `depth` slots are
//! unreturned and fewer than `depth` of its WRITEs are unacknowledged.
//! Sends are queued (never block) and receives take bytes in order, so a
//! collective written as "send to A, receive from B" cannot deadlock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, ConnectOptions, Context, Cq, Mr, Pd, Qp, QpEndpoint, QpType, RemoteRegion, SendOp,
    SendWr, WorkCompletion,
};

use crate::Error;

const KIND_DATA: u64 = 1;
const KIND_HDR: u64 = 2;
const KIND_CREDIT: u64 = 3;

/// Byte layout of a rank's regions for `size` ranks.
#[derive(Clone, Copy)]
struct Layout {
    size: usize,
    depth: usize,
    chunk: usize,
}

impl Layout {
    fn data(&self, from: usize, slot: usize) -> usize {
        (from * self.depth + slot) * self.chunk
    }
    fn header(&self, from: usize, slot: usize) -> usize {
        self.size * self.depth * self.chunk + (from * self.depth + slot) * 8
    }
    fn credit(&self, from: usize) -> usize {
        self.size * self.depth * (self.chunk + 8) + from * 8
    }
    fn len(&self) -> usize {
        self.size * self.depth * (self.chunk + 8) + self.size * 8
    }
}

/// One peer's queue pair and stream state.
struct Link {
    qp: Qp,
    /// The peer's whole receive region.
    remote: RemoteRegion,
    /// Unacknowledged data WRITEs (staging slots in use).
    inflight: usize,
    /// Unacknowledged credit WRITEs.
    ctrl_inflight: usize,
    /// Slots written so far.
    send_seq: u64,
    /// Slots the peer has given back (its last credit word).
    returned: u64,
    /// Queued outgoing bytes: chunks and the offset already sent of the first.
    out: VecDeque<Vec<u8>>,
    out_off: usize,
    /// Slots seen arrived from the peer.
    recv_seq: u64,
    /// Arrived slots not yet emptied (lengths, oldest first: slot
    /// `recv_seq - inbox.len() + i`), and the bytes taken of the first.
    inbox: VecDeque<usize>,
    in_off: usize,
    /// Slots emptied so far, and the count last written to the peer.
    consumed: u64,
    told: u64,
}

/// The per-rank transport: device, regions, CQ and one link per peer.
pub(crate) struct Net {
    pub rank: usize,
    pub size: usize,
    pub chunk: usize,
    pub depth: usize,
    pub timeout: Duration,
    /// Polls before a waiting rank starts yielding its core.
    pub spin: u32,
    lay: Layout,
    links: Vec<Option<Link>>,
    cq: Cq,
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
/// The transport before connection: objects made, endpoints known.
pub(crate) struct Pending {
    net: Net,
    qps: Vec<Option<Qp>>,
}

pub(crate) fn connect_options() -> ConnectOptions {
    ConnectOptions {
        // 4.096 µs × 2^14 ≈ 67 ms per try, 7 retries: a dead peer is
        // noticed within about half a second of traffic towards it, and a
        // live one descheduled for a few hundred milliseconds (8 ranks on
        // 2 loaded cores; 2^12's 150 ms was exhausted there) is not
        // mistaken for dead.
        timeout: 14,
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
        let lay = Layout { size, depth, chunk };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let send_mr = pd.alloc_mr(lay.len().max(4096), AccessFlags::LOCAL_WRITE)?;
        let recv_mr = pd.alloc_mr(lay.len().max(4096), access)?;
        let per = (3 * depth + 4) as u32;
        let cq = ctx.create_cq((per as usize * size.max(2)) as u32)?;
        let opts = connect_options();
        let mut qps = Vec::with_capacity(size);
        for j in 0..size {
            if j == rank {
                qps.push(None);
                continue;
            }
            let qp = pd
                .create_qp(QpType::Rc, &cq, &cq)
                .max_send_wr(per)
                .max_recv_wr(1)
                .max_send_sge(1)
                .max_recv_sge(1)
                .build()?;
            qp.init(&opts)?;
            qps.push(Some(qp));
        }
        let net = Net {
            rank,
            size,
            chunk,
            depth,
            timeout,
            spin: 20_000,
            lay,
            links: (0..size).map(|_| None).collect(),
            cq,
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
        let need = self.net.lay.len() as u64;
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
            self.net.links[j] = Some(Link {
                qp,
                remote: h.region,
                inflight: 0,
                ctrl_inflight: 0,
                send_seq: 0,
                returned: 0,
                out: VecDeque::new(),
                out_off: 0,
                recv_seq: 0,
                inbox: VecDeque::new(),
                in_off: 0,
                consumed: 0,
                told: 0,
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
        // Post straight from the caller's buffer while slots allow; queue
        // (copy) only the rest.
        let l = self.link(peer)?;
        let direct = if l.out.is_empty() {
            match self.post_from(peer, data) {
                Ok(n) => n,
                Err(e) => return self.fail(e),
            }
        } else {
            0
        };
        if direct < data.len() {
            let chunk = self.chunk.max(1 << 16);
            let l = self.link(peer)?;
            for c in data[direct..].chunks(chunk) {
                l.out.push_back(c.to_vec());
            }
        }
        Ok(())
    }

    /// Fills `dst` with the next bytes from `peer`, waiting up to the timeout.
    pub fn recv(&mut self, peer: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.recv_sending(peer, dst, None)
    }

    /// [`Net::recv`] that also posts `src[*sent..]` to `to` straight from
    /// `src`, as slots allow, and moves `*sent` past what it posted. A
    /// ring posts the segment it keeps unchanged this way between its
    /// receives instead of copying it into the send queue; posting while
    /// it waits keeps two ranks that wait on each other moving. The caller
    /// hands what is left to [`Net::send`] before it sends anything else
    /// to `to`.
    pub fn recv_sending(
        &mut self,
        peer: usize,
        dst: &mut [u8],
        mut send: Option<(usize, &[u8], &mut usize)>,
    ) -> Result<(), Error> {
        self.check()?;
        let mut got = 0;
        let start = Instant::now();
        let mut idle = 0u32;
        let (depth, lay) = (self.depth, self.lay);
        self.link(peer)?;
        loop {
            if let Some((to, src, sent)) = send.as_mut() {
                self.offer(*to, src, sent)?;
            }
            let l = self.links[peer].as_mut().expect("checked");
            let mut freed = false;
            while got < dst.len() {
                let Some(&len) = l.inbox.front() else { break };
                let seq = l.recv_seq - l.inbox.len() as u64;
                let slot = (seq % depth as u64) as usize;
                let off = lay.data(peer, slot) + l.in_off;
                let n = (len - l.in_off).min(dst.len() - got);
                self.recv_mr.read(off, &mut dst[got..got + n])?;
                got += n;
                l.in_off += n;
                if l.in_off == len {
                    l.inbox.pop_front();
                    l.in_off = 0;
                    l.consumed += 1;
                    freed = true;
                }
            }
            if freed {
                if let Err(e) = self.pump(peer) {
                    return self.fail(e);
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
            idle = backoff(idle, self.spin);
        }
    }

    /// Posts what slots allow of `src[*sent..]` to `to`, unless earlier
    /// sends are still queued there (the stream stays in order).
    fn offer(&mut self, to: usize, src: &[u8], sent: &mut usize) -> Result<(), Error> {
        if *sent >= src.len() || !self.link(to)?.out.is_empty() {
            return Ok(());
        }
        match self.post_from(to, &src[*sent..]) {
            Ok(n) => {
                *sent += n;
                Ok(())
            }
            Err(e) => self.fail(e),
        }
    }

    /// Waits up to `wait` for bytes from `peer` without failing the
    /// transport when none come (the service's idle poll): true when some
    /// have arrived.
    pub fn wait_data(&mut self, peer: usize, wait: Duration) -> Result<bool, Error> {
        self.check()?;
        self.link(peer)?;
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            if !self.links[peer].as_ref().expect("checked").inbox.is_empty() {
                return Ok(true);
            }
            if self.progress()? {
                idle = 0;
                continue;
            }
            if start.elapsed() > wait {
                return Ok(false);
            }
            idle = backoff(idle, self.spin);
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
            idle = backoff(idle, self.spin);
        }
    }

    /// Polls the CQ (which drives the device), the next slot header and
    /// the credit word of every peer, and posts what can go. True when
    /// anything happened.
    fn progress(&mut self) -> Result<bool, Error> {
        match self.poll_all() {
            Ok(did) => Ok(did),
            Err(e) => self.fail(e),
        }
    }

    fn poll_all(&mut self) -> Result<bool, Error> {
        let mut did = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let mut res = self.cq.poll(&mut wcs, 64).map(|_| ()).map_err(Error::from);
        for wc in wcs.drain(..) {
            did = true;
            if res.is_ok() {
                res = self.on_send(&wc);
            }
        }
        self.wcs = wcs;
        res?;
        let (depth, lay, chunk) = (self.depth, self.lay, self.chunk);
        for p in 0..self.size {
            let Some(l) = self.links[p].as_mut() else {
                continue;
            };
            // Arrivals: headers naming the next sequence numbers.
            while l.inbox.len() < depth {
                let slot = (l.recv_seq % depth as u64) as usize;
                let h = self.recv_mr.read_u64(lay.header(p, slot))?;
                let want = (l.recv_seq + 1) & 0xffff_ffff;
                if h >> 32 != want {
                    let old = (l.recv_seq + 1).wrapping_sub(depth as u64) & 0xffff_ffff;
                    if h != 0 && h >> 32 != old {
                        return Err(Error::Protocol(format!(
                            "rank {p}: slot {slot} header {h:#x}, expected sequence {want} or {old}"
                        )));
                    }
                    break;
                }
                let len = (h & 0xffff_ffff) as usize;
                if len == 0 || len > chunk {
                    return Err(Error::Protocol(format!(
                        "rank {p} wrote a {len}-byte slot (chunk {chunk})"
                    )));
                }
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                l.inbox.push_back(len);
                l.recv_seq += 1;
                did = true;
            }
            // Credits: slots the peer has emptied.
            let c = self.recv_mr.read_u64(lay.credit(p))?;
            if c != l.returned {
                if c < l.returned || c > l.send_seq {
                    return Err(Error::Protocol(format!(
                        "rank {p} gave back {c} slots, {} before, {} written",
                        l.returned, l.send_seq
                    )));
                }
                l.returned = c;
                did = true;
            }
        }
        for p in 0..self.size {
            if self.links[p].is_some() {
                self.pump(p)?;
            }
        }
        Ok(did)
    }

    fn on_send(&mut self, wc: &WorkCompletion) -> Result<(), Error> {
        let peer = (wc.wr_id >> 8) as usize;
        let kind = wc.wr_id & 0xff;
        if !wc.status.is_ok() {
            return Err(Error::Peer {
                rank: peer,
                why: format!("a WRITE completed with {:?}", wc.status),
            });
        }
        let l = self
            .links
            .get_mut(peer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| Error::Protocol(format!("a completion for peer {peer}")))?;
        match kind {
            // The header is a slot's last WRITE, and RC completes in order:
            // its completion frees the staging slot (data and header; a
            // retransmission after reuse would carry the new bytes).
            KIND_DATA => {}
            KIND_HDR => l.inflight = l.inflight.saturating_sub(1),
            KIND_CREDIT => l.ctrl_inflight = l.ctrl_inflight.saturating_sub(1),
            _ => return Err(Error::Protocol(format!("completion kind {kind}"))),
        }
        Ok(())
    }

    /// Writes as much of `data` as slots and staging allow; returns the bytes posted.
    fn post_from(&mut self, peer: usize, data: &[u8]) -> Result<usize, Error> {
        let (depth, chunk, lay, me) = (self.depth, self.chunk, self.lay, self.rank);
        let Some(l) = self.links[peer].as_mut() else {
            return Ok(0);
        };
        let mut done = 0;
        while done < data.len() && l.send_seq - l.returned < depth as u64 && l.inflight < depth {
            let n = (data.len() - done).min(chunk);
            let slot = (l.send_seq % depth as u64) as usize;
            let off = lay.data(peer, slot);
            self.send_mr.write(off, &data[done..done + n])?;
            let id = (peer as u64) << 8;
            let op = SendOp::Write {
                remote_addr: l.remote.at(lay.data(me, slot) as u64),
                rkey: l.remote.rkey,
            };
            let sge = vec![self.send_mr.sge(off as u64, n as u32)];
            l.qp.post_send(&SendWr::new(id | KIND_DATA, op, sge))?;
            let hoff = lay.header(peer, slot);
            let h = (((l.send_seq + 1) & 0xffff_ffff) << 32) | n as u64;
            self.send_mr.write(hoff, &h.to_ne_bytes())?;
            let op = SendOp::Write {
                remote_addr: l.remote.at(lay.header(me, slot) as u64),
                rkey: l.remote.rkey,
            };
            let sge = vec![self.send_mr.sge(hoff as u64, 8)];
            l.qp.post_send(&SendWr::new(id | KIND_HDR, op, sge))?;
            l.send_seq += 1;
            l.inflight += 1;
            done += n;
        }
        Ok(done)
    }

    /// Posts queued data while slots and staging allow, and due credits.
    fn pump(&mut self, peer: usize) -> Result<(), Error> {
        let depth = self.depth;
        loop {
            let Some(l) = self.links[peer].as_mut() else {
                return Ok(());
            };
            let Some(front) = l.out.pop_front() else {
                break;
            };
            let off = l.out_off;
            let r = self.post_from(peer, &front[off..]);
            let l = self.links[peer].as_mut().expect("checked");
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    l.out.push_front(front);
                    return Err(e);
                }
            };
            if off + n == front.len() {
                l.out_off = 0;
                continue;
            }
            l.out_off = off + n;
            l.out.push_front(front);
            break;
        }
        let Some(l) = self.links[peer].as_mut() else {
            return Ok(());
        };
        if l.consumed != l.told && l.ctrl_inflight < depth {
            let (lay, me) = (self.lay, self.rank);
            let coff = lay.credit(peer);
            self.send_mr.write(coff, &l.consumed.to_ne_bytes())?;
            let op = SendOp::Write {
                remote_addr: l.remote.at(lay.credit(me) as u64),
                rkey: l.remote.rkey,
            };
            let sge = vec![self.send_mr.sge(coff as u64, 8)];
            l.qp.post_send(&SendWr::new(((peer as u64) << 8) | KIND_CREDIT, op, sge))?;
            l.told = l.consumed;
            l.ctrl_inflight += 1;
        }
        Ok(())
    }
}

impl Drop for Net {
    /// Waits (bounded) until every WRITE this rank posted is acknowledged:
    /// a rank that leaves right after its last send must not take the
    /// message with it (its QP would be gone before a lost packet is
    /// retransmitted).
    fn drop(&mut self) {
        if self.broken.is_some() {
            return;
        }
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(10));
        let mut idle = 0u32;
        while Instant::now() < deadline {
            let busy = self
                .links
                .iter()
                .flatten()
                .any(|l| !l.out.is_empty() || l.inflight > 0);
            if !busy {
                return;
            }
            match self.progress() {
                Ok(true) => idle = 0,
                Ok(false) => idle = backoff(idle, self.spin),
                Err(_) => return,
            }
        }
    }
}

/// Spins, then yields, then naps: a sleep costs the timer slack (~60 µs),
/// the whole of a small collective, so it comes only after a long wait.
fn backoff(idle: u32, spin: u32) -> u32 {
    if idle > spin.saturating_add(100_000) {
        std::thread::sleep(Duration::from_micros(50));
    } else if idle > spin {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
    idle.saturating_add(1)
}
