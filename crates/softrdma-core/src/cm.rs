//! The connection manager on the device core: the IB CM agent
//! (`softrdma-cm`) fed from the engine's QP1 and sending through it, its
//! timers inside the core's deadline, and rdma_cm's automatic QP
//! transitions — a connection made with a QP moves that QP through INIT,
//! RTR and RTS with the numbers the exchange settled, as the kernel's
//! rdma_cm does for `rdma_connect`/`rdma_accept`.
//!
//! Peers are named by IP address: a MAD's UDP source port is a flow's, not
//! the peer's CM, so replies go to the peer's address on the RoCE port.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use softrdma_cm::{
    AcceptParams, AgentConfig, CmAgent, ConnId, ConnectParams, Event, QpAttr as CmQpAttr,
    QpState as CmQpState, SidrParams,
};
use softrdma_engine::{
    AccessFlags, AhAttr, AttrMask, Ece, Engine, Gid, Instant, Mtu, QpAttr, QpState, QpType, Qpn,
    VerbsError,
};
use softrdma_wire::cm::TransportType;

/// The IB CM of one device.
pub struct DeviceCm {
    agent: CmAgent<SocketAddr>,
    /// The QP each connection moves (rdma_cm style), by connection.
    qps: HashMap<ConnId, Qpn>,
    /// Events for the consumer, in order.
    events: VecDeque<Event<SocketAddr>>,
    /// The REP's private data of each connection this side made with a
    /// QP, kept for the consumer's ESTABLISHED (rdma_cm reports it there;
    /// the automatic confirmation raises no ConnectResponse).
    rep_data: HashMap<ConnId, Vec<u8>>,
    /// The ECE each connection this side made with a QP offered (only
    /// those that offered any): the REP's answer is agreed with it and set
    /// on the QP before RTR.
    offers: HashMap<ConnId, Ece>,
    /// The UDP port peers' QP1s listen on.
    roce_port: u16,
}

/// What went wrong with a CM command.
#[derive(Debug)]
pub enum CmError {
    /// The CM refused it (state, limits, unknown connection).
    Cm(softrdma_cm::Error),
    /// The QP could not be moved.
    Qp(VerbsError),
}

