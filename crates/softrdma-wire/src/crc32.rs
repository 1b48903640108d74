//! The CRC-32 behind the ICRC (the Ethernet/zlib polynomial, reflected: the
//! CRC `crc32fast` computes), folded in one pass with its state kept wide
//! until the end, on every CPU class.
//!
//! `crc32fast` folds as fast as the kernels here, but each of its `update`
//! calls ends by collapsing its streams and reducing to 32 bits: the ICRC,
//! taken as two updates (the 40 or 60 pseudo-header bytes, then the
//! packet), pays that twice, and the short first update is a chain of
//! dependent multiplies on its own; a length that is not a whole number of
//! its blocks ends in a serial tail. Here the input is padded at the front
//! with zeros to whole blocks (the pseudo-header and the start of the
//! packet form the first one or two, built in a buffer and folded last:
//! see `x86.rs`), folded, and collapsed once. Inputs of 32 to 511 bytes
//! take one pass of the 128-bit kernel on every x86 path.
//!
//! Which kernel runs is a [`Path`], chosen once per process: the widest the
//! CPU has (see [`Path::detect`]), or the one `SOFTRDMA_CRC32` names
//! (`avx512`, `avx2`, `pclmul`, `portable`) if the CPU has it, or one set
//! by [`force`] (tests and benchmarks, to measure on one machine what
//! another CPU class would run). Every path gives the same CRC (tested
//! below against `crc32fast`, and in `tests/crc32_paths.rs`).

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(target_arch = "x86_64")]
mod x86;

/// The longest head the folding kernels take in their first blocks.
const MAX_HEAD: usize = 256;

/// The shortest input the 128-bit kernel takes in one pass (below, and on
/// [`Path::Portable`], `crc32fast`).
const SHORT_MIN: usize = 32;

/// A CRC-32 implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// 512-bit VPCLMULQDQ folding (x86-64 with AVX-512F and VPCLMULQDQ).
    Avx512,
    /// 256-bit VPCLMULQDQ folding (x86-64 with AVX2 and VPCLMULQDQ and no
    /// AVX-512, such as AMD Zen 3).
    Avx2,
    /// 128-bit PCLMULQDQ folding (x86-64 with PCLMULQDQ and SSE4.1).
    Pclmul,
    /// `crc32fast` throughout, with whatever kernel it picks for the CPU
    /// (on AArch64 its CRC32/PMULL code, on CPUs without carry-less
    /// multiply its table-driven code).
    Portable,
}

impl Path {
    /// Every path, widest first.
    pub const ALL: [Path; 4] = [Path::Avx512, Path::Avx2, Path::Pclmul, Path::Portable];

