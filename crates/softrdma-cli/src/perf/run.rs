//! The two ends of a perf test: resources (one PD, one MR, one CQ, the
//! QPs), the connection handshake, and the measured loops.
//!
//! Memory layout: each QP owns two equal slots of the one MR, a send area
//! then a receive area; a slot holds the largest message (plus the 40-byte
//! GRH on UD, or one 8-byte result per outstanding atomic). Each side fills
//! its send areas with its own byte pattern, so `--check` can tell whose
//! data arrived. A polling loop never sleeps and every wait gives up after
//! [`STALL`] without progress, so a lost peer ends the run with an error.

use std::io::Write as _;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softrdma::cm::ConnInfo;
use softrdma::{
    AccessFlags, Ah, CompChannel, ConnectOptions, Context, Cq, Mr, Pd, Qp, QpType, Qpn, RecvWr,
    RemoteRegion, Rkey, SendFlags, SendOp, SendWr, UdDest, WcOpcode, WorkCompletion, GRH_LEN,
};

use super::clock::Clock;
use super::ctrl::{check_word, Ctrl};
use super::report::{self, Addr, BwRow, LatDurRow, Row, RULE};
use super::{
    addr_kind, connect, header, json_doc, table_head, Args, Conn, Out, Params, Progress, Test,
    Verb, MAGIC, SPAWN_READY,
};

/// Longest wait without any progress before a run is declared stuck.
const STALL: Duration = Duration::from_secs(10);
/// Control-connection answers that need no work on the other side.
const QUICK: Duration = Duration::from_secs(30);

fn es(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The byte at offset `i` of `side`'s send pattern (0 client, 1 server).
fn pattern(side: u8, i: u64) -> u8 {
    (i.wrapping_mul(7)
        .wrapping_add(u64::from(side) * 101)
        .wrapping_add(13)) as u8
}

/// Ends a loop that stopped making progress. Reads the clock only once a
/// wait has spun 1024 times: progress, every iteration of a latency test,
/// costs no clock read.
struct Watchdog {
    /// When the current wait was first seen to be long, if it has been.
    waiting_since: Option<Instant>,
    spins: u32,
    what: &'static str,
}

impl Watchdog {
    fn new(what: &'static str) -> Watchdog {
        Watchdog {
            waiting_since: None,
            spins: 0,
            what,
        }
    }
    #[inline]
    fn progressed(&mut self) {
        self.spins = 0;
        self.waiting_since = None;
    }
    #[inline]
    fn idle(&mut self) -> Result<(), String> {
        self.spins += 1;
        if self.spins & 1023 != 0 {
            return Ok(());
        }
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        if since.elapsed() > STALL {
            return Err(format!(
                "no progress for {} s while waiting for {} (is the other side still running?)",
                STALL.as_secs(),
                self.what
            ));
        }
        Ok(())
    }
}

/// What each side reports at the end of a size.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Done {
    /// Operations posted per QP (atomics: what the target's value must be).
    ops: Vec<u64>,
    /// Messages received (send_bw server).
    received: u64,
    /// This side's data check (None when it had nothing to check).
    check: Option<bool>,
    /// Why the check failed.
    why: Option<String>,
    /// The server's own result with -b.
    #[serde(default)]
    bw: Option<BwRow>,
}

/// Everything one side of a test owns. Fields drop in order: QPs before
/// the CQ, the MR and the PD.
pub(crate) struct Res {
    qps: Vec<Qp>,
    ahs: Vec<Ah>,
    cq: Cq,
    chan: Option<CompChannel>,
    mr: Mr,
    _pd: Pd,
    _ctx: Context,
    p: Params,
    slot: u64,
    side: u8,
    remote: Vec<ConnInfo>,
    /// Receives outstanding per QP.
    recvs: Vec<u32>,
    clock: Clock,
    wcs: Vec<WorkCompletion>,
    gbits: bool,
    /// The path MTU the QPs were connected with.
    path_mtu: u32,
    /// Print notes (not a spawned or quiet end).
    notes: bool,
}

