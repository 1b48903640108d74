//! Connecting QPs with the InfiniBand Communication Manager, in the
//! rdma_cm model: listen on a port of a port space, connect a QP to an
//! address and port, take events (a connection request, established,
//! rejected, unreachable, disconnected, timewait exit) from an fd.
//!
//! The CM speaks IB CM MADs on QP1 over the same RoCEv2 wire as the data
//! (docs/cm.md), so it interoperates with the Linux kernel's rdma_cm. The
//! QP of a connection is moved for the consumer, as rdma_cm does: INIT at
//! `connect`, RTR and RTS when the REP comes (active side); INIT, RTR and
//! RTS at `accept` (passive side), each with the numbers the exchange
//! settled (the peer's QPN and PSN, the path MTU, READ/atomic depths,
//! retry counts, the ACK timeout).
//!
//! ```no_run
//! # use softrdma::rdma_cm::{ConnParam, PortSpace, CmEvent};
//! # use std::time::Duration;
//! # fn demo(ctx: &softrdma::Context, qp: &softrdma::Qp) -> softrdma::Result<()> {
//! let cm = ctx.cm();
//! let conn = cm.connect(qp, "10.0.0.2:7471".parse().unwrap(), &ConnParam::default())?;
//! match cm.get_event(Duration::from_secs(5))? {
//!     Some(CmEvent::Established { conn: c }) if c == conn => { /* post WRs */ }
//!     other => eprintln!("not connected: {other:?}"),
//! }
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use softrdma_cm::rdma_cm::connect_params;
pub use softrdma_cm::rdma_cm::PortSpace;
pub use softrdma_cm::{ConnId, Event as CmEvent, RejReason, SidrStatus};
/// The QP attributes a connection's exchange gives ([`Cm::init_qp_attr`]).
pub use softrdma_cm::{QpAttr as CmQpAttr, QpState as CmQpState};
/// The REQ and REP as received, in [`CmEvent::ConnectRequest`] and
/// [`CmEvent::ConnectResponse`], with the types of their fields.
pub use softrdma_wire::cm::{CmPath, RepRepr, ReqRepr, TransportType};
/// The CMA header at the start of a REQ's private data
/// ([`parse_req_private_data`]).
pub use softrdma_wire::cma::CmaHeader;
/// Why bytes do not parse as (or a value does not fit) a wire format:
/// the error of [`ReqRepr::parse`], [`CmaHeader::parse`] and their kin.
pub use softrdma_wire::Error as WireError;

/// Splits a [`CmEvent::ConnectRequest`]'s private data into the CMA
/// header (the active side's address and port) and the consumer's bytes.
/// Private data without a valid CMA header is `Error::Cm` with `EINVAL`.
pub fn parse_req_private_data(private_data: &[u8]) -> Result<(CmaHeader, &[u8])> {
    softrdma_cm::rdma_cm::parse_req_private_data(private_data).map_err(cm_error)
}

use crate::verbs::{Context, Qp};
use crate::QpType;
use crate::{Ece, Error, Result};

/// What `rdma_conn_param` carries: private data and the QP's READ/atomic
/// depths and retry counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// The consumer's private data (REQ: at most 56 bytes, REP 196).
    pub private_data: Vec<u8>,
    /// READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests the local QP keeps outstanding.
    pub initiator_depth: u8,
    /// Transport retries (0-7).
    pub retry_count: u8,
    /// RNR retries (0-7; 7 = forever).
    pub rnr_retry_count: u8,
    /// How long each side's CM may take to answer, as the REQ's 5-bit
    /// exponent (4.096 µs × 2^n; rdma_cm's 20, about 4 s). With the path's
    /// round trip it is the wait before a REQ or DREQ is sent again.
    pub cm_response_timeout: u8,
    /// Times a REQ (and later a DREQ) is sent again before the connection
    /// is given up as unreachable (0-15; rdma_cm's 15). The two bound how
    /// long a connect to a peer that never answers takes.
    pub max_cm_retries: u8,
    /// ECE (`rdma_set_local_ece`): the transport options this side offers
    /// ([`connect`](Cm::connect): the REQ carries them) or can do
    /// ([`accept`](Cm::accept): the REP answers with the options both can
    /// do, [`Ece::agree`]). With a QP of softrdma's moving, the agreed
    /// options are set on it before RTR (`Ece::SUPPORTED` on both sides
    /// gives selective repeat, docs/transport.md). The default, no vendor,
    /// offers nothing, leaves the QP alone, and sends the REQ and REP of
    /// before ECE.
    pub ece: Ece,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            ece: Ece::default(),
        }
    }
}

