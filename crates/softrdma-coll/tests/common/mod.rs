//! What the collectives' integration tests share: devices, the ranks of
//! one world (a thread each) and deterministic inputs.

use std::net::TcpListener;

use softrdma::shm::Transport;
use softrdma::{DeviceConfig, FaultSpec};
use softrdma_coll::{Communicator, Config, DataType, Element, ReduceOp, Rendezvous};

/// A loopback device on `t`, no capture, with `fault` injected.
pub fn device(t: Transport, fault: Option<FaultSpec>) -> DeviceConfig {
    let mut c = DeviceConfig::default_loopback().transport(t);
    c.capture = None;
    c.fault = fault;
    c
}

/// Runs `f` on `n` ranks (one thread each) and returns their results.
#[allow(dead_code)] // not every test file uses every helper
pub fn world<R: Send>(n: usize, cfg: &Config, f: impl Fn(&mut Communicator) -> R + Sync) -> Vec<R> {
    world_with(vec![cfg.clone(); n], f)
}

/// As `world`, each rank with its own configuration.
pub fn world_with<R: Send>(cfgs: Vec<Config>, f: impl Fn(&mut Communicator) -> R + Sync) -> Vec<R> {
    let n = cfgs.len();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut listener = Some(listener);
    std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .enumerate()
            .map(|(r, cfg)| {
                let rdv = match r {
                    0 => Rendezvous::Listener(listener.take().unwrap()),
                    _ => Rendezvous::Addr(addr),
                };
                let f = &f;
                s.spawn(move || {
                    let mut c = Communicator::new(r, n, rdv, cfg).expect("communicator");
                    assert_eq!((c.rank(), c.size()), (r, n));
                    f(&mut c)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Deterministic inputs: rank `q`'s `len` values for `op` (near 1 for
/// products so that they neither overflow nor vanish).
pub fn input<T: Element>(q: usize, len: usize, op: ReduceOp, salt: u64) -> Vec<T> {
    let mut x = (q as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ salt.wrapping_mul(0xd1b5_4a32_d192_ed69);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            if T::DTYPE.is_float() {
                match op {
                    ReduceOp::Prod => T::from_f64(0.5 + u),
                    _ => T::from_f64(8.0 * u - 4.0),
                }
            } else {
                match T::DTYPE {
                    DataType::U8 => T::from_f64((x % 256) as f64),
                    _ => T::from_f64((x % 2001) as f64 - 1000.0),
                }
            }
        })
        .collect()
}
