//! The C ABI of `<infiniband/verbs.h>` (rdma-core v44) on x86-64: every
//! struct this library reads or writes, field for field, with compile-time
//! asserts of its size and of the offsets programs and inline functions
//! depend on. The numbers come from `gdb ptype /o` of Debian 12's header.
//!
//! Applications compiled against the header read these structs directly
//! (`wc->status`, `qp->qp_num`) and the header's inline functions jump
//! through `ctx->ops` and the `verbs_context` in front of the context, so a
//! single byte off breaks unmodified binaries. Names keep the C spelling.

#![allow(non_camel_case_types, missing_docs)]

use core::mem::{offset_of, size_of};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `union ibv_gid`: 16 raw bytes, 8-byte aligned through its `global` view.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_global {
    pub subnet_prefix: u64,
    pub interface_id: u64,
}

impl ibv_gid {
    pub fn from_raw(raw: [u8; 16]) -> Self {
        ibv_gid { raw }
    }
    pub fn raw(&self) -> [u8; 16] {
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        unsafe { self.raw }
    }
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int;

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops`: the slots the header's inline functions call.
/// Only `alloc_mw`, `bind_mw`, `dealloc_mw`, `poll_cq`, `req_notify_cq`,
/// `post_srq_recv`, `post_send` and `post_recv` are live; the `_compat_*`
/// slots exist for layout only.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `abi_compat` of an extended context: `verbs_get_ctx()` then treats the
/// 320 bytes in front of the context as a `struct verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct verbs_context`: the extended operations, in front of the
/// `ibv_context` handed to applications. Only `query_port` and
/// `query_device_ex` are set; the inline functions treat a NULL slot as
/// "not supported" (EOPNOTSUPP) or fall back to the classic verb.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: *mut c_void,
    pub alloc_null_mr: *mut c_void,
    pub read_counters: *mut c_void,
    pub attach_counters_point_flow: *mut c_void,
    pub create_counters: *mut c_void,
    pub destroy_counters: *mut c_void,
    pub reg_dm_mr: *mut c_void,
    pub alloc_dm: *mut c_void,
    pub free_dm: *mut c_void,
    pub modify_flow_action_esp: *mut c_void,
    pub destroy_flow_action: *mut c_void,
    pub create_flow_action_esp: *mut c_void,
    pub modify_qp_rate_limit: *mut c_void,
    pub alloc_parent_domain: *mut c_void,
    pub dealloc_td: *mut c_void,
    pub alloc_td: *mut c_void,
    pub modify_cq: *mut c_void,
    pub post_srq_ops: *mut c_void,
    pub destroy_rwq_ind_table: *mut c_void,
    pub create_rwq_ind_table: *mut c_void,
    pub destroy_wq: *mut c_void,
    pub modify_wq: *mut c_void,
    pub create_wq: *mut c_void,
    pub query_rt_values: *mut c_void,
    pub create_cq_ex: *mut c_void,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: *mut c_void,
    pub abi_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub abi_placeholder1: *mut c_void,
    pub open_qp: *mut c_void,
    pub create_qp_ex: *mut c_void,
    pub get_srq_num: *mut c_void,
    pub create_srq_ex: *mut c_void,
    pub open_xrcd: *mut c_void,
    pub close_xrcd: *mut c_void,
    pub abi_placeholder3: u64,
    /// Size of the whole struct, so `verbs_get_ctx_op` knows which slots exist.
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`: `handle` is the engine's window handle (its index).
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: c_uint,
}

/// `struct ibv_mw_bind` (the argument of `ibv_bind_mw`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (`__be32`, network byte order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `bind_mw.bind_info` (`struct ibv_mw_bind_info`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The trailing anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (`__be32`) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    pub ext: ibv_send_wr_ext,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_port_attr` (52 bytes; the exported `ibv_query_port` writes
/// only the first [`COMPAT_PORT_ATTR_LEN`] of them).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Size of `struct _compat_ibv_port_attr`, what `ibv_query_port` itself fills.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// `__be64`.
    pub node_guid: u64,
    /// `__be64`.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_device_attr_ex`: the classic attributes followed by
