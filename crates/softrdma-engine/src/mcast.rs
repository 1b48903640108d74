//! UD multicast: which QPs are attached to which group (`ibv_attach_mcast`).
//!
//! A group is a multicast GID; for RoCEv2 its IP address (IPv4-mapped
//! `::ffff:224.0.0.0/4`, or IPv6 `ff00::/8`) is the destination IP of
//! every datagram sent to it, with DQPN [`MCAST_QPN`]. Every QP attached
//! to the group receives each such datagram (its P_Key and Q_Key checked
//! as for any UD packet), the sending QP included when it is attached, as
//! rxe delivers. The rules (which GIDs are multicast, which QPs may be
//! attached, the limits) are in [`crate::rules`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::handle::Qpn;
use crate::rules;
use crate::{Result, VerbsError};

pub use crate::rules::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH, MCAST_QPN};

/// The groups of one device and their attached QPs.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    groups: BTreeMap<IpAddr, Vec<Qpn>>,
    total: usize,
}

impl McastTable {
    /// Attaches `qpn` to `group`; attaching twice is not an error (rxe's
    /// rule). True when the group is new on this device.
    pub fn attach(&mut self, qpn: Qpn, group: IpAddr) -> Result<bool> {
        let new_group = !self.groups.contains_key(&group);
        if let Some(qps) = self.groups.get(&group) {
            if qps.contains(&qpn) {
                return Ok(false);
            }
        }
        rules::check_mcast_limits(
            self.groups.len() + new_group as usize,
            self.groups.get(&group).map_or(0, Vec::len) + 1,
            self.total + 1,
        )?;
        self.groups.entry(group).or_default().push(qpn);
        self.total += 1;
        Ok(new_group)
    }

    /// Detaches `qpn` from `group` (EINVAL when it was not attached). True
    /// when the group has no QP left on this device.
    pub fn detach(&mut self, qpn: Qpn, group: IpAddr) -> Result<bool> {
        let Some(qps) = self.groups.get_mut(&group) else {
            return Err(VerbsError::inval(format!(
                "detach_mcast: QP {:#x} is not attached to {group}",
                qpn.raw()
            )));
        };
        let Some(i) = qps.iter().position(|&q| q == qpn) else {
            return Err(VerbsError::inval(format!(
                "detach_mcast: QP {:#x} is not attached to {group}",
                qpn.raw()
            )));
        };
        qps.swap_remove(i);
        self.total -= 1;
        let empty = qps.is_empty();
        if empty {
            self.groups.remove(&group);
        }
        Ok(empty)
    }

    /// Detaches a QP that is going away from every group.
    pub fn forget_qp(&mut self, qpn: Qpn) {
        self.groups.retain(|_, qps| {
            let before = qps.len();
            qps.retain(|&q| q != qpn);
            self.total -= before - qps.len();
            !qps.is_empty()
        });
    }

    /// The QPs attached to `group`, copied into `out`.
    pub fn members(&self, group: IpAddr, out: &mut Vec<Qpn>) {
        out.clear();
        if let Some(qps) = self.groups.get(&group) {
            out.extend_from_slice(qps);
        }
    }

    /// The groups with at least one attached QP.
    pub fn groups(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.groups.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u8) -> IpAddr {
        IpAddr::from([239, 1, 1, n])
    }

    #[test]
    fn attach_detach_and_limits() {
        let mut t = McastTable::default();
        let (a, b) = (Qpn::from_raw(0x11), Qpn::from_raw(0x12));
        assert_eq!(t.attach(a, g(1)), Ok(true));
        assert_eq!(t.attach(a, g(1)), Ok(false));
        assert_eq!(t.attach(b, g(1)), Ok(false));
        let mut m = Vec::new();
        t.members(g(1), &mut m);
        assert_eq!(m, vec![a, b]);
        assert_eq!(t.detach(a, g(1)), Ok(false));
        assert!(t.detach(a, g(1)).is_err());
        assert!(t.detach(a, g(2)).is_err());
        assert_eq!(t.detach(b, g(1)), Ok(true));
        assert_eq!(t.groups().count(), 0);
        for i in 0..MAX_MCAST_GRP as u32 {
            let grp = IpAddr::from((0xEF01_0000u32 + i).to_be_bytes());
            assert_eq!(t.attach(a, grp), Ok(true));
        }
        let e = t.attach(a, g(250)).unwrap_err();
        assert_eq!(e.errno(), crate::errno::ENOMEM);
        t.forget_qp(a);
        assert_eq!(t.groups().count(), 0);
        assert_eq!(t.total, 0);
        for i in 0..MAX_MCAST_QP_ATTACH as u32 {
            t.attach(Qpn::from_raw(0x100 + i), g(3)).unwrap();
        }
        assert_eq!(
            t.attach(Qpn::from_raw(0x99), g(3)).unwrap_err().errno(),
            crate::errno::ENOMEM
        );
    }
}