impl Res {
    fn new(ctx: &Context, p: &Params, side: u8, events: bool, gbits: bool) -> Result<Res, String> {
        let max = *p.sizes.iter().max().unwrap_or(&8);
        let mut slot = max;
        if p.conn == Conn::Ud {
            slot += GRH_LEN as u64;
        }
        if p.test.verb() == Verb::Atomic {
            slot = slot.max(u64::from(p.tx_depth) * 8);
        }
        // A page at least per slot, as perftest's cycle buffer lays out the
        // send and receive areas (64-byte slots put them on adjacent lines).
        let slot = (slot.div_ceil(64) * 64).max(4096);
        let pd = ctx.alloc_pd().map_err(es)?;
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let len = slot * 2 * u64::from(p.qps);
        let mr = pd
            .alloc_mr(len as usize, access)
            .map_err(|e| format!("registering {len} bytes: {e}"))?;
        let rx = if p.test.verb() == Verb::Send {
            p.rx_depth
        } else {
            1
        };
        let depth = p.qps * (p.tx_depth + 2) + p.qps * rx + 16;
        let chan = if events {
            Some(ctx.create_comp_channel().map_err(es)?)
        } else {
            None
        };
        let cq = match &chan {
            Some(ch) => ctx.create_cq_with_channel(depth, ch),
            None => ctx.create_cq(depth),
        }
        .map_err(es)?;
        let qt = match p.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        };
        let mut qps = Vec::new();
        for _ in 0..p.qps {
            let qp = pd
                .create_qp(qt, &cq, &cq)
                .max_send_wr(p.tx_depth + 1)
                .max_recv_wr(rx)
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(p.inline)
                .build()
                .map_err(|e| format!("creating a {} QP: {e}", p.conn.name()))?;
            qps.push(qp);
        }
        Ok(Res {
            qps,
            ahs: Vec::new(),
            cq,
            chan,
            mr,
            _pd: pd,
            _ctx: ctx.clone(),
            p: p.clone(),
            slot,
            side,
            remote: Vec::new(),
            recvs: vec![0; p.qps as usize],
            clock: Clock::new(),
            wcs: Vec::with_capacity(64),
            gbits,
            path_mtu: ctx.query_port().active_mtu.bytes(),
            notes: false,
        })
    }

    fn send_off(&self, q: usize) -> u64 {
        q as u64 * 2 * self.slot
    }
    fn recv_off(&self, q: usize) -> u64 {
        self.send_off(q) + self.slot
    }
    fn peer_recv_addr(&self, q: usize) -> u64 {
        self.remote[q].region.map_or(0, |r| r.addr) + self.slot
    }
    fn peer_send_addr(&self, q: usize) -> u64 {
        self.remote[q].region.map_or(0, |r| r.addr)
    }
    fn peer_rkey(&self, q: usize) -> Rkey {
        self.remote[q].region.map_or(Rkey::default(), |r| r.rkey)
    }

    fn conn_info(&self, q: usize) -> ConnInfo {
        ConnInfo {
            endpoint: self.qps[q].endpoint(),
            region: Some(RemoteRegion {
                addr: self.mr.addr() + self.send_off(q),
                rkey: self.mr.rkey(),
                len: 2 * self.slot,
            }),
        }
    }

    fn addrs(&self) -> (Vec<Addr>, Vec<Addr>) {
        let mk = |c: &ConnInfo| Addr {
            lid: 0,
            qpn: c.endpoint.qpn.raw(),
            psn: c.endpoint.psn,
            rkey: c.region.map_or(0, |r| r.rkey.raw()),
            vaddr: c.region.map_or(0, |r| r.addr),
            out_reads: 16,
            gid: c.endpoint.gid.0,
        };
        let local = (0..self.qps.len())
            .map(|q| mk(&self.conn_info(q)))
            .collect();
        let remote = self.remote.iter().map(mk).collect();
        (local, remote)
    }

    /// Brings every QP to RTS towards the peer's.
    fn connect(&mut self, remote: Vec<ConnInfo>) -> Result<(), String> {
        if remote.len() != self.qps.len() {
            return Err(format!(
                "the other side described {} QPs, not {}",
                remote.len(),
                self.qps.len()
            ));
        }
        // perftest's rule: a requested MTU above what both ports run falls
        // back to it, with a note.
        let active = self._ctx.query_port().active_mtu.bytes();
        let both = remote
            .iter()
            .map(|r| r.endpoint.mtu.bytes())
            .fold(active, u32::min);
        let path = match self.p.mtu {
            Some(m) if m > both => {
                if self.notes {
                    eprintln!(
                        " Requested mtu is higher than active mtu \n Changing to active mtu - {both} (this port {active}, the peer's {})",
                        remote.first().map_or(active, |r| r.endpoint.mtu.bytes())
                    );
                }
                both
            }
            Some(m) => m,
            None => both,
        };
        self.path_mtu = path;
        let opts = ConnectOptions {
            timeout: self.p.qp_timeout,
            retry_cnt: self.p.retry_count,
            max_rd_atomic: self.p.outs,
            mtu: softrdma::Mtu::from_bytes(path),
            ..ConnectOptions::default()
        };
        if self.p.rdma_cm {
            self.remote = remote;
            return self.connect_cm(&opts);
        }
        for (q, r) in remote.iter().enumerate() {
            if self.p.conn == Conn::Ud {
                self.qps[q].ready_ud().map_err(es)?;
                let ah = self
                    ._pd
                    .create_ah(r.endpoint.gid)
                    .map_err(|e| format!("address handle: {e}"))?;
                self.ahs.push(ah);
            } else {
                self.qps[q]
                    .connect(&r.endpoint, &opts)
                    .map_err(|e| format!("connecting QP {:#x}: {e}", self.qps[q].qpn()))?;
            }
        }
        self.remote = remote;
        Ok(())
    }

    /// -R: the RC QPs connected through the connection manager (REQ, REP,
    /// RTU on QP1 over RoCEv2), which moves them to RTS with the numbers
    /// it settled. The client connects each QP to the server's device
    /// address and the CM port; the server (listening since before it
    /// answered the parameters) accepts each request on the QP whose peer
    /// the request names.
    fn connect_cm(&mut self, o: &ConnectOptions) -> Result<(), String> {
        use softrdma::rdma_cm::{CmEvent, ConnParam};
        let cm = self._ctx.cm();
        let param = ConnParam {
            responder_resources: o.max_rd_atomic,
            initiator_depth: o.max_rd_atomic,
            retry_count: o.retry_cnt,
            ..ConnParam::default()
        };
        let deadline = Instant::now() + QUICK;
        let mut pending: Vec<_> = Vec::new();
        if self.side == 0 {
            let ip = self.remote[0].endpoint.gid.to_ip();
            let dst = std::net::SocketAddr::new(ip, self.p.cm_port);
            for qp in &self.qps {
                let id = cm
                    .connect(qp, dst, &param)
                    .map_err(|e| format!("-R: connecting QP {:#x} to {dst}: {e}", qp.qpn()))?;
                pending.push(id);
            }
        }
        let mut requests = if self.side == 0 { 0 } else { self.qps.len() };
        while !pending.is_empty() || requests > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "-R: the connection manager did not connect every QP within {} s",
                    QUICK.as_secs()
                ));
            }
            match cm.get_event(left).map_err(es)? {
                Some(CmEvent::ConnectRequest { conn, req, .. }) if self.side == 1 => {
                    let q = self
                        .remote
                        .iter()
                        .position(|r| r.endpoint.qpn.raw() == req.local_qpn)
                        .ok_or_else(|| {
                            format!(
                                "-R: a request from QP {:#x}, not one of the client's",
                                req.local_qpn
                            )
                        })?;
                    cm.accept(conn, &self.qps[q], &param)
                        .map_err(|e| format!("-R: accepting QP {:#x}: {e}", req.local_qpn))?;
                    pending.push(conn);
                    requests -= 1;
                }
                Some(CmEvent::Established { conn }) => pending.retain(|&c| c != conn),
                Some(CmEvent::Rejected { reason, .. }) => {
                    return Err(format!(
                        "-R: the server rejected the connection ({reason:?})"
                    ))
                }
                Some(CmEvent::Unreachable { .. }) => {
                    return Err("-R: the server's connection manager never answered".into())
                }
                Some(_) | None => {}
            }
        }
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Polls completions into `self.wcs`. With events, sleeps until some
    /// arrive (at most 100 ms, then returns none).
    fn poll(&mut self) -> Result<usize, String> {
        self.wcs.clear();
        let n = self.cq.poll(&mut self.wcs, 64).map_err(es)?;
        let Some(ch) = &self.chan else {
            return Ok(n);
        };
        if n > 0 {
            return Ok(n);
        }
        self.cq.req_notify(false).map_err(es)?;
        let n = self.cq.poll(&mut self.wcs, 64).map_err(es)?;
        if n > 0 {
            return Ok(n);
        }
        match ch.get_event(Some(Duration::from_millis(100))) {
            Ok(_) | Err(softrdma::Error::Timeout(_)) => {}
            Err(e) => return Err(es(e)),
        }
        self.cq.poll(&mut self.wcs, 64).map_err(es)
    }

    fn recv_len(&self) -> u32 {
        self.slot as u32
    }

    fn post_recv(&mut self, q: usize) -> Result<(), String> {
        let sge = self.mr.sge(self.recv_off(q), self.recv_len());
        self.qps[q]
            .post_recv(&RecvWr {
                wr_id: q as u64,
                sg_list: vec![sge],
            })
            .map_err(es)?;
        self.recvs[q] += 1;
        Ok(())
    }

    /// Before each size: patterns in the send areas, zeroed receive areas,
    /// receives topped up.
    fn prepare(&mut self, size: u64) -> Result<(), String> {
        let pat: Vec<u8> = (0..size).map(|i| pattern(self.side, i)).collect();
        let zero = vec![0u8; self.slot as usize];
        for q in 0..self.qps.len() {
            self.mr.write(self.send_off(q) as usize, &pat).map_err(es)?;
            self.mr
                .write(self.recv_off(q) as usize, &zero)
                .map_err(es)?;
        }
        let t = self.p.test;
        let target = match t {
            Test::SendLat => self.p.rx_depth.min(64),
            Test::SendBw if self.side == 1 => self.p.rx_depth,
            _ => 0,
        };
        if target > 0 {
            for q in 0..self.qps.len() {
                while self.recvs[q] < target {
                    self.post_recv(q)?;
                }
            }
        }
        Ok(())
    }

    /// A send WR of this test towards QP `q`'s peer.
    fn send_wr(&self, q: usize, size: u64) -> SendWr {
        let t = self.p.test;
        let op = match t.verb() {
            Verb::Write => SendOp::Write {
                remote_addr: self.peer_recv_addr(q),
                rkey: self.peer_rkey(q),
            },
            Verb::Read => SendOp::Read {
                remote_addr: self.peer_send_addr(q),
                rkey: self.peer_rkey(q),
            },
            Verb::Send => SendOp::Send,
            Verb::Atomic => match self.p.atomic {
                super::AtomicOp::FetchAndAdd => SendOp::FetchAdd {
                    remote_addr: self.peer_recv_addr(q),
                    rkey: self.peer_rkey(q),
                    add: 1,
                },
                super::AtomicOp::CmpAndSwap => SendOp::CompareSwap {
                    remote_addr: self.peer_recv_addr(q),
                    rkey: self.peer_rkey(q),
                    compare: 0,
                    swap: 1,
                },
            },
        };
        let local = match t.verb() {
            Verb::Read | Verb::Atomic => self.recv_off(q),
            _ => self.send_off(q),
        };
        let mut wr = SendWr::new(0, op, vec![self.mr.sge(local, size as u32)]);
        if self.p.conn == Conn::Ud {
            wr.ud = Some(UdDest {
                ah: self.ahs[q].handle(),
                remote_qpn: self.remote[q].endpoint.qpn,
                remote_qkey: self.remote[q].endpoint.qkey,
            });
        }
        wr
    }

    /// Sets the per-operation fields of WR number `k` on QP `q`.
    fn set_op(&self, wr: &mut SendWr, q: usize, k: u64) {
        wr.wr_id = k;
        if let SendOp::CompareSwap { compare, swap, .. } = &mut wr.op {
            *compare = k;
            *swap = k + 1;
        }
        if self.p.test.verb() == Verb::Atomic {
            let slots = u64::from(self.p.tx_depth);
            wr.sg_list[0].addr = self.mr.addr() + self.recv_off(q) + (k % slots) * 8;
        }
    }

    fn post(&self, q: usize, wr: &SendWr, inline: Option<&[u8]>) -> Result<(), String> {
        let r = match inline {
            Some(d) => self.qps[q].post_send_inline(wr, d),
            None => self.qps[q].post_send(wr),
        };
        r.map_err(|e| format!("post_send: {e}"))
    }

    fn wc_ok(wc: &WorkCompletion) -> Result<(), String> {
        if wc.status.is_ok() {
            Ok(())
        } else {
            Err(format!(
                "completion error on QP {:#x}: {:?} ({}) for wr_id {}, vendor_err {}",
                wc.qp_num, wc.status, wc.status, wc.wr_id, wc.vendor_err
            ))
        }
    }

    fn qp_index(&self, qpn: Qpn) -> usize {
        self.qps.iter().position(|q| q.qpn() == qpn).unwrap_or(0)
    }

    // ----- latency -----

    /// Ping-pong (write_lat, send_lat). `first` posts first (the client).
    /// Returns post timestamps. In timed mode the client stops at the
    /// deadline and the server when the client's "done" arrives.
    fn ping_pong(
        &mut self,
        size: u64,
        first: bool,
        ctrl: &mut Ctrl,
        early_done: &mut Option<String>,
        prog: &mut Progress,
    ) -> Result<Vec<u64>, String> {
        let write = self.p.test.verb() == Verb::Write;
        let ud_extra = if self.p.conn == Conn::Ud {
            GRH_LEN as u64
        } else {
            0
        };
        let inline = size <= u64::from(self.p.inline);
        let mut wr = self.send_wr(0, size);
        wr.flags = if inline {
            SendFlags::SIGNALED | SendFlags::INLINE
        } else {
            SendFlags::SIGNALED
        };
        let mut data: Vec<u8> = (0..size).map(|i| pattern(self.side, i)).collect();
        let poll_off = (self.recv_off(0) + size - 1) as usize;
        let n = if self.p.duration.is_some() {
            u64::MAX
        } else {
            self.p.iters
        };
        let deadline = self
            .p
            .duration
            .map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut times = prefaulted(if n == u64::MAX { 1 << 20 } else { n as usize });
        let mut dog = Watchdog::new(if write {
            "the peer's RDMA WRITE"
        } else {
            "the peer's SEND"
        });
        let mut got_recv = 0u64; // receives completed (send_lat)
        let mut got_send = 0u64; // send completions
        let expected_len = size + ud_extra;
        let mut k = 0u64;
        while k < n {
            if first && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            // Responder: wait for message k+1 before answering.
            if !first {
                let want = k + 1;
                let mut spins = 0u32;
                loop {
                    let have = self.pp_progress(
                        write,
                        poll_off,
                        want,
                        &mut got_recv,
                        &mut got_send,
                        expected_len,
                    )?;
                    if have {
                        dog.progressed();
                        break;
                    }
                    dog.idle()?;
                    spins += 1;
                    if self.p.duration.is_some() && spins & 4095 == 0 {
                        if let Some(l) = ctrl.try_recv()? {
                            *early_done = Some(l);
                            return Ok(times);
                        }
                    }
                }
            }
            k += 1;
            if write {
                data[size as usize - 1] = k as u8;
                if !inline {
                    self.poke(self.send_off(0) as usize + size as usize - 1, k as u8);
                }
            }
            self.post(0, &wr, inline.then_some(&data[..]))?;
            // Stamped after the post, off the ping-pong's critical path (a
            // clock read costs about 25 ns under KVM); consecutive stamps
            // are still one iteration apart.
            times.push(self.now_ns());
            // Wait for our send to complete and, on the client, the answer.
            loop {
                let answered = !first
                    || self.pp_progress(
                        write,
                        poll_off,
                        k,
                        &mut got_recv,
                        &mut got_send,
                        expected_len,
                    )?;
                if got_send < k {
                    self.pp_collect(&mut got_recv, &mut got_send, expected_len)?;
                }
                if answered && got_send >= k {
                    dog.progressed();
                    break;
                }
                dog.idle()?;
            }
            if k & 1023 == 0 {
                prog.say(|| format!("{size} bytes: {k} iterations"));
            }
        }
        Ok(times)
    }

    /// One step of ping-pong progress: says whether message `want` from the
    /// peer has arrived. WRITE: the last byte of the receive area, read
    /// without a lock (as perftest polls its buffer), before and after
    /// collecting completions (which runs the driver's progress). SEND:
    /// receive completions.
    fn pp_progress(
        &mut self,
        write: bool,
        poll_off: usize,
        want: u64,
        got_recv: &mut u64,
        got_send: &mut u64,
        expected_len: u64,
    ) -> Result<bool, String> {
        if !write {
            // The message may have come with the last collection (with our
            // send's completion): with events a poll of an empty CQ sleeps.
            if *got_recv < want {
                self.pp_collect(got_recv, got_send, expected_len)?;
            }
            return Ok(*got_recv >= want);
        }
        if self.peek(poll_off) == want as u8 {
            return Ok(true);
        }
        self.pp_collect(got_recv, got_send, expected_len)?;
        Ok(self.peek(poll_off) == want as u8)
    }

    /// The byte at `off` of the MR, read atomically without the device lock.
    fn peek(&self, off: usize) -> u8 {
        assert!(off < self.mr.len());
        // SAFETY: `off` is inside the region, which the MR owns and keeps
        // mapped while `self` lives; a u8 is always aligned. Remote writes
        // land concurrently (that is the point of polling); the atomic load
        // sees each byte either before or after such a write.
        unsafe { AtomicU8::from_ptr(self.mr.as_ptr().add(off)) }.load(Ordering::Acquire)
    }

    /// Stores `v` at `off` of the MR without the device lock, as perftest
    /// stores into its buffer before each post.
    fn poke(&self, off: usize, v: u8) {
        assert!(off < self.mr.len());
        // SAFETY: as in `peek`; the byte is in our send area, which only
        // this thread writes (peers read it through our WRITEs' source).
        unsafe { AtomicU8::from_ptr(self.mr.as_ptr().add(off)) }.store(v, Ordering::Release)
    }

    fn pp_collect(
        &mut self,
        got_recv: &mut u64,
        got_send: &mut u64,
        expected_len: u64,
    ) -> Result<(), String> {
        if self.poll()? == 0 {
            return Ok(());
        }
        let wcs = std::mem::take(&mut self.wcs);
        for wc in &wcs {
            Self::wc_ok(wc)?;
            if wc.opcode == WcOpcode::Recv {
                if u64::from(wc.byte_len) != expected_len {
                    return Err(format!(
                        "received {} bytes, expected {expected_len}",
                        wc.byte_len
                    ));
                }
                *got_recv += 1;
                self.recvs[0] -= 1;
                self.post_recv(0)?;
            } else {
                *got_send += 1;
            }
        }
        self.wcs = wcs;
        Ok(())
    }

    /// READ or atomic latency (client): one operation at a time.
    fn one_sided_lat(
        &mut self,
        size: u64,
        prog: &mut Progress,
        check: &mut Option<String>,
    ) -> Result<Vec<u64>, String> {
        let mut wr = self.send_wr(0, size);
        let n = if self.p.duration.is_some() {
            u64::MAX
        } else {
            self.p.iters
        };
        let deadline = self
            .p
            .duration
            .map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut times = prefaulted(n.min(1 << 20) as usize);
        let mut dog = Watchdog::new("a READ or atomic response");
        let atomic = self.p.test.verb() == Verb::Atomic;
        let mut k = 0;
        while k < n {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            self.set_op(&mut wr, 0, k);
            times.push(self.now_ns());
            self.post(0, &wr, None)?;
            loop {
                if self.poll()? > 0 {
                    for wc in &self.wcs {
                        Self::wc_ok(wc)?;
                    }
                    dog.progressed();
                    break;
                }
                dog.idle()?;
            }
            if atomic && self.p.check && check.is_none() {
                let got = self
                    .mr
                    .read_u64(wr.sg_list[0].addr as usize - self.mr.addr() as usize)
                    .map_err(es)?;
                if got != k {
                    *check = Some(format!(
                        "atomic #{k} fetched {got}, expected {k} (the value before it)"
                    ));
                }
            }
            k += 1;
            if k & 1023 == 0 {
                prog.say(|| format!("{size} bytes: {k} iterations"));
            }
        }
        Ok(times)
    }

    // ----- bandwidth -----

    /// The bandwidth client: keeps `tx_depth` WRs outstanding on every QP,
    /// one signaled every `cq_mod`. Returns the row and operations per QP.
    fn bw_client(&mut self, size: u64, prog: &mut Progress) -> Result<(Row, Vec<u64>), String> {
        let nq = self.qps.len();
        let p = self.p.clone();
        let per_qp = if p.duration.is_some() {
            u64::MAX
        } else {
            p.iters
        };
        let depth = u64::from(p.tx_depth);
        let cq_mod = u64::from(p.cq_mod);
        let mut posted = vec![0u64; nq];
        let mut done = vec![0u64; nq];
        let mut last_sig = vec![0u64; nq];
        let timed = p.duration.is_none();
        let total = if timed { p.iters * nq as u64 } else { 0 };
        let mut tposted: Vec<u64> = prefaulted(total as usize);
        let mut tcomp: Vec<(u64, u64)> = prefaulted((total / cq_mod + nq as u64 + 1) as usize);
        let mut wrs: Vec<SendWr> = (0..nq).map(|q| self.send_wr(q, size)).collect();
        let inline =
            if size <= u64::from(p.inline) && matches!(p.test.verb(), Verb::Write | Verb::Send) {
                SendFlags::INLINE
            } else {
                SendFlags::default()
            };
        let start_ns = self.now_ns();
        let deadline = p
            .duration
            .map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut stopping = false;
        let mut total_done = 0u64;
        let mut dog = Watchdog::new("completions");
        let mut spins = 0u32;
        loop {
            if let Some(dl) = deadline {
                if !stopping && Instant::now() >= dl {
                    stopping = true;
                    // The tail since the last signaled WR needs one signaled WR to complete.
                    for q in 0..nq {
                        if posted[q] > last_sig[q] {
                            let k = posted[q];
                            self.set_op(&mut wrs[q], q, k);
                            wrs[q].flags = SendFlags::SIGNALED | inline;
                            self.post(q, &wrs[q], None)?;
                            posted[q] += 1;
                            last_sig[q] = posted[q];
                        }
                    }
                }
            }
            if !stopping {
                for q in 0..nq {
                    while posted[q] - done[q] < depth && posted[q] < per_qp {
                        let k = posted[q];
                        let sig = (k + 1).is_multiple_of(cq_mod) || k + 1 == per_qp;
                        self.set_op(&mut wrs[q], q, k);
                        wrs[q].flags = if sig {
                            SendFlags::SIGNALED | inline
                        } else {
                            inline
                        };
                        if timed {
                            tposted.push(self.now_ns());
                        }
                        self.post(q, &wrs[q], None)?;
                        posted[q] += 1;
                        if sig {
                            last_sig[q] = posted[q];
                        }
                    }
                }
            }
            if self.poll()? > 0 {
                let now = self.now_ns();
                let wcs = std::mem::take(&mut self.wcs);
                for wc in &wcs {
                    Self::wc_ok(wc)?;
                    let q = self.qp_index(wc.qp_num);
                    let covered = (wc.wr_id + 1).saturating_sub(done[q]);
                    done[q] = wc.wr_id + 1;
                    total_done += covered;
                    if timed {
                        tcomp.push((total_done, now));
                    }
                }
                self.wcs = wcs;
                dog.progressed();
            } else {
                dog.idle()?;
            }
            let finished = if timed {
                done.iter().all(|&d| d == per_qp)
            } else {
                stopping && done.iter().zip(&posted).all(|(d, p)| d == p)
            };
            if finished {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins & 4095 == 0 {
                prog.say(|| format!("{size} bytes: {total_done} messages"));
            }
        }
        let end_ns = self.now_ns();
        let msgs: u64 = done.iter().sum();
        let (t0, t1) = if timed {
            (tposted[0], tcomp.last().map_or(end_ns, |c| c.1))
        } else {
            (start_ns, end_ns)
        };
        let secs = (t1.saturating_sub(t0)).max(1) as f64 / 1e9;
        let g = self.gbits;
        let avg = report::bw_unit(msgs as f64 * size as f64 / secs, g);
        let peak = if timed {
            report::peak_ns_per_msg(&tposted, &tcomp).map_or(0.0, |ns| {
                report::bw_unit(size as f64 / (ns.max(1.0) / 1e9), g)
            })
        } else {
            0.0
        };
        Ok((
            Row::Bw(BwRow {
                bytes: size,
                iterations: msgs,
                bw_peak: peak,
                bw_average: avg,
                msg_rate_mpps: msgs as f64 / secs / 1e6,
            }),
            posted,
        ))
    }

    /// The send_bw server: receives until every message arrived or, once
    /// the client said it is done, nothing more came for 50 ms (UC and UD
    /// may drop). Returns the row (seen from here) and messages received.
    fn send_bw_server(
        &mut self,
        size: u64,
        ctrl: &mut Ctrl,
        early_done: &mut Option<String>,
        prog: &mut Progress,
    ) -> Result<(Row, u64), String> {
        let nq = self.qps.len() as u64;
        let expected = if self.p.duration.is_some() {
            u64::MAX
        } else {
            self.p.iters * nq
        };
        let ud_extra = if self.p.conn == Conn::Ud {
            GRH_LEN as u64
        } else {
            0
        };
        let mut received = 0u64;
        let (mut first, mut last) = (None, 0u64);
        let mut client_done: Option<Instant> = None;
        let mut dog = Watchdog::new("the client's SENDs");
        let mut spins = 0u32;
        loop {
            if self.poll()? > 0 {
                let now = self.now_ns();
                let wcs = std::mem::take(&mut self.wcs);
                for wc in &wcs {
                    Self::wc_ok(wc)?;
                    if wc.opcode != WcOpcode::Recv {
                        continue;
                    }
                    if u64::from(wc.byte_len) != size + ud_extra {
                        return Err(format!(
                            "received {} bytes, expected {}",
                            wc.byte_len,
                            size + ud_extra
                        ));
                    }
                    received += 1;
                    first.get_or_insert(now);
                    last = now;
                    let q = self.qp_index(wc.qp_num);
                    self.recvs[q] -= 1;
                    self.post_recv(q)?;
                }
                self.wcs = wcs;
                dog.progressed();
                if received >= expected {
                    break;
                }
            } else {
                spins = spins.wrapping_add(1);
                if spins & 1023 == 0 {
                    if client_done.is_none() {
                        if let Some(l) = ctrl.try_recv()? {
                            *early_done = Some(l);
                            client_done = Some(Instant::now());
                        }
                    }
                    if client_done.is_some_and(|t| t.elapsed() > Duration::from_millis(50)) {
                        break;
                    }
                }
                if client_done.is_none() {
                    dog.idle()?;
                }
            }
            if spins & 4095 == 0 {
                prog.say(|| format!("{size} bytes: {received} messages received"));
            }
        }
        let secs = last.saturating_sub(first.unwrap_or(last)).max(1) as f64 / 1e9;
        let avg = report::bw_unit(received as f64 * size as f64 / secs, self.gbits);
        Ok((
            Row::Bw(BwRow {
                bytes: size,
                iterations: received,
                bw_peak: 0.0,
                bw_average: avg,
                msg_rate_mpps: received as f64 / secs / 1e6,
            }),
            received,
        ))
    }

    // ----- data checks -----

    /// Compares `size` bytes at `off` with `peer`'s pattern; `last`, when
    /// given, is what the final byte must hold instead (write_lat's counter).
    fn compare(&self, off: u64, size: u64, peer: u8, last: Option<u8>) -> Result<(), String> {
        let mut got = vec![0u8; size as usize];
        self.mr.read(off as usize, &mut got).map_err(es)?;
        for (i, &b) in got.iter().enumerate() {
            let want = match last {
                Some(l) if i as u64 == size - 1 => l,
                _ => pattern(peer, i as u64),
            };
            if b != want {
                return Err(format!(
                    "byte {i} of a {size}-byte message is {b:#04x}, expected {want:#04x}"
                ));
            }
        }
        Ok(())
    }

    /// This side's check after a size: `count` is this side's iterations
    /// (ping-pong), `peer_ops` the other side's operations per QP.
    fn check(
        &self,
        size: u64,
        count: u64,
        peer_ops: &[u64],
        received_any: bool,
    ) -> Option<Result<(), String>> {
        let peer = 1 - self.side;
        let ud = if self.p.conn == Conn::Ud {
            GRH_LEN as u64
        } else {
            0
        };
        let all = |f: &dyn Fn(usize) -> Result<(), String>| (0..self.qps.len()).try_for_each(f);
        let server = self.side == 1;
        Some(match (self.p.test, server) {
            (Test::WriteLat, _) => self.compare(self.recv_off(0), size, peer, Some(count as u8)),
            (Test::SendLat, _) => self.compare(self.recv_off(0) + ud, size, peer, None),
            (Test::WriteBw, true) => all(&|q| self.compare(self.recv_off(q), size, peer, None)),
            (Test::SendBw, true) if received_any => {
                all(&|q| self.compare(self.recv_off(q) + ud, size, peer, None))
            }
            (Test::ReadLat | Test::ReadBw, false) => {
                all(&|q| self.compare(self.recv_off(q), size, peer, None))
            }
            (Test::AtomicLat | Test::AtomicBw, true) => all(&|q| {
                let v = self.mr.read_u64(self.recv_off(q) as usize).map_err(es)?;
                let want = peer_ops.get(q).copied().unwrap_or(0);
                if v == want {
                    Ok(())
                } else {
                    Err(format!(
                        "QP {q}: the target holds {v} after {want} atomics; expected {want}"
                    ))
                }
            }),
            _ => return None,
        })
    }
}

