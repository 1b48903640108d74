//! The pure functions of libibverbs: names of statuses, events, node types
//! and port states, and static rate conversions. No state, no pointers in.

use std::ffi::{c_char, c_int, CStr};

fn s(c: &'static CStr) -> *const c_char {
    c.as_ptr()
}

/// `ibv_wc_status_str`.
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    s(match status {
        0 => c"success",
        1 => c"local length error",
        2 => c"local QP operation error",
        3 => c"local EE context operation error",
        4 => c"local protection error",
        5 => c"Work Request Flushed Error",
        6 => c"memory window bind error",
        7 => c"bad response error",
        8 => c"local access error",
        9 => c"remote invalid request error",
        10 => c"remote access error",
        11 => c"remote operation error",
        12 => c"transport retry counter exceeded",
        13 => c"RNR retry counter exceeded",
        14 => c"local RDD violation error",
        15 => c"remote invalid RD request",
        16 => c"remote abort error",
        17 => c"invalid EE context number",
        18 => c"invalid EE context state",
        19 => c"fatal error",
        20 => c"response timeout error",
        21 => c"general error",
        22 => c"TM error",
        23 => c"TM software rendezvous",
        _ => c"unknown",
    })
}

/// `ibv_event_type_str`.
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    s(match event {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        4 => c"communication established",
        5 => c"send queue drained",
        6 => c"path migrated",
        7 => c"path migration request error",
        8 => c"local catastrophic error",
        9 => c"port active",
        10 => c"port error",
        11 => c"LID change",
        12 => c"P_Key change",
        13 => c"SM change",
        14 => c"SRQ catastrophic error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        17 => c"client reregistration",
        18 => c"GID table change",
        19 => c"WQ fatal",
        _ => c"unknown",
    })
}

/// `ibv_node_type_str`.
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    s(match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    })
}

/// `ibv_port_state_str`.
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    s(match state {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    })
}

/// `enum ibv_rate` value, rate in Mb/s, and multiple of 2.5 Gb/s (-1 when
/// the rate is not such a multiple).
const RATES: [(c_int, c_int, c_int); 24] = [
    (2, 2500, 1),
    (5, 5000, 2),
    (3, 10000, 4),
    (6, 20000, 8),
    (4, 30000, 12),
    (7, 40000, 16),
    (8, 60000, 24),
    (9, 80000, 32),
    (10, 120000, 48),
    (11, 14062, -1),
    (12, 56250, -1),
    (13, 112500, -1),
    (14, 168750, -1),
    (15, 25781, -1),
    (16, 103125, -1),
    (17, 206250, -1),
    (18, 309375, -1),
    (19, 28125, 11),
    (20, 53125, 20),
    (21, 425000, 160),
    (22, 637500, 240),
    (23, 850000, 320),
    (24, 1275000, 480),
    (0, 0, -1),
];

/// `ibv_rate_to_mult`.
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && rate != 0)
        .map_or(-1, |r| r.2)
}

/// `mult_to_ibv_rate` (IBV_RATE_MAX, 0, when unknown).
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mult && mult > 0)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`.
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && rate != 0)
        .map_or(-1, |r| r.1)
}

/// `mbps_to_ibv_rate` (IBV_RATE_MAX, 0, when unknown).
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mbps && mbps > 0)
        .map_or(0, |r| r.0)
}