/// capability blocks softrdma reports as all zero (no TSO, RSS, packet
/// pacing, tag matching or CQ moderation) except odp_caps
/// ([`ODP_CAPS_AT`]) and max_dm_size ([`MAX_DM_SIZE_AT`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    /// odp_caps, completion_timestamp_mask, hca_core_clock,
    /// device_cap_flags_ex, tso/rss/packet pacing caps, raw_packet_caps,
    /// tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps.
    pub _caps: [u8; 396 - 236],
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// `element`: the CQ, QP or SRQ (or the port number in the low 4 bytes).
    pub element: *mut c_void,
    pub event_type: c_uint,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_ece`: Enhanced Connection Establishment options.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// `struct ibv_grh`: what a UD receive finds in the first 40 bytes.
#[repr(C)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

// ----- enum values -----

pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;

pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `enum ibv_gid_type_sysfs` (what `ibv_query_gid_type` reports).
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_uint = 1;
/// `enum ibv_gid_type` (what `ibv_query_gid_ex` reports).
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

pub const IBV_ATOMIC_HCA: c_uint = 1;
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;
pub const IBV_DEVICE_SRQ_RESIZE: c_uint = 1 << 13;
pub const IBV_DEVICE_MEM_WINDOW: c_uint = 1 << 17;
pub const IBV_DEVICE_XRC: c_uint = 1 << 20;
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: c_uint = 1 << 24;

pub const IBV_MW_TYPE_1: c_uint = 1;
pub const IBV_MW_TYPE_2: c_uint = 2;

pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
pub const IBV_WR_LOCAL_INV: c_uint = 7;
pub const IBV_WR_BIND_MW: c_uint = 8;
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;

pub const IBV_SEND_INLINE: c_uint = 8;
/// FENCE | SIGNALED | SOLICITED | INLINE: the flags softrdma honours.
pub const IBV_SEND_KNOWN: c_uint = 0xF;

pub const IBV_WC_GRH: c_uint = 1;
pub const IBV_WC_WITH_IMM: c_uint = 2;
pub const IBV_WC_WITH_INV: c_uint = 8;

/// Access flags that are hints a provider may ignore (`IBV_ACCESS_OPTIONAL_RANGE`).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;
pub const IBV_ACCESS_MW_BIND: c_uint = 1 << 4;
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
pub const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: u32 = 1;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: u32 = 2;
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;
/// `struct ibv_odp_caps` starts 4 bytes into `ibv_device_attr_ex::_caps`
/// (offset 240 of the struct, after comp_mask and padding): general_caps
/// (u64), then the RC, UC and UD operation bits (u32 each).
pub const ODP_CAPS_AT: usize = 4;
/// Where `max_dm_size` (u64) sits in [`ibv_device_attr_ex::_caps`]: at
/// byte 376 of the struct (checked against Debian's header).
pub const MAX_DM_SIZE_AT: usize = 376 - 236;
/// Where `xrc_odp_caps` (u32) sits in [`ibv_device_attr_ex::_caps`]: at
/// byte 392 of the struct, after `pci_atomic_caps` (three u16 at 384).
pub const XRC_ODP_CAPS_AT: usize = 392 - 236;

pub const IBV_QP_STATE: c_int = 1;

pub const IBV_SRQ_MAX_WR: c_int = 1;
pub const IBV_SRQ_LIMIT: c_int = 2;

pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_SQ_DRAINED: c_uint = 5;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_uint = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_uint = 16;

/// `IBV_FORK_UNNEEDED`: registered memory is not DMA-pinned, fork is safe.
pub const IBV_FORK_UNNEEDED: c_int = 2;

// ----- layout asserts (x86-64, rdma-core v44) -----

macro_rules! layout {
    ($t:ty, $size:expr $(, $field:ident = $off:expr)*) => {
        const _: () = assert!(size_of::<$t>() == $size, concat!("size of ", stringify!($t)));
        $(const _: () = assert!(
            offset_of!($t, $field) == $off,
            concat!("offset of ", stringify!($t), ".", stringify!($field))
        );)*
    };
}
pub(crate) use layout;

layout!(ibv_gid, 16);
layout!(
    ibv_device,
    664,
    node_type = 16,
    transport_type = 20,
    name = 24,
    dev_name = 88,
    dev_path = 152,
    ibdev_path = 408
);
layout!(
    ibv_context_ops,
    256,
    alloc_mw = 56,
    bind_mw = 64,
    dealloc_mw = 72,
    poll_cq = 88,
    req_notify_cq = 96,
    post_srq_recv = 160,
    post_send = 200,
    post_recv = 208,
    _compat_async_event = 248
);
layout!(
    ibv_context,
    328,
    ops = 8,
    cmd_fd = 264,
    async_fd = 268,
    num_comp_vectors = 272,
    mutex = 280,
    abi_compat = 320
);
layout!(
    verbs_context,
    648,
    query_port = 0,
    create_cq_ex = 200,
    priv_ = 208,
    query_device_ex = 216,
    create_qp_ex = 264,
    close_xrcd = 296,
    abi_placeholder3 = 304,
    sz = 312,
    context = 320
);
// The inline dispatch offsets from the context, as compiled into programs.
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
const _: () =
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
const _: () =
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv) == 168);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
layout!(ibv_pd, 16, context = 0, handle = 8);
layout!(
    ibv_mr,
    48,
    context = 0,
    pd = 8,
    addr = 16,
    length = 24,
    handle = 32,
    lkey = 36,
    rkey = 40
);
layout!(ibv_comp_channel, 16, context = 0, fd = 8, refcnt = 12);
layout!(
    ibv_cq,
    128,
    context = 0,
    channel = 8,
    cq_context = 16,
    handle = 24,
    cqe = 28,
    mutex = 32,
    cond = 72,
    comp_events_completed = 120,
    async_events_completed = 124
);
layout!(
    ibv_srq,
    128,
    context = 0,
    srq_context = 8,
    pd = 16,
    handle = 24,
    mutex = 32,
    cond = 72,
    events_completed = 120
);
layout!(
    ibv_qp,
    160,
    context = 0,
    qp_context = 8,
    pd = 16,
    send_cq = 24,
    recv_cq = 32,
    srq = 40,
    handle = 48,
    qp_num = 52,
    state = 56,
    qp_type = 60,
    mutex = 64,
    cond = 104,
    events_completed = 152
);
layout!(ibv_ah, 24, context = 0, pd = 8, handle = 16);
layout!(
    ibv_wc,
    48,
    wr_id = 0,
    status = 8,
    opcode = 12,
    vendor_err = 16,
    byte_len = 20,
    imm_data = 24,
    qp_num = 28,
    src_qp = 32,
    wc_flags = 36,
    pkey_index = 40,
    slid = 42,
    sl = 44,
    dlid_path_bits = 45
);
layout!(ibv_sge, 16, addr = 0, length = 8, lkey = 12);
layout!(ibv_send_wr_rdma, 16, remote_addr = 0, rkey = 8);
layout!(
    ibv_send_wr_atomic,
    32,
    remote_addr = 0,
    compare_add = 8,
    swap = 16,
    rkey = 24
);
layout!(ibv_send_wr_ud, 16, ah = 0, remote_qpn = 8, remote_qkey = 12);
layout!(ibv_send_wr_wr, 32);
layout!(ibv_send_wr_bind_mw, 48, mw = 0, rkey = 8, bind_info = 16);
layout!(
    ibv_mw,
    32,
    context = 0,
    pd = 8,
    rkey = 16,
    handle = 20,
    type_ = 24
);
layout!(ibv_mw_bind, 48, wr_id = 0, send_flags = 8, bind_info = 16);
layout!(ibv_send_wr_ext, 48);
layout!(
    ibv_send_wr,
    128,
    wr_id = 0,
    next = 8,
    sg_list = 16,
    num_sge = 24,
    opcode = 28,
    send_flags = 32,
    imm_data = 36,
    wr = 40,
    remote_srqn = 72,
    ext = 80
);
layout!(
    ibv_recv_wr,
    32,
    wr_id = 0,
    next = 8,
    sg_list = 16,
    num_sge = 24
);
layout!(
    ibv_global_route,
    24,
    dgid = 0,
    flow_label = 16,
    sgid_index = 20,
    hop_limit = 21,
    traffic_class = 22
);
layout!(
    ibv_ah_attr,
    32,
    grh = 0,
    dlid = 24,
    sl = 26,
    src_path_bits = 27,
    static_rate = 28,
    is_global = 29,
    port_num = 30
);
layout!(
    ibv_qp_cap,
    20,
    max_send_wr = 0,
    max_recv_wr = 4,
    max_send_sge = 8,
    max_recv_sge = 12,
    max_inline_data = 16
);
layout!(
    ibv_qp_attr,
    144,
    qp_state = 0,
    cur_qp_state = 4,
    path_mtu = 8,
    path_mig_state = 12,
    qkey = 16,
    rq_psn = 20,
    sq_psn = 24,
    dest_qp_num = 28,
    qp_access_flags = 32,
    cap = 36,
    ah_attr = 56,
    alt_ah_attr = 88,
    pkey_index = 120,
    alt_pkey_index = 122,
    en_sqd_async_notify = 124,
    sq_draining = 125,
    max_rd_atomic = 126,
    max_dest_rd_atomic = 127,
    min_rnr_timer = 128,
    port_num = 129,
    timeout = 130,
    retry_cnt = 131,
    rnr_retry = 132,
    alt_port_num = 133,
    alt_timeout = 134,
    rate_limit = 136
);
layout!(
    ibv_qp_init_attr,
    64,
    qp_context = 0,
    send_cq = 8,
    recv_cq = 16,
    srq = 24,
    cap = 32,
    qp_type = 52,
    sq_sig_all = 56
);
layout!(ibv_srq_attr, 12, max_wr = 0, max_sge = 4, srq_limit = 8);
layout!(ibv_srq_init_attr, 24, srq_context = 0, attr = 8);
layout!(
    ibv_port_attr,
    52,
    state = 0,
    max_mtu = 4,
    active_mtu = 8,
    gid_tbl_len = 12,
    port_cap_flags = 16,
    max_msg_sz = 20,
    bad_pkey_cntr = 24,
    qkey_viol_cntr = 28,
    pkey_tbl_len = 32,
    lid = 34,
    sm_lid = 36,
    lmc = 38,
    max_vl_num = 39,
    sm_sl = 40,
    subnet_timeout = 41,
    init_type_reply = 42,
    active_width = 43,
    active_speed = 44,
    phys_state = 45,
    link_layer = 46,
    flags = 47,
    port_cap_flags2 = 48
);
layout!(
    ibv_device_attr,
    232,
    fw_ver = 0,
    node_guid = 64,
    sys_image_guid = 72,
    max_mr_size = 80,
    page_size_cap = 88,
    vendor_id = 96,
    vendor_part_id = 100,
    hw_ver = 104,
    max_qp = 108,
    max_qp_wr = 112,
    device_cap_flags = 116,
    max_sge = 120,
    max_sge_rd = 124,
    max_cq = 128,
    max_cqe = 132,
    max_mr = 136,
    max_pd = 140,
    max_qp_rd_atom = 144,
    max_ee_rd_atom = 148,
    max_res_rd_atom = 152,
    max_qp_init_rd_atom = 156,
    max_ee_init_rd_atom = 160,
    atomic_cap = 164,
    max_ee = 168,
    max_rdd = 172,
    max_mw = 176,
    max_raw_ipv6_qp = 180,
    max_raw_ethy_qp = 184,
    max_mcast_grp = 188,
    max_mcast_qp_attach = 192,
    max_total_mcast_qp_attach = 196,
    max_ah = 200,
    max_fmr = 204,
    max_map_per_fmr = 208,
    max_srq = 212,
    max_srq_wr = 216,
    max_srq_sge = 220,
    max_pkeys = 224,
    local_ca_ack_delay = 226,
    phys_port_cnt = 227
);
layout!(
    ibv_device_attr_ex,
    400,
    orig_attr = 0,
    comp_mask = 232,
    _caps = 236,
    phys_port_cnt_ex = 396
);
layout!(ibv_async_event, 16, element = 0, event_type = 8);
layout!(
    ibv_gid_entry,
    32,
    gid = 0,
    gid_index = 16,
    port_num = 20,
    gid_type = 24,
    ndev_ifindex = 28
);
layout!(
    ibv_grh,
    40,
    version_tclass_flow = 0,
    paylen = 4,
    next_hdr = 6,
    hop_limit = 7,
    sgid = 8,
    dgid = 24
);
