//! RDMA Extended Transport Header (16 bytes): where a WRITE or READ lands.
//! Carried by WRITE_FIRST, WRITE_ONLY(_IMM) and READ_REQUEST.

use crate::util::{be32, be64, check, put32, put64};
use crate::Result;

/// RETH length in bytes.
pub const HEADER_LEN: usize = 16;

/// A view of a RETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; accessors panic if it is short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps a buffer after checking that it holds a whole RETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check("RETH", buffer.as_ref(), HEADER_LEN)?;
        Ok(Packet { buffer })
    }
    /// The remote virtual address the transfer starts at.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[0..8])
    }
    /// The remote key authorising access to the region.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[8..12])
    }
    /// The length of the whole message (not of this packet).
    pub fn dma_len(&self) -> u32 {
        be32(&self.buffer.as_ref()[12..16])
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
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        put32(&mut self.buffer.as_mut()[12..16], v)
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address the transfer starts at.
    pub va: u64,
    /// Remote key authorising access to the region.
    pub rkey: u32,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a view, checking its length.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        check("RETH", p.buffer.as_ref(), HEADER_LEN)?;
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
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
        p.set_dma_len(self.dma_len);
    }
}
