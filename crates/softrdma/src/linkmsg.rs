//! The messages same-host devices exchange over a link's Unix socket, in
//! the manner of smoltcp's `wire` module: a fixed-size byte layout, a
//! `Repr` that is built or parsed, and a parser that checks every field
//! of what came from the other process before anything uses it.
//!
//! Every message is [`MSG_LEN`] bytes: magic `SRDL`, version (u16 LE),
//! kind (u16 LE), then the kind's fields (little-endian) and zeros.
//!
//! | kind | name | fields | descriptors |
//! |---|---|---|---|
//! | 1 | HELLO | sender's device address (18 bytes: IPv6 or v4-mapped, port BE) | link segment memfd, wake-up eventfd |
//! | 2 | WELCOME | sender's device address | wake-up eventfd |
//! | 3 | GRANT_REQUEST | rkey, requester QPN, target QPN, access needed | – |
//! | 4 | GRANT | rkey, target QPN, table slot, generation, PD, region access, QP access, region iova, length, offset of the iova byte in the memfd | the region's memfd |
//! | 5 | REFUSE | rkey, target QPN, access asked | – |

use softrdma_engine::{PdHandle, Qpn, Rkey};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Bytes of every link message.
pub const MSG_LEN: usize = 64;
const MAGIC: [u8; 4] = *b"SRDL";
/// The link protocol version this build speaks.
pub const VERSION: u16 = 2;

/// Grant slots in each direction of a link (see `grant.rs`).
pub const GRANT_SLOTS: u32 = 256;

/// A request for direct access to one region of the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRequest {
    /// The region asked for.
    pub rkey: Rkey,
    /// The requester's QP, which must be the target QP's destination.
    pub requester_qpn: Qpn,
    /// The receiver's QP the requester is connected to.
    pub target_qpn: Qpn,
    /// The remote access right needed (`AccessFlags` bits).
    pub access: u32,
}

/// Direct access granted to a region, with the facts the requester checks
/// each operation against (with the engine's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The region granted.
    pub rkey: Rkey,
    /// The granter's QP the grant is for.
    pub target_qpn: Qpn,
    /// Slot of the grant in the granter's table of the link.
    pub slot: u32,
    /// The slot's generation when the grant was made.
    pub gen: u32,
    /// The region's (and the QP's) protection domain.
    pub pd: PdHandle,
    /// The region's access flags.
    pub access: u32,
    /// The target QP's access flags.
    pub qp_access: u32,
    /// The region's virtual address.
    pub iova: u64,
    /// The region's length.
    pub len: u64,
    /// Where the byte at `iova` is in the memfd.
    pub offset: u64,
}

/// A message on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // the table in the module documentation says what each field is
pub enum LinkMsg {
    Hello {
        addr: SocketAddr,
    },
    Welcome {
        addr: SocketAddr,
    },
    GrantRequest(GrantRequest),
    Grant(Grant),
    Refuse {
        rkey: Rkey,
        target_qpn: Qpn,
        access: u32,
    },
}

impl LinkMsg {
    /// The message's kind number.
    pub fn kind(&self) -> u16 {
        match self {
            LinkMsg::Hello { .. } => 1,
            LinkMsg::Welcome { .. } => 2,
            LinkMsg::GrantRequest(_) => 3,
            LinkMsg::Grant(_) => 4,
            LinkMsg::Refuse { .. } => 5,
        }
    }

    /// How many descriptors travel with the message.
    pub fn fds(&self) -> usize {
        match self {
            LinkMsg::Hello { .. } => 2,
            LinkMsg::Welcome { .. } | LinkMsg::Grant(_) => 1,
            _ => 0,
        }
    }

