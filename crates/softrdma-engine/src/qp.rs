//! A queue pair: its state, send and receive queues, and the glue between
//! the requester (`requester.rs`), completer (`completer.rs`) and
//! responder (`responder.rs`).
//!
//! Vocabulary follows rdma-core and rxe: a WQE is a posted work request as
//! the HCA holds it; the requester turns send WQEs into packets, the
//! completer retires them on ACKs and responses, and the responder
//! executes incoming requests.

use crate::handle::{AhHandle, CqHandle, PdHandle, Qpn, Rkey, SrqHandle};
use std::collections::VecDeque;
use std::net::SocketAddr;

use softrdma_wire::{Msn, Psn, Syndrome};

use crate::completer::Completer;
use crate::congestion::QpCongestion;
use crate::counters::Counters;
use crate::qp_attr::{QpAttr, QpCap, QpState, QpType};
use crate::resources::{Event, RecvWqe, Resources};
use crate::rules;
use crate::send_records::SendRecords;
use crate::time::Instant;
use crate::timers::{Timer, Timers};
use crate::wr::{SendFlags, SendOp, Sge, WcOpcode, WcStatus, WorkCompletion};

/// The port's P_Key table: one entry, the default P_Key 0xFFFF (full
/// member of the default partition) at index 0, as on Linux rxe.
pub(crate) const PKEY_TABLE: [u16; 1] = [softrdma_wire::bth::DEFAULT_PKEY];

/// The SGE list of a send WQE: one SGE (the common case) is kept inline,
/// so posting it allocates nothing.
#[derive(Debug, Clone)]
pub(crate) enum SgeList {
    One([Sge; 1]),
    Many(Vec<Sge>),
}

impl SgeList {
    pub fn new(sges: &[Sge]) -> Self {
        match sges {
            [one] => SgeList::One([*one]),
            _ => SgeList::Many(sges.to_vec()),
        }
    }
}

impl std::ops::Deref for SgeList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::One(s) => s,
            SgeList::Many(v) => v,
        }
    }
}

/// A send WQE.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: SgeList,
    pub inline: Option<Box<[u8]>>,
    pub len: u64,
    pub flags: SendFlags,
    pub signaled: bool,
    /// UD: (address handle, remote QPN, Q_Key as posted).
    pub ud: Option<(AhHandle, Qpn, u32)>,
    /// Its place in the order of posting (one more than the WQE before
    /// it): how a send record names it while indices shift.
    pub serial: u64,
    /// PSNs are assigned on first transmission and never change after.
    pub assigned: bool,
    pub first_psn: Psn,
    pub npkts: u32,
    /// READ: response packets received in order so far.
    pub read_done: u32,
    /// XRC initiator: the remote XRC SRQ the WR is for (its XRCETH).
    pub xrc_srqn: u32,
}

/// The `Copy` part of a send WQE that packet building reads, so that the
/// WQE (and its SGE list) need not be cloned for every packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WqeView {
    pub op: SendOp,
    pub len: u64,
    pub npkts: u32,
    pub flags: SendFlags,
}

impl SendWqe {
    pub fn view(&self) -> WqeView {
        WqeView {
            op: self.op,
            len: self.len,
            npkts: self.npkts,
            flags: self.flags,
        }
    }

    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
}

/// What the responder still has to send.
#[derive(Debug, Clone)]
pub(crate) enum RespOut {
    /// ACK or NAK for `psn`. Credits of an ACK are filled in when it is sent.
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: Msn,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: Msn,
    },
    Read(ReadJob),
}

/// A READ being answered, one response packet at a time.
#[derive(Debug, Clone)]
pub(crate) struct ReadJob {
    pub psn: Psn,
    /// PSN of the READ request this job answers (the first response's PSN
    /// when the request was not a re-request from the middle).
    pub req_psn: Psn,
    /// PSNs of response packets still to send.
    pub npkts: u32,
    /// Answers a READ the requester has not finished yet, and so holds one of
    /// the `max_dest_rd_atomic` responder resources. A replay for a duplicate
    /// request whose original job is gone does not: the requester may
    /// already have everything.
    pub counted: bool,
    pub rkey: Rkey,
    pub va: u64,
    pub remaining: u64,
    pub first: bool,
    pub msn: Msn,
}

/// A saved atomic result, replayed for duplicate requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtomicResource {
    pub psn: Psn,
    pub orig: u64,
}

