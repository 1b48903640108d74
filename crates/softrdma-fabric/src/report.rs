//! A run's results: times, bandwidths, completion-time percentiles,
//! retransmissions, pauses, queues, drops, cost — as JSON (serde) and as
//! a text summary.

use std::time::Instant as WallClock;

use serde::Serialize;

use crate::scenario::Scenario;
use crate::sim::{LinkReport, Sim, Totals, Uncongested};

/// Completion-time percentiles (µs).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Fct {
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// What an idle GPU costs, with the assumptions.
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    pub gpus: u32,
    pub gpu_hour_usd: f64,
    pub compute_us: f64,
    pub step_us: f64,
    /// Share of each step the GPUs wait for the network.
    pub idle_fraction: f64,
    /// gpus × price × 168 h × idle fraction.
    pub idle_usd_per_week: f64,
    pub assumptions: Vec<String>,
}

/// What the scenario was, for tables and plots across scenarios.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// "lossy", "pfc" or "ib_credit".
    pub link_layer: String,
    pub recovery: String,
    pub dcqcn: bool,
    /// Per-packet loss probability on the chosen links.
    pub loss_rate: f64,
    pub loss_links: String,
    /// The workload's kind, and its algorithm for collectives.
    pub workload: String,
    pub algorithm: Option<String>,
    pub link_gbps: f64,
    pub tiers: u8,
    pub k: u32,
}

impl Params {
    fn of(sc: &Scenario) -> Params {
        use crate::scenario::Workload as W;
        let (workload, algorithm) = match &sc.workload {
            W::Flows { .. } => ("flows", None),
            W::Permutation { .. } => ("permutation", None),
            W::AllToAll { .. } => ("all_to_all", None),
            W::AllReduce { algorithm, .. } => ("all_reduce", Some(algorithm.text())),
            W::Training { algorithm, .. } => ("training", Some(algorithm.text())),
        };
        Params {
            link_layer: sc.link_layer.kind.text(),
            recovery: sc.transport.recovery.clone(),
            dcqcn: sc.transport.dcqcn,
            loss_rate: sc.link_layer.loss.rate,
            loss_links: sc.link_layer.loss.links.clone(),
            workload: workload.into(),
            algorithm,
            link_gbps: sc.topology.link_gbps,
            tiers: sc.topology.tiers,
            k: sc.topology.k,
        }
    }
}

/// The serde name of a unit enum value.
trait SerdeName {
    fn text(&self) -> String;
}

