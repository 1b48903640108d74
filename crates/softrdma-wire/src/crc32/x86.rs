//! The folding kernels: 512-bit (AVX-512F + VPCLMULQDQ), 256-bit (AVX2 +
//! VPCLMULQDQ) and 128-bit (PCLMULQDQ + SSE4.1) carry-less multiplies.
//!
//! Each kernel takes input already padded at the front to whole blocks,
//! in two pieces (`first`, built by the caller with the head in it, and
//! `rest`, the remaining whole blocks of the body), loads its first block
//! into its accumulators, folds every further block into them, collapses
//! them onto one 128-bit lane as a tree and reduces that to 32 bits. The
//! running value is already XORed into the input, so the register starts
//! at zero.
//!
//! The first blocks (built in a buffer just before the call, so their
//! wide loads wait for the narrow stores that built them, and those for
//! everything before them to retire) are folded last where the rest is
//! long enough and tabled: the rest from its own first block, the first
//! blocks on their own, then moved on over the rest's length in one fold
//! (the CRC is linear) and added. The wait then overlaps the rest's fold
//! instead of delaying it.
//!
//! The fold constants for a fold by `D` bits are the pair
//! `(reflect(x^(D+32) mod P) << 1, reflect(x^(D-32) mod P) << 1)`, as in
//! `crc32fast` and the Intel paper it follows. Loads are unaligned raw
//! pointer loads: `rest` may be registered memory that is never borrowed.

use core::arch::x86_64::*;

// Fold constants for 16, 32, ... 256 bytes, low then high quadword.
const K128: (i64, i64) = (0x1751997d0, 0x0ccaa009e);
const K256: (i64, i64) = (0x0f1da05aa, 0x15a546366);
const K384: (i64, i64) = (0x03db1ecdc, 0x174359406);
const K512: (i64, i64) = (0x154442bd4, 0x1c6e41596);
const K1024: (i64, i64) = (0x1e88ef372, 0x14a7fe880);
const K2048: (i64, i64) = (0x11542778a, 0x1322d1430);
const K5: i64 = 0x163cd6124;
const P_X: i64 = 0x1DB710641;
const U_PRIME: i64 = 0x1F7011641;

/// The CRC polynomial, x^32 and below (not reflected).
const POLY: u64 = 0x1_04C1_1DB7;

/// `a * b mod POLY` over GF(2), for polynomials below x^32.
const fn mul_mod(a: u32, b: u32) -> u32 {
    let mut r = 0u64;
    let mut i = 0;
    while i < 32 {
        if (b >> i) & 1 == 1 {
            r ^= (a as u64) << i;
        }
        i += 1;
    }
    let mut bit = 63;
    while bit >= 32 {
        if (r >> bit) & 1 == 1 {
            r ^= POLY << (bit - 32);
        }
        bit -= 1;
    }
    r as u32
}

/// `x^n mod POLY`.
const fn x_pow(n: u32) -> u32 {
    let (mut r, mut base, mut n) = (1u32, 2u32, n);
    while n > 0 {
        if n & 1 == 1 {
            r = mul_mod(r, base);
        }
        base = mul_mod(base, base);
        n >>= 1;
    }
    r
}

/// The fold constant pair for `bytes` bytes (see the module comment).
const fn fold_key(bytes: u32) -> (i64, i64) {
    let d = 8 * bytes;
    (reflect(x_pow(d + 32)), reflect(x_pow(d - 32)))
}

/// A remainder as the reflected kernels use it.
const fn reflect(p: u32) -> i64 {
    ((p.reverse_bits() as u64) << 1) as i64
}

/// Longest rest (bytes) [`FOLD_KEYS`] covers: the largest UDP payload.
const KEYED_REST: usize = 65536;

/// `FOLD_KEYS[i]` folds by `128 * i` bytes (`i >= 1`): how far the first
/// blocks, folded last, are moved on over the rest.
static FOLD_KEYS: [(i64, i64); KEYED_REST / 128 + 1] = {
    let mut t = [(0i64, 0i64); KEYED_REST / 128 + 1];
    let mut i = 1;
    while i < t.len() {
        t[i] = fold_key(128 * i as u32);
        i += 1;
    }
    t
};

/// The fold constants over `rest` bytes (a multiple of 128), if tabled.
fn rest_key(rest: usize) -> Option<(i64, i64)> {
    rest.is_multiple_of(128)
        .then(|| FOLD_KEYS.get(rest / 128))
        .flatten()
        .copied()
}

/// AVX-512F and VPCLMULQDQ, with PCLMULQDQ and SSE4.1 for the final
/// reduction. `std` caches the detection.
pub(super) fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("vpclmulqdq")
        && has_pclmul()
}