/// The message the responder is in the middle of.
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        rkey: Rkey,
        va: u64,
        remaining: u64,
        total: u64,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Requester {
    pub sq: VecDeque<SendWqe>,
    /// Index in `sq` of the next WQE to transmit from.
    pub next: usize,
    /// Bytes of `sq[next]` already transmitted (READ: already requested).
    pub next_offset: u64,
    /// PSN of the next packet to transmit.
    pub psn: Psn,
    /// One past the highest PSN ever transmitted (to count retransmissions).
    pub high: Psn,
    pub since_ack_req: u32,
    /// SQD: the drained event was raised.
    pub drained_notified: bool,
    /// End-to-end credits: messages sent that consume a receive WQE
    /// (the completer counts those acknowledged).
    pub rq_msgs_sent: u64,
    /// RC: a record of every request packet not yet acknowledged.
    pub records: SendRecords,
    /// The serial the next posted WQE gets.
    pub next_serial: u64,
    /// Transmissions of RC request packets so far (`SendRecord::tx_seq`).
    pub tx_seq: u64,
    /// Selective repeat: the newest transmission known delivered.
    pub delivered_seq: u64,
    /// Selective repeat: PSNs to send again, and whether even if held.
    pub sr_queue: VecDeque<(Psn, bool)>,
    /// Selective repeat: `delivered_seq` at the last search for losses.
    pub lost_scan_at: u64,
}

impl Requester {
    /// The serial of `sq[0]` (of the next WQE posted when `sq` is empty).
    pub fn base_serial(&self) -> u64 {
        self.next_serial - self.sq.len() as u64
    }
}

#[derive(Debug, Default)]
pub(crate) struct Responder {
    pub epsn: Psn,
    pub msn: Msn,
    pub nak_sent: bool,
    pub cur: Option<InMsg>,
    pub out: VecDeque<RespOut>,
    pub atomics: VecDeque<AtomicResource>,
    /// UC: drop packets until the next FIRST/ONLY.
    pub uc_dropping: bool,
    /// Whether a lone positive ACK is being held back: see
    /// `EngineConfig::ack_delay_ns`.
    pub ack_hold: AckHold,
    /// The QP sent a request since its last held ACK (see
    /// `EngineConfig::ack_delay_answering_only`).
    pub answered: bool,
    /// Selective repeat: requests kept until the PSNs before them arrive.
    pub held: crate::sr::Held,
}

/// A `Held` ACK waits until its [`Timer::AckDelay`] expires (or until its
/// QP sends a request, which it then follows out); once `Due` it goes with
/// the next transmission. Only `Held` arms the timer, so a QP that cannot
/// transmit keeps no timer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckHold {
    #[default]
    None,
    Held,
    Due,
}

pub(crate) struct Qp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    /// The SRQ receives come from. An XRC target has none of its own: it
    /// is the XRC SRQ the request being executed names (with `pd` and
    /// `recv_cq` that SRQ's), set for each request ([`Qp::xrc_target`]).
    pub srq: Option<SrqHandle>,
    /// The XRC domain of an XRC target QP.
    pub xrcd: Option<crate::handle::XrcdHandle>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub state: QpState,
    pub attr: QpAttr,
    pub dest: Option<SocketAddr>,
    pub src_port: u16,
    /// Path MTU in bytes (the device MTU for UD).
    pub mtu: u32,
    pub rq: VecDeque<RecvWqe>,
    pub req: Requester,
    pub comp: Completer,
    pub resp: Responder,
    pub counters: Counters,
    pub scheduled: bool,
    /// Every deadline of the QP, by name.
    pub timers: Timers,
    /// The congestion controller.
    pub cc: QpCongestion,
    /// The controller asked for a CNP to the peer; it goes out first.
    pub cnp_due: bool,
    /// Deadline last registered with the engine's timer heap.
    pub timer_registered: Option<Instant>,
    /// The ECE options set for the QP (`Engine::set_ece`): selective repeat.
    pub ece: crate::sr::Ece,
}

impl Qp {
    /// The earliest time this QP needs `handle_timeout`.
    pub fn deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// A held ACK goes with the next transmission.
    pub fn ack_due(&mut self) {
        if self.resp.ack_hold != AckHold::None {
            self.resp.ack_hold = AckHold::Due;
            self.timers.stop(Timer::AckDelay);
        }
    }

    /// No ACK is held (it went out, or there is none).
    pub fn ack_released(&mut self) {
        self.resp.ack_hold = AckHold::None;
        self.timers.stop(Timer::AckDelay);
    }

    /// The P_Key this QP puts in every packet it sends and checks every
    /// packet it receives against: the table entry of its P_Key index (the
    /// table has one entry; `modify_qp` keeps the index below the device's
    /// `max_pkeys`, and an index past the table, possible only with a raised
    /// `max_pkeys`, names that same entry).
    pub fn pkey(&self) -> u16 {
        PKEY_TABLE
            .get(usize::from(self.attr.pkey_index))
            .copied()
            .unwrap_or(PKEY_TABLE[0])
    }

    /// Whether incoming requests are executed ([`rules::responder_receives`]).
    pub fn can_receive(&self) -> bool {
        rules::responder_receives(self.state)
    }

