//! QP1, the General Services Interface: the UD queue pair every port has
//! for management datagrams (MADs), the connection manager's among them.
//!
//! QP1 is not an application QP: it has no CQ, no receive queue the
//! application fills and no verbs of its own. A MAD that arrives for it is
//! checked with the rules QP1 has (a UD SEND_ONLY with the GSI Q_Key,
//! exactly 256 bytes of payload: `softrdma_wire::mad::gmp_payload`; a P_Key
//! of the default partition, the only one in this port's table) and queued
//! for the driver's management agents ([`crate::Engine::poll_gsi`]); a MAD
//! they send leaves as a UD SEND_ONLY from QP1 ([`crate::Engine::send_gsi`]).
//! Both queues are bounded: a peer that floods QP1 loses its excess MADs
//! (counted in `gsi_mads_dropped`), as a real port's GSI drops MADs it has no
//! buffer for, and the CM's retries recover from it.

use std::collections::VecDeque;
use std::net::SocketAddr;

use softrdma_wire::mad::{gmp_packet, gmp_payload, GSI_QPN, MAD_LEN};
use softrdma_wire::{Endpoints, PacketRepr, Psn};

use crate::counters::Counters;
use crate::handle::Qpn;
use crate::requester::Transmit;

/// MADs waiting for the agents, at most.
pub const GSI_RX_MAX: usize = 256;
/// MADs waiting to be sent, at most.
pub const GSI_TX_MAX: usize = 256;
/// The P_Key of the default partition, the one QP1 sends with.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// A MAD received on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GsiMad {
    /// Where it came from (IP address and UDP source port).
    pub from: SocketAddr,
    /// The sender's QP (its DETH SrcQP; 1 when the sender is a GSI).
    pub src_qpn: u32,
    /// The P_Key it carried.
    pub pkey: u16,
    pub mad: Box<[u8; MAD_LEN]>,
}

/// QP1's queues.
#[derive(Debug, Default)]
pub(crate) struct Gsi {
    rx: VecDeque<GsiMad>,
    tx: VecDeque<(Transmit, Vec<u8>)>,
    /// PSN of the next MAD sent (UD: the receiver does not check it).
    psn: u32,
}

impl Gsi {
    /// A packet addressed to QP1 (already ICRC-checked and parsed): queued
    /// for the agents if it is a MAD QP1 takes, else counted as dropped.
    pub fn receive(&mut self, c: &mut Counters, from: SocketAddr, pkt: &PacketRepr<'_>) {
        let Ok(mad) = gmp_payload(pkt) else {
            c.gsi_mads_dropped += 1;
            return;
        };
        if !crate::engine::pkey_matches(pkt.bth.pkey, DEFAULT_PKEY) {
            c.pkey_violations += 1;
            c.gsi_mads_dropped += 1;
            return;
        }
        if self.rx.len() >= GSI_RX_MAX {
            c.gsi_mads_dropped += 1;
            return;
        }
        let src_qpn = pkt.headers.deth().map_or(0, |d| d.src_qp);
        c.gsi_mads_rcvd += 1;
        self.rx.push_back(GsiMad {
            from,
            src_qpn,
            pkey: pkt.bth.pkey,
            mad: Box::new(*mad),
        });
    }

    pub fn poll_rx(&mut self) -> Option<GsiMad> {
        self.rx.pop_front()
    }

    /// Builds the packet carrying `mad` from QP1 at `ep.src` to the GSI at
    /// `ep.dst`; false when the send queue is full.
    pub fn send(&mut self, c: &mut Counters, ep: Endpoints, mad: &[u8; MAD_LEN]) -> bool {
        if self.tx.len() >= GSI_TX_MAX {
            return false;
        }
        let mut repr = gmp_packet(GSI_QPN, Psn::new(self.psn), mad);
        repr.bth.pkey = DEFAULT_PKEY;
        self.psn = self.psn.wrapping_add(1) & softrdma_wire::bth::QPN_MASK;
        let mut buf = vec![0u8; repr.buffer_len()];
        let Ok(len) = repr.emit(&mut buf, &ep) else {
            return false;
        };
        buf.truncate(len);
        c.gsi_mads_sent += 1;
        let t = Transmit {
            len,
            endpoints: ep,
            qpn: Qpn::from_raw(GSI_QPN),
            ecn: softrdma_wire::Ecn::NotEct,
            payload: None,
        };
        self.tx.push_back((t, buf));
        true
    }

    /// The next built MAD packet to send.
    pub fn poll_tx(&mut self) -> Option<(Transmit, Vec<u8>)> {
        self.tx.pop_front()
    }
}
