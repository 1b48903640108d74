//! CM MADs as the Linux kernel builds them, judged by our parser: the
//! fixture `tests/fixtures/linux-cm.pcap` is a capture of the rxe guest's
//! kernel CM (Debian 12's 6.1 kernel, `interop/rxe/run.sh --capture-cm`)
//! dialling a host where nothing listens: the REQs of `rping -c` and the
//! SIDR_REQs of `udaddy`, first tries and retries, and the REJ rping's CM
//! sent when it was killed. Every frame must carry a
//! right ICRC, be a MAD QP1 takes, parse as the CM message it is, say what
//! rdma_cm put in it (service IDs of the TCP and UDP port spaces, the CMA
//! header's addresses), and come out of our emitter byte for byte.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use softrdma_wire::cm::{CmMad, CmMessage, RejReason, TransportType};
use softrdma_wire::cma::{self, CmaHeader};
use softrdma_wire::mad::{gmp_payload, MAD_LEN};
use softrdma_wire::{icrc, Endpoints, PacketRepr};

const GUEST: Ipv4Addr = Ipv4Addr::new(10, 213, 91, 2);
const HOST: Ipv4Addr = Ipv4Addr::new(10, 213, 91, 1);
/// `rping -p 7174` (TCP port space) and `udaddy` (its port 7174, UDP port space).
const RPING_PORT: u16 = 7174;
const UDADDY_PORT: u16 = 7174;

/// (endpoints, UDP payload, IP packet) of every IPv4/UDP frame of a classic pcap.
fn udp_frames(pcap: &[u8]) -> Vec<(Endpoints, Vec<u8>, Vec<u8>)> {
    assert!(pcap.len() >= 24, "not a pcap");
    let le = matches!(
        pcap[..4],
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1]
    );
    let u32_at = |b: &[u8], o: usize| {
        let w = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let (mut off, mut out) = (24, Vec::new());
    while off + 16 <= pcap.len() {
        let incl = u32_at(pcap, off + 8) as usize;
        let fr = &pcap[off + 16..(off + 16 + incl).min(pcap.len())];
        off += 16 + incl;
        // Ethernet, IPv4 without options, UDP.
        if fr.len() < 42 || fr[12..14] != [0x08, 0x00] || fr[14] != 0x45 || fr[23] != 17 {
            continue;
        }
        let ip = |o: usize| IpAddr::V4(Ipv4Addr::new(fr[o], fr[o + 1], fr[o + 2], fr[o + 3]));
        let port = |o: usize| u16::from_be_bytes([fr[o], fr[o + 1]]);
        let ep = Endpoints::new(
            SocketAddr::new(ip(26), port(34)),
            SocketAddr::new(ip(30), port(36)),
        );
        let udp_len = port(38) as usize;
        out.push((
            ep,
            fr[42..34 + udp_len].to_vec(),
            fr[14..34 + udp_len].to_vec(),
        ));
    }
    out
}

fn fixture() -> Vec<(Endpoints, Vec<u8>, Vec<u8>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/linux-cm.pcap");
    let pcap = std::fs::read(path).expect("the fixture capture");
    udp_frames(&pcap)
}

#[test]
fn every_kernel_cm_mad_parses_and_emits_back_byte_for_byte() {
    let frames = fixture();
    let (mut reqs, mut sidr_reqs, mut rejs) = (0, 0, 0);
    let mut req_comm_id = None;
    for (i, (ep, udp, ip)) in frames.iter().enumerate() {
        assert_eq!(
            ep.src.ip(),
            IpAddr::V4(GUEST),
            "frame {i}: only the guest talks"
        );
        // Over the real IP header: rxe sends non-zero IPv4 IDs, which the ICRC covers.
        let (stored, computed) = icrc::over_ip_packet(ip).unwrap();
        assert_eq!(stored, computed, "frame {i}: ICRC");
        let pkt = PacketRepr::parse(udp).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        let mad: &[u8; MAD_LEN] = gmp_payload(&pkt).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        let cm = CmMad::parse(mad).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        let again = cm.to_bytes().unwrap();
        assert_eq!(
            &again[..],
            &mad[..],
            "frame {i}: {cm:?} emitted differently"
        );
        match cm.message {
            CmMessage::Req(r) => {
                reqs += 1;
                req_comm_id = Some(r.local_comm_id);
                assert_eq!(
                    cma::parse_service_id(r.service_id),
                    Some((cma::PS_TCP, RPING_PORT))
                );
                assert_eq!(r.transport, TransportType::Rc, "frame {i}");
                assert!(
                    (1..=5).contains(&r.path_mtu),
                    "frame {i}: path MTU {}",
                    r.path_mtu
                );
                let h = CmaHeader::parse(&r.private_data).unwrap();
                assert_eq!(
                    (h.src, h.dst),
                    (IpAddr::V4(GUEST), IpAddr::V4(HOST)),
                    "frame {i}"
                );
                assert_ne!(h.src_port, 0, "frame {i}");
            }
            CmMessage::SidrReq(s) => {
                sidr_reqs += 1;
                assert_eq!(
                    cma::parse_service_id(s.service_id),
                    Some((cma::PS_UDP, UDADDY_PORT))
                );
                let h = CmaHeader::parse(&s.private_data).unwrap();
                assert_eq!(
                    (h.src, h.dst),
                    (IpAddr::V4(GUEST), IpAddr::V4(HOST)),
                    "frame {i}"
                );
            }
            // rping killed: its kernel CM rejects the connection it was making.
            // As cm.c's destroy in REQ_SENT: reason Timeout, the CA GUID in the ARI.
            CmMessage::Rej(j) => {
                rejs += 1;
                assert_eq!(
                    Some(j.local_comm_id),
                    req_comm_id,
                    "frame {i}: REJ of our REQ"
                );
                assert_eq!(j.remote_comm_id, 0, "frame {i}: no REP came, no remote ID");
                assert_eq!(j.reason, RejReason::Timeout, "frame {i}: {j:?}");
                assert_eq!(j.reject_info_len, 8, "frame {i}: a GUID of ARI");
            }
            other => panic!("frame {i}: unexpected {other:?}"),
        }
    }
    assert!(reqs >= 2, "{reqs} REQs: a first try and a retry");
    assert!(
        sidr_reqs >= 2,
        "{sidr_reqs} SIDR_REQs: a first try and a retry"
    );
    assert_eq!(rejs, 1, "rping's REJ when it was killed");
}

/// A retried REQ is the same message (the same communication ID, PSN and
/// transaction ID): what a passive side's duplicate detection relies on.
#[test]
fn the_kernel_retries_a_req_unchanged() {
    let reqs: Vec<[u8; MAD_LEN]> = fixture()
        .iter()
        .filter_map(|(_, udp, _)| {
            let pkt = PacketRepr::parse(udp).ok()?;
            let mad = gmp_payload(&pkt).ok()?;
            matches!(CmMad::parse(mad).ok()?.message, CmMessage::Req(_)).then_some(*mad)
        })
        .collect();
    assert!(reqs.len() >= 2);
    assert!(reqs.windows(2).all(|w| w[0] == w[1]), "the retries differ");
}
