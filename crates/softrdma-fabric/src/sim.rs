//! The simulator: one fabric (`part::Part`, the event core), run
//! whole, or split into parts that run side by side on threads.
//!
//! A split is conservative parallel discrete-event simulation. Each part
//! owns some pods' hosts and switches and the links they transmit on.
//! Whatever one part's event does to another part (a packet reaching the
//! far end of a link, IB credits or a PFC frame going back upstream, a
//! receive to post, a dependency delivered) is due at least one
//! *lookahead* later: the shortest cable between two parts, or the host
//! delay before a message that waits on another part's delivery. So the
//! parts run in windows of one lookahead: each runs its events due before
//! the window's end, then they swap their effects, which all fall in a
//! later window. The split is fixed by the scenario (`partitions`), not by
//! the threads: effects are handed over in part order, and a run gives the
//! same results on one thread or many.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::link::Ps;
use crate::part::{Cross, Part};
pub use crate::part::{LinkReport, MsgTimes, NullMemory, Outside, Totals};
use crate::scenario::Scenario;
use crate::topology::{Node, Tree};
use crate::workload::Plan;
use softrdma_wire::Ecn;

/// The simulator of one scenario.
pub struct Sim {
    parts: Vec<Part>,
    /// How far ahead of a window's start every cross-part effect is due.
    lookahead: Ps,
    /// Why a scenario that asked for parts runs whole (empty if it did not).
    pub whole_because: String,
    threads: usize,
    limit: Ps,
    mtu: u64,
    pub tree: Arc<Tree>,
    plan: Arc<Plan>,
    /// Filled in when the run ends (from every part).
    pub times: Vec<MsgTimes>,
    pub totals: Totals,
    /// (time µs, bytes in all switch buffers, deepest egress queue bytes).
    pub samples: Vec<(f64, u64, u64)>,
    pub goodput_bins: Vec<u64>,
    pub goodput_shift: u32,
}

impl Sim {
    /// Builds the fabric, the engines and their connections for `sc`,
    /// split into `sc.partitions` parts when the scenario allows.
    pub fn new(sc: &Scenario) -> Result<Sim, String> {
        sc.validate()?;
        let tree = Tree::build(&sc.topology)?;
        let plan = crate::workload::plan(&sc.workload, tree.hosts, sc.seed)?;
        let wanted = sc.partitions.min(groups(&tree)) as u8;
        let (host_part, switch_part) = assign(&tree, wanted);
        let host_ps = (sc.transport.host_ns * 1000.0) as Ps;
        let lookahead = lookahead(&tree, &plan, &host_part, &switch_part, host_ps);
        let whole_because = if sc.partitions <= 1 {
            String::new()
        } else if !plan.sharp_base.is_empty() {
            "in-network aggregation keeps one state for the whole tree".into()
        } else if lookahead == 0 {
            "a cross-part effect is due at once (a cable of 0 ns, or host_ns 0 before a message that waits on another part)".into()
        } else {
            String::new()
        };
        let whole = Part::with_plan(sc, tree, plan)?;
        let mut parts = if wanted > 1 && whole_because.is_empty() {
            whole.split(wanted, host_part, &switch_part, sc.seed)
        } else {
            vec![whole]
        };
        for p in &mut parts {
            p.start();
        }
        Ok(Self::of(parts, lookahead, whole_because, sc))
    }

    /// The fabric of `sc` with no workload of its own: its packets come
    /// from outside ([`Sim::inject`]), and what becomes of them is taken
    /// with [`Sim::advance_until`] (the engines of its hosts stay idle).
    /// `sc.workload` is not used; it runs whole.
    pub fn carrier(sc: &Scenario) -> Result<Sim, String> {
        sc.validate()?;
        let tree = Tree::build(&sc.topology)?;
        let part = Part::with_plan(sc, tree, Plan::empty())?;
        Ok(Self::of(vec![part], 0, String::new(), sc))
    }

