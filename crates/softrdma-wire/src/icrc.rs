//! The RoCEv2 invariant CRC.
//!
//! CRC-32 (the Ethernet/zlib polynomial, reflected, final inversion) over
//! eight 0xFF bytes, the IP header with its variant fields set to ones, the
//! UDP header with its checksum set to ones, the BTH with byte 4 set to ones,
//! and everything after the BTH up to the ICRC. Stored least significant byte
//! first. Two entry points: one that synthesises the IP/UDP headers a RoCE
//! sender emits (DF set, IP ID 0), used by the transport, and one over a real
//! captured IP packet, used by capture checkers.

use std::net::{IpAddr, SocketAddr};

use crate::util::{be16, be32, check};
use crate::{bth, Error, Result};

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// The two UDP endpoints of a packet, from which the IP and UDP headers that
/// the ICRC covers are rebuilt. Both must be of the same address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    /// The sender's address and UDP source port.
    pub src: SocketAddr,
    /// The receiver's address and UDP destination port (normally 4791).
    pub dst: SocketAddr,
}

impl Endpoints {
    /// Endpoints of a packet sent from `src` to `dst`.
    pub const fn new(src: SocketAddr, dst: SocketAddr) -> Self {
        Endpoints { src, dst }
    }
    /// The same path seen from the other end.
    pub const fn reversed(self) -> Self {
        Endpoints {
            src: self.dst,
            dst: self.src,
        }
    }
}

/// CRC-32 of the eight 0xFF bytes that stand in for the masked link header
/// (the raw register state 0xDEBB20E3, inverted). Starting the hasher from
/// it spares one tiny `update` per packet.
const CRC_OF_LEADING_ONES: u32 = 0x2144_DF1C;

/// Computes the ICRC of `udp_payload` (BTH up to, not including, the ICRC)
/// as sent between `ep` with the IP header a RoCE sender emits: IPv4 with
/// DF set and ID 0, or IPv6.
pub fn compute(ep: &Endpoints, udp_payload: &[u8]) -> Result<u32> {
    compute_with_ipv4_id(ep, udp_payload, 0)
}

/// Like [`compute`], for an IPv4 header carrying identification `ip_id`
/// (ignored for IPv6). Linux Soft-RoCE (rxe) sends DF packets with a
/// non-zero, changing ID, which the ICRC covers.
pub fn compute_with_ipv4_id(ep: &Endpoints, udp_payload: &[u8], ip_id: u16) -> Result<u32> {
    check("BTH", udp_payload, bth::HEADER_LEN)?;
    let mut hdr = [0u8; PSEUDO_MAX];
    let n = pseudo_header(
        ep,
        udp_payload.len(),
        &udp_payload[..bth::HEADER_LEN],
        ip_id,
        &mut hdr,
    )?;
    let rest = &udp_payload[bth::HEADER_LEN..];
    // One CRC over the pseudo-header and the rest, reduced to 32 bits once
    // (two `crc32fast` updates would reduce after the 40-60 header bytes too).
    Ok(crate::crc32::checksum(CRC_OF_LEADING_ONES, &hdr[..n], rest))
}

