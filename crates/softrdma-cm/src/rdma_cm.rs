//! The rdma_cm conventions on the IB CM, still sans I/O: service IDs from
//! port spaces, the CMA header in front of a REQ's private data, the user
//! private-data limits, and REQ parameters from `rdma_connect`'s.

use std::net::{IpAddr, SocketAddr};

use softrdma_wire::cm::CmPath;
use softrdma_wire::cma::{self, CmaHeader};
use softrdma_wire::Psn;

use crate::limits::Message;
use crate::{ConnectParams, Error, Result};

/// An rdma_cm port space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// RDMA_PS_TCP: RC connections.
    Tcp,
    /// RDMA_PS_UDP: UD, resolved with SIDR.
    Udp,
    /// RDMA_PS_IB: any QP type.
    Ib,
}

impl PortSpace {
    /// The port space's number.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::Tcp => cma::PS_TCP,
            PortSpace::Udp => cma::PS_UDP,
            PortSpace::Ib => cma::PS_IB,
        }
    }

    /// The service ID of `port` in this space.
    pub const fn service_id(self, port: u16) -> u64 {
        cma::service_id(self.code(), port)
    }
}

/// The GID of an IP address on RoCEv2 (IPv4 ones IPv4-mapped).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A REQ's private data: the CMA header (`src` is the active side's
/// address and port, `dst` the passive side's address), then at most
/// [`Message::user_len`] bytes of the consumer's own (56).
pub fn req_private_data(src: SocketAddr, dst: IpAddr, user: &[u8]) -> Result<Vec<u8>> {
    headed_private_data(Message::Req, src, dst, user)
}

/// A SIDR_REQ's private data: the same CMA header as a REQ's, then at
/// most 180 bytes of the consumer's.
pub fn sidr_req_private_data(src: SocketAddr, dst: IpAddr, user: &[u8]) -> Result<Vec<u8>> {
    headed_private_data(Message::SidrReq, src, dst, user)
}

fn headed_private_data(m: Message, src: SocketAddr, dst: IpAddr, user: &[u8]) -> Result<Vec<u8>> {
    m.check(user.len(), m.user_len())?;
    let h = CmaHeader {
        src: src.ip(),
        dst,
        src_port: src.port(),
    };
    let mut pd = vec![0u8; cma::HEADER_LEN];
    h.emit(&mut pd)?;
    pd.extend_from_slice(user);
    Ok(pd)
}

/// Splits a received REQ's private data into the CMA header and the
/// consumer's bytes (all 56 of them: the wire carries no length).
pub fn parse_req_private_data(pd: &[u8]) -> Result<(CmaHeader, &[u8])> {
    let h = CmaHeader::parse(pd)?;
    Ok((h, pd.get(cma::HEADER_LEN..).unwrap_or(&[])))
}

/// Checks consumer private data for `message` against rdma_cm's limit
/// (the API maps the error to EINVAL).
pub fn check_user_private_data(message: Message, len: usize) -> Result<()> {
    message.check(len, message.user_len())
}

/// `rdma_conn_param`'s fields that reach the REQ.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// The consumer's private data (at most 56 bytes in a REQ).
    pub private_data: Vec<u8>,
    /// READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests the local QP keeps outstanding.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
}

/// The REQ parameters rdma_cm sends for `rdma_connect` from `src` to
/// `dst` in port space `ps` with QP `qpn` starting at `psn`.
pub fn connect_params(
    ps: PortSpace,
    src: SocketAddr,
    dst: SocketAddr,
    qpn: u32,
    psn: Psn,
    p: &ConnParam,
) -> Result<ConnectParams> {
    if src.is_ipv4() != dst.is_ipv4() {
        return Err(Error::Wire(softrdma_wire::Error::NotRoce(
            "source and destination of different families",
        )));
    }
    let path = CmPath {
        local_gid: gid_of(src.ip()),
        remote_gid: gid_of(dst.ip()),
        hop_limit: 64,
        subnet_local: true,
        ..CmPath::default()
    };
    Ok(ConnectParams {
        service_id: ps.service_id(dst.port()),
        qpn,
        starting_psn: psn,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        path,
        private_data: req_private_data(src, dst.ip(), &p.private_data)?,
        ..ConnectParams::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_private_data_carries_the_header_then_the_user_bytes() {
        let src: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let dst: IpAddr = "10.0.0.2".parse().unwrap();
        let pd = req_private_data(src, dst, b"hello").unwrap();
        let (h, user) = parse_req_private_data(&pd).unwrap();
        assert_eq!((h.src, h.dst, h.src_port), (src.ip(), dst, 40000));
        assert_eq!(user, b"hello");
        let e = req_private_data(src, dst, &[0; 57]).unwrap_err();
        assert_eq!(e.errno(), 22);
        assert!(req_private_data(src, dst, &[0; 56]).is_ok());
    }
}
