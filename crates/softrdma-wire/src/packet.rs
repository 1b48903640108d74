//! A whole RoCEv2 UDP payload: BTH, the extension headers its opcode calls
//! for, payload, pad and ICRC.
//!
//! [`PacketRepr::parse`] checks structure (lengths, opcode, pad) and returns
//! the typed headers plus a borrowed payload; the ICRC is checked separately by
//! [`crate::icrc::verify`] because it needs the IP/UDP endpoints. Emitting goes
//! through the same opcode table, writes the pad count and pad bytes, and
//! seals the ICRC.

use crate::aeth::{self, AethRepr, Syndrome};
use crate::atomic_eth::{self, AtomicEthRepr};
use crate::bth::{self, BthRepr};
use crate::icrc::{self, Endpoints, ICRC_LEN};
use crate::opcode::{HeaderLayout, Opcode};
use crate::reth::{self, RethRepr};
use crate::sack;
use crate::small::{self, DethRepr};
use crate::{Error, Result};

/// The extension headers of one packet, typed by the opcode's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    /// BTH only.
    None,
    /// Immediate data (ImmDt).
    Imm(u32),
    /// The rkey to invalidate (IETH).
    Ieth(u32),
    /// RETH.
    Reth(RethRepr),
    /// RETH then ImmDt.
    RethImm(RethRepr, u32),
    /// AETH.
    Aeth(AethRepr),
    /// AETH then AtomicAckETH (the original remote value).
    AtomicAck(AethRepr, u64),
    /// AtomicETH.
    Atomic(AtomicEthRepr),
    /// DETH.
    Deth(DethRepr),
    /// DETH then ImmDt.
    DethImm(DethRepr, u32),
    /// The 16 reserved bytes of a CNP (emitted as zeros, ignored on parse).
    Cnp,
    /// XRCETH (the XRC SRQ number) alone.
    Xrc(u32),
    /// XRCETH then ImmDt.
    XrcImm(u32, u32),
    /// XRCETH then IETH.
    XrcIeth(u32, u32),
    /// XRCETH then RETH.
    XrcReth(u32, RethRepr),
    /// XRCETH, RETH, ImmDt.
    XrcRethImm(u32, RethRepr, u32),
    /// XRCETH then AtomicETH.
    XrcAtomic(u32, AtomicEthRepr),
}

impl Headers {
    /// The layout these headers have.
    pub const fn layout(&self) -> HeaderLayout {
        match self {
            Headers::None => HeaderLayout::None,
            Headers::Imm(_) => HeaderLayout::Imm,
            Headers::Ieth(_) => HeaderLayout::Ieth,
            Headers::Reth(_) => HeaderLayout::Reth,
            Headers::RethImm(..) => HeaderLayout::RethImm,
            Headers::Aeth(_) => HeaderLayout::Aeth,
            Headers::AtomicAck(..) => HeaderLayout::AtomicAck,
            Headers::Atomic(_) => HeaderLayout::Atomic,
            Headers::Deth(_) => HeaderLayout::Deth,
            Headers::DethImm(..) => HeaderLayout::DethImm,
            Headers::Cnp => HeaderLayout::Cnp,
            Headers::Xrc(_) => HeaderLayout::Xrc,
            Headers::XrcImm(..) => HeaderLayout::XrcImm,
            Headers::XrcIeth(..) => HeaderLayout::XrcIeth,
            Headers::XrcReth(..) => HeaderLayout::XrcReth,
            Headers::XrcRethImm(..) => HeaderLayout::XrcRethImm,
            Headers::XrcAtomic(..) => HeaderLayout::XrcAtomic,
        }
    }

