//! What the simulator needs of a node, and the engine as one.

use std::net::SocketAddr;

use softrdma_wire::Endpoints;

use crate::engine::{Engine, RxMeta};
use crate::requester::Transmit;
use crate::time::Instant;

/// A node of the simulated network: a bare [`Engine`], or a driver core that
/// runs one (its progress loop, its held ACKs, its direct path) over a
/// simulated port.
///
/// The network calls these in a fixed order within one instant (see the
/// [module documentation](super)): deliveries with [`SimNode::handle_packet`],
/// then [`SimNode::handle_timeout`] on every node, then
/// [`SimNode::poll_transmit`] until it returns `None`. A node may queue a
/// delivered packet and handle it in `handle_timeout`; it must then report
/// `now` from [`SimNode::poll_timeout`] until it has.
pub trait SimNode {
    /// The node's address: packets to this IP address are delivered to it.
    fn local_addr(&self) -> SocketAddr;

    /// A packet arrives, with what its IP header said ([`RxMeta`]).
    fn handle_packet(&mut self, now: Instant, ep: Endpoints, meta: RxMeta, data: &[u8]);

    /// Runs the work due at `now`.
    fn handle_timeout(&mut self, now: Instant);

    /// The next packet to send, whole in `buf[..len]` (no payload left by
    /// reference). With `gather`, a node that can build packets with their
    /// payload by reference does so and copies it in before it returns:
    /// the bytes must be the same either way.
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8], gather: bool) -> Option<Transmit>;

    /// When [`SimNode::handle_timeout`] must next be called.
    fn poll_timeout(&mut self) -> Option<Instant>;
}

impl SimNode for Engine {
    fn local_addr(&self) -> SocketAddr {
        self.config().local
    }

    fn handle_packet(&mut self, now: Instant, ep: Endpoints, meta: RxMeta, data: &[u8]) {
        self.handle_packet_meta(now, ep, meta, data);
    }

    fn handle_timeout(&mut self, now: Instant) {
        Engine::handle_timeout(self, now);
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8], gather: bool) -> Option<Transmit> {
        if !gather {
            return Engine::poll_transmit(self, now, buf);
        }
        let mut t = self.poll_transmit_gather(now, buf)?;
        if t.payload.is_some() {
            // A simulator fault, not outside input: the engine offered a
            // payload by reference it cannot read back.
            assert!(
                self.copy_payload(&t, buf),
                "a payload sent by reference could not be copied: {t:?}"
            );
            t.payload = None;
        }
        Some(t)
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        Engine::poll_timeout(self)
    }
}
