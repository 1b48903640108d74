//! The α-β-γ cost model (Hockney's α-β plus a per-byte reduction cost γ,
//! as in Thakur, Rabenseifner and Gropp 2005) and the algorithm choice.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// Collective algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring, chunked and pipelined (broadcast: a pipelined chain).
    Ring,
    /// Recursive halving-doubling: Rabenseifner's all-reduce with the
    /// non-power-of-two fold; recursive-doubling (Bruck) all-gather;
    /// binomial broadcast and reduce.
    Rhd,
    /// Double binary tree (all-reduce); a pipelined binary tree
    /// (broadcast, reduce).
    Tree,
    /// In-network aggregation (all-reduce): every rank streams its vector
    /// to the aggregation service (`softrdma aggd`), which reduces each
    /// chunk once and returns the result to every rank. Chosen only when
    /// asked for and a service was joined; otherwise (and when the service
    /// fails mid-run) the host choice runs.
    InNetwork,
}

impl Algorithm {
    /// Every host algorithm (the automatic choice picks among these).
    pub const ALL: [Algorithm; 3] = [Algorithm::Ring, Algorithm::Rhd, Algorithm::Tree];

    /// Whether the collective has this algorithm.
    pub fn applies(self, c: Collective) -> bool {
        if self == Algorithm::InNetwork {
            return c == Collective::AllReduce;
        }
        match c {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => true,
            Collective::ReduceScatter | Collective::AllGather => self != Algorithm::Tree,
            Collective::AllToAll | Collective::Barrier => false,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Ring => "ring",
            Algorithm::Rhd => "rhd",
            Algorithm::Tree => "tree",
            Algorithm::InNetwork => "innetwork",
        })
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ring" => Ok(Algorithm::Ring),
            "rhd" | "rabenseifner" | "recursive" => Ok(Algorithm::Rhd),
            "tree" | "dbtree" => Ok(Algorithm::Tree),
            "innetwork" | "in-network" | "aggd" | "sharp" => Ok(Algorithm::InNetwork),
            _ => Err(format!(
                "unknown algorithm {s:?} (ring, rhd, tree, innetwork)"
            )),
        }
    }
}

/// The collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// All-reduce.
    AllReduce,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-gather.
    AllGather,
    /// Broadcast.
    Broadcast,
    /// Reduce to a root.
    Reduce,
    /// All-to-all.
    AllToAll,
    /// Barrier.
    Barrier,
}

/// Seconds per message (α), per byte sent (β) and per byte reduced (γ).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Start-up cost of a message, seconds.
    pub alpha: f64,
    /// Transfer cost, seconds per byte.
    pub beta: f64,
    /// Reduction cost, seconds per byte.
    pub gamma: f64,
}

impl Default for CostModel {
    /// Fixed figures (10 µs, 2 GB/s, 4 GB/s): the deterministic mode's.
    fn default() -> Self {
        CostModel {
            alpha: 10e-6,
            beta: 1.0 / 2e9,
            gamma: 1.0 / 4e9,
        }
    }
}

fn log2_ceil(n: usize) -> f64 {
    (usize::BITS - (n.max(1) - 1).leading_zeros()) as f64
}

