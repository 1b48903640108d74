//! The responder of a QP: executes incoming SEND, WRITE, READ and atomic
//! requests in PSN order against registered memory, and queues what goes
//! back: coalesced ACKs, NAKs (sequence, RNR, invalid request, remote access,
//! remote operational), READ responses and atomic ACKs. Duplicates are
//! re-acknowledged, READs re-executed and atomics replayed from saved
//! results, never re-executed.

use crate::handle::{Qpn, Rkey};
use std::net::{IpAddr, SocketAddr};

use softrdma_wire::packet::payload_offset;
use softrdma_wire::{
    aeth, AethRepr, BthRepr, Headers, NakCode, OpKind, Opcode, PacketRepr, Position, Psn, Syndrome,
};

use crate::qp::{AckHold, AtomicResource, InMsg, Qp, ReadJob, RespOut};
use crate::qp_attr::{AccessFlags, Gid, QpType};
use crate::requester::{Transmit, TxCtx};
use crate::resources::{Mr, RecvWqe, Resources};
use crate::rules::{self, RemoteDenied};
use crate::time::Instant;
use crate::timers::Timer;
use crate::wr::{NetworkHdr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// Bytes of GRH space in front of every UD receive.
pub const GRH_LEN: usize = 40;

/// How a request failed at the responder.
enum Fail {
    /// Send this NAK and move to ERR.
    Nak(NakCode),
    /// No receive WQE: RNR NAK, retry later.
    Rnr,
    /// Drop silently (UC/UD, or nothing to say).
    Drop,
}

impl Qp {
    fn take_recv_wqe(&mut self, res: &mut Resources) -> Option<RecvWqe> {
        match self.srq {
            Some(s) => res.srq_pop(s),
            None => self.rq.pop_front(),
        }
    }

    fn give_back_recv_wqe(&mut self, res: &mut Resources, w: RecvWqe) {
        match self.srq {
            Some(s) => {
                if let Some(srq) = res.srqs.get_mut(&s) {
                    srq.wqes.push_front(w);
                }
            }
            None => self.rq.push_front(w),
        }
    }

    fn queue_ack(&mut self, psn: Psn) {
        let msn = self.resp.msn;
        if let Some(RespOut::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.resp.out.back_mut()
        {
            // Coalesce: one ACK for the newest PSN stands for all before it.
            *p = psn;
            *m = msn;
            return;
        }
        self.resp.out.push_back(RespOut::Ack {
            psn,
            syndrome: Syndrome::Ack { credits: 0 },
            msn,
        });
    }

    fn queue_nak(&mut self, psn: Psn, syndrome: Syndrome) {
        let msn = self.resp.msn;
        self.resp.out.push_back(RespOut::Ack { psn, syndrome, msn });
    }

    fn recv_completion(&self, wqe: &RecvWqe, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion::new(wqe.wr_id, status, opcode, self.qpn)
    }

    /// A request packet for this QP arrived from `src`.
    pub(crate) fn handle_request(
        &mut self,
        res: &mut Resources,
        pkt: &PacketRepr<'_>,
        src: SocketAddr,
        local: IpAddr,
    ) {
        if !self.can_receive() {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        }
        match self.qp_type {
            QpType::Ud => self.handle_ud(res, pkt, src, local),
            QpType::Uc => self.handle_uc(res, pkt),
            QpType::Rc | QpType::XrcTgt => self.handle_rc(res, pkt),
            // No responder (rules::takes_requests).
            QpType::XrcIni => {
                self.counters.dropped += 1;
                res.counters.dropped += 1;
            }
        }
    }

    /// An XRC target's check of a request it is about to execute
    /// ([`rules::check_xrc_target`]): on success the request runs against
    /// the XRC SRQ its XRCETH names, so the QP takes that SRQ's WQEs, PD
    /// and CQ for it.
    fn xrc_target(&mut self, res: &Resources, pkt: &PacketRepr<'_>) -> Result<(), Fail> {
        let srqn = pkt.headers.xrc_srqn();
        let handle = srqn.map(crate::handle::SrqHandle::from_raw);
        let found = handle.and_then(|h| res.srqs.get(&h));
        rules::check_xrc_target(self.xrcd, srqn, |_| {
            found.map(|s| rules::XrcSrqFacts {
                xrcd: s.xrc.map(|x| x.0),
            })
        })
        .map_err(Fail::Nak)?;
        if let (Some(h), Some(s)) = (handle, found) {
            self.srq = Some(h);
            self.pd = s.pd;
            if let Some((_, cq)) = s.xrc {
                self.recv_cq = cq;
            }
        }
        Ok(())
    }

    fn handle_rc(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            self.counters.out_of_sequence += 1;
            res.counters.out_of_sequence += 1;
            if self.sr() {
                // Selective repeat: kept until the PSNs before it arrive.
                self.sr_hold(res, pkt, d as u32);
                return;
            }
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                self.counters.seq_naks_sent += 1;
                res.counters.seq_naks_sent += 1;
                let e = self.resp.epsn;
                self.queue_nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            self.counters.duplicates += 1;
            res.counters.duplicates += 1;
            self.handle_duplicate(res, pkt);
            return;
        }
        let before = self.resp.epsn;
        if self.execute_in_order(res, pkt) && self.sr() {
            self.sr_after_execute(res, before);
        }
    }

    /// Executes the request at the expected PSN and queues what its outcome
    /// calls for (an RNR NAK, an error NAK and ERR). True when it executed.
    pub(crate) fn execute_in_order(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>) -> bool {
        let psn = pkt.bth.psn;
        self.resp.nak_sent = false;
        match self.execute(res, pkt) {
            Ok(()) => return true,
            Err(Fail::Rnr) => {
                self.counters.rnr_naks_sent += 1;
                res.counters.rnr_naks_sent += 1;
                let t = self.attr.min_rnr_timer;
                self.queue_nak(psn, Syndrome::RnrNak { timer: t });
                // The RNR NAK already tells the requester to go back to this
                // PSN: the packets behind it are dropped silently, like after
                // a sequence NAK, instead of each drawing a sequence NAK that
                // would spend the requester's transport retries.
                self.resp.nak_sent = true;
            }
            Err(Fail::Nak(code)) => {
                self.counters.error_naks_sent += 1;
                res.counters.error_naks_sent += 1;
                self.queue_nak(psn, Syndrome::Nak(code));
                self.enter_error_after_nak(res);
            }
            Err(Fail::Drop) => {}
        }
        false
    }

    /// Queues an ACK for `psn` (coalesced like any), which carries a SACK
    /// when it goes out while requests are held.
    pub(crate) fn queue_sr_ack(&mut self, psn: Psn) {
        self.queue_ack(psn);
    }

    fn handle_duplicate(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>) {
        let info = pkt.bth.opcode.info();
        match info.kind {
            OpKind::ReadRequest => {
                // Re-execute from the request as sent now (it may start mid-way).
                if let Some(reth) = pkt.headers.reth() {
                    if self.check_remote(
                        res,
                        Rkey::from_raw(reth.rkey),
                        reth.va,
                        u64::from(reth.dma_len),
                        rules::request_access(OpKind::ReadRequest),
                    ) {
                        let psn = pkt.bth.psn;
                        let len = u64::from(reth.dma_len);
                        let npkts = len.div_ceil(u64::from(self.mtu)).max(1) as u32;
                        // The requester restarts this READ from `psn`: the
                        // responses still queued for it are superseded, and the
                        // new job takes over their resource.
                        let mut counted = false;
                        self.resp.out.retain(|o| match o {
                            RespOut::Read(j)
                                if {
                                    // [req_psn, end) overlaps [psn, psn + npkts)
                                    let end = j.psn.add(j.npkts);
                                    psn.in_window(j.req_psn, end.distance_from(j.req_psn))
                                        || j.req_psn.in_window(psn, npkts)
                                } =>
                            {
                                counted |= j.counted;
                                false
                            }
                            _ => true,
                        });
                        let msn = self.resp.msn;
                        self.resp.out.push_back(RespOut::Read(ReadJob {
                            psn,
                            req_psn: psn,
                            npkts,
                            counted,
                            rkey: Rkey::from_raw(reth.rkey),
                            va: reth.va,
                            remaining: len,
                            first: true,
                            msn,
                        }));
                    }
                }
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let psn = pkt.bth.psn;
                if let Some(r) = self.resp.atomics.iter().find(|r| r.psn == psn).copied() {
                    let msn = self.resp.msn;
                    self.resp.out.push_back(RespOut::AtomicAck {
                        psn,
                        orig: r.orig,
                        msn,
                    });
                }
            }
            _ => {
                let last = self.resp.epsn.sub(1);
                self.queue_ack(last);
            }
        }
    }

    /// The remote access check of a request on this QP
    /// ([`rules::check_remote_key`]: this QP's rights and PD, then the
    /// region or the window the rkey names): the region and the offset of
    /// `va` in it, or `None` for a zero-length access (which needs no
    /// region).
    fn remote_target<'r>(
        &self,
        res: &'r Resources,
        rkey: Rkey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<(&'r Mr, usize)>, RemoteDenied> {
        let mut found = None;
        let off = rules::check_remote_key(
            self.attr.qp_access_flags,
            self.pd,
            self.qpn,
            need,
            va,
            len,
            || {
                let (t, mr) = res.key_target(rkey)?;
                found = Some(mr);
                Some(t)
            },
        )?;
        Ok(found.map(|mr| (mr, off as usize)))
    }

    fn check_remote(
        &self,
        res: &Resources,
        rkey: Rkey,
        va: u64,
        len: u64,
        access: AccessFlags,
    ) -> bool {
        self.remote_target(res, rkey, va, len, access).is_ok()
    }

    fn write_remote(&self, res: &Resources, rkey: Rkey, va: u64, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        let need = rules::request_access(OpKind::Write);
        match self.remote_target(res, rkey, va, data.len() as u64, need) {
            Ok(Some((mr, off))) => {
                mr.mem.resolve(off, data.len(), true) && mr.mem.try_write(off, data)
            }
            _ => false,
        }
    }

    /// Executes the in-sequence request `pkt`. On success `epsn` has moved on.
    fn execute(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>) -> Result<(), Fail> {
        let info = pkt.bth.opcode.info();
        let psn = pkt.bth.psn;
        let mtu = self.mtu as usize;
        let pos = info.position;
        if self.qp_type == QpType::XrcTgt {
            self.xrc_target(res, pkt)?;
        }
        // Opcode sequence: a FIRST/ONLY may not interrupt a message, MIDDLE/LAST must continue one.
        let continues = matches!(
            (&self.resp.cur, info.kind),
            (Some(InMsg::Send { .. }), OpKind::Send) | (Some(InMsg::Write { .. }), OpKind::Write)
        );
        if pos.starts_message() == self.resp.cur.is_some() || (!pos.starts_message() && !continues)
        {
            if self.qp_type == QpType::Uc {
                return Err(Fail::Drop);
            }
            return Err(Fail::Nak(NakCode::InvalidRequest));
        }
        if info.has_payload
            && matches!(pos, Position::First | Position::Middle)
            && pkt.payload.len() != mtu
            || pkt.payload.len() > mtu
        {
            return Err(self.local_fail(res, NakCode::InvalidRequest, None));
        }
        match info.kind {
            OpKind::Send => {
                let (mut wqe, offset) = match self.resp.cur.take() {
                    Some(InMsg::Send { wqe, offset }) => (wqe, offset),
                    _ => match self.take_recv_wqe(res) {
                        Some(w) => (w, 0),
                        None => {
                            return Err(if self.qp_type.is_reliable() {
                                Fail::Rnr
                            } else {
                                Fail::Drop
                            })
                        }
                    },
                };
                if offset + pkt.payload.len() as u64 > wqe.capacity() {
                    let wc = self.recv_completion(&wqe, WcStatus::LocLenErr, WcOpcode::Recv);
                    res.complete(self.recv_cq, wc);
                    return Err(self.local_fail(res, NakCode::InvalidRequest, None));
                }
                if let Err(st) = res.scatter(&wqe.sges, self.pd, offset, pkt.payload) {
                    let wc = self.recv_completion(&wqe, st, WcOpcode::Recv);
                    res.complete(self.recv_cq, wc);
                    return Err(self.local_fail(res, NakCode::RemoteOperationalError, None));
                }
                let offset = offset + pkt.payload.len() as u64;
                if pos.ends_message() {
                    if let Some(k) = pkt.headers.ieth() {
                        // SEND with invalidate: the window goes before the
                        // receive completes (IBTA ch. 9); a refused one
                        // completes the receive in error and NAKs (rxe:
                        // responder class J).
                        let rkey = Rkey::from_raw(k);
                        if res.invalidate_mw(self.pd, self.qpn, rkey, true).is_err() {
                            let wc =
                                self.recv_completion(&wqe, WcStatus::RemInvReqErr, WcOpcode::Recv);
                            res.complete(self.recv_cq, wc);
                            return Err(self.local_fail(res, NakCode::InvalidRequest, None));
                        }
                    }
                    let mut wc = self.recv_completion(&wqe, WcStatus::Success, WcOpcode::Recv);
                    wc.byte_len = offset as u32;
                    wc.solicited = pkt.bth.solicited;
                    match (pkt.headers.imm(), pkt.headers.ieth()) {
                        (Some(i), _) => {
                            wc.imm_data = i;
                            wc.wc_flags = WcFlags::WITH_IMM;
                        }
                        (None, Some(k)) => {
                            wc.imm_data = k;
                            wc.wc_flags = WcFlags::WITH_INV;
                        }
                        _ => {}
                    }
                    res.complete(self.recv_cq, wc);
                    self.resp.msn = self.resp.msn.next();
                } else {
                    wqe.sges.shrink_to_fit();
                    self.resp.cur = Some(InMsg::Send { wqe, offset });
                }
            }
            OpKind::Write => {
                let n = pkt.payload.len() as u64;
                // Whether this packet's payload is already in the region.
                let mut written = false;
                let (rkey, va, remaining, total) = match self.resp.cur.take() {
                    Some(InMsg::Write {
                        rkey,
                        va,
                        remaining,
                        total,
                    }) => (rkey, va, remaining, total),
                    _ => {
                        let Some(reth) = pkt.headers.reth() else {
                            return Err(Fail::Nak(NakCode::InvalidRequest));
                        };
                        let len = u64::from(reth.dma_len);
                        let access = rules::request_access(OpKind::Write);
                        if len == 0 || pkt.headers.imm().is_some() {
                            if !self.check_remote(
                                res,
                                Rkey::from_raw(reth.rkey),
                                reth.va,
                                len,
                                access,
                            ) {
                                return Err(self.remote_fail(NakCode::RemoteAccessError));
                            }
                        } else {
                            // No receive WQE to wait for: one key lookup checks
                            // the whole message and writes this first packet,
                            // after the same checks in the same order.
                            let found = self.remote_target(
                                res,
                                Rkey::from_raw(reth.rkey),
                                reth.va,
                                len,
                                access,
                            );
                            let Ok(Some((mr, off))) = found else {
                                return Err(self.remote_fail(NakCode::RemoteAccessError));
                            };
                            if n > len || (pos.ends_message() && n != len) {
                                return Err(self.remote_fail(NakCode::InvalidRequest));
                            }
                            if n > 0
                                && !(mr.mem.resolve(off, pkt.payload.len(), true)
                                    && mr.mem.try_write(off, pkt.payload))
                            {
                                return Err(self.remote_fail(NakCode::RemoteAccessError));
                            }
                            written = true;
                        }
                        (Rkey::from_raw(reth.rkey), reth.va, len, len)
                    }
                };
                if n > remaining || (pos.ends_message() && n != remaining) {
                    return Err(self.remote_fail(NakCode::InvalidRequest));
                }
                // WRITE with immediate needs a receive WQE before anything is written.
                let imm_wqe = match pkt.headers.imm() {
                    Some(_) => match self.take_recv_wqe(res) {
                        Some(w) => Some(w),
                        None => {
                            if !pos.starts_message() {
                                self.resp.cur = Some(InMsg::Write {
                                    rkey,
                                    va,
                                    remaining,
                                    total,
                                });
                            }
                            return Err(if self.qp_type.is_reliable() {
                                Fail::Rnr
                            } else {
                                Fail::Drop
                            });
                        }
                    },
                    None => None,
                };
                if !written && !self.write_remote(res, rkey, va, pkt.payload) {
                    // The region went away mid-message.
                    return Err(self.remote_fail(NakCode::RemoteAccessError));
                }
                if pos.ends_message() {
                    if let (Some(w), Some(imm)) = (imm_wqe, pkt.headers.imm()) {
                        let mut wc =
                            self.recv_completion(&w, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
                        wc.byte_len = total as u32;
                        wc.imm_data = imm;
                        wc.wc_flags = WcFlags::WITH_IMM;
                        wc.solicited = pkt.bth.solicited;
                        res.complete(self.recv_cq, wc);
                    }
                    self.resp.msn = self.resp.msn.next();
                } else {
                    self.resp.cur = Some(InMsg::Write {
                        rkey,
                        va: va + n,
                        remaining: remaining - n,
                        total,
                    });
                }
            }
            OpKind::ReadRequest => {
                let Some(reth) = pkt.headers.reth() else {
                    return Err(Fail::Nak(NakCode::InvalidRequest));
                };
                let len = u64::from(reth.dma_len);
                let pending = self
                    .resp
                    .out
                    .iter()
                    .filter(|o| matches!(o, RespOut::Read(j) if j.counted))
                    .count();
                if pending >= usize::from(self.attr.max_dest_rd_atomic.max(1)) {
                    return Err(Fail::Nak(NakCode::InvalidRequest));
                }
                let access = rules::request_access(OpKind::ReadRequest);
                if !self.check_remote(res, Rkey::from_raw(reth.rkey), reth.va, len, access) {
                    return Err(Fail::Nak(NakCode::RemoteAccessError));
                }
                self.resp.msn = self.resp.msn.next();
                let msn = self.resp.msn;
                let npkts = len.div_ceil(mtu as u64).max(1) as u32;
                self.resp.out.push_back(RespOut::Read(ReadJob {
                    psn,
                    req_psn: psn,
                    npkts,
                    counted: true,
                    rkey: Rkey::from_raw(reth.rkey),
                    va: reth.va,
                    remaining: len,
                    first: true,
                    msn,
                }));
                self.resp.epsn = psn.add(npkts);
                return Ok(());
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let Some(a) = pkt.headers.atomic() else {
                    return Err(Fail::Nak(NakCode::InvalidRequest));
                };
                if !rules::atomic_va_aligned(a.va) {
                    return Err(Fail::Nak(NakCode::InvalidRequest));
                }
                let access = rules::request_access(info.kind);
                let Ok(Some((mr, off))) = self.remote_target(
                    res,
                    Rkey::from_raw(a.rkey),
                    a.va,
                    rules::ATOMIC_LEN,
                    access,
                ) else {
                    return Err(Fail::Nak(NakCode::RemoteAccessError));
                };
                if !mr.mem.resolve(off, rules::ATOMIC_LEN as usize, true) {
                    return Err(Fail::Nak(NakCode::RemoteAccessError));
                }
                let orig = if info.kind == OpKind::CompareSwap {
                    mr.mem.compare_swap(off, a.compare, a.swap_add)
                } else {
                    mr.mem.fetch_add(off, a.swap_add)
                };
                self.resp.msn = self.resp.msn.next();
                let depth = usize::from(self.attr.max_dest_rd_atomic.max(1));
                while self.resp.atomics.len() >= depth {
                    self.resp.atomics.pop_front();
                }
                self.resp.atomics.push_back(AtomicResource { psn, orig });
                let msn = self.resp.msn;
                self.resp
                    .out
                    .push_back(RespOut::AtomicAck { psn, orig, msn });
                self.resp.epsn = psn.next();
                return Ok(());
            }
            _ => return Err(Fail::Drop),
        }
        self.resp.epsn = psn.next();
        if pkt.bth.ack_req && self.qp_type.is_reliable() {
            self.queue_ack(psn);
        }
        Ok(())
    }

    /// A receive-side failure: UC drops, RC NAKs.
    fn local_fail(&mut self, _res: &mut Resources, code: NakCode, _w: Option<RecvWqe>) -> Fail {
        self.resp.cur = None;
        if self.qp_type == QpType::Uc {
            Fail::Drop
        } else {
            Fail::Nak(code)
        }
    }

    fn remote_fail(&mut self, code: NakCode) -> Fail {
        self.resp.cur = None;
        if self.qp_type == QpType::Uc {
            Fail::Drop
        } else {
            Fail::Nak(code)
        }
    }

    fn handle_uc(&mut self, res: &mut Resources, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        let starts = pkt.bth.opcode.info().position.starts_message();
        if psn != self.resp.epsn {
            // A lost packet: the message in progress is dropped silently.
            self.counters.out_of_sequence += 1;
            res.counters.out_of_sequence += 1;
            self.abort_uc_message(res);
        }
        self.resp.epsn = psn.next();
        if starts {
            if self.resp.cur.is_some() {
                self.abort_uc_message(res);
            }
            self.resp.uc_dropping = false;
        }
        if self.resp.uc_dropping {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        }
        if self.execute(res, pkt).is_err() {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            self.abort_uc_message(res);
            // execute() advanced nothing on failure; keep epsn past this packet.
            self.resp.epsn = psn.next();
        }
    }

    fn abort_uc_message(&mut self, res: &mut Resources) {
        if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
            self.give_back_recv_wqe(res, wqe);
        }
        self.resp.cur = None;
        self.resp.uc_dropping = true;
    }

    fn handle_ud(
        &mut self,
        res: &mut Resources,
        pkt: &PacketRepr<'_>,
        src: SocketAddr,
        local: IpAddr,
    ) {
        let Some(deth) = pkt.headers.deth() else {
            return;
        };
        // A UD message is one packet of at most the port MTU; anything longer
        // did not come from a conforming sender.
        if pkt.payload.len() > self.mtu as usize {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        }
        if deth.qkey != self.attr.qkey {
            self.counters.qkey_violations += 1;
            res.counters.qkey_violations += 1;
            return;
        }
        let Some(wqe) = self.take_recv_wqe(res) else {
            self.counters.dropped += 1;
            res.counters.dropped += 1;
            return;
        };
        let total = GRH_LEN + pkt.payload.len();
        if total as u64 > wqe.capacity() {
            let wc = self.recv_completion(&wqe, WcStatus::LocLenErr, WcOpcode::Recv);
            res.complete(self.recv_cq, wc);
            return;
        }
        let network_hdr = network_hdr(src.ip(), local);
        let grh = build_grh(src.ip(), local, network_hdr, pkt.payload.len());
        let r = res
            .scatter(&wqe.sges, self.pd, 0, &grh)
            .and_then(|_| res.scatter(&wqe.sges, self.pd, GRH_LEN as u64, pkt.payload));
        let mut wc = self.recv_completion(&wqe, WcStatus::Success, WcOpcode::Recv);
        if let Err(s) = r {
            wc.status = s;
            res.complete(self.recv_cq, wc);
            return;
        }
        wc.byte_len = total as u32;
        wc.src_qp = Qpn::from_raw(deth.src_qp);
        wc.wc_flags = WcFlags::GRH;
        wc.sgid = Gid::from_ip(src.ip());
        wc.network_hdr = network_hdr;
        wc.solicited = pkt.bth.solicited;
        if let Some(i) = pkt.headers.imm() {
            wc.imm_data = i;
            wc.wc_flags = WcFlags(WcFlags::GRH.0 | WcFlags::WITH_IMM.0);
        }
        res.complete(self.recv_cq, wc);
    }

    /// Whether all the responder has to send is one positive ACK between
    /// messages: the ACK that may be held for a request to ride with.
    pub(crate) fn lone_plain_ack(&self) -> bool {
        self.resp.cur.is_none()
            && self.resp.out.len() == 1
            && matches!(
                self.resp.out.front(),
                Some(RespOut::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                })
            )
    }

    /// Whether the queued ACK goes out with the next transmission.
    pub(crate) fn ack_is_due(&self) -> bool {
        self.resp.ack_hold == AckHold::Due
    }

    /// The queued ACK goes out with the next transmission, held or not.
    pub(crate) fn ack_follows(&mut self) {
        if !self.resp.out.is_empty() {
            self.resp.ack_hold = AckHold::Due;
            self.timers.stop(Timer::AckDelay);
        }
    }

    /// Produces the next ACK, NAK or response packet, if any is queued.
    pub(crate) fn next_response(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
    ) -> Option<Transmit> {
        if self.resp.out.is_empty() {
            self.ack_released();
            return None;
        }
        let dst = self.dest?;
        let remote_qpn = self.attr.dest_qp_num;
        let mtu = u64::from(self.mtu);
        let sacking = self.sr_acks_now();
        loop {
            let lone = self.resp.out.len() == 1;
            let out = self.resp.out.front_mut()?;
            match out {
                RespOut::Ack { psn, syndrome, msn } => {
                    // Held only between messages: in the middle of one the
                    // requester is streaming and waits for this ACK to move
                    // its window, and no answer can come before the message
                    // ends.
                    if lone
                        && ctx.ack_delay_ns > 0
                        && matches!(syndrome, Syndrome::Ack { .. })
                        && self.resp.cur.is_none()
                        && !sacking
                    {
                        match self.resp.ack_hold {
                            // A hold starts only for a QP that answers, when asked.
                            AckHold::None if self.resp.answered || !ctx.hold_needs_answer => {
                                self.resp.answered = false;
                                let until = Instant(ctx.now.0.saturating_add(ctx.ack_delay_ns));
                                self.resp.ack_hold = AckHold::Held;
                                self.timers.set(Timer::AckDelay, until);
                                return None;
                            }
                            AckHold::Held
                                if self
                                    .timers
                                    .get(Timer::AckDelay)
                                    .is_some_and(|t| ctx.now < t) =>
                            {
                                return None
                            }
                            _ => {}
                        }
                    }
                    // Disjoint fields: `out` still borrows the queue.
                    self.resp.ack_hold = AckHold::None;
                    self.timers.stop(Timer::AckDelay);
                    let mut syndrome = *syndrome;
                    if let Syndrome::Ack { .. } = syndrome {
                        let credits = match self.srq {
                            Some(_) => aeth::CREDITS_INVALID,
                            None => aeth::code_from_credits(self.rq.len() as u32),
                        };
                        syndrome = Syndrome::Ack { credits };
                    }
                    let bth = BthRepr::new(Opcode::RC_ACK, remote_qpn.raw(), *psn);
                    let headers = Headers::Aeth(AethRepr {
                        syndrome,
                        msn: *msn,
                    });
                    let psn = *psn;
                    self.resp.out.pop_front();
                    // Selective repeat: what is held past the ACK rides behind the AETH.
                    let mut ext = 0;
                    if let (Syndrome::Ack { .. }, Some(sack)) = (syndrome, self.sr_sack_for(psn)) {
                        let off = payload_offset(&headers);
                        ext = sack.emit(ctx.buf.get_mut(off..)?).ok()?;
                    }
                    return self.finish_packet(res, ctx, bth, headers, ext, dst);
                }
                RespOut::AtomicAck { psn, orig, msn } => {
                    let bth = BthRepr::new(Opcode::RC_ATOMIC_ACK, remote_qpn.raw(), *psn);
                    let a = AethRepr {
                        syndrome: Syndrome::Ack {
                            credits: aeth::CREDITS_INVALID,
                        },
                        msn: *msn,
                    };
                    let headers = Headers::AtomicAck(a, *orig);
                    self.resp.out.pop_front();
                    return self.finish_packet(res, ctx, bth, headers, 0, dst);
                }
                RespOut::Read(job) => {
                    let seg = job.remaining.min(mtu);
                    let last = seg == job.remaining;
                    let (opcode, with_aeth) = match (job.first, last) {
                        (true, true) => (Opcode::RC_READ_RESPONSE_ONLY, true),
                        (true, false) => (Opcode::RC_READ_RESPONSE_FIRST, true),
                        (false, false) => (Opcode::RC_READ_RESPONSE_MIDDLE, false),
                        (false, true) => (Opcode::RC_READ_RESPONSE_LAST, true),
                    };
                    let aeth = AethRepr {
                        syndrome: Syndrome::Ack {
                            credits: aeth::CREDITS_INVALID,
                        },
                        msn: job.msn,
                    };
                    let headers = if with_aeth {
                        Headers::Aeth(aeth)
                    } else {
                        Headers::None
                    };
                    let off = payload_offset(&headers);
                    let (psn, rkey, va) = (job.psn, job.rkey, job.va);
                    // Look the region (or window) up again for every packet: it
                    // may have been deregistered or invalidated since the
                    // request, and then must not be touched.
                    let region = if seg == 0 {
                        None
                    } else {
                        let access = rules::request_access(OpKind::ReadRequest);
                        match self.remote_target(res, rkey, va, seg, access) {
                            Ok(Some((mr, o))) if mr.mem.resolve(o, seg as usize, false) => {
                                Some((mr.mem.clone(), o))
                            }
                            // Not found, or a page that cannot be resolved.
                            _ => {
                                self.resp.out.pop_front();
                                self.counters.error_naks_sent += 1;
                                res.counters.error_naks_sent += 1;
                                self.queue_nak(psn, Syndrome::Nak(NakCode::RemoteAccessError));
                                self.enter_error(res, true);
                                continue;
                            }
                        }
                    };
                    let dstbuf = ctx.buf.get_mut(off..off + seg as usize)?;
                    if let Some((mem, o)) = region {
                        mem.read(o, dstbuf);
                    }
                    if last {
                        self.resp.out.pop_front();
                    } else if let Some(RespOut::Read(job)) = self.resp.out.front_mut() {
                        job.first = false;
                        job.psn = job.psn.next();
                        job.npkts = job.npkts.saturating_sub(1);
                        job.va += seg;
                        job.remaining -= seg;
                    }
                    let bth = BthRepr::new(opcode, remote_qpn.raw(), psn);
                    return self.finish_packet(res, ctx, bth, headers, seg as usize, dst);
                }
            }
        }
    }
}

/// The network header a packet from `src` to `dst` travelled with: IPv4
/// when both ends are IPv4 addresses, IPv6 otherwise.
fn network_hdr(src: IpAddr, dst: IpAddr) -> NetworkHdr {
    match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => NetworkHdr::Ipv4,
        _ => NetworkHdr::Ipv6,
    }
}

/// The 40 bytes placed in front of a UD receive: an IPv6 header for IPv6
/// packets, or 20 unused bytes then the IPv4 header for IPv4 packets
/// (RoCEv2).
fn build_grh(src: IpAddr, dst: IpAddr, hdr: NetworkHdr, payload_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = (8 + 12 + 8 + payload_len + 4) as u16;
    match (hdr, src, dst) {
        (NetworkHdr::Ipv4, IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(udp_len + 20).to_be_bytes());
            h[6] = 0x40;
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
        }
        _ => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&Gid::from_ip(src).0);
            g[24..40].copy_from_slice(&Gid::from_ip(dst).0);
        }
    }
    g
}