impl std::fmt::Display for CmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmError::Cm(e) => write!(f, "{e}"),
            CmError::Qp(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CmError {}

impl CmError {
    /// The errno rdma_cm gives for it.
    pub fn errno(&self) -> i32 {
        match self {
            CmError::Cm(e) => e.errno(),
            CmError::Qp(e) => e.errno(),
        }
    }
}

impl From<softrdma_cm::Error> for CmError {
    fn from(e: softrdma_cm::Error) -> Self {
        CmError::Cm(e)
    }
}

impl From<VerbsError> for CmError {
    fn from(e: VerbsError) -> Self {
        CmError::Qp(e)
    }
}

fn cm_now(now: Instant) -> softrdma_cm::Instant {
    softrdma_cm::Instant(now.0)
}

impl DeviceCm {
    /// A CM for the device whose CA GUID is `ca_guid`, drawing its
    /// communication IDs from `seed` (a CSPRNG's in production).
    pub fn new(ca_guid: u64, seed: [u8; 32], roce_port: u16) -> Self {
        let config = AgentConfig {
            ca_guid,
            ..AgentConfig::default()
        };
        DeviceCm {
            agent: CmAgent::new(config, seed),
            qps: HashMap::new(),
            events: VecDeque::new(),
            rep_data: HashMap::new(),
            offers: HashMap::new(),
            roce_port,
        }
    }

    /// The agent, for commands that move no QP (listen, reject, disconnect…).
    pub fn agent(&mut self) -> &mut CmAgent<SocketAddr> {
        &mut self.agent
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event<SocketAddr>> {
        self.events.pop_front()
    }

    /// Whether events wait.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// When the agent's next timer is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.agent.next_deadline().map(|t| Instant(t.0))
    }

    /// Starts connecting QP `qpn` (moved to INIT now, to RTR and RTS when the
    /// REP comes): `p` names the service, the QP and its PSN.
    pub fn connect(
        &mut self,
        engine: &mut Engine,
        now: Instant,
        peer: SocketAddr,
        qpn: Qpn,
        p: &ConnectParams,
    ) -> Result<ConnId, CmError> {
        modify(engine, now, qpn, &init_attr(true), init_mask())?;
        let p = ConnectParams {
            confirm_rep: true,
            ..p.clone()
        };
        let conn = self.agent.connect(cm_now(now), self.peer(peer), &p)?;
        self.qps.insert(conn, qpn);
        if p.ece.vendor_id != 0 {
            self.offers.insert(conn, engine_ece(p.ece));
        }
        Ok(conn)
    }

    /// What this side answers a connection request's ECE offer with when
    /// it can do `mine` (zero: nothing): the options both can do
    /// (`Ece::agree`, the engine's rule), zero when the request offered
    /// none or another vendor's. Its REP carries that, so a REP to a peer
    /// without ECE (rxe, the kernel) is the REP of before.
    pub fn ece_answer(&self, conn: ConnId, mine: softrdma_cm::Ece) -> softrdma_cm::Ece {
        let theirs = self.agent.remote_ece(conn).unwrap_or_default();
        let agreed = engine_ece(mine).agree(engine_ece(theirs));
        softrdma_cm::Ece {
            vendor_id: agreed.vendor_id,
            options: agreed.options,
        }
    }

    /// The ECE the peer sent for `conn` (its REQ's offer, or its REP's
    /// answer once the REP came): rdma_cm's `rdma_get_remote_ece`.
    pub fn remote_ece(&self, conn: ConnId) -> Option<softrdma_cm::Ece> {
        self.agent.remote_ece(conn)
    }

    /// Starts connecting for a consumer that moves its own QP (rdma_cm's
    /// ids without a QP, as UCX uses them): `p` names the QP and PSN the
    /// REQ carries, and no QP moves; `Event::ConnectResponse` brings the
    /// REP, and [`Self::establish`] sends the RTU.
    pub fn connect_qpless(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        p: &ConnectParams,
    ) -> Result<ConnId, CmError> {
        let p = ConnectParams {
            confirm_rep: true,
            ..p.clone()
        };
        Ok(self.agent.connect(cm_now(now), self.peer(peer), &p)?)
    }

    /// Accepts the connection request `conn` for a consumer that moves its
    /// own QP: the REP names `p`'s QP and PSN, and no QP moves.
    pub fn accept_qpless(
        &mut self,
        now: Instant,
        conn: ConnId,
        p: &AcceptParams,
    ) -> Result<(), CmError> {
        let p = AcceptParams {
            ece: self.ece_answer(conn, p.ece),
            ..p.clone()
        };
        Ok(self.agent.accept(cm_now(now), conn, &p)?)
    }

    /// Confirms a connection held at `Event::ConnectResponse` (one made
    /// with [`Self::connect_qpless`]): the RTU leaves.
    pub fn establish(&mut self, conn: ConnId) -> Result<(), CmError> {
        Ok(self.agent.establish(conn)?)
    }

    /// Accepts the connection request `conn` on QP `qpn`: the QP goes to RTR
    /// and RTS with the REQ's numbers, then the REP leaves.
    pub fn accept(
        &mut self,
        engine: &mut Engine,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
        p: &AcceptParams,
    ) -> Result<(), CmError> {
        // ECE: the options both sides can do go on the QP before RTR and
        // in the REP. Nothing agreed (no offer, or nothing in common)
        // leaves the QP alone: it keeps what its owner set.
        self.check_qp_type(engine, conn, qpn)?;
        let ece = self.ece_answer(conn, p.ece);
        if ece.vendor_id != 0 {
            engine.set_ece(qpn, engine_ece(ece))?;
        }
        let p = &AcceptParams { ece, ..p.clone() };
        // The REP is only queued here: it leaves after the QP is in RTS
        // (this runs under the device lock), or a REJ follows it if the QP
        // cannot take the numbers.
        self.agent.accept(cm_now(now), conn, p)?;
        if let Err(e) = self.ready_passive(engine, now, conn, qpn) {
            let _ = self.agent.destroy(cm_now(now), conn);
            return Err(e);
        }
        self.qps.insert(conn, qpn);
        Ok(())
    }

    /// Refuses (EINVAL) a QP of the wrong kind for the request: an XRC
    /// request takes an XRC target, and an XRC target takes nothing else
    /// (an XRC initiator answers no request).
    fn check_qp_type(&self, engine: &Engine, conn: ConnId, qpn: Qpn) -> Result<(), CmError> {
        let (_, init) = engine.query_qp(qpn)?;
        let asked = self
            .agent
            .transport(conn)
            .ok_or(softrdma_cm::Error::NoSuchConn(conn))?;
        let xrc_asked = asked == TransportType::Extended;
        let fits = xrc_asked == (init.qp_type == QpType::XrcTgt) && init.qp_type != QpType::XrcIni;
        if fits {
            return Ok(());
        }
        Err(CmError::Qp(VerbsError::InvalidArgument(format!(
            "a {:?} connection request cannot be accepted on a {} QP (accept an XRC request \
             on an XRC target QP, an RC one on an RC QP)",
            asked, init.qp_type
        ))))
    }

    /// INIT, RTR and RTS for the passive side of `conn`, after its accept.
    fn ready_passive(
        &mut self,
        engine: &mut Engine,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
    ) -> Result<(), CmError> {
        let init = self.agent.init_qp_attr(conn, CmQpState::Init)?;
        let access = init_attr(init.remote_read_atomic);
        modify(engine, now, qpn, &access, init_mask())?;
        let (attr, mask) = rtr_attr(&self.agent.init_qp_attr(conn, CmQpState::Rtr)?);
        modify(engine, now, qpn, &attr, mask)?;
        let (attr, mask) = rts_attr(&self.agent.init_qp_attr(conn, CmQpState::Rts)?);
        modify(engine, now, qpn, &attr, mask)?;
        Ok(())
    }

    /// Asks `peer` which UD QP serves `p.service_id` (SIDR_REQ); an
    /// `Event::SidrResolved` or `Event::Unreachable` follows. No QP moves:
    /// a UD QP is ready before it asks.
    pub fn sidr_resolve(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        p: &SidrParams,
    ) -> Result<ConnId, CmError> {
        Ok(self.agent.sidr_resolve(cm_now(now), self.peer(peer), p)?)
    }

    /// Answers the SIDR request `conn` with the UD QP and Q_Key of `p`
    /// (SIDR_REP, status Success); the request is then gone.
    pub fn sidr_accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        p: &AcceptParams,
    ) -> Result<(), CmError> {
        Ok(self.agent.accept(cm_now(now), conn, p)?)
    }

    /// The private data of the REP that established `conn` (made by this
    /// side with a QP), taken once: rdma_cm's ESTABLISHED carries it.
    pub fn take_rep_private_data(&mut self, conn: ConnId) -> Option<Vec<u8>> {
        self.rep_data.remove(&conn)
    }

    /// Forgets connection `conn` (the agent's destroy: a REJ or DREQ as its state needs).
    pub fn destroy(&mut self, now: Instant, conn: ConnId) -> Result<(), CmError> {
        self.qps.remove(&conn);
        self.rep_data.remove(&conn);
        self.offers.remove(&conn);
        Ok(self.agent.destroy(cm_now(now), conn)?)
    }

    /// Feeds the MADs QP1 received, runs due timers, sends what the agent
    /// has for QP1 and handles its events (moving connected QPs).
    pub fn progress(&mut self, engine: &mut Engine, now: Instant) {
        while let Some(m) = engine.poll_gsi() {
            let from = self.peer(m.from);
            self.agent.on_mad(cm_now(now), from, &m.mad[..]);
        }
        if self.next_deadline().is_some_and(|t| t <= now) {
            self.agent.on_timeout(cm_now(now));
        }
        self.follow_events(engine, now);
        while let Some((to, mad)) = self.agent.poll_transmit() {
            // A full QP1 queue drops the MAD; the CM's retry sends it again.
            let _ = engine.send_gsi(to, &mad);
        }
    }

    /// Takes the agent's events: a REP for a connection with a QP moves the
    /// QP to RTR and RTS and confirms (RTU); every event then goes to the
    /// consumer.
    fn follow_events(&mut self, engine: &mut Engine, now: Instant) {
        while let Some(ev) = self.agent.poll_event() {
            if let Event::ConnectResponse { conn, .. } = &ev {
                if let Some(&qpn) = self.qps.get(conn) {
                    // As rdma_cm with a QP: RTR, RTS, the RTU, and the
                    // consumer hears "established" (the agent raises no
                    // event for a confirmation it was asked for).
                    let conn = *conn;
                    let data = match &ev {
                        Event::ConnectResponse { rep, .. } => rep.private_data.to_vec(),
                        _ => Vec::new(),
                    };
                    let ev = match self.finish_active(engine, now, conn, qpn) {
                        Ok(()) => {
                            self.rep_data.insert(conn, data);
                            Event::Established { conn }
                        }
                        Err(_) => {
                            // The QP could not take the numbers: the peer
                            // gets a REJ, the consumer a failure.
                            let _ = self.agent.destroy(cm_now(now), conn);
                            self.qps.remove(&conn);
                            self.offers.remove(&conn);
                            Event::Unreachable { conn }
                        }
                    };
                    self.events.push_back(ev);
                    continue;
                }
            }
            if let Event::TimewaitExit { conn }
            | Event::Rejected { conn, .. }
            | Event::Unreachable { conn } = &ev
            {
                self.qps.remove(conn);
                self.rep_data.remove(conn);
                self.offers.remove(conn);
            }
            self.events.push_back(ev);
        }
    }

    fn finish_active(
        &mut self,
        engine: &mut Engine,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
    ) -> Result<(), CmError> {
        // ECE: what we offered, agreed with the REP's answer, goes on the
        // QP (still in INIT) before RTR.
        if let Some(offer) = self.offers.remove(&conn) {
            let answer = engine_ece(self.agent.remote_ece(conn).unwrap_or_default());
            engine.set_ece(qpn, offer.agree(answer))?;
        }
        let (attr, mask) = rtr_attr(&self.agent.init_qp_attr(conn, CmQpState::Rtr)?);
        modify(engine, now, qpn, &attr, mask)?;
        let (attr, mask) = rts_attr(&self.agent.init_qp_attr(conn, CmQpState::Rts)?);
        modify(engine, now, qpn, &attr, mask)?;
        Ok(self.agent.establish(conn)?)
    }

    /// A peer as the agent names it: its IP address on the RoCE port.
    fn peer(&self, a: SocketAddr) -> SocketAddr {
        SocketAddr::new(a.ip(), self.roce_port)
    }
}

