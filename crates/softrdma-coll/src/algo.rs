//! The collectives and their algorithms, written against the per-peer
//! byte streams of `net.rs` (sends queue, receives wait in program order).

use crate::bytes::{as_bytes, as_bytes_mut};
use crate::cost::{Algorithm, Collective};
use crate::elem::{reduce_into, reduce_into_rev, Element, ReduceOp};
use crate::{Communicator, Error, Result};

/// Bounds of part `i` of `len` elements cut into `n` near-equal parts.
fn part(len: usize, n: usize, i: usize) -> (usize, usize) {
    let at = |k: usize| ((len as u128 * k as u128) / n as u128) as usize;
    (at(i), at(i + 1))
}

/// `buf[a.0..a.1]` to read and `buf[b.0..b.1]` to write, two ranges
/// that do not overlap.
fn apart<T>(buf: &mut [T], a: (usize, usize), b: (usize, usize)) -> (&[T], &mut [T]) {
    debug_assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "overlapping ranges {a:?} and {b:?}"
    );
    if a.1 <= b.0 {
        let (x, y) = buf.split_at_mut(b.0);
        (&x[a.0..a.1], &mut y[..b.1 - b.0])
    } else {
        let (x, y) = buf.split_at_mut(a.0);
        (&y[..a.1 - a.0], &mut x[b.0..b.1])
    }
}

/// `[lo, hi)` in pieces of at most `pe` elements.
fn pieces(lo: usize, hi: usize, pe: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo..hi)
        .step_by(pe.max(1))
        .map(move |a| (a, (a + pe).min(hi)))
}

/// The largest power of two not above `n`.
fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The range vrank `v` of `p2` holds after recursive halving of `len`.
fn halving_range(v: usize, p2: usize, len: usize) -> (usize, usize) {
    let (mut lo, mut hi) = (0, len);
    let mut mask = p2 / 2;
    while mask >= 1 {
        let mid = lo + (hi - lo) / 2;
        if v & mask == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
        mask /= 2;
    }
    (lo, hi)
}

/// Parent and children of position `p` in a heap-shaped binary tree of `n`.
fn heap_links(p: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let parent = if p == 0 { None } else { Some((p - 1) / 2) };
    let children = [2 * p + 1, 2 * p + 2]
        .into_iter()
        .filter(|&c| c < n)
        .collect();
    (parent, children)
}

fn intersect(a: (usize, usize), b: (usize, usize)) -> Option<(usize, usize)> {
    let lo = a.0.max(b.0);
    let hi = a.1.min(b.1);
    (lo < hi).then_some((lo, hi))
}

/// This rank's vrank and the range it holds after recursive halving.
type Held = Option<(usize, (usize, usize))>;

struct Fold {
    p2: usize,
    rem: usize,
}

impl Fold {
    fn new(n: usize) -> Fold {
        let p2 = pow2_floor(n);
        Fold { p2, rem: n - p2 }
    }
    /// The vrank of real rank `r` (None: folded into `r + 1`).
    fn vrank(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }
    fn real(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }
}

impl Communicator {
    fn send_t<T: Element>(&mut self, peer: usize, x: &[T]) -> Result<()> {
        self.net.send(peer, as_bytes(x))
    }

    fn recv_t<T: Element>(&mut self, peer: usize, x: &mut [T]) -> Result<()> {
        self.net.recv(peer, as_bytes_mut(x))
    }

    /// Receives `x` from `peer` while posting `own[*sent..]` (bytes) to
    /// `to` as slots allow ([`Net::recv_sending`]).
    fn recv_sending_t<T: Element>(
        &mut self,
        peer: usize,
        x: &mut [T],
        to: usize,
        own: &[T],
        sent: &mut usize,
    ) -> Result<()> {
        let send = Some((to, as_bytes(own), sent));
        self.net.recv_sending(peer, as_bytes_mut(x), send)
    }

