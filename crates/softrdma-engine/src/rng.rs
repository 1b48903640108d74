//! Random numbers.
//!
//! [`Rng`] is a small seeded generator (SplitMix64) for simulation choices
//! (losses, delays, workloads): fast and deterministic for a seed, which is
//! what replaying a simulation needs, and predictable from a few outputs,
//! so it never makes anything a peer must not guess.
//!
//! [`SecretRng`] makes what a peer must not guess — memory keys and QPNs —
//! with ChaCha20 (the RustCrypto `chacha20` crate's `ChaCha20Rng`), seeded
//! from 32 bytes the driver gives ([`crate::EngineConfig::key_seed`]) or, for
//! deterministic runs, derived from [`crate::EngineConfig::seed`]. The engine
//! never reads OS randomness itself.

use chacha20::ChaCha20Rng;
use rand_core::{Rng as _, SeedableRng as _};

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

/// What a [`SecretRng`] stream is for. Each purpose has its own ChaCha
/// stream (nonce) under the same seed, so the keys an engine hands out do
/// not depend on how many QPs it created, nor the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// lkeys and rkeys.
    MemoryKeys = 1,
    /// QP numbers.
    Qpns = 2,
}

/// A cryptographically secure generator (ChaCha20) for values a peer must
/// not be able to predict from the ones it has seen.
pub(crate) struct SecretRng(ChaCha20Rng);

impl std::fmt::Debug for SecretRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the state: it would give every future value away.
        f.write_str("SecretRng(..)")
    }
}

/// The label filling the rest of a seed derived from a 64-bit `seed`.
const DERIVED_SEED_LABEL: &[u8; 24] = b"softrdma key/qpn seed v1";

/// The 32-byte ChaCha seed used when the configuration gives none: the
/// 64-bit `seed` (little-endian) followed by a fixed label. Distinct seeds
/// give distinct ChaCha keys, so runs stay a function of `seed` alone; the
/// values are only as secret as `seed` is.
pub(crate) fn derived_seed(seed: u64) -> [u8; 32] {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8..].copy_from_slice(DERIVED_SEED_LABEL);
    s
}

impl SecretRng {
    /// The stream for `purpose` under the 32-byte `seed`.
    pub fn new(seed: [u8; 32], purpose: Purpose) -> Self {
        let mut r = ChaCha20Rng::from_seed(seed);
        r.set_stream(purpose as u64);
        SecretRng(r)
    }
    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_differ_per_seed_and_streams_per_purpose() {
        assert_ne!(derived_seed(0), derived_seed(1));
        let mut a = SecretRng::new(derived_seed(7), Purpose::MemoryKeys);
        let mut b = SecretRng::new(derived_seed(7), Purpose::MemoryKeys);
        let mut q = SecretRng::new(derived_seed(7), Purpose::Qpns);
        let va: Vec<u32> = (0..8).map(|_| a.next_u32()).collect();
        let vb: Vec<u32> = (0..8).map(|_| b.next_u32()).collect();
        let vq: Vec<u32> = (0..8).map(|_| q.next_u32()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vq);
    }

    #[test]
    fn chacha20_stream_is_the_rfc_one() {
        // ChaCha20 with an all-zero key and nonce: the first keystream words
        // of RFC 8439's test vector (A.1, #1), so the generator really is
        // ChaCha20 and not something merely shaped like it.
        let mut r = ChaCha20Rng::from_seed([0; 32]);
        assert_eq!(r.next_u32().to_le_bytes(), [0x76, 0xb8, 0xe0, 0xad]);
        assert_eq!(r.next_u32().to_le_bytes(), [0xa0, 0xf1, 0x3d, 0x90]);
    }
}
