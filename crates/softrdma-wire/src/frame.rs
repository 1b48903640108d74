//! Ethernet, IPv4, IPv6 and UDP around a RoCEv2 payload.
//!
//! The transport never sees these headers (the kernel's UDP socket writes
//! them), but captures do: the pcap writer builds whole frames with
//! [`build_frame`], and decoders find the RoCEv2 payload in a captured frame
//! with [`parse_ip`]. Frames are built the way a RoCE sender emits them: IPv4
//! with DF set and ID 0, so the ICRC computed by [`crate::icrc::compute`]
//! matches the one recomputed from the frame.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::util::{be16, check, put16};
use crate::{Error, Result};

/// The IANA UDP port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
/// Ethernet header length.
pub const ETHERNET_LEN: usize = 14;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// UDP header length.
pub const UDP_LEN: usize = 8;

/// Options for frames built for captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameOptions {
    /// Ethernet source MAC.
    pub src_mac: [u8; 6],
    /// Ethernet destination MAC.
    pub dst_mac: [u8; 6],
    /// IPv4 TTL / IPv6 hop limit (masked out of the ICRC).
    pub ttl: u8,
    /// DSCP and ECN bits.
    pub tos: u8,
}

impl Default for FrameOptions {
    fn default() -> Self {
        FrameOptions {
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            ttl: 64,
            tos: 0,
        }
    }
}

/// A MAC address derived from an IP address, so captures show stable,
/// locally administered MACs per endpoint.
pub fn mac_for(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

fn checksum_add(mut sum: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn checksum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Length of the Ethernet, IP and UDP headers in front of a RoCEv2 payload
/// (IPv4 without options, or IPv6 without extension headers).
pub const fn frame_header_len(ipv6: bool) -> usize {
    ETHERNET_LEN + if ipv6 { 40 } else { 20 } + UDP_LEN
}

/// Writes the Ethernet, IP and UDP headers of a frame in place, in front of
/// the `payload_len` bytes already at `frame[frame_header_len(..)..]`:
/// IPv4 with DF set and ID 0 and its header checksum, the UDP checksum for
/// IPv6 (where it is mandatory; RoCE senders leave IPv4's at zero). Returns
/// the frame's length. Nothing is allocated: a sender builds its frame in
/// the buffer it sends from.
pub fn emit_frame(
    frame: &mut [u8],
    src: SocketAddr,
    dst: SocketAddr,
    payload_len: usize,
    opts: &FrameOptions,
) -> Result<usize> {
    let v6 = match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => false,
        (IpAddr::V6(_), IpAddr::V6(_)) => true,
        _ => {
            return Err(Error::NotRoce(
                "source and destination address families differ",
            ))
        }
    };
    let hdr = frame_header_len(v6);
    let udp_len = UDP_LEN + payload_len;
    let ip_len = if v6 { 40 } else { 20 };
    if udp_len > usize::from(u16::MAX) {
        return Err(Error::BadLength {
            header: "UDP",
            field: "length",
            value: udp_len,
            have: usize::from(u16::MAX),
        });
    }
    if !v6 && ip_len + udp_len > usize::from(u16::MAX) {
        return Err(Error::BadLength {
            header: "IPv4",
            field: "total length",
            value: ip_len + udp_len,
            have: usize::from(u16::MAX),
        });
    }
    check("frame", frame, hdr + payload_len)?;
    frame[0..6].copy_from_slice(&opts.dst_mac);
    frame[6..12].copy_from_slice(&opts.src_mac);
    let et = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
    put16(&mut frame[12..14], et);
    let (ip, rest) = frame[ETHERNET_LEN..hdr + payload_len].split_at_mut(ip_len);
    let mut udp_sum = None;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip[0] = 0x45;
            ip[1] = opts.tos;
            put16(&mut ip[2..4], (ip_len + udp_len) as u16);
            ip[4..6].fill(0); // ID 0
            ip[6] = 0x40; // DF
            ip[7] = 0;
            ip[8] = opts.ttl;
            ip[9] = 17;
            ip[10..12].fill(0);
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = checksum_fold(checksum_add(0, ip));
            put16(&mut ip[10..12], c);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip[0] = 0x60 | (opts.tos >> 4);
            ip[1] = opts.tos << 4;
            ip[2..4].fill(0);
            put16(&mut ip[4..6], udp_len as u16);
            ip[6] = 17;
            ip[7] = opts.ttl;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            udp_sum = Some(checksum_add(0, &ip[8..40]) + udp_len as u32 + 17);
        }
        _ => unreachable!("families checked above"),
    }
    put16(&mut rest[0..2], src.port());
    put16(&mut rest[2..4], dst.port());
    put16(&mut rest[4..6], udp_len as u16);
    rest[6..8].fill(0);
    if let Some(sum) = udp_sum {
        let c = checksum_fold(checksum_add(sum, rest));
        put16(&mut rest[6..8], if c == 0 { 0xFFFF } else { c });
    }
    Ok(hdr + payload_len)
}