/// The ICRC of a packet whose payload is not in `pkt`: `pkt` is the UDP
/// payload without the ICRC (BTH, headers, payload, pad), of which the
/// bytes in `hole` are not read; the payload's share comes from
/// `payload_crc(crc, head)`, which must return the CRC-32 continuing from
/// `crc` over `head` and then the payload that belongs in the hole (as
/// [`crc32`] and [`crc32_raw`] compute it). The result equals
/// [`compute`] over the packet with its payload in place.
///
/// This lets a sender checksum payload that stays in registered memory and
/// goes to the socket by reference (the UDP driver's zero-copy sends).
pub fn compute_around(
    ep: &Endpoints,
    pkt: &[u8],
    hole: std::ops::Range<usize>,
    payload_crc: impl FnOnce(u32, &[u8]) -> u32,
) -> Result<u32> {
    check("BTH", pkt, bth::HEADER_LEN)?;
    if hole.start < bth::HEADER_LEN || hole.start > hole.end || hole.end > pkt.len() {
        return Err(Error::BadLength {
            header: "packet",
            field: "payload hole",
            value: hole.end,
            have: pkt.len(),
        });
    }
    let mut hdr = [0u8; PSEUDO_MAX];
    let n = pseudo_header(ep, pkt.len(), &pkt[..bth::HEADER_LEN], 0, &mut hdr)?;
    // The pseudo-header and the headers between the BTH and the payload,
    // as one head (at most 60 + 28 bytes: IPv6 and an AtomicETH).
    let ext = &pkt[bth::HEADER_LEN..hole.start];
    let mut head = [0u8; PSEUDO_MAX + 64];
    let Some(h) = head.get_mut(n..n + ext.len()) else {
        return Err(Error::BadLength {
            header: "packet",
            field: "headers before the payload",
            value: ext.len(),
            have: 64,
        });
    };
    h.copy_from_slice(ext);
    head[..n].copy_from_slice(&hdr[..n]);
    let crc = payload_crc(CRC_OF_LEADING_ONES, &head[..n + ext.len()]);
    let tail = &pkt[hole.end..];
    if tail.is_empty() {
        return Ok(crc);
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(tail);
    Ok(h.finalize())
}

/// The CRC-32 (Ethernet/zlib polynomial, as `crc32fast` continues it)
/// continuing from `crc` over `head` and then `body`, with the single-pass
/// fold the ICRC uses.
pub fn crc32(crc: u32, head: &[u8], body: &[u8]) -> u32 {
    crate::crc32::checksum(crc, head, body)
}

/// [`crc32`] over a body given by address, read with raw-pointer loads
/// only: for registered memory, which peers and the application may write
/// at any time and so must never be borrowed as a slice.
///
/// # Safety
/// `body` must be valid for reads of `len` bytes for the duration of the call.
#[allow(unsafe_code)]
pub unsafe fn crc32_raw(crc: u32, head: &[u8], body: *const u8, len: usize) -> u32 {
    // SAFETY: passed on from the caller.
    unsafe { crate::crc32::checksum_raw(crc, head, body, len) }
}

/// Longest [`pseudo_header`].
const PSEUDO_MAX: usize = 40 + 8 + bth::HEADER_LEN;

/// What the ICRC covers up to the end of the BTH, after the eight leading
/// ones (which the hasher's seed stands for): the IP and UDP headers with
/// their variant fields masked, and the BTH with byte 4 masked, for a
/// packet whose UDP payload (BTH up to, not including, the ICRC) is `len`
/// bytes. Written into `hdr`; returns how many bytes of it are used.
///
/// Built as 32-bit big-endian words (each field in its place, masked bits
/// set): a handful of word stores, which the CRC's wide loads read back
/// sooner than a scatter of byte and half-word stores.
#[inline(always)]
fn pseudo_header(
    ep: &Endpoints,
    len: usize,
    bth_bytes: &[u8],
    ip_id: u16,
    hdr: &mut [u8; PSEUDO_MAX],
) -> Result<usize> {
    check("BTH", bth_bytes, bth::HEADER_LEN)?;
    let udp_len = len + ICRC_LEN + 8;
    // Each word straight into its place (no array of words copied over
    // afterwards: that copy's wide loads would wait on the word stores).
    let mut put = |i: usize, w: u32| {
        if let Some(b) = hdr.get_mut(4 * i..4 * i + 4) {
            b.copy_from_slice(&w.to_be_bytes());
        }
    };
    let ip_words = match (ep.src.ip(), ep.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = 20 + udp_len;
            if total > usize::from(u16::MAX) {
                return Err(Error::BadLength {
                    header: "IPv4",
                    field: "total length",
                    value: total,
                    have: usize::from(u16::MAX),
                });
            }
            // Version/IHL, TOS masked, total length; ID, flags DF; TTL
            // masked, protocol UDP, checksum masked; addresses.
            put(0, 0x45FF_0000 | total as u32);
            put(1, u32::from(ip_id) << 16 | 0x4000);
            put(2, 0xFF11_FFFF);
            put(3, u32::from(s));
            put(4, u32::from(d));
            5
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            if udp_len > usize::from(u16::MAX) {
                return Err(Error::BadLength {
                    header: "IPv6",
                    field: "payload length",
                    value: udp_len,
                    have: usize::from(u16::MAX),
                });
            }
            // Version, traffic class and flow label masked; payload
            // length, next header UDP, hop limit masked; addresses.
            put(0, 0x6FFF_FFFF);
            put(1, (udp_len as u32) << 16 | 0x11FF);
            let (s, d) = (u128::from(s), u128::from(d));
            for k in 0..4 {
                put(2 + k, (s >> (96 - 32 * k)) as u32);
                put(6 + k, (d >> (96 - 32 * k)) as u32);
            }
            10
        }
        _ => {
            return Err(Error::NotRoce(
                "source and destination address families differ",
            ))
        }
    };
    // UDP ports, length and checksum (masked); the BTH with byte 4 masked.
    put(
        ip_words,
        u32::from(ep.src.port()) << 16 | u32::from(ep.dst.port()),
    );
    put(ip_words + 1, (udp_len as u32) << 16 | 0xFFFF);
    put(ip_words + 2, be32(&bth_bytes[0..4]));
    put(
        ip_words + 3,
        0xFF00_0000 | be32(&bth_bytes[4..8]) & 0x00FF_FFFF,
    );
    put(ip_words + 4, be32(&bth_bytes[8..12]));
    Ok(4 * (ip_words + 5))
}

