//! Link-layer types of capture files and how to find the IP packet in a
//! frame of each.

use core::fmt;

use softrdma_wire::frame::{ip_of_ethernet, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// A capture's link-layer header type (the `LINKTYPE_*` registry of
/// tcpdump.org). Unknown values are carried through so that a reader can
/// report them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkType(pub u32);

impl LinkType {
    /// BSD loopback: a 4-byte address family in the writer's byte order.
    pub const NULL: LinkType = LinkType(0);
    /// Ethernet II (with optional 802.1Q / 802.1ad tags).
    pub const ETHERNET: LinkType = LinkType(1);
    /// Raw IPv4 or IPv6 as written by some BSDs (DLT_RAW = 12 there).
    pub const RAW_BSD: LinkType = LinkType(12);
    /// Raw IPv4 or IPv6 as written by OpenBSD (DLT_RAW = 14 there).
    pub const RAW_OPENBSD: LinkType = LinkType(14);
    /// Raw IPv4 or IPv6, no link header (`LINKTYPE_RAW`).
    pub const RAW: LinkType = LinkType(101);
    /// OpenBSD loopback: a 4-byte big-endian address family.
    pub const LOOP: LinkType = LinkType(108);
    /// Linux "cooked" capture v1 (`tcpdump -i any`): 16-byte header.
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// Raw IPv4 only.
    pub const IPV4: LinkType = LinkType(228);
    /// Raw IPv6 only.
    pub const IPV6: LinkType = LinkType(229);
    /// Linux "cooked" capture v2: 20-byte header.
    pub const LINUX_SLL2: LinkType = LinkType(276);

    /// The raw value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// A short name, or `None` for types softrdma does not know.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "NULL",
            1 => "ETHERNET",
            12 | 14 | 101 => "RAW",
            108 => "LOOP",
            113 => "LINUX_SLL",
            228 => "IPV4",
            229 => "IPV6",
            276 => "LINUX_SLL2",
            _ => return None,
        })
    }

    /// True when [`ip_of_frame`] can find IP packets in frames of this type.
    pub const fn is_supported(self) -> bool {
        self.name().is_some()
    }
}

impl fmt::Debug for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "LinkType::{n}({})", self.0),
            None => write!(f, "LinkType({})", self.0),
        }
    }
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0),
            None => write!(f, "link type {}", self.0),
        }
    }
}

