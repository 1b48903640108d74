//! Atomic Extended Transport Header (28 bytes): target, rkey, swap-or-add
//! value and compare value of CMP_SWAP and FETCH_ADD requests.

use crate::util::{be32, be64, check, put32, put64};
use crate::Result;

/// AtomicETH length in bytes.
pub const HEADER_LEN: usize = 28;

/// A view of an AtomicETH.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; accessors panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps a buffer after checking that it holds a whole AtomicETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check("AtomicETH", buffer.as_ref(), HEADER_LEN)?;
        Ok(Packet { buffer })
    }
    /// The remote virtual address (must be 8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[0..8])
    }
    /// The remote key of the target memory region.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[8..12])
    }
    /// The swap value (CMP_SWAP) or the addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[12..20])
    }
    /// The compare value (CMP_SWAP; ignored by FETCH_ADD).
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[20..28])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[0..8], v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        put32(&mut self.buffer.as_mut()[8..12], v)
    }
    /// Sets the swap value or addend.
    pub fn set_swap_add(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[12..20], v)
    }
    /// Sets the compare value.
    pub fn set_compare(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[20..28], v)
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address of the 8-byte target.
    pub va: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP only).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses a view, checking its length.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        check("AtomicETH", p.buffer.as_ref(), HEADER_LEN)?;
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header; the view must hold [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}
