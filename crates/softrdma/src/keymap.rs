//! A fast hasher for the driver's small integer keys.

/// Multiply-and-fold hasher for the driver's small integer keys (lkeys,
/// source ports): the direct path looks one up per SGE and every UDP send
/// one per source port, and std's SipHash costs more than the rest of such
/// a lookup. The keys are the engine's, not a peer's choice.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

/// A `HashMap` with [`KeyHasher`].
pub type KeyMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;
