//! Hand-built capture files for the reader tests: classic pcap in either
//! byte order and resolution, and pcapng block by block.

#![allow(dead_code)]

use std::net::SocketAddr;

use softrdma_wire::{BthRepr, Endpoints, Headers, Opcode, PacketRepr, Psn, RethRepr};

/// A classic pcap file with the given byte order, resolution and link type.
/// Records are `(secs, frac, data)`; `frac` is in micro- or nanoseconds.
pub fn classic(big: bool, nanos: bool, link: u32, records: &[(u32, u32, &[u8])]) -> Vec<u8> {
    let mut f = Vec::new();
    let put32 = |f: &mut Vec<u8>, v: u32| {
        f.extend_from_slice(&if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    };
    let put16 = |f: &mut Vec<u8>, v: u16| {
        f.extend_from_slice(&if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    };
    put32(&mut f, if nanos { 0xA1B2_3C4D } else { 0xA1B2_C3D4 });
    put16(&mut f, 2);
    put16(&mut f, 4);
    put32(&mut f, 0);
    put32(&mut f, 0);
    put32(&mut f, 262_144);
    put32(&mut f, link);
    for (s, frac, data) in records {
        put32(&mut f, *s);
        put32(&mut f, *frac);
        put32(&mut f, data.len() as u32);
        put32(&mut f, data.len() as u32);
        f.extend_from_slice(data);
    }
    f
}

/// Builds pcapng blocks in one byte order.
pub struct Ng {
    pub big: bool,
    pub out: Vec<u8>,
}

impl Ng {
    pub fn new(big: bool) -> Self {
        let mut ng = Ng {
            big,
            out: Vec::new(),
        };
        ng.shb();
        ng
    }

    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }
    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    /// Appends a block of `block_type` with `body` (padded to 4).
    pub fn block(&mut self, block_type: u32, body: &[u8]) -> &mut Self {
        let padded = (body.len() + 3) & !3;
        let total = (12 + padded) as u32;
        let (t, l) = (self.u32(block_type), self.u32(total));
        self.out.extend_from_slice(&t);
        self.out.extend_from_slice(&l);
        self.out.extend_from_slice(body);
        self.out.resize(self.out.len() + padded - body.len(), 0);
        self.out.extend_from_slice(&l);
        self
    }

    /// An option `(code, value)` list ending in opt_endofopt.
    pub fn options(&self, opts: &[(u16, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (code, v) in opts {
            b.extend_from_slice(&self.u16(*code));
            b.extend_from_slice(&self.u16(v.len() as u16));
            b.extend_from_slice(v);
            b.resize((b.len() + 3) & !3, 0);
        }
        b.extend_from_slice(&[0, 0, 0, 0]);
        b
    }

    /// A Section Header Block (version 1.0, unknown section length).
    pub fn shb(&mut self) -> &mut Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.u32(0x1A2B_3C4D));
        b.extend_from_slice(&self.u16(1));
        b.extend_from_slice(&self.u16(0));
        b.extend_from_slice(&[0xFF; 8]);
        let shb_comment = self.options(&[(1, b"softrdma test")]);
        b.extend_from_slice(&shb_comment);
        self.block(0x0A0D_0D0A, &b)
    }

    /// An Interface Description Block; `tsresol` / `tsoffset` as options.
    pub fn idb(&mut self, link: u16, tsresol: Option<u8>, tsoffset: Option<i64>) -> &mut Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.u16(link));
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.u32(0));
        let mut opts: Vec<(u16, Vec<u8>)> = vec![(2, b"eth-test".to_vec())];
        if let Some(r) = tsresol {
            opts.push((9, vec![r]));
        }
        if let Some(o) = tsoffset {
            let v = if self.big {
                o.to_be_bytes()
            } else {
                o.to_le_bytes()
            };
            opts.push((14, v.to_vec()));
        }
        let refs: Vec<(u16, &[u8])> = opts.iter().map(|(c, v)| (*c, v.as_slice())).collect();
        let o = self.options(&refs);
        b.extend_from_slice(&o);
        self.block(1, &b)
    }

    /// An Enhanced Packet Block with a raw 64-bit timestamp in interface units.
    pub fn epb(&mut self, iface: u32, ts: u64, data: &[u8]) -> &mut Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.u32(iface));
        b.extend_from_slice(&self.u32((ts >> 32) as u32));
        b.extend_from_slice(&self.u32(ts as u32));
        b.extend_from_slice(&self.u32(data.len() as u32));
        b.extend_from_slice(&self.u32(data.len() as u32 + 100));
        b.extend_from_slice(data);
        b.resize((b.len() + 3) & !3, 0);
        let o = self.options(&[(1, b"a packet comment")]);
        b.extend_from_slice(&o);
        self.block(6, &b)
    }

    /// A Simple Packet Block.
    pub fn spb(&mut self, data: &[u8]) -> &mut Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.u32(data.len() as u32));
        b.extend_from_slice(data);
        self.block(3, &b)
    }

    /// An obsolete Packet Block.
    pub fn pb(&mut self, iface: u16, ts: u64, data: &[u8]) -> &mut Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.u16(iface));
        b.extend_from_slice(&self.u16(0));
        b.extend_from_slice(&self.u32((ts >> 32) as u32));
        b.extend_from_slice(&self.u32(ts as u32));
        b.extend_from_slice(&self.u32(data.len() as u32));
        b.extend_from_slice(&self.u32(data.len() as u32));
        b.extend_from_slice(data);
        self.block(2, &b)
    }

    /// Starts a new section in byte order `big`.
    pub fn section(&mut self, big: bool) -> &mut Self {
        self.big = big;
        self.shb()
    }
}

/// A RoCEv2 RDMA WRITE Only packet (UDP payload) between `src` and `dst`.
pub fn roce_payload(src: SocketAddr, dst: SocketAddr, psn: u32) -> Vec<u8> {
    let data = [0xA5u8; 13];
    let p = PacketRepr {
        bth: BthRepr::new(Opcode::RC_WRITE_ONLY, 0x12, Psn::new(psn)),
        headers: Headers::Reth(RethRepr {
            va: 0x1000,
            rkey: 0x55,
            dma_len: data.len() as u32,
        }),
        payload: &data,
    };
    let mut buf = vec![0u8; p.buffer_len()];
    p.emit(&mut buf, &Endpoints::new(src, dst)).unwrap();
    buf
}

/// A tiny deterministic PRNG (xorshift64*), so mutation tests need no crate
/// and replay exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