    /// The name `SOFTRDMA_CRC32` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Path::Avx512 => "avx512",
            Path::Avx2 => "avx2",
            Path::Pclmul => "pclmul",
            Path::Portable => "portable",
        }
    }

    /// The path called `name` ([`Path::name`]), if any.
    pub fn from_name(name: &str) -> Option<Path> {
        Path::ALL.into_iter().find(|p| p.name() == name.trim())
    }

    /// Whether this CPU has every feature the path's kernel uses.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Path::Avx512 => x86::has_avx512(),
                Path::Avx2 => x86::has_avx2(),
                Path::Pclmul => x86::has_pclmul(),
                Path::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Path::Portable
        }
    }

    /// The widest path this CPU supports.
    pub fn detect() -> Path {
        Path::ALL
            .into_iter()
            .find(|p| p.supported())
            .unwrap_or(Path::Portable)
    }

    /// Bytes per folding block, and the shortest input (head and body) the
    /// kernel takes: below it `crc32fast` is as fast. `None` for
    /// [`Path::Portable`].
    const fn kernel(self) -> Option<(usize, usize)> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => Some((x86::avx512::BLOCK, 2 * x86::avx512::BLOCK)),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => Some((x86::avx2::BLOCK, 2 * x86::avx2::BLOCK)),
            #[cfg(target_arch = "x86_64")]
            Path::Pclmul => Some((x86::pclmul::BLOCK, 2 * x86::pclmul::BLOCK)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The chosen path (an index into [`Path::ALL`]), or `UNSET`.
static ACTIVE: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

/// The path every CRC in this process takes: the one [`force`]d last, else
/// the one `SOFTRDMA_CRC32` names if the CPU supports it, else
/// [`Path::detect`]. Chosen on first use; always a supported path.
pub fn active() -> Path {
    match Path::ALL.get(usize::from(ACTIVE.load(Ordering::Relaxed))) {
        Some(&p) => p,
        None => {
            let p = std::env::var("SOFTRDMA_CRC32")
                .ok()
                .and_then(|s| Path::from_name(&s))
                .filter(|p| p.supported())
                .unwrap_or_else(Path::detect);
            store(p);
            p
        }
    }
}

/// Makes `path` the one every later CRC takes, process-wide, if the CPU
/// supports it (returns whether it does; if not, nothing changes). For
/// tests and benchmarks: results are the same on every path, only speed
/// differs.
pub fn force(path: Path) -> bool {
    let ok = path.supported();
    if ok {
        store(path);
    }
    ok
}

fn store(p: Path) {
    let i = Path::ALL.iter().position(|&q| q == p).unwrap_or(0);
    ACTIVE.store(i as u8, Ordering::Relaxed);
}

/// The CRC continuing from `crc` (as `crc32fast` takes it) over `head`
/// then `body`, on the [`active`] path.
pub(crate) fn checksum(crc: u32, head: &[u8], body: &[u8]) -> u32 {
    // SAFETY: `active` returns only supported paths; a slice is readable.
    unsafe { on_path(active(), crc, head, body.as_ptr(), body.len(), Some(body)) }
}

/// [`checksum`] over a body given by address, for bytes that must not be
/// borrowed as a slice (registered memory that peers and the application
/// may write at any time): they are only read with raw-pointer loads and
/// copies, as the drivers' region copies read them.
///
/// # Safety
/// `body` must be valid for reads of `len` bytes for the duration of the call.
pub(crate) unsafe fn checksum_raw(crc: u32, head: &[u8], body: *const u8, len: usize) -> u32 {
    // SAFETY: `active` returns only supported paths; the body by the contract.
    unsafe { on_path(active(), crc, head, body, len, None) }
}

/// [`checksum_raw`] on a given path (an unsupported one runs as
/// [`Path::Portable`]): for tests that compare the paths.
///
/// # Safety
/// As [`checksum_raw`].
#[cfg(test)]
pub(crate) unsafe fn checksum_raw_on(
    path: Path,
    crc: u32,
    head: &[u8],
    body: *const u8,
    len: usize,
) -> u32 {
    let path = if path.supported() {
        path
    } else {
        Path::Portable
    };
    // SAFETY: checked just above; the body by the contract.
    unsafe { on_path(path, crc, head, body, len, None) }
}

/// The CRC over `head` then the `len` bytes at `body` on `path`, through
/// its kernel where it has one and the input suits it, else `crc32fast`
/// (over `slice`, the same bytes, when the caller may borrow them).
///
/// # Safety
/// `path` is supported; `body` is readable for `len` bytes.
unsafe fn on_path(
    path: Path,
    crc: u32,
    head: &[u8],
    body: *const u8,
    len: usize,
    slice: Option<&[u8]>,
) -> u32 {
    if let Some((block, min)) = path.kernel() {
        // The kernels take a whole block from the body (after up to 4
        // bytes that a short head takes into it).
        if head.len() + len >= min && len >= block + 4 {
            // SAFETY: passed on.
            return unsafe { folded(path, crc, head, body, len) };
        }
        // Short inputs (a header and a little payload: ACKs, small
        // messages) in one pass of the 128-bit kernel, which every x86
        // path's CPU has.
        #[cfg(target_arch = "x86_64")]
        if head.len() + len >= SHORT_MIN && (4..=MAX_HEAD).contains(&head.len()) {
            // SAFETY: `path` is an x86 path with a kernel, so the CPU has
            // PCLMULQDQ and SSE4.1; the body as passed on.
            return unsafe { padded(Path::Pclmul, crc, head, body, len) };
        }
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(head);
    match slice {
        Some(s) => h.update(s),
        // SAFETY: passed on.
        None => unsafe { update_raw(&mut h, body, len) },
    }
    h.finalize()
}

/// Feeds the `len` bytes at `body` to `h` through a bounce buffer: no
/// slice of the body is ever formed.
///
/// # Safety
/// `body` is readable for `len` bytes.
unsafe fn update_raw(h: &mut crc32fast::Hasher, body: *const u8, len: usize) {
    let mut chunk = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        // SAFETY: `body + done .. + n` lies within the caller's readable range.
        unsafe { std::ptr::copy_nonoverlapping(body.add(done), chunk.as_mut_ptr(), n) };
        h.update(&chunk[..n]);
        done += n;
    }
}

/// [`on_path`] through `path`'s kernel. A head of fewer than 4 bytes takes
/// its first body bytes into it (the running value enters through the
/// first 4 bytes); a head longer than [`MAX_HEAD`] goes first on its own.
///
/// # Safety
/// As [`on_path`], and `path` has a kernel whose block the body, less 4
/// bytes, still holds.
unsafe fn folded(path: Path, crc: u32, head: &[u8], body: *const u8, len: usize) -> u32 {
    if head.len() > MAX_HEAD {
        let (a, b) = head.split_at(MAX_HEAD);
        // SAFETY: a slice is readable; `path` unchanged. `on_path` takes
        // any length (short ones to `crc32fast`).
        let crc = unsafe { on_path(path, crc, a, b.as_ptr(), b.len(), Some(b)) };
        // SAFETY: passed on.
        return unsafe { on_path(path, crc, &[], body, len, None) };
    }
    if head.len() < 4 {
        let (h, k) = (head.len(), (4 - head.len()).min(len));
        let mut four = [0u8; 4];
        four[..h].copy_from_slice(head);
        // SAFETY: `k <= len` bytes of the body are readable.
        unsafe { std::ptr::copy_nonoverlapping(body, four[h..].as_mut_ptr(), k) };
        // SAFETY: the rest of the body, from `body + k`.
        return unsafe { padded(path, crc, &four[..h + k], body.add(k), len - k) };
    }
    // SAFETY: passed on.
    unsafe { padded(path, crc, head, body, len) }
}

/// Runs `path`'s kernel over `head` (4 to [`MAX_HEAD`] bytes) then `body`,
/// padded at the front with zero bytes to whole blocks, the running value
/// XORed into the first real bytes: leading zeros do not change a CRC taken
/// that way (the register starts at zero), and nothing is left over for a
/// tail, so there is one reduction to 32 bits.
///
/// # Safety
/// `path` is supported and has a kernel, `4 <= head.len() <= MAX_HEAD`,
/// and `body` is readable for `len` bytes.
unsafe fn padded(path: Path, crc: u32, head: &[u8], body: *const u8, len: usize) -> u32 {
    let Some((block, _)) = path.kernel() else {
        return crc; // unreachable: only paths with a kernel come here
    };
    let h = head.len();
    let pad = (block - (h + len) % block) % block;
    // The padded input is whole blocks: the first ones (the pad, the head
    // and the start of the body) are built here, `body` supplies the rest.
    // Fixed-size writes where possible (no `memset`/`memcpy` calls): zeros
    // over the largest pad, the head, then a block of the body (or all of
    // a shorter one).
    let mut first = std::mem::MaybeUninit::<[u8; 3 * MAX_HEAD]>::uninit();
    let f = first.as_mut_ptr().cast::<u8>();
    // SAFETY: all writes land in `first`: pad < block <= MAX_HEAD, and
    // pad + h + block <= 3 * MAX_HEAD; at most `len` body bytes are read.
    unsafe {
        std::ptr::write_bytes(f, 0, MAX_HEAD);
        std::ptr::copy_nonoverlapping(head.as_ptr(), f.add(pad), h);
        let w = f.add(pad).cast::<u32>();
        w.write_unaligned(w.read_unaligned() ^ (!crc).to_le());
        std::ptr::copy_nonoverlapping(body, f.add(pad + h), block.min(len));
    }
    let first_len = (pad + h).div_ceil(block) * block;
    // The whole padded length is a multiple of `block` and at least
    // `pad + h`, so at least `first_len`: the body has `split < block` bytes.
    let split = first_len - pad - h;
    let (rest, rest_len) = (body.wrapping_add(split), len - split);
    // SAFETY: `path` is supported (caller's contract), so its kernel's
    // features are present; `first` holds `first_len` initialised bytes
    // and the remaining `rest_len` body bytes (whole blocks) are readable.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => x86::avx512::run(f, first_len, rest, rest_len),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => x86::avx2::run(f, first_len, rest, rest_len),
            #[cfg(target_arch = "x86_64")]
            Path::Pclmul => x86::pclmul::run(f, first_len, rest, rest_len),
            _ => crc,
        }
    }
}

