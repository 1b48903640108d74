//! `rdma_join_multicast`, `rdma_join_multicast_ex` and
//! `rdma_leave_multicast` for UD ids, as librdmacm and the kernel's
//! rdma_cm give them on RoCEv2: the group's MGID is the IPv4-mapped
//! address `::ffff:a.b.c.d` (the kernel's `cma_iboe_set_mgid` for
//! RoCEv2's GID type; an IPv6 group is its own address), the id's QP is
//! attached to it (`ibv_attach_mcast`, unless the join is send-only, as
//! librdmacm's `ucma_process_join` skips it), and MULTICAST_JOIN follows
//! at once (no SA or IGMP exchange to wait for: the device's UDP port
//! joins the IP group itself) with `param.ud` holding an address handle
//! towards the group, QPN 0xFFFFFF and the UDP port space's Q_Key, and
//! the join's context in `param.ud.private_data`, as librdmacm sets it.

use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::ptr::null_mut;

use super::abi::*;
use super::events::{self, EventData, Param};
use super::qp::RDMA_UDP_QKEY;
use super::{addr, complete, Id};
use crate::abi::*;

/// `IBV_QPT_UD`.
const IBV_QPT_UD: u32 = 4;

/// One group an id joined.
pub struct Joined {
    /// The group's IP address, as the application gave it.
    pub ip: IpAddr,
    /// Its MGID.
    pub mgid: [u8; 16],
    /// The QP attached to it (0: none, or a send-only join).
    pub qp: usize,
}

/// The MGID of a multicast address on RoCEv2, or None for an address that
/// is not multicast (the wildcard included).
pub fn mgid_of(ip: IpAddr) -> Option<[u8; 16]> {
    match ip {
        IpAddr::V4(v4) if v4.is_multicast() => Some(v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) if v6.is_multicast() => Some(v6.octets()),
        _ => None,
    }
}

/// A join of `sa` by `id` (`send_only`: the QP is not attached).
///
/// # Safety
/// `sa` is NULL or a readable sockaddr; the id's QP, if any, is live.
pub unsafe fn join(
    id: &mut Id,
    sa: *const libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let ip = unsafe { addr::from_c(sa) }.ok_or(libc::EINVAL)?.ip();
    // As the kernel: a UD id bound to a device (a bind or a resolve).
    if id.ctx().is_none() || id.c.qp_type != IBV_QPT_UD {
        return Err(libc::EINVAL);
    }
    let mgid = mgid_of(ip).ok_or(libc::EINVAL)?;
    let mut qp = 0;
    if !send_only && !id.c.qp.is_null() {
        let gid = ibv_gid::from_raw(mgid);
        // SAFETY: the id's live QP and a GID on this stack frame.
        let rc = unsafe { crate::verbs::ibv_attach_mcast(id.c.qp, &gid, 0) };
        if rc != 0 {
            return Err(rc);
        }
        qp = id.c.qp as usize;
    }
    id.state().mcast.push(Joined { ip, mgid, qp });
    // SAFETY: all-zero is a valid ibv_ah_attr (integers and a GID union).
    let mut ah: ibv_ah_attr = unsafe { std::mem::zeroed() };
    ah.grh.dgid = ibv_gid::from_raw(mgid);
    // IP multicast's default TTL.
    ah.grh.hop_limit = 1;
    ah.is_global = 1;
    ah.port_num = id.c.port_num;
    let ev = EventData {
        kind: RDMA_CM_EVENT_MULTICAST_JOIN,
        status: 0,
        listen_id: null_mut(),
        private_data: Vec::new(),
        param: Param::Ud(rdma_ud_param {
            private_data: context.cast_const(),
            private_data_len: 0,
            ah_attr: ah,
            qp_num: softrdma::MCAST_QPN,
            qkey: RDMA_UDP_QKEY,
        }),
    };
    events::push(id.c.channel, id.as_ptr(), ev);
    complete(id)
}

/// `rdma_leave_multicast` of `sa` (EADDRNOTAVAIL when `id` did not join
/// it, as librdmacm): the QP is detached first.
///
/// # Safety
/// `sa` is NULL or a readable sockaddr; the id's QP, if any, is live.
pub unsafe fn leave(id: &mut Id, sa: *const libc::sockaddr) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let ip = unsafe { addr::from_c(sa) }.ok_or(libc::EINVAL)?.ip();
    let j = {
        let mut st = id.state();
        let i = st
            .mcast
            .iter()
            .position(|j| j.ip == ip)
            .ok_or(libc::EADDRNOTAVAIL)?;
        st.mcast.remove(i)
    };
    // SAFETY: the id's QP, live per the contract.
    unsafe { detach(id, &j) };
    Ok(())
}

/// Detaches the id's QP from a group it joined (when that QP is still the
/// id's: a QP destroyed meanwhile left its groups with it).
///
/// # Safety
/// The id's QP, if any, is live.
pub unsafe fn detach(id: &Id, j: &Joined) {
    if j.qp != 0 && j.qp == id.c.qp as usize {
        let gid = ibv_gid::from_raw(j.mgid);
        // SAFETY: the id's live QP and a GID on this stack frame.
        let _ = unsafe { crate::verbs::ibv_detach_mcast(id.c.qp, &gid, 0) };
    }
}

/// `rdma_join_multicast_ex`'s attributes: the address and whether the
/// join is send-only, or EINVAL as librdmacm checks them.
///
/// # Safety
/// `a` is NULL or readable.
pub unsafe fn ex_attr(
    a: *const rdma_cm_join_mc_attr_ex,
) -> Result<(*const libc::sockaddr, bool), c_int> {
    // SAFETY: per the contract.
    let a = unsafe { a.as_ref() }.ok_or(libc::EINVAL)?;
    let known = RDMA_CM_JOIN_MC_ATTR_RESERVED - 1;
    if a.comp_mask & !known != 0
        || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
        || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
        || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        || a.addr.is_null()
    {
        return Err(libc::EINVAL);
    }
    Ok((
        a.addr,
        a.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mgids_as_the_kernel_maps_them_for_rocev2() {
        let m = mgid_of("239.1.1.1".parse().unwrap()).unwrap();
        assert_eq!(m, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1]);
        let v6: IpAddr = "ff0e::1".parse().unwrap();
        assert_eq!(mgid_of(v6).unwrap()[..2], [0xff, 0x0e]);
        assert!(mgid_of("10.0.0.1".parse().unwrap()).is_none());
        assert!(mgid_of("0.0.0.0".parse().unwrap()).is_none());
    }
}
