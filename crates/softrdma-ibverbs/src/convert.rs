//! Translation between the C structs of `abi` and the data types of
//! softrdma's API (the engine's, re-exported by `softrdma`).
//!
//! The engine already uses libibverbs numbering for states, MTUs, masks,
//! access flags, opcodes and statuses, so this is mostly field copying.
//! Two things need care: immediate data is `__be32` in C (network order in
//! memory) while the engine holds the value read big-endian off the wire,
//! and the C unions of `ibv_send_wr` are read according to the opcode.

use std::ffi::{c_int, c_uint};

use softrdma::{
    AccessFlags, AhAttr, AttrMask, DeviceAttr, Event, Gid, Lkey, Mtu, MwHandle, NetworkHdr,
    PortAttr, Psn, QpAttr, QpCap, QpState, Qpn, Rkey, SendFlags, SendOp, Sge, WcFlags,
    WorkCompletion,
};

use crate::abi::*;

/// `struct ibv_sge` → softrdma SGE.
pub fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: Lkey::from_raw(s.lkey),
    }
}

/// The operation of a send WR (everything but the SGEs, flags and UD address).
pub fn send_op(wr: &ibv_send_wr) -> Result<SendOp, &'static str> {
    // Which member of the union is meaningful is decided by the opcode, as
    // in C; both are read here and used per opcode below.
    // SAFETY: the union's members are plain integers and pointers, valid
    // for any bit pattern.
    let rdma = unsafe { wr.wr.rdma };
    // SAFETY: as above.
    let atomic = unsafe { wr.wr.atomic };
    let imm = u32::from_be(wr.imm_data);
    Ok(match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: Rkey::from_raw(wr.imm_data),
        },
        IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: Rkey::from_raw(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: Rkey::from_raw(atomic.rkey),
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            rkey: Rkey::from_raw(wr.imm_data),
        },
        IBV_WR_BIND_MW => {
            // SAFETY: the union's members are plain integers and pointers.
            let b = unsafe { wr.ext.bind_mw };
            if b.mw.is_null() {
                return Err("BIND_MW without a window");
            }
            // SAFETY: a live MW and MR of this library (the contract of
            // ibv_post_send); the window's handle is checked by the engine.
            unsafe {
                SendOp::BindMw {
                    mw: MwHandle::from_raw((*b.mw.cast::<ibv_mw>()).handle),
                    rkey: Rkey::from_raw(b.rkey),
                    bind: crate::mw::bind_of(&b.bind_info),
                }
            }
        }
        _ => return Err("opcode not supported (TSO, ATOMIC_WRITE, driver)"),
    })
}

/// Send flags softrdma honours (FENCE, SIGNALED, SOLICITED, INLINE); others
/// (IP_CSUM) mean nothing on a soft device and are dropped.
pub fn send_flags(flags: c_uint) -> SendFlags {
    SendFlags(flags & IBV_SEND_KNOWN)
}

/// `ibv_wc.sl` of a completion. On RoCE there is no service level to
/// report; ConnectX hardware puts the received packet's network-header type
/// in the CQE's SL bits instead (mlx5 provider: `sl` is those four bits; the
/// PRM's L3 header types 0 GRH, 1 IPv6, 2 IPv4), and UCX's `ud_verbs` reads
/// `wc.sl` that way to find the destination GID in the 40 bytes before a UD
/// receive. rxe reports 0, which makes UCX read an IPv4 packet's header as
/// an IPv6 one. softrdma follows mlx5.
pub fn wc_sl(hdr: NetworkHdr) -> u8 {
    match hdr {
        NetworkHdr::None => 0,
        NetworkHdr::Ipv6 => 1,
        NetworkHdr::Ipv4 => 2,
    }
}

/// softrdma completion → `struct ibv_wc`. The fields hardware fills from
/// addresses RoCE does not have are 0, as on mlx5 and rxe over Ethernet:
/// `slid` (no LIDs), `dlid_path_bits`, `pkey_index` (the one P_Key, index
/// 0); `src_qp` is the sender's QP for UD receives; IBV_WC_GRH is set on UD
/// receives, whose first 40 bytes hold the packet's network header.
pub fn wc(w: &WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    let mut imm = 0;
    if w.wc_flags.contains(WcFlags::GRH) {
        flags |= IBV_WC_GRH;
    }
    if w.wc_flags.contains(WcFlags::WITH_IMM) {
        flags |= IBV_WC_WITH_IMM;
        imm = w.imm_data.to_be();
    }
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        flags |= IBV_WC_WITH_INV;
        imm = w.imm_data;
    }
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_uint,
        opcode: w.opcode as c_uint,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.raw(),
        src_qp: w.src_qp.raw(),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: wc_sl(w.network_hdr),
        dlid_path_bits: 0,
    }
}

/// `struct ibv_ah_attr` → softrdma address vector.
pub fn ah_attr(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid(a.grh.dgid.raw()),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
        is_global: a.is_global != 0,
        dlid: a.dlid,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
    }
}

