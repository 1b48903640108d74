//! A fast hasher for the engine's `u32`-keyed tables.
//!
//! Every packet looks up its QP, and every memory access its region (by
//! lkey, or rkey then lkey): with std's SipHash these lookups cost more than
//! the protocol logic around them. The keys are QPNs and handles the engine
//! hands out and keys it draws at random, so a remote peer cannot choose
//! keys that collide (it can only look up keys that exist or miss), which
//! is what SipHash's flooding resistance protects against.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-and-fold hasher for small integer keys.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(K);
    }
    fn finish(&self) -> u64 {
        // Fold the well-mixed high half into the low bits the table indexes by.
        self.0 ^ (self.0 >> 32)
    }
}

/// A `HashMap` with [`KeyHasher`].
pub type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;
/// A `HashSet` with [`KeyHasher`].
pub type KeySet<K> = HashSet<K, BuildHasherDefault<KeyHasher>>;