    fn of(parts: Vec<Part>, lookahead: Ps, whole_because: String, sc: &Scenario) -> Sim {
        let tree = Arc::clone(&parts[0].tree);
        let plan = parts[0].plan_arc();
        let goodput_shift = parts[0].goodput_shift;
        Sim {
            parts,
            lookahead,
            whole_because,
            threads: 1,
            limit: sc.time_limit_us.saturating_mul(1_000_000),
            mtu: u64::from(sc.transport.mtu),
            tree,
            plan,
            times: Vec::new(),
            totals: Totals::default(),
            samples: Vec::new(),
            goodput_bins: Vec::new(),
            goodput_shift,
        }
    }

    /// Runs the parts on up to `n` threads (the results do not change).
    pub fn set_threads(&mut self, n: usize) {
        self.threads = n.max(1);
    }

    /// The parts the fabric runs in.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// The threads the run uses.
    pub fn threads(&self) -> usize {
        self.threads.min(self.parts.len())
    }

    /// The lookahead of a split run (ps; 0 when whole).
    pub fn lookahead(&self) -> Ps {
        self.lookahead
    }

    /// Packet `token` (`data`, `ecn`; `token` not 0) leaves host `from`
    /// for host `to` at `at` (ps, not before what already ran): it joins
    /// the host's NIC queue and crosses the fabric as the workload's
    /// packets do (its class, ECN marking, ECMP on its UDP source port).
    pub fn inject(&mut self, at: Ps, from: u32, to: u32, data: &[u8], ecn: Ecn, token: u64) {
        self.parts[0].inject(at, from, to, data, ecn, token);
    }

    /// When the next event is due (ps), if any: a queued event, or what
    /// became of an injected packet and was not taken yet.
    pub fn next_event_at(&mut self) -> Option<Ps> {
        self.parts[0].next_event_at()
    }

    /// Runs every event due at or before `until` (ps); with `out`, moves
    /// what became of injected packets so far into it, in order.
    pub fn advance_until(&mut self, until: Ps, out: Option<&mut Vec<Outside>>) {
        self.parts[0].advance_until(until, out);
    }