impl<T: Serialize> SerdeName for T {
    fn text(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub params: Params,
    /// Bytes per host of one collective (or the largest flow).
    pub bytes: u64,
    /// Bytes of every message delivered.
    pub delivered_bytes: u64,
    pub seed: u64,
    pub hosts: u32,
    pub completed: bool,
    pub messages: usize,
    pub messages_left: usize,
    /// The first incomplete messages, for diagnosis.
    pub incomplete: Vec<String>,
    /// Last delivery (µs of simulated time).
    pub makespan_us: f64,
    /// Per collective instance / training step (µs).
    pub step_us: Vec<f64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    pub fct: Fct,
    /// The completion-time distribution: (µs, share of messages done by
    /// then), at most 200 points.
    pub fct_cdf: Vec<(f64, f64)>,
    /// Payload reaching the hosts over time: (µs, Gb/s per host).
    pub goodput: Vec<(f64, f64)>,
    /// Each message's completion time (µs; flows workloads only).
    pub flow_fct_us: Vec<Option<f64>>,
    pub totals: Totals,
    /// Total pause time over all links (µs), and the worst link's.
    pub pause_us_total: f64,
    pub pause_us_max_link: f64,
    pub paused_links: usize,
    pub max_queue_bytes: u64,
    /// (µs, bytes in switch buffers, deepest queue bytes).
    pub queue_samples: Vec<(f64, u64, u64)>,
    pub cost: Option<CostReport>,
    pub wall_s: f64,
    pub events_per_s: f64,
    pub peak_rss_mb: f64,
    /// The parts the fabric ran in (the scenario's `partitions`, or 1 and
    /// why not), and the threads that ran them (a wall-clock figure: the
    /// results do not depend on it).
    pub partitions: usize,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub whole_because: String,
    pub threads: usize,
    /// The messages that had their path to themselves, against the ideal
    /// (None: sprayed, aggregated in the network, or too many messages).
    pub uncongested: Option<Uncongested>,
    /// The busiest links (by pause time, then drops, then queue).
    pub links: Vec<LinkReport>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Peak resident memory of this process (MB), from /proc (0 elsewhere).
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Simulates `sc`.
pub fn run(sc: &Scenario) -> Result<Report, String> {
    run_with(sc, 0)
}

/// Simulates `sc`, sampling queues every `sample_us` (0: never).
pub fn run_with(sc: &Scenario, sample_us: u64) -> Result<Report, String> {
    run_threads(sc, sample_us, 1)
}

/// Simulates `sc` as [`run_with`] does, its parts (if the scenario splits
/// the fabric) on up to `threads` threads.
pub fn run_threads(sc: &Scenario, sample_us: u64, threads: usize) -> Result<Report, String> {
    let t0 = WallClock::now();
    let mut sim = Sim::new(sc)?;
    sim.set_threads(threads);
    sim.set_sample_interval(sample_us * 1_000_000);
    let completed = sim.run();
    let wall = t0.elapsed().as_secs_f64();
    Ok(report(sc, &mut sim, completed, wall))
}

fn report(sc: &Scenario, sim: &mut Sim, completed: bool, wall: f64) -> Report {
    let plan = sim.plan();
    let mut fcts: Vec<f64> = sim
        .times
        .iter()
        .filter_map(|t| Some((t.delivered? - t.ready?) as f64 / 1e6))
        .collect();
    fcts.sort_by(f64::total_cmp);
    let makespan = sim
        .times
        .iter()
        .filter_map(|t| t.delivered)
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let mut ends = vec![0u64; plan.groups as usize];
    for (m, t) in plan.msgs.iter().zip(&sim.times) {
        if let Some(d) = t.delivered {
            let e = &mut ends[m.group as usize];
            *e = (*e).max(d);
        }
    }
    let mut step_us = Vec::new();
    let mut prev = 0;
    for &e in &ends {
        step_us.push(e.saturating_sub(prev) as f64 / 1e6);
        prev = e;
    }
    let collective = plan.bus_factor > 0.0;
    let (algbw, busbw) = if collective && completed && !step_us.is_empty() {
        // The communication part of a step (compute taken out).
        let comm_us: f64 = step_us
            .iter()
            .map(|s| s - plan.compute_ps as f64 / 1e6)
            .sum::<f64>()
            / step_us.len() as f64;
        let alg = plan.bytes as f64 * 8.0 / (comm_us * 1e3);
        (Some(alg), Some(alg * plan.bus_factor))
    } else {
        (None, None)
    };
    let mut links = sim.link_reports();
    let pause_total: f64 = links.iter().map(|l| l.pause_us).sum();
    let pause_max = links.iter().map(|l| l.pause_us).fold(0.0, f64::max);
    let paused_links = links.iter().filter(|l| l.pause_us > 0.0).count();
    let max_queue = links.iter().map(|l| l.max_queue_bytes).max().unwrap_or(0);
    links.sort_by(|a, b| {
        b.pause_us
            .total_cmp(&a.pause_us)
            .then((b.drops_tail + b.drops_corruption).cmp(&(a.drops_tail + a.drops_corruption)))
            .then(b.max_queue_bytes.cmp(&a.max_queue_bytes))
    });
    links.truncate(16);
    let cost = (plan.compute_ps > 0 && completed).then(|| {
        let gpus = sc.cost.gpus.unwrap_or(sim.tree.hosts);
        let step = step_us.iter().sum::<f64>() / step_us.len() as f64;
        let compute = plan.compute_ps as f64 / 1e6;
        let idle = ((step - compute) / step).max(0.0);
        CostReport {
            gpus,
            gpu_hour_usd: sc.cost.gpu_hour_usd,
            compute_us: compute,
            step_us: step,
            idle_fraction: idle,
            idle_usd_per_week: f64::from(gpus) * sc.cost.gpu_hour_usd * 168.0 * idle,
            assumptions: vec![
                format!(
                    "{gpus} GPUs at ${}/GPU-hour, running 168 h a week",
                    sc.cost.gpu_hour_usd
                ),
                format!("compute {compute} µs per step, not overlapped with the all-reduce"),
                "a GPU is idle while its step's all-reduce runs (data parallel, synchronous)"
                    .into(),
                format!(
                    "all-reduce: {:?} of {} bytes per GPU, every step",
                    match &sc.workload {
                        crate::scenario::Workload::Training { algorithm, .. } => *algorithm,
                        _ => Default::default(),
                    },
                    plan.bytes
                ),
            ],
        }
    });
    Report {
        name: sc.name.clone(),
        params: Params::of(sc),
        bytes: plan.bytes,
        delivered_bytes: plan
            .msgs
            .iter()
            .zip(&sim.times)
            .filter(|(_, t)| t.delivered.is_some())
            .map(|(m, _)| m.bytes)
            .sum(),
        seed: sc.seed,
        hosts: sim.tree.hosts,
        completed,
        messages: plan.msgs.len(),
        messages_left: sim.remaining(),
        incomplete: sim.incomplete(8),
        uncongested: sim.uncongested(),
        makespan_us: makespan,
        step_us,
        algbw_gbps: algbw,
        busbw_gbps: busbw,
        fct: Fct {
            count: fcts.len(),
            p50_us: percentile(&fcts, 0.5),
            p99_us: percentile(&fcts, 0.99),
            max_us: fcts.last().copied().unwrap_or(0.0),
        },
        goodput: {
            let w_ps = (1u64 << sim.goodput_shift) as f64;
            let hosts = f64::from(sim.tree.hosts.max(1));
            sim.goodput_bins
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    (
                        (i as f64 + 0.5) * w_ps / 1e6,
                        b as f64 * 8.0 / (w_ps / 1e3) / hosts,
                    )
                })
                .collect()
        },
        fct_cdf: {
            let n = fcts.len();
            let step = n.div_ceil(200).max(1);
            let mut v: Vec<(f64, f64)> = (0..n)
                .step_by(step)
                .map(|i| (fcts[i], (i + 1) as f64 / n as f64))
                .collect();
            if let Some(&last) = fcts.last() {
                v.push((last, 1.0));
            }
            v
        },
        flow_fct_us: if matches!(sc.workload, crate::scenario::Workload::Flows { .. }) {
            sim.times
                .iter()
                .map(|t| Some((t.delivered? - t.ready?) as f64 / 1e6))
                .collect()
        } else {
            Vec::new()
        },
        totals: sim.totals.clone(),
        pause_us_total: pause_total,
        pause_us_max_link: pause_max,
        paused_links,
        max_queue_bytes: max_queue,
        queue_samples: sim.samples.clone(),
        cost,
        wall_s: wall,
        events_per_s: sim.totals.events as f64 / wall.max(1e-9),
        peak_rss_mb: peak_rss_mb(),
        partitions: sim.partitions(),
        whole_because: sim.whole_because.clone(),
        threads: sim.threads(),
        links,
    }
}