/// Latency row of timestamps (iterations) or of a timed run.
fn lat_result(p: &Params, size: u64, times: &[u64], end_ns: u64) -> Result<Row, String> {
    let f = p.test.rtt_factor();
    if p.duration.is_some() {
        let n = times.len() as u64;
        if n == 0 {
            return Err("no iteration completed in the time given".into());
        }
        let secs = end_ns.saturating_sub(times[0]).max(1) as f64 / 1e9;
        return Ok(Row::LatDur(LatDurRow {
            bytes: size,
            iterations: n,
            t_avg: secs * 1e6 / f / n as f64,
            tps: n as f64 / secs,
        }));
    }
    report::lat_row(times, f, size)
        .map(Row::Lat)
        .ok_or_else(|| "too few iterations for latency statistics".to_string())
}

fn send_conns(c: &mut Ctrl, res: &Res) -> Result<(), String> {
    for q in 0..res.qps.len() {
        c.send(&res.conn_info(q).to_line())?;
    }
    Ok(())
}

fn recv_conns(c: &mut Ctrl, n: u32) -> Result<Vec<ConnInfo>, String> {
    (0..n)
        .map(|_| {
            let l = c.recv(Some(QUICK))?;
            if let Some(m) = l.strip_prefix("error ") {
                return Err(format!("the other side failed: {m}"));
            }
            ConnInfo::from_line(&l).map_err(es)
        })
        .collect()
}