/// Whether the checksums of an IP packet ([`IpUdp::ip_packet`]) hold: the
/// IPv4 header's, and the UDP checksum where one is present (always for
/// IPv6; zero means none for IPv4), complete or left to offload (the
/// pseudo-header's sum alone: what veth and generic XDP deliver from a
/// local sender; the ICRC covers the payload either way). For receivers
/// that see raw frames, which no kernel has checked.
pub fn checksums_valid(ip_packet: &[u8]) -> bool {
    let Ok(p) = parse_ip(ip_packet) else {
        return false;
    };
    let (hdr_len, pseudo) = match ip_packet[0] >> 4 {
        4 => {
            let ihl = usize::from(ip_packet[0] & 0xF) * 4;
            if checksum_fold(checksum_add(0, &ip_packet[..ihl])) != 0 {
                return false;
            }
            (ihl, checksum_add(0, &ip_packet[12..20]))
        }
        _ => (40, checksum_add(0, &ip_packet[8..40])),
    };
    let udp = &ip_packet[hdr_len..hdr_len + UDP_LEN + p.udp_payload.len()];
    let stored = be16(&udp[6..8]);
    if stored == 0 {
        return ip_packet[0] >> 4 == 4;
    }
    let sum = pseudo + udp.len() as u32 + 17;
    // A sender that left the checksum to offload (veth and generic XDP hand
    // such frames over unfinished) stored only the pseudo-header's sum.
    checksum_fold(checksum_add(sum, udp)) == 0 || stored == !checksum_fold(sum)
}

/// Builds an IPv4/IPv6 + UDP packet around `udp_payload` (no link header).
pub fn build_ip(
    src: SocketAddr,
    dst: SocketAddr,
    udp_payload: &[u8],
    opts: &FrameOptions,
) -> Result<Vec<u8>> {
    let mut f = build_frame(src, dst, udp_payload, opts)?;
    f.drain(..ETHERNET_LEN);
    Ok(f)
}

/// Builds a whole Ethernet frame around `udp_payload`.
pub fn build_frame(
    src: SocketAddr,
    dst: SocketAddr,
    udp_payload: &[u8],
    opts: &FrameOptions,
) -> Result<Vec<u8>> {
    let hdr = frame_header_len(src.is_ipv6());
    let mut f = vec![0u8; hdr + udp_payload.len()];
    f[hdr..].copy_from_slice(udp_payload);
    let n = emit_frame(&mut f, src, dst, udp_payload.len(), opts)?;
    f.truncate(n);
    Ok(f)
}

/// A UDP datagram found in an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpUdp<'a> {
    /// Source address and UDP port.
    pub src: SocketAddr,
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// The IP packet from its first header byte to its total length (link
    /// padding removed), as the ICRC covers it.
    pub ip_packet: &'a [u8],
    /// The UDP payload.
    pub udp_payload: &'a [u8],
}

/// Finds the UDP datagram in an IPv4/IPv6 packet. Fails with `NotRoce` for
/// non-UDP packets and with length errors for cut-short ones.
pub fn parse_ip(ip: &[u8]) -> Result<IpUdp<'_>> {
    check("IP", ip, 1)?;
    let (hdr_len, total, src, dst) = match ip[0] >> 4 {
        4 => {
            check("IPv4", ip, 20)?;
            let ihl = usize::from(ip[0] & 0xF) * 4;
            if ihl < 20 {
                return Err(Error::BadField {
                    header: "IPv4",
                    field: "IHL",
                    value: (ip[0] & 0xF).into(),
                });
            }
            if ip[9] != 17 {
                return Err(Error::NotRoce("IPv4 protocol is not UDP"));
            }
            if be16(&ip[6..8]) & 0x3FFF != 0 {
                return Err(Error::NotRoce("IPv4 fragment"));
            }
            let s = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let d = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (
                ihl,
                usize::from(be16(&ip[2..4])),
                IpAddr::V4(s),
                IpAddr::V4(d),
            )
        }
        6 => {
            check("IPv6", ip, 40)?;
            if ip[6] != 17 {
                return Err(Error::NotRoce("IPv6 next header is not UDP"));
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            (
                40,
                40 + usize::from(be16(&ip[4..6])),
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
            )
        }
        v => {
            return Err(Error::BadField {
                header: "IP",
                field: "version",
                value: v.into(),
            })
        }
    };
    if total > ip.len() || total < hdr_len + UDP_LEN {
        return Err(Error::BadLength {
            header: "IP",
            field: "total length",
            value: total,
            have: ip.len(),
        });
    }
    let pkt = &ip[..total];
    let u = &pkt[hdr_len..];
    let udp_len = usize::from(be16(&u[4..6]));
    if udp_len < UDP_LEN || udp_len > u.len() {
        return Err(Error::BadLength {
            header: "UDP",
            field: "length",
            value: udp_len,
            have: u.len(),
        });
    }
    Ok(IpUdp {
        src: SocketAddr::new(src, be16(&u[0..2])),
        dst: SocketAddr::new(dst, be16(&u[2..4])),
        ip_packet: pkt,
        udp_payload: &u[UDP_LEN..udp_len],
    })
}

