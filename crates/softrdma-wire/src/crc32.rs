//! A CRC-32 (the Ethernet/zlib polynomial, reflected) folded in 256-byte
//! blocks, with its folding state kept wide until the end, for the ICRC.
//!
//! `crc32fast` folds with VPCLMULQDQ as fast as this does, but each of its
//! `update` calls ends by collapsing its streams and reducing to 32 bits:
//! the ICRC, taken as two updates (the 40 or 60 pseudo-header bytes, then
//! the packet), pays that twice, and the short first update is a chain of
//! dependent multiplies on its own; a length that is not a whole number of
//! its blocks ends in a byte-wise tail. Here [`checksum`] pads the input at
//! the front with zeros to whole 256-byte blocks (the pseudo-header and the
//! start of the packet form the first one or two), folds them into four
//! 512-bit accumulators and collapses those once (as a tree). On CPUs
//! without AVX-512F and VPCLMULQDQ it is `crc32fast` throughout. Results
//! are identical either way (tested against `crc32fast` below and in
//! `icrc`).
//!
//! The fold constants for a fold by `D` bits are the pair
//! `(reflect(x^(D+32) mod P) << 1, reflect(x^(D-32) mod P) << 1)`, as in
//! `crc32fast` and the Intel paper it follows.

#![allow(unsafe_code)]

/// Bytes per block.
pub(crate) const BLOCK: usize = 256;

/// The CRC continuing from `crc` (as `crc32fast` takes it) over `head`
/// then `body`.
///
/// With the wide fold the input is padded at the front with zero bytes up
/// to whole blocks, the running value entering at the first real byte:
/// leading zeros do not change a CRC taken that way, and nothing is left
/// over for a short tail, so there is one reduction to 32 bits and no
/// `crc32fast` pass for the tail. Elsewhere (or for short inputs) it is
/// `crc32fast` over both.
pub(crate) fn checksum(crc: u32, head: &[u8], body: &[u8]) -> u32 {
    // SAFETY: a slice is valid for reads of its whole length.
    unsafe { checksum_raw(crc, head, body.as_ptr(), body.len()) }
}

