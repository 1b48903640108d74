//! The device core as a node of the engine's simulated network
//! (`softrdma_engine::sim::SimNet<DeviceCore<SimPort>>`): the network
//! delivers into the port's inbox, the core's own progress loop takes the
//! packets in, runs the timers and sends into the outbox, and the network
//! takes them from there — the loop, held ACKs and direct path of
//! production, under the simulator's clock.

use std::net::SocketAddr;

use softrdma_engine::sim::SimNode;
use softrdma_engine::{Instant, RxMeta, Transmit};
use softrdma_wire::Endpoints;

use crate::sim_port::SimPort;
use crate::DeviceCore;

impl SimNode for DeviceCore<SimPort> {
    fn local_addr(&self) -> SocketAddr {
        self.engine.config().local
    }

    fn handle_packet(&mut self, _: Instant, ep: Endpoints, meta: RxMeta, data: &[u8]) {
        self.port.deliver(ep.src, meta, data.to_vec());
    }

    /// What a driver's background thread does when it wakes: full progress.
    fn handle_timeout(&mut self, now: Instant) {
        self.progress(now, true);
    }

    /// The outbox first; when it is empty, what the engine has ready (the
    /// harness may have called the engine directly) goes through the
    /// core's transmit path into it.
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8], _gather: bool) -> Option<Transmit> {
        let p = match self.port.take_sent() {
            Some(p) => p,
            None => {
                self.transmit(now);
                self.port.take_sent()?
            }
        };
        // The simulator's buffer holds any packet (a fault of its own if not).
        buf[..p.data.len()].copy_from_slice(&p.data);
        Some(Transmit {
            len: p.data.len(),
            endpoints: p.endpoints,
            qpn: p.qpn,
            ecn: p.ecn,
            payload: None,
        })
    }

    /// Packets delivered and not yet taken in are due at once.
    fn poll_timeout(&mut self) -> Option<Instant> {
        if self.port.pending() > 0 {
            return Some(Instant::ZERO);
        }
        self.next_deadline()
    }
}