    /// Queues whatever of `own` is not posted yet (`*sent` bytes are).
    fn send_rest_t<T: Element>(&mut self, peer: usize, own: &[T], sent: &mut usize) -> Result<()> {
        let b = as_bytes(own);
        if *sent < b.len() {
            self.net.send(peer, &b[*sent..])?;
            *sent = b.len();
        }
        Ok(())
    }

    fn piece<T: Element>(&self) -> usize {
        (self.net.chunk / std::mem::size_of::<T>()).max(1)
    }

    fn finish<T: Element>(&mut self, op: ReduceOp, buf: &mut [T]) -> Result<()> {
        self.net.flush()?;
        if op == ReduceOp::Avg {
            let n = self.net.size;
            for x in buf.iter_mut() {
                *x = x.div_n(n);
            }
        }
        Ok(())
    }

    /// Element-wise reduction of every rank's `send` into `recv` on all.
    pub fn all_reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::Invalid(format!(
                "all_reduce: send {} and recv {} elements",
                send.len(),
                recv.len()
            )));
        }
        if self.net.size > 1
            && !send.is_empty()
            && self.algorithm_for(Collective::AllReduce, std::mem::size_of_val(send))
                == Algorithm::InNetwork
        {
            let rop = if op == ReduceOp::Avg {
                ReduceOp::Sum
            } else {
                op
            };
            self.agg_all_reduce(send, recv, rop)?;
            return self.finish(op, recv);
        }
        recv.copy_from_slice(send);
        self.all_reduce_in_place(recv, op)
    }

    /// [`Communicator::all_reduce`] in place.
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if self.net.size > 1 && !buf.is_empty() {
            let alg = self.algorithm_for(Collective::AllReduce, std::mem::size_of_val(buf));
            let rop = if op == ReduceOp::Avg {
                ReduceOp::Sum
            } else {
                op
            };
            if alg == Algorithm::InNetwork {
                let saved = buf.to_vec();
                self.agg_all_reduce(&saved, buf, rop)?;
            } else {
                self.host_all_reduce(buf, rop, alg)?;
            }
        }
        self.finish(op, buf)
    }

    /// A host all-reduce (no Avg) with `alg`.
    pub(crate) fn host_all_reduce<T: Element>(
        &mut self,
        buf: &mut [T],
        rop: ReduceOp,
        alg: Algorithm,
    ) -> Result<()> {
        match alg {
            Algorithm::Ring => {
                let n = self.net.size;
                let segs: Vec<_> = (0..n).map(|i| part(buf.len(), n, i)).collect();
                let own = self.ring_rs(buf, rop, &segs)?;
                self.ring_ag(buf, &segs, own)
            }
            Algorithm::Rhd => {
                let model = self.model();
                let (n, m) = (self.net.size, std::mem::size_of_val(buf));
                if model.all_reduce_by_doubling(n, m) {
                    self.rd_all_reduce(buf, rop)
                } else {
                    self.rhd_all_reduce(buf, rop)
                }
            }
            Algorithm::Tree => self.dbtree_all_reduce(buf, rop),
            Algorithm::InNetwork => {
                let alg = self.host_algorithm(Collective::AllReduce, std::mem::size_of_val(buf));
                if alg == Algorithm::InNetwork {
                    return Err(Error::Invalid("no host algorithm".into()));
                }
                self.host_all_reduce(buf, rop, alg)
            }
        }
    }

    /// The in-network all-reduce of `src` into `out` (no Avg), then the
    /// agreement round; when any rank's stream to the service failed, all
    /// drop the service and reduce `src` on the host.
    fn agg_all_reduce<T: Element>(
        &mut self,
        src: &[T],
        out: &mut [T],
        rop: ReduceOp,
    ) -> Result<()> {
        let res = match self.agg.as_mut() {
            Some(l) => l.all_reduce(src, out, rop),
            None => Err(Error::Invalid("no aggregation service".into())),
        };
        if let Err(e) = &res {
            self.agg_note = format!("failed mid-run, host fallback: {e}");
            self.agg = None;
        }
        let mut ok = [res.is_ok() as u8];
        let alg = self.host_algorithm(Collective::AllReduce, 1);
        self.host_all_reduce(&mut ok, ReduceOp::Min, alg)?;
        if ok[0] == 1 {
            return Ok(());
        }
        if self.agg.take().is_some() {
            self.agg_note = "another rank's stream to the service failed: host fallback".into();
        }
        out.copy_from_slice(src);
        let alg = self.host_algorithm(Collective::AllReduce, std::mem::size_of_val(out));
        self.host_all_reduce(out, rop, alg)
    }

    /// Ring reduce-scatter over segments `segs` (n of them): afterwards
    /// this rank holds segment `(r + 1) mod n` fully reduced; returns it.
    fn ring_rs<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        segs: &[(usize, usize)],
    ) -> Result<usize> {
        let (n, r) = (self.net.size, self.net.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let pe = self.piece::<T>();
        // This rank's own segment is never reduced into here: it goes out
        // straight from `buf` while the others come in.
        let (lo, hi) = segs[r];
        let mut sent = 0;
        // A piece, or the longest segment if shorter: a small vector must
        // not pay for a piece-sized allocation (256 KiB: an mmap, a munmap
        // and page faults, most of an 8-byte all-reduce's time).
        let longest = segs.iter().map(|&(a, b)| b - a).max().unwrap_or(0);
        let mut tmp = vec![T::default(); pe.min(longest)];
        for s in 0..n - 1 {
            let (slo, shi) = segs[(r + 2 * n - s - 1) % n];
            for (a, b) in pieces(slo, shi, pe) {
                let t = &mut tmp[..b - a];
                self.recv_sending_t(left, t, right, &buf[lo..hi], &mut sent)?;
                reduce_into(op, &mut buf[a..b], t);
                if s < n - 2 {
                    self.send_rest_t(right, &buf[lo..hi], &mut sent)?;
                    self.send_t(right, &buf[a..b])?;
                }
            }
        }
        self.send_rest_t(right, &buf[lo..hi], &mut sent)?;
        Ok((r + 1) % n)
    }

    /// Ring all-gather of segments, this rank holding segment `own` (and
    /// rank k segment `own - r + k`).
    fn ring_ag<T: Element>(
        &mut self,
        buf: &mut [T],
        segs: &[(usize, usize)],
        own: usize,
    ) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let pe = self.piece::<T>();
        // The own segment goes out straight from `buf` while the others
        // come in (they never overlap it).
        let (lo, hi) = segs[own];
        let mut sent = 0;
        for s in 0..n - 1 {
            let (slo, shi) = segs[(own + 2 * n - s - 1) % n];
            for (a, b) in pieces(slo, shi, pe) {
                let (mine, into) = apart(buf, (lo, hi), (a, b));
                self.recv_sending_t(left, into, right, mine, &mut sent)?;
                if s < n - 2 {
                    self.send_rest_t(right, &buf[lo..hi], &mut sent)?;
                    self.send_t(right, &buf[a..b])?;
                }
            }
        }
        self.send_rest_t(right, &buf[lo..hi], &mut sent)?;
        Ok(())
    }

    /// The fold of the non-power-of-two ranks and recursive halving:
    /// returns this rank's vrank and the range it holds reduced.
    fn rhd_reduce<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        stack: &mut Vec<(usize, usize, usize, bool)>,
    ) -> Result<(Fold, Held)> {
        let (n, r) = (self.net.size, self.net.rank);
        let f = Fold::new(n);
        let Some(v) = f.vrank(r) else {
            self.send_t(r + 1, buf)?;
            return Ok((f, None));
        };
        let mut tmp = vec![
            T::default();
            buf.len()
                .div_ceil(2)
                .max(if r < 2 * f.rem { buf.len() } else { 0 })
        ];
        if r < 2 * f.rem {
            let t = &mut tmp[..buf.len()];
            self.recv_t(r - 1, t)?;
            reduce_into_rev(op, buf, t);
        }
        let (mut lo, mut hi) = (0, buf.len());
        let mut mask = f.p2 / 2;
        while mask >= 1 {
            let partner = f.real(v ^ mask);
            let mid = lo + (hi - lo) / 2;
            let lower = v & mask == 0;
            let (keep, give) = if lower {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            self.send_t(partner, &buf[give.0..give.1])?;
            let t = &mut tmp[..keep.1 - keep.0];
            self.recv_t(partner, t)?;
            if lower {
                reduce_into(op, &mut buf[keep.0..keep.1], t);
            } else {
                reduce_into_rev(op, &mut buf[keep.0..keep.1], t);
            }
            stack.push((lo, mid, hi, lower));
            (lo, hi) = keep;
            mask /= 2;
        }
        Ok((f, Some((v, (lo, hi)))))
    }

    /// Recursive doubling: after the fold of the non-power-of-two ranks,
    /// the whole vector goes to the partner at each of the lg p2 steps
    /// (lower partner's operand first, so both hold the same bits), and
    /// back to the folded ranks at the end. Half the latencies of
    /// halving-doubling for twice the bytes: the small vectors' algorithm
    /// (`CostModel::all_reduce_by_doubling`).
    fn rd_all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let f = Fold::new(n);
        let Some(v) = f.vrank(r) else {
            self.send_t(r + 1, buf)?;
            return self.recv_t(r + 1, buf);
        };
        let mut tmp = vec![T::default(); buf.len()];
        if r < 2 * f.rem {
            self.recv_t(r - 1, &mut tmp)?;
            reduce_into_rev(op, buf, &tmp);
        }
        let mut mask = 1;
        while mask < f.p2 {
            let partner = f.real(v ^ mask);
            self.send_t(partner, buf)?;
            self.recv_t(partner, &mut tmp)?;
            if v & mask == 0 {
                reduce_into(op, buf, &tmp);
            } else {
                reduce_into_rev(op, buf, &tmp);
            }
            mask *= 2;
        }
        if r < 2 * f.rem {
            self.send_t(r - 1, buf)?;
        }
        Ok(())
    }

    fn rhd_all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let r = self.net.rank;
        let mut stack = Vec::new();
        let (f, me) = self.rhd_reduce(buf, op, &mut stack)?;
        if let Some((v, _)) = me {
            let mut mask = 1;
            while let Some((lo, mid, hi, lower)) = stack.pop() {
                let partner = f.real(v ^ mask);
                let (mine, theirs) = if lower {
                    ((lo, mid), (mid, hi))
                } else {
                    ((mid, hi), (lo, mid))
                };
                self.send_t(partner, &buf[mine.0..mine.1])?;
                self.recv_t(partner, &mut buf[theirs.0..theirs.1])?;
                mask *= 2;
            }
            if r < 2 * f.rem {
                self.send_t(r - 1, buf)?;
            }
        } else {
            self.recv_t(r + 1, buf)?;
        }
        Ok(())
    }

    /// Two binary trees (heap-shaped on rank order, and mirrored so that
    /// the first's leaves are the second's inner nodes), each carrying half
    /// the vector up (reduce) and down (broadcast), in pieces.
    fn dbtree_all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let pe = self.piece::<T>();
        let mid = buf.len() / 2;
        let links = |tree: usize| -> (Option<usize>, Vec<usize>) {
            if tree == 0 {
                heap_links(r, n)
            } else {
                let (p, c) = heap_links(n - 1 - r, n);
                (
                    p.map(|q| n - 1 - q),
                    c.into_iter().map(|q| n - 1 - q).collect(),
                )
            }
        };
        let trees = [links(0), links(1)];
        let mut order = Vec::new();
        let (mut a, mut b) = (pieces(0, mid, pe), pieces(mid, buf.len(), pe));
        loop {
            let (x, y) = (a.next(), b.next());
            if x.is_none() && y.is_none() {
                break;
            }
            if let Some((lo, hi)) = x {
                order.push((0, lo, hi));
            }
            if let Some((lo, hi)) = y {
                order.push((1, lo, hi));
            }
        }
        let longest = order.iter().map(|&(_, lo, hi)| hi - lo).max().unwrap_or(0);
        let mut tmp = vec![T::default(); pe.min(longest)];
        for &(t, lo, hi) in &order {
            let (parent, children) = &trees[t];
            for &c in children {
                let x = &mut tmp[..hi - lo];
                self.recv_t(c, x)?;
                reduce_into(op, &mut buf[lo..hi], x);
            }
            if let Some(p) = *parent {
                self.send_t(p, &buf[lo..hi])?;
            }
        }
        for &(t, lo, hi) in &order {
            let (parent, children) = &trees[t];
            if let Some(p) = *parent {
                self.recv_t(p, &mut buf[lo..hi])?;
            }
            for &c in children {
                self.send_t(c, &buf[lo..hi])?;
            }
        }
        Ok(())
    }

    /// Reduces every rank's `send` (size × `recv.len()` elements) and leaves
    /// block `rank` of the result in `recv`.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let count = recv.len();
        if send.len() != count.saturating_mul(n) {
            return Err(Error::Invalid(format!(
                "reduce_scatter: send {} elements, want {n} × {count}",
                send.len()
            )));
        }
        let mut w = send.to_vec();
        self.reduce_scatter_work(&mut w, op, count)?;
        recv.copy_from_slice(&w[r * count..(r + 1) * count]);
        self.finish(op, recv)
    }

    /// In place: `buf` holds size × count elements; afterwards its block
    /// `rank` holds the result (the other blocks are scratch).
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.net.size;
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "reduce_scatter: {} elements for {n} ranks",
                buf.len()
            )));
        }
        let count = buf.len() / n;
        self.reduce_scatter_work(buf, op, count)?;
        let r = self.net.rank;
        self.finish(op, &mut buf[r * count..(r + 1) * count])
    }

    fn reduce_scatter_work<T: Element>(
        &mut self,
        w: &mut [T],
        op: ReduceOp,
        count: usize,
    ) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        if n == 1 || count == 0 {
            return Ok(());
        }
        let rop = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let block = |i: usize| (i * count, (i + 1) * count);
        match self.algorithm_for(Collective::ReduceScatter, std::mem::size_of_val(w)) {
            Algorithm::Rhd => {
                let mut stack = Vec::new();
                let (f, me) = self.rhd_reduce(w, rop, &mut stack)?;
                if let Some((_, range)) = me {
                    for q in 0..n {
                        if q == r {
                            continue;
                        }
                        if let Some((a, b)) = intersect(range, block(q)) {
                            self.send_t(q, &w[a..b])?;
                        }
                    }
                }
                let len = w.len();
                for v in 0..f.p2 {
                    let from = f.real(v);
                    if from == r {
                        continue;
                    }
                    if let Some((a, b)) = intersect(halving_range(v, f.p2, len), block(r)) {
                        self.recv_t(from, &mut w[a..b])?;
                    }
                }
            }
            _ => {
                let segs: Vec<_> = (0..n).map(|i| block((i + n - 1) % n)).collect();
                self.ring_rs(w, rop, &segs)?;
            }
        }
        Ok(())
    }

    /// Gathers every rank's `send` into `recv` (size × `send.len()`), in rank order.
    pub fn all_gather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let count = send.len();
        if recv.len() != count.saturating_mul(n) {
            return Err(Error::Invalid(format!(
                "all_gather: recv {} elements, want {n} × {count}",
                recv.len()
            )));
        }
        recv[r * count..(r + 1) * count].copy_from_slice(send);
        self.all_gather_in_place(recv)
    }

    /// In place: block `rank` of `buf` is this rank's contribution.
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "all_gather: {} elements for {n} ranks",
                buf.len()
            )));
        }
        let count = buf.len() / n;
        if n == 1 || count == 0 {
            return self.net.flush();
        }
        match self.algorithm_for(Collective::AllGather, std::mem::size_of_val(buf)) {
            Algorithm::Rhd => {
                // Bruck: tmp[i] is rank (r + i)'s block.
                let mut tmp = vec![T::default(); buf.len()];
                tmp[..count].copy_from_slice(&buf[r * count..(r + 1) * count]);
                let mut d = 1;
                while d < n {
                    let cnt = d.min(n - d);
                    self.send_t((r + n - d) % n, &tmp[..cnt * count])?;
                    self.recv_t((r + d) % n, &mut tmp[d * count..(d + cnt) * count])?;
                    d *= 2;
                }
                for i in 0..n {
                    let q = (r + i) % n;
                    buf[q * count..(q + 1) * count]
                        .copy_from_slice(&tmp[i * count..(i + 1) * count]);
                }
            }
            _ => {
                let segs: Vec<_> = (0..n).map(|i| (i * count, (i + 1) * count)).collect();
                self.ring_ag(buf, &segs, r)?;
            }
        }
        self.net.flush()
    }

    /// Copies `root`'s `buf` to every rank's.
    pub fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let n = self.net.size;
        if root >= n {
            return Err(Error::Invalid(format!(
                "broadcast root {root} of {n} ranks"
            )));
        }
        if n == 1 || buf.is_empty() {
            return self.net.flush();
        }
        let vr = (self.net.rank + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let pe = self.piece::<T>();
        match self.algorithm_for(Collective::Broadcast, std::mem::size_of_val(buf)) {
            Algorithm::Ring => {
                for (a, b) in pieces(0, buf.len(), pe) {
                    if vr > 0 {
                        self.recv_t(real(vr - 1), &mut buf[a..b])?;
                    }
                    if vr + 1 < n {
                        self.send_t(real(vr + 1), &buf[a..b])?;
                    }
                }
            }
            Algorithm::Tree => {
                let (parent, children) = heap_links(vr, n);
                for (a, b) in pieces(0, buf.len(), pe) {
                    if let Some(p) = parent {
                        self.recv_t(real(p), &mut buf[a..b])?;
                    }
                    for &c in &children {
                        self.send_t(real(c), &buf[a..b])?;
                    }
                }
            }
            // (The in-network algorithm is all-reduce's only: never chosen here.)
            Algorithm::Rhd | Algorithm::InNetwork => self.bcast_binomial(buf, root)?,
        }
        self.net.flush()
    }

    /// Binomial-tree broadcast of the whole buffer.
    pub(crate) fn bcast_binomial<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let n = self.net.size;
        let vr = (self.net.rank + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                self.recv_t(real(vr - mask), buf)?;
                break;
            }
            mask *= 2;
        }
        mask /= 2;
        while mask > 0 {
            if vr + mask < n {
                self.send_t(real(vr + mask), buf)?;
            }
            mask /= 2;
        }
        self.net.flush()
    }

    /// Reduces every rank's `send` into `root`'s `recv` (`recv` must be
    /// as long as `send` on every rank; only the root's is written).
    pub fn reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = self.net.size;
        if root >= n || send.len() != recv.len() {
            return Err(Error::Invalid(format!(
                "reduce: root {root} of {n}, send {} recv {} elements",
                send.len(),
                recv.len()
            )));
        }
        let mut w = send.to_vec();
        self.reduce_work(&mut w, op, root)?;
        if self.net.rank == root {
            recv.copy_from_slice(&w);
            self.finish(op, recv)
        } else {
            self.net.flush()
        }
    }

    /// [`Communicator::reduce`] in place (non-roots' `buf` becomes scratch).
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = self.net.size;
        if root >= n {
            return Err(Error::Invalid(format!("reduce root {root} of {n} ranks")));
        }
        self.reduce_work(buf, op, root)?;
        if self.net.rank == root {
            self.finish(op, buf)
        } else {
            self.net.flush()
        }
    }

    fn reduce_work<T: Element>(&mut self, w: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        if n == 1 || w.is_empty() {
            return Ok(());
        }
        let rop = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let pe = self.piece::<T>();
        let len = w.len();
        match self.algorithm_for(Collective::Reduce, std::mem::size_of_val(w)) {
            Algorithm::Tree => {
                let vr = (r + n - root) % n;
                let real = |v: usize| (v + root) % n;
                let (parent, children) = heap_links(vr, n);
                let mut tmp = vec![T::default(); pe.min(len)];
                for (a, b) in pieces(0, len, pe) {
                    for &c in &children {
                        let x = &mut tmp[..b - a];
                        self.recv_t(real(c), x)?;
                        reduce_into(rop, &mut w[a..b], x);
                    }
                    if let Some(p) = parent {
                        self.send_t(real(p), &w[a..b])?;
                    }
                }
            }
            Algorithm::Ring => {
                let segs: Vec<_> = (0..n).map(|i| part(len, n, i)).collect();
                let own = self.ring_rs(w, rop, &segs)?;
                if r != root {
                    let (a, b) = segs[own];
                    self.send_t(root, &w[a..b])?;
                } else {
                    for q in 0..n {
                        if q != root {
                            let (a, b) = segs[(q + 1) % n];
                            self.recv_t(q, &mut w[a..b])?;
                        }
                    }
                }
            }
            Algorithm::Rhd | Algorithm::InNetwork => {
                let mut stack = Vec::new();
                let (f, me) = self.rhd_reduce(w, rop, &mut stack)?;
                if let Some((_, (a, b))) = me {
                    if r != root && a < b {
                        self.send_t(root, &w[a..b])?;
                    }
                }
                if r == root {
                    for v in 0..f.p2 {
                        let from = f.real(v);
                        let (a, b) = halving_range(v, f.p2, len);
                        if from != r && a < b {
                            self.recv_t(from, &mut w[a..b])?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Block j of `send` goes to rank j, arriving as its block `rank`.
    pub fn all_to_all<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        if send.len() != recv.len() || !send.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "all_to_all: send {} recv {} elements for {n} ranks",
                send.len(),
                recv.len()
            )));
        }
        let c = send.len() / n;
        for k in 1..n {
            let j = (r + k) % n;
            self.send_t(j, &send[j * c..(j + 1) * c])?;
        }
        recv[r * c..(r + 1) * c].copy_from_slice(&send[r * c..(r + 1) * c]);
        for k in 1..n {
            let j = (r + n - k) % n;
            self.recv_t(j, &mut recv[j * c..(j + 1) * c])?;
        }
        self.net.flush()
    }

    /// Returns once every rank has entered (dissemination, 1-byte messages).
    pub fn barrier(&mut self) -> Result<()> {
        let (n, r) = (self.net.size, self.net.rank);
        let mut d = 1;
        let mut b = [0u8];
        while d < n {
            self.net.send((r + d) % n, &[1])?;
            self.net.recv((r + n - d) % n, &mut b)?;
            d *= 2;
        }
        self.net.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_ranges_tile_the_vector() {
        for p2 in [1, 2, 4, 8] {
            for len in [0, 1, 2, 3, 7, 13, 64] {
                let mut rs: Vec<_> = (0..p2).map(|v| halving_range(v, p2, len)).collect();
                rs.sort();
                let mut at = 0;
                for (lo, hi) in rs {
                    assert_eq!(lo, at);
                    at = hi;
                }
                assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn fold_maps_ranks_both_ways() {
        for n in 1..=9 {
            let f = Fold::new(n);
            let vs: Vec<_> = (0..n).filter_map(|r| f.vrank(r).map(|v| (r, v))).collect();
            assert_eq!(vs.len(), f.p2);
            for (r, v) in vs {
                assert_eq!(f.real(v), r);
            }
        }
    }
}
