//! A classic pcap writer: Ethernet link type, microsecond timestamps,
//! snap length 65535, little-endian (the byte order of the hosts softrdma
//! runs on; readers accept either).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use softrdma_wire::frame::{build_frame, mac_for, FrameOptions};

use crate::LinkType;

/// Magic of a classic pcap file with microsecond timestamps.
pub const PCAP_MAGIC_MICROS: u32 = 0xA1B2_C3D4;
/// Magic of a classic pcap file with nanosecond timestamps.
pub const PCAP_MAGIC_NANOS: u32 = 0xA1B2_3C4D;
/// The snap length written files declare; longer frames are cut to it (the
/// record keeps their original length).
pub const SNAPLEN: u32 = 65535;

/// A capture timestamp: time since the Unix epoch. Built from a
/// [`Duration`] since the epoch or from a [`SystemTime`] (times before the
/// epoch become the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub Duration);

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        SystemTime::now().into()
    }
}

impl From<Duration> for Timestamp {
    fn from(d: Duration) -> Self {
        Timestamp(d)
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        Timestamp(t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO))
    }
}

/// Writes frames into a classic pcap stream.
///
/// The file header is written by [`PcapWriter::new`]; every
/// [`write_frame`](PcapWriter::write_frame) appends one record. The writer
/// flushes its output when dropped (errors at that point are lost: call
/// [`flush`](PcapWriter::flush) to see them).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    // `None` only after `into_inner`.
    out: Option<W>,
    frames: u64,
}

impl PcapWriter<BufWriter<File>> {
    /// Creates (or truncates) `path` and writes the pcap file header.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::new(BufWriter::new(File::create(path)?))
    }
}

impl<W: Write> PcapWriter<W> {
    /// Writes the pcap file header to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&PCAP_MAGIC_MICROS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone 0, sigfigs 0
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LinkType::ETHERNET.value().to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter {
            out: Some(out),
            frames: 0,
        })
    }

    fn out(&mut self) -> &mut W {
        self.out.as_mut().expect("PcapWriter used after into_inner")
    }

    /// Appends one Ethernet frame captured at `ts`.
    ///
    /// Fails with `InvalidInput` for timestamps past 2106 (the format's
    /// 32-bit seconds) and for frames longer than 4 GiB.
    pub fn write_frame(&mut self, ts: impl Into<Timestamp>, frame: &[u8]) -> io::Result<()> {
        let ts = ts.into().0;
        let secs = u32::try_from(ts.as_secs()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "timestamp does not fit the pcap format's 32-bit seconds",
            )
        })?;
        let orig = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame longer than 4 GiB"))?;
        let incl = orig.min(SNAPLEN);
        let mut r = [0u8; 16];
        r[0..4].copy_from_slice(&secs.to_le_bytes());
        r[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        r[8..12].copy_from_slice(&incl.to_le_bytes());
        r[12..16].copy_from_slice(&orig.to_le_bytes());
        let out = self.out();
        out.write_all(&r)?;
        out.write_all(&frame[..incl as usize])?;
        self.frames += 1;
        Ok(())
    }

    /// Appends a RoCEv2 (or any UDP) datagram sent from `src` to `dst`,
    /// framed in Ethernet/IP/UDP by [`softrdma_wire::frame::build_frame`]
    /// the way a RoCE sender emits it (IPv4 with DF and ID 0), with MACs
    /// derived from the addresses by [`mac_for`].
    pub fn write_roce(
        &mut self,
        ts: impl Into<Timestamp>,
        src: SocketAddr,
        dst: SocketAddr,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let frame = roce_frame(src, dst, udp_payload)?;
        self.write_frame(ts, &frame)
    }

    /// Frames written so far.
    pub fn frames_written(&self) -> u64 {
        self.frames
    }

    /// Flushes the output.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out().flush()
    }

    /// The output.
    pub fn get_ref(&self) -> &W {
        self.out.as_ref().expect("PcapWriter used after into_inner")
    }

    /// Flushes and returns the output.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.out.take().expect("PcapWriter used after into_inner"))
    }
}

impl<W: Write> Drop for PcapWriter<W> {
    fn drop(&mut self) {
        if let Some(out) = self.out.as_mut() {
            let _ = out.flush();
        }
    }
}

/// The Ethernet frame [`PcapWriter::write_roce`] writes.
pub fn roce_frame(src: SocketAddr, dst: SocketAddr, udp_payload: &[u8]) -> io::Result<Vec<u8>> {
    let opts = FrameOptions {
        src_mac: mac_for(src.ip()),
        dst_mac: mac_for(dst.ip()),
        ..FrameOptions::default()
    };
    build_frame(src, dst, udp_payload, &opts)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A [`PcapWriter`] shared between threads: clone it freely; each frame is
/// written whole under a mutex, and the file is flushed when the last clone
/// is dropped.
///
/// A thread that panicked while writing does not stop the others from
/// logging (the mutex's poison is ignored).
#[derive(Debug)]
pub struct SharedPcapWriter<W: Write = BufWriter<File>> {
    inner: Arc<Mutex<PcapWriter<W>>>,
}

impl<W: Write> Clone for SharedPcapWriter<W> {
    fn clone(&self) -> Self {
        SharedPcapWriter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl SharedPcapWriter<BufWriter<File>> {
    /// Creates (or truncates) `path` and writes the pcap file header.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::from_writer(PcapWriter::create(path)?))
    }
}

impl<W: Write> SharedPcapWriter<W> {
    /// Writes the pcap file header to `out`.
    pub fn new(out: W) -> io::Result<Self> {
        Ok(Self::from_writer(PcapWriter::new(out)?))
    }

    /// Shares an existing writer.
    pub fn from_writer(w: PcapWriter<W>) -> Self {
        SharedPcapWriter {
            inner: Arc::new(Mutex::new(w)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PcapWriter<W>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See [`PcapWriter::write_frame`].
    pub fn write_frame(&self, ts: impl Into<Timestamp>, frame: &[u8]) -> io::Result<()> {
        self.lock().write_frame(ts, frame)
    }

    /// See [`PcapWriter::write_roce`]. The frame is built outside the lock.
    pub fn write_roce(
        &self,
        ts: impl Into<Timestamp>,
        src: SocketAddr,
        dst: SocketAddr,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let frame = roce_frame(src, dst, udp_payload)?;
        self.lock().write_frame(ts, &frame)
    }

    /// Frames written so far by all clones.
    pub fn frames_written(&self) -> u64 {
        self.lock().frames_written()
    }

    /// Flushes the output.
    pub fn flush(&self) -> io::Result<()> {
        self.lock().flush()
    }

    /// Runs `f` on the underlying writer (e.g. to look at an in-memory buffer).
    pub fn with_writer<T>(&self, f: impl FnOnce(&mut PcapWriter<W>) -> T) -> T {
        f(&mut self.lock())
    }
}
