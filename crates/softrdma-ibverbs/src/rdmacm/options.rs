//! `rdma_set_option`, `rdma_init_qp_attr` and `rdma_establish`, with the
//! kernel's rdma_cm answers (docs/rdmacm.md).

use std::ffi::{c_int, c_void};

use super::abi::*;
use super::{addr, Id};
use crate::abi::*;
use crate::ffi::{guard, set_errno};

/// `RDMA_OPTION_ID` and its options; `RDMA_OPTION_IB` and its one.
const RDMA_OPTION_ID: c_int = 0;
const RDMA_OPTION_ID_TOS: c_int = 0;
const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
const RDMA_OPTION_ID_AFONLY: c_int = 2;
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
const RDMA_OPTION_IB: c_int = 1;
const RDMA_OPTION_IB_PATH: c_int = 1;
/// `struct ibv_path_data`: flags, reserved, a 64-byte path record.
const PATH_DATA_LEN: usize = 72;

/// What `rdma_set_option` recorded on an id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmOptions {
    pub tos: Option<u8>,
    pub reuseaddr: bool,
    pub afonly: bool,
    pub ack_timeout: Option<u8>,
}

/// `ibv_qp_attr_mask` bits.
const STATE: c_int = 1;
const ACCESS_FLAGS: c_int = 1 << 3;
const PKEY_INDEX: c_int = 1 << 4;
const PORT: c_int = 1 << 5;
const QKEY: c_int = 1 << 6;
const AV: c_int = 1 << 7;
const PATH_MTU: c_int = 1 << 8;
const TIMEOUT: c_int = 1 << 9;
const RETRY_CNT: c_int = 1 << 10;
const RNR_RETRY: c_int = 1 << 11;
const RQ_PSN: c_int = 1 << 12;
const MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const MIN_RNR_TIMER: c_int = 1 << 15;
const SQ_PSN: c_int = 1 << 16;
const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const DEST_QPN: c_int = 1 << 20;
/// `ibv_qp_state`.
const QPS_INIT: u32 = 1;
const QPS_RTR: u32 = 2;
const QPS_RTS: u32 = 3;
/// `ibv_access_flags`.
const LOCAL_WRITE: u32 = 1;
const REMOTE_WRITE: u32 = 2;
const REMOTE_READ: u32 = 4;
const REMOTE_ATOMIC: u32 = 8;

fn ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        let Some(id) = Id::live(id) else {
            return ret(Err(libc::EINVAL));
        };
        if optval.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: per the contract, `optlen` readable bytes.
        let v = unsafe { std::slice::from_raw_parts(optval.cast::<u8>(), optlen) };
        ret(set_option(id, level, optname, v))
    })
}

/// As the kernel's `ucma_set_option`: an option of the wrong size is
/// EINVAL, an unknown one ENOSYS. TOS, REUSEADDR, AFONLY and ACK_TIMEOUT
/// are kept on the id (softrdma's CM takes its route, reuse and timeout
/// rules from the device: they change nothing on the wire); an IB path
/// sets the route, and ROUTE_RESOLVED follows as after
/// `rdma_resolve_route`.
fn set_option(id: &mut Id, level: c_int, optname: c_int, v: &[u8]) -> Result<(), c_int> {
    let int = || -> Result<c_int, c_int> {
        let b: [u8; 4] = v.try_into().map_err(|_| libc::EINVAL)?;
        Ok(c_int::from_ne_bytes(b))
    };
    let byte = || -> Result<u8, c_int> {
        match v {
            [b] => Ok(*b),
            _ => Err(libc::EINVAL),
        }
    };
    match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => {
            let t = byte()?;
            id.state().options.tos = Some(t);
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => {
            let on = int()? != 0;
            id.state().options.reuseaddr = on;
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => {
            let on = int()? != 0;
            id.state().options.afonly = on;
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
            let t = byte()?;
            if t > 31 {
                return Err(libc::EINVAL);
            }
            id.state().options.ack_timeout = Some(t);
        }
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
            if v.is_empty() || !v.len().is_multiple_of(PATH_DATA_LEN) {
                return Err(libc::EINVAL);
            }
            if id.ctx().is_none() || addr::route_addr(&id.c.route, true).is_none() {
                return Err(libc::EINVAL);
            }
            super::exports::queue(id, RDMA_CM_EVENT_ROUTE_RESOLVED);
        }
        (RDMA_OPTION_ID | RDMA_OPTION_IB, _) => return Err(libc::ENOSYS),
        _ => return Err(libc::ENOSYS),
    }
    Ok(())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        let Some(id) = Id::live(id) else {
            return ret(Err(libc::EINVAL));
        };
        if attr.is_null() || mask.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: per the contract, a readable and writable ibv_qp_attr and
        // a writable int.
        let (a, m) = unsafe { (&mut *attr, &mut *mask) };
        ret(init_qp_attr(id, a, m))
    })
}