    pub fn wc_for_send(&self, w: &SendWqe, status: WcStatus) -> WorkCompletion {
        let mut wc = WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), self.qpn);
        if status.is_ok() {
            wc.byte_len = rules::send_byte_len(w.op.is_atomic(), w.len);
        }
        wc
    }

    /// Retires the head send WQE with `status`, posting a completion when it is
    /// signaled or failed.
    pub fn complete_head(&mut self, res: &mut Resources, status: WcStatus) {
        let Some(w) = self.req.sq.pop_front() else {
            return;
        };
        if self.req.next > 0 {
            self.req.next -= 1;
        } else {
            self.req.next_offset = 0;
        }
        if rules::send_completes(w.signaled, status) {
            let wc = self.wc_for_send(&w, status);
            res.complete(self.send_cq, wc);
        }
    }

    /// Moves the QP to ERR, flushing every outstanding WQE with WR_FLUSH_ERR.
    /// `fatal` raises the asynchronous QP event (transport and local errors do;
    /// an application's own modify to ERR does not).
    pub fn enter_error(&mut self, res: &mut Resources, fatal: bool) {
        self.flush_into_error(res);
        // Keep only NAKs already queued: they tell the peer why.
        self.resp.out.retain(|o| {
            matches!(
                o,
                RespOut::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.raise_error_events(res, fatal);
    }

    /// Moves the QP to ERR after its responder queued a NAK for a request
    /// it could not execute. The responses already queued for the requests
    /// before it (READ data, atomic results, ACKs) still go out, ahead of
    /// the NAK: the NAK acknowledges those requests, so the peer must get
    /// what they returned. Work is flushed as for any error.
    pub fn enter_error_after_nak(&mut self, res: &mut Resources) {
        self.flush_into_error(res);
        self.raise_error_events(res, true);
    }

    /// ERR state, every outstanding send and receive WQE flushed, timers stopped.
    fn flush_into_error(&mut self, res: &mut Resources) {
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.flush_sq(res);
        // The receive WQE a partly received SEND holds was taken off the
        // queue first: it is the oldest, so it is flushed first.
        if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
            let wc = WorkCompletion::new(wqe.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            res.complete(self.recv_cq, wc);
        }
        while let Some(r) = self.rq.pop_front() {
            let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            res.complete(self.recv_cq, wc);
        }
        self.resp.held.clear();
        self.req.sr_queue.clear();
        self.timers.stop(Timer::Retransmit);
        self.timers.stop(Timer::TailProbe);
        self.timers.stop(Timer::RnrWait);
        self.timers.stop(Timer::Pacing);
    }

    /// `QpFatal` when the error came from the transport or a local failure
    /// (not the application's own modify), and `LastWqeReached` on an SRQ.
    fn raise_error_events(&mut self, res: &mut Resources, fatal: bool) {
        if fatal {
            res.events.push_back(Event::QpFatal { qpn: self.qpn });
        }
        if self.srq.is_some() {
            res.events
                .push_back(Event::LastWqeReached { qpn: self.qpn });
        }
    }

    /// Completes every send WQE with WR_FLUSH_ERR.
    pub fn flush_sq(&mut self, res: &mut Resources) {
        while !self.req.sq.is_empty() {
            self.complete_head(res, WcStatus::WrFlushErr);
        }
        self.req.next = 0;
        self.req.next_offset = 0;
        self.req.records.clear();
    }

    /// READ and atomic WQEs transmitted and not yet completed: those before
    /// the send pointer (after a rewind, the ones behind it are re-sent
    /// before anything new starts).
    pub fn rd_atomic_outstanding(&self) -> u32 {
        self.req
            .sq
            .iter()
            .take(self.req.next)
            .filter(|w| w.op.is_read_or_atomic())
            .count() as u32
    }

    /// A local or remote error on the head send WQE: it completes with
    /// `status`, and the QP goes to ERR (RC) or SQE (UC, UD).
    pub fn fail_head(&mut self, res: &mut Resources, status: WcStatus) {
        self.complete_head(res, status);
        match self.qp_type {
            QpType::Rc | QpType::XrcIni | QpType::XrcTgt => self.enter_error(res, true),
            QpType::Uc | QpType::Ud => {
                self.state = QpState::Sqe;
                self.attr.qp_state = QpState::Sqe;
                self.flush_sq(res);
            }
        }
    }

    /// Back to the RESET state: every queue emptied without completions.
    pub fn reset(&mut self) {
        self.state = QpState::Reset;
        self.req = Requester::default();
        self.comp = Completer::default();
        self.resp = Responder::default();
        self.timers = Timers::default();
        self.cnp_due = false;
        self.rq.clear();
        self.dest = None;
    }
}