/// The x86 features the CRC-32 paths depend on, as `name yes/no`, for
/// benchmarks to print beside their figures.
pub fn cpu_flags() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        [
            ("avx512f", has!("avx512f")),
            ("avx2", has!("avx2")),
            ("vpclmulqdq", has!("vpclmulqdq")),
            ("pclmulqdq", has!("pclmulqdq")),
            ("sse4.1", has!("sse4.1")),
        ]
        .iter()
        .map(|(n, y)| format!("{n} {}", if *y { "yes" } else { "no" }))
        .collect::<Vec<_>>()
        .join(", ")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        format!("{} (no x86 features)", std::env::consts::ARCH)
    }
}

#[cfg(test)]
mod tests {
    use super::{checksum_raw_on, Path};

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

    fn reference(init: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(init);
        h.update(data);
        h.finalize()
    }

    fn on(path: Path, init: u32, head: &[u8], body: &[u8]) -> u32 {
        // SAFETY: a slice is readable for its length.
        unsafe { checksum_raw_on(path, init, head, body.as_ptr(), body.len()) }
    }

    fn paths() -> Vec<Path> {
        let p: Vec<Path> = Path::ALL.into_iter().filter(|p| p.supported()).collect();
        eprintln!("paths this CPU supports: {p:?}");
        p
    }

