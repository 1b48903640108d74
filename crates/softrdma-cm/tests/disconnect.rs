//! Disconnection, timewait and SIDR between two agents.

mod common;

use std::time::Duration;

use common::{Faults, Net};
use softrdma_cm::rdma_cm::PortSpace;
use softrdma_cm::time::{ack_timeout, iba_time};
use softrdma_cm::{
    AcceptParams, AgentConfig, ConnId, ConnectParams, Event, SidrParams, SidrStatus, State,
};
use softrdma_wire::cm::attr;
use softrdma_wire::Psn;

const SERVICE: u64 = 0x0000_0000_0106_0001;

fn connect_params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        qpn: 0x100,
        starting_psn: Psn::new(1),
        max_cm_retries: 3,
        ..ConnectParams::default()
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x200,
        starting_psn: Psn::new(2),
        ..AcceptParams::default()
    }
}

/// An established connection: (net, active conn, passive conn).
fn connected(seed: u64) -> (Net, ConnId, ConnId) {
    let mut net = Net::new(2, seed, Faults::default());
    net.agents[1].listen(SERVICE).unwrap();
    net.consumers[1].accept = Some(accept_params());
    net.consumers[0].drep = true;
    net.consumers[1].drep = true;
    let now = net.now;
    let a = net.agents[0].connect(now, 1, &connect_params()).unwrap();
    let up = |n: &Net, i| {
        n.find(i, |e| matches!(e, Event::Established { .. }))
            .is_some()
    };
    assert!(net.run_until(Duration::from_secs(1), |n| up(n, 0) && up(n, 1)));
    let p = common::conn_of(&net.events[1][0].1);
    (net, a, p)
}

/// The timewait both sides wait with default parameters: the local ACK
/// timeout from packet lifetime 16 and ACK delay 15.
fn timewait() -> Duration {
    let lifetime = connect_params().packet_life_time;
    iba_time(ack_timeout(AgentConfig::default().ack_delay, lifetime))
}

/// Both sides saw Disconnected, then TimewaitExit one timewait later.
fn assert_clean_disconnect(net: &Net, conns: [ConnId; 2]) {
    for (n, conn) in conns.into_iter().enumerate() {
        let (down, _) = net
            .find(n, |e| {
                *e == Event::Disconnected {
                    conn,
                    private_data: e_pd(e),
                }
            })
            .unwrap_or_else(|| panic!("node {n} not disconnected"));
        let (exit, _) = net
            .find(n, |e| *e == Event::TimewaitExit { conn })
            .unwrap_or_else(|| panic!("node {n} never left timewait"));
        assert_eq!(exit, down + timewait(), "node {n}");
        assert_eq!(net.agents[n].conn_count(), 0);
    }
}

fn e_pd(e: &Event<u8>) -> Vec<u8> {
    match e {
        Event::Disconnected { private_data, .. } => private_data.clone(),
        _ => Vec::new(),
    }
}

#[test]
fn disconnect_from_either_side_ends_in_timewait_exit() {
    for side in [0usize, 1] {
        let (mut net, a, p) = connected(20 + side as u64);
        let conn = [a, p][side];
        let now = net.now;
        net.agents[side].disconnect(now, conn, b"bye").unwrap();
        assert_eq!(net.agents[side].state(conn), Some(State::DreqSent));
        net.settle();
        assert_clean_disconnect(&net, [a, p]);
        // The DREQ's private data reached the other side.
        let other = 1 - side;
        let (_, e) = net
            .find(other, |e| matches!(e, Event::Disconnected { .. }))
            .unwrap();
        assert_eq!(&e_pd(&e)[..3], b"bye");
        assert_eq!(net.sent_count(side as u8, attr::DREQ), 1);
        assert_eq!(net.sent_count(other as u8, attr::DREP), 1);
    }
}

#[test]
fn lost_dreq_and_lost_drep_are_retried() {
    for lost in [attr::DREQ, attr::DREP] {
        let (mut net, a, p) = connected(30);
        net.drop_nth.push((lost, 0));
        let now = net.now;
        net.agents[0].disconnect(now, a, &[]).unwrap();
        net.settle();
        assert_clean_disconnect(&net, [a, p]);
        assert_eq!(net.sent_count(0, attr::DREQ), 2, "after losing {lost:#x}");
    }
}

#[test]
fn unanswered_dreq_still_disconnects_after_its_retries() {
    let (mut net, a, _) = connected(31);
    net.drop_all.push(attr::DREQ);
    let t0 = net.now;
    net.agents[0].disconnect(t0, a, &[]).unwrap();
    net.settle();
    let (down, _) = net
        .find(0, |e| matches!(e, Event::Disconnected { .. }))
        .unwrap();
    let p = connect_params();
    let wait = 2 * iba_time(p.packet_life_time) + iba_time(p.remote_cm_response_timeout);
    assert_eq!(down, t0 + wait * (u32::from(p.max_cm_retries) + 1));
    let (exit, _) = net
        .find(0, |e| matches!(e, Event::TimewaitExit { .. }))
        .unwrap();
    assert_eq!(exit, down + timewait());
}