/// AVX2 and VPCLMULQDQ (with PCLMULQDQ and SSE4.1).
pub(super) fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("vpclmulqdq")
        && has_pclmul()
}

/// PCLMULQDQ and SSE4.1.
pub(super) fn has_pclmul() -> bool {
    std::is_x86_feature_detected!("pclmulqdq") && std::is_x86_feature_detected!("sse4.1")
}

/// The 512-bit kernel: four accumulators, 256-byte blocks.
pub(super) mod avx512 {
    use super::*;

    /// Bytes per block.
    pub(in crate::crc32) const BLOCK: usize = 256;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn keys(k: (i64, i64)) -> __m512i {
        _mm512_set_epi64(k.1, k.0, k.1, k.0, k.1, k.0, k.1, k.0)
    }

    /// 64 bytes from `p`.
    ///
    /// # Safety
    /// `p` must be readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const u8) -> __m512i {
        // SAFETY: the caller's contract; an unaligned load has no other requirement.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    /// `b ^ fold(a)`: each 128-bit lane of `a` moved on by the distance `k` is for.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(a, k, 0x11);
        // 0x96: three-way XOR.
        _mm512_ternarylogic_epi64(lo, hi, b, 0x96)
    }

    /// Folds the `len / BLOCK` whole blocks at `p` into `acc`.
    ///
    /// # Safety
    /// `p` must be readable for `len` bytes.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    unsafe fn fold_blocks(acc: &mut [__m512i; 4], mut p: *const u8, mut len: usize) {
        let [mut v0, mut v1, mut v2, mut v3] = *acc;
        let k = keys(K2048);
        while len >= BLOCK {
            // SAFETY: the next BLOCK bytes at `p` are readable (caller's contract).
            unsafe {
                v0 = fold(v0, load(p), k);
                v1 = fold(v1, load(p.add(64)), k);
                v2 = fold(v2, load(p.add(128)), k);
                v3 = fold(v3, load(p.add(192)), k);
                p = p.add(BLOCK);
            }
            len -= BLOCK;
        }
        *acc = [v0, v1, v2, v3];
    }

    /// The CRC of `first[..first_len]` then `rest[..rest_len]`, both whole
    /// blocks, `first_len >= BLOCK`.
    ///
    /// # Safety
    /// The CPU has [`has_avx512`]'s features; both ranges are readable.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(in crate::crc32) unsafe fn run(
        first: *const u8,
        first_len: usize,
        rest: *const u8,
        rest_len: usize,
    ) -> u32 {
        // SAFETY: `first` holds at least one block; the rest by the contract.
        let head = |p: *const u8| unsafe {
            [load(p), load(p.add(64)), load(p.add(128)), load(p.add(192))]
        };
        let key = rest_key(rest_len).filter(|_| rest_len >= BLOCK);
        // SAFETY: as above.
        let acc = unsafe {
            let mut f = head(first);
            fold_blocks(&mut f, first.add(BLOCK), first_len - BLOCK);
            match key {
                None => {
                    fold_blocks(&mut f, rest, rest_len);
                    f
                }
                Some(k) => {
                    let mut r = head(rest);
                    fold_blocks(&mut r, rest.add(BLOCK), rest_len - BLOCK);
                    let k = keys(k);
                    [0, 1, 2, 3].map(|i| fold(f[i], r[i], k))
                }
            }
        };
        collapse(&acc)
    }

    /// The four accumulators (64 bytes apart) to the CRC value.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    fn collapse(acc: &[__m512i; 4]) -> u32 {
        let [v0, v1, v2, v3] = *acc;
        // As a tree: v0 → v2 and v1 → v3 (128 bytes on), then the first into the second (64).
        let k1024 = keys(K1024);
        let a = fold(v0, v2, k1024);
        let b = fold(v1, v3, k1024);
        let c = fold(a, b, keys(K512));
        // Lanes 0, 1 and 2 moved onto lane 3 (48, 32 and 16 bytes on) in one multiply.
        let k = _mm512_set_epi64(0, 0, K128.1, K128.0, K256.1, K256.0, K384.1, K384.0);
        let lo = _mm512_clmulepi64_epi128(c, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(c, k, 0x11);
        let last = _mm512_maskz_mov_epi64(0xC0, c);
        let t = _mm512_ternarylogic_epi64(lo, hi, last, 0x96);
        let x = _mm_xor_si128(
            _mm_xor_si128(_mm512_castsi512_si128(t), _mm512_extracti32x4_epi32(t, 1)),
            _mm_xor_si128(
                _mm512_extracti32x4_epi32(t, 2),
                _mm512_extracti32x4_epi32(t, 3),
            ),
        );
        reduce_128(x)
    }
}

