//! Memory keys and QPNs: drawn from ChaCha20 under `EngineConfig::key_seed`
//! (or a seed derived from `EngineConfig::seed`), never zero or reserved,
//! never in use, never recently freed, and a function of the seed alone.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use softrdma_engine::sim::node_addr;
use softrdma_engine::*;

fn engine(seed: u64, key_seed: Option<[u8; 32]>) -> Engine {
    let mut c = EngineConfig::new(node_addr(0));
    c.seed = seed;
    c.key_seed = key_seed;
    Engine::new(c)
}

/// The lkeys and rkeys of `n` regions registered one after the other.
fn keys(e: &mut Engine, n: usize) -> Vec<(u32, u32)> {
    let pd = e.alloc_pd();
    (0..n)
        .map(|i| {
            let mem = Arc::new(VecMemory::new(64));
            let k = e
                .reg_mr(pd, 0x1000 * (i as u64 + 1), AccessFlags::LOCAL_WRITE, mem)
                .unwrap();
            (k.lkey.raw(), k.rkey.raw())
        })
        .collect()
}

fn qp_init(e: &mut Engine) -> QpInit {
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    }
}

/// The QPNs of `n` QPs created one after the other.
fn qpns(e: &mut Engine, n: usize) -> Vec<u32> {
    let init = qp_init(e);
    (0..n).map(|_| e.create_qp(init).unwrap().raw()).collect()
}

fn flat(k: &[(u32, u32)]) -> Vec<u32> {
    k.iter().flat_map(|&(l, r)| [l, r]).collect()
}

#[test]
fn keys_are_a_function_of_the_seed_when_no_key_seed_is_given() {
    let a = keys(&mut engine(1, None), 64);
    let b = keys(&mut engine(2, None), 64);
    assert_eq!(a, keys(&mut engine(1, None), 64), "same seed, same keys");
    assert_ne!(a, b, "different seeds, different keys");
    let sa: HashSet<u32> = flat(&a).into_iter().collect();
    assert!(
        flat(&b).iter().all(|k| !sa.contains(k)),
        "two seeds share no key (128 of 2^32 each)"
    );
}

#[test]
fn a_key_seed_decides_keys_and_qpns_whatever_the_seed() {
    let s1 = [0x11; 32];
    let mut s2 = s1;
    s2[31] ^= 1; // one bit apart
                 // Equal key seeds: equal keys and QPNs, even under different `seed`s.
    let (mut x, mut y) = (engine(1, Some(s1)), engine(99, Some(s1)));
    assert_eq!(keys(&mut x, 64), keys(&mut y, 64));
    assert_eq!(qpns(&mut x, 64), qpns(&mut y, 64));
    // Key seeds one bit apart: nothing in common.
    let (mut x, mut z) = (engine(1, Some(s1)), engine(1, Some(s2)));
    let (kx, kz) = (flat(&keys(&mut x, 64)), flat(&keys(&mut z, 64)));
    let sx: HashSet<u32> = kx.iter().copied().collect();
    assert!(kz.iter().all(|k| !sx.contains(k)), "{kx:x?} / {kz:x?}");
    assert_ne!(qpns(&mut x, 64), qpns(&mut z, 64));
    // A key seed is not the seed-derived one: Some(..) and None differ.
    assert_ne!(
        keys(&mut engine(1, Some(s1)), 8),
        keys(&mut engine(1, None), 8)
    );
}

#[test]
fn keys_do_not_depend_on_how_many_qps_were_made() {
    // Keys and QPNs come from separate streams: creating QPs in between
    // leaves the key sequence as it was.
    let mut a = engine(5, None);
    let mut b = engine(5, None);
    let ka = keys(&mut a, 16);
    qpns(&mut b, 10);
    assert_eq!(ka, keys(&mut b, 16));
}

#[test]
fn keys_are_non_zero_unique_and_not_reused_from_quarantine() {
    let mut e = engine(7, None);
    let pd = e.alloc_pd();
    let mut live: VecDeque<Lkey> = VecDeque::new(); // lkeys of live regions
    let mut in_use: HashSet<u32> = HashSet::new();
    let mut retired: VecDeque<u32> = VecDeque::new(); // the last 4096 freed
    for i in 0..6000u64 {
        let mem = Arc::new(VecMemory::new(8));
        let k = e
            .reg_mr(pd, 0x1000 + 8 * i, AccessFlags::LOCAL_WRITE, mem)
            .unwrap();
        for key in [k.lkey.raw(), k.rkey.raw()] {
            assert_ne!(key, 0);
            assert!(!in_use.contains(&key), "{key:#x} handed out twice");
            assert!(!retired.contains(&key), "{key:#x} reused from quarantine");
        }
        assert_ne!(k.lkey.raw(), k.rkey.raw());
        in_use.insert(k.lkey.raw());
        in_use.insert(k.rkey.raw());
        live.push_back(k.lkey);
        // Keep about 16 regions alive, freeing the oldest.
        if live.len() > 16 {
            let lkey = live.pop_front().unwrap();
            let (_, _, keys) = e.mr_info(lkey).unwrap();
            e.dereg_mr(lkey).unwrap();
            for key in [keys.lkey.raw(), keys.rkey.raw()] {
                in_use.remove(&key);
                retired.push_back(key);
                if retired.len() > 4096 {
                    retired.pop_front();
                }
            }
        }
    }
}