impl Report {
    /// A human summary.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let t = &self.totals;
        let _ = writeln!(
            s,
            "{}: {} hosts, {} messages{}",
            if self.name.is_empty() {
                "scenario"
            } else {
                &self.name
            },
            self.hosts,
            self.messages,
            if self.completed {
                String::new()
            } else {
                format!(", {} NOT COMPLETED", self.messages_left)
            }
        );
        for i in &self.incomplete {
            let _ = writeln!(s, "  incomplete: {i}");
        }
        let _ = writeln!(s, "  makespan {:.1} µs", self.makespan_us);
        if self.step_us.len() > 1 {
            let mean = self.step_us.iter().sum::<f64>() / self.step_us.len() as f64;
            let _ = writeln!(
                s,
                "  step time mean {mean:.1} µs over {} steps",
                self.step_us.len()
            );
        }
        if let (Some(a), Some(b)) = (self.algbw_gbps, self.busbw_gbps) {
            let _ = writeln!(s, "  algbw {a:.2} Gb/s, busbw {b:.2} Gb/s");
        }
        let _ = writeln!(
            s,
            "  FCT p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            self.fct.p50_us, self.fct.p99_us, self.fct.max_us
        );
        let _ = writeln!(
            s,
            "  retransmits {} (selective {}), timeouts {}, seq NAKs {}, CNPs {}, failed WRs {}",
            t.retransmits, t.sr_retransmits, t.timeouts, t.seq_naks, t.cnps, t.failed_wrs
        );
        let _ = writeln!(
            s,
            "  drops: tail {}, headroom {}, corruption {}; ECN marks {}",
            t.drops_tail, t.drops_headroom, t.drops_corruption, t.ecn_marked
        );
        let _ = writeln!(
            s,
            "  PFC: {} pause frames, {} links paused, {:.1} µs paused in all, {:.1} µs on the worst link; deepest queue {} B",
            t.pause_frames, self.paused_links, self.pause_us_total, self.pause_us_max_link, self.max_queue_bytes
        );
        if let Some(c) = &self.cost {
            let _ = writeln!(
                s,
                "  cost: step {:.1} µs, compute {:.1} µs, GPUs idle {:.1} % → ${:.0} per week",
                c.step_us,
                c.compute_us,
                c.idle_fraction * 100.0,
                c.idle_usd_per_week
            );
            for a in &c.assumptions {
                let _ = writeln!(s, "    assumes: {a}");
            }
        }
        let _ = writeln!(
            s,
            "  simulator: {} events in {:.2} s wall ({:.2} M events/s), peak RSS {:.0} MB; {} part{} on {} thread{}",
            t.events,
            self.wall_s,
            self.events_per_s / 1e6,
            self.peak_rss_mb,
            self.partitions,
            if self.partitions == 1 { "" } else { "s" },
            self.threads,
            if self.threads == 1 { "" } else { "s" },
        );
        if let Some(u) = &self.uncongested {
            let _ = writeln!(
                s,
                "  messages with the fabric to themselves: {} of {}, completion time / ideal p50 {:.3}, max {:.3}",
                u.alone, u.delivered, u.fct_over_ideal_p50, u.fct_over_ideal_max
            );
        }
        if !self.whole_because.is_empty() {
            let _ = writeln!(s, "  ran whole: {}", self.whole_because);
        }
        s
    }
}