    /// Sets the interval of queue samples (0: none).
    pub fn set_sample_interval(&mut self, ps: Ps) {
        for p in &mut self.parts {
            p.set_sample_interval(ps);
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// How far the simulated clock got.
    pub fn now(&self) -> Ps {
        self.parts.iter().map(Part::now).max().unwrap_or(0)
    }

    /// Runs until every message is delivered and acknowledged, nothing is
    /// left to happen, or the time limit. Returns whether all completed.
    pub fn run(&mut self) -> bool {
        let completed = if self.parts.len() == 1 {
            self.parts[0].run()
        } else {
            let done = self.run_split();
            for p in &mut self.parts {
                p.finish();
            }
            done
        };
        self.gather();
        completed
    }

    /// Messages not delivered and acknowledged (after [`Sim::run`]).
    pub fn remaining(&self) -> usize {
        self.times
            .iter()
            .filter(|t| t.delivered.is_none() || t.acked.is_none())
            .count()
    }

    /// The windows of a split run, the parts shared among the threads.
    fn run_split(&mut self) -> bool {
        let n = self.parts.len();
        let threads = self.threads();
        let shared = Shared {
            mail: (0..n * n).map(|_| Mutex::new(Vec::new())).collect(),
            next: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            left: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            barrier: SpinBarrier::new(threads),
            lookahead: self.lookahead,
            limit: self.limit,
            failed: AtomicBool::new(false),
        };
        let per = n.div_ceil(threads);
        let mut chunks = self.parts.chunks_mut(per);
        let mine = chunks.next().expect("a part");
        std::thread::scope(|s| {
            for chunk in chunks {
                let shared = &shared;
                s.spawn(move || shared.work(chunk));
            }
            shared.work(mine)
        })
    }

    /// Merges what the parts measured into this simulator's fields.
    fn gather(&mut self) {
        let mut parts = self.parts.iter_mut();
        let first = parts.next().expect("a part");
        let mut times = std::mem::take(&mut first.times);
        let mut totals = first.totals.clone();
        let mut samples = std::mem::take(&mut first.samples);
        let mut bins = (std::mem::take(&mut first.goodput_bins), first.goodput_shift);
        for p in parts {
            for (t, o) in times.iter_mut().zip(&p.times) {
                t.ready = t.ready.or(o.ready);
                t.delivered = t.delivered.or(o.delivered);
                t.acked = t.acked.or(o.acked);
            }
            totals.add(&p.totals);
            if samples.len() < p.samples.len() {
                samples.resize(p.samples.len(), (0.0, 0, 0));
            }
            for (s, o) in samples.iter_mut().zip(&p.samples) {
                *s = (o.0, s.1 + o.1, s.2.max(o.2));
            }
            bins = add_bins(bins, (p.goodput_bins.clone(), p.goodput_shift));
        }
        self.times = times;
        self.totals = totals;
        self.samples = samples;
        (self.goodput_bins, self.goodput_shift) = bins;
    }

    /// Every link's figures (each part counts what its side of a link did).
    pub fn link_reports(&self) -> Vec<LinkReport> {
        let mut parts = self.parts.iter();
        let mut all = parts.next().expect("a part").link_reports();
        for p in parts {
            for (a, b) in all.iter_mut().zip(p.link_reports()) {
                a.tx_packets += b.tx_packets;
                a.tx_bytes += b.tx_bytes;
                a.max_queue_bytes = a.max_queue_bytes.max(b.max_queue_bytes);
                a.pause_us += b.pause_us;
                a.max_pause_us = a.max_pause_us.max(b.max_pause_us);
                a.pause_frames += b.pause_frames;
                a.drops_tail += b.drops_tail;
                a.drops_headroom += b.drops_headroom;
                a.drops_corruption += b.drops_corruption;
            }
        }
        all
    }

    /// Up to `max` messages not completed (after [`Sim::run`]): (message,
    /// src, dst, ready, delivered, acknowledged, the sender QP's state and
    /// unacknowledged packets) for diagnosis.
    pub fn incomplete(&mut self, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (i, t) in self.times.iter().enumerate() {
            if out.len() >= max {
                break;
            }
            if t.delivered.is_some() && t.acked.is_some() {
                continue;
            }
            let src = self.plan.msgs[i].src;
            let Some(p) = self.parts.iter_mut().find(|p| p.owns(src)) else {
                continue;
            };
            out.push(p.describe(i, t));
        }
        out
    }

    /// The link from host `h` to its leaf, and the leaf's link to it.
    pub fn host_links(&self, h: u32) -> (usize, usize) {
        self.parts[0].host_links(h)
    }

    /// The delivered messages that had the fabric to themselves while on
    /// their way (from post to delivery): no other message's data on a
    /// link their data crossed, and no pause on a link their data or
    /// their ACKs crossed; against the time they would take alone (after
    /// [`Sim::run`]). None for sprayed packets
    /// (no one path), in-network aggregation, or more than
    /// [`UNCONGESTED_MAX_MESSAGES`] messages.
    pub fn uncongested(&self) -> Option<Uncongested> {
        let n = self.times.len();
        if n > UNCONGESTED_MAX_MESSAGES || !self.plan.sharp_base.is_empty() {
            return None;
        }
        let mut on_link: Vec<Vec<(Ps, Ps, usize)>> = vec![Vec::new(); self.tree.links.len()];
        let mut paths = Vec::with_capacity(n);
        for (i, t) in self.times.iter().enumerate() {
            let (Some(ready), Some(done)) = (t.ready, t.delivered) else {
                paths.push(None);
                continue;
            };
            let m = &self.plan.msgs[i];
            let part = self.parts.iter().find(|p| p.owns(m.src))?;
            let path = part.path(m.src, m.dst)?;
            let receiver = self.parts.iter().find(|p| p.owns(m.dst))?;
            let acks = receiver.path(m.dst, m.src)?;
            for &l in &path {
                on_link[l].push((ready, done, i));
            }
            paths.push(Some((part, path, acks)));
        }
        let mut crowded = vec![false; n];
        for list in &mut on_link {
            list.sort_unstable();
            for (k, &(_, end, i)) in list.iter().enumerate() {
                for &(start, _, j) in &list[k + 1..] {
                    if start >= end {
                        break;
                    }
                    (crowded[i], crowded[j]) = (true, true);
                }
            }
        }
        let mut ratios: Vec<f64> = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let (Some((part, path, acks)), false) = (p, crowded[i]) else {
                continue;
            };
            let t = &self.times[i];
            let (ready, done) = (t.ready?, t.delivered?);
            // A paused link on the way there or back (a host NIC's pause
            // holds its ACKs too) is congestion.
            let paused = |l: &usize| self.parts.iter().any(|p| p.paused_between(*l, ready, done));
            if path.iter().chain(acks).any(paused) {
                continue;
            }
            let fct = done - ready;
            ratios.push(fct as f64 / part.ideal_ps(i, path, self.mtu).max(1) as f64);
        }
        ratios.sort_by(f64::total_cmp);
        Some(Uncongested {
            alone: ratios.len(),
            delivered: paths.iter().filter(|p| p.is_some()).count(),
            fct_over_ideal_p50: ratios.get(ratios.len() / 2).copied().unwrap_or(0.0),
            fct_over_ideal_max: ratios.last().copied().unwrap_or(0.0),
        })
    }
}

/// The most messages [`Sim::uncongested`] looks at.
pub const UNCONGESTED_MAX_MESSAGES: usize = 200_000;

/// How the messages that had their path to themselves fared.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Uncongested {
    /// Messages whose data crossed no link while another message's did,
    /// and whose data and ACKs crossed no paused link.
    pub alone: usize,
    /// Messages delivered.
    pub delivered: usize,
    /// Their completion times (post to delivery) over the ideal (their
    /// packets back to back, stored and forwarded at each switch): the
    /// median and the worst.
    pub fct_over_ideal_p50: f64,
    pub fct_over_ideal_max: f64,
}

