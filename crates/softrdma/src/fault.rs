//! Fault injection on receive, for tests and demos:
//! `SOFTRDMA_FAULT=loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7`.
//! Faults act on packets as they arrive, before the ICRC check, so a
//! corrupted packet is caught and counted like one damaged on a real wire.

use std::str::FromStr;

use softrdma_engine::Rng;

use crate::Error;

/// Fault probabilities (each 0.0..=1.0) and the generator seed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultSpec {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is held back behind the next one.
    pub reorder: f64,
    /// Probability a packet is delivered twice.
    pub dup: f64,
    /// Probability one bit of a packet is flipped.
    pub corrupt: f64,
    /// Seed of the generator (runs replay exactly).
    pub seed: u64,
}

impl FromStr for FaultSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let mut f = FaultSpec {
            seed: 1,
            ..Default::default()
        };
        for kv in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("fault spec item {kv:?} is not key=value")))?;
            if k == "seed" {
                f.seed = v.parse().map_err(|_| {
                    Error::Config(format!("fault spec seed {v:?} is not an integer"))
                })?;
                continue;
            }
            let p: f64 = v
                .parse()
                .ok()
                .filter(|p: &f64| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "fault spec {k}={v}: probability must be between 0 and 1"
                    ))
                })?;
            match k {
                "loss" => f.loss = p,
                "reorder" => f.reorder = p,
                "dup" => f.dup = p,
                "corrupt" => f.corrupt = p,
                _ => {
                    return Err(Error::Config(format!(
                        "fault spec key {k:?} is unknown (loss, reorder, dup, corrupt, seed)"
                    )))
                }
            }
        }
        Ok(f)
    }
}

/// Applies a [`FaultSpec`] to a stream of packets.
#[derive(Debug)]
pub(crate) struct FaultInjector {
    spec: FaultSpec,
    rng: Rng,
    held: Option<(std::net::SocketAddr, Vec<u8>)>,
    pub injected: u64,
}

impl FaultInjector {
    pub fn new(spec: FaultSpec) -> Self {
        FaultInjector {
            spec,
            rng: Rng::new(spec.seed),
            held: None,
            injected: 0,
        }
    }

    /// Feeds one received packet; `deliver` gets what comes out (zero, one or
    /// more packets, possibly an earlier held one).
    pub fn apply(
        &mut self,
        src: std::net::SocketAddr,
        data: &[u8],
        mut deliver: impl FnMut(std::net::SocketAddr, &[u8]),
    ) {
        if self.rng.chance(self.spec.loss) {
            self.injected += 1;
            return;
        }
        let mut pkt = data.to_vec();
        if self.rng.chance(self.spec.corrupt) && !pkt.is_empty() {
            self.injected += 1;
            let bit = self.rng.below(pkt.len() as u64 * 8);
            pkt[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        if self.held.is_none() && self.rng.chance(self.spec.reorder) {
            // Hold it back: it goes out after the next packet.
            self.injected += 1;
            self.held = Some((src, pkt));
            return;
        }
        deliver(src, &pkt);
        if self.rng.chance(self.spec.dup) {
            self.injected += 1;
            deliver(src, &pkt);
        }
        if let Some((s, p)) = self.held.take() {
            deliver(s, &p);
        }
    }

    /// Releases a held packet (when the stream goes quiet).
    pub fn flush(&mut self, mut deliver: impl FnMut(std::net::SocketAddr, &[u8])) {
        if let Some((s, p)) = self.held.take() {
            deliver(s, &p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spec() {
        let f: FaultSpec = "loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7"
            .parse()
            .unwrap();
        assert_eq!(
            f,
            FaultSpec {
                loss: 0.01,
                reorder: 0.01,
                dup: 0.005,
                corrupt: 0.001,
                seed: 7
            }
        );
        assert!("loss=2"
            .parse::<FaultSpec>()
            .unwrap_err()
            .to_string()
            .contains("between 0 and 1"));
        assert!("jitter=0.1"
            .parse::<FaultSpec>()
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }

    #[test]
    fn loss_rate_is_roughly_right() {
        let mut inj = FaultInjector::new(FaultSpec {
            loss: 0.1,
            seed: 3,
            ..Default::default()
        });
        let src = "127.0.0.1:1".parse().unwrap();
        let mut n = 0;
        for _ in 0..10_000 {
            inj.apply(src, &[1, 2, 3], |_, _| n += 1);
        }
        assert!(
            (8_700..9_300).contains(&n),
            "{n} of 10000 delivered at 10% loss"
        );
    }
}