impl ConnParam {
    /// The field a CM message cannot carry, if any.
    fn check(&self) -> Result<()> {
        let bad = |what: &str, v: u8, max: u8| Error::Cm {
            errno: softrdma_engine::errno::EINVAL,
            message: format!("ConnParam.{what} is {v}; at most {max}"),
        };
        let fields = [
            ("retry_count", self.retry_count, 7),
            ("rnr_retry_count", self.rnr_retry_count, 7),
            ("cm_response_timeout", self.cm_response_timeout, 31),
            ("max_cm_retries", self.max_cm_retries, 15),
        ];
        match fields.into_iter().find(|&(_, v, max)| v > max) {
            Some((what, v, max)) => Err(bad(what, v, max)),
            None => Ok(()),
        }
    }
}

/// The connection manager of one device ([`Context::cm`]).
#[derive(Clone)]
pub struct Cm {
    ctx: Context,
}

impl Context {
    /// This device's connection manager.
    pub fn cm(&self) -> Cm {
        Cm { ctx: self.clone() }
    }
}

fn no_cm() -> Error {
    Error::Config("this device runs no connection manager".into())
}

impl Cm {
    /// Listens on `port` of `space` (rdma_bind_addr + rdma_listen).
    pub fn listen(&self, space: PortSpace, port: u16) -> Result<()> {
        let sid = space.service_id(port);
        self.command(|cm, _, _| cm.agent().listen(sid).map_err(cm_error))
    }

    /// `port` of `space` is bound and about to be listened on
    /// (rdma_bind_addr): a REQ that comes first waits for the listen
    /// instead of being rejected, until [`Cm::release`].
    pub fn reserve(&self, space: PortSpace, port: u16) {
        let sid = space.service_id(port);
        let _ = self.command(|cm, _, _| {
            cm.agent().reserve(sid);
            Ok(())
        });
    }

    /// Ends [`Cm::reserve`]: REQs still waiting for `port` are rejected
    /// unless it is listened on.
    pub fn release(&self, space: PortSpace, port: u16) {
        let sid = space.service_id(port);
        let _ = self.command(|cm, _, _| {
            cm.agent().release(sid);
            Ok(())
        });
    }

    /// Stops listening on `port` of `space` (rdma_destroy_id of a
    /// listener); requests already raised are unaffected.
    pub fn unlisten(&self, space: PortSpace, port: u16) -> Result<()> {
        let sid = space.service_id(port);
        self.command(|cm, _, _| cm.agent().unlisten(sid).map_err(cm_error))
    }

    /// Connects `qp` (RC, in RESET) to the listener at `dst` (its IP
    /// address and rdma_cm port) in the TCP port space: the QP goes to INIT
    /// now and to RTS when the peer accepts; [`CmEvent::Established`] or a
    /// failure follows.
    pub fn connect(&self, qp: &Qp, dst: SocketAddr, p: &ConnParam) -> Result<ConnId> {
        self.connect_in(PortSpace::Tcp, qp, dst, p)
    }

    /// [`Cm::connect`] to a listener of port space `space`: `Tcp` takes RC
    /// QPs; `Ib` (RDMA_PS_IB) also takes an XRC initiator
    /// ([`crate::QpType::XrcIni`]), whose REQ asks for XRC and whose peer
    /// accepts on an XRC target ([`Pd::create_tgt_qp`](crate::Pd)); the
    /// target's QPN comes back in the REP. `Udp` has no connections
    /// (use [`Cm::resolve_ud`]).
    pub fn connect_in(
        &self,
        space: PortSpace,
        qp: &Qp,
        dst: SocketAddr,
        p: &ConnParam,
    ) -> Result<ConnId> {
        let transport = match (space, qp.qp_type()) {
            (PortSpace::Udp, _) => {
                return Err(einval(
                    "the UDP port space has no connections: use resolve_ud",
                ))
            }
            (PortSpace::Tcp | PortSpace::Ib, QpType::Rc) => TransportType::Rc,
            (PortSpace::Ib, QpType::XrcIni) => TransportType::Extended,
            (_, t) => {
                return Err(einval(&format!(
                "a {t} QP cannot connect in the {space:?} port space (TCP: RC; IB: RC or XRC_INI)"
            )))
            }
        };
        let ep = qp.endpoint();
        let (peer, mut params) = self.rc_request(space, ep.qpn.raw(), ep.psn, dst, p)?;
        params.transport = transport;
        let qpn = ep.qpn;
        self.command(|cm, e, now| {
            cm.connect(e, now, peer, qpn, &params)
                .map_err(command_error)
        })
    }