/// [`checksum`] over a body given by address, for bytes that must not be
/// borrowed as a slice (registered memory that peers and the application
/// may write at any time): they are only read with raw-pointer loads and
/// copies, as the drivers' region copies read them.
///
/// # Safety
/// `body` must be valid for reads of `len` bytes for the duration of the call.
pub(crate) unsafe fn checksum_raw(crc: u32, head: &[u8], body: *const u8, len: usize) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if head.len() + len >= 2 * BLOCK && (4..=BLOCK).contains(&head.len()) && wide::available() {
        let total = head.len() + len;
        let pad = (BLOCK - total % BLOCK) % BLOCK;
        let h = head.len();
        let mut first = [0u8; 2 * BLOCK];
        first[pad..pad + h].copy_from_slice(head);
        for (b, c) in first[pad..pad + 4].iter_mut().zip((!crc).to_le_bytes()) {
            *b ^= c;
        }
        // The padded input is a whole number of blocks, at least two: the
        // first one or two are built here, `body` supplies the rest whole.
        let first_len = if pad + h <= BLOCK { BLOCK } else { 2 * BLOCK };
        let split = first_len - pad - h;
        if split <= len {
            // SAFETY: `body` is readable for `len >= split` bytes (caller's
            // contract); `first` has room for them after the head.
            unsafe {
                std::ptr::copy_nonoverlapping(body, first[pad + h..].as_mut_ptr(), split);
            }
            let b0: &[u8; BLOCK] = first[..BLOCK].try_into().unwrap_or(&[0; BLOCK]);
            // SAFETY: `available()` checked every feature these enable; the
            // rest of the body, `len - split` bytes (a whole number of
            // blocks) from `body + split`, is readable by the caller's contract.
            return unsafe {
                // The running value is already in the bytes: start from 0.
                let mut acc = wide::begin(u32::MAX, b0);
                wide::fold(
                    &mut acc,
                    first[BLOCK..first_len].as_ptr(),
                    first_len - BLOCK,
                );
                wide::fold(&mut acc, body.add(split), len - split);
                wide::collapse(&acc)
            };
        }
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(head);
    // Through a bounce buffer: no slice of the body is ever formed.
    let mut chunk = [0u8; 512];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        // SAFETY: `body + done .. + n` lies within the caller's readable range.
        unsafe { std::ptr::copy_nonoverlapping(body.add(done), chunk.as_mut_ptr(), n) };
        h.update(&chunk[..n]);
        done += n;
    }
    h.finalize()
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use super::BLOCK;
    use core::arch::x86_64::*;

    // Fold constants (see the module comment), low then high quadword.
    const K128: (i64, i64) = (0x1751997d0, 0x0ccaa009e);
    const K256: (i64, i64) = (0x0f1da05aa, 0x15a546366);
    const K384: (i64, i64) = (0x03db1ecdc, 0x174359406);
    const K512: (i64, i64) = (0x154442bd4, 0x1c6e41596);
    const K1024: (i64, i64) = (0x1e88ef372, 0x14a7fe880);
    const K2048: (i64, i64) = (0x11542778a, 0x1322d1430);
    const K5: i64 = 0x163cd6124;
    const P_X: i64 = 0x1DB710641;
    const U_PRIME: i64 = 0x1F7011641;

    /// AVX-512F and VPCLMULQDQ (with PCLMULQDQ and SSE4.1 for the final
    /// reduction) are present. `std` caches the detection.
    #[inline]
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("pclmulqdq")
            && std::is_x86_feature_detected!("sse4.1")
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(b: &[u8]) -> __m512i {
        let b: &[u8; 64] = b[..64].try_into().unwrap_or(&[0; 64]);
        // SAFETY: `b` is 64 readable bytes; an unaligned load has no other requirement.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    /// 64 bytes from `p`.
    ///
    /// # Safety
    /// `p` must be readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_raw(p: *const u8) -> __m512i {
        // SAFETY: the caller's contract; an unaligned load has no other requirement.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn keys512(k: (i64, i64)) -> __m512i {
        _mm512_set_epi64(k.1, k.0, k.1, k.0, k.1, k.0, k.1, k.0)
    }

    /// `b ^ fold(a)`: each 128-bit lane of `a` moved forward by the distance `k` is for.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(a, k, 0x11);
        // 0x96: three-way XOR.
        _mm512_ternarylogic_epi64(lo, hi, b, 0x96)
    }

    /// The accumulators after `first`, starting from CRC value `crc`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub(super) fn begin(crc: u32, first: &[u8; BLOCK]) -> [__m512i; 4] {
        let v0 = load(&first[0..]);
        // The running CRC enters as the first 32 bits, inverted.
        let v0 = _mm512_xor_si512(v0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32)));
        [
            v0,
            load(&first[64..]),
            load(&first[128..]),
            load(&first[192..]),
        ]
    }

    /// Folds the whole blocks of the `len` bytes at `data` into the accumulators.
    ///
    /// # Safety
    /// `data` must be readable for `len` bytes.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub(super) unsafe fn fold(acc: &mut [__m512i; 4], mut data: *const u8, mut len: usize) {
        let [mut v0, mut v1, mut v2, mut v3] = *acc;
        let k = keys512(K2048);
        while len >= BLOCK {
            // SAFETY: the next BLOCK bytes at `data` are readable (caller's contract).
            unsafe {
                v0 = fold512(v0, load_raw(data), k);
                v1 = fold512(v1, load_raw(data.add(64)), k);
                v2 = fold512(v2, load_raw(data.add(128)), k);
                v3 = fold512(v3, load_raw(data.add(192)), k);
                data = data.add(BLOCK);
            }
            len -= BLOCK;
        }
        *acc = [v0, v1, v2, v3];
    }

    /// The CRC value of everything folded so far.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) fn collapse(acc: &[__m512i; 4]) -> u32 {
        let [v0, v1, v2, v3] = *acc;
        // As a tree: v0 → v2 and v1 → v3 (128 bytes on), then the first into the second (64).
        let k1024 = keys512(K1024);
        let a = fold512(v0, v2, k1024);
        let b = fold512(v1, v3, k1024);
        let c = fold512(a, b, keys512(K512));
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

    /// 128 bits to the 32-bit CRC value: two folds and a Barrett reduction,
    /// as `crc32fast` ends.
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
}

#[cfg(test)]
mod tests {
    use super::checksum;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn checksum_matches_crc32fast_for_every_length_and_head() {
        for len in (0..1400).chain([2047, 2048, 4096, 4112, 4152, 4172, 9000]) {
            let data = bytes(len, len as u32 ^ 0x55);
            for head in [0, 3, 4, 40, 60, 200, 256, 300] {
                if head > len {
                    continue;
                }
                for init in [0u32, 0x2144_DF1C, 0xFFFF_FFFF] {
                    let mut want = crc32fast::Hasher::new_with_initial(init);
                    want.update(&data);
                    let got = checksum(init, &data[..head], &data[head..]);
                    assert_eq!(got, want.finalize(), "len {len} head {head} init {init:#x}");
                }
            }
        }
    }
}
