//! Hooks for drivers that execute some operations themselves.
//!
//! The shared-memory driver performs an RDMA WRITE, READ or atomic by
//! copying straight into a same-host peer's memory when the QP has nothing
//! else outstanding (so ordering is unaffected). It still needs the QP's
//! view (state, peer, PD, flags) and must deliver the completion through the
//! engine's CQ so that polling, events and overrun behave as for any other
//! work request.

use std::net::SocketAddr;

use crate::qp_attr::{AccessFlags, QpState, QpType};
use crate::wr::{SendFlags, WorkCompletion};

use super::Engine;

/// What a driver needs to know to execute a WR of a QP itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastQpInfo {
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: u32,
    /// The connected peer (RC/UC).
    pub dest: Option<SocketAddr>,
    pub dest_qpn: u32,
    /// No send WQE is outstanding: a WR executed now keeps send-queue order.
    pub sq_empty: bool,
    pub sq_sig_all: bool,
    pub access: AccessFlags,
}

impl Engine {
    /// The driver's view of a QP, for executing WRs outside the engine.
    pub fn fast_qp_info(&self, qpn: u32) -> Option<FastQpInfo> {
        let q = self.qps.get(&qpn)?;
        Some(FastQpInfo {
            qp_type: q.qp_type,
            state: q.state,
            pd: q.pd,
            dest: q.dest,
            dest_qpn: q.attr.dest_qp_num,
            sq_empty: q.req.sq.is_empty(),
            sq_sig_all: q.sq_sig_all,
            access: q.attr.qp_access_flags,
        })
    }

    /// Completes a WR the driver executed itself: posts `wc` to the QP's send
    /// CQ when the WR was signaled (or the QP signals all) or failed.
    pub fn complete_executed(&mut self, qpn: u32, flags: SendFlags, wc: WorkCompletion) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        q.counters.tx_bytes += u64::from(wc.byte_len);
        if q.sq_sig_all || flags.contains(SendFlags::SIGNALED) || !wc.status.is_ok() {
            let cq = q.send_cq;
            self.res.complete(cq, wc);
        }
    }

    /// The QPs whose state changed to ERR since the last call are reported
    /// through `poll_event` as `QpFatal`; this gives the current state of one.
    pub fn qp_state_of(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }
}