/// Why no IP packet could be taken out of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// softrdma does not know how to read this link type.
    UnsupportedLinkType(LinkType),
    /// The frame ends inside its link-layer header.
    Truncated {
        header: &'static str,
        need: usize,
        have: usize,
    },
    /// The link layer carries something other than IPv4/IPv6 (an ARP frame,
    /// say). `protocol` is the EtherType, address family or version nibble.
    NotIp { header: &'static str, protocol: u32 },
    /// The Ethernet decoder of `softrdma-wire` refused the frame.
    Wire(softrdma_wire::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::UnsupportedLinkType(lt) => write!(f, "unsupported {lt}"),
            FrameError::Truncated { header, need, have } => {
                write!(
                    f,
                    "truncated {header} header: need {need} bytes, have {have}"
                )
            }
            FrameError::NotIp { header, protocol } => {
                write!(
                    f,
                    "{header} protocol {protocol:#06x} is neither IPv4 nor IPv6"
                )
            }
            FrameError::Wire(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FrameError {}

const SLL_LEN: usize = 16;
const SLL2_LEN: usize = 20;

fn check(header: &'static str, frame: &[u8], need: usize) -> Result<(), FrameError> {
    if frame.len() < need {
        Err(FrameError::Truncated {
            header,
            need,
            have: frame.len(),
        })
    } else {
        Ok(())
    }
}

fn ip_by_ethertype<'a>(
    header: &'static str,
    et: u16,
    rest: &'a [u8],
) -> Result<&'a [u8], FrameError> {
    match et {
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => Ok(rest),
        _ => Err(FrameError::NotIp {
            header,
            protocol: u32::from(et),
        }),
    }
}

fn ip_by_version<'a>(header: &'static str, ip: &'a [u8]) -> Result<&'a [u8], FrameError> {
    check(header, ip, 1)?;
    match ip[0] >> 4 {
        4 | 6 => Ok(ip),
        v => Err(FrameError::NotIp {
            header,
            protocol: u32::from(v),
        }),
    }
}

/// Returns the IP packet (from its first header byte to the end of the
/// captured frame; link padding and FCS may follow it, which the IP total
/// length lets [`softrdma_wire::frame::parse_ip`] cut off) carried by a frame
/// of link type `link`.
///
/// Ethernet frames may carry 802.1Q/802.1ad tags. Linux cooked captures
/// (SLL, SLL2) and BSD loopback give the protocol in their own headers; raw IP
/// frames are checked for an IPv4/IPv6 version nibble.
pub fn ip_of_frame(link: LinkType, frame: &[u8]) -> Result<&[u8], FrameError> {
    match link {
        LinkType::ETHERNET => ip_of_ethernet(frame).map_err(|e| match e {
            softrdma_wire::Error::NotRoce(_) if frame.len() >= 14 => FrameError::NotIp {
                header: "Ethernet",
                protocol: u32::from(last_ethertype(frame)),
            },
            e => FrameError::Wire(e),
        }),
        LinkType::RAW | LinkType::RAW_BSD | LinkType::RAW_OPENBSD => ip_by_version("raw IP", frame),
        LinkType::IPV4 => match ip_by_version("raw IPv4", frame)? {
            ip if ip[0] >> 4 == 4 => Ok(ip),
            ip => Err(FrameError::NotIp {
                header: "raw IPv4",
                protocol: u32::from(ip[0] >> 4),
            }),
        },
        LinkType::IPV6 => match ip_by_version("raw IPv6", frame)? {
            ip if ip[0] >> 4 == 6 => Ok(ip),
            ip => Err(FrameError::NotIp {
                header: "raw IPv6",
                protocol: u32::from(ip[0] >> 4),
            }),
        },
        LinkType::LINUX_SLL => {
            // packet type(2) ARPHRD(2) addr len(2) addr(8) protocol(2)
            check("Linux SLL", frame, SLL_LEN)?;
            let et = u16::from_be_bytes([frame[14], frame[15]]);
            ip_by_ethertype("Linux SLL", et, &frame[SLL_LEN..])
        }
        LinkType::LINUX_SLL2 => {
            // protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1)
            // addr len(1) addr(8)
            check("Linux SLL2", frame, SLL2_LEN)?;
            let et = u16::from_be_bytes([frame[0], frame[1]]);
            ip_by_ethertype("Linux SLL2", et, &frame[SLL2_LEN..])
        }
        LinkType::NULL | LinkType::LOOP => {
            // The address family is in the capturing host's byte order for
            // NULL (big-endian for LOOP); the IP version nibble settles it.
            check("loopback", frame, 4)?;
            let fam_le = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let fam_be = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
            // AF_INET is 2 everywhere; AF_INET6 is 10, 24, 28 or 30 by OS.
            let known = |f: u32| matches!(f, 2 | 10 | 24 | 28 | 30);
            if known(fam_le) || known(fam_be) {
                ip_by_version("loopback", &frame[4..])
            } else {
                Err(FrameError::NotIp {
                    header: "loopback",
                    protocol: fam_be,
                })
            }
        }
        other => Err(FrameError::UnsupportedLinkType(other)),
    }
}

fn last_ethertype(frame: &[u8]) -> u16 {
    let mut et = u16::from_be_bytes([frame[12], frame[13]]);
    let mut off = 14;
    while (et == 0x8100 || et == 0x88A8) && frame.len() >= off + 4 {
        et = u16::from_be_bytes([frame[off + 2], frame[off + 3]]);
        off += 4;
    }
    et
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: [u8; 4] = [0x45, 0, 0, 20];

    #[test]
    fn ethernet_with_vlan_tag() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        f.extend_from_slice(&IP);
        assert_eq!(ip_of_frame(LinkType::ETHERNET, &f).unwrap(), &IP);
    }

    #[test]
    fn ethernet_arp_is_not_ip() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x06]);
        let e = ip_of_frame(LinkType::ETHERNET, &f).unwrap_err();
        assert_eq!(
            e,
            FrameError::NotIp {
                header: "Ethernet",
                protocol: 0x0806
            }
        );
        assert_eq!(
            e.to_string(),
            "Ethernet protocol 0x0806 is neither IPv4 nor IPv6"
        );
    }

    #[test]
    fn cooked_headers() {
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x86, 0xDD]);
        sll.extend_from_slice(&[0x60, 0, 0, 0]);
        assert_eq!(
            ip_of_frame(LinkType::LINUX_SLL, &sll).unwrap(),
            &[0x60, 0, 0, 0]
        );
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend_from_slice(&[0u8; 18]);
        sll2.extend_from_slice(&IP);
        assert_eq!(ip_of_frame(LinkType::LINUX_SLL2, &sll2).unwrap(), &IP);
        assert_eq!(
            ip_of_frame(LinkType::LINUX_SLL2, &sll2[..10]).unwrap_err(),
            FrameError::Truncated {
                header: "Linux SLL2",
                need: 20,
                have: 10
            }
        );
    }

    #[test]
    fn raw_and_loopback() {
        assert_eq!(ip_of_frame(LinkType::RAW, &IP).unwrap(), &IP);
        assert_eq!(ip_of_frame(LinkType::RAW_BSD, &IP).unwrap(), &IP);
        assert!(ip_of_frame(LinkType::IPV6, &IP).is_err());
        assert!(ip_of_frame(LinkType::RAW, &[0x20]).is_err());
        assert!(ip_of_frame(LinkType::RAW, &[]).is_err());
        let mut lo = vec![2, 0, 0, 0];
        lo.extend_from_slice(&IP);
        assert_eq!(ip_of_frame(LinkType::NULL, &lo).unwrap(), &IP);
        assert_eq!(
            ip_of_frame(LinkType(147), &IP).unwrap_err(),
            FrameError::UnsupportedLinkType(LinkType(147))
        );
    }
}
