//! Workloads as messages with dependencies: a message is posted when every
//! message it depends on has been delivered (its WRITE-with-immediate
//! completed at the receiver), plus a delay (compute time).

use crate::link::Ps;
use crate::scenario::{Algorithm, Workload};
use softrdma_engine::Rng;

/// One RDMA WRITE (with immediate) of the workload.
#[derive(Debug, Clone)]
pub struct Msg {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// Messages that must be delivered first.
    pub deps: Vec<u32>,
    /// Wait after the last dependency (or the start).
    pub delay_ps: Ps,
    /// Which collective instance (training step) it belongs to.
    pub group: u32,
    /// In-network aggregation: the operation this is host `src`'s part of
    /// (then `dst == src`, and its delivery is the whole result's arrival).
    pub sharp: Option<u32>,
}

/// The messages of a workload, and what one instance of it moves.
#[derive(Debug, Clone)]
pub struct Plan {
    pub msgs: Vec<Msg>,
    pub groups: u32,
    /// Bytes per host of one collective (for algbw), or of the flows.
    pub bytes: u64,
    /// busbw / algbw for this collective (0: not a collective).
    pub bus_factor: f64,
    /// Compute time per step (training), else 0.
    pub compute_ps: Ps,
    /// In-network aggregation operations: the first message of each (host
    /// h's part of operation o is message `sharp_base[o] + h`).
    pub sharp_base: Vec<u32>,
}

fn log2_exact(n: u32) -> Result<u32, String> {
    if n.is_power_of_two() {
        Ok(n.trailing_zeros())
    } else {
        Err(format!(
            "this algorithm needs a power-of-two host count, not {n}"
        ))
    }
}

/// Appends one all-reduce among hosts `0..n`; `entry[i]` are the messages
/// host i waits for before it starts (the previous step's), `delay` its
/// compute time. Returns, per host, the messages whose delivery ends its part.
#[allow(clippy::too_many_arguments)]
fn all_reduce(
    msgs: &mut Vec<Msg>,
    sharp_base: &mut Vec<u32>,
    n: u32,
    bytes: u64,
    alg: Algorithm,
    entry: &[Vec<u32>],
    delay: Ps,
    group: u32,
) -> Result<Vec<Vec<u32>>, String> {
    if n < 2 {
        return Err("an all-reduce needs 2 hosts or more".into());
    }
    // The message each host received last: what its next step waits for.
    let mut last: Vec<Vec<u32>> = entry.to_vec();
    let push = |msgs: &mut Vec<Msg>, src: u32, dst: u32, b: u64, deps: Vec<u32>, first| {
        msgs.push(Msg {
            src,
            dst,
            bytes: b.max(1),
            deps,
            delay_ps: if first { delay } else { 0 },
            group,
            sharp: None,
        });
        (msgs.len() - 1) as u32
    };
    match alg {
        Algorithm::Sharp => {
            let op = sharp_base.len() as u32;
            sharp_base.push(msgs.len() as u32);
            for i in 0..n {
                msgs.push(Msg {
                    src: i,
                    dst: i,
                    bytes,
                    deps: last[i as usize].clone(),
                    delay_ps: delay,
                    group,
                    sharp: Some(op),
                });
                last[i as usize] = vec![(msgs.len() - 1) as u32];
            }
        }
        Algorithm::Ring => {
            let chunk = bytes.div_ceil(u64::from(n));
            for k in 0..2 * (n - 1) {
                let mut next = vec![Vec::new(); n as usize];
                for i in 0..n {
                    let to = (i + 1) % n;
                    let id = push(msgs, i, to, chunk, last[i as usize].clone(), k == 0);
                    next[to as usize] = vec![id];
                }
                last = next;
            }
        }
        Algorithm::DoubleBinaryTree => {
            let half = bytes.div_ceil(2);
            let chunks = half.div_ceil(DBT_CHUNK).max(1);
            let chunk = half.div_ceil(chunks);
            let mut done = vec![Vec::new(); n as usize];
            for tree in double_binary_tree(n) {
                for _ in 0..chunks {
                    tree_pass(msgs, &tree, &last, &mut done, chunk, push);
                }
            }
            last = done;
        }
        Algorithm::RecursiveDoubling | Algorithm::HalvingDoubling => {
            let steps = log2_exact(n)?;
            let plan: Vec<(u32, u64)> = if alg == Algorithm::RecursiveDoubling {
                (0..steps).map(|k| (1 << k, bytes)).collect()
            } else {
                let rs = (0..steps).map(|k| (n >> (k + 1), bytes >> (k + 1)));
                let ag = (0..steps).rev().map(|k| (n >> (k + 1), bytes >> (k + 1)));
                rs.chain(ag).collect()
            };
            for (s, &(dist, b)) in plan.iter().enumerate() {
                let mut next = vec![Vec::new(); n as usize];
                for i in 0..n {
                    let to = i ^ dist;
                    let id = push(msgs, i, to, b, last[i as usize].clone(), s == 0);
                    next[to as usize] = vec![id];
                }
                last = next;
            }
        }
    }
    Ok(last)
}

