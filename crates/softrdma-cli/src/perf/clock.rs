//! Timestamps for the perf tests. Like perftest's `get_cycles`, the time
//! stamp counter where it ticks at a constant rate (x86-64 with
//! `constant_tsc` and `nonstop_tsc`): one instruction instead of a
//! `clock_gettime`, which a ping-pong would otherwise pay on its critical
//! path every iteration. Elsewhere, `Instant`.

use std::time::{Duration, Instant};

pub(crate) struct Clock {
    origin: Instant,
    tsc: Option<Tsc>,
}

#[derive(Clone, Copy)]
struct Tsc {
    start: u64,
    /// Nanoseconds per tick, measured against `Instant` at start-up.
    ns_per_tick: f64,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        let origin = Instant::now();
        Clock {
            origin,
            tsc: Tsc::calibrate(),
        }
    }

    /// Nanoseconds since the clock was made.
    pub(crate) fn now_ns(&self) -> u64 {
        match self.tsc {
            Some(t) => (ticks().wrapping_sub(t.start) as f64 * t.ns_per_tick) as u64,
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }
}

impl Tsc {
    fn calibrate() -> Option<Tsc> {
        if !invariant_tsc() {
            return None;
        }
        let (i0, t0) = (Instant::now(), ticks());
        // 20 ms: the calibration error is then below 0.1 %.
        while i0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (ns, t1) = (i0.elapsed().as_nanos() as f64, ticks());
        let dt = t1.wrapping_sub(t0);
        (dt > 0).then(|| Tsc {
            start: t1,
            ns_per_tick: ns / dt as f64,
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    0
}

/// The TSC ticks at one rate in every state on every CPU, per the kernel.
fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.contains(&"constant_tsc") && f.contains(&"nonstop_tsc")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_instant_within_a_percent() {
        let c = Clock::new();
        let i0 = Instant::now();
        let a = c.now_ns();
        std::thread::sleep(Duration::from_millis(30));
        let b = c.now_ns();
        let want = i0.elapsed().as_nanos() as f64;
        let got = b.saturating_sub(a) as f64;
        assert!(
            (got - want).abs() < want * 0.01 + 200_000.0,
            "clock says {got} ns, Instant {want} ns"
        );
        assert!(b > a);
    }
}
