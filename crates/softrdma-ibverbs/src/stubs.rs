//! Symbols that exist so that programs and libraries load, and that fail
//! cleanly when called.
//!
//! The loader binds every imported symbol at start-up (the Debian binaries
//! are linked with BIND_NOW), so whatever perftest, the rdma-core examples
//! and the libraries they link (libmlx5, libefa, librdmacm) import must be
//! here with its version, even what softrdma cannot do. Public verbs that
//! softrdma does not implement return EOPNOTSUPP (or NULL with errno
//! EOPNOTSUPP); the provider interface (`ibv_cmd_*`, `verbs_*`,
//! IBVERBS_PRIVATE_34) talks to the kernel's uverbs, which softrdma
//! replaces, so it returns ENOSYS (or NULL with errno ENOSYS).
//! `verbs_register_driver_34`, which provider libraries call from their
//! constructors, does nothing: softrdma never loads providers.
//!
//! A stub declares fewer parameters than its C prototype; under the x86-64
//! System V convention the callee may ignore trailing arguments, and the
//! return register carries the int or pointer result.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use crate::ffi::{fail_with, set_errno};

/// Public verbs softrdma does not implement: return EOPNOTSUPP.
macro_rules! eopnotsupp_int {
    ($($name:ident: $why:literal;)*) => {$(
        pub extern "C" fn $name() -> c_int {
            fail_with(stringify!($name), libc::EOPNOTSUPP, $why)
        }
    )*};
}

/// Public verbs softrdma does not implement: NULL with errno EOPNOTSUPP.
macro_rules! eopnotsupp_ptr {
    ($($name:ident: $why:literal;)*) => {$(
        pub extern "C" fn $name() -> *mut c_void {
            fail_with(stringify!($name), libc::EOPNOTSUPP, $why);
            null_mut()
        }
    )*};
}

/// Provider interface: ENOSYS.
macro_rules! enosys_int {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::ENOSYS);
            libc::ENOSYS
        }
    )*};
}

/// Provider interface returning a pointer: NULL with errno ENOSYS.
macro_rules! enosys_ptr {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(libc::ENOSYS);
            null_mut()
        }
    )*};
}

/// Functions without a result: do nothing.
macro_rules! noop {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() {}
    )*};
}

eopnotsupp_int! {
    ibv_resolve_eth_l2_from_gid: "no Ethernet L2 addresses (softrdma runs over UDP)";
}

eopnotsupp_ptr! {
    ibv_reg_dmabuf_mr: "dma-buf memory regions are not supported";
    ibv_import_device: "sharing contexts between processes is not supported";
    ibv_import_pd: "sharing objects between processes is not supported";
    ibv_import_mr: "sharing objects between processes is not supported";
    ibv_import_dm: "device memory is not supported";
}

/// `ibv_query_qp_data_in_order`: 0, in-order data placement is not promised.
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

noop!(
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
    // Kernel-ABI struct conversions for librdmacm, which needs the kernel's
    // rdma_cm anyway: never reached with softrdma.
    ibv_copy_qp_attr_from_kern,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    // Provider registration and helpers.
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_init_cq,
    verbs_uninit_context,
    __verbs_log,
);

enosys_ptr!(_verbs_init_and_alloc_context, verbs_open_device);

enosys_int!(
    execute_ioctl,
    ibv_read_ibdev_sysfs_file,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

/// `__ioctl_final_num_attrs(num_attrs, link)`: the attribute count unchanged.
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

// `verbs_allow_disassociate_destroy`, a provider-private `bool` that stays
// false, is data: build.rs defines it in assembly with its version.
