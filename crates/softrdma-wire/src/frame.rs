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

/// Builds an IPv4/IPv6 + UDP packet around `udp_payload` (no link header).
pub fn build_ip(
    src: SocketAddr,
    dst: SocketAddr,
    udp_payload: &[u8],
    opts: &FrameOptions,
) -> Result<Vec<u8>> {
    let udp_len = UDP_LEN + udp_payload.len();
    if udp_len > usize::from(u16::MAX) {
        return Err(Error::BadLength {
            header: "UDP",
            field: "length",
            value: udp_len,
            have: usize::from(u16::MAX),
        });
    }
    let mut out;
    let ip_len;
    let mut udp_sum;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip_len = 20;
            let total = ip_len + udp_len;
            if total > usize::from(u16::MAX) {
                return Err(Error::BadLength {
                    header: "IPv4",
                    field: "total length",
                    value: total,
                    have: usize::from(u16::MAX),
                });
            }
            out = vec![0u8; total];
            out[0] = 0x45;
            out[1] = opts.tos;
            put16(&mut out[2..4], total as u16);
            out[6] = 0x40; // DF, ID 0
            out[8] = opts.ttl;
            out[9] = 17;
            out[12..16].copy_from_slice(&s.octets());
            out[16..20].copy_from_slice(&d.octets());
            let c = checksum_fold(checksum_add(0, &out[..20]));
            put16(&mut out[10..12], c);
            // RoCE senders leave the IPv4 UDP checksum at zero.
            udp_sum = None;
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip_len = 40;
            out = vec![0u8; ip_len + udp_len];
            out[0] = 0x60 | (opts.tos >> 4);
            out[1] = opts.tos << 4;
            put16(&mut out[4..6], udp_len as u16);
            out[6] = 17;
            out[7] = opts.ttl;
            out[8..24].copy_from_slice(&s.octets());
            out[24..40].copy_from_slice(&d.octets());
            let mut sum = checksum_add(0, &out[8..40]);
            sum += udp_len as u32 + 17;
            udp_sum = Some(sum);
        }
        _ => {
            return Err(Error::NotRoce(
                "source and destination address families differ",
            ))
        }
    }
    {
        let u = &mut out[ip_len..];
        put16(&mut u[0..2], src.port());
        put16(&mut u[2..4], dst.port());
        put16(&mut u[4..6], udp_len as u16);
        u[UDP_LEN..].copy_from_slice(udp_payload);
    }
    if let Some(sum) = udp_sum.take() {
        let c = checksum_fold(checksum_add(sum, &out[ip_len..]));
        put16(
            &mut out[ip_len + 6..ip_len + 8],
            if c == 0 { 0xFFFF } else { c },
        );
    }
    Ok(out)
}

/// Builds a whole Ethernet frame around `udp_payload`.
pub fn build_frame(
    src: SocketAddr,
    dst: SocketAddr,
    udp_payload: &[u8],
    opts: &FrameOptions,
) -> Result<Vec<u8>> {
    let ip = build_ip(src, dst, udp_payload, opts)?;
    let mut f = Vec::with_capacity(ETHERNET_LEN + ip.len());
    f.extend_from_slice(&opts.dst_mac);
    f.extend_from_slice(&opts.src_mac);
    let et = if src.is_ipv4() {
        ETHERTYPE_IPV4
    } else {
        ETHERTYPE_IPV6
    };
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(&ip);
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