impl CostModel {
    /// Overrides from `SOFTRDMA_COLL_ALPHA_US`, `SOFTRDMA_COLL_BW_GBPS`
    /// and `SOFTRDMA_COLL_REDUCE_GBPS` (any of them set fixes the model;
    /// the others keep `base`'s or the default figures).
    pub fn from_env(base: Option<CostModel>) -> Result<Option<CostModel>, Error> {
        let get = |k: &str| -> Result<Option<f64>, Error> {
            match std::env::var(k).ok().filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => match v.parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                    _ => Err(Error::Invalid(format!(
                        "{k}={v:?} is not a positive number"
                    ))),
                },
            }
        };
        let (a, b, g) = (
            get("SOFTRDMA_COLL_ALPHA_US")?,
            get("SOFTRDMA_COLL_BW_GBPS")?,
            get("SOFTRDMA_COLL_REDUCE_GBPS")?,
        );
        if a.is_none() && b.is_none() && g.is_none() {
            return Ok(base);
        }
        let mut m = base.unwrap_or_default();
        if let Some(a) = a {
            m.alpha = a * 1e-6;
        }
        if let Some(b) = b {
            m.beta = 1.0 / (b * 1e9);
        }
        if let Some(g) = g {
            m.gamma = 1.0 / (g * 1e9);
        }
        Ok(Some(m))
    }

    /// Modelled time of `alg` for collective `c` on `n` ranks and `m` bytes
    /// (the whole vector; None when the collective lacks the algorithm).
    pub fn time(&self, c: Collective, alg: Algorithm, n: usize, m: usize) -> Option<f64> {
        if !alg.applies(c) {
            return None;
        }
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        let nf = n as f64;
        let mf = m as f64;
        let lg = log2_ceil(n);
        let (p2f, lgp, fold) = self.power_of_two(n, m);
        let frac = (nf - 1.0) / nf;
        Some(match (c, alg) {
            (Collective::AllReduce, Algorithm::Ring) => {
                2.0 * (nf - 1.0) * a + 2.0 * frac * mf * b + frac * mf * g
            }
            (Collective::AllReduce, Algorithm::Rhd) => {
                let (halving, doubling) = self.rhd_all_reduce_times(n, m);
                halving.min(doubling)
            }
            (Collective::AllReduce, Algorithm::Tree) => {
                // Each half goes up and down a tree of depth lg; pipelined,
                // a node's links carry about the whole vector each way.
                4.0 * lg * a + 2.0 * mf * b + mf * g
            }
            (Collective::AllReduce, Algorithm::InNetwork) => {
                // A round trip to the service, each rank's link carrying the
                // vector once each way, and the service's one link and one
                // core carrying and reducing all n vectors (the software
                // service's bottleneck; a switch reduces at line rate), plus
                // the host agreement round on a byte that makes the mid-run
                // fallback safe.
                2.0 * a + nf * mf * b + (nf - 1.0) * mf * g + 2.0 * lg * a
            }
            (Collective::ReduceScatter, Algorithm::Ring) => {
                (nf - 1.0) * a + frac * mf * b + frac * mf * g
            }
            (Collective::ReduceScatter, Algorithm::Rhd) => {
                let pf = (p2f - 1.0) / p2f;
                (lgp + 1.0) * a + (pf + 1.0 / nf) * mf * b + pf * mf * g + fold / 2.0
            }
            (Collective::AllGather, Algorithm::Ring) => (nf - 1.0) * a + frac * mf * b,
            (Collective::AllGather, Algorithm::Rhd) => lg * a + frac * mf * b,
            (Collective::Broadcast, Algorithm::Ring) => (nf - 1.0) * a + mf * b,
            (Collective::Broadcast, Algorithm::Rhd) => lg * (a + mf * b),
            (Collective::Broadcast, Algorithm::Tree) => 2.0 * lg * a + 2.0 * mf * b,
            (Collective::Reduce, Algorithm::Ring) => {
                nf * a + (frac + frac) * mf * b + frac * mf * g
            }
            (Collective::Reduce, Algorithm::Rhd) => lg * (a + mf * b + mf * g),
            (Collective::Reduce, Algorithm::Tree) => 2.0 * lg * a + 2.0 * mf * b + 2.0 * mf * g,
            _ => return None,
        })
    }

    /// The power-of-two algorithms' terms on `n` ranks and `m` bytes: p,
    /// the largest power of two not above n; log₂p; and the cost of folding
    /// the other n − p ranks in (and out again), 0 when n is p.
    fn power_of_two(&self, n: usize, m: usize) -> (f64, f64, f64) {
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        let mf = m as f64;
        let p2 = 1usize << (usize::BITS - 1 - n.max(1).leading_zeros());
        let fold = if p2 != n {
            2.0 * (a + mf * b) + mf * g
        } else {
            0.0
        };
        (p2 as f64, log2_ceil(p2), fold)
    }

    /// The all-reduce of `Algorithm::Rhd` on `n` ranks and `m` bytes:
    /// (recursive halving then doubling, 2 lg p latencies and about 2m
    /// bytes; recursive doubling of the whole vector, lg p latencies and
    /// lg p × m bytes), each after the fold of the non-power-of-two ranks.
    fn rhd_all_reduce_times(&self, n: usize, m: usize) -> (f64, f64) {
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        let mf = m as f64;
        let (p2f, lgp, fold) = self.power_of_two(n, m);
        let pf = (p2f - 1.0) / p2f;
        let halving = 2.0 * lgp * a + 2.0 * pf * mf * b + pf * mf * g + fold;
        let doubling = lgp * (a + mf * b + mf * g) + fold;
        (halving, doubling)
    }

    /// Whether `Algorithm::Rhd`'s all-reduce of `m` bytes on `n` ranks
    /// doubles the whole vector (small vectors) rather than halving it.
    pub fn all_reduce_by_doubling(&self, n: usize, m: usize) -> bool {
        let (halving, doubling) = self.rhd_all_reduce_times(n, m);
        doubling < halving
    }

    /// The cheapest algorithm for `c` on `n` ranks and `m` bytes.
    pub fn choose(&self, c: Collective, n: usize, m: usize) -> Algorithm {
        let mut best = (f64::INFINITY, Algorithm::Ring);
        for alg in Algorithm::ALL {
            if let Some(t) = self.time(c, alg, n, m) {
                if t < best.0 {
                    best = (t, alg);
                }
            }
        }
        best.1
    }
}