    /// The message's bytes.
    pub fn to_bytes(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.kind().to_le_bytes());
        let mut w = Writer { b: &mut b, at: 8 };
        match *self {
            LinkMsg::Hello { addr } | LinkMsg::Welcome { addr } => w.bytes(&addr_bytes(addr)),
            LinkMsg::GrantRequest(r) => {
                w.u32(r.rkey.raw());
                w.u32(r.requester_qpn.raw());
                w.u32(r.target_qpn.raw());
                w.u32(r.access);
            }
            LinkMsg::Grant(g) => {
                for v in [
                    g.rkey.raw(),
                    g.target_qpn.raw(),
                    g.slot,
                    g.gen,
                    g.pd.raw(),
                    g.access,
                    g.qp_access,
                    0,
                ] {
                    w.u32(v);
                }
                w.u64(g.iova);
                w.u64(g.len);
                w.u64(g.offset);
            }
            LinkMsg::Refuse {
                rkey,
                target_qpn,
                access,
            } => {
                w.u32(rkey.raw());
                w.u32(target_qpn.raw());
                w.u32(access);
            }
        }
        b
    }

    /// Parses a message from a peer, checking every field: the error says
    /// which one is wrong.
    pub fn parse(b: &[u8]) -> Result<LinkMsg, String> {
        if b.len() != MSG_LEN {
            return Err(format!("message of {} bytes, expected {MSG_LEN}", b.len()));
        }
        if b[..4] != MAGIC {
            return Err("not a softrdma link message (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(format!(
                "link protocol version {version}, this build speaks {VERSION}"
            ));
        }
        let kind = u16::from_le_bytes([b[6], b[7]]);
        let mut r = Reader { b, at: 8 };
        let msg = match kind {
            1 | 2 => {
                let mut a = [0u8; 18];
                a.copy_from_slice(r.take(18));
                let addr = addr_from(&a);
                if addr.port() == 0 || addr.ip().is_unspecified() || addr.ip().is_multicast() {
                    return Err(format!("the message names no device address ({addr})"));
                }
                if kind == 1 {
                    LinkMsg::Hello { addr }
                } else {
                    LinkMsg::Welcome { addr }
                }
            }
            3 => LinkMsg::GrantRequest(GrantRequest {
                rkey: Rkey::from_raw(r.u32()),
                requester_qpn: Qpn::from_raw(r.qpn("requester QPN")?),
                target_qpn: Qpn::from_raw(r.qpn("target QPN")?),
                access: r.u32(),
            }),
            4 => {
                let (rkey, target_qpn) = (r.u32(), r.qpn("target QPN")?);
                let (slot, gen, pd, access, qp_access) =
                    (r.u32(), r.u32(), r.u32(), r.u32(), r.u32());
                if slot >= GRANT_SLOTS {
                    return Err(format!(
                        "grant slot {slot} beyond the table's {GRANT_SLOTS}"
                    ));
                }
                if r.u32() != 0 {
                    return Err("grant padding not zero".into());
                }
                let (iova, len, offset) = (r.u64(), r.u64(), r.u64());
                if len == 0 {
                    return Err("grant of an empty region".into());
                }
                if iova.checked_add(len).is_none() {
                    return Err(format!("grant iova {iova:#x} + length {len} overflows"));
                }
                if offset.checked_add(len).is_none() {
                    return Err(format!("grant offset {offset} + length {len} overflows"));
                }
                LinkMsg::Grant(Grant {
                    rkey: Rkey::from_raw(rkey),
                    target_qpn: Qpn::from_raw(target_qpn),
                    slot,
                    gen,
                    pd: PdHandle::from_raw(pd),
                    access,
                    qp_access,
                    iova,
                    len,
                    offset,
                })
            }
            5 => LinkMsg::Refuse {
                rkey: Rkey::from_raw(r.u32()),
                target_qpn: Qpn::from_raw(r.qpn("target QPN")?),
                access: r.u32(),
            },
            k => return Err(format!("unknown link message kind {k}")),
        };
        if b[r.at..].iter().any(|&x| x != 0) {
            return Err(format!(
                "message kind {kind}: bytes past its fields are not zero"
            ));
        }
        Ok(msg)
    }
}

struct Writer<'a> {
    b: &'a mut [u8; MSG_LEN],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, v: &[u8]) {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u32(&mut self) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4));
        u32::from_le_bytes(a)
    }
    fn u64(&mut self) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8));
        u64::from_le_bytes(a)
    }
    fn qpn(&mut self, what: &str) -> Result<u32, String> {
        let v = self.u32();
        if v >= 1 << 24 {
            return Err(format!("{what} {v:#x} is not a 24-bit QP number"));
        }
        Ok(v)
    }
}

/// Largest region memfd a grant may carry (it is mapped whole).
pub const MAX_SEGMENT: u64 = 1 << 40;

/// Checks a grant against the size of the memfd it came with: the region
/// must lie inside it (what [`LinkMsg::parse`] cannot know alone).
pub fn check_grant_fits(g: &Grant, memfd_size: u64) -> Result<(), String> {
    if memfd_size == 0 || memfd_size > MAX_SEGMENT {
        return Err(format!("a granted segment of {memfd_size} bytes"));
    }
    let end = g
        .offset
        .checked_add(g.len)
        .ok_or_else(|| "grant offset + length overflows".to_string())?;
    if end > memfd_size {
        return Err(format!(
            "grant of {} bytes at offset {} in a segment of {memfd_size}",
            g.len, g.offset
        ));
    }
    Ok(())
}

/// Everything a peer controls in one link message and the size of the
/// memfd that came with it, checked as the device checks them: the fuzz
/// target's entry point. Never panics; `Ok` only for a message the device
/// would act on.
pub fn check_from_peer(bytes: &[u8], memfd_size: u64) -> Result<LinkMsg, String> {
    let m = LinkMsg::parse(bytes)?;
    if let LinkMsg::Grant(g) = &m {
        check_grant_fits(g, memfd_size)?;
    }
    Ok(m)
}

