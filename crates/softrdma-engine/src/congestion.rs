//! Congestion control of a QP, behind one trait.
//!
//! The requester asks its QP's controller before each request packet
//! whether it may go ([`CongestionControl::can_send`]), tells it what went
//! out, and the completer feeds it what came back: PSNs acknowledged,
//! NAKs, retry timeouts. The engine hands it the ECN codepoint of every
//! packet its QP accepts and the CNPs that name the QP, and asks it which
//! ECN codepoint the QP's packets carry. A controller can so be a window
//! (as today), a rate limiter that paces packets with a "not before" time
//! (DCQCN's reaction point, fed with CNPs), and a notification point that
//! answers CE-marked packets with CNPs ([`EcnAction::SendCnp`]).
//!
//! The default, [`FixedWindow`], is what the engine always did: at most
//! `EngineConfig::max_inflight` PSNs unacknowledged, no rate control, no
//! ECN. It is held by value (no allocation, no virtual call on the hot
//! path); a custom controller comes from [`CongestionConfig::custom`].

use crate::handle::Qpn;
use std::fmt;
use std::sync::Arc;

use softrdma_wire::{BthRepr, Ecn, Headers, Opcode, Psn, Syndrome};

use crate::qp::Qp;
use crate::qp_attr::QpType;
use crate::requester::{Transmit, TxCtx};
use crate::resources::Resources;
use crate::time::Instant;

/// Whether the next request packet may be transmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendVerdict {
    /// Now.
    Now,
    /// Not before this instant (pacing): the engine sets a timer and asks
    /// again then.
    NotBefore(Instant),
    /// Not until something changes (the window is full): an ACK, a NAK, a
    /// timeout or a CNP makes the engine ask again.
    Blocked,
}

/// What the controller wants done about a received packet's ECN mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EcnAction {
    /// Nothing.
    None,
    /// Send a CNP to the QP's peer (RC and UC; the notification point of
    /// DCQCN). Several requests before the next transmission make one CNP.
    SendCnp,
}

/// A request packet that was transmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentPacket {
    /// Its PSN.
    pub psn: Psn,
    /// PSNs it occupies: 1, or the responses a READ request asks for.
    pub span: u32,
    /// Bytes of the whole UDP payload (headers, payload, ICRC).
    pub bytes: usize,
    /// The PSN had been sent before.
    pub retransmit: bool,
}

/// What a controller is created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionQp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    /// `EngineConfig::max_inflight`.
    pub max_inflight: u32,
}

/// What a controller reports about itself (`Engine::qp_congestion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CcCounters {
    /// Rate cuts (a reaction point's answers to CNPs).
    pub rate_cuts: u64,
    /// The current rate (b/s); 0 for a controller without one.
    pub rate_bps: u64,
    /// CNPs the notification point asked for.
    pub cnps_asked: u64,
}

/// A QP's congestion controller. Every method has the time; none may
/// panic. PSNs are those of the QP's requester.
pub trait CongestionControl: Send + fmt::Debug {
    /// The most PSNs it lets be unacknowledged (`u32::MAX`: no window).
    /// A SEND or WRITE packet that fills the window asks for an ACK.
    fn window(&self) -> u32;

    /// Whether the next request packet (`bytes` of payload) may go at
    /// `now`, with `inflight` PSNs unacknowledged (from the oldest
    /// unacknowledged PSN up to the next one to send; always 0 on UC and
    /// UD, which have no acknowledgements).
    fn can_send(&self, now: Instant, inflight: u32, bytes: usize) -> SendVerdict {
        let _ = (now, bytes);
        if inflight >= self.window() {
            SendVerdict::Blocked
        } else {
            SendVerdict::Now
        }
    }

    /// A request packet went out.
    fn on_sent(&mut self, now: Instant, sent: &SentPacket) {
        let _ = (now, sent);
    }

    /// `count` PSNs from `first` on were newly acknowledged (by an ACK, a
    /// NAK's implied ACK, READ responses or an atomic ACK).
    fn on_ack(&mut self, now: Instant, first: Psn, count: u32) {
        let _ = (now, first, count);
    }

    /// A NAK (RNR, PSN sequence error, or an error NAK) for `psn` arrived.
    fn on_nak(&mut self, now: Instant, psn: Psn, syndrome: Syndrome) {
        let _ = (now, psn, syndrome);
    }

    /// The local ACK timeout expired with packets unacknowledged.
    fn on_timeout(&mut self, now: Instant) {
        let _ = now;
    }

    /// A packet for this QP arrived with this ECN codepoint (every packet
    /// the QP accepts, requests and responses, `NotEct` included).
    fn on_ecn(&mut self, now: Instant, ecn: Ecn) -> EcnAction {
        let _ = (now, ecn);
        EcnAction::None
    }

    /// A CNP naming this QP arrived from its peer.
    fn on_cnp(&mut self, now: Instant) {
        let _ = now;
    }

    /// The ECN codepoint of the packets this QP sends.
    fn ecn_to_send(&self) -> Ecn {
        Ecn::NotEct
    }

    /// When [`Self::on_timer`] must next run (rate increase, alpha update).
    fn timeout(&self) -> Option<Instant> {
        None
    }

    /// Its timer expired.
    fn on_timer(&mut self, now: Instant) {
        let _ = now;
    }

    /// What it reports about itself.
    fn counters(&self) -> CcCounters {
        CcCounters::default()
    }
}

