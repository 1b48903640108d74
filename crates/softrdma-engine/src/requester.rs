//! The requester of a QP: turns send WQEs into request packets
//! (segmenting by path MTU, assigning PSNs, setting AckReq) under the
//! `max_rd_atomic` limit, fences, end-to-end credits and the congestion
//! controller's say, and goes back (go-back-N) when the completer
//! (`completer.rs`) finds something lost. What comes back is the
//! completer's.

use crate::handle::{Lkey, Qpn};
use std::net::SocketAddr;

use softrdma_wire::packet::{emit_around, emit_in_place, payload_offset};
use softrdma_wire::{
    AtomicEthRepr, BthRepr, DethRepr, Endpoints, Headers, OpKind, Opcode, Position, Psn, RethRepr,
    Transport,
};

use crate::congestion::{SendVerdict, SentPacket};
use crate::qp::{Qp, SendWqe, WqeView};
use crate::qp_attr::QpType;
use crate::resources::Resources;
use crate::rules;
use crate::send_records::SendRecord;
use crate::time::Instant;
use crate::timers::Timer;
use crate::wr::{SendFlags, SendOp, WcStatus};

/// What `poll_transmit` hands the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written to the buffer (a whole UDP payload, ICRC included).
    pub len: usize,
    /// The UDP endpoints: send from `src` (the port matters: the ICRC covers it) to `dst`.
    pub endpoints: Endpoints,
    /// The QP that sent it.
    pub qpn: Qpn,
    /// The ECN codepoint the IP header must carry (`NotEct` unless
    /// congestion control asks for ECN-capable transport).
    pub ecn: softrdma_wire::Ecn,
    /// With [`crate::Engine::poll_transmit_gather`]: the payload was left
    /// in registered memory, and the packet is the buffer with this hole
    /// filled from there.
    pub payload: Option<TxPayload>,
}

/// A payload sent by reference: `len` bytes at process address `addr`
/// (what the region's [`crate::RegionMemory::tx_addr`] gave) belong at
/// `offset` in the packet. The buffer holds everything else: headers
/// before the hole, pad and ICRC after it (the ICRC already covers the
/// payload). The address stays valid while the region is registered: a
/// driver sends (or copies) the packet before it lets anything deregister
/// regions, and applications must not change memory a send WR reads
/// before its completion (the ICRC was computed when the packet was built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPayload {
    /// Where the payload starts in the packet.
    pub offset: usize,
    /// Its length.
    pub len: usize,
    /// Its address in the driver's process.
    pub addr: usize,
    /// The region it lies in (local key) and its offset there, for
    /// [`crate::Engine::copy_payload`].
    pub lkey: Lkey,
    /// Offset of the payload in that region.
    pub region_offset: usize,
}

/// A payload piece of one packet lying in one region, to be sent by reference.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ZcPiece {
    pub lkey: Lkey,
    /// Offset in the region.
    pub base: usize,
    pub addr: usize,
}

/// A request packet built by `build_request`, not yet sealed and counted.
pub(crate) struct BuiltRequest {
    pub bth: BthRepr,
    pub headers: Headers,
    /// Payload bytes (in the buffer, or in a region when `zc` is set).
    pub payload_len: usize,
    /// PSNs it occupies: 1, or the responses a READ request asks for.
    pub span: u32,
    pub zc: Option<ZcPiece>,
}

impl BuiltRequest {
    fn header_only(bth: BthRepr, headers: Headers, span: u32) -> Self {
        BuiltRequest {
            bth,
            headers,
            payload_len: 0,
            span,
            zc: None,
        }
    }
}

/// The per-call context of packet production.
pub(crate) struct TxCtx<'a> {
    pub buf: &'a mut [u8],
    pub local: SocketAddr,
    pub ack_req_every: u32,
    pub ack_delay_ns: u64,
    /// `EngineConfig::ack_delay_answering_only`.
    pub hold_needs_answer: bool,
    pub now: Instant,
    /// Payloads may be left in registered memory ([`TxPayload`]).
    pub gather: bool,
}

