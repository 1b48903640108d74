//! A reader of classic pcap and pcapng files.
//!
//! Classic pcap: either byte order, microsecond or nanosecond magic.
//! pcapng: Section Header, Interface Description, Enhanced Packet, Simple
//! Packet and (obsolete) Packet blocks, any number of sections and
//! interfaces each with its own link type, timestamp resolution and offset,
//! either byte order per section; all other blocks are skipped.
//!
//! The reader streams: it holds one record in memory at a time, and never
//! allocates more than the bytes actually present, whatever a length field
//! claims. Malformed input yields an [`Error`] naming the structure and
//! byte offset at fault; nothing panics.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::linktype::{ip_of_frame, FrameError, LinkType};

/// Largest frame or block the reader accepts (far above any real snap
/// length; it only stops a corrupt length field from being believed).
pub const MAX_RECORD_LEN: u32 = 16 << 20;

const PCAPNG_SHB: u32 = 0x0A0D_0D0A;
const PCAPNG_BOM: u32 = 0x1A2B_3C4D;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_PB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;

/// The container format of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic libpcap format.
    Pcap {
        /// Fields are big-endian.
        big_endian: bool,
        /// Timestamps have nanosecond (rather than microsecond) resolution.
        nanos: bool,
    },
    /// pcapng; the byte order may change from section to section.
    Pcapng,
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// 1-based position among the frames of the file (Wireshark's frame number).
    pub number: u64,
    /// Link type of the interface the frame was captured on.
    pub link_type: LinkType,
    /// The pcapng interface index (0 for classic pcap).
    pub interface: u32,
    /// Capture time since the Unix epoch; `None` for pcapng Simple Packet
    /// Blocks, which have none.
    pub timestamp: Option<Duration>,
    /// Length of the frame on the wire (`data` may be shorter when the
    /// capture cut it to its snap length).
    pub orig_len: u32,
    /// The captured bytes, starting with the link-layer header.
    pub data: Vec<u8>,
}

impl Frame {
    /// The IP packet in this frame; see [`ip_of_frame`].
    pub fn ip(&self) -> core::result::Result<&[u8], FrameError> {
        ip_of_frame(self.link_type, &self.data)
    }
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    link_type: LinkType,
    snaplen: u32,
    /// Timestamp units per second (10^n or 2^n).
    units_per_sec: u64,
    /// Seconds added to every timestamp.
    offset_secs: i64,
}

#[derive(Debug)]
enum State {
    Pcap {
        big_endian: bool,
        nanos: bool,
        link_type: LinkType,
    },
    Pcapng {
        big_endian: bool,
        interfaces: Vec<Interface>,
    },
}

/// Reads frames from a pcap or pcapng stream; the format is detected from
/// the first bytes.
///
/// As an [`Iterator`] it yields `Result<Frame>` and stops after the first
/// error.
#[derive(Debug)]
pub struct CaptureReader<R: Read> {
    r: R,
    /// Bytes consumed so far.
    offset: u64,
    state: State,
    frames: u64,
    failed: bool,
}

impl CaptureReader<BufReader<File>> {
    /// Opens a capture file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::new(BufReader::with_capacity(256 << 10, File::open(path)?))
    }
}

impl<'a> CaptureReader<&'a [u8]> {
    /// Reads a capture held in memory.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Self> {
        Self::new(bytes)
    }
}

fn u16_at(b: &[u8], off: usize, big: bool) -> u16 {
    let a = [b[off], b[off + 1]];
    if big {
        u16::from_be_bytes(a)
    } else {
        u16::from_le_bytes(a)
    }
}

fn u32_at(b: &[u8], off: usize, big: bool) -> u32 {
    let a = [b[off], b[off + 1], b[off + 2], b[off + 3]];
    if big {
        u32::from_be_bytes(a)
    } else {
        u32::from_le_bytes(a)
    }
}

fn u64_at(b: &[u8], off: usize, big: bool) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    if big {
        u64::from_be_bytes(a)
    } else {
        u64::from_le_bytes(a)
    }
}