fn accept(l: &TcpListener, timeout: Option<Duration>) -> Result<std::net::TcpStream, String> {
    let Some(t) = timeout else {
        return l.accept().map(|(s, _)| s).map_err(es);
    };
    l.set_nonblocking(true).map_err(es)?;
    let start = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(es)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > t {
                    return Err("no client connected in time".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(es(e)),
        }
    }
}

/// Opens the device for a test with `peer` over a control connection
/// whose local end is `local`; also returns the configured transport's
/// description.
///
/// A device left to its default (the first free 127.0.0.N) takes `local`
/// when the peer is on another host: the address the peer reached this
/// host at is the one it can send RoCE packets to. A device configured on
/// a loopback address cannot serve a remote peer: that is an error that
/// says what to give instead, not a GID the peer would send into nowhere.
fn open(
    args: &Args,
    devices: &[String],
    local: std::net::IpAddr,
    peer: std::net::IpAddr,
) -> Result<(Context, &'static str), String> {
    let mut cfg = args.device_config(devices)?;
    let remote = softrdma::cm::peer_on_another_host(local, peer);
    if let softrdma::config::Bind::AutoLoopback { port } = cfg.bind {
        if remote && !local.is_loopback() && !local.is_unspecified() {
            cfg.bind = softrdma::config::Bind::Addr(std::net::SocketAddr::new(local, port));
        }
    }
    let ctx = Context::open_with(&cfg).map_err(|e| format!("opening device {}: {e}", cfg.name))?;
    if softrdma::cm::unreachable_gid(ctx.addr().ip(), local, peer) {
        return Err(format!(
            "device {} is on {}, a loopback address, but the peer {peer} is on another host: \
             it could not reach that GID. Give the address of this host that {peer} reaches: \
             --device {}={local} (or SOFTRDMA_DEVICES={}={local})",
            cfg.name,
            ctx.addr(),
            cfg.name,
            cfg.name
        ));
    }
    let t = match cfg.transport {
        softrdma::shm::Transport::Udp => "udp",
        softrdma::shm::Transport::Shm => "shm",
        softrdma::shm::Transport::Auto => "auto (shm to a same-host peer, else udp)",
    };
    Ok((ctx, t))
}