#[test]
fn simultaneous_disconnects_both_end_in_timewait() {
    let (mut net, a, p) = connected(32);
    let now = net.now;
    net.agents[0].disconnect(now, a, &[]).unwrap();
    net.agents[1].disconnect(now, p, &[]).unwrap();
    net.settle();
    for (n, conn) in [(0, a), (1, p)] {
        assert_eq!(net.count(n, |e| matches!(e, Event::Disconnected { .. })), 1);
        assert!(net
            .find(n, |e| *e == Event::TimewaitExit { conn })
            .is_some());
        assert_eq!(net.agents[n].conn_count(), 0);
    }
}

#[test]
fn destroying_an_established_connection_disconnects_the_peer() {
    let (mut net, a, p) = connected(33);
    let now = net.now;
    net.agents[0].destroy(now, a).unwrap();
    net.settle();
    assert!(net
        .find(1, |e| *e == Event::TimewaitExit { conn: p })
        .is_some());
    // The destroyed side raises nothing after destroy, but still waited.
    assert_eq!(net.count(0, |e| matches!(e, Event::Disconnected { .. })), 0);
    assert_eq!(net.agents[0].conn_count(), 0);
}

#[test]
fn stale_req_for_a_qp_in_timewait_is_rejected() {
    let (mut net, a, _) = connected(34);
    net.consumers[1].drep = false;
    let now = net.now;
    net.agents[0].disconnect(now, a, &[]).unwrap();
    // The passive side holds in DreqRcvd; the same QP connects again.
    net.run_until(Duration::from_millis(1), |_| false);
    let now = net.now;
    let b = net.agents[0].connect(now, 1, &connect_params()).unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n
        .find(0, |e| matches!(e, Event::Rejected { .. }))
        .is_some()));
    let (_, e) = net
        .find(0, |e| matches!(e, Event::Rejected { .. }))
        .unwrap();
    assert!(
        matches!(e, Event::Rejected { conn, reason: softrdma_cm::RejReason::StaleConnection, .. } if conn == b)
    );
}

#[test]
fn sidr_resolves_a_ud_service() {
    let mut net = Net::new(2, 40, Faults::default());
    let service = PortSpace::Udp.service_id(7174);
    net.agents[1].listen(service).unwrap();
    net.consumers[1].accept = Some(AcceptParams {
        qpn: 0x12_3456,
        qkey: 0x1111_2222,
        private_data: b"ud here".to_vec(),
        ..AcceptParams::default()
    });
    net.drop_nth.push((attr::SIDR_REQ, 0));
    let p = SidrParams {
        service_id: service,
        pkey: 0xFFFF,
        timeout: 12,
        max_retries: 2,
        private_data: b"who serves?".to_vec(),
    };
    let t0 = net.now;
    let s = net.agents[0].sidr_resolve(t0, 1, &p).unwrap();
    net.settle();
    let (at, e) = net
        .find(0, |e| matches!(e, Event::SidrResolved { .. }))
        .unwrap();
    let Event::SidrResolved {
        conn,
        status,
        qpn,
        qkey,
        private_data,
    } = e
    else {
        unreachable!()
    };
    assert_eq!(
        (conn, status, qpn, qkey),
        (s, SidrStatus::Success, 0x12_3456, 0x1111_2222)
    );
    assert_eq!(&private_data[..7], b"ud here");
    // The first SIDR_REQ was lost: the answer came after one wait.
    assert!(at >= t0 + iba_time(12));
    let (_, req) = net
        .find(1, |e| matches!(e, Event::SidrRequest { .. }))
        .unwrap();
    assert!(
        matches!(req, Event::SidrRequest { service_id, ref private_data, .. }
        if service_id == service && &private_data[..11] == b"who serves?")
    );
    assert_eq!(net.agents[0].conn_count() + net.agents[1].conn_count(), 0);
}

#[test]
fn sidr_without_listener_is_unsupported_and_silence_is_unreachable() {
    let mut net = Net::new(2, 41, Faults::default());
    let p = SidrParams {
        service_id: PortSpace::Udp.service_id(1),
        pkey: 0xFFFF,
        timeout: 12,
        max_retries: 2,
        private_data: Vec::new(),
    };
    let now = net.now;
    net.agents[0].sidr_resolve(now, 1, &p).unwrap();
    net.settle();
    let (_, e) = net
        .find(0, |e| matches!(e, Event::SidrResolved { .. }))
        .unwrap();
    assert!(matches!(
        e,
        Event::SidrResolved {
            status: SidrStatus::Unsupported,
            ..
        }
    ));

    net.drop_all.push(attr::SIDR_REQ);
    let t0 = net.now;
    let s = net.agents[0].sidr_resolve(t0, 1, &p).unwrap();
    net.settle();
    let (at, _) = net
        .find(0, |e| *e == Event::Unreachable { conn: s })
        .unwrap();
    assert_eq!(at, t0 + iba_time(12) * 3);
}
