//! Connecting QPs over a TCP socket, like the common rdma_cm flow but
//! without a kernel: each side sends one line describing its QP (and
//! optionally a region), and reads the other's.
//!
//! Line format (stable, human-readable): `softrdma-conn/1 gid=… qpn=0x…
//! psn=0x… mtu=… qkey=0x…[ addr=0x… rkey=0x… len=…]\n`.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::verbs::{QpEndpoint, RemoteRegion};
use crate::{Error, Result};

const MAGIC: &str = "softrdma-conn/1";
/// Longest connection line accepted.
const MAX_LINE: usize = 4096;

/// What each side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// The QP to connect to.
    pub endpoint: QpEndpoint,
    /// A region the peer may access, if offered.
    pub region: Option<RemoteRegion>,
}

impl ConnInfo {
    /// The wire line (without newline).
    pub fn to_line(&self) -> String {
        match &self.region {
            Some(r) => format!("{MAGIC} {} {}", self.endpoint, r),
            None => format!("{MAGIC} {}", self.endpoint),
        }
    }

    /// Parses a line.
    pub fn from_line(line: &str) -> Result<Self> {
        let rest = line.trim().strip_prefix(MAGIC).ok_or_else(|| {
            Error::Config(format!(
                "connection line does not start with {MAGIC}: {line:?}"
            ))
        })?;
        let endpoint: QpEndpoint = rest.parse()?;
        let region = if rest.contains("rkey=") {
            Some(rest.parse()?)
        } else {
            None
        };
        Ok(ConnInfo { endpoint, region })
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e.to_string())
}

/// Whether advertising a device at `gid_ip` to a peer at `peer`, reached
/// over a connection whose local end is `local`, would give the peer an
/// address it cannot send to: a loopback GID, and a peer on another host
/// (neither loopback nor this host's end of the connection).
pub fn unreachable_gid(gid_ip: IpAddr, local: IpAddr, peer: IpAddr) -> bool {
    gid_ip.is_loopback() && peer_on_another_host(local, peer)
}

/// Whether the peer of a connection from `local` to `peer` is on another
/// host: neither on loopback nor at this host's end of the connection.
pub fn peer_on_another_host(local: IpAddr, peer: IpAddr) -> bool {
    !peer.is_loopback() && peer != local
}

/// Sends ours, reads theirs.
///
/// A loopback GID is not sent to a peer on another host (it would send
/// its packets to its own loopback): that is an error naming the address
/// to configure instead.
pub fn exchange(stream: &mut TcpStream, mine: &ConnInfo) -> Result<ConnInfo> {
    if let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) {
        let gid = mine.endpoint.gid.to_ip();
        if unreachable_gid(gid, local.ip(), peer.ip()) {
            return Err(Error::Config(format!(
                "this device's GID {gid} is a loopback address, but the peer {} is on another host \
                 and could not reach it; open the device on an address of this host the peer \
                 reaches, e.g. SOFTRDMA_DEVICES=srx0={} (or DeviceConfig::new)",
                peer.ip(),
                local.ip()
            )));
        }
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    stream
        .write_all(format!("{}\n", mine.to_line()).as_bytes())
        .map_err(io)?;
    // Read byte by byte up to the newline: a buffered reader would swallow
    // whatever the peer sends after its line (the next exchange, a `sync`).
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match stream.read(&mut b).map_err(io)? {
            0 if line.is_empty() => {
                return Err(Error::Io(
                    "peer closed the connection before sending its QP".into(),
                ))
            }
            0 => break,
            _ if b[0] == b'\n' => break,
            _ if line.len() >= MAX_LINE => {
                return Err(Error::Io(format!(
                    "peer's connection line is longer than {MAX_LINE} bytes"
                )))
            }
            _ => line.push(b[0]),
        }
    }
    ConnInfo::from_line(&String::from_utf8_lossy(&line))
}

/// Server side: waits for one client on `listener` and exchanges.
pub fn accept(listener: &TcpListener, mine: &ConnInfo) -> Result<(TcpStream, ConnInfo)> {
    let (mut s, _) = listener.accept().map_err(io)?;
    let theirs = exchange(&mut s, mine)?;
    Ok((s, theirs))
}

/// Client side: connects (retrying for up to `wait` while the server starts) and exchanges.
pub fn connect(
    addr: impl ToSocketAddrs + Copy,
    mine: &ConnInfo,
    wait: Duration,
) -> Result<(TcpStream, ConnInfo)> {
    let start = std::time::Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if start.elapsed() < wait => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                let to = addr
                    .to_socket_addrs()
                    .map(|a| a.map(|a| a.to_string()).collect::<Vec<_>>().join(", "))
                    .unwrap_or_else(|_| "an address that does not resolve".into());
                return Err(Error::Io(format!(
                    "cannot connect to the peer at {to} after trying for {:.1} s: {e} \
                     (is its listener running, on that address and port?)",
                    start.elapsed().as_secs_f64()
                )));
            }
        }
    };
    let theirs = exchange(&mut s, mine)?;
    Ok((s, theirs))
}

/// Waits until the peer closes or writes a byte (a barrier at the end of a test).
pub fn sync(stream: &mut TcpStream) -> Result<()> {
    stream.write_all(b"S").map_err(io)?;
    let mut b = [0u8; 1];
    stream.read_exact(&mut b).map_err(io)?;
    Ok(())
}