/// A device address as 18 bytes (IPv6 or v4-mapped, then the port big-endian).
pub fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let mut b = [0u8; 18];
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    b[..16].copy_from_slice(&ip);
    b[16..].copy_from_slice(&a.port().to_be_bytes());
    b
}

fn addr_from(b: &[u8; 18]) -> SocketAddr {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[..16]);
    let v6 = Ipv6Addr::from(ip);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_be_bytes([b[16], b[17]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<LinkMsg> {
        let addr: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        vec![
            LinkMsg::Hello { addr },
            LinkMsg::Welcome {
                addr: "[fe80::1]:5000".parse().unwrap(),
            },
            LinkMsg::GrantRequest(GrantRequest {
                rkey: Rkey::from_raw(0xdead_beef),
                requester_qpn: Qpn::from_raw(0x12),
                target_qpn: Qpn::from_raw(0xff_ffff),
                access: 2,
            }),
            LinkMsg::Grant(Grant {
                rkey: Rkey::from_raw(7),
                target_qpn: Qpn::from_raw(9),
                slot: 255,
                gen: 3,
                pd: PdHandle::from_raw(1),
                access: 15,
                qp_access: 14,
                iova: 0x7f00_0000_0000,
                len: 4096,
                offset: 0,
            }),
            LinkMsg::Refuse {
                rkey: Rkey::from_raw(1),
                target_qpn: Qpn::from_raw(2),
                access: 4,
            },
        ]
    }

    /// A bounded run of the fuzz target (`crates/softrdma/fuzz`): mutated
    /// and random messages never panic, whatever parses is what it
    /// encodes, and a grant accepted fits its segment.
    #[test]
    fn mutated_messages_are_refused_or_round_trip() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds: Vec<[u8; MSG_LEN]> = samples().iter().map(|m| m.to_bytes()).collect();
        let mut accepted = 0;
        for i in 0..200_000u32 {
            let mut b = seeds[i as usize % seeds.len()].to_vec();
            match next() % 4 {
                0 => {
                    let at = (next() % MSG_LEN as u64) as usize;
                    b[at] = next() as u8;
                }
                1 => {
                    for _ in 0..1 + next() % 8 {
                        let at = (next() % MSG_LEN as u64) as usize;
                        b[at] ^= 1 << (next() % 8);
                    }
                }
                2 => b.truncate((next() % (MSG_LEN as u64 + 1)) as usize),
                _ => b.iter_mut().skip(8).for_each(|v| *v = next() as u8),
            }
            let size = match next() % 3 {
                0 => 4096,
                1 => next() % (1 << 20),
                _ => next(),
            };
            if let Ok(m) = check_from_peer(&b, size) {
                accepted += 1;
                assert_eq!(LinkMsg::parse(&m.to_bytes()), Ok(m));
                if let LinkMsg::Grant(g) = m {
                    assert!(g.offset + g.len <= size && size <= MAX_SEGMENT);
                    assert!(g.slot < GRANT_SLOTS && g.len > 0);
                }
            }
        }
        assert!(
            accepted > 1000,
            "the mutations kept some messages valid: {accepted}"
        );
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(LinkMsg::parse(&m.to_bytes()), Ok(m));
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let g = samples()[3].to_bytes();
        type Edit = Box<dyn Fn(&mut [u8; MSG_LEN])>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|b| b[0] = b'X'), "magic"),
            (Box::new(|b| b[4] = 9), "version"),
            (Box::new(|b| b[6] = 77), "kind 77"),
            (
                Box::new(|b| b[16..20].copy_from_slice(&256u32.to_le_bytes())),
                "slot 256",
            ),
            (
                Box::new(|b| b[12..16].copy_from_slice(&(1u32 << 24).to_le_bytes())),
                "target QPN",
            ),
            (
                Box::new(|b| b[48..56].copy_from_slice(&0u64.to_le_bytes())),
                "empty region",
            ),
            (
                Box::new(|b| b[40..48].copy_from_slice(&u64::MAX.to_le_bytes())),
                "overflows",
            ),
            (Box::new(|b| b[36] = 1), "padding"),
        ];
        for (edit, want) in cases {
            let mut b = g;
            edit(&mut b);
            let e = LinkMsg::parse(&b).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let mut h = samples()[0].to_bytes();
        h[40] = 1;
        assert!(LinkMsg::parse(&h).unwrap_err().contains("not zero"));
        assert!(LinkMsg::parse(&h[..10]).unwrap_err().contains("10 bytes"));
    }
}