    #[test]
    fn every_path_matches_crc32fast_for_every_length_up_to_4200() {
        // Every length, each at a different alignment, head length and
        // initial value (the sweeps below vary those on their own).
        let data = bytes(4200 + 64, 7);
        let heads = [0, 1, 3, 4, 12, 40, 60, 88, 255, 256, 300];
        let inits = [0u32, 0x2144_DF1C, 0xFFFF_FFFF, 0x1234_5678];
        let paths = paths();
        for len in 0..=4200 {
            let align = len % 64;
            let d = &data[align..align + len];
            let head = heads[len % heads.len()].min(len);
            let init = inits[len % inits.len()];
            let want = reference(init, d);
            for &p in &paths {
                assert_eq!(
                    on(p, init, &d[..head], &d[head..]),
                    want,
                    "{p} len {len} align {align} head {head} init {init:#x}"
                );
            }
        }
    }

    #[test]
    fn every_path_matches_crc32fast_at_every_alignment_and_head() {
        let data = bytes(9100, 11);
        let paths = paths();
        for len in [
            0, 3, 4, 127, 128, 255, 256, 511, 512, 1052, 2048, 4124, 4152, 9000,
        ] {
            for align in 0..64 {
                let d = &data[align..align + len];
                for head in [0, 2, 4, 40, 60, 128, 200, 256, 257, 600] {
                    let head = head.min(len);
                    let want = reference(0x2144_DF1C, d);
                    for &p in &paths {
                        let got = on(p, 0x2144_DF1C, &d[..head], &d[head..]);
                        assert_eq!(got, want, "{p} len {len} align {align} head {head}");
                    }
                }
            }
        }
    }

    #[test]
    fn path_names_round_trip() {
        for p in Path::ALL {
            assert_eq!(Path::from_name(p.name()), Some(p));
        }
        assert_eq!(Path::from_name("avx1024"), None);
        assert!(Path::Portable.supported());
        assert!(Path::detect().supported());
    }
}