pub(crate) fn transport_of(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
        QpType::XrcIni | QpType::XrcTgt => Transport::Xrc,
    }
}

/// The XRC twin of an RC opcode (same low five bits, transport bits
/// 0b101); the opcode itself when it has none.
pub(crate) fn xrc_opcode(op: Opcode) -> Opcode {
    if op.info().transport == Transport::Rc {
        Opcode::from_u8(op.value() | Transport::Xrc.base()).unwrap_or(op)
    } else {
        op
    }
}

impl Qp {
    pub(crate) fn endpoints(&self, ctx: &TxCtx<'_>, dst: SocketAddr) -> Endpoints {
        Endpoints::new(SocketAddr::new(ctx.local.ip(), self.src_port), dst)
    }

    /// Writes headers around a payload already placed at its offset, and counts it.
    pub(crate) fn finish_packet(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
        bth: BthRepr,
        headers: Headers,
        payload_len: usize,
        dst: SocketAddr,
    ) -> Option<Transmit> {
        self.finish_packet_zc(res, ctx, bth, headers, payload_len, dst, None)
    }

    /// [`Self::finish_packet`] for a payload that may be left in a region (`zc`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_packet_zc(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
        bth: BthRepr,
        headers: Headers,
        payload_len: usize,
        dst: SocketAddr,
        zc: Option<ZcPiece>,
    ) -> Option<Transmit> {
        // Every packet a QP sends (requests, ACKs, NAKs, READ responses,
        // atomic ACKs) carries its P_Key, which the peer checks.
        let mut bth = bth;
        bth.pkey = self.pkey();
        // An XRC QP's packets are RC's with XRC opcodes (its requests got
        // their XRCETH when they were built, `Qp::xrc_request`).
        if self.qp_type.is_xrc() {
            bth.opcode = xrc_opcode(bth.opcode);
        }
        let ep = self.endpoints(ctx, dst);
        let (len, payload) = match zc {
            None => (
                emit_in_place(&bth, &headers, ctx.buf, payload_len, &ep).ok()?,
                None,
            ),
            Some(p) => {
                let mem = &res.mrs.get(&p.lkey)?.mem;
                let len = emit_around(&bth, &headers, ctx.buf, payload_len, &ep, |crc, head| {
                    mem.crc32(crc, head, p.base, payload_len)
                })
                .ok()?;
                let payload = TxPayload {
                    offset: payload_offset(&headers),
                    len: payload_len,
                    addr: p.addr,
                    lkey: p.lkey,
                    region_offset: p.base,
                };
                (len, Some(payload))
            }
        };
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += len as u64;
        res.counters.tx_packets += 1;
        res.counters.tx_bytes += len as u64;
        Some(Transmit {
            len,
            endpoints: ep,
            qpn: self.qpn,
            ecn: self.cc.ecn_to_send(),
            payload,
        })
    }

    fn npkts_of(&self, w: &SendWqe) -> u32 {
        match w.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
            _ if self.qp_type == QpType::Ud => 1,
            _ => w.len.div_ceil(u64::from(self.mtu)).max(1) as u32,
        }
    }

    /// Checks a WQE when it first starts executing, the way an HCA does: bad
    /// local keys or lengths become error completions, not post failures.
    fn validate_wqe(&self, res: &Resources, w: &SendWqe) -> Result<(), WcStatus> {
        if !rules::message_len_ok(w.len) {
            return Err(WcStatus::LocLenErr);
        }
        if self.qp_type == QpType::Ud {
            if w.len > u64::from(self.mtu) {
                return Err(WcStatus::LocLenErr);
            }
            let (ah, _, _) = w.ud.ok_or(WcStatus::LocQpOpErr)?;
            match res.ahs.get(&ah) {
                Some(a) if a.pd == self.pd => {}
                _ => return Err(WcStatus::LocQpOpErr),
            }
        }
        if w.inline.is_none() {
            res.check_sges(&w.sges, self.pd, rules::local_access(&w.op))?;
        }
        if w.op.is_atomic() && !rules::atomic_local_len_ok(w.len) {
            return Err(WcStatus::LocLenErr);
        }
        Ok(())
    }

    /// Produces the next request packet, if the send queue has one to go.
    pub(crate) fn next_request(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
    ) -> Option<Transmit> {
        if !rules::requester_active(self.state) {
            return None;
        }
        if let Some(t) = self.timers.get(Timer::RnrWait) {
            if ctx.now < t {
                return None;
            }
            self.timers.stop(Timer::RnrWait);
        }
        if self.sr() && !self.req.sr_queue.is_empty() {
            if let Some(t) = self.sr_retransmit(res, ctx) {
                return Some(t);
            }
            if !self.req.sr_queue.is_empty() {
                // A retransmission waits for the controller: nothing new passes it.
                return None;
            }
        }
        // Memory-window binds and local invalidations run when they are the
        // head of the send queue — every WQE before them completed, so
        // completions stay in order and no request posted before a bind
        // meets the window it sets — and take no PSN.
        while self.req.next == 0 {
            let Some(op) = self.req.sq.front().map(|w| w.op) else {
                break;
            };
            if !op.is_local() {
                break;
            }
            if !rules::requester_may_start(self.state) {
                return None;
            }
            match self.execute_local(res, &op) {
                Ok(()) => self.complete_head(res, WcStatus::Success),
                Err(status) => {
                    self.fail_head(res, status);
                    return None;
                }
            }
        }
        let idx = self.req.next;
        let view = self.req.sq.get(idx)?.view();
        if view.op.is_local() {
            // Waits until it is the head.
            return None;
        }
        if self.sr() && self.req.psn.distance_from(self.comp.una) >= softrdma_wire::sack::MAX_BITS {
            // No further than a SACK can describe.
            return None;
        }
        if !self.congestion_allows(ctx.now, &view) {
            return None;
        }
        let w = &self.req.sq[idx];
        if !w.assigned {
            // A WQE that has not started: drain, fence, read/atomic limit and credits apply.
            if !rules::requester_may_start(self.state) {
                return None;
            }
            if w.flags.contains(SendFlags::FENCE) && self.rd_atomic_outstanding() > 0 {
                return None;
            }
            if w.op.is_read_or_atomic()
                && self.rd_atomic_outstanding() >= u32::from(self.attr.max_rd_atomic.max(1))
            {
                return None;
            }
            if self.qp_type == QpType::Rc && consumes_rq(&w.op) && !self.has_credit() {
                return None;
            }
            if let Err(status) = self.validate_wqe(res, w) {
                // Only the head can fail: the WQEs before it were sent, so
                // it fails once they are acknowledged and it is the head.
                if idx == 0 {
                    self.fail_head(res, status);
                }
                return None;
            }
            let npkts = self.npkts_of(w);
            let psn = self.req.psn;
            let w = &mut self.req.sq[idx];
            w.assigned = true;
            w.first_psn = psn;
            w.npkts = npkts;
            if consumes_rq(&w.op) {
                self.req.rq_msgs_sent += 1;
            }
        }
        match self.qp_type {
            QpType::Ud => self.send_ud(res, ctx),
            _ => self.send_connected(res, ctx, idx),
        }
    }

    /// A bind (IBV_WC_MW_BIND_ERR when refused) or a local invalidation
    /// (IBV_WC_LOC_QP_OP_ERR when refused, as rxe reports it), by the
    /// rules of [`rules::check_bind`] and [`rules::check_invalidate`].
    fn execute_local(&self, res: &mut Resources, op: &SendOp) -> Result<(), WcStatus> {
        match *op {
            SendOp::BindMw { mw, rkey, bind } => res
                .bind_mw(self.pd, self.qpn, mw, rkey, &bind)
                .map_err(|_| WcStatus::MwBindErr),
            SendOp::LocalInv { rkey } => res
                .invalidate_mw(self.pd, self.qpn, rkey, false)
                .map_err(|_| WcStatus::LocQpOpErr),
            _ => Ok(()),
        }
    }

    /// Asks the congestion controller whether the next packet, from `w`,
    /// may go now; a "not before" arms the pacing timer.
    fn congestion_allows(&mut self, now: Instant, w: &WqeView) -> bool {
        // UC and UD have no acknowledgements: nothing is ever in flight.
        let inflight = match self.qp_type {
            QpType::Rc if self.sr() => self.sr_window_inflight(self.req.psn),
            QpType::Rc | QpType::XrcIni => self.req.psn.distance_from(self.comp.una),
            _ => 0,
        };
        let bytes = if w.op.is_read_or_atomic() {
            0
        } else {
            w.len
                .saturating_sub(self.req.next_offset)
                .min(u64::from(self.mtu)) as usize
        };
        self.congestion_allows_with(now, inflight, bytes)
    }

    /// [`Self::congestion_allows`] for `inflight` PSNs and a payload of `bytes`.
    pub(crate) fn congestion_allows_with(
        &mut self,
        now: Instant,
        inflight: u32,
        bytes: usize,
    ) -> bool {
        match self.cc.can_send(now, inflight, bytes) {
            SendVerdict::Now => {
                self.timers.stop(Timer::Pacing);
                true
            }
            SendVerdict::NotBefore(t) if t <= now => {
                self.timers.stop(Timer::Pacing);
                true
            }
            SendVerdict::NotBefore(t) => {
                self.timers.set(Timer::Pacing, t);
                false
            }
            SendVerdict::Blocked => false,
        }
    }

    fn has_credit(&self) -> bool {
        match self.comp.credit_limit {
            None => true,
            Some(limit) => {
                // With no credit, one message may still probe (it may be RNR NAKed).
                self.req.rq_msgs_sent < limit || self.req.rq_msgs_sent == self.comp.rq_msgs_acked
            }
        }
    }

    fn send_ud(&mut self, res: &mut Resources, ctx: &mut TxCtx<'_>) -> Option<Transmit> {
        let w = self.req.sq.front()?.clone();
        let (ah, remote_qpn, qkey) = w.ud?;
        let dst = res.ahs.get(&ah)?.dest;
        let qkey = if qkey & 0x8000_0000 != 0 {
            self.attr.qkey
        } else {
            qkey
        };
        let deth = DethRepr {
            qkey,
            src_qp: self.qpn.raw(),
        };
        let (opcode, headers) = match w.op {
            SendOp::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_IMM, Headers::DethImm(deth, imm)),
            _ => (Opcode::UD_SEND_ONLY, Headers::Deth(deth)),
        };
        let off = payload_offset(&headers);
        let len = w.len as usize;
        if let Err(s) = self.fill_payload(res, &w, 0, ctx.buf.get_mut(off..off + len)?) {
            self.fail_head(res, s);
            return None;
        }
        let mut bth = BthRepr::new(opcode, remote_qpn.raw(), self.req.psn);
        bth.solicited = w.flags.contains(SendFlags::SOLICITED);
        let psn = self.req.psn;
        self.req.psn = psn.next();
        let tx = self.finish_packet(res, ctx, bth, headers, len, dst);
        if let Some(t) = &tx {
            let sent = SentPacket {
                psn,
                span: 1,
                bytes: t.len,
                retransmit: false,
            };
            self.cc.on_sent(ctx.now, &sent);
        }
        self.complete_head(res, WcStatus::Success);
        tx
    }

    fn fill_payload(
        &self,
        res: &Resources,
        w: &SendWqe,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), WcStatus> {
        match &w.inline {
            Some(data) => {
                let o = offset as usize;
                dst.copy_from_slice(data.get(o..o + dst.len()).ok_or(WcStatus::LocLenErr)?);
                Ok(())
            }
            None => res.gather(&w.sges, self.pd, offset, dst),
        }
    }

    /// The next packet of an RC or UC send queue, from WQE `idx` at the
    /// send position.
    fn send_connected(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
        idx: usize,
    ) -> Option<Transmit> {
        let dst = self.dest?;
        let w = self.req.sq[idx].view();
        let psn = self.req.psn;
        let offset = self.req.next_offset;
        let b = self.build_request(res, ctx, idx, offset, psn)?;
        if b.bth.ack_req {
            self.req.since_ack_req = 0;
        }
        // Advance the send position.
        if w.op.is_read_or_atomic() || offset + b.payload_len as u64 >= w.len {
            self.req.next += 1;
            self.req.next_offset = 0;
        } else {
            self.req.next_offset += b.payload_len as u64;
        }
        self.req.psn = psn.add(b.span);
        let retransmit = psn.is_before(self.req.high);
        if crate::rules::sends_requests_reliably(self.qp_type) {
            self.record_sent(ctx.now, idx, offset, psn, &b, retransmit);
        }
        if retransmit {
            self.counters.retransmits += 1;
            res.counters.retransmits += 1;
        }
        if self.req.high.is_before(self.req.psn) {
            self.req.high = self.req.psn;
        }
        let (span, payload_len) = (b.span, b.payload_len);
        let tx = self.finish_packet_zc(res, ctx, b.bth, b.headers, payload_len, dst, b.zc);
        if let Some(t) = &tx {
            let sent = SentPacket {
                psn,
                span,
                bytes: t.len,
                retransmit,
            };
            self.cc.on_sent(ctx.now, &sent);
        }
        match self.qp_type {
            QpType::Uc => {
                if self.req.next > 0 {
                    // UC completes on transmission of the last packet.
                    self.complete_head(res, WcStatus::Success);
                }
            }
            _ => {
                if !self.timers.is_armed(Timer::Retransmit) {
                    self.arm_ack_timer(ctx.now);
                }
            }
        }
        tx
    }

    /// Keeps the send record of an RC request packet that is going out.
    pub(crate) fn record_sent(
        &mut self,
        now: Instant,
        idx: usize,
        offset: u64,
        psn: Psn,
        b: &BuiltRequest,
        retransmit: bool,
    ) {
        let w = &self.req.sq[idx];
        let len = match w.op {
            SendOp::Read { .. } => w.len - offset,
            _ => b.payload_len as u64,
        };
        let rec = SendRecord {
            psn,
            span: b.span,
            wqe: w.serial,
            offset,
            len: len as u32,
            opcode: b.bth.opcode,
            sent_at: now,
            retransmitted: retransmit,
            tx_seq: {
                self.req.tx_seq += 1;
                self.req.tx_seq
            },
            sacked: false,
            lost: false,
        };
        let resume = (
            self.req.base_serial() + self.req.next as u64,
            self.req.next_offset,
        );
        self.req.records.sent(rec, !retransmit, resume);
    }

    /// Builds the request packet of WQE `idx` that starts at `offset` of its
    /// message and carries PSN `psn`: its headers, and its payload placed in
    /// `ctx.buf` (or left in the region, `zc`). The requester's next packet,
    /// or any packet a send record describes (`position_of`). A payload that
    /// cannot be read fails the WQE (the head at once; a later one when it
    /// becomes the head) and builds nothing.
    pub(crate) fn build_request(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
        idx: usize,
        offset: u64,
        psn: Psn,
    ) -> Option<BuiltRequest> {
        let w = self.req.sq[idx].view();
        let remote_qpn = self.attr.dest_qp_num;
        let xrc = self.xrc_srqn_of(idx);
        let atomic = |opcode, a: AtomicEthRepr| {
            let mut bth = BthRepr::new(opcode, remote_qpn.raw(), psn);
            bth.ack_req = true;
            let h = xrc_request(xrc, Headers::Atomic(a))?;
            Some(BuiltRequest::header_only(bth, h, 1))
        };
        match w.op {
            SendOp::Read { remote_addr, rkey } => {
                let reth = RethRepr {
                    va: remote_addr.wrapping_add(offset),
                    rkey: rkey.raw(),
                    dma_len: (w.len - offset) as u32,
                };
                let mut bth = BthRepr::new(Opcode::RC_READ_REQUEST, remote_qpn.raw(), psn);
                bth.ack_req = true;
                let remaining_pkts = w.npkts - (offset / u64::from(self.mtu)) as u32;
                Some(BuiltRequest::header_only(
                    bth,
                    xrc_request(xrc, Headers::Reth(reth))?,
                    remaining_pkts,
                ))
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => atomic(
                Opcode::RC_COMPARE_SWAP,
                AtomicEthRepr {
                    va: remote_addr,
                    rkey: rkey.raw(),
                    swap_add: swap,
                    compare,
                },
            ),
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => atomic(
                Opcode::RC_FETCH_ADD,
                AtomicEthRepr {
                    va: remote_addr,
                    rkey: rkey.raw(),
                    swap_add: add,
                    compare: 0,
                },
            ),
            _ => self.build_message_packet(res, ctx, idx, offset, psn),
        }
    }

    /// [`Self::build_request`] for a SEND or WRITE packet: position in the
    /// message, opcode, AckReq, and the payload.
    fn build_message_packet(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
        idx: usize,
        offset: u64,
        psn: Psn,
    ) -> Option<BuiltRequest> {
        let w = self.req.sq[idx].view();
        let seg = (w.len - offset).min(u64::from(self.mtu));
        let first = offset == 0;
        let last = offset + seg == w.len;
        let position = match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        };
        let (kind, headers) = message_headers(&w.op, position, w.len);
        let headers = xrc_request(self.xrc_srqn_of(idx), headers)?;
        let opcode = Opcode::find(transport_of(self.qp_type), kind, position, headers.layout())?;
        let mut bth = BthRepr::new(opcode, self.attr.dest_qp_num.raw(), psn);
        bth.solicited = last && w.flags.contains(SendFlags::SOLICITED);
        self.req.since_ack_req += 1;
        let inflight = if self.sr() {
            self.sr_window_inflight(psn.next())
        } else {
            psn.next().distance_from(self.comp.una)
        };
        let window_full = inflight >= self.cc.window();
        bth.ack_req = self.qp_type.is_reliable()
            && (last || window_full || self.req.since_ack_req >= ctx.ack_req_every);
        let off = payload_offset(&headers);
        let dstbuf = ctx.buf.get_mut(off..off + seg as usize)?;
        let wqe = &self.req.sq[idx];
        // By reference when the packet's payload lies in one SGE of
        // a region that allows it; otherwise (and for every error,
        // which the copy then reports) copied.
        let by_ref = match &wqe.inline {
            None if ctx.gather && seg > 0 => {
                res.payload_ref(&wqe.sges, self.pd, offset, seg as usize)
            }
            _ => None,
        };
        if by_ref.is_none() {
            if let Err(s) = self.fill_payload(res, wqe, offset, dstbuf) {
                if idx == 0 {
                    self.fail_head(res, s);
                } else {
                    // Let earlier WQEs finish; the head check fails it later.
                    self.req.sq[idx].assigned = false;
                }
                return None;
            }
        }
        Some(BuiltRequest {
            bth,
            headers,
            payload_len: seg as usize,
            span: 1,
            zc: by_ref,
        })
    }

    /// Go back (or forward) to `psn`, which must lie in `[una, high]`: the next
    /// packet transmitted is the one with that PSN. A READ resumes its
    /// request at the first response still missing.
    pub(crate) fn rewind(&mut self, psn: Psn) {
        let (idx, offset) = self.position_of(psn);
        debug_assert_eq!(
            (idx, offset),
            self.position_by_wqes(psn),
            "the send records disagree with the WQEs about PSN {psn:?}"
        );
        self.req.next = idx;
        self.req.next_offset = offset;
        self.req.psn = psn;
        self.req.since_ack_req = 0;
        // Going back sends everything from `psn` again: nothing is left to
        // send selectively.
        self.req.sr_queue.clear();
        self.req.records.clear_lost();
        self.req.lost_scan_at = 0;
    }

    /// Where the packet with PSN `psn` (in `[una, high]`) starts, as (index
    /// in `sq`, offset in that WQE's message): from the record of the packet
    /// that holds it, or for `high`, never sent, where transmission resumes.
    pub(crate) fn position_of(&self, psn: Psn) -> (usize, u64) {
        let mtu = u64::from(self.mtu);
        let base = self.req.base_serial();
        let (serial, offset) = match self.req.records.find(psn) {
            // A READ's record covers all its responses: one MTU each.
            Some(r) => (r.wqe, r.offset + u64::from(psn.distance_from(r.psn)) * mtu),
            None => self.req.records.resume().unwrap_or((base, 0)),
        };
        match serial.checked_sub(base) {
            Some(i) if i <= self.req.sq.len() as u64 => (i as usize, offset),
            // The WQE is gone (only a flush retires WQEs still in flight).
            _ => (self.req.sq.len(), 0),
        }
    }

    /// [`Self::position_of`] worked out from the WQEs' PSNs instead of the
    /// records: the check of the records in debug builds.
    fn position_by_wqes(&self, psn: Psn) -> (usize, u64) {
        let mtu = u64::from(self.mtu);
        for (i, w) in self.req.sq.iter().enumerate() {
            if !w.assigned {
                return (i, 0);
            }
            if psn.in_window(w.first_psn, w.npkts) {
                return (i, u64::from(psn.distance_from(w.first_psn)) * mtu);
            }
        }
        (self.req.sq.len(), 0)
    }
}