#[test]
fn keys_show_no_pattern() {
    // Deterministic checks (fixed seeds) that would catch a counter, a
    // linear generator's low bits or a stuck bit: every bit position is set
    // in about half of the keys, the low and high bytes are spread evenly,
    // and consecutive keys are not a fixed step apart.
    for key_seed in [None, Some([0xA5; 32])] {
        let ks = flat(&keys(&mut engine(3, key_seed), 4096)); // 8192 keys
        let n = ks.len() as f64;
        for bit in 0..32 {
            let ones = ks.iter().filter(|&&k| k >> bit & 1 == 1).count() as f64;
            // 8192 fair coins: sigma = 45; allow 5 sigma.
            assert!(
                (ones - n / 2.0).abs() < 5.0 * (n / 4.0).sqrt(),
                "bit {bit} set in {ones} of {n} keys"
            );
        }
        for shift in [0, 24] {
            let mut hist = [0f64; 256];
            for k in &ks {
                hist[(k >> shift & 0xFF) as usize] += 1.0;
            }
            let exp = n / 256.0;
            let chi2: f64 = hist.iter().map(|h| (h - exp) * (h - exp) / exp).sum();
            // 255 degrees of freedom: mean 255, sd ~22.6; 400 is far out.
            assert!(chi2 < 400.0, "byte at bit {shift}: chi^2 = {chi2}");
        }
        let steps: HashSet<u32> = ks.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(steps.len() > ks.len() - 8, "{} distinct steps", steps.len());
    }
}

#[test]
fn qpns_are_random_24_bit_and_never_reserved() {
    let mut e = engine(11, None);
    let q = qpns(&mut e, 512);
    let set: HashSet<u32> = q.iter().copied().collect();
    assert_eq!(set.len(), q.len(), "every QPN unique");
    assert!(q.iter().all(|&n| n > 1 && n <= 0xFF_FFFF));
    assert_ne!(q[0], 0x11, "no fixed first QPN");
    let consecutive = q.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert!(
        consecutive < 4,
        "{consecutive} QPNs follow their predecessor"
    );
    // Spread over the 24 bits: each top-nibble bucket gets a share.
    let mut hist = [0u32; 16];
    for n in &q {
        hist[(n >> 20) as usize] += 1;
    }
    assert!(hist.iter().all(|&h| h > 8), "{hist:?}");
    // Another seed, other QPNs; the same seed, the same QPNs.
    assert_ne!(q[..16], qpns(&mut engine(12, None), 16)[..]);
    assert_eq!(q[..16], qpns(&mut engine(11, None), 16)[..]);
}

#[test]
fn destroyed_qpns_are_not_reused_soon() {
    let mut e = engine(13, None);
    let init = qp_init(&mut e);
    let mut live: VecDeque<Qpn> = VecDeque::new();
    let mut destroyed: VecDeque<Qpn> = VecDeque::new(); // the last 256
    for _ in 0..2000 {
        let q = e.create_qp(init).unwrap();
        assert!(q.raw() > 1 && q.raw() <= 0xFF_FFFF);
        assert!(!live.contains(&q), "{q:#x} is in use");
        assert!(!destroyed.contains(&q), "{q:#x} destroyed recently");
        live.push_back(q);
        if live.len() > 4 {
            let old = live.pop_front().unwrap();
            e.destroy_qp(old).unwrap();
            destroyed.push_back(old);
            if destroyed.len() > 256 {
                destroyed.pop_front();
            }
        }
    }
}

#[test]
fn a_qpn_in_use_is_drawn_again() {
    // 20,000 live QPs: by the birthday bound about a dozen draws hit a QPN
    // already in use and must be drawn again; every QPN stays unique.
    let mut e = engine(17, None);
    let q = qpns(&mut e, 20_000);
    let set: HashSet<u32> = q.iter().copied().collect();
    assert_eq!(set.len(), q.len());
}
