//! Builders of CM messages for the tests: random ones that respect every
//! field's width, for round trips and fuzz seeds.

use softrdma_wire::cm::{
    attr, ClassPortInfoRepr, CmPath, CommIdsRepr, DreqRepr, MessageKind, MraRepr, PortTarget,
    RejReason, RejRepr, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr, SidrStatus, TransportType,
    ADDITIONAL_INFO_LEN,
};
use softrdma_wire::{CmMessage, Psn};

use super::Rng;

/// Every attribute ID the wire crate knows.
pub const ATTRIBUTES: [u16; 10] = [
    attr::CLASS_PORT_INFO,
    attr::REQ,
    attr::MRA,
    attr::REJ,
    attr::REP,
    attr::RTU,
    attr::DREQ,
    attr::DREP,
    attr::SIDR_REQ,
    attr::SIDR_REP,
];

/// `width` random low bits.
pub fn bits(r: &mut Rng, width: u32) -> u32 {
    r.next_u32() & ((1u64 << width) - 1) as u32
}

fn b8(r: &mut Rng, width: u32) -> u8 {
    bits(r, width) as u8
}

fn array<const N: usize>(r: &mut Rng) -> [u8; N] {
    let mut a = [0u8; N];
    r.fill(&mut a);
    a
}

fn kind(r: &mut Rng) -> MessageKind {
    [MessageKind::Req, MessageKind::Rep, MessageKind::Other][r.below(3)]
}

pub fn path(r: &mut Rng) -> CmPath {
    CmPath {
        local_lid: r.next_u32() as u16,
        remote_lid: r.next_u32() as u16,
        local_gid: array(r),
        remote_gid: array(r),
        flow_label: bits(r, 20),
        packet_rate: b8(r, 6),
        traffic_class: r.byte(),
        hop_limit: r.byte(),
        sl: b8(r, 4),
        subnet_local: r.bool(),
        local_ack_timeout: b8(r, 5),
    }
}

pub fn req(r: &mut Rng) -> ReqRepr {
    ReqRepr {
        local_comm_id: r.next_u32(),
        vendor_id: bits(r, 24),
        service_id: r.next_u64(),
        local_ca_guid: r.next_u64(),
        local_qkey: r.next_u32(),
        local_qpn: bits(r, 24),
        responder_resources: r.byte(),
        local_eecn: bits(r, 24),
        initiator_depth: r.byte(),
        remote_eecn: bits(r, 24),
        remote_cm_response_timeout: b8(r, 5),
        transport: [TransportType::Rc, TransportType::Uc, TransportType::Rd][r.below(3)],
        end_to_end_flow_control: r.bool(),
        starting_psn: Psn::new(bits(r, 24)),
        local_cm_response_timeout: b8(r, 5),
        retry_count: b8(r, 3),
        pkey: r.next_u32() as u16,
        path_mtu: b8(r, 4),
        rdc_exists: r.bool(),
        rnr_retry_count: b8(r, 3),
        max_cm_retries: b8(r, 4),
        srq: r.bool(),
        extended_transport: b8(r, 3),
        primary_path: path(r),
        alternate_path: path(r),
        sap_supported: r.bool(),
        private_data: array(r),
    }
}

pub fn rep(r: &mut Rng) -> RepRepr {
    RepRepr {
        local_comm_id: r.next_u32(),
        remote_comm_id: r.next_u32(),
        local_qkey: r.next_u32(),
        local_qpn: bits(r, 24),
        vendor_id: bits(r, 24),
        local_eecn: bits(r, 24),
        starting_psn: Psn::new(bits(r, 24)),
        responder_resources: r.byte(),
        initiator_depth: r.byte(),
        target_ack_delay: b8(r, 5),
        failover_accepted: b8(r, 2),
        end_to_end_flow_control: r.bool(),
        rnr_retry_count: b8(r, 3),
        srq: r.bool(),
        local_ca_guid: r.next_u64(),
        private_data: array(r),
    }
}

pub fn rej(r: &mut Rng) -> RejRepr {
    RejRepr {
        local_comm_id: r.next_u32(),
        remote_comm_id: r.next_u32(),
        message_rejected: kind(r),
        reject_info_len: r.below(ADDITIONAL_INFO_LEN + 1) as u8,
        reason: RejReason::from_code(r.next_u32() as u16 % 40),
        ari: array(r),
        private_data: array(r),
    }
}

fn port_target(r: &mut Rng) -> PortTarget {
    PortTarget {
        gid: array(r),
        traffic_class: r.byte(),
        sl: b8(r, 4),
        flow_label: bits(r, 20),
        lid: r.next_u32() as u16,
        pkey: r.next_u32() as u16,
        hop_limit: r.byte(),
        qp: bits(r, 24),
        qkey: r.next_u32(),
    }
}

fn class_port_info(r: &mut Rng) -> ClassPortInfoRepr {
    ClassPortInfoRepr {
        base_version: r.byte(),
        class_version: r.byte(),
        capability_mask: r.next_u32() as u16,
        capability_mask2: bits(r, 27),
        resp_time_value: b8(r, 5),
        redirect: port_target(r),
        trap: port_target(r),
    }
}

fn sidr_rep(r: &mut Rng) -> SidrRepRepr {
    use SidrStatus::*;
    SidrRepRepr {
        request_id: r.next_u32(),
        status: [
            Success,
            Unsupported,
            Reject,
            NoQp,
            Redirect,
            UnsupportedVersion,
        ][r.below(6)],
        additional_info_len: r.below(ADDITIONAL_INFO_LEN + 1) as u8,
        qpn: bits(r, 24),
        service_id: r.next_u64(),
        qkey: r.next_u32(),
        additional_info: array(r),
        private_data: array(r),
    }
}

/// A random, valid message with attribute `id` (one of [`ATTRIBUTES`]).
pub fn random_message(r: &mut Rng, id: u16) -> CmMessage {
    match id {
        attr::CLASS_PORT_INFO => CmMessage::ClassPortInfo(class_port_info(r)),
        attr::REQ => CmMessage::Req(req(r)),
        attr::MRA => CmMessage::Mra(MraRepr {
            local_comm_id: r.next_u32(),
            remote_comm_id: r.next_u32(),
            message_mraed: kind(r),
            service_timeout: b8(r, 5),
            private_data: array(r),
        }),
        attr::REJ => CmMessage::Rej(rej(r)),
        attr::REP => CmMessage::Rep(rep(r)),
        attr::RTU => CmMessage::Rtu(CommIdsRepr {
            local_comm_id: r.next_u32(),
            remote_comm_id: r.next_u32(),
            private_data: array(r),
        }),
        attr::DREQ => CmMessage::Dreq(DreqRepr {
            local_comm_id: r.next_u32(),
            remote_comm_id: r.next_u32(),
            remote_qpn: bits(r, 24),
            private_data: array(r),
        }),
        attr::DREP => CmMessage::Drep(CommIdsRepr {
            local_comm_id: r.next_u32(),
            remote_comm_id: r.next_u32(),
            private_data: array(r),
        }),
        attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr {
            request_id: r.next_u32(),
            pkey: r.next_u32() as u16,
            service_id: r.next_u64(),
            private_data: array(r),
        }),
        attr::SIDR_REP => CmMessage::SidrRep(sidr_rep(r)),
        _ => panic!("no builder for attribute {id:#x}"),
    }
}
