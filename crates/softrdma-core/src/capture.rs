//! Capture on any port: [`Capture`] writes every packet its port receives
//! and every packet sent through it to a pcap file, as the frames a wire
//! would carry (`softrdma decode` reads them back). Over shared memory the
//! packets are the same bytes the rings carry, so a same-host run captures
//! like a UDP one. Direct operations are not packets and are not captured.
//!
//! The file is written through at the end of every receive and send batch
//! (one `write` per batch that had packets, none for an empty poll), so a
//! process that ends in `abort()`, a fatal signal or `_exit` leaves a
//! capture complete up to its last batch: what is in the kernel survives
//! the process.

use std::net::SocketAddr;
use std::time::Duration;

use softrdma_engine::{Instant, RxMeta};
use softrdma_pcap::{SharedPcapWriter, Timestamp};

use crate::port::{Outgoing, Port, PortCounters, Received, Sources};

/// A port whose traffic is written to a capture.
#[derive(Debug)]
pub struct Capture<P> {
    inner: P,
    writer: SharedPcapWriter,
    /// Wall-clock time at engine instant zero: captures carry real times
    /// while the core knows only the engine's clock.
    epoch: Duration,
    local: SocketAddr,
}

impl<P> Capture<P> {
    /// Captures `inner`'s traffic to `writer`; `local` is this device's
    /// address (the destination of what it receives), `epoch` the wall time
    /// of engine instant zero (zero in a simulation).
    pub fn new(inner: P, writer: SharedPcapWriter, local: SocketAddr, epoch: Duration) -> Self {
        Capture {
            inner,
            writer,
            epoch,
            local,
        }
    }
    /// The port inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }
    /// The port inside.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }
    fn stamp(&self, now: Instant) -> Timestamp {
        Timestamp(self.epoch + Duration::from_nanos(now.0))
    }
}

impl<P: Port> Port for Capture<P> {
    type Peers = P::Peers;

    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let (w, local, ts) = (&self.writer, self.local, self.stamp(now));
        let mut any = false;
        let r = self.inner.receive(now, from, budget, |src, meta, d| {
            // A capture that cannot be written must not stop the traffic.
            // A datagram to a multicast group was addressed to it.
            let dst = match meta.group {
                None => local,
                Some(g) => SocketAddr::new(g, local.port()),
            };
            let _ = w.write_roce(ts, src, dst, d);
            any = true;
            rx(src, meta, d)
        });
        if any {
            let _ = self.writer.flush();
        }
        r
    }

    fn send(&mut self, now: Instant, out: &mut Outgoing<'_>) {
        let ts = self.stamp(now);
        for i in 0..out.len() {
            let ep = out.endpoints(i);
            let _ = self.writer.write_roce(ts, ep.src, ep.dst, out.whole(i));
        }
        if !out.is_empty() {
            let _ = self.writer.flush();
        }
        self.inner.send(now, out)
    }

    fn has_fast(&self) -> bool {
        self.inner.has_fast()
    }

    fn fast_pending(&self) -> bool {
        self.inner.fast_pending()
    }

    fn next_due(&self) -> Option<Instant> {
        self.inner.next_due()
    }

    fn maintain(&mut self) {
        self.inner.maintain()
    }

    fn direct_allowed(&self) -> bool {
        self.inner.direct_allowed()
    }

    fn peers(&mut self) -> Option<&mut P::Peers> {
        self.inner.peers()
    }

    fn counters(&self, c: &mut PortCounters) {
        self.inner.counters(c)
    }
}
