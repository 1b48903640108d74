//! The rsocket protocol's formats, as rdma-core's rsockets puts them on
//! the wire (facts from librdmacm's rsocket.c; docs/rdmacm.md, "rsockets"):
//! the connection data carried as rdma_cm private data in the REQ and the
//! REP, the 32-bit immediate of every RDMA WRITE_WITH_IMM (an opcode in
//! bits 31..29, its argument in 28..0), and the two records one side
//! RDMA-writes into the other's memory: a buffer advertisement (`Sge`) and
//! an I/O mapping (`Iomap`). Pure data, no I/O.

/// The protocol version in the connection data.
pub const VERSION: u8 = 1;
/// The connection data's flags: the sender's host is big-endian.
pub const FLAG_NET: u8 = 1 << 0;
/// The connection data's flags: the sender offers an I/O-mapping table.
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Slots in the table of receive-buffer advertisements (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;
/// Bytes of the connection data.
pub const CONN_DATA_LEN: usize = 40;
/// Bytes of an [`Sge`] record.
pub const SGE_LEN: usize = 16;
/// Bytes of an [`Iomap`] record (an offset and an [`Sge`], unpadded).
pub const IOMAP_LEN: usize = 24;

/// The immediate's opcodes (`RS_OP_*`). `WRITE` never travels: it marks
/// a local RDMA WRITE without immediate (riowrite) in the WR id.
pub const OP_DATA: u32 = 0;
pub const OP_WRITE: u32 = 2;
pub const OP_SGL: u32 = 4;
pub const OP_IOMAP_SGL: u32 = 6;
pub const OP_CTRL: u32 = 7;

/// Control messages (`OP_CTRL`'s argument).
pub const CTRL_DISCONNECT: u32 = 0;
/// Sent by rsockets' keepalive service (not offered here); ignored.
#[allow(dead_code)]
pub const CTRL_KEEPALIVE: u32 = 1;
pub const CTRL_SHUTDOWN: u32 = 2;

/// The argument's mask (29 bits).
pub const DATA_MASK: u32 = 0x1FFF_FFFF;

/// An immediate: `op` in the top 3 bits, `data` below.
pub fn imm(op: u32, data: u32) -> u32 {
    (op << 29) | (data & DATA_MASK)
}

/// The opcode of an immediate.
pub fn op(imm: u32) -> u32 {
    imm >> 29
}

/// The argument of an immediate.
pub fn data(imm: u32) -> u32 {
    imm & DATA_MASK
}

/// A count in 8 bits as rsockets scales it: values up to 128 as they are,
/// larger ones as 0x80 | (value >> 8).
pub fn value_to_scale(value: u32, bits: u32) -> u32 {
    let half = 1 << (bits - 1);
    if value <= half {
        value
    } else {
        half | (value >> bits)
    }
}

/// The inverse of [`value_to_scale`].
pub fn scale_to_value(scaled: u32, bits: u32) -> u32 {
    let half = 1 << (bits - 1);
    if scaled <= half {
        scaled
    } else {
        (scaled & !half) << bits
    }
}

/// A buffer: where to RDMA-write, with which rkey, how many bytes
/// (`struct rs_sge`: addr, key, length).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

impl Sge {
    /// Big-endian, as in the connection data.
    fn put_be(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn get_be(b: &[u8]) -> Sge {
        Sge {
            addr: u64::from_be_bytes(b[0..8].try_into().unwrap_or_default()),
            key: u32::from_be_bytes(b[8..12].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(b[12..16].try_into().unwrap_or_default()),
        }
    }

    /// As written into the peer's memory: in the byte order the reader's
    /// host uses (`big` for a peer that set [`FLAG_NET`]).
    pub fn to_bytes(self, big: bool) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        if big {
            self.put_be(&mut b);
        } else {
            b[0..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..16].copy_from_slice(&self.length.to_le_bytes());
        }
        b
    }

    /// A record this host's peer wrote into its memory (host order).
    pub fn from_le(b: &[u8; SGE_LEN]) -> Sge {
        Sge {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            key: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
            length: u32::from_le_bytes(b[12..16].try_into().unwrap_or_default()),
        }
    }
}

/// An I/O mapping (`struct rs_iomap`): the peer's `offset` names the
/// buffer `sge`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Iomap {
    pub offset: u64,
    pub sge: Sge,
}

impl Iomap {
    pub fn to_bytes(self, big: bool) -> [u8; IOMAP_LEN] {
        let mut b = [0u8; IOMAP_LEN];
        let off = if big {
            self.offset.to_be_bytes()
        } else {
            self.offset.to_le_bytes()
        };
        b[0..8].copy_from_slice(&off);
        b[8..24].copy_from_slice(&self.sge.to_bytes(big));
        b
    }

    pub fn from_le(b: &[u8; IOMAP_LEN]) -> Iomap {
        let mut s = [0u8; SGE_LEN];
        s.copy_from_slice(&b[8..24]);
        Iomap {
            offset: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            sge: Sge::from_le(&s),
        }
    }
}

/// The connection data (`struct rs_conn_data`), in the REQ's and the REP's
/// private data: version, flags, the receive credits (the sender's receive
/// queue depth), the scaled size of its I/O-mapping table, where its table
/// of buffer advertisements is (`target_sgl`: address, rkey, number of
/// slots) and the first receive buffer (`data_buf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnData {
    pub flags: u8,
    pub credits: u16,
    pub target_iomap_size: u8,
    pub target_sgl: Sge,
    pub data_buf: Sge,
}

/// Why connection data was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnDataError {
    /// Fewer bytes than the structure.
    Short,
    /// A version other than 1.
    Version(u8),
}

impl ConnData {
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = VERSION;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // b[4..7] reserved, zero.
        b[7] = self.target_iomap_size;
        self.target_sgl.put_be(&mut b[8..24]);
        self.data_buf.put_be(&mut b[24..40]);
        b
    }

    pub fn decode(b: &[u8]) -> Result<ConnData, ConnDataError> {
        if b.len() < CONN_DATA_LEN {
            return Err(ConnDataError::Short);
        }
        if b[0] != VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        Ok(ConnData {
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: Sge::get_be(&b[8..24]),
            data_buf: Sge::get_be(&b[24..40]),
        })
    }

    /// The peer's host is big-endian: records written into its memory are
    /// byte-swapped from ours (`RS_OPT_SWAP_SGL`).
    pub fn peer_is_big_endian(&self) -> bool {
        self.flags & FLAG_NET != 0
    }

    /// Slots in the peer's I/O-mapping table (0 without [`FLAG_IOMAP`]).
    pub fn iomap_slots(&self) -> u32 {
        if self.flags & FLAG_IOMAP == 0 {
            0
        } else {
            scale_to_value(self.target_iomap_size.into(), 8)
        }
    }
}
