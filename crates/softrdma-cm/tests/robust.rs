//! Robustness: random and mutated MADs never panic an agent nor establish
//! a connection; seeded lossy runs always end, established or failed.

mod common;

use std::time::Duration;

use common::{Faults, Net};
use proptest::prelude::*;
use softrdma_cm::rdma_cm::PortSpace;
use softrdma_cm::{AcceptParams, ConnectParams, Event, RejReason, SidrParams, State};
use softrdma_wire::Psn;

const SERVICE: u64 = 0x0000_0000_0106_0002;

/// The MADs of a full conversation: connect, establish, disconnect, a
/// rejected REQ, an MRA, a SIDR exchange. Mutated, they make inputs that
/// parse often and reach deep into the handlers.
fn corpus() -> Vec<[u8; 256]> {
    let mut net = Net::new(2, 99, Faults::default());
    net.agents[1].listen(SERVICE).unwrap();
    net.agents[1].listen(PortSpace::Udp.service_id(9)).unwrap();
    net.consumers[1].accept = Some(AcceptParams::default());
    net.consumers[0].disconnect_established = true;
    net.consumers[1].drep = true;
    let now = net.now;
    let p = ConnectParams {
        service_id: SERVICE,
        ..ConnectParams::default()
    };
    net.agents[0].connect(now, 1, &p).unwrap();
    let bad = ConnectParams {
        service_id: SERVICE + 7,
        ..p.clone()
    };
    net.agents[0].connect(now, 1, &bad).unwrap();
    let sidr = SidrParams {
        service_id: PortSpace::Udp.service_id(9),
        pkey: 0xFFFF,
        timeout: 10,
        max_retries: 1,
        private_data: vec![1, 2, 3],
    };
    net.agents[0].sidr_resolve(now, 1, &sidr).unwrap();
    net.settle();
    net.consumers[1].accept = None;
    let now = net.now;
    net.agents[0].connect(now, 1, &p).unwrap();
    net.run_until(Duration::from_millis(1), |_| false);
    let c = common::conn_of(&net.events[1].last().unwrap().1);
    net.agents[1].send_mra(c, 20).unwrap();
    let now = net.now;
    net.agents[1]
        .reject(now, c, RejReason::ConsumerDefined, b"no")
        .unwrap();
    net.settle();
    net.captured.clone()
}

#[derive(Debug, Clone)]
enum Input {
    Random(Vec<u8>),
    Mutated {
        index: usize,
        flips: Vec<(usize, u8)>,
    },
    Wait(u64),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Input::Random),
        (
            any::<usize>(),
            proptest::collection::vec((0usize..256, any::<u8>()), 0..6)
        )
            .prop_map(|(index, flips)| Input::Mutated { index, flips }),
        (0u64..20_000_000_000).prop_map(Input::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_and_mutated_mads_never_panic_nor_establish(inputs in proptest::collection::vec(input(), 1..40)) {
        let corpus = corpus();
        let mut net = Net::new(2, 7, Faults::default());
        net.agents[1].listen(SERVICE).unwrap();
        let now = net.now;
        let p = ConnectParams { service_id: SERVICE, ..ConnectParams::default() };
        let a = net.agents[0].connect(now, 1, &p).unwrap();
        // Only the attacker (node 9) talks: the REQ never reaches node 1.
        while net.agents[0].poll_transmit().is_some() {}
        for i in inputs {
            match i {
                Input::Random(b) => {
                    net.inject(9, 0, &b);
                    net.inject(9, 1, &b);
                }
                Input::Mutated { index, flips } => {
                    let mut m = corpus[index % corpus.len()];
                    for (at, x) in flips {
                        m[at] ^= x;
                    }
                    net.inject(9, 0, &m);
                    net.inject(9, 1, &m);
                }
                Input::Wait(ns) => net.advance(Duration::from_nanos(ns)),
            }
        }
        for n in 0..2 {
            let up = net.count(n, |e| matches!(e, Event::Established { .. } | Event::ConnectResponse { .. }));
            prop_assert_eq!(up, 0, "node {} established without an exchange", n);
        }
        let s = net.agents[0].state(a);
        prop_assert!(matches!(s, None | Some(State::ReqSent) | Some(State::MraReqRcvd) | Some(State::Timewait)), "{:?}", s);
    }
}

#[test]
fn lossy_runs_always_end_established_or_failed() {
    let mut outcomes = [0usize; 2];
    for seed in 0..300u64 {
        let faults = Faults {
            loss: 0.1 + (seed % 4) as f64 * 0.1,
            duplicate: 0.1,
            delay: Duration::from_micros(20),
            jitter: Duration::from_millis(2),
        };
        let mut net = Net::new(2, seed, faults);
        net.agents[1].listen(SERVICE).unwrap();
        net.consumers[1].accept = Some(AcceptParams {
            qpn: 0x200,
            starting_psn: Psn::new(5),
            ..AcceptParams::default()
        });
        net.consumers[0].disconnect_established = true;
        net.consumers[0].drep = true;
        net.consumers[1].drep = true;
        let p = ConnectParams {
            service_id: SERVICE,
            max_cm_retries: (seed % 5) as u8,
            ..ConnectParams::default()
        };
        let now = net.now;
        let conns: Vec<_> = (0..3u32)
            .map(|i| {
                let p = ConnectParams {
                    qpn: 0x100 + i,
                    ..p.clone()
                };
                net.agents[0].connect(now, 1, &p).unwrap()
            })
            .collect();
        net.settle();
        for c in conns {
            let up = net
                .find(0, |e| *e == Event::Established { conn: c })
                .is_some();
            let failed = net
                .find(0, |e| {
                    matches!(e, Event::Unreachable { conn } | Event::Rejected { conn, .. } if *conn == c)
                })
                .is_some();
            assert!(up ^ failed, "seed {seed}: {c:?} up={up} failed={failed}");
            if up {
                let gone = net.find(0, |e| *e == Event::TimewaitExit { conn: c });
                assert!(gone.is_some(), "seed {seed}: {c:?} never left timewait");
            }
            outcomes[usize::from(up)] += 1;
        }
        assert_eq!(net.agents[0].conn_count(), 0, "seed {seed}");
        // The passive side keeps a connection only when every DREQ of its
        // peer was lost: it is established and waits for nothing (its QP's
        // own retries would find the peer gone). Destroying it ends it.
        let left: Vec<_> = net.agents[1].conns().collect();
        for (c, state) in left {
            assert_eq!(state, State::Established, "seed {seed}");
            let now = net.now;
            net.agents[1].destroy(now, c).unwrap();
        }
        net.settle();
        for n in 0..2 {
            assert_eq!(net.agents[n].conn_count(), 0, "seed {seed} node {n}");
            assert_eq!(net.agents[n].next_deadline(), None);
        }
    }
    eprintln!("soak outcomes [failed, established]: {outcomes:?}");
    // Both outcomes happen: the soak exercises the failure paths too.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}
