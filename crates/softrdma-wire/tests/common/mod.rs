//! Helpers shared by the integration tests: a tiny deterministic PRNG,
//! fixed endpoints, and builders for the extension headers of any layout.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

pub mod cm;

use softrdma_wire::{
    AethRepr, AtomicEthRepr, DethRepr, Endpoints, HeaderLayout, Headers, Msn, NakCode, RethRepr,
    Syndrome,
};

/// SplitMix64: tiny, fast, deterministic and good enough to drive a fuzzer.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
    pub fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for chunk in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

pub fn ep4() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(Ipv4Addr::new(192, 168, 10, 1).into(), 0xC123),
        SocketAddr::new(Ipv4Addr::new(192, 168, 10, 2).into(), 4791),
    )
}

pub fn ep6() -> Endpoints {
    Endpoints::new(
        SocketAddr::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xdead, 0xbeef).into(),
            0xC456,
        ),
        SocketAddr::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(), 4791),
    )
}

/// Raw values for every extension-header field; [`Fields::headers`] picks
/// those the layout needs.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
    pub imm: u32,
    pub syndrome: Syndrome,
    pub msn: Msn,
    pub orig: u64,
    pub swap_add: u64,
    pub compare: u64,
    pub qkey: u32,
    pub src_qp: u32,
}

impl Fields {
    pub fn zero() -> Self {
        Fields {
            va: 0,
            rkey: 0,
            dma_len: 0,
            imm: 0,
            syndrome: Syndrome::Ack { credits: 0 },
            msn: Msn::new(0),
            orig: 0,
            swap_add: 0,
            compare: 0,
            qkey: 0,
            src_qp: 0,
        }
    }

    pub fn max() -> Self {
        Fields {
            va: u64::MAX,
            rkey: u32::MAX,
            dma_len: u32::MAX,
            imm: u32::MAX,
            syndrome: Syndrome::Nak(NakCode::InvalidRdRequest),
            msn: Msn::new(0xFF_FFFF),
            orig: u64::MAX,
            swap_add: u64::MAX,
            compare: u64::MAX,
            qkey: u32::MAX,
            src_qp: 0xFF_FFFF,
        }
    }

    pub fn random(r: &mut Rng) -> Self {
        Fields {
            va: r.next_u64(),
            rkey: r.next_u32(),
            dma_len: r.next_u32(),
            imm: r.next_u32(),
            syndrome: random_syndrome(r),
            msn: Msn::new(r.next_u32()),
            orig: r.next_u64(),
            swap_add: r.next_u64(),
            compare: r.next_u64(),
            qkey: r.next_u32(),
            src_qp: r.next_u32() & 0xFF_FFFF,
        }
    }

    pub fn headers(&self, layout: HeaderLayout) -> Headers {
        let reth = RethRepr {
            va: self.va,
            rkey: self.rkey,
            dma_len: self.dma_len,
        };
        let aeth = AethRepr {
            syndrome: self.syndrome,
            msn: self.msn,
        };
        let deth = DethRepr {
            qkey: self.qkey,
            src_qp: self.src_qp,
        };
        match layout {
            HeaderLayout::None => Headers::None,
            HeaderLayout::Imm => Headers::Imm(self.imm),
            HeaderLayout::Ieth => Headers::Ieth(self.rkey),
            HeaderLayout::Reth => Headers::Reth(reth),
            HeaderLayout::RethImm => Headers::RethImm(reth, self.imm),
            HeaderLayout::Aeth => Headers::Aeth(aeth),
            HeaderLayout::AtomicAck => Headers::AtomicAck(aeth, self.orig),
            HeaderLayout::Atomic => Headers::Atomic(AtomicEthRepr {
                va: self.va,
                rkey: self.rkey,
                swap_add: self.swap_add,
                compare: self.compare,
            }),
            HeaderLayout::Deth => Headers::Deth(deth),
            HeaderLayout::DethImm => Headers::DethImm(deth, self.imm),
            HeaderLayout::Cnp => Headers::Cnp,
            // An XRC request: the XRC SRQ number (24 bits) from the source QP
            // field, then the RC request's headers.
            HeaderLayout::Xrc
            | HeaderLayout::XrcImm
            | HeaderLayout::XrcIeth
            | HeaderLayout::XrcReth
            | HeaderLayout::XrcRethImm
            | HeaderLayout::XrcAtomic => self
                .headers(layout.without_xrceth())
                .with_xrceth(self.src_qp & 0xFF_FFFF)
                .unwrap(),
        }
    }
}

/// Every syndrome byte the AETH accepts, decoded.
pub fn all_syndromes() -> Vec<Syndrome> {
    (0u8..=255)
        .filter_map(|b| Syndrome::from_byte(b).ok())
        .collect()
}

pub fn random_syndrome(r: &mut Rng) -> Syndrome {
    match r.below(3) {
        0 => Syndrome::Ack {
            credits: r.byte() & 0x1F,
        },
        1 => Syndrome::RnrNak {
            timer: r.byte() & 0x1F,
        },
        _ => Syndrome::Nak(NakCode::from_value((r.below(5)) as u8).unwrap()),
    }
}