/// The double binary tree's pipeline chunk (bytes): NCCL's slices are of
/// this order.
const DBT_CHUNK: u64 = 512 << 10;

/// A binary tree over hosts `0..n`: each host's parent (None: the root)
/// and children.
struct BinTree {
    parent: Vec<Option<u32>>,
    children: Vec<Vec<u32>>,
}

/// The in-order binary tree over `0..n` (a host's height is its lowest set
/// bit: the odd hosts are leaves) hung below host 0, and its mirror image
/// (`n − 1 − h`; shifted by one for odd `n`), in which the first tree's
/// leaves are inside. The two share the links' load in both directions.
fn double_binary_tree(n: u32) -> [BinTree; 2] {
    let mut children = vec![Vec::new(); n as usize];
    // Host 0's one child: the highest power of two below n.
    let top = if n > 1 {
        1u32 << (31 - (n - 1).leading_zeros())
    } else {
        0
    };
    if top > 0 {
        children[0].push(top);
    }
    let mut stack = vec![top];
    while let Some(h) = stack.pop() {
        let mut step = (h & h.wrapping_neg()) >> 1;
        if h == 0 || step == 0 {
            continue;
        }
        children[h as usize].push(h - step);
        stack.push(h - step);
        // The right child: the farthest still below n.
        while step > 0 && h + step >= n {
            step >>= 1;
        }
        if step > 0 {
            children[h as usize].push(h + step);
            stack.push(h + step);
        }
    }
    let map = |h: u32| {
        if n.is_multiple_of(2) {
            n - 1 - h
        } else {
            (h + 1) % n
        }
    };
    let mut mirrored = vec![Vec::new(); n as usize];
    for (h, c) in children.iter().enumerate() {
        mirrored[map(h as u32) as usize] = c.iter().map(|&x| map(x)).collect();
    }
    [children, mirrored].map(|children| {
        let mut parent = vec![None; n as usize];
        for (h, c) in children.iter().enumerate() {
            for &x in c {
                parent[x as usize] = Some(h as u32);
            }
        }
        BinTree { parent, children }
    })
}

/// One chunk reduced up `tree` and broadcast back down it: a host sends
/// up once its children's parts arrived (and its `entry`; a leaf after
/// its compute delay), the root sends down once its children's did,
/// every other host forwards what its parent sent. Adds to `done[h]`
/// what host h's result waits for.
fn tree_pass(
    msgs: &mut Vec<Msg>,
    tree: &BinTree,
    entry: &[Vec<u32>],
    done: &mut [Vec<u32>],
    chunk: u64,
    push: impl Fn(&mut Vec<Msg>, u32, u32, u64, Vec<u32>, bool) -> u32,
) {
    let n = tree.parent.len();
    // Children before parents: hosts by decreasing depth.
    let depth = |mut h: u32| {
        let mut d = 0;
        while let Some(p) = tree.parent[h as usize] {
            h = p;
            d += 1;
        }
        d
    };
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&h| std::cmp::Reverse(depth(h)));
    let mut up = vec![u32::MAX; n];
    for &h in &order {
        let Some(p) = tree.parent[h as usize] else {
            continue;
        };
        let mut deps = entry[h as usize].clone();
        let kids = &tree.children[h as usize];
        deps.extend(kids.iter().map(|&c| up[c as usize]));
        up[h as usize] = push(msgs, h, p, chunk, deps, kids.is_empty());
    }
    let mut down = vec![u32::MAX; n];
    for &h in order.iter().rev() {
        let deps = match tree.parent[h as usize] {
            Some(_) => vec![down[h as usize]],
            None => {
                let mut d = entry[h as usize].clone();
                d.extend(tree.children[h as usize].iter().map(|&c| up[c as usize]));
                done[h as usize].extend(&d[entry[h as usize].len()..]);
                d
            }
        };
        if tree.parent[h as usize].is_some() {
            done[h as usize].push(down[h as usize]);
        }
        for &c in &tree.children[h as usize] {
            down[c as usize] = push(msgs, h, c, chunk, deps.clone(), false);
        }
    }
}