/// A request's headers on its QP: an XRC initiator's (`xrc` is its WQE's
/// remote XRC SRQ number) get the XRCETH in front; other QPs' stay as they
/// are. `None` only for headers no request has.
fn xrc_request(xrc: Option<u32>, headers: Headers) -> Option<Headers> {
    match xrc {
        Some(n) => headers.with_xrceth(n),
        None => Some(headers),
    }
}

impl Qp {
    /// The remote XRC SRQ number of send WQE `idx` on an XRC initiator;
    /// `None` on other QPs.
    fn xrc_srqn_of(&self, idx: usize) -> Option<u32> {
        if self.qp_type == QpType::XrcIni {
            Some(self.req.sq[idx].xrc_srqn)
        } else {
            None
        }
    }
}

/// Messages that consume a receive WQE at the responder.
pub(crate) fn consumes_rq(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::WriteWithImm { .. }
    )
}

/// Opcode kind and extension headers of a SEND or WRITE packet at `position`.
fn message_headers(op: &SendOp, position: Position, len: u64) -> (OpKind, Headers) {
    let ends = position.ends_message();
    let starts = position.starts_message();
    match *op {
        SendOp::SendWithImm { imm } if ends => (OpKind::Send, Headers::Imm(imm)),
        SendOp::SendWithInv { invalidate_rkey } if ends => {
            (OpKind::Send, Headers::Ieth(invalidate_rkey.raw()))
        }
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
            (OpKind::Send, Headers::None)
        }
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        } => {
            let reth = RethRepr {
                va: remote_addr,
                rkey: rkey.raw(),
                dma_len: len as u32,
            };
            let imm = match *op {
                SendOp::WriteWithImm { imm, .. } if ends => Some(imm),
                _ => None,
            };
            let h = match (starts, imm) {
                (true, Some(i)) => Headers::RethImm(reth, i),
                (true, None) => Headers::Reth(reth),
                (false, Some(i)) => Headers::Imm(i),
                (false, None) => Headers::None,
            };
            (OpKind::Write, h)
        }
        _ => (OpKind::Send, Headers::None),
    }
}