    /// Connects without a QP of softrdma's moving, as rdma_cm's ids
    /// without a QP do (UCX's rdmacm transport), to a listener of port
    /// space `space` (`Tcp` or `Ib`; an RC request): the REQ names QP `qpn`
    /// and starting PSN `psn`, [`CmEvent::ConnectResponse`] brings the
    /// REP, and the caller moves its QPs itself, then confirms with
    /// [`Cm::establish`] (the RTU; the passive side then sees
    /// [`CmEvent::Established`]).
    pub fn connect_qpless(
        &self,
        space: PortSpace,
        qpn: u32,
        psn: u32,
        dst: SocketAddr,
        p: &ConnParam,
    ) -> Result<ConnId> {
        if space == PortSpace::Udp {
            return Err(einval(
                "the UDP port space has no connections: use resolve_ud",
            ));
        }
        let (peer, params) = self.rc_request(space, qpn, psn, dst, p)?;
        self.command(|cm, _, now| cm.connect_qpless(now, peer, &params).map_err(command_error))
    }

    /// Sends the RTU of a connection made with [`Cm::connect_qpless`] once
    /// its [`CmEvent::ConnectResponse`] came (`rdma_establish`); an error
    /// for any other connection, or before that.
    pub fn establish(&self, conn: ConnId) -> Result<()> {
        self.command(|cm, _, _| cm.establish(conn).map_err(command_error))
    }

    /// The passive side's QP received the peer's first packet before the
    /// RTU (the verbs COMM_EST event, `rdma_notify`): the connection is
    /// established now ([`CmEvent::Established`] follows) instead of when
    /// the RTU arrives. An error (EINVAL) before this side accepted.
    pub fn notify_established(&self, conn: ConnId) -> Result<()> {
        self.command(|cm, _, _| cm.agent().notify_established(conn).map_err(cm_error))
    }

    /// The REQ's parameters for an RC connection from QP `qpn` (starting
    /// PSN `psn`) to the listener at `dst`, and the peer's CM address.
    fn rc_request(
        &self,
        space: PortSpace,
        qpn: u32,
        psn: u32,
        dst: SocketAddr,
        p: &ConnParam,
    ) -> Result<(SocketAddr, softrdma_cm::ConnectParams)> {
        p.check()?;
        let dev = &self.ctx.dev;
        // The CMA header's source port names the active side's id.
        let src = SocketAddr::new(dev.addr.ip(), 0x8000 | (qpn & 0x7FFF) as u16);
        let mut params = connect_params(
            space,
            src,
            dst,
            qpn,
            softrdma_wire::Psn::new(psn),
            &softrdma_cm::rdma_cm::ConnParam {
                private_data: p.private_data.clone(),
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: false,
            },
        )
        .map_err(cm_error)?;
        params.path_mtu = dev.active_mtu.to_ibv() as u8;
        params.remote_cm_response_timeout = p.cm_response_timeout;
        params.local_cm_response_timeout = p.cm_response_timeout;
        params.max_cm_retries = p.max_cm_retries;
        params.ece = cm_ece(p.ece);
        Ok((SocketAddr::new(dst.ip(), dev.addr.port()), params))
    }

    /// Accepts connection request `conn` on `qp` (RC, in RESET): the QP
    /// goes to RTS with the request's numbers and the REP leaves.
    pub fn accept(&self, conn: ConnId, qp: &Qp, p: &ConnParam) -> Result<()> {
        let ep = qp.endpoint();
        let params = accept_params(ep.qpn.raw(), ep.psn, p)?;
        self.command(|cm, e, now| {
            cm.accept(e, now, conn, ep.qpn, &params)
                .map_err(command_error)
        })
    }