/// The path the run took: shared memory once a same-host link exists.
fn path_used(ctx: &Context) -> &'static str {
    if ctx.shm_counters().links > 0 {
        "shm"
    } else {
        "udp"
    }
}

/// With fault injection on, how many packets this end's faults hit (on
/// either path: the shared-memory one is as faulty as UDP).
fn print_faults(args: &Args, ctx: &Context) {
    if args.fault.is_some() || std::env::var_os("SOFTRDMA_FAULT").is_some() {
        println!(
            " Faults injected : {} (packets received here, --fault)",
            ctx.driver_counters().faults_injected
        );
    }
}

/// Prints the header block and the address lines.
#[allow(clippy::too_many_arguments)]
fn print_intro(
    res: &Res,
    p: &Params,
    dev: &str,
    mtu: u32,
    events: bool,
    client: bool,
    table: bool,
    transport: &str,
) {
    let (local, remote) = res.addrs();
    let mut o = header(p, dev, mtu, events, client, transport).text();
    for (l, r) in local.iter().zip(&remote) {
        o.push_str(&l.text("local", addr_kind(p.test)));
        o.push_str(&r.text("remote", addr_kind(p.test)));
    }
    o.push_str(RULE);
    o.push('\n');
    if table {
        o.push_str(table_head(p, res.gbits));
        o.push('\n');
    }
    print!("{o}");
    let _ = std::io::stdout().flush();
}