/// softrdma address vector → `struct ibv_ah_attr`.
pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid::from_raw(a.dgid.0),
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `struct ibv_qp_cap` → softrdma queue sizes.
pub fn qp_cap(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// softrdma queue sizes → `struct ibv_qp_cap`.
pub fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `struct ibv_qp_attr` + mask → softrdma attributes. Enumerations are only
/// checked where the mask names them (a modify ignores the other fields);
/// an out-of-range value there is EINVAL, as from the kernel.
pub fn qp_attr(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, String> {
    let m = AttrMask(mask as u32);
    let state = |v: c_uint, what: &str, named: bool| -> Result<QpState, String> {
        if !named {
            return Ok(QpState::Reset);
        }
        QpState::from_ibv(v).ok_or_else(|| format!("{what} {v} is not a QP state"))
    };
    let path_mtu = if m.contains(AttrMask::PATH_MTU) {
        Mtu::from_ibv(a.path_mtu).ok_or_else(|| format!("path_mtu {} is not 1..5", a.path_mtu))?
    } else {
        Mtu::default()
    };
    Ok(QpAttr {
        qp_state: state(a.qp_state, "qp_state", m.contains(AttrMask::STATE))?,
        cur_qp_state: state(
            a.cur_qp_state,
            "cur_qp_state",
            m.contains(AttrMask::CUR_STATE),
        )?,
        path_mtu,
        path_mig_state: a.path_mig_state.min(255) as u8,
        qkey: a.qkey,
        rq_psn: Psn::new(a.rq_psn),
        sq_psn: Psn::new(a.sq_psn),
        dest_qp_num: Qpn::from_raw(a.dest_qp_num),
        qp_access_flags: AccessFlags::from_bits_retain(a.qp_access_flags),
        cap: qp_cap(&a.cap),
        ah_attr: ah_attr(&a.ah_attr),
        alt_ah_attr: ah_attr(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    })
}

/// softrdma attributes → `struct ibv_qp_attr` (`ibv_query_qp`).
pub fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state.to_ibv(),
        cur_qp_state: a.cur_qp_state.to_ibv(),
        path_mtu: a.path_mtu.to_ibv(),
        path_mig_state: c_uint::from(a.path_mig_state),
        qkey: a.qkey,
        rq_psn: a.rq_psn.value(),
        sq_psn: a.sq_psn.value(),
        dest_qp_num: a.dest_qp_num.raw(),
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to_c(&a.cap),
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ah_attr_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

fn clamp(v: u32) -> c_int {
    v.min(c_int::MAX as u32) as c_int
}

/// `ibv_query_device`.
pub fn device_attr(d: &DeviceAttr) -> ibv_device_attr {
    let mut fw_ver = [0 as std::ffi::c_char; 64];
    for (dst, b) in fw_ver.iter_mut().zip(d.fw_ver.bytes().take(63)) {
        *dst = b as std::ffi::c_char;
    }
    ibv_device_attr {
        fw_ver,
        node_guid: d.node_guid.to_be(),
        sys_image_guid: d.sys_image_guid.to_be(),
        max_mr_size: d.max_mr_size,
        page_size_cap: d.page_size_cap,
        vendor_id: d.vendor_id,
        vendor_part_id: d.vendor_part_id,
        hw_ver: d.hw_ver,
        max_qp: clamp(d.max_qp),
        max_qp_wr: clamp(d.max_qp_wr),
        device_cap_flags: IBV_DEVICE_RC_RNR_NAK_GEN
            | IBV_DEVICE_XRC
            | if d.max_mw > 0 {
                IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B
            } else {
                0
            },
        max_sge: clamp(d.max_sge),
        max_sge_rd: clamp(d.max_sge),
        max_cq: clamp(d.max_cq),
        max_cqe: clamp(d.max_cqe),
        max_mr: clamp(d.max_mr),
        max_pd: clamp(d.max_pd),
        max_qp_rd_atom: clamp(d.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: clamp(d.max_qp_rd_atom.saturating_mul(d.max_qp)),
        max_qp_init_rd_atom: clamp(d.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: if d.atomic_cap != 0 { IBV_ATOMIC_HCA } else { 0 },
        max_ee: 0,
        max_rdd: 0,
        max_mw: clamp(d.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: clamp(d.max_mcast_grp),
        max_mcast_qp_attach: clamp(d.max_mcast_qp_attach),
        max_total_mcast_qp_attach: clamp(d.max_total_mcast_qp_attach),
        max_ah: clamp(d.max_pd),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp(d.max_srq),
        max_srq_wr: clamp(d.max_srq_wr),
        max_srq_sge: clamp(d.max_srq_sge),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: d.phys_port_cnt,
    }
}

/// `ibv_query_port` (the full 52-byte struct).
pub fn port_attr(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state,
        max_mtu: p.max_mtu.to_ibv(),
        active_mtu: p.active_mtu.to_ibv(),
        gid_tbl_len: clamp(p.gid_tbl_len),
        port_cap_flags: 0,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len.min(u32::from(u16::MAX)) as u16,
        lid: p.lid,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer,
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// The object an async event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventObject {
    Cq(u32),
    Qp(u32),
    Srq(u32),
}

/// softrdma event → (`enum ibv_event_type`, object); `None` for completion
/// notifications, which go to completion channels instead.
pub fn async_event(e: &Event) -> Option<(c_uint, EventObject)> {
    Some(match *e {
        Event::CqOverrun { cq } => (IBV_EVENT_CQ_ERR, EventObject::Cq(cq.raw())),
        Event::QpFatal { qpn } => (IBV_EVENT_QP_FATAL, EventObject::Qp(qpn.raw())),
        Event::SqDrained { qpn } => (IBV_EVENT_SQ_DRAINED, EventObject::Qp(qpn.raw())),
        Event::LastWqeReached { qpn } => {
            (IBV_EVENT_QP_LAST_WQE_REACHED, EventObject::Qp(qpn.raw()))
        }
        Event::SrqLimitReached { srq } => {
            (IBV_EVENT_SRQ_LIMIT_REACHED, EventObject::Srq(srq.raw()))
        }
        Event::Completion { .. } => return None,
    })
}
