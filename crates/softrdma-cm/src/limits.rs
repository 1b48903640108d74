//! How much private data each CM message carries: the one table both the
//! agent (raw IB CM limits) and the rdma_cm layer (which reserves the CMA
//! header in REQ and SIDR_REQ) consult.

use softrdma_wire::cm;
use softrdma_wire::cma;

use crate::{Error, Result};

/// The CM messages that carry consumer private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// ConnectRequest.
    Req,
    /// MsgRcptAck.
    Mra,
    /// ConnectReject.
    Rej,
    /// ConnectReply.
    Rep,
    /// ReadyToUse.
    Rtu,
    /// DisconnectRequest.
    Dreq,
    /// DisconnectReply.
    Drep,
    /// ServiceIDResReq.
    SidrReq,
    /// ServiceIDResReqResp.
    SidrRep,
}

impl Message {
    /// The message's name, for errors.
    pub const fn name(self) -> &'static str {
        match self {
            Message::Req => "REQ",
            Message::Mra => "MRA",
            Message::Rej => "REJ",
            Message::Rep => "REP",
            Message::Rtu => "RTU",
            Message::Dreq => "DREQ",
            Message::Drep => "DREP",
            Message::SidrReq => "SIDR_REQ",
            Message::SidrRep => "SIDR_REP",
        }
    }

    /// Private data bytes on the wire.
    pub const fn wire_len(self) -> usize {
        match self {
            Message::Req => cm::REQ_PRIVATE_DATA_LEN,
            Message::Mra => cm::MRA_PRIVATE_DATA_LEN,
            Message::Rej => cm::REJ_PRIVATE_DATA_LEN,
            Message::Rep => cm::REP_PRIVATE_DATA_LEN,
            Message::Rtu => cm::RTU_PRIVATE_DATA_LEN,
            Message::Dreq => cm::DREQ_PRIVATE_DATA_LEN,
            Message::Drep => cm::DREP_PRIVATE_DATA_LEN,
            Message::SidrReq => cm::SIDR_REQ_PRIVATE_DATA_LEN,
            Message::SidrRep => cm::SIDR_REP_PRIVATE_DATA_LEN,
        }
    }

    /// What an rdma_cm consumer may put in it: REQ and SIDR_REQ lose the
    /// 36-byte CMA header rdma_cm puts first (IP address families; AF_IB
    /// ids, which carry none, are not supported).
    pub const fn user_len(self) -> usize {
        match self {
            Message::Req | Message::SidrReq => self.wire_len() - cma::HEADER_LEN,
            _ => self.wire_len(),
        }
    }

    /// Fails unless `len` bytes fit in `max`.
    pub(crate) fn check(self, len: usize, max: usize) -> Result<()> {
        if len > max {
            return Err(Error::PrivateDataTooLong {
                message: self.name(),
                max,
                len,
            });
        }
        Ok(())
    }

    /// `data` zero-padded to the message's wire array, or an error when it
    /// does not fit.
    pub(crate) fn fill<const N: usize>(self, data: &[u8]) -> Result<[u8; N]> {
        debug_assert_eq!(N, self.wire_len());
        self.check(data.len(), N)?;
        let mut a = [0u8; N];
        a[..data.len()].copy_from_slice(data);
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_limits_are_rdma_cm_ones() {
        assert_eq!(Message::Req.user_len(), 56);
        assert_eq!(Message::Rep.user_len(), 196);
        assert_eq!(Message::Rej.user_len(), 148);
        assert_eq!(Message::Dreq.user_len(), 220);
        assert_eq!(Message::Drep.user_len(), 224);
        assert_eq!(Message::SidrReq.user_len(), 180);
        assert_eq!(Message::SidrRep.user_len(), 136);
        let e = Message::Rep.fill::<196>(&[0; 197]).unwrap_err();
        assert_eq!(e.errno(), 22);
    }
}