/// The 256-bit kernel: eight accumulators, 256-byte blocks. Eight
/// independent chains keep two multiplies a cycle busy (AMD Zen 3 issues
/// that many) where four would wait on the multiply's latency.
pub(super) mod avx2 {
    use super::*;

    /// Bytes per block.
    pub(in crate::crc32) const BLOCK: usize = 256;

    #[inline]
    #[target_feature(enable = "avx2")]
    fn keys(k: (i64, i64)) -> __m256i {
        _mm256_set_epi64x(k.1, k.0, k.1, k.0)
    }

    /// 32 bytes from `p`.
    ///
    /// # Safety
    /// `p` must be readable for 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const u8) -> __m256i {
        // SAFETY: the caller's contract; an unaligned load has no other requirement.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    /// `b ^ fold(a)`, per 128-bit lane.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold(a: __m256i, b: __m256i, k: __m256i) -> __m256i {
        let lo = _mm256_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm256_clmulepi64_epi128(a, k, 0x11);
        _mm256_xor_si256(_mm256_xor_si256(lo, b), hi)
    }

    /// Eight 32-byte loads from `p`.
    ///
    /// # Safety
    /// `p` must be readable for `BLOCK` bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_block(p: *const u8) -> [__m256i; 8] {
        let mut v = [_mm256_setzero_si256(); 8];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: each load lies within the BLOCK bytes at `p`.
            *v = unsafe { load(p.add(32 * i)) };
        }
        v
    }

    /// Folds the `len / BLOCK` whole blocks at `p` into `acc`.
    ///
    /// # Safety
    /// `p` must be readable for `len` bytes.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    unsafe fn fold_blocks(acc: &mut [__m256i; 8], mut p: *const u8, mut len: usize) {
        let k = keys(K2048);
        let mut v = *acc;
        while len >= BLOCK {
            // SAFETY: the next BLOCK bytes at `p` are readable (caller's contract).
            let d = unsafe { load_block(p) };
            for i in 0..8 {
                v[i] = fold(v[i], d[i], k);
            }
            // SAFETY: stays within (or one past) the readable range.
            p = unsafe { p.add(BLOCK) };
            len -= BLOCK;
        }
        *acc = v;
    }

    /// As [`super::avx512::run`].
    ///
    /// # Safety
    /// The CPU has [`has_avx2`]'s features; both ranges are readable.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(in crate::crc32) unsafe fn run(
        first: *const u8,
        first_len: usize,
        rest: *const u8,
        rest_len: usize,
    ) -> u32 {
        let key = rest_key(rest_len).filter(|_| rest_len >= BLOCK);
        // SAFETY: `first` holds at least one block; the rest by the contract.
        let acc = unsafe {
            let mut f = load_block(first);
            fold_blocks(&mut f, first.add(BLOCK), first_len - BLOCK);
            match key {
                None => {
                    fold_blocks(&mut f, rest, rest_len);
                    f
                }
                Some(k) => {
                    let mut r = load_block(rest);
                    fold_blocks(&mut r, rest.add(BLOCK), rest_len - BLOCK);
                    let k = keys(k);
                    for i in 0..8 {
                        r[i] = fold(f[i], r[i], k);
                    }
                    r
                }
            }
        };
        collapse(&acc)
    }

    /// The eight accumulators (32 bytes apart) to the CRC value.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.1")]
    fn collapse(v: &[__m256i; 8]) -> u32 {
        // As a tree: 0-3 onto 4-7 (128 bytes on), 4-5 onto 6-7 (64), 6 onto 7 (32).
        let k = keys(K1024);
        let a = [
            fold(v[0], v[4], k),
            fold(v[1], v[5], k),
            fold(v[2], v[6], k),
            fold(v[3], v[7], k),
        ];
        let k = keys(K512);
        let b = [fold(a[0], a[2], k), fold(a[1], a[3], k)];
        let c = fold(b[0], b[1], keys(K256));
        // The low lane onto the high one (16 bytes on).
        let lo = _mm256_castsi256_si128(c);
        let hi = _mm256_extracti128_si256(c, 1);
        reduce_128(super::fold128(lo, hi, K128))
    }
}

/// The 128-bit kernel: eight accumulators, 128-byte blocks (eight chains
/// hide the multiply's latency; all of them and the constant fit in the
/// sixteen XMM registers).
pub(super) mod pclmul {
    use super::*;

    /// Bytes per block.
    pub(in crate::crc32) const BLOCK: usize = 128;

