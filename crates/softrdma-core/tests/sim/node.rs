//! What the harness needs of a node, for the two kinds it runs: bare
//! engines (the engine's transport alone, as the wire-identity test needs)
//! and device cores over simulated ports (the production progress loop and
//! direct path, as the simulation suite runs).

use std::sync::Arc;

use softrdma_core::sim_port::{HostMemory, SimHost, SimPort};
use softrdma_core::DeviceCore;
use softrdma_engine::sim::SimNode;
use softrdma_engine::{
    Engine, EngineConfig, Event, Instant, RecvWr, Result, SendWr, WorkCompletion,
};

/// A node the harness can build and drive like an application would.
pub trait HarnessNode: SimNode + Sized {
    /// Whether a post puts its packets in the node's outbox at once (a
    /// device core) rather than when the network next polls (an engine):
    /// the harness then flushes them onto the wire before it reads what
    /// was sent (an SQD drain's boundary).
    const SENDS_AT_POST: bool;

    /// A node of `cfg`, on `host` when the scenario puts nodes on one.
    fn build(cfg: EngineConfig, host: Option<&SimHost>) -> Self;
    fn engine(&self) -> &Engine;
    fn engine_mut(&mut self) -> &mut Engine;
    /// Posts a send WR; true when it was executed directly (a same-host
    /// peer's memory) and has completed already.
    fn submit(&mut self, now: Instant, qpn: u32, wr: &SendWr) -> Result<bool>;
    fn post_recv(&mut self, now: Instant, qpn: u32, wr: &RecvWr) -> Result<()>;
    fn post_srq_recv(&mut self, now: Instant, srq: u32, wr: &RecvWr) -> Result<()>;
    fn next_event(&mut self) -> Option<Event>;
    /// Takes every completion of `cq` into `out`, as an application's
    /// `poll_cq` does.
    fn poll_cq(&mut self, now: Instant, cq: u32, out: &mut Vec<WorkCompletion>) -> Result<usize>;
    /// Offers region `rkey` to same-host peers (nothing without a host).
    fn share(&mut self, rkey: u32, mem: Arc<HostMemory>);
}

impl HarnessNode for Engine {
    const SENDS_AT_POST: bool = false;

    fn build(cfg: EngineConfig, _: Option<&SimHost>) -> Self {
        Engine::new(cfg)
    }
    fn engine(&self) -> &Engine {
        self
    }
    fn engine_mut(&mut self) -> &mut Engine {
        self
    }
    fn submit(&mut self, now: Instant, qpn: u32, wr: &SendWr) -> Result<bool> {
        self.post_send(now, qpn, wr).map(|()| false)
    }
    fn post_recv(&mut self, _: Instant, qpn: u32, wr: &RecvWr) -> Result<()> {
        Engine::post_recv(self, qpn, wr)
    }
    fn post_srq_recv(&mut self, _: Instant, srq: u32, wr: &RecvWr) -> Result<()> {
        Engine::post_srq_recv(self, srq, wr)
    }
    fn next_event(&mut self) -> Option<Event> {
        self.poll_event()
    }
    fn poll_cq(&mut self, _: Instant, cq: u32, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        Engine::poll_cq(self, cq, usize::MAX, out)
    }
    fn share(&mut self, _: u32, _: Arc<HostMemory>) {}
}

/// The application's calls as a driver makes them through the core: the
/// direct path first, then `command` (which sends what the call produced
/// and runs progress); `poll_cq` with the inline progress and idle policy
/// of the device's poll; events the core routed first, then the engine's.
impl HarnessNode for DeviceCore<SimPort> {
    const SENDS_AT_POST: bool = true;

    fn build(cfg: EngineConfig, host: Option<&SimHost>) -> Self {
        let port = match host {
            Some(h) => SimPort::on_host(h, cfg.local),
            None => SimPort::new(),
        };
        DeviceCore::new(Engine::new(cfg), port)
    }
    fn engine(&self) -> &Engine {
        &self.engine
    }
    fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
    fn submit(&mut self, now: Instant, qpn: u32, wr: &SendWr) -> Result<bool> {
        if self.try_direct(qpn, wr) {
            return Ok(true);
        }
        self.command(now, |e, now| e.post_send(now, qpn, wr)).0?;
        Ok(false)
    }
    fn post_recv(&mut self, now: Instant, qpn: u32, wr: &RecvWr) -> Result<()> {
        self.command(now, |e, _| e.post_recv(qpn, wr)).0
    }
    fn post_srq_recv(&mut self, now: Instant, srq: u32, wr: &RecvWr) -> Result<()> {
        self.command(now, |e, _| e.post_srq_recv(srq, wr)).0
    }
    fn next_event(&mut self) -> Option<Event> {
        self.poll_event().or_else(|| self.engine.poll_event())
    }
    /// The device's inline poll: the CQ; when it is empty, progress unless
    /// the core's idle policy says nothing can be pending; the CQ again.
    fn poll_cq(&mut self, now: Instant, cq: u32, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let n = self.engine.poll_cq(cq, usize::MAX, out)?;
        if n > 0 || !self.poll_wanted() {
            return Ok(n);
        }
        self.forget_routes();
        self.progress(now, false);
        self.engine.poll_cq(cq, usize::MAX, out)
    }
    fn share(&mut self, rkey: u32, mem: Arc<HostMemory>) {
        if let Some(p) = self.port.peers_mut() {
            p.share(rkey, mem);
        }
    }
}