    /// These headers with an XRCETH naming `srqn` in front: an XRC request's
    /// headers from the RC request's. `None` for headers no XRC request has
    /// (AETH, DETH, CNP, or an XRCETH already).
    pub const fn with_xrceth(self, srqn: u32) -> Option<Headers> {
        Some(match self {
            Headers::None => Headers::Xrc(srqn),
            Headers::Imm(i) => Headers::XrcImm(srqn, i),
            Headers::Ieth(k) => Headers::XrcIeth(srqn, k),
            Headers::Reth(r) => Headers::XrcReth(srqn, r),
            Headers::RethImm(r, i) => Headers::XrcRethImm(srqn, r, i),
            Headers::Atomic(a) => Headers::XrcAtomic(srqn, a),
            _ => return None,
        })
    }

    /// The headers without their XRCETH (themselves when they have none).
    pub const fn without_xrceth(self) -> Headers {
        match self {
            Headers::Xrc(_) => Headers::None,
            Headers::XrcImm(_, i) => Headers::Imm(i),
            Headers::XrcIeth(_, k) => Headers::Ieth(k),
            Headers::XrcReth(_, r) => Headers::Reth(r),
            Headers::XrcRethImm(_, r, i) => Headers::RethImm(r, i),
            Headers::XrcAtomic(_, a) => Headers::Atomic(a),
            other => other,
        }
    }

    /// The XRC SRQ number of the XRCETH, if any.
    pub const fn xrc_srqn(&self) -> Option<u32> {
        match *self {
            Headers::Xrc(n)
            | Headers::XrcImm(n, _)
            | Headers::XrcIeth(n, _)
            | Headers::XrcReth(n, _)
            | Headers::XrcRethImm(n, ..)
            | Headers::XrcAtomic(n, _) => Some(n),
            _ => None,
        }
    }

    /// The rkey to invalidate (IETH), if any.
    pub const fn ieth(&self) -> Option<u32> {
        match *self {
            Headers::Ieth(k) | Headers::XrcIeth(_, k) => Some(k),
            _ => None,
        }
    }

    /// The AtomicETH, if any.
    pub const fn atomic(&self) -> Option<AtomicEthRepr> {
        match *self {
            Headers::Atomic(a) | Headers::XrcAtomic(_, a) => Some(a),
            _ => None,
        }
    }

    /// Bytes these headers take on the wire.
    pub const fn len(&self) -> usize {
        self.layout().len()
    }

    /// True when there are no extension headers.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The RETH, if any.
    pub const fn reth(&self) -> Option<RethRepr> {
        match *self {
            Headers::Reth(r)
            | Headers::RethImm(r, _)
            | Headers::XrcReth(_, r)
            | Headers::XrcRethImm(_, r, _) => Some(r),
            _ => None,
        }
    }

    /// The AETH, if any.
    pub const fn aeth(&self) -> Option<AethRepr> {
        match *self {
            Headers::Aeth(a) | Headers::AtomicAck(a, _) => Some(a),
            _ => None,
        }
    }

    /// The immediate data, if any.
    pub const fn imm(&self) -> Option<u32> {
        match *self {
            Headers::Imm(i)
            | Headers::RethImm(_, i)
            | Headers::DethImm(_, i)
            | Headers::XrcImm(_, i)
            | Headers::XrcRethImm(_, _, i) => Some(i),
            _ => None,
        }
    }

    /// The DETH, if any.
    pub const fn deth(&self) -> Option<DethRepr> {
        match *self {
            Headers::Deth(d) | Headers::DethImm(d, _) => Some(d),
            _ => None,
        }
    }