/// Reads the ICRC stored in the last four bytes of a UDP payload.
pub fn stored(udp_payload: &[u8]) -> Result<u32> {
    check("ICRC", udp_payload, bth::HEADER_LEN + ICRC_LEN)?;
    let n = udp_payload.len();
    Ok(u32::from_le_bytes([
        udp_payload[n - 4],
        udp_payload[n - 3],
        udp_payload[n - 2],
        udp_payload[n - 1],
    ]))
}

/// Writes the ICRC over `buf[..len - 4]` into `buf[len - 4..len]`.
pub fn seal(ep: &Endpoints, buf: &mut [u8]) -> Result<()> {
    check("ICRC", buf, bth::HEADER_LEN + ICRC_LEN)?;
    let n = buf.len();
    let crc = compute(ep, &buf[..n - ICRC_LEN])?;
    buf[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Checks the ICRC of a whole UDP payload (BTH through ICRC) received between `ep`.
pub fn verify(ep: &Endpoints, udp_payload: &[u8]) -> Result<()> {
    let got = stored(udp_payload)?;
    let want = compute(ep, &udp_payload[..udp_payload.len() - ICRC_LEN])?;
    if got == want {
        Ok(())
    } else {
        Err(Error::IcrcMismatch { got, want })
    }
}

/// Computes the ICRC of a real IP packet (IPv4 with any options, ID and
/// flags, or IPv6 without extension headers) carrying UDP and a RoCEv2
/// payload whose last four bytes are the ICRC. Returns `(stored, computed)`.
pub fn over_ip_packet(ip: &[u8]) -> Result<(u32, u32)> {
    check("IP", ip, 1)?;
    let (ip_hdr_len, ip_total) = match ip[0] >> 4 {
        4 => {
            check("IPv4", ip, 20)?;
            if ip[9] != 17 {
                return Err(Error::NotRoce("IPv4 protocol is not UDP"));
            }
            ((usize::from(ip[0] & 0xF)) * 4, usize::from(be16(&ip[2..4])))
        }
        6 => {
            check("IPv6", ip, 40)?;
            if ip[6] != 17 {
                return Err(Error::NotRoce("IPv6 next header is not UDP"));
            }
            (40, 40 + usize::from(be16(&ip[4..6])))
        }
        _ => return Err(Error::NotRoce("IP version is neither 4 nor 6")),
    };
    if ip_total > ip.len() {
        return Err(Error::BadLength {
            header: "IP",
            field: "total length",
            value: ip_total,
            have: ip.len(),
        });
    }
    if ip_hdr_len < 20 {
        return Err(Error::BadField {
            header: "IPv4",
            field: "IHL",
            value: (ip[0] & 0xF).into(),
        });
    }
    let min = ip_hdr_len + 8 + bth::HEADER_LEN + ICRC_LEN;
    if ip_total < min {
        return Err(Error::Truncated {
            header: "RoCEv2 packet",
            need: min,
            have: ip_total,
        });
    }
    let pkt = &ip[..ip_total];
    let mut masked = [0u8; 60 + 8 + bth::HEADER_LEN];
    let prefix = ip_hdr_len + 8 + bth::HEADER_LEN;
    masked[..prefix].copy_from_slice(&pkt[..prefix]);
    if ip_hdr_len == 40 && pkt[0] >> 4 == 6 {
        masked[0] |= 0x0F;
        masked[1] = 0xFF;
        masked[2] = 0xFF;
        masked[3] = 0xFF;
        masked[7] = 0xFF;
    } else {
        masked[1] = 0xFF;
        masked[8] = 0xFF;
        masked[10] = 0xFF;
        masked[11] = 0xFF;
    }
    masked[ip_hdr_len + 6] = 0xFF;
    masked[ip_hdr_len + 7] = 0xFF;
    masked[ip_hdr_len + 8 + 4] = 0xFF;
    let computed = crate::crc32::checksum(
        CRC_OF_LEADING_ONES,
        &masked[..prefix],
        &pkt[prefix..ip_total - ICRC_LEN],
    );
    let s = &pkt[ip_total - ICRC_LEN..];
    Ok((u32::from_le_bytes([s[0], s[1], s[2], s[3]]), computed))
}

/// Finds the IPv4 identification under which the ICRC of `udp_payload`
/// (BTH through ICRC, received between `ep`) is correct, when a UDP socket
/// could not see the real header.
///
/// The CRC is linear in the 16 ID bits: the difference between the stored
/// ICRC and the one computed with ID 0 must be a combination of the 16
/// per-bit differences, which a 32×16 system over GF(2) solves. A packet
/// whose ICRC matches with ID 0 keeps the full 32-bit check; one that needs
/// this recovery keeps 16 bits of it (a damaged packet passes with
/// probability 2^-16), which is why callers count such packets.
pub fn recover_ipv4_id(ep: &Endpoints, udp_payload: &[u8]) -> Option<u16> {
    if !ep.src.is_ipv4() || !ep.dst.is_ipv4() {
        return None;
    }
    let stored = stored(udp_payload).ok()?;
    let body = &udp_payload[..udp_payload.len() - ICRC_LEN];
    let c0 = compute(ep, body).ok()?;
    let diff = stored ^ c0;
    if diff == 0 {
        return Some(0);
    }
    // Bytes of CRC input after the ID field: the rest of the IPv4 header
    // (14), the UDP header (8) and the body.
    let after = 14 + 8 + body.len();
    let zeros = [0u8; 256];
    let mut tail = crc32fast::Hasher::new();
    let mut left = after;
    while left > 0 {
        let n = left.min(zeros.len());
        tail.update(&zeros[..n]);
        left -= n;
    }
    let crc_of = |id: u16| {
        let mut h = crc32fast::Hasher::new();
        h.update(&id.to_be_bytes());
        h.combine(&tail);
        h.finalize()
    };
    let base = crc_of(0);
    // Gaussian elimination: each row is (difference vector, ID bits making it).
    let mut rows: Vec<(u32, u16)> = Vec::with_capacity(16);
    for bit in 0..16 {
        let mut v = (crc_of(1 << bit) ^ base, 1u16 << bit);
        for r in &rows {
            if v.0 & (1 << r.0.trailing_zeros()) != 0 {
                v.0 ^= r.0;
                v.1 ^= r.1;
            }
        }
        if v.0 != 0 {
            // Keep the basis reduced on each row's pivot (lowest set bit).
            let p = 1 << v.0.trailing_zeros();
            for r in &mut rows {
                if r.0 & p != 0 {
                    r.0 ^= v.0;
                    r.1 ^= v.1;
                }
            }
            rows.push(v);
        }
    }
    let mut rest = diff;
    let mut id = 0u16;
    for r in &rows {
        if rest & (1 << r.0.trailing_zeros()) != 0 {
            rest ^= r.0;
            id ^= r.1;
        }
    }
    if rest != 0 {
        return None;
    }
    (compute_with_ipv4_id(ep, body, id).ok()? == stored).then_some(id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn seed_is_the_crc_of_eight_ff_bytes() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), super::CRC_OF_LEADING_ONES);
        assert_eq!(!super::CRC_OF_LEADING_ONES, 0xDEBB_20E3);
    }

    fn packet(len: usize) -> Vec<u8> {
        // A BTH (RC SEND ONLY to QP 0x12) and a payload, ICRC space at the end.
        let mut p = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x12, 0x80, 0, 0, 7];
        p.extend((0..len).map(|i| (i * 13 + 1) as u8));
        p.extend([0; 4]);
        p
    }

    #[test]
    fn compute_matches_crc32fast_over_the_pseudo_header_at_every_length() {
        let eps = [
            super::Endpoints::new(
                "10.0.0.2:49152".parse().unwrap(),
                "10.0.0.1:4791".parse().unwrap(),
            ),
            super::Endpoints::new(
                "[fe80::2]:49152".parse().unwrap(),
                "[fe80::1]:4791".parse().unwrap(),
            ),
        ];
        let lens = (0..600)
            .chain((600..9000).step_by(97))
            .chain([4096, 4112, 4124]);
        for len in lens {
            let p = packet(len);
            let body = &p[..p.len() - 4];
            for ep in &eps {
                for id in [0u16, 0x1234] {
                    let mut hdr = [0u8; super::PSEUDO_MAX];
                    let n =
                        super::pseudo_header(ep, body.len(), &body[..12], id, &mut hdr).unwrap();
                    let mut h = crc32fast::Hasher::new_with_initial(super::CRC_OF_LEADING_ONES);
                    h.update(&hdr[..n]);
                    h.update(&body[12..]);
                    let got = super::compute_with_ipv4_id(ep, body, id).unwrap();
                    assert_eq!(got, h.finalize(), "len {len} {ep:?} id {id}");
                }
            }
        }
    }

    #[test]
    fn recovers_the_ipv4_id_a_sender_used() {
        let ep = super::Endpoints::new(
            "10.0.0.2:49152".parse().unwrap(),
            "10.0.0.1:4791".parse().unwrap(),
        );
        for (len, id) in [
            (0usize, 1u16),
            (16, 0xF686),
            (1024, 0x8000),
            (4096, 0xFFFF),
            (33, 0x1234),
        ] {
            let mut p = packet(len);
            let n = p.len();
            let crc = super::compute_with_ipv4_id(&ep, &p[..n - 4], id).unwrap();
            p[n - 4..].copy_from_slice(&crc.to_le_bytes());
            assert!(super::verify(&ep, &p).is_err() || id == 0);
            assert_eq!(
                super::recover_ipv4_id(&ep, &p),
                Some(id),
                "len {len} id {id:#x}"
            );
        }
    }

    #[test]
    fn id_zero_keeps_the_full_check_and_damage_is_mostly_caught() {
        let ep = super::Endpoints::new(
            "10.0.0.2:49152".parse().unwrap(),
            "10.0.0.1:4791".parse().unwrap(),
        );
        let mut p = packet(200);
        super::seal(&ep, &mut p).unwrap();
        assert_eq!(super::recover_ipv4_id(&ep, &p), Some(0));
        let mut passed = 0;
        for bit in 0..(p.len() - 4) * 8 {
            if bit / 8 == 4 {
                continue; // BTH byte 4 (F, B, reserved) is masked: not covered
            }
            let mut q = p.clone();
            q[bit / 8] ^= 1 << (bit % 8);
            if super::recover_ipv4_id(&ep, &q).is_some() {
                passed += 1;
            }
        }
        // Single-bit errors: the ID-0 check catches them all, and the
        // recovery explains none of them away (each would need the error
        // pattern to fall in a 16-dimensional subspace: odds 2^-16).
        assert_eq!(passed, 0, "{passed} damaged packets passed");
    }
}