/// Finds the IP packet in an Ethernet frame, skipping 802.1Q/802.1ad tags.
pub fn ip_of_ethernet(frame: &[u8]) -> Result<&[u8]> {
    check("Ethernet", frame, ETHERNET_LEN)?;
    let mut et = be16(&frame[12..14]);
    let mut off = ETHERNET_LEN;
    while et == 0x8100 || et == 0x88A8 {
        check("802.1Q tag", frame, off + 4)?;
        et = be16(&frame[off + 2..off + 4]);
        off += 4;
    }
    match et {
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => Ok(&frame[off..]),
        _ => Err(Error::NotRoce("EtherType is neither IPv4 nor IPv6")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame built in place parses back to its endpoints and payload,
    /// its checksums hold, and a flipped bit anywhere the checksums cover
    /// is caught.
    #[test]
    fn frames_built_in_place_parse_back_with_valid_checksums() {
        for (s, d) in [
            ("10.0.0.1:49152", "10.0.0.2:4791"),
            ("[fd00::1]:49152", "[fd00::2]:4791"),
        ] {
            let (s, d): (SocketAddr, SocketAddr) = (s.parse().unwrap(), d.parse().unwrap());
            let payload: Vec<u8> = (0..301u32).map(|i| (i * 7) as u8).collect();
            let hdr = frame_header_len(s.is_ipv6());
            let mut f = vec![0u8; hdr + payload.len() + 5];
            f[hdr..hdr + payload.len()].copy_from_slice(&payload);
            let opts = FrameOptions::default();
            let n = emit_frame(&mut f, s, d, payload.len(), &opts).unwrap();
            assert_eq!(n, hdr + payload.len());
            assert_eq!(f[..n], build_frame(s, d, &payload, &opts).unwrap()[..]);
            let ip = ip_of_ethernet(&f[..n]).unwrap();
            let p = parse_ip(ip).unwrap();
            assert_eq!((p.src, p.dst, p.udp_payload), (s, d, &payload[..]));
            assert!(checksums_valid(p.ip_packet));
            if s.is_ipv6() {
                // Left to offload: the pseudo-header's sum alone.
                let mut g = ip.to_vec();
                let mut sum = checksum_add(0, &g[8..40]) + (UDP_LEN + payload.len()) as u32 + 17;
                sum = (sum & 0xFFFF) + (sum >> 16);
                put16(&mut g[46..48], !checksum_fold(sum));
                assert!(checksums_valid(&g), "a partial checksum passes");
            }
            // Every bit of the IPv6 packet is covered (the UDP checksum and
            // its pseudo-header); for IPv4, the header (the UDP checksum is 0).
            let covered = if s.is_ipv6() { ip.len() } else { 20 };
            for byte in 0..covered {
                if (s.is_ipv6() && byte < 8 && byte != 4 && byte != 5 && byte != 6)
                    || (!s.is_ipv6() && byte == 1)
                {
                    continue; // version/class/flow label and TOS: not checksummed
                }
                let mut g = ip.to_vec();
                g[byte] ^= 0x10;
                assert!(
                    parse_ip(&g).is_err() || !checksums_valid(&g),
                    "{s}: flipped byte {byte} passed"
                );
            }
        }
        let e = emit_frame(
            &mut [0u8; 64],
            "10.0.0.1:1".parse().unwrap(),
            "[::1]:1".parse().unwrap(),
            0,
            &FrameOptions::default(),
        );
        assert!(e.is_err());
        assert!(emit_frame(
            &mut [0u8; 40],
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:1".parse().unwrap(),
            10,
            &FrameOptions::default(),
        )
        .is_err());
    }
}
