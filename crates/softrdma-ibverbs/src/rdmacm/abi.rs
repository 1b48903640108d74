//! The structs of rdma-core v44's `<rdma/rdma_cma.h>` that the rdma_cm
//! entry points read or write, `#[repr(C)]`, with compile-time asserts of
//! their sizes and field offsets on x86-64 (computed from the header's
//! declarations: `union ibv_gid` is 8-byte aligned, `sockaddr_storage` is
//! 128 bytes).

#![allow(non_camel_case_types)]

use core::mem::{offset_of, size_of};
use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq, layout,
};

/// `enum rdma_cm_event_type`.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_uint = 5;
pub const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
pub const RDMA_CM_EVENT_REJECTED: c_uint = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_uint = 12;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;

/// `struct rdma_cm_join_mc_attr_ex` and its masks and flags.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// The names `rdma_event_str` gives, indexed by event type.
pub const EVENT_NAMES: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_uint = 0x0002;
pub const RDMA_PS_TCP: c_uint = 0x0106;
pub const RDMA_PS_UDP: c_uint = 0x0111;
pub const RDMA_PS_IB: c_uint = 0x013F;

/// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;

/// `enum ibv_qp_type` values rdma_cm uses.
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPT_UD: c_uint = 4;

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination as `sockaddr_storage`
/// (the header's unions with `sockaddr`, `sockaddr_in`, `sockaddr_in6`),
/// then the IB view.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src_storage: libc::sockaddr_storage,
    pub dst_storage: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_uint,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_uint,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_uint,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

layout!(rdma_ib_addr, 40, dgid = 16, pkey = 32);
layout!(rdma_addr, 296, dst_storage = 128, ibaddr = 256);
layout!(rdma_route, 312, path_rec = 296, num_paths = 304);
layout!(rdma_event_channel, 4);
layout!(
    rdma_cm_id,
    416,
    channel = 8,
    context = 16,
    qp = 24,
    route = 32,
    ps = 344,
    port_num = 348,
    event = 352,
    send_cq_channel = 360,
    send_cq = 368,
    recv_cq_channel = 376,
    recv_cq = 384,
    srq = 392,
    pd = 400,
    qp_type = 408
);
layout!(
    rdma_conn_param,
    24,
    private_data_len = 8,
    responder_resources = 9,
    initiator_depth = 10,
    flow_control = 11,
    retry_count = 12,
    rnr_retry_count = 13,
    srq = 14,
    qp_num = 16
);
layout!(rdma_cm_join_mc_attr_ex, 16, join_flags = 4, addr = 8);
layout!(rdma_ud_param, 56, ah_attr = 16, qp_num = 48, qkey = 52);
layout!(rdma_cm_event_param, 56);
layout!(
    rdma_cm_event,
    80,
    listen_id = 8,
    event = 16,
    status = 20,
    param = 24
);
layout!(
    rdma_addrinfo,
    96,
    ai_port_space = 12,
    ai_src_len = 16,
    ai_dst_len = 20,
    ai_src_addr = 24,
    ai_dst_addr = 32,
    ai_src_canonname = 40,
    ai_dst_canonname = 48,
    ai_route_len = 56,
    ai_route = 64,
    ai_connect_len = 72,
    ai_connect = 80,
    ai_next = 88
);
