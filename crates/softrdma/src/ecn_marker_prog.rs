//! A phantom-queue ECN marker as a tc (cls_bpf, direct-action) program,
//! assembled by hand like the AF_XDP port's program (`xdp_prog.rs`). It is
//! for test networks whose kernel has no ECN-marking qdisc (no RED,
//! fq_codel, pie): attached on the egress of a bottleneck link, ahead of
//! its (tail-dropping) qdisc, it keeps HULL's phantom queue (Alizadeh et
//! al., NSDI 2012): a virtual queue that every packet leaving through the
//! link fills by its length and that drains at a set rate, a little below
//! the link's. When the virtual queue is above a threshold, an ECN-capable
//! IPv4 packet (ECT(0) or ECT(1)) gets CE, and its header checksum is
//! updated (`bpf_l3_csum_replace`). The real queue then stays near empty
//! while the link runs at the drain rate.
//!
//! State is one entry of an array map, [`STATE_LEN`] bytes:
//! `u64 virtual queue bytes, u64 last time (ns), u64 packets seen,
//! u64 packets marked`. Updates from two CPUs at once can race; the queue
//! is an estimate either way.

use crate::xdp_prog::{insn, Insn};

/// The map value: four u64s.
pub const STATE_LEN: u32 = 32;

// Opcodes (class | size/op | source) beyond those of `xdp_prog`.
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_DW: u8 = 0x79;
const STX_DW: u8 = 0x7b;
const STX_H: u8 = 0x6b;
const ST_W: u8 = 0x62; // BPF_ST | BPF_MEM | BPF_W
const MOV_X: u8 = 0xbf;
const MOV_K: u8 = 0xb7;
const ADD_K: u8 = 0x07;
const ADD_X: u8 = 0x0f;
const SUB_X: u8 = 0x1f;
const MUL_K: u8 = 0x27;
const RSH_K: u8 = 0x77;
const AND_K: u8 = 0x57;
const OR_K: u8 = 0x47;
const JGT_X: u8 = 0x2d;
const JGT_K: u8 = 0x25;
const JLE_K: u8 = 0xb5;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JA: u8 = 0x05;
const LD_DW: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const PSEUDO_MAP_FD: u8 = 1;
const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_KTIME_GET_NS: i32 = 5;
const HELPER_SKB_STORE_BYTES: i32 = 9;
const HELPER_L3_CSUM_REPLACE: i32 = 10;
const TC_ACT_OK: i32 = 0;
// `struct __sk_buff` offsets.
const SKB_LEN: i16 = 0;
const SKB_DATA: i16 = 76;
const SKB_DATA_END: i16 = 80;

/// A gap longer than this (ns) empties the virtual queue outright (and
/// keeps the product below from overflowing).
const MAX_GAP_NS: i32 = 10_000_000;
/// The drain rate's fixed point: bytes per ns × 2^20.
const SHIFT: i32 = 20;

/// The drain rate in the program's units (bytes per ns × 2^20) for
/// `rate_bps` bits per second; at least 1.
pub fn drain_scaled(rate_bps: u64) -> i32 {
    let v = (rate_bps as u128 * (1u128 << SHIFT)) / (8 * 1_000_000_000u128);
    v.clamp(1, i32::MAX as u128) as i32
}

