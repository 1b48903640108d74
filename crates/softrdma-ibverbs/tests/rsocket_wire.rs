//! rsockets' formats (`ibverbs::rsocket_wire`, the module behind the
//! drop-in's rsocket calls) against rdma-core's layout: the connection
//! data's 40 bytes, the immediate's opcode and argument, the records one
//! side writes into the other's memory, the 8-bit size scaling.

use ibverbs::rsocket_wire::*;

#[test]
fn immediates_split_as_rsockets_does() {
    let m = imm(OP_SGL, 384 + 17);
    assert_eq!(m, 0x8000_0000 | 401);
    assert_eq!((op(m), data(m)), (OP_SGL, 401));
    assert_eq!(imm(OP_CTRL, CTRL_DISCONNECT), 0xE000_0000);
    // The argument keeps 29 bits.
    assert_eq!(data(imm(OP_DATA, u32::MAX)), DATA_MASK);
}

#[test]
fn conn_data_layout_is_rdma_cores() {
    let c = ConnData {
        flags: FLAG_IOMAP,
        credits: 384,
        target_iomap_size: 1,
        target_sgl: Sge {
            addr: 0x1122_3344_5566_7788,
            key: 0xAABB_CCDD,
            length: SGL_SIZE,
        },
        data_buf: Sge {
            addr: 0x7F00_0000_1000,
            key: 0x0102_0304,
            length: 65536,
        },
    };
    let b = c.encode();
    assert_eq!(&b[0..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 1]);
    assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(&b[16..20], &[0xAA, 0xBB, 0xCC, 0xDD]);
    assert_eq!(&b[20..24], &[0, 0, 0, 2]);
    assert_eq!(&b[36..40], &65536u32.to_be_bytes());
    assert_eq!(ConnData::decode(&b), Ok(c));
    assert_eq!(c.iomap_slots(), 1);
    assert!(!c.peer_is_big_endian());
}

#[test]
fn bad_conn_data_is_refused() {
    let mut b = [0u8; CONN_DATA_LEN];
    assert_eq!(ConnData::decode(&b[..39]), Err(ConnDataError::Short));
    assert_eq!(ConnData::decode(&b), Err(ConnDataError::Version(0)));
    b[0] = 2;
    assert_eq!(ConnData::decode(&b), Err(ConnDataError::Version(2)));
}

#[test]
fn records_in_either_byte_order() {
    let s = Sge {
        addr: 0x10_0000,
        key: 7,
        length: 4096,
    };
    assert_eq!(Sge::from_le(&s.to_bytes(false)), s);
    let be = s.to_bytes(true);
    assert_eq!(&be[12..16], &4096u32.to_be_bytes());
    let m = Iomap { offset: 5, sge: s };
    assert_eq!(Iomap::from_le(&m.to_bytes(false)), m);
    // struct rs_iomap: the offset, then the sge, unpadded (24 bytes; a
    // 32-byte write overran rdma-core's table in the rxe guest).
    let b = m.to_bytes(false);
    assert_eq!(b.len(), 24);
    assert_eq!(&b[0..8], &5u64.to_le_bytes());
    assert_eq!(&b[8..16], &0x10_0000u64.to_le_bytes());
    assert_eq!(&b[20..24], &4096u32.to_le_bytes());
}

#[test]
fn scaling_round_trips_supported_sizes() {
    for v in [0, 1, 64, 128] {
        assert_eq!(scale_to_value(value_to_scale(v, 8), 8), v);
    }
    assert_eq!(value_to_scale(256, 8), 0x81);
    assert_eq!(scale_to_value(0x81, 8), 256);
}