    /// Accepts connection request `conn` without a QP of softrdma's
    /// moving (the counterpart of [`Cm::connect_qpless`]): the REP names
    /// QP `qpn` and starting PSN `psn`; [`CmEvent::Established`] follows
    /// the peer's RTU.
    pub fn accept_qpless(&self, conn: ConnId, qpn: u32, psn: u32, p: &ConnParam) -> Result<()> {
        let params = accept_params(qpn, psn, p)?;
        self.command(|cm, _, now| cm.accept_qpless(now, conn, &params).map_err(command_error))
    }

    /// Asks the listener at `dst` (its IP address and rdma_cm port) in the
    /// UDP port space which UD QP serves it (SIDR, rdma_connect on a UD
    /// id): [`CmEvent::SidrResolved`] follows with the QPN and Q_Key, or
    /// [`CmEvent::Unreachable`] once every resend (each after
    /// `p.cm_response_timeout`, `p.max_cm_retries` of them) went unanswered.
    /// Only `p`'s private data (at most 180 bytes) and CM timing are used.
    pub fn resolve_ud(&self, dst: SocketAddr, p: &ConnParam) -> Result<ConnId> {
        p.check()?;
        let dev = &self.ctx.dev;
        let src = SocketAddr::new(dev.addr.ip(), 0);
        let private_data =
            softrdma_cm::rdma_cm::sidr_req_private_data(src, dst.ip(), &p.private_data)
                .map_err(cm_error)?;
        let params = softrdma_cm::SidrParams {
            service_id: PortSpace::Udp.service_id(dst.port()),
            pkey: 0xFFFF,
            timeout: p.cm_response_timeout,
            max_retries: p.max_cm_retries,
            private_data,
        };
        let peer = SocketAddr::new(dst.ip(), dev.addr.port());
        self.command(|cm, _, now| cm.sidr_resolve(now, peer, &params).map_err(command_error))
    }

    /// Answers the SIDR request `conn` ([`CmEvent::SidrRequest`]) with
    /// `qp` (UD, ready to receive) and its Q_Key `qkey`; `private_data`
    /// (at most 136 bytes) goes in the SIDR_REP.
    pub fn accept_ud(&self, conn: ConnId, qp: &Qp, qkey: u32, private_data: &[u8]) -> Result<()> {
        let params = softrdma_cm::AcceptParams {
            qpn: qp.endpoint().qpn.raw(),
            qkey,
            private_data: private_data.to_vec(),
            ..softrdma_cm::AcceptParams::default()
        };
        self.command(|cm, _, now| cm.sidr_accept(now, conn, &params).map_err(command_error))
    }

    /// Rejects connection request `conn` (consumer-defined reason, with
    /// `private_data`, at most 148 bytes).
    pub fn reject(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.command(|cm, _, now| {
            let now = softrdma_cm::Instant(now.0);
            cm.agent()
                .reject(now, conn, RejReason::ConsumerDefined, private_data)
                .map_err(cm_error)
        })
    }

    /// Rejects connection request `conn` because of its ECE offer
    /// (`rdma_reject_ece`): reason 35, vendor option not supported, with
    /// `private_data` (at most 148 bytes).
    pub fn reject_ece(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.command(|cm, _, now| {
            let now = softrdma_cm::Instant(now.0);
            cm.agent()
                .reject(now, conn, RejReason::VendorOptionNotSupported, private_data)
                .map_err(cm_error)
        })
    }

    /// The ECE options the peer sent for `conn` (`rdma_get_remote_ece`):
    /// its REQ's offer (passive side, from [`CmEvent::ConnectRequest`] on)
    /// or its REP's answer (active side, from the REP on; zero before).
    /// Zero from a peer without ECE (rxe, the kernel's CM with a device
    /// that has none). An error once the connection is gone.
    pub fn remote_ece(&self, conn: ConnId) -> Result<Ece> {
        self.command(|cm, _, _| {
            let e = cm
                .remote_ece(conn)
                .ok_or_else(|| cm_error(softrdma_cm::Error::NoSuchConn(conn)))?;
            Ok(Ece {
                vendor_id: e.vendor_id,
                options: e.options,
            })
        })
    }