/// Converts a pcapng timestamp in `units_per_sec` units to a duration.
fn units_to_duration(ts: u64, units_per_sec: u64, offset_secs: i64) -> Duration {
    let secs = ts / units_per_sec;
    let frac = ts % units_per_sec;
    let nanos = (u128::from(frac) * 1_000_000_000 / u128::from(units_per_sec)) as u32;
    let base = Duration::new(secs, nanos);
    if offset_secs >= 0 {
        base.saturating_add(Duration::from_secs(offset_secs as u64))
    } else {
        base.saturating_sub(Duration::from_secs(offset_secs.unsigned_abs()))
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header (pcap) or first Section Header Block (pcapng).
    pub fn new(mut r: R) -> Result<Self> {
        let mut magic = [0u8; 4];
        let got = read_full(&mut r, &mut magic)?;
        if got < 4 {
            return Err(Error::Truncated {
                what: "file header",
                offset: 0,
                need: 4,
                have: got as u64,
            });
        }
        let mut rd = CaptureReader {
            r,
            offset: 4,
            state: State::Pcap {
                big_endian: false,
                nanos: false,
                link_type: LinkType::ETHERNET,
            },
            frames: 0,
            failed: false,
        };
        let le = u32::from_le_bytes(magic);
        match le {
            0xA1B2_C3D4 | 0xA1B2_3C4D | 0xD4C3_B2A1 | 0x4D3C_B2A1 => {
                let big_endian = matches!(le, 0xD4C3_B2A1 | 0x4D3C_B2A1);
                let nanos = matches!(le, 0xA1B2_3C4D | 0x4D3C_B2A1);
                let mut h = [0u8; 20];
                rd.read_exact_at("pcap file header", 0, &mut h, 4)?;
                let (major, minor) = (u16_at(&h, 0, big_endian), u16_at(&h, 2, big_endian));
                if major != 2 {
                    return Err(Error::invalid(
                        4,
                        format!("unsupported pcap version {major}.{minor} (expected 2.x)"),
                    ));
                }
                // Bits 16..31 of the link-type word hold FCS information.
                let link_type = LinkType(u32_at(&h, 16, big_endian) & 0xFFFF);
                rd.state = State::Pcap {
                    big_endian,
                    nanos,
                    link_type,
                };
            }
            0xA1B2_CD34 | 0x34CD_B2A1 => {
                return Err(Error::invalid(
                    0,
                    "modified (Kuznetsov) pcap format is not supported; convert it with editcap",
                ))
            }
            PCAPNG_SHB => {
                let mut len = [0u8; 4];
                rd.read_exact_at("pcapng section header block", 0, &mut len, 4)?;
                rd.read_shb(0, len)?;
            }
            _ => return Err(Error::NotACapture { magic }),
        }
        Ok(rd)
    }

    /// The container format (for pcapng, of the current section).
    pub fn format(&self) -> Format {
        match self.state {
            State::Pcap {
                big_endian, nanos, ..
            } => Format::Pcap { big_endian, nanos },
            State::Pcapng { .. } => Format::Pcapng,
        }
    }

    /// The file-wide link type of a classic pcap; for pcapng, the link type of
    /// the first interface described so far, if any.
    pub fn link_type(&self) -> Option<LinkType> {
        match &self.state {
            State::Pcap { link_type, .. } => Some(*link_type),
            State::Pcapng { interfaces, .. } => interfaces.first().map(|i| i.link_type),
        }
    }

    /// Bytes of the file consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads exactly `buf.len()` bytes of `what` (which starts at `start`
    /// and of which `already` bytes were read before).
    fn read_exact_at(
        &mut self,
        what: &'static str,
        start: u64,
        buf: &mut [u8],
        already: u64,
    ) -> Result<()> {
        let got = read_full(&mut self.r, buf)?;
        self.offset += got as u64;
        if got < buf.len() {
            return Err(Error::Truncated {
                what,
                offset: start,
                need: already + buf.len() as u64,
                have: already + got as u64,
            });
        }
        Ok(())
    }

    /// Reads `len` bytes into a fresh vector, allocating only what arrives.
    fn read_vec_at(
        &mut self,
        what: &'static str,
        start: u64,
        len: u32,
        already: u64,
    ) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        let got = (&mut self.r).take(u64::from(len)).read_to_end(&mut v)?;
        self.offset += got as u64;
        if got < len as usize {
            return Err(Error::Truncated {
                what,
                offset: start,
                need: already + u64::from(len),
                have: already + got as u64,
            });
        }
        Ok(v)
    }

    /// Reads the next frame; `Ok(None)` at a clean end of file.
    pub fn next_frame(&mut self) -> Result<Option<Frame>> {
        if self.failed {
            return Ok(None);
        }
        let r = match self.state {
            State::Pcap {
                big_endian,
                nanos,
                link_type,
            } => self.next_pcap(big_endian, nanos, link_type),
            State::Pcapng { .. } => self.next_pcapng(),
        };
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn next_pcap(&mut self, big: bool, nanos: bool, link_type: LinkType) -> Result<Option<Frame>> {
        let start = self.offset;
        let mut h = [0u8; 16];
        let got = read_full(&mut self.r, &mut h)?;
        self.offset += got as u64;
        if got == 0 {
            return Ok(None);
        }
        if got < 16 {
            return Err(Error::Truncated {
                what: "pcap record header",
                offset: start,
                need: 16,
                have: got as u64,
            });
        }
        let secs = u32_at(&h, 0, big);
        let frac = u32_at(&h, 4, big);
        let incl = u32_at(&h, 8, big);
        let orig = u32_at(&h, 12, big);
        if incl > MAX_RECORD_LEN {
            return Err(Error::invalid(
                start,
                format!(
                    "pcap record claims {incl} captured bytes (limit {MAX_RECORD_LEN}); \
                     the file is corrupt"
                ),
            ));
        }
        let data = self.read_vec_at("pcap record data", start, incl, 16)?;
        let frac_nanos = if nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1000
        };
        let ts = Duration::from_secs(u64::from(secs)) + Duration::from_nanos(frac_nanos);
        self.frames += 1;
        Ok(Some(Frame {
            number: self.frames,
            link_type,
            interface: 0,
            timestamp: Some(ts),
            orig_len: orig,
            data,
        }))
    }

    /// Reads the rest of a Section Header Block whose type and length
    /// (`len_raw`, in a byte order yet to be learnt) were read at `start`,
    /// and starts a new section.
    fn read_shb(&mut self, start: u64, len_raw: [u8; 4]) -> Result<()> {
        let mut h = [0u8; 4];
        self.read_exact_at("pcapng section header block", start, &mut h, 8)?;
        let big = match u32::from_le_bytes(h) {
            PCAPNG_BOM => false,
            0x4D3C_2B1A => true,
            bom => {
                return Err(Error::invalid(
                    start + 8,
                    format!("pcapng byte-order magic is {bom:#010x}, expected 0x1a2b3c4d"),
                ))
            }
        };
        let total = u32_at(&len_raw, 0, big);
        let body = self.read_block_rest(start, PCAPNG_SHB, total, big, 12)?;
        // body: BOM(4, already read) is not in it; it starts at version.
        if body.len() < 12 {
            return Err(Error::invalid(
                start,
                format!("pcapng section header block is {total} bytes, less than the 28 minimum"),
            ));
        }
        let major = u16_at(&body, 0, big);
        let minor = u16_at(&body, 2, big);
        if major != 1 {
            return Err(Error::invalid(
                start + 12,
                format!("unsupported pcapng version {major}.{minor} (expected 1.x)"),
            ));
        }
        self.state = State::Pcapng {
            big_endian: big,
            interfaces: Vec::new(),
        };
        Ok(())
    }

    /// Given a block of `total` bytes at `start` of which `read` were already
    /// consumed, checks the length, reads the rest of the body and the
    /// trailing length, and returns the remaining body bytes.
    fn read_block_rest(
        &mut self,
        start: u64,
        block_type: u32,
        total: u32,
        big: bool,
        read: u32,
    ) -> Result<Vec<u8>> {
        if total < read + 4 || total & 3 != 0 {
            return Err(Error::invalid(
                start + 4,
                format!(
                    "pcapng block of type {block_type:#x} has length {total}, \
                     which is not a multiple of 4 of at least {}",
                    read + 4
                ),
            ));
        }
        if total > MAX_RECORD_LEN {
            return Err(Error::invalid(
                start + 4,
                format!(
                    "pcapng block of type {block_type:#x} claims {total} bytes \
                     (limit {MAX_RECORD_LEN}); the file is corrupt"
                ),
            ));
        }
        let body = self
            .read_vec_at("pcapng block", start, total - read - 4, u64::from(read))
            .map_err(|e| match e {
                // Report the whole block as needed, not just its body.
                Error::Truncated {
                    what, offset, have, ..
                } => Error::Truncated {
                    what,
                    offset,
                    need: u64::from(total),
                    have,
                },
                e => e,
            })?;
        let mut trailer = [0u8; 4];
        self.read_exact_at("pcapng block", start, &mut trailer, u64::from(total - 4))?;
        let t2 = u32_at(&trailer, 0, big);
        if t2 != total {
            return Err(Error::invalid(
                start + u64::from(total) - 4,
                format!(
                    "pcapng block of type {block_type:#x} has leading length {total} \
                     but trailing length {t2}"
                ),
            ));
        }
        Ok(body)
    }

    fn next_pcapng(&mut self) -> Result<Option<Frame>> {
        loop {
            let start = self.offset;
            let mut h = [0u8; 8];
            let got = read_full(&mut self.r, &mut h)?;
            self.offset += got as u64;
            if got == 0 {
                return Ok(None);
            }
            if got < 8 {
                return Err(Error::Truncated {
                    what: "pcapng block header",
                    offset: start,
                    need: 8,
                    have: got as u64,
                });
            }
            let big = match self.state {
                State::Pcapng { big_endian, .. } => big_endian,
                State::Pcap { .. } => false,
            };
            let block_type = u32_at(&h, 0, big);
            if block_type == PCAPNG_SHB {
                // A new section, perhaps in the other byte order (the SHB
                // type reads the same both ways).
                self.read_shb(start, [h[4], h[5], h[6], h[7]])?;
                continue;
            }
            let total = u32_at(&h, 4, big);
            let body = self.read_block_rest(start, block_type, total, big, 8)?;
            let body_off = start + 8;
            match block_type {
                PCAPNG_IDB => self.add_interface(&body, body_off, big)?,
                PCAPNG_EPB | PCAPNG_PB => {
                    return self.packet_block(block_type, body, body_off, big).map(Some)
                }
                PCAPNG_SPB => return self.simple_packet_block(body, body_off, big).map(Some),
                _ => {} // name resolution, statistics, custom, ...: skipped
            }
        }
    }

    fn interfaces(&self) -> &[Interface] {
        match &self.state {
            State::Pcapng { interfaces, .. } => interfaces,
            State::Pcap { .. } => &[],
        }
    }

    fn add_interface(&mut self, body: &[u8], off: u64, big: bool) -> Result<()> {
        if body.len() < 8 {
            return Err(Error::invalid(
                off,
                format!(
                    "pcapng interface description block body is {} bytes, less than 8",
                    body.len()
                ),
            ));
        }
        let mut iface = Interface {
            link_type: LinkType(u32::from(u16_at(body, 0, big))),
            snaplen: u32_at(body, 4, big),
            units_per_sec: 1_000_000,
            offset_secs: 0,
        };
        for (code, value, voff) in options(&body[8..], off + 8, big, "interface description")? {
            match code {
                9 => {
                    let Some(&r) = value.first() else {
                        return Err(Error::invalid(voff, "empty if_tsresol option"));
                    };
                    let exp = u32::from(r & 0x7F);
                    let units = if r & 0x80 != 0 {
                        1u64.checked_shl(exp).filter(|_| exp < 64)
                    } else {
                        10u64.checked_pow(exp)
                    };
                    iface.units_per_sec = units.filter(|&u| u > 0).ok_or_else(|| {
                        Error::invalid(
                            voff,
                            format!("if_tsresol {r:#04x} is finer than softrdma can represent"),
                        )
                    })?;
                }
                14 => {
                    if value.len() < 8 {
                        return Err(Error::invalid(
                            voff,
                            format!("if_tsoffset option is {} bytes, expected 8", value.len()),
                        ));
                    }
                    iface.offset_secs = u64_at(value, 0, big) as i64;
                }
                _ => {}
            }
        }
        if let State::Pcapng { interfaces, .. } = &mut self.state {
            interfaces.push(iface);
        }
        Ok(())
    }

    fn interface(&self, id: u32, off: u64) -> Result<Interface> {
        self.interfaces().get(id as usize).copied().ok_or_else(|| {
            Error::invalid(
                off,
                format!(
                    "packet refers to interface {id}, but only {} interface(s) are described",
                    self.interfaces().len()
                ),
            )
        })
    }

    fn packet_block(
        &mut self,
        block_type: u32,
        body: Vec<u8>,
        off: u64,
        big: bool,
    ) -> Result<Frame> {
        let name = if block_type == PCAPNG_EPB {
            "enhanced packet block"
        } else {
            "packet block"
        };
        if body.len() < 20 {
            return Err(Error::invalid(
                off,
                format!("pcapng {name} body is {} bytes, less than 20", body.len()),
            ));
        }
        let id = if block_type == PCAPNG_EPB {
            u32_at(&body, 0, big)
        } else {
            u32::from(u16_at(&body, 0, big))
        };
        let iface = self.interface(id, off)?;
        let ts = (u64::from(u32_at(&body, 4, big)) << 32) | u64::from(u32_at(&body, 8, big));
        let caplen = u32_at(&body, 12, big);
        let orig_len = u32_at(&body, 16, big);
        if caplen as usize > body.len() - 20 {
            return Err(Error::invalid(
                off + 12,
                format!(
                    "pcapng {name} claims {caplen} captured bytes but holds only {}",
                    body.len() - 20
                ),
            ));
        }
        let mut body = body;
        body.truncate(20 + caplen as usize);
        body.drain(..20);
        self.frames += 1;
        Ok(Frame {
            number: self.frames,
            link_type: iface.link_type,
            interface: id,
            timestamp: Some(units_to_duration(
                ts,
                iface.units_per_sec,
                iface.offset_secs,
            )),
            orig_len,
            data: body,
        })
    }

    fn simple_packet_block(&mut self, body: Vec<u8>, off: u64, big: bool) -> Result<Frame> {
        if body.len() < 4 {
            return Err(Error::invalid(
                off,
                format!(
                    "pcapng simple packet block body is {} bytes, less than 4",
                    body.len()
                ),
            ));
        }
        let iface = self.interface(0, off)?;
        let orig_len = u32_at(&body, 0, big);
        let mut caplen = (orig_len as usize).min(body.len() - 4);
        if iface.snaplen != 0 {
            caplen = caplen.min(iface.snaplen as usize);
        }
        let mut body = body;
        body.truncate(4 + caplen);
        body.drain(..4);
        self.frames += 1;
        Ok(Frame {
            number: self.frames,
            link_type: iface.link_type,
            interface: 0,
            timestamp: None,
            orig_len,
            data: body,
        })
    }
}

/// Splits a pcapng option list into `(code, value, value offset)`.
fn options<'b>(
    mut b: &'b [u8],
    mut off: u64,
    big: bool,
    block: &str,
) -> Result<Vec<(u16, &'b [u8], u64)>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let code = u16_at(b, 0, big);
        let len = usize::from(u16_at(b, 2, big));
        if code == 0 {
            break;
        }
        let padded = (len + 3) & !3;
        if 4 + padded > b.len() {
            return Err(Error::invalid(
                off,
                format!("{block} option {code} of length {len} runs past the end of its block"),
            ));
        }
        out.push((code, &b[4..4 + len], off + 4));
        b = &b[4 + padded..];
        off += 4 + padded as u64;
    }
    Ok(out)
}

/// Reads until `buf` is full or the end of the stream; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Frame>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame().transpose()
    }
}
