//! Big-endian field helpers shared by the header modules.

use crate::{Error, Result};

pub(crate) fn check(header: &'static str, b: &[u8], need: usize) -> Result<()> {
    if b.len() < need {
        Err(Error::Truncated {
            header,
            need,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}
pub(crate) fn put16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes())
}
pub(crate) fn put32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes())
}
pub(crate) fn put64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes())
}