    /// Disconnects `conn` (DREQ; both sides then see
    /// [`CmEvent::Disconnected`], and [`CmEvent::TimewaitExit`] later).
    pub fn disconnect(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.command(|cm, _, now| {
            let now = softrdma_cm::Instant(now.0);
            cm.agent()
                .disconnect(now, conn, private_data)
                .map_err(cm_error)
        })
    }

    /// Forgets `conn` (rdma_destroy_id): the peer gets what its state
    /// needs (a REJ or a DREQ).
    pub fn destroy(&self, conn: ConnId) -> Result<()> {
        self.command(|cm, _, now| cm.destroy(now, conn).map_err(command_error))
    }

    /// The next event, waiting at most `timeout` (`None` when none came).
    pub fn get_event(&self, timeout: Duration) -> Result<Option<CmEvent<SocketAddr>>> {
        let dev = &self.ctx.dev;
        let end = Instant::now() + timeout;
        loop {
            if let Some(ev) = dev.poll_cm_event() {
                return Ok(Some(ev));
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // The background thread signals the fd when events wait; wake
            // at least every millisecond to run inline progress too.
            let [ready] = crate::sys::wait_readable(
                [dev.cm_fd.as_raw_fd()],
                Some(left.min(Duration::from_millis(1))),
            );
            if ready {
                dev.cm_fd.drain_shared();
            }
        }
    }

    /// An fd that becomes readable when events may wait (then call
    /// [`Self::get_event`] with a zero timeout until it returns `None`).
    pub fn fd(&self) -> RawFd {
        self.ctx.dev.cm_fd.as_raw_fd()
    }

    /// The attributes that move the QP of `conn` to `target` (INIT, RTR
    /// or RTS) with the numbers the exchange settled (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, conn: ConnId, target: CmQpState) -> Result<CmQpAttr> {
        self.command(|cm, _, _| cm.agent().init_qp_attr(conn, target).map_err(cm_error))
    }

    /// The private data of the REP that established `conn` (a connection
    /// this side made with [`Cm::connect`]), once, after
    /// [`CmEvent::Established`]: rdma_cm's ESTABLISHED event carries it
    /// (rsockets reads its peer's buffers there). Padded to the REP's 196
    /// bytes, as received.
    pub fn take_rep_private_data(&self, conn: ConnId) -> Option<Vec<u8>> {
        self.command(|cm, _, _| Ok(cm.take_rep_private_data(conn)))
            .ok()
            .flatten()
    }

    fn command<R>(
        &self,
        f: impl FnOnce(
            &mut softrdma_core::cm::DeviceCm,
            &mut softrdma_engine::Engine,
            softrdma_engine::Instant,
        ) -> Result<R>,
    ) -> Result<R> {
        self.ctx.dev.cm_command(f).ok_or_else(no_cm)?
    }
}

/// The REP's parameters for QP `qpn` with starting PSN `psn`.
fn accept_params(qpn: u32, psn: u32, p: &ConnParam) -> Result<softrdma_cm::AcceptParams> {
    p.check()?;
    Ok(softrdma_cm::AcceptParams {
        qpn,
        starting_psn: softrdma_wire::Psn::new(psn),
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        rnr_retry_count: p.rnr_retry_count,
        private_data: p.private_data.clone(),
        ece: cm_ece(p.ece),
        ..softrdma_cm::AcceptParams::default()
    })
}

/// The CM's ECE value (what a REQ or REP carries) of an engine one.
fn cm_ece(e: Ece) -> softrdma_cm::Ece {
    softrdma_cm::Ece {
        vendor_id: e.vendor_id,
        options: e.options,
    }
}

fn cm_error(e: softrdma_cm::Error) -> Error {
    Error::Cm {
        errno: e.errno(),
        message: e.to_string(),
    }
}

/// A command of the device's CM (the state machine's refusal or the QP's).
fn command_error(e: softrdma_core::cm::CmError) -> Error {
    Error::Cm {
        errno: e.errno(),
        message: e.to_string(),
    }
}

/// A connect or accept the port space or QP type forbids (EINVAL).
fn einval(message: &str) -> Error {
    Error::Cm {
        errno: softrdma_engine::errno::EINVAL,
        message: message.to_string(),
    }
}
