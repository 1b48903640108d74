//! Whether a same-host peer may be handed one of this device's regions for
//! direct access (the driver's grants, docs/shm.md): the checks the
//! responder makes on every request — QP type, state and access rights,
//! the requester being the QP's connected peer, the region's key, PD and
//! rights — made once, by the target, for the whole region.

use crate::handle::{PdHandle, Qpn, Rkey};
use std::net::IpAddr;

use crate::qp_attr::{AccessFlags, QpType};
use crate::rules::{self, RemoteDenied};

use super::Engine;

/// What a granted region is: the facts the peer checks each direct
/// operation against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantFacts {
    pub pd: PdHandle,
    /// The region's access flags.
    pub access: AccessFlags,
    /// The QP's access flags.
    pub qp_access: AccessFlags,
    pub iova: u64,
    pub len: u64,
}

/// Why a grant is refused (or no longer holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantRefusal {
    /// No such QP.
    NoQp,
    /// UD, or UC asked for anything but WRITE.
    QpType,
    /// The QP does not accept requests in its state.
    QpState,
    /// The asker is not the QP's connected peer (address or QPN).
    NotConnected,
    /// The QP's access flags lack the right.
    QpAccess,
    /// No valid region has the rkey.
    NoRegion,
    /// The region is in another PD than the QP.
    RegionPd,
    /// The region's access flags lack the right.
    RegionAccess,
}

impl Engine {
    /// Whether the peer at `peer`, on its QP `peer_qpn`, may reach region
    /// `rkey` of this device directly with right `need` through QP `qpn`.
    pub fn check_grant(
        &self,
        qpn: Qpn,
        peer: IpAddr,
        peer_qpn: Qpn,
        rkey: Rkey,
        need: AccessFlags,
    ) -> Result<GrantFacts, GrantRefusal> {
        self.check_grant_qp(qpn, peer, peer_qpn, need)?;
        let q = self.qps.get(&qpn).ok_or(GrantRefusal::NoQp)?;
        let mr = self
            .res
            .rkeys
            .get(&rkey)
            .and_then(|lkey| self.res.mrs.get(lkey))
            .ok_or(GrantRefusal::NoRegion)?;
        // The responder's remote access rule, for the whole region.
        let view = mr.view();
        rules::check_remote(
            q.attr.qp_access_flags,
            q.pd,
            need,
            view.iova,
            view.len.max(1),
            || Some(view),
        )
        .map_err(|e| match e {
            RemoteDenied::QpAccess => GrantRefusal::QpAccess,
            RemoteDenied::NoRegion | RemoteDenied::Range | RemoteDenied::WindowQp => {
                GrantRefusal::NoRegion
            }
            RemoteDenied::Pd => GrantRefusal::RegionPd,
            RemoteDenied::RegionAccess => GrantRefusal::RegionAccess,
        })?;
        Ok(GrantFacts {
            pd: mr.pd,
            access: mr.access,
            qp_access: q.attr.qp_access_flags,
            iova: mr.iova,
            len: mr.len,
        })
    }

    /// The QP half of [`Engine::check_grant`]: still true after a modify
    /// means the grants made through `qpn` still hold.
    pub fn check_grant_qp(
        &self,
        qpn: Qpn,
        peer: IpAddr,
        peer_qpn: Qpn,
        need: AccessFlags,
    ) -> Result<(), GrantRefusal> {
        let q = self.qps.get(&qpn).ok_or(GrantRefusal::NoQp)?;
        match q.qp_type {
            QpType::Rc => {}
            QpType::Uc if need == AccessFlags::REMOTE_WRITE => {}
            _ => return Err(GrantRefusal::QpType),
        }
        // The responder's rule for the states that take requests.
        if !rules::responder_receives(q.state) {
            return Err(GrantRefusal::QpState);
        }
        if q.dest.map(|d| d.ip()) != Some(peer) || q.attr.dest_qp_num != peer_qpn {
            return Err(GrantRefusal::NotConnected);
        }
        if !q.attr.qp_access_flags.contains(need) {
            return Err(GrantRefusal::QpAccess);
        }
        Ok(())
    }
}