    fn parse(layout: HeaderLayout, b: &[u8]) -> Result<Self> {
        let reth =
            |b: &[u8]| -> Result<RethRepr> { RethRepr::parse(&reth::Packet::new_checked(b)?) };
        let aeth =
            |b: &[u8]| -> Result<AethRepr> { AethRepr::parse(&aeth::Packet::new_checked(b)?) };
        Ok(match layout {
            HeaderLayout::None => Headers::None,
            HeaderLayout::Imm => Headers::Imm(small::parse_immdt(b)?),
            HeaderLayout::Ieth => Headers::Ieth(small::parse_ieth(b)?),
            HeaderLayout::Reth => Headers::Reth(reth(b)?),
            HeaderLayout::RethImm => {
                Headers::RethImm(reth(b)?, small::parse_immdt(&b[reth::HEADER_LEN..])?)
            }
            HeaderLayout::Aeth => Headers::Aeth(aeth(b)?),
            HeaderLayout::AtomicAck => Headers::AtomicAck(
                aeth(b)?,
                small::parse_atomic_ack_eth(&b[aeth::HEADER_LEN..])?,
            ),
            HeaderLayout::Atomic => {
                Headers::Atomic(AtomicEthRepr::parse(&atomic_eth::Packet::new_checked(b)?)?)
            }
            HeaderLayout::Deth => Headers::Deth(DethRepr::parse(b)?),
            HeaderLayout::DethImm => Headers::DethImm(
                DethRepr::parse(b)?,
                small::parse_immdt(&b[small::DETH_LEN..])?,
            ),
            HeaderLayout::Cnp => {
                crate::util::check("CNP", b, HeaderLayout::Cnp.len())?;
                Headers::Cnp
            }
            HeaderLayout::Xrc
            | HeaderLayout::XrcImm
            | HeaderLayout::XrcIeth
            | HeaderLayout::XrcReth
            | HeaderLayout::XrcRethImm
            | HeaderLayout::XrcAtomic => {
                let srqn = small::parse_xrceth(b)?;
                let inner = Headers::parse(layout.without_xrceth(), &b[small::XRCETH_LEN..])?;
                // `without_xrceth` of an XRC layout is one `with_xrceth` takes.
                inner.with_xrceth(srqn).unwrap_or(Headers::Xrc(srqn))
            }
        })
    }

    /// Rejects values the wire fields cannot hold, which `emit` would
    /// otherwise truncate silently (and the peer would parse as something else).
    fn check_fields(&self) -> Result<()> {
        if let Some(n) = self.xrc_srqn() {
            if n > small::XRC_SRQN_MASK {
                return Err(Error::BadField {
                    header: "XRCETH",
                    field: "XRCSRQ",
                    value: u64::from(n),
                });
            }
        }
        if let Some(d) = self.deth() {
            if d.src_qp > bth::QPN_MASK {
                return Err(Error::BadField {
                    header: "DETH",
                    field: "SrcQP",
                    value: u64::from(d.src_qp),
                });
            }
        }
        if let Some(a) = self.aeth() {
            let code = match a.syndrome {
                Syndrome::Ack { credits } => credits,
                Syndrome::RnrNak { timer } => timer,
                Syndrome::Nak(_) => 0,
            };
            if code > 0x1F {
                return Err(Error::BadField {
                    header: "AETH",
                    field: "syndrome",
                    value: u64::from(code),
                });
            }
        }
        Ok(())
    }

    /// Writes the headers into `b`, which must be exactly `self.len()` long.
    fn emit(&self, b: &mut [u8]) {
        match *self {
            Headers::None => {}
            Headers::Imm(i) => small::emit_immdt(b, i),
            Headers::Ieth(k) => small::emit_ieth(b, k),
            Headers::Reth(r) => r.emit(&mut reth::Packet::new_unchecked(b)),
            Headers::RethImm(r, i) => {
                r.emit(&mut reth::Packet::new_unchecked(&mut b[..reth::HEADER_LEN]));
                small::emit_immdt(&mut b[reth::HEADER_LEN..], i);
            }
            Headers::Aeth(a) => a.emit(&mut aeth::Packet::new_unchecked(b)),
            Headers::AtomicAck(a, orig) => {
                a.emit(&mut aeth::Packet::new_unchecked(&mut b[..aeth::HEADER_LEN]));
                small::emit_atomic_ack_eth(&mut b[aeth::HEADER_LEN..], orig);
            }
            Headers::Atomic(a) => a.emit(&mut atomic_eth::Packet::new_unchecked(b)),
            Headers::Deth(d) => d.emit(b),
            Headers::DethImm(d, i) => {
                d.emit(&mut b[..small::DETH_LEN]);
                small::emit_immdt(&mut b[small::DETH_LEN..], i);
            }
            Headers::Cnp => b.fill(0),
            Headers::Xrc(n)
            | Headers::XrcImm(n, _)
            | Headers::XrcIeth(n, _)
            | Headers::XrcReth(n, _)
            | Headers::XrcRethImm(n, ..)
            | Headers::XrcAtomic(n, _) => {
                small::emit_xrceth(b, n);
                self.without_xrceth().emit(&mut b[small::XRCETH_LEN..]);
            }
        }
    }
}

