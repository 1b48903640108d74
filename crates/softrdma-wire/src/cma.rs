//! The rdma_cm conventions on top of the IB CM (IBTA vol. 1, annex A11,
//! "RDMA IP CM Service", as the Linux kernel's rdma_cm implements it).
//!
//! - The service ID of an IP port is `0x0000_0000_0100_0000 | port space << 16
//!   | port`, the port space being the IP protocol (TCP, UDP) or rdma_cm's IB space.
//! - The REQ's private data starts with a 36-byte [`CmaHeader`]: version 0,
//!   the IP version in the top nibble of byte 1, the source port, then the
//!   source and destination addresses, each in a 16-byte slot (an IPv4
//!   address in the slot's last four bytes, the rest zero). The consumer's
//!   own private data follows it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::util::{be16, check, put16};
use crate::{Error, Result};

/// rdma_cm's TCP port space (RC connections).
pub const PS_TCP: u16 = 0x0106;
/// rdma_cm's UDP port space (UD, resolved with SIDR).
pub const PS_UDP: u16 = 0x0111;
/// rdma_cm's IB port space (any QP type).
pub const PS_IB: u16 = 0x013F;
/// The prefix of every rdma_cm service ID.
pub const SERVICE_ID_PREFIX: u64 = 0x0000_0000_0100_0000;
/// The bits of a service ID that hold the port space and port.
const SERVICE_ID_MASK: u64 = 0xFFFF_FFFF_FF00_0000;

/// The service ID rdma_cm uses for `port` in `port_space`.
pub const fn service_id(port_space: u16, port: u16) -> u64 {
    SERVICE_ID_PREFIX | ((port_space as u64 & 0xFF) << 16) | port as u64
}

/// The port space and port of an rdma_cm service ID, or `None` when the ID
/// does not carry the rdma_cm prefix.
pub const fn parse_service_id(sid: u64) -> Option<(u16, u16)> {
    if sid & SERVICE_ID_MASK != SERVICE_ID_PREFIX {
        return None;
    }
    Some((0x0100 | ((sid >> 16) & 0xFF) as u16, sid as u16))
}

/// Length of the CMA header at the start of a REQ's private data.
pub const HEADER_LEN: usize = 36;
/// The CMA header version the kernel writes and accepts.
pub const CMA_VERSION: u8 = 0x00;
/// Private data left to the consumer of a REQ after the CMA header.
pub const REQ_USER_DATA_LEN: usize = crate::cm::REQ_PRIVATE_DATA_LEN - HEADER_LEN;

/// The addressing rdma_cm puts in front of a REQ's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's IP address.
    pub src: IpAddr,
    /// The passive side's IP address.
    pub dst: IpAddr,
    /// The active side's port (the passive side's is in the service ID).
    pub src_port: u16,
}

impl CmaHeader {
    /// Parses the header at the start of `b` (a REQ's private data).
    pub fn parse(b: &[u8]) -> Result<Self> {
        check("CMA header", b, HEADER_LEN)?;
        let bad = |field, value: u8| Error::BadField {
            header: "CMA header",
            field,
            value: value.into(),
        };
        if b[0] != CMA_VERSION {
            return Err(bad("version", b[0]));
        }
        let addr = |slot: &[u8]| -> Result<IpAddr> {
            match b[1] >> 4 {
                4 => Ok(Ipv4Addr::new(slot[12], slot[13], slot[14], slot[15]).into()),
                6 => {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&slot[..16]);
                    Ok(Ipv6Addr::from(a).into())
                }
                v => Err(bad("ip_version", v)),
            }
        };
        Ok(CmaHeader {
            src_port: be16(&b[2..]),
            src: addr(&b[4..20])?,
            dst: addr(&b[20..36])?,
        })
    }

    /// Writes the header into `b[..36]`; both addresses must be of one family.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if b.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let b = &mut b[..HEADER_LEN];
        b.fill(0);
        b[0] = CMA_VERSION;
        put16(&mut b[2..], self.src_port);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&s.octets());
                b[20..36].copy_from_slice(&d.octets());
            }
            _ => {
                return Err(Error::NotRoce(
                    "CMA header addresses are of different families",
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_follow_the_rdma_cm_convention() {
        assert_eq!(service_id(PS_TCP, 7471), 0x0000_0000_0106_1D2F);
        assert_eq!(service_id(PS_UDP, 1), 0x0000_0000_0111_0001);
        assert_eq!(service_id(PS_IB, 0xFFFF), 0x0000_0000_013F_FFFF);
        for ps in [PS_TCP, PS_UDP, PS_IB] {
            assert_eq!(parse_service_id(service_id(ps, 4791)), Some((ps, 4791)));
        }
        assert_eq!(parse_service_id(0x0200_0000_0000_0001), None);
    }

    #[test]
    fn ipv4_header_bytes() {
        let h = CmaHeader {
            src: Ipv4Addr::new(10, 0, 0, 1).into(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
            src_port: 0x1234,
        };
        let mut b = [0xEEu8; HEADER_LEN];
        h.emit(&mut b).unwrap();
        let mut want = [0u8; HEADER_LEN];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0x12, 0x34]);
        want[16..20].copy_from_slice(&[10, 0, 0, 1]);
        want[32..36].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(b, want);
        assert_eq!(CmaHeader::parse(&b).unwrap(), h);
    }
}