impl Plan {
    /// No messages (a fabric whose packets come from outside).
    pub fn empty() -> Plan {
        Plan {
            msgs: Vec::new(),
            groups: 1,
            bytes: 0,
            bus_factor: 0.0,
            compute_ps: 0,
            sharp_base: Vec::new(),
        }
    }
}

/// The messages of `w` on `n` hosts.
pub fn plan(w: &Workload, n: u32, seed: u64) -> Result<Plan, String> {
    let mut msgs = Vec::new();
    let mut p = Plan::empty();
    match w {
        Workload::Flows { flows } => {
            for f in flows {
                if f.src >= n || f.dst >= n || f.src == f.dst {
                    return Err(format!("flow {}→{}: no such pair of hosts", f.src, f.dst));
                }
                msgs.push(Msg {
                    src: f.src,
                    dst: f.dst,
                    bytes: f.bytes,
                    deps: Vec::new(),
                    delay_ps: (f.start_us * 1e6) as Ps,
                    group: 0,
                    sharp: None,
                });
            }
            p.bytes = flows.iter().map(|f| f.bytes).max().unwrap_or(0);
        }
        Workload::Permutation { bytes } => {
            if n < 2 {
                return Err("a permutation needs 2 hosts or more".into());
            }
            // A seeded random derangement (Sattolo's cycle).
            let mut perm: Vec<u32> = (0..n).collect();
            let mut rng = Rng::new(seed ^ 0x7065_726D);
            for i in (1..n as usize).rev() {
                let j = rng.below(i as u64) as usize;
                perm.swap(i, j);
            }
            for (i, &d) in perm.iter().enumerate() {
                msgs.push(Msg {
                    src: i as u32,
                    dst: d,
                    bytes: *bytes,
                    deps: Vec::new(),
                    delay_ps: 0,
                    group: 0,
                    sharp: None,
                });
            }
            p.bytes = *bytes;
        }
        Workload::AllToAll { bytes } => {
            let each = bytes.div_ceil(u64::from(n)).max(1);
            for s in 0..n {
                for k in 1..n {
                    msgs.push(Msg {
                        src: s,
                        dst: (s + k) % n,
                        bytes: each,
                        deps: Vec::new(),
                        delay_ps: 0,
                        group: 0,
                        sharp: None,
                    });
                }
            }
            p.bytes = *bytes;
        }
        Workload::AllReduce {
            bytes,
            algorithm,
            repeat,
        } => {
            let mut entry = vec![Vec::new(); n as usize];
            for r in 0..*repeat {
                entry = all_reduce(
                    &mut msgs,
                    &mut p.sharp_base,
                    n,
                    *bytes,
                    *algorithm,
                    &entry,
                    0,
                    r,
                )?;
            }
            p.groups = *repeat;
            p.bytes = *bytes;
            p.bus_factor = 2.0 * f64::from(n - 1) / f64::from(n);
        }
        Workload::Training {
            steps,
            compute_us,
            gradient_bytes,
            algorithm,
        } => {
            let c = (compute_us * 1e6) as Ps;
            let mut entry = vec![Vec::new(); n as usize];
            for r in 0..*steps {
                entry = all_reduce(
                    &mut msgs,
                    &mut p.sharp_base,
                    n,
                    *gradient_bytes,
                    *algorithm,
                    &entry,
                    c,
                    r,
                )?;
            }
            p.groups = *steps;
            p.bytes = *gradient_bytes;
            p.bus_factor = 2.0 * f64::from(n - 1) / f64::from(n);
            p.compute_ps = c;
        }
    }
    p.msgs = msgs;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_has_2_n_minus_1_steps_of_one_nth() {
        let w = Workload::AllReduce {
            bytes: 1 << 20,
            algorithm: Algorithm::Ring,
            repeat: 2,
        };
        let p = plan(&w, 4, 1).unwrap();
        assert_eq!(p.msgs.len(), 2 * 4 * 6);
        assert!(p
            .msgs
            .iter()
            .all(|m| m.bytes == 1 << 18 && m.dst == (m.src + 1) % 4));
        // Step 1 of host 1 waits for step 0 of host 0.
        assert_eq!(p.msgs[5].deps, vec![0]);
        assert_eq!(p.msgs[24].group, 1);
        assert!(
            !p.msgs[24].deps.is_empty(),
            "the repeat waits for the first"
        );
    }

    #[test]
    fn halving_doubling_moves_2_n_minus_1_over_n() {
        let w = Workload::AllReduce {
            bytes: 1 << 20,
            algorithm: Algorithm::HalvingDoubling,
            repeat: 1,
        };
        let p = plan(&w, 8, 1).unwrap();
        let sent: u64 = p.msgs.iter().filter(|m| m.src == 0).map(|m| m.bytes).sum();
        assert_eq!(sent, 2 * (1 << 20) * 7 / 8);
        assert!(plan(&w, 6, 1).is_err());
    }

    #[test]
    fn double_binary_tree_is_two_trees_whose_leaves_swap() {
        for n in [2u32, 3, 7, 8, 16, 100, 1024] {
            let trees = double_binary_tree(n);
            for t in &trees {
                let roots = t.parent.iter().filter(|p| p.is_none()).count();
                assert_eq!(roots, 1, "n {n}");
                for h in 0..n {
                    // Every host reaches the root, within log2 n + 1 hops.
                    let (mut x, mut hops) = (h, 0);
                    while let Some(p) = t.parent[x as usize] {
                        x = p;
                        hops += 1;
                        assert!(hops <= 32 - n.leading_zeros() + 1, "n {n}: loop at {h}");
                    }
                    assert!(t.children[h as usize].len() <= 2);
                }
            }
            if n % 2 == 0 {
                // For even n a leaf of one tree is inside the other.
                for h in 0..n as usize {
                    let leaf = |t: &BinTree| t.children[h].is_empty();
                    assert!(
                        !(leaf(&trees[0]) && leaf(&trees[1])),
                        "n {n}: {h} a leaf twice"
                    );
                }
            }
        }
    }

    #[test]
    fn double_binary_tree_moves_each_half_up_and_down_once() {
        let w = Workload::AllReduce {
            bytes: 3 << 20,
            algorithm: Algorithm::DoubleBinaryTree,
            repeat: 2,
        };
        let n = 16;
        let p = plan(&w, n, 1).unwrap();
        // 1.5 MiB a tree in 3 chunks of 512 KiB, n − 1 edges up and down.
        let per_repeat = 2 * 3 * 2 * (n as usize - 1);
        assert_eq!(p.msgs.len(), 2 * per_repeat);
        assert!(p.msgs.iter().all(|m| m.bytes == 512 << 10));
        // Every edge of both trees carries each chunk once each way.
        let trees = double_binary_tree(n);
        for m in &p.msgs[..per_repeat] {
            let edge = |t: &BinTree| {
                t.parent[m.src as usize] == Some(m.dst) || t.parent[m.dst as usize] == Some(m.src)
            };
            assert!(edge(&trees[0]) || edge(&trees[1]), "{} -> {}", m.src, m.dst);
        }
        // The second repeat waits for the first: its messages with no
        // dependency inside it depend on the first's deliveries.
        assert!(p.msgs[per_repeat..].iter().all(|m| !m.deps.is_empty()));
        // A dependency is always delivered at the host that then sends.
        for m in &p.msgs {
            for &d in &m.deps {
                assert_eq!(p.msgs[d as usize].dst, m.src);
            }
        }
        assert!(plan(&w, 1, 1).is_err());
    }

    #[test]
    fn permutation_is_a_derangement() {
        let p = plan(&Workload::Permutation { bytes: 10 }, 64, 9).unwrap();
        let mut seen = [false; 64];
        for m in &p.msgs {
            assert_ne!(m.src, m.dst);
            assert!(!seen[m.dst as usize]);
            seen[m.dst as usize] = true;
        }
    }
}