    /// Eight 16-byte loads from `p`.
    ///
    /// # Safety
    /// `p` must be readable for `BLOCK` bytes.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn load_block(p: *const u8) -> [__m128i; 8] {
        let mut v = [_mm_setzero_si128(); 8];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: each load lies within the BLOCK bytes at `p`; unaligned loads.
            *v = unsafe { _mm_loadu_si128(p.add(16 * i).cast()) };
        }
        v
    }

    /// Folds the `len / BLOCK` whole blocks at `p` into `acc`.
    ///
    /// # Safety
    /// `p` must be readable for `len` bytes.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    unsafe fn fold_blocks(acc: &mut [__m128i; 8], mut p: *const u8, mut len: usize) {
        let k = _mm_set_epi64x(K1024.1, K1024.0);
        let mut v = *acc;
        while len >= BLOCK {
            // SAFETY: the next BLOCK bytes at `p` are readable (caller's contract).
            let d = unsafe { load_block(p) };
            for i in 0..8 {
                v[i] = super::fold128_k(v[i], d[i], k);
            }
            // SAFETY: stays within (or one past) the readable range.
            p = unsafe { p.add(BLOCK) };
            len -= BLOCK;
        }
        *acc = v;
    }

    /// As [`super::avx512::run`].
    ///
    /// # Safety
    /// The CPU has [`has_pclmul`]'s features; both ranges are readable.
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    pub(in crate::crc32) unsafe fn run(
        first: *const u8,
        first_len: usize,
        rest: *const u8,
        rest_len: usize,
    ) -> u32 {
        let key = rest_key(rest_len).filter(|_| rest_len >= BLOCK);
        // SAFETY: `first` holds at least one block; the rest by the contract.
        let v = unsafe {
            let mut f = load_block(first);
            fold_blocks(&mut f, first.add(BLOCK), first_len - BLOCK);
            match key {
                None => {
                    fold_blocks(&mut f, rest, rest_len);
                    f
                }
                Some(k) => {
                    let mut r = load_block(rest);
                    fold_blocks(&mut r, rest.add(BLOCK), rest_len - BLOCK);
                    let k = _mm_set_epi64x(k.1, k.0);
                    for i in 0..8 {
                        r[i] = super::fold128_k(f[i], r[i], k);
                    }
                    r
                }
            }
        };
        // As a tree: 0-3 onto 4-7 (64 bytes on), 4-5 onto 6-7 (32), 6 onto 7 (16).
        let a = [
            super::fold128(v[0], v[4], K512),
            super::fold128(v[1], v[5], K512),
            super::fold128(v[2], v[6], K512),
            super::fold128(v[3], v[7], K512),
        ];
        let b = [
            super::fold128(a[0], a[2], K256),
            super::fold128(a[1], a[3], K256),
        ];
        reduce_128(super::fold128(b[0], b[1], K128))
    }
}

/// `b ^ fold(a)` by the distance the constant pair `k` is for.
#[inline]
#[target_feature(enable = "pclmulqdq,sse2")]
fn fold128(a: __m128i, b: __m128i, k: (i64, i64)) -> __m128i {
    fold128_k(a, b, _mm_set_epi64x(k.1, k.0))
}

/// [`fold128`] with the constants already in a register.
#[inline]
#[target_feature(enable = "pclmulqdq,sse2")]
fn fold128_k(a: __m128i, b: __m128i, k: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128(a, k, 0x00);
    let hi = _mm_clmulepi64_si128(a, k, 0x11);
    _mm_xor_si128(_mm_xor_si128(lo, b), hi)
}

/// 128 bits to the 32-bit CRC value: two folds and a Barrett reduction.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
fn reduce_128(x: __m128i) -> u32 {
    let k3k4 = _mm_set_epi64x(K128.1, K128.0);
    let mask32 = _mm_set_epi32(0, 0, 0, !0);
    let x = _mm_xor_si128(_mm_clmulepi64_si128(x, k3k4, 0x10), _mm_srli_si128(x, 8));
    let x = _mm_xor_si128(
        _mm_clmulepi64_si128(_mm_and_si128(x, mask32), _mm_set_epi64x(0, K5), 0x00),
        _mm_srli_si128(x, 4),
    );
    let pu = _mm_set_epi64x(U_PRIME, P_X);
    let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pu, 0x10);
    let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, mask32), pu, 0x00);
    !(_mm_extract_epi32(_mm_xor_si128(x, t2), 1) as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fold_keys_are_the_published_constants() {
        assert_eq!(super::fold_key(16), super::K128);
        assert_eq!(super::fold_key(32), super::K256);
        assert_eq!(super::fold_key(48), super::K384);
        assert_eq!(super::fold_key(64), super::K512);
        assert_eq!(super::FOLD_KEYS[1], super::K1024);
        assert_eq!(super::FOLD_KEYS[2], super::K2048);
        assert_eq!(super::rest_key(256), Some(super::K2048));
        assert_eq!(super::rest_key(100), None);
        assert_eq!(super::rest_key(super::KEYED_REST + 128), None);
    }
}