/// Today's behaviour: a fixed window of PSNs, no rate control, no ECN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    pub window: u32,
}

impl CongestionControl for FixedWindow {
    fn window(&self) -> u32 {
        self.window
    }
}

type Factory = dyn Fn(&CongestionQp) -> Box<dyn CongestionControl> + Send + Sync;

/// Which controller each QP gets (`EngineConfig::congestion`).
#[derive(Clone, Default)]
pub struct CongestionConfig(Option<Arc<Factory>>);

impl CongestionConfig {
    /// [`FixedWindow`] of `max_inflight` PSNs (the default).
    pub fn fixed_window() -> Self {
        CongestionConfig(None)
    }

    /// A controller from `make` for every QP (called at creation and again
    /// when the QP goes back to RESET).
    pub fn custom(
        make: impl Fn(&CongestionQp) -> Box<dyn CongestionControl> + Send + Sync + 'static,
    ) -> Self {
        CongestionConfig(Some(Arc::new(make)))
    }

    /// DCQCN ([`crate::Dcqcn`]) on every QP, with these parameters; its
    /// window is the engine's `max_inflight`.
    pub fn dcqcn(params: crate::DcqcnParams) -> Self {
        Self::custom(move |qp| {
            let mut p = params;
            p.window = qp.max_inflight;
            Box::new(crate::Dcqcn::new(p))
        })
    }

    /// TIMELY ([`crate::Timely`], delay-based) on every QP, with these
    /// parameters; its window is the engine's `max_inflight`.
    pub fn timely(params: crate::TimelyParams) -> Self {
        Self::custom(move |qp| {
            let mut p = params;
            p.window = qp.max_inflight;
            Box::new(crate::Timely::new(p))
        })
    }

    pub(crate) fn build(&self, qp: &CongestionQp) -> QpCongestion {
        match &self.0 {
            None => QpCongestion::Fixed(FixedWindow {
                window: qp.max_inflight,
            }),
            Some(make) => QpCongestion::Custom(make(qp)),
        }
    }
}

impl fmt::Debug for CongestionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            None => "CongestionConfig::FixedWindow",
            Some(_) => "CongestionConfig::Custom",
        })
    }
}

/// A QP's controller: the default by value, a custom one boxed.
#[derive(Debug)]
pub(crate) enum QpCongestion {
    Fixed(FixedWindow),
    Custom(Box<dyn CongestionControl>),
}

/// Forwards a call to the controller, statically for the default.
macro_rules! forward {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            QpCongestion::Fixed($c) => $call,
            QpCongestion::Custom($c) => $call,
        }
    };
}

/// The most PSNs that may ever be unacknowledged, whatever a controller
/// says: half the 24-bit PSN space, beyond which PSN order is ambiguous.
pub(crate) const MAX_WINDOW: u32 = 1 << 23;

impl QpCongestion {
    pub fn window(&self) -> u32 {
        forward!(self, c => c.window()).min(MAX_WINDOW)
    }

    pub fn can_send(&self, now: Instant, inflight: u32, bytes: usize) -> SendVerdict {
        if inflight >= MAX_WINDOW {
            return SendVerdict::Blocked;
        }
        forward!(self, c => c.can_send(now, inflight, bytes))
    }

    pub fn on_sent(&mut self, now: Instant, sent: &SentPacket) {
        forward!(self, c => c.on_sent(now, sent))
    }

    pub fn on_ack(&mut self, now: Instant, first: Psn, count: u32) {
        forward!(self, c => c.on_ack(now, first, count))
    }

    pub fn on_nak(&mut self, now: Instant, psn: Psn, syndrome: Syndrome) {
        forward!(self, c => c.on_nak(now, psn, syndrome))
    }

    pub fn on_timeout(&mut self, now: Instant) {
        forward!(self, c => c.on_timeout(now))
    }

    pub fn on_ecn(&mut self, now: Instant, ecn: Ecn) -> EcnAction {
        forward!(self, c => c.on_ecn(now, ecn))
    }

    pub fn on_cnp(&mut self, now: Instant) {
        forward!(self, c => c.on_cnp(now))
    }

    pub fn ecn_to_send(&self) -> Ecn {
        forward!(self, c => c.ecn_to_send())
    }

    pub fn timeout(&self) -> Option<Instant> {
        forward!(self, c => c.timeout())
    }

    pub fn on_timer(&mut self, now: Instant) {
        forward!(self, c => c.on_timer(now))
    }

    pub fn counters(&self) -> CcCounters {
        forward!(self, c => c.counters())
    }
}

impl Qp {
    /// The CNP the controller asked for, if any: to the peer QP, PSN 0,
    /// BECN set, 16 reserved bytes (the layout ConnectX NICs send).
    pub(crate) fn next_cnp(
        &mut self,
        res: &mut Resources,
        ctx: &mut TxCtx<'_>,
    ) -> Option<Transmit> {
        if !self.cnp_due {
            return None;
        }
        self.cnp_due = false;
        let dst = self.dest?;
        let mut bth = BthRepr::new(Opcode::CNP, self.attr.dest_qp_num.raw(), Psn::new(0));
        bth.becn = true;
        self.counters.cnp_sent += 1;
        res.counters.cnp_sent += 1;
        self.finish_packet(res, ctx, bth, Headers::Cnp, 0, dst)
    }
}