/// The engine's ECE value of what a CM message carries.
fn engine_ece(e: softrdma_cm::Ece) -> Ece {
    Ece {
        vendor_id: e.vendor_id,
        options: e.options,
    }
}

fn modify(
    engine: &mut Engine,
    now: Instant,
    qpn: Qpn,
    attr: &QpAttr,
    mask: AttrMask,
) -> Result<(), VerbsError> {
    engine.modify_qp(now, qpn, attr, mask)
}

fn init_mask() -> AttrMask {
    AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
}

/// INIT as rdma_cm sets it: local and remote write, and remote READ and
/// atomics when the connection serves them.
fn init_attr(read_atomic: bool) -> QpAttr {
    let mut access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    if read_atomic {
        access = access | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: access,
        ..Default::default()
    }
}

fn rtr_attr(c: &CmQpAttr) -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::from_ibv(u32::from(c.path_mtu)).unwrap_or(Mtu::Mtu1024),
        dest_qp_num: Qpn::from_raw(c.dest_qp_num),
        rq_psn: c.rq_psn,
        max_dest_rd_atomic: c.max_dest_rd_atomic,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: Gid(c.path.remote_gid),
            is_global: true,
            port_num: 1,
            hop_limit: c.path.hop_limit.max(1),
            traffic_class: c.path.traffic_class,
            ..Default::default()
        },
        ..Default::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    (attr, mask)
}

fn rts_attr(c: &CmQpAttr) -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: c.sq_psn,
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        max_rd_atomic: c.max_rd_atomic,
        ..Default::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    (attr, mask)
}
