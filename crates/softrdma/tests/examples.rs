//! Runs the logic of every example (each keeps it in a function next to
//! its `main`), over RoCEv2/UDP and over the default transport.

mod common;

#[allow(dead_code)]
#[path = "../examples/atomic_counter.rs"]
mod atomic_counter;
#[allow(dead_code)]
#[path = "../examples/cm_ping.rs"]
mod cm_ping;
#[allow(dead_code)]
#[path = "../examples/epoll_events.rs"]
mod epoll_events;
#[allow(dead_code)]
#[path = "../examples/rc_pingpong.rs"]
mod rc_pingpong;
#[allow(dead_code)]
#[path = "../examples/srq_server.rs"]
mod srq_server;
#[allow(dead_code)]
#[path = "../examples/ud_send.rs"]
mod ud_send;
#[allow(dead_code)]
#[path = "../examples/ud_server.rs"]
mod ud_server;
#[allow(dead_code)]
#[path = "../examples/write_read.rs"]
mod write_read;

use common::udp_loopback;
use softrdma::DeviceConfig;

fn configs() -> [DeviceConfig; 2] {
    let mut auto = DeviceConfig::default_loopback();
    auto.transport = softrdma::shm::Transport::Auto;
    [udp_loopback(), auto]
}

#[test]
fn write_read_example() {
    for cfg in configs() {
        assert_eq!(write_read::run(&cfg).unwrap(), 1 << 20);
    }
}

#[test]
fn atomic_counter_example() {
    for cfg in configs() {
        assert_eq!(atomic_counter::run(&cfg).unwrap(), 0xDEAD_BEEF);
    }
}

#[test]
fn ud_send_example() {
    for cfg in configs() {
        let got = ud_send::run(&cfg).unwrap();
        let want: Vec<&[u8]> = vec![b"hello", b"from", b"a UD QP", b"with immediate data"];
        assert_eq!(got, want);
    }
}

#[test]
fn rc_pingpong_example() {
    for cfg in configs() {
        rc_pingpong::run_local(&cfg, 50, 100).unwrap();
    }
}

#[test]
fn cm_ping_example() {
    for (i, cfg) in configs().iter().enumerate() {
        let (request, answer) = cm_ping::run_local(cfg, 7600 + i as u16).unwrap();
        assert_eq!(request, b"softrdma client\0");
        assert_eq!(answer, b"softrdma server\0");
    }
}

#[test]
fn srq_server_example() {
    for cfg in configs() {
        let r = srq_server::run(&cfg).unwrap();
        for (c, msgs) in r.received.iter().enumerate() {
            // Every message of every client, in its order, intact.
            let want: Vec<String> = (0..20).map(|m| format!("client {c} message {m}")).collect();
            assert_eq!(msgs, &want);
        }
        // 60 messages through 32 buffers: the limit event refilled the pool.
        assert!(r.refills >= 2, "{} refills", r.refills);
    }
}

#[test]
fn epoll_events_example() {
    for cfg in configs() {
        let (report, echoes) = epoll_events::run(&cfg, 50).unwrap();
        let want: Vec<String> = (0..50).map(|i| format!("ping {i}")).collect();
        assert_eq!(echoes, want);
        assert_eq!(report.echoed, 50);
        // The server slept between messages, and not in a busy loop of empty
        // wake-ups. A wake-up takes every pending event, so one may serve
        // the send completion of a round and the receive of the next (the
        // client's next message can arrive with its ACK): at least one
        // wake-up per two round trips.
        assert!((25..=400).contains(&report.wakeups), "{report:?}");
    }
}

#[test]
fn ud_server_example() {
    for cfg in configs() {
        let (replies, peers) = ud_server::run(&cfg).unwrap();
        assert_eq!(replies.len(), 3);
        for (who, r) in replies.iter().enumerate() {
            let want: Vec<String> = (0..10)
                .map(|i| format!("REQUEST {i} FROM CLIENT {who}"))
                .collect();
            assert_eq!(r, &want);
        }
        // Three client QPs on one device: one address handle.
        assert_eq!(peers, 1);
    }
}