/// Server mode: waits for one client and serves its test.
pub(crate) fn server(args: &Args, devices: &[String]) -> Result<bool, String> {
    let out = if args.spawned || args.output.is_some() {
        Out::Quiet
    } else if args.json {
        Out::Json
    } else {
        Out::Text
    };
    // A bad device option fails now, not when a client comes.
    args.device_config(devices)?;
    let listener = if args.spawned {
        TcpListener::bind(("127.0.0.1", 0))
    } else {
        TcpListener::bind(("0.0.0.0", args.port))
    }
    .map_err(|e| format!("cannot listen on TCP port {}: {e}", args.port))?;
    let port = listener.local_addr().map_err(es)?.port();
    if args.spawned {
        println!("{SPAWN_READY} {port}");
        let _ = std::io::stdout().flush();
    } else if out == Out::Text {
        println!("\n************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
        let _ = std::io::stdout().flush();
    }
    let stream = accept(&listener, args.spawned.then_some(QUICK))?;
    drop(listener);
    let (local, peer) = (
        stream.local_addr().map_err(es)?.ip(),
        stream.peer_addr().map_err(es)?.ip(),
    );
    let mut c = Ctrl::new(stream)?;
    let r = open(args, devices, local, peer).and_then(|(ctx, tname)| {
        let r = serve(args, &ctx, &mut c, out, tname);
        wait_destroy(args);
        r
    });
    if let Err(e) = &r {
        let _ = c.send(&format!("error {e}"));
    }
    r
}

fn serve(args: &Args, ctx: &Context, c: &mut Ctrl, out: Out, tname: &str) -> Result<bool, String> {
    let line = c.recv(Some(QUICK))?;
    let json = check_word(line, MAGIC)?;
    let p: Params =
        serde_json::from_str(&json).map_err(|e| format!("bad parameters from the client: {e}"))?;
    if p.test != args.test {
        return Err(format!(
            "this server runs {}, the client asked for {}",
            args.test.name(),
            p.test.name()
        ));
    }
    let events = args.events && p.test.verb() != Verb::Write;
    let mut res = Res::new(ctx, &p, 1, events, args.report_gbits)?;
    res.notes = out == Out::Text;
    if p.rdma_cm {
        ctx.cm()
            .listen(softrdma::rdma_cm::PortSpace::Tcp, p.cm_port)
            .map_err(|e| format!("-R: listening on rdma_cm port {}: {e}", p.cm_port))?;
    }
    c.send("ok")?;
    let remote = recv_conns(c, p.qps)?;
    send_conns(c, &res)?;
    res.connect(remote)?;
    let mtu = res.path_mtu;
    let active = !p.test.passive_server() || p.bidir;
    if out == Out::Text {
        print_intro(&res, &p, ctx.name(), mtu, events, false, active, tname);
    }
    let mut prog = Progress::new(out == Out::Text && (p.sizes.len() > 1 || p.duration.is_some()));
    let mut rows = Vec::new();
    let mut all_ok = true;
    let mut checked = false;
    loop {
        // The client says "go SIZE" for each run, then "bye".
        let l = c.recv(None)?;
        if l == "bye" {
            break;
        }
        let size: u64 = check_word(l, "go")?
            .parse()
            .map_err(|_| "bad size from the client".to_string())?;
        if !p.sizes.contains(&size) {
            return Err(format!(
                "the client asked for size {size}, not one of its sizes"
            ));
        }
        res.prepare(size)?;
        c.send("ready")?;
        let mut early = None;
        let mut mine = Done::default();
        let mut count = 0;
        let row = match p.test {
            Test::WriteLat | Test::SendLat => {
                let t = res.ping_pong(size, false, c, &mut early, &mut prog)?;
                count = t.len() as u64;
                Some(lat_result(&p, size, &t, res.now_ns())?)
            }
            Test::SendBw => {
                let (row, n) = res.send_bw_server(size, c, &mut early, &mut prog)?;
                mine.received = n;
                Some(row)
            }
            _ if p.bidir => {
                // -b: this end runs the same test towards the client.
                let (row, _) = res.bw_client(size, &mut prog)?;
                if let Row::Bw(b) = &row {
                    // In the client's units, for its sum.
                    let c = |v| report::bw_convert(v, res.gbits, p.gbits);
                    mine.bw = Some(BwRow {
                        bw_peak: c(b.bw_peak),
                        bw_average: c(b.bw_average),
                        ..b.clone()
                    });
                }
                Some(row)
            }
            _ => None,
        };
        let cl = match early {
            Some(l) => check_word(l, "done")?,
            None => c.expect("done", None)?,
        };
        let cd: Done =
            serde_json::from_str(&cl).map_err(|e| format!("bad report from the client: {e}"))?;
        if p.check {
            if let Some(r) = res.check(size, count, &cd.ops, mine.received > 0) {
                checked = true;
                mine.check = Some(r.is_ok());
                if let Err(w) = r {
                    all_ok = false;
                    if out != Out::Quiet {
                        eprintln!("softrdma perf: data check failed at {size} bytes: {w}");
                    }
                    mine.why = Some(w);
                }
            }
        }
        c.send(&format!(
            "done {}",
            serde_json::to_string(&mine).map_err(es)?
        ))?;
        if let Some(mut row) = row {
            no_peak(args, &mut row);
            if out == Out::Text {
                println!("{}", row.text());
            }
            if let (Some(k), false) = (args.output, args.spawned) {
                println!("{}", row.number(k));
            }
            rows.push(row);
        }
    }
    prog.done();
    match out {
        Out::Text => {
            println!("{RULE}");
            println!(" Path used       : {}", path_used(ctx));
            print_faults(args, ctx);
            if checked {
                println!(
                    " Data check      : {}",
                    if all_ok { "passed" } else { "FAILED" }
                );
            }
        }
        Out::Json | Out::Quiet => {}
    }
    if args.json || args.out_json {
        let (local, remote) = res.addrs();
        let doc = json_doc(
            &p,
            "server",
            ctx.name(),
            mtu,
            res.gbits,
            &local,
            &remote,
            &rows,
            checked.then_some(all_ok),
            path_used(ctx),
        );
        let mut doc = doc;
        doc["faults_injected"] = ctx.driver_counters().faults_injected.into();
        emit_json(args, &doc);
    }
    Ok(all_ok)
}

/// Client mode: connects to the server at `host:port` and runs the test.
pub(crate) fn client(
    args: &Args,
    devices: &[String],
    host: &str,
    port: u16,
) -> Result<bool, String> {
    args.params(None)?;
    let out = if args.json {
        Out::Json
    } else if args.output.is_some() {
        Out::Quiet
    } else {
        Out::Text
    };
    let stream = connect(host, port, Duration::from_secs(5))?;
    let (local, peer) = (
        stream.local_addr().map_err(es)?.ip(),
        stream.peer_addr().map_err(es)?.ip(),
    );
    let (ctx, tname) = open(args, devices, local, peer)?;
    let p = args.params(Some(ctx.query_port().active_mtu.bytes()))?;
    super::note_ud_clamp(args, &p);
    let mut c = Ctrl::new(stream)?;
    c.send(&format!(
        "{MAGIC} {}",
        serde_json::to_string(&p).map_err(es)?
    ))?;
    c.expect("ok", Some(QUICK))?;
    let mut res = Res::new(&ctx, &p, 0, args.events, args.report_gbits)?;
    res.notes = out == Out::Text;
    send_conns(&mut c, &res)?;
    let remote = recv_conns(&mut c, p.qps)?;
    res.connect(remote)?;
    let mtu = res.path_mtu;
    if out == Out::Text {
        print_intro(&res, &p, ctx.name(), mtu, args.events, true, true, tname);
    }
    let mut prog = Progress::new(out == Out::Text && (p.sizes.len() > 1 || p.duration.is_some()));
    let mut rows = Vec::new();
    let mut all_ok = true;
    let mut checked = false;
    let n_sizes = p.sizes.len();
    // -b: the server's own rows (added into ours).
    let mut peer_rows: Vec<BwRow> = Vec::new();
    // --run_infinitely: the one timed run again and again, until stopped.
    let runs: Box<dyn Iterator<Item = u64>> = if p.forever {
        Box::new(std::iter::repeat(p.sizes[0]))
    } else {
        Box::new(p.sizes.clone().into_iter())
    };
    for (i, size) in runs.enumerate() {
        res.prepare(size)?;
        c.send(&format!("go {size}"))?;
        c.expect("ready", Some(QUICK))?;
        let mut mine = Done::default();
        let mut early = None;
        let mut fetched: Option<String> = None;
        let mut count = 0;
        let row = match p.test {
            Test::WriteLat | Test::SendLat => {
                let t = res.ping_pong(size, true, &mut c, &mut early, &mut prog)?;
                count = t.len() as u64;
                mine.ops = vec![count];
                lat_result(&p, size, &t, res.now_ns())?
            }
            Test::ReadLat | Test::AtomicLat => {
                let t = res.one_sided_lat(size, &mut prog, &mut fetched)?;
                mine.ops = vec![t.len() as u64];
                lat_result(&p, size, &t, res.now_ns())?
            }
            _ => {
                let (row, ops) = res.bw_client(size, &mut prog)?;
                mine.ops = ops;
                row
            }
        };
        if let Some(l) = early {
            return Err(format!("unexpected message from the server: {l:?}"));
        }
        let mut fails = Vec::new();
        if p.check {
            if let Some(r) = res.check(size, count, &[], true) {
                checked = true;
                mine.check = Some(r.is_ok());
                if let Err(w) = r {
                    fails.push(format!("here: {w}"));
                }
            }
            if let Some(w) = fetched {
                checked = true;
                fails.push(format!("here: {w}"));
            }
        }
        c.send(&format!(
            "done {}",
            serde_json::to_string(&mine).map_err(es)?
        ))?;
        let sd: Done = serde_json::from_str(&c.expect("done", Some(QUICK))?)
            .map_err(|e| format!("bad report from the server: {e}"))?;
        let mut row = row;
        if let Some(b) = &sd.bw {
            peer_rows.push(b.clone());
        }
        if let (Some(theirs), Row::Bw(mine)) = (&sd.bw, &mut row) {
            // -b: both directions together, as perftest reports them.
            mine.bw_peak += theirs.bw_peak;
            mine.bw_average += theirs.bw_average;
            mine.msg_rate_mpps += theirs.msg_rate_mpps;
        }
        no_peak(args, &mut row);
        if let Some(ok) = sd.check {
            checked = true;
            if !ok {
                fails.push(format!(
                    "on the server: {}",
                    sd.why.unwrap_or_else(|| "failed".into())
                ));
            }
        }
        if !fails.is_empty() {
            all_ok = false;
            eprintln!(
                "softrdma perf: data check failed at {size} bytes: {}",
                fails.join("; ")
            );
        }
        if p.test == Test::SendBw
            && p.conn != Conn::Rc
            && sd.received < row_iters(&row)
            && out == Out::Text
        {
            eprintln!(
                "softrdma perf: the server received {} of {} messages ({} drops them when no receive is posted)",
                sd.received,
                row_iters(&row),
                p.conn.name()
            );
        }
        if out == Out::Text {
            prog.done();
            println!("{}", row.text());
        }
        if let Some(k) = args.output {
            println!("{}", row.number(k));
        }
        let _ = std::io::stdout().flush();
        if !p.forever {
            rows.push(row);
        }
        prog.say(|| format!("{} of {n_sizes} sizes done", i + 1));
    }
    prog.done();
    let _ = c.send("bye");
    wait_destroy(args);
    match out {
        Out::Text => {
            println!("{RULE}");
            println!(" Path used       : {}", path_used(&ctx));
            print_faults(args, &ctx);
            if checked {
                println!(
                    " Data check      : {}",
                    if all_ok { "passed" } else { "FAILED" }
                );
            }
        }
        Out::Json | Out::Quiet => {}
    }
    if args.json || args.out_json {
        let (local, remote) = res.addrs();
        let doc = json_doc(
            &p,
            "client",
            ctx.name(),
            mtu,
            res.gbits,
            &local,
            &remote,
            &rows,
            checked.then_some(all_ok),
            path_used(&ctx),
        );
        let mut doc = doc;
        doc["faults_injected"] = ctx.driver_counters().faults_injected.into();
        if p.bidir {
            doc["bidirectional_server_results"] = serde_json::json!(peer_rows);
        }
        emit_json(args, &doc);
    }
    Ok(all_ok)
}

/// -N: no peak bandwidth.
fn no_peak(args: &Args, row: &mut Row) {
    if let (true, Row::Bw(b)) = (args.no_peak, row) {
        b.bw_peak = 0.0;
    }
}

/// --wait_destroy: keep the resources a while before they are released.
fn wait_destroy(args: &Args) {
    if let Some(s) = args.wait_destroy {
        std::thread::sleep(Duration::from_secs(s.min(3600)));
    }
}

/// Prints the JSON report, or writes it to --out_json's file (or both).
fn emit_json(args: &Args, doc: &serde_json::Value) {
    if args.json {
        println!("{doc}");
    }
    if args.out_json {
        let path = args
            .out_json_file
            .clone()
            .unwrap_or_else(|| "perftest_out.json".into());
        if let Err(e) = std::fs::write(&path, format!("{doc}\n")) {
            eprintln!("softrdma perf: cannot write {}: {e}", path.display());
        }
    }
}

fn row_iters(r: &Row) -> u64 {
    match r {
        Row::Lat(l) => l.iterations,
        Row::LatDur(l) => l.iterations,
        Row::Bw(b) => b.iterations,
    }
}

/// An empty vector with room for `n` items whose pages are already
/// touched: the timed loop then takes no page fault when it pushes (a fault
/// per 4 KiB of stamps cost the 8 B message rate 8 % of its time, charged
/// to the transport).
fn prefaulted<T: Default + Clone>(n: usize) -> Vec<T> {
    // Written item by item (not `vec![0; n]`, which maps zero pages lazily).
    let mut v = Vec::with_capacity(n);
    v.resize(n, T::default());
    v.clear();
    v
}