/// One RoCEv2 packet, parsed or to be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// The base transport header.
    pub bth: BthRepr,
    /// The extension headers; their layout must match `bth.opcode`.
    pub headers: Headers,
    /// The payload without pad bytes.
    pub payload: &'a [u8],
}

/// Pad bytes needed to bring `len` to a multiple of four.
pub const fn pad_for(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

/// Offset of the payload in a packet with these headers.
pub const fn payload_offset(headers: &Headers) -> usize {
    bth::HEADER_LEN + headers.len()
}

/// Whole UDP payload length (BTH to ICRC) for these headers and payload length.
pub const fn packet_len(headers: &Headers, payload_len: usize) -> usize {
    payload_offset(headers) + payload_len + pad_for(payload_len) + ICRC_LEN
}

impl<'a> PacketRepr<'a> {
    /// Parses a whole UDP payload (BTH through ICRC). Checks opcode, TVer,
    /// header lengths and pad count; does not check the ICRC.
    pub fn parse(udp_payload: &'a [u8]) -> Result<Self> {
        let bth = BthRepr::parse(&bth::Packet::new_checked(udp_payload)?)?;
        let info = bth.opcode.info();
        let hdr_end = bth::HEADER_LEN + info.layout.len();
        let need = hdr_end + ICRC_LEN;
        if udp_payload.len() < need {
            // Name the header that is cut short when it is the headers themselves.
            if udp_payload.len() < hdr_end {
                Headers::parse(info.layout, &udp_payload[bth::HEADER_LEN..])?;
            }
            return Err(Error::Truncated {
                header: "ICRC",
                need,
                have: udp_payload.len(),
            });
        }
        let headers = Headers::parse(info.layout, &udp_payload[bth::HEADER_LEN..hdr_end])?;
        let body = &udp_payload[hdr_end..udp_payload.len() - ICRC_LEN];
        let pad = usize::from(bth.pad_count);
        // An RC ACK may carry one selective-acknowledgement extension
        // (`sack`), and nothing else; no other payload-less opcode carries bytes.
        if bth.opcode == Opcode::RC_ACK && !body.is_empty() {
            if bth.pad_count != 0 {
                return Err(Error::PadExceedsPayload {
                    pad: bth.pad_count,
                    payload: 0,
                });
            }
            sack::SackRepr::parse(body)?;
            return Ok(PacketRepr {
                bth,
                headers,
                payload: body,
            });
        }
        if !info.has_payload && !body.is_empty() {
            return Err(Error::UnexpectedPayload {
                opcode: bth.opcode.value(),
                len: body.len(),
            });
        }
        // Also catches a non-zero pad on an opcode without payload (body is empty).
        if pad > body.len() {
            return Err(Error::PadExceedsPayload {
                pad: bth.pad_count,
                payload: body.len(),
            });
        }
        Ok(PacketRepr {
            bth,
            headers,
            payload: &body[..body.len() - pad],
        })
    }

    /// Bytes [`PacketRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        packet_len(&self.headers, self.payload.len())
    }

    /// Writes the packet, pad and ICRC into `buf`; returns the length written.
    /// Fails as [`emit_in_place`] does.
    pub fn emit(&self, buf: &mut [u8], ep: &Endpoints) -> Result<usize> {
        let off = payload_offset(&self.headers);
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(Error::BufferTooSmall {
                need,
                have: buf.len(),
            });
        }
        buf[off..off + self.payload.len()].copy_from_slice(self.payload);
        emit_in_place(&self.bth, &self.headers, buf, self.payload.len(), ep)
    }
}