/// What the threads of a split run share.
struct Shared {
    /// Effects from part `i` on part `j` at `i * n + j`.
    mail: Vec<Mutex<Vec<Cross>>>,
    /// Each part's next event (MAX: none) and halves of messages left.
    next: Vec<AtomicU64>,
    left: Vec<AtomicUsize>,
    barrier: SpinBarrier,
    lookahead: Ps,
    limit: Ps,
    /// A thread panicked: the others leave the barrier and stop (the
    /// scope then passes the panic on) instead of waiting for it forever.
    failed: AtomicBool,
}

/// Raises [`Shared::failed`] if its thread unwinds.
struct FailOnPanic<'a>(&'a AtomicBool);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

impl Shared {
    /// One thread's share of the windows: take in the mail, agree on the
    /// window (every thread computes the same from the same figures), run
    /// it, post the mail. Returns whether every message completed.
    fn work(&self, parts: &mut [Part]) -> bool {
        let _guard = FailOnPanic(&self.failed);
        let n = self.next.len();
        loop {
            for p in parts.iter_mut() {
                let me = p.index();
                for from in 0..n {
                    let mail = std::mem::take(&mut *self.lock(from * n + me));
                    for c in mail {
                        p.apply(c);
                    }
                }
                let next = p.next_at().unwrap_or(u64::MAX);
                self.next[me].store(next, Ordering::Relaxed);
                self.left[me].store(p.halves_left(), Ordering::Relaxed);
            }
            if !self.barrier.wait(&self.failed) {
                return false;
            }
            let left: usize = self.left.iter().map(|l| l.load(Ordering::Relaxed)).sum();
            let start = self.next.iter().map(|t| t.load(Ordering::Relaxed)).min();
            let start = start.unwrap_or(u64::MAX);
            if left == 0 || start == u64::MAX || start > self.limit {
                return left == 0;
            }
            let end = start.saturating_add(self.lookahead);
            for p in parts.iter_mut() {
                p.run_before(end);
                let me = p.index();
                for (to, c) in p.out.drain(..) {
                    self.lock(me * n + to as usize).push(c);
                }
            }
            if !self.barrier.wait(&self.failed) {
                return false;
            }
        }
    }

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Vec<Cross>> {
        // A thread that panicked has already failed the run; its mail is
        // still whole (pushes do not unwind half-way).
        self.mail[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A barrier for a few threads that wait microseconds at a time: it
/// spins briefly (a window is far shorter than a futex sleep and wake),
/// then yields, then naps, so that a thread that is not running (a loaded
/// machine, more threads than cores) gets the core it waits for.
struct SpinBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(threads: usize) -> SpinBarrier {
        SpinBarrier {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Waits for every thread; false if `failed` rose meanwhile.
    fn wait(&self, failed: &AtomicBool) -> bool {
        if self.threads == 1 {
            return true;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return !failed.load(Ordering::Acquire);
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if failed.load(Ordering::Acquire) {
                return false;
            }
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else if spins < 50_000 {
                std::thread::yield_now();
            } else {
                // The other thread has not run for a long while (a loaded
                // machine, more threads than cores): stop taking turns
                // with it and sleep.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        !failed.load(Ordering::Acquire)
    }
}

/// Groups of nodes a split keeps together: the pods of a three-tier
/// tree, the leaves of a two-tier one.
fn groups(tree: &Tree) -> usize {
    tree.switches
        .iter()
        .enumerate()
        .filter(|(_, s)| s.level == 0)
        .map(|(i, s)| group_of(tree, i, s.pod))
        .max()
        .map_or(1, |g| g + 1)
}

fn group_of(tree: &Tree, switch: usize, pod: u32) -> usize {
    if tree.tiers == 3 {
        pod as usize
    } else {
        switch
    }
}

/// Each host's and switch's part: groups (pods, or leaves) in `parts`
/// contiguous runs, the top tier's switches dealt out in order.
fn assign(tree: &Tree, parts: u8) -> (Vec<u8>, Vec<u8>) {
    let n = groups(tree);
    let top = tree.tiers - 1;
    let tops: Vec<usize> = (0..tree.switches.len())
        .filter(|&i| tree.switches[i].level == top)
        .collect();
    let mut switch_part = vec![0u8; tree.switches.len()];
    for (i, s) in tree.switches.iter().enumerate() {
        if s.level != top {
            switch_part[i] = (group_of(tree, i, s.pod) * parts as usize / n) as u8;
        }
    }
    for (j, &i) in tops.iter().enumerate() {
        switch_part[i] = (j * parts as usize / tops.len()) as u8;
    }
    let host_part = tree
        .host_leaf
        .iter()
        .map(|&l| switch_part[l as usize])
        .collect();
    (host_part, switch_part)
}

/// The shortest time between a part's event and its effect on another:
/// the cable delay of links between parts, and the host delay (plus its
/// own) before a message waiting on a delivery in another part.
fn lookahead(tree: &Tree, plan: &Plan, host_part: &[u8], switch_part: &[u8], host_ps: Ps) -> Ps {
    let part = |n: Node| match n {
        Node::Host(h) => host_part[h as usize],
        Node::Switch(s) => switch_part[s as usize],
    };
    let cables = tree
        .links
        .iter()
        .filter(|l| part(l.src) != part(l.dst))
        .map(|l| l.prop_ps);
    let waits = plan.msgs.iter().flat_map(|m| {
        let mine = host_part[m.src as usize];
        m.deps
            .iter()
            .filter(move |&&d| host_part[plan.msgs[d as usize].dst as usize] != mine)
            .map(move |_| host_ps + m.delay_ps)
    });
    cables.chain(waits).min().unwrap_or(Ps::MAX)
}

/// Sums two goodput series of bins 2^shift ps wide (the narrower one's
/// bins are paired up first).
fn add_bins(a: (Vec<u64>, u32), b: (Vec<u64>, u32)) -> (Vec<u64>, u32) {
    let shift = a.1.max(b.1);
    let widen = |(mut v, s): (Vec<u64>, u32)| {
        for _ in s..shift {
            v = v.chunks(2).map(|c| c.iter().sum()).collect();
        }
        v
    };
    let (mut x, y) = (widen(a), widen(b));
    if x.len() < y.len() {
        x.resize(y.len(), 0);
    }
    for (s, o) in x.iter_mut().zip(y) {
        *s += o;
    }
    (x, shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(json: &str) -> Tree {
        let t: crate::scenario::Topology = serde_json::from_str(json).unwrap();
        Tree::build(&t).unwrap()
    }

    #[test]
    fn a_split_keeps_pods_together_and_deals_the_cores_out() {
        let t = tree(r#"{"tiers":3,"k":8,"link_gbps":100,"cable_ns":40}"#);
        let (hosts, switches) = assign(&t, 4);
        for (i, s) in t.switches.iter().enumerate() {
            if s.level < 2 {
                assert_eq!(switches[i] as u32, s.pod / 2, "switch {i}");
            }
        }
        for (h, &p) in hosts.iter().enumerate() {
            assert_eq!(p, switches[t.host_leaf[h] as usize]);
        }
        for p in 0..4 {
            let cores = (0..t.switches.len())
                .filter(|&i| t.switches[i].level == 2 && switches[i] == p)
                .count();
            assert_eq!(cores, 4, "part {p}: 16 cores dealt out 4 a part");
            assert_eq!(hosts.iter().filter(|&&q| q == p).count(), 32);
        }
        // Only cables cross parts: the lookahead is one cable.
        let plan = crate::workload::plan(
            &serde_json::from_str(r#"{"kind":"permutation","bytes":1000}"#).unwrap(),
            t.hosts,
            1,
        )
        .unwrap();
        assert_eq!(lookahead(&t, &plan, &hosts, &switches, 0), 40_000);
    }

    #[test]
    fn two_tiers_split_by_leaf() {
        let t = tree(r#"{"tiers":2,"k":8,"link_gbps":100}"#);
        assert_eq!(groups(&t), 8);
        let (hosts, _) = assign(&t, 2);
        assert_eq!(hosts.iter().filter(|&&p| p == 0).count(), 16);
        assert_eq!(hosts.iter().filter(|&&p| p == 1).count(), 16);
    }

    #[test]
    fn a_thread_that_fails_releases_the_others_from_the_barrier() {
        let barrier = SpinBarrier::new(2);
        let failed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| barrier.wait(&failed));
            // The other thread panics instead of arriving.
            let panicker = s.spawn(|| {
                let _guard = FailOnPanic(&failed);
                panic!("a part's bug");
            });
            assert!(panicker.join().is_err());
            assert!(!waiter.join().unwrap(), "the waiter left the barrier");
        });
        // Both arrive: the barrier opens.
        let ok = AtomicBool::new(false);
        let barrier = SpinBarrier::new(2);
        std::thread::scope(|s| {
            let a = s.spawn(|| barrier.wait(&ok));
            assert!(barrier.wait(&ok));
            assert!(a.join().unwrap());
        });
    }

    #[test]
    fn goodput_series_of_other_widths_add_up() {
        let (v, s) = add_bins((vec![1, 2, 3, 4, 5], 20), (vec![10, 20], 21));
        assert_eq!((v, s), (vec![13, 27, 5], 21));
        let (v, s) = add_bins((vec![1], 20), (vec![], 20));
        assert_eq!((v, s), (vec![1], 20));
    }
}