/// The program for state map fd `map`, draining at `rate_bps`, marking
/// above `threshold` bytes. Jump offsets count instructions after the
/// jump; the labels are checked by the test below.
pub fn program(map: i32, rate_bps: u64, threshold: u32) -> Vec<Insn> {
    let thr = threshold.min(i32::MAX as u32) as i32;
    let rate = drain_scaled(rate_bps);
    // Registers: r6 skb, r7 the IPv4 word with the TOS, r8 the state,
    // r9 now and then the drained bytes; r2 the virtual queue.
    let v = vec![
        /* 0 */ insn(MOV_X, 6, 1, 0, 0), // r6 = skb
        /* 1 */ insn(ST_W, 10, 0, -4, 0), // key = 0 on the stack
        /* 2 */ insn(MOV_X, 2, 10, 0, 0),
        /* 3 */ insn(ADD_K, 2, 0, 0, -4), // r2 = &key
        /* 4 */ insn(LD_DW, 1, PSEUDO_MAP_FD, 0, map), // r1 = map (slot 1)
        /* 5 */ insn(0, 0, 0, 0, 0), // (slot 2)
        /* 6 */ insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP),
        /* 7 */ insn(JEQ_K, 0, 0, OK - 8, 0), // no state → pass
        /* 8 */ insn(MOV_X, 8, 0, 0, 0), // r8 = state
        /* 9 */ insn(CALL, 0, 0, 0, HELPER_KTIME_GET_NS),
        /* 10 */ insn(MOV_X, 9, 0, 0, 0), // r9 = now
        /* 11 */ insn(LDX_DW, 1, 8, 8, 0), // r1 = last
        /* 12 */ insn(LDX_DW, 2, 8, 0, 0), // r2 = virtual queue
        /* 13 */ insn(STX_DW, 8, 9, 8, 0), // last = now
        /* 14 */ insn(SUB_X, 9, 1, 0, 0), // r9 = elapsed
        /* 15 */ insn(JGT_K, 9, 0, EMPTY - 16, MAX_GAP_NS),
        /* 16 */ insn(MUL_K, 9, 0, 0, rate),
        /* 17 */ insn(RSH_K, 9, 0, 0, SHIFT), // r9 = drained bytes
        /* 18 */ insn(JGT_X, 2, 9, DRAIN - 19, 0),
        /* EMPTY = 19 */ insn(MOV_K, 2, 0, 0, 0), // drained dry
        /* 20 */ insn(JA, 0, 0, FILL - 21, 0),
        /* DRAIN = 21 */ insn(SUB_X, 2, 9, 0, 0),
        /* FILL = 22 */ insn(LDX_W, 3, 6, SKB_LEN, 0),
        /* 23 */ insn(ADD_X, 2, 3, 0, 0), // queue += this packet
        /* 24 */ insn(STX_DW, 8, 2, 0, 0),
        /* 25 */ insn(LDX_DW, 1, 8, 16, 0),
        /* 26 */ insn(ADD_K, 1, 0, 0, 1),
        /* 27 */ insn(STX_DW, 8, 1, 16, 0), // seen += 1
        /* 28 */ insn(JLE_K, 2, 0, OK - 29, thr), // below the threshold → pass
        // Mark: Ethernet, IPv4 (the TOS byte is the high byte of the
        // little-endian load of bytes 14–15), ECT → CE.
        /* 29 */
        insn(LDX_W, 2, 6, SKB_DATA, 0),
        /* 30 */ insn(LDX_W, 3, 6, SKB_DATA_END, 0),
        /* 31 */ insn(MOV_X, 4, 2, 0, 0),
        /* 32 */ insn(ADD_K, 4, 0, 0, 34), // Ethernet + IPv4
        /* 33 */ insn(JGT_X, 4, 3, OK - 34, 0), // short → pass
        /* 34 */ insn(LDX_H, 5, 2, 12, 0), // EtherType
        /* 35 */ insn(JNE_K, 5, 0, OK - 36, 0x0008), // not IPv4 → pass
        /* 36 */ insn(LDX_H, 7, 2, 14, 0), // r7 = version/IHL | TOS << 8
        /* 37 */ insn(MOV_X, 5, 7, 0, 0),
        /* 38 */ insn(AND_K, 5, 0, 0, 0x300), // ECN field
        /* 39 */ insn(JEQ_K, 5, 0, OK - 40, 0), // Not-ECT → pass
        /* 40 */ insn(JEQ_K, 5, 0, OK - 41, 0x300), // CE already → pass
        /* 41 */ insn(MOV_X, 5, 7, 0, 0),
        /* 42 */ insn(OR_K, 5, 0, 0, 0x300),
        /* 43 */ insn(STX_H, 10, 5, -8, 0), // the new word on the stack
        /* 44 */ insn(MOV_X, 1, 6, 0, 0),
        /* 45 */ insn(MOV_K, 2, 0, 0, 14),
        /* 46 */ insn(MOV_X, 3, 10, 0, 0),
        /* 47 */ insn(ADD_K, 3, 0, 0, -8),
        /* 48 */ insn(MOV_K, 4, 0, 0, 2),
        /* 49 */ insn(MOV_K, 5, 0, 0, 0),
        /* 50 */ insn(CALL, 0, 0, 0, HELPER_SKB_STORE_BYTES),
        /* 51 */ insn(MOV_X, 1, 6, 0, 0),
        /* 52 */ insn(MOV_K, 2, 0, 0, 24), // the IPv4 header checksum
        /* 53 */ insn(MOV_X, 3, 7, 0, 0), // from
        /* 54 */ insn(MOV_X, 4, 7, 0, 0),
        /* 55 */ insn(OR_K, 4, 0, 0, 0x300), // to
        /* 56 */ insn(MOV_K, 5, 0, 0, 2), // a 2-byte field
        /* 57 */ insn(CALL, 0, 0, 0, HELPER_L3_CSUM_REPLACE),
        /* 58 */ insn(LDX_DW, 1, 8, 24, 0),
        /* 59 */ insn(ADD_K, 1, 0, 0, 1),
        /* 60 */ insn(STX_DW, 8, 1, 24, 0), // marked += 1
        /* OK = 61 */ insn(MOV_K, 0, 0, 0, TC_ACT_OK),
        /* 62 */ insn(EXIT, 0, 0, 0, 0),
    ];
    v
}

const EMPTY: i16 = 19;
const DRAIN: i16 = 21;
const FILL: i16 = 22;
const OK: i16 = 61;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_match_the_instructions() {
        let p = program(9, 950_000_000, 30_000);
        assert_eq!(p.len(), 63);
        assert_eq!(p[EMPTY as usize], insn(MOV_K, 2, 0, 0, 0));
        assert_eq!(p[DRAIN as usize], insn(SUB_X, 2, 9, 0, 0));
        assert_eq!(p[FILL as usize].off, SKB_LEN);
        assert_eq!(p[OK as usize], insn(MOV_K, 0, 0, 0, TC_ACT_OK));
        assert_eq!(p[4].imm, 9);
        assert_eq!(p[28].imm, 30_000);
        for (i, x) in p.iter().enumerate() {
            if x.code & 0x07 == 0x05 && x.code != CALL && x.code != EXIT {
                let to = i as i64 + 1 + i64::from(x.off);
                assert!((0..p.len() as i64).contains(&to), "jump at {i} to {to}");
            }
        }
    }

    #[test]
    fn drain_rate_in_fixed_point() {
        // 950 Mb/s = 0.11875 bytes/ns; × 2^20 = 124,518.4.
        assert_eq!(drain_scaled(950_000_000), 124_518);
        assert_eq!(drain_scaled(0), 1);
        // The largest product stays in 64 bits.
        assert!((MAX_GAP_NS as u128 * drain_scaled(400_000_000_000) as u128) < u64::MAX as u128);
    }
}
