//! The XDP program of the AF_XDP port, assembled by hand: Ethernet → IPv4
//! (no options, not a fragment) or IPv6 (UDP as the first next header) →
//! UDP destination port = the device's → `bpf_redirect_map` into the XSKMAP
//! at the receive queue's index (XDP_PASS when no socket is there);
//! everything else goes to the kernel (XDP_PASS): ARP, neighbour discovery,
//! TCP (the CM's and tests' side channels), other UDP.
//!
//! Twenty-odd instructions do not justify a C toolchain at build time
//! (clang with a BPF target) or a loader library; each is written out below
//! with what it does.

/// One eBPF instruction as the kernel reads it (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// dst register in the low nibble, src in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

pub(crate) const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes (class | size/op | source).
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const LDX_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
const MOV_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const ADD_K: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const JGT_X: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X
const JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JSET_K: u8 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const JA: u8 = 0x05; // BPF_JMP | BPF_JA
const LD_DW: u8 = 0x18; // BPF_LD | BPF_DW | BPF_IMM (two slots)
const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
const PSEUDO_MAP_FD: u8 = 1;
const HELPER_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

/// A 16-bit network-order field as a little-endian load reads it.
const fn net16(v: u16) -> i32 {
    v.swap_bytes() as i32
}

/// The program for map fd `map` and UDP port `port`. Jump offsets count
/// instructions after the jump; the labels are checked by the test below.
pub fn program(map: i32, port: u16) -> Vec<Insn> {
    // Registers: r1 ctx, r2 data, r3 data_end, r4 the end of what is
    // read next, r5 a field, r6 the saved ctx.
    let v4_port = 36i16;
    let v6_port = 56i16;
    let port = net16(port);
    let mut v = vec![
        /* 0 */ insn(MOV_X, 6, 1, 0, 0), // r6 = ctx
        /* 1 */ insn(LDX_W, 2, 1, 0, 0), // r2 = ctx->data
        /* 2 */ insn(LDX_W, 3, 1, 4, 0), // r3 = ctx->data_end
        /* 3 */ insn(MOV_X, 4, 2, 0, 0), // r4 = data
        /* 4 */ insn(ADD_K, 4, 0, 0, 14), // r4 += Ethernet header
        /* 5 */ insn(JGT_X, 4, 3, PASS - 6, 0), // short → pass
        /* 6 */ insn(LDX_H, 5, 2, 12, 0), // r5 = EtherType
        /* 7 */ insn(JEQ_K, 5, 0, V4 - 8, net16(0x0800)),
        /* 8 */ insn(JEQ_K, 5, 0, V6 - 9, net16(0x86DD)),
        /* 9 */ insn(JA, 0, 0, PASS - 10, 0),
        // V4 = 10: IPv4 at 14, UDP at 34.
        /* 10 */ insn(MOV_X, 4, 2, 0, 0),
        /* 11 */ insn(ADD_K, 4, 0, 0, 42), // Ethernet + IPv4 + UDP
        /* 12 */ insn(JGT_X, 4, 3, PASS - 13, 0),
        /* 13 */ insn(LDX_B, 5, 2, 14, 0), // version/IHL
        /* 14 */ insn(JNE_K, 5, 0, PASS - 15, 0x45), // options → pass
        /* 15 */ insn(LDX_B, 5, 2, 23, 0), // protocol
        /* 16 */ insn(JNE_K, 5, 0, PASS - 17, 17), // not UDP → pass
        /* 17 */ insn(LDX_H, 5, 2, 20, 0), // flags/fragment offset
        /* 18 */ insn(JSET_K, 5, 0, PASS - 19, net16(0x3FFF)), // fragment → pass
        /* 19 */ insn(LDX_H, 5, 2, v4_port, 0), // UDP destination port
        /* 20 */ insn(JEQ_K, 5, 0, REDIRECT - 21, port),
        /* 21 */ insn(JA, 0, 0, PASS - 22, 0),
        // V6 = 22: IPv6 at 14, UDP at 54.
        /* 22 */ insn(MOV_X, 4, 2, 0, 0),
        /* 23 */ insn(ADD_K, 4, 0, 0, 62), // Ethernet + IPv6 + UDP
        /* 24 */ insn(JGT_X, 4, 3, PASS - 25, 0),
        /* 25 */ insn(LDX_B, 5, 2, 20, 0), // next header
        /* 26 */ insn(JNE_K, 5, 0, PASS - 27, 17), // not UDP → pass
        /* 27 */ insn(LDX_H, 5, 2, v6_port, 0), // UDP destination port
        /* 28 */ insn(JNE_K, 5, 0, PASS - 29, port),
        // REDIRECT = 29: bpf_redirect_map(map, rx_queue_index, XDP_PASS).
        /* 29 */
        insn(LDX_W, 2, 6, 16, 0), // r2 = ctx->rx_queue_index
        /* 30 */ insn(LD_DW, 1, PSEUDO_MAP_FD, 0, map), // r1 = map (slot 1)
        /* 31 */ insn(0, 0, 0, 0, 0), // (slot 2)
        /* 32 */ insn(MOV_K, 3, 0, 0, XDP_PASS), // no socket → pass
        /* 33 */ insn(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),
        /* 34 */ insn(EXIT, 0, 0, 0, 0),
        // PASS = 35.
        /* 35 */ insn(MOV_K, 0, 0, 0, XDP_PASS),
        /* 36 */ insn(EXIT, 0, 0, 0, 0),
    ];
    v.shrink_to_fit();
    v
}

const V4: i16 = 10;
const V6: i16 = 22;
const REDIRECT: i16 = 29;
const PASS: i16 = 35;

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels sit where the jumps expect them.
    #[test]
    fn labels_match_the_instructions() {
        let p = program(7, 4791);
        assert_eq!(p.len(), 37);
        assert_eq!(p[V4 as usize], insn(MOV_X, 4, 2, 0, 0));
        assert_eq!(p[V6 as usize], insn(MOV_X, 4, 2, 0, 0));
        assert_eq!(p[V6 as usize + 1].imm, 62);
        assert_eq!(p[REDIRECT as usize].code, LDX_W);
        assert_eq!(p[REDIRECT as usize].off, 16);
        assert_eq!(p[PASS as usize], insn(MOV_K, 0, 0, 0, XDP_PASS));
        assert_eq!(p[30].imm, 7);
        // Every jump lands inside the program.
        for (i, x) in p.iter().enumerate() {
            if x.code & 0x07 == 0x05 && x.code != CALL && x.code != EXIT {
                let to = i as i64 + 1 + i64::from(x.off);
                assert!((0..p.len() as i64).contains(&to), "jump at {i} to {to}");
            }
        }
        // 4791 in network order, as a little-endian u16 load reads it.
        assert_eq!(p[20].imm, 0xB712);
    }
}