/// Emits the headers, pad and ICRC around a payload that the caller already
/// wrote at `buf[payload_offset(headers)..][..payload_len]`, sparing a copy.
/// `bth.pad_count` is ignored and derived from `payload_len`. Returns the
/// packet length. Values too wide for their wire field (a 25-bit DestQP or
/// DETH.SrcQP, an AETH credit count or RNR timer above 31) are refused with
/// [`Error::BadField`] rather than silently truncated.
pub fn emit_in_place(
    bth: &BthRepr,
    headers: &Headers,
    buf: &mut [u8],
    payload_len: usize,
    ep: &Endpoints,
) -> Result<usize> {
    let need = emit_headers(bth, headers, buf, payload_len)?;
    icrc::seal(ep, &mut buf[..need])?;
    Ok(need)
}

/// The checks and header writing of [`emit_in_place`] and [`emit_around`],
/// without the ICRC; returns the packet length.
fn emit_headers(
    bth: &BthRepr,
    headers: &Headers,
    buf: &mut [u8],
    payload_len: usize,
) -> Result<usize> {
    let info = bth.opcode.info();
    if info.layout != headers.layout() {
        return Err(Error::HeadersDoNotMatchOpcode {
            opcode: bth.opcode.value(),
        });
    }
    // The one exception: an RC ACK's SACK extension (`sack`), which the
    // caller wrote where a payload would be.
    if !info.has_payload && payload_len != 0 && bth.opcode != Opcode::RC_ACK {
        return Err(Error::UnexpectedPayload {
            opcode: bth.opcode.value(),
            len: payload_len,
        });
    }
    if bth.dest_qp > bth::QPN_MASK {
        return Err(Error::BadField {
            header: "BTH",
            field: "DestQP",
            value: u64::from(bth.dest_qp),
        });
    }
    headers.check_fields()?;
    let need = packet_len(headers, payload_len);
    if buf.len() < need {
        return Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        });
    }
    let pad = pad_for(payload_len);
    let mut b = *bth;
    b.pad_count = pad as u8;
    b.emit(&mut bth::Packet::new_unchecked(&mut buf[..bth::HEADER_LEN]));
    let off = payload_offset(headers);
    headers.emit(&mut buf[bth::HEADER_LEN..off]);
    let end = off + payload_len;
    buf[end..end + pad].fill(0);
    Ok(need)
}

/// Like [`emit_in_place`] for a payload that is not in `buf`: writes the
/// headers, the pad and the ICRC around a hole of `payload_len` bytes at
/// `payload_offset(headers)` (left as it is), and takes the payload's share
/// of the ICRC from `payload_crc` (see [`icrc::compute_around`]). Filling
/// the hole with the payload gives exactly the packet `emit_in_place`
/// would have built. Returns the packet length.
pub fn emit_around(
    bth: &BthRepr,
    headers: &Headers,
    buf: &mut [u8],
    payload_len: usize,
    ep: &Endpoints,
    payload_crc: impl FnOnce(u32, &[u8]) -> u32,
) -> Result<usize> {
    let need = emit_headers(bth, headers, buf, payload_len)?;
    let off = payload_offset(headers);
    let body = need - icrc::ICRC_LEN;
    let crc = icrc::compute_around(ep, &buf[..body], off..off + payload_len, payload_crc)?;
    buf[body..need].copy_from_slice(&crc.to_le_bytes());
    Ok(need)
}