/// The attributes that move the id's QP to `attr.qp_state` (INIT, RTR or
/// RTS), as rdma_cm computes them from the connection's exchange; INIT
/// needs no connection (no remote access then, or the UDP Q_Key for a UD
/// id). EINVAL for other states or a connection not far enough along.
fn init_qp_attr(id: &mut Id, a: &mut ibv_qp_attr, m: &mut c_int) -> Result<(), c_int> {
    use softrdma::rdma_cm::CmQpState;
    let ctx = id.ctx().ok_or(libc::EINVAL)?;
    let target = a.qp_state;
    let conn = id.state().conn;
    let ud = id.c.qp_type == IBV_QPT_UD;
    let cm_state = match target {
        QPS_INIT => CmQpState::Init,
        QPS_RTR => CmQpState::Rtr,
        QPS_RTS => CmQpState::Rts,
        _ => return Err(libc::EINVAL),
    };
    if target == QPS_INIT {
        a.qp_state = QPS_INIT;
        a.pkey_index = 0;
        a.port_num = 1;
        *m = STATE | PKEY_INDEX | PORT;
        if ud {
            a.qkey = super::qp::RDMA_UDP_QKEY;
            *m |= QKEY;
            return Ok(());
        }
        a.qp_access_flags = 0;
        if let Some(conn) = conn {
            let c = ctx
                .dev
                .cm()
                .init_qp_attr(conn, cm_state)
                .map_err(|e| e.errno())?;
            a.qp_access_flags = LOCAL_WRITE
                | REMOTE_WRITE
                | if c.remote_read_atomic {
                    REMOTE_READ | REMOTE_ATOMIC
                } else {
                    0
                };
        }
        *m |= ACCESS_FLAGS;
        return Ok(());
    }
    if ud {
        // RTR and RTS of a UD QP need nothing from the exchange.
        a.qp_state = target;
        *m = STATE;
        if target == QPS_RTS {
            a.sq_psn = 0;
            *m |= SQ_PSN;
        }
        return Ok(());
    }
    let conn = conn.ok_or(libc::EINVAL)?;
    let c = ctx
        .dev
        .cm()
        .init_qp_attr(conn, cm_state)
        .map_err(|e| e.errno())?;
    a.qp_state = target;
    if target == QPS_RTR {
        a.path_mtu = u32::from(c.path_mtu);
        a.dest_qp_num = c.dest_qp_num;
        a.rq_psn = c.rq_psn.value();
        a.max_dest_rd_atomic = c.max_dest_rd_atomic;
        a.min_rnr_timer = 12;
        // SAFETY: all-zero is a valid ibv_ah_attr.
        let mut ah: ibv_ah_attr = unsafe { std::mem::zeroed() };
        ah.grh.dgid = ibv_gid {
            raw: c.path.remote_gid,
        };
        ah.grh.hop_limit = c.path.hop_limit.max(1);
        ah.grh.traffic_class = c.path.traffic_class;
        ah.grh.flow_label = c.path.flow_label;
        ah.is_global = 1;
        ah.port_num = 1;
        ah.sl = c.path.sl;
        a.ah_attr = ah;
        *m = STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    } else {
        a.sq_psn = c.sq_psn.value();
        a.timeout = c.timeout;
        a.retry_cnt = c.retry_cnt;
        a.rnr_retry = c.rnr_retry;
        a.max_rd_atomic = c.max_rd_atomic;
        *m = STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;
    }
    Ok(())
}

pub unsafe extern "C" fn softrdma_rdmacm_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let Some(idr) = Id::live(id) else {
            return ret(Err(libc::EINVAL));
        };
        // An id without a QP waits at CONNECT_RESPONSE for this call (the
        // RTU); any other id is EINVAL, as librdmacm's: one with a QP is
        // established by the library.
        let r = (|| {
            let ctx = idr.ctx().ok_or(libc::EINVAL)?;
            let conn = idr.state().conn.ok_or(libc::EINVAL)?;
            if !idr.c.qp.is_null() {
                return Err(libc::EINVAL);
            }
            ctx.dev.cm().establish(conn).map_err(|_| libc::EINVAL)
        })();
        ret(r)
    })
}
