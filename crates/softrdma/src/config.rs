//! Which devices exist and how they are set up, from code or environment.
//!
//! `SOFTRDMA_DEVICES` lists devices as `name=address[:port][@xdp:IFACE]`,
//! comma separated, e.g. `srx0=192.168.1.10,srx1=[fd00::2]:4791`;
//! `@xdp:IFACE` puts the device on an AF_XDP socket on interface IFACE
//! instead of a UDP socket, `@xdp-or-udp:IFACE` the same but falling back
//! to UDP when AF_XDP cannot start (docs/xdp.md). Without it there
//! is one device, `srx0`, on loopback: it binds UDP port 4791 on the first
//! free address of 127.0.0.1, 127.0.0.2, … 127.0.0.254, so every process on a
//! host gets its own address (its GID) with no configuration.
//! `SOFTRDMA_CAPTURE=FILE.pcap` records every packet (`%p` in the name
//! becomes the process id, `%d` the device name, `%a` its address: see
//! [`capture_path`]); `SOFTRDMA_FAULT=…` injects faults on receive (see
//! [`crate::FaultSpec`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::Error;
use softrdma_core::FaultSpec;

/// The UDP port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
/// Name of the default device.
pub const DEFAULT_DEVICE: &str = "srx0";

/// Where a device listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// A fixed address and port.
    Addr(SocketAddr),
    /// The first free 127.0.0.N (N = 1..=254) on `port`.
    AutoLoopback {
        /// UDP port to bind.
        port: u16,
    },
}

/// Which network port a device sends and receives through.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Net {
    /// A UDP socket (the kernel's stack).
    #[default]
    Udp,
    /// An AF_XDP socket on an interface (docs/xdp.md).
    Xdp(XdpConfig),
}

/// Which XDP attach modes the AF_XDP port tries (SOFTRDMA_XDP_MODE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttach {
    /// Native (driver) XDP, and generic (SKB) XDP when the driver refuses.
    Auto,
    /// Native XDP only.
    Native,
    /// Generic XDP only.
    Generic,
}

/// The AF_XDP port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpConfig {
    /// The interface (its address must be the device's).
    pub iface: String,
    /// The receive queue the socket binds (0 unless `IFACE/QUEUE`).
    pub queue: u32,
    /// Fall back to the UDP port, saying why, when AF_XDP cannot start.
    pub fallback_udp: bool,
    /// Attach modes to try (SOFTRDMA_XDP_MODE=auto|native|generic).
    pub attach: XdpAttach,
    /// Busy-poll mode (SOFTRDMA_XDP_POLL=busy): the socket asks the kernel
    /// to busy-poll the queue from its system calls, and every send kicks
    /// the kernel; the default, wake-up mode, makes a system call only
    /// when the kernel's need-wakeup flag asks for one.
    pub busy_poll: bool,
}

impl XdpConfig {
    /// AF_XDP on queue 0 of `iface`, native XDP if the driver has it,
    /// wake-up mode, no fallback.
    pub fn new(iface: impl Into<String>) -> Self {
        XdpConfig {
            iface: iface.into(),
            queue: 0,
            fallback_udp: false,
            attach: XdpAttach::Auto,
            busy_poll: false,
        }
    }
}

/// How to open one device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Device name (`srx0`, …).
    pub name: String,
    /// Where it listens; its IP address is its GID.
    pub bind: Bind,
    /// Record every packet sent and received to this pcap file (`%p`,
    /// `%d`, `%a` in it are replaced: [`capture_path`]).
    pub capture: Option<PathBuf>,
    /// Faults injected on receive.
    pub fault: Option<FaultSpec>,
    /// Seed for keys; `None` takes one from the OS.
    pub seed: Option<u64>,
    /// Transport to same-host peers (SOFTRDMA_TRANSPORT).
    pub transport: crate::shm::Transport,
    /// Send runs of equal-sized packets to loopback peers as one UDP GSO
    /// message each (default on; SOFTRDMA_GSO=0 turns it off). The
    /// datagrams are the same; only a capture on `lo` (tcpdump), which
    /// sees the kernel's buffers before they are split, shows the
    /// difference.
    pub gso: bool,
    /// Reads the ECN codepoint of every received datagram (IP_RECVTOS), so
    /// that CE marks reach the engine's congestion control (default off;
    /// SOFTRDMA_ECN=1 turns it on). The control message it adds to each
    /// received datagram cost about 0.1 µs of a 3.5 µs UDP ping-pong on
    /// loopback, where nothing marks packets; what is sent always carries
    /// the ECN codepoint the engine chose.
    pub ecn: bool,
    /// The congestion control of every QP (SOFTRDMA_CC; default the
    /// fixed window). DCQCN also turns [`DeviceConfig::ecn`] on, since its
    /// notification point needs the CE marks.
    pub congestion: Congestion,
    /// How long a thread that waits on a completion channel polls before
    /// it sleeps (SOFTRDMA_EVENT_SPIN_US; default [`EVENT_SPIN_DEFAULT`],
    /// zero never polls). A completion that comes within it costs no
    /// wake-up; the device shortens the poll on its own while completions
    /// come later than that, so a program that waits long between events
    /// soon stops paying it.
    pub event_spin: Duration,
    /// The network port: UDP, or AF_XDP on an interface.
    pub net: Net,
}

/// A device's congestion control ([`DeviceConfig::congestion`]), chosen
/// with `SOFTRDMA_CC`: `fixed` (the default), `dcqcn[:GBPS]` (the DCQCN
/// paper's parameters) or `dcqcn-hpcc[:GBPS]` (the ns-3 HPCC model's),
/// with the line rate in Gb/s (default 10), or `timely[:GBPS[:MIN_RTT_US]]`
/// (default 10 Gb/s and 20 µs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Congestion {
    /// A fixed window of in-flight PSNs, no rate control (rxe's behaviour).
    #[default]
    FixedWindow,
    /// DCQCN with the paper's parameters at this line rate (b/s).
    Dcqcn {
        /// The line rate (b/s).
        line_bps: u64,
    },
    /// DCQCN with the ns-3 HPCC model's parameters at this line rate (b/s).
    DcqcnHpcc {
        /// The line rate (b/s).
        line_bps: u64,
    },
    /// TIMELY (delay-based) at this line rate and minimum RTT.
    Timely {
        /// The line rate (b/s).
        line_bps: u64,
        /// The path's minimum RTT.
        min_rtt: Duration,
    },
}

impl std::str::FromStr for Congestion {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let mut it = s.trim().split(':');
        let kind = it.next().unwrap_or("");
        let num = |v: Option<&str>, what: &str, default: f64, max: f64| -> Result<f64, Error> {
            match v {
                None => Ok(default),
                Some(t) => match t.trim().parse::<f64>() {
                    Ok(x) if x > 0.0 && x <= max => Ok(x),
                    _ => Err(Error::Config(format!(
                        "SOFTRDMA_CC={s:?}: {what} {t:?} is not a number above 0 and at most {max}"
                    ))),
                },
            }
        };
        let line = |v| num(v, "line rate (Gb/s)", 10.0, 10_000.0).map(|g| (g * 1e9) as u64);
        let c = match kind {
            "fixed" | "none" | "off" => Congestion::FixedWindow,
            "dcqcn" => Congestion::Dcqcn {
                line_bps: line(it.next())?,
            },
            "dcqcn-hpcc" => Congestion::DcqcnHpcc {
                line_bps: line(it.next())?,
            },
            "timely" => Congestion::Timely {
                line_bps: line(it.next())?,
                min_rtt: Duration::from_nanos(
                    (num(it.next(), "minimum RTT (µs)", 20.0, 1e6)? * 1e3) as u64,
                ),
            },
            _ => {
                return Err(Error::Config(format!(
                    "SOFTRDMA_CC={s:?}: give fixed, dcqcn[:GBPS], dcqcn-hpcc[:GBPS] or timely[:GBPS[:MIN_RTT_US]]"
                )))
            }
        };
        if it.next().is_some() {
            return Err(Error::Config(format!(
                "SOFTRDMA_CC={s:?}: too many ':' fields"
            )));
        }
        Ok(c)
    }
}

impl Congestion {
    /// The engine's setting for this choice.
    pub fn engine_config(self) -> softrdma_engine::CongestionConfig {
        use softrdma_engine::{CongestionConfig, DcqcnParams, TimelyParams};
        match self {
            Congestion::FixedWindow => CongestionConfig::fixed_window(),
            Congestion::Dcqcn { line_bps } => CongestionConfig::dcqcn(DcqcnParams::new(line_bps)),
            Congestion::DcqcnHpcc { line_bps } => {
                CongestionConfig::dcqcn(DcqcnParams::ns3_hpcc(line_bps))
            }
            Congestion::Timely { line_bps, min_rtt } => {
                CongestionConfig::timely(TimelyParams::new(line_bps, min_rtt))
            }
        }
    }

    /// Whether this controller acts on CE marks (so received ECN must be read).
    pub fn reads_ecn(self) -> bool {
        matches!(
            self,
            Congestion::Dcqcn { .. } | Congestion::DcqcnHpcc { .. }
        )
    }
}

/// The default [`DeviceConfig::event_spin`]: 50 µs, the busy-poll time
/// Linux's documentation suggests for `net.core.busy_read`, and longer
/// than a same-host or loopback UDP round trip here (0.3–15 µs), shorter
/// than one sleep and wake-up on a loaded VM (20–50 µs).
pub const EVENT_SPIN_DEFAULT: Duration = Duration::from_micros(50);

impl DeviceConfig {
    /// The default loopback device, with SOFTRDMA_CAPTURE/SOFTRDMA_FAULT applied.
    pub fn default_loopback() -> Self {
        DeviceConfig {
            name: DEFAULT_DEVICE.into(),
            bind: Bind::AutoLoopback { port: ROCE_PORT },
            capture: None,
            fault: None,
            seed: None,
            transport: crate::shm::Transport::Auto,
            gso: true,
            ecn: false,
            congestion: Congestion::FixedWindow,
            event_spin: EVENT_SPIN_DEFAULT,
            net: Net::Udp,
        }
        .with_env()
    }

    /// A device named `name` bound to `addr`.
    pub fn new(name: impl Into<String>, addr: SocketAddr) -> Self {
        DeviceConfig {
            name: name.into(),
            bind: Bind::Addr(addr),
            capture: None,
            fault: None,
            seed: None,
            transport: crate::shm::Transport::Auto,
            gso: true,
            ecn: false,
            congestion: Congestion::FixedWindow,
            event_spin: EVENT_SPIN_DEFAULT,
            net: Net::Udp,
        }
    }

    /// Records every packet to `path` (classic pcap; `%p`, `%d`, `%a` in
    /// it are replaced: [`capture_path`]).
    pub fn capture(mut self, path: impl Into<PathBuf>) -> Self {
        self.capture = Some(path.into());
        self
    }

    /// Injects faults on receive.
    pub fn fault(mut self, spec: FaultSpec) -> Self {
        self.fault = Some(spec);
        self
    }

    /// Chooses the transport to same-host peers.
    pub fn transport(mut self, t: crate::shm::Transport) -> Self {
        self.transport = t;
        self
    }

    /// Allows or forbids UDP GSO sends (see [`DeviceConfig::gso`]).
    pub fn gso(mut self, on: bool) -> Self {
        self.gso = on;
        self
    }

    /// Chooses the congestion control (see [`DeviceConfig::congestion`]).
    pub fn congestion(mut self, c: Congestion) -> Self {
        self.congestion = c;
        self
    }

    /// Reads received ECN marks or not (see [`DeviceConfig::ecn`]).
    pub fn ecn(mut self, on: bool) -> Self {
        self.ecn = on;
        self
    }

    /// Sets how long a completion-channel wait polls before it sleeps
    /// (see [`DeviceConfig::event_spin`]).
    pub fn event_spin(mut self, t: Duration) -> Self {
        self.event_spin = t;
        self
    }

    /// Sends and receives through an AF_XDP socket (docs/xdp.md).
    pub fn xdp(mut self, x: XdpConfig) -> Self {
        self.net = Net::Xdp(x);
        self
    }

    /// Fixes the key seed (tests that want reproducible keys).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Applies SOFTRDMA_CAPTURE (see [`capture_path`] for its `%p`, `%d`,
    /// `%a`) and SOFTRDMA_FAULT when set and not already
    /// configured, SOFTRDMA_TRANSPORT, SOFTRDMA_GSO=0 (no GSO sends),
    /// SOFTRDMA_ECN=1 (received ECN marks read), SOFTRDMA_CC (congestion
    /// control: [`Congestion`]) and SOFTRDMA_EVENT_SPIN_US.
    pub fn with_env(mut self) -> Self {
        if let Net::Xdp(x) = &mut self.net {
            if let Ok(v) = std::env::var("SOFTRDMA_XDP_MODE") {
                match v.as_str() {
                    "auto" => x.attach = XdpAttach::Auto,
                    "native" | "drv" => x.attach = XdpAttach::Native,
                    "generic" | "skb" => x.attach = XdpAttach::Generic,
                    _ => eprintln!(
                        "softrdma: ignoring SOFTRDMA_XDP_MODE={v:?} (auto, native or generic)"
                    ),
                }
            }
            if let Ok(v) = std::env::var("SOFTRDMA_XDP_POLL") {
                match v.as_str() {
                    "busy" => x.busy_poll = true,
                    "wakeup" | "wake-up" => x.busy_poll = false,
                    _ => eprintln!("softrdma: ignoring SOFTRDMA_XDP_POLL={v:?} (wakeup or busy)"),
                }
            }
        }
        if let Ok(v) = std::env::var("SOFTRDMA_ECN") {
            match v.as_str() {
                "0" | "off" | "no" => self.ecn = false,
                "1" | "on" | "yes" => self.ecn = true,
                _ => eprintln!("softrdma: ignoring SOFTRDMA_ECN={v:?} (0 or 1)"),
            }
        }
        if let Ok(v) = std::env::var("SOFTRDMA_CC") {
            match v.parse::<Congestion>() {
                Ok(c) => self.congestion = c,
                Err(e) => eprintln!("softrdma: ignoring {e}"),
            }
        }
        if let Ok(v) = std::env::var("SOFTRDMA_EVENT_SPIN_US") {
            match v.parse::<u64>() {
                Ok(us) if us <= 1_000_000 => self.event_spin = Duration::from_micros(us),
                _ => eprintln!(
                    "softrdma: ignoring SOFTRDMA_EVENT_SPIN_US={v:?} (microseconds, 0 to 1000000)"
                ),
            }
        }
        if let Ok(v) = std::env::var("SOFTRDMA_GSO") {
            match v.as_str() {
                "0" | "off" | "no" => self.gso = false,
                "1" | "on" | "yes" => self.gso = true,
                _ => eprintln!("softrdma: ignoring SOFTRDMA_GSO={v:?} (0 or 1)"),
            }
        }
        if self.capture.is_none() {
            if let Some(p) = std::env::var_os("SOFTRDMA_CAPTURE").filter(|v| !v.is_empty()) {
                self.capture = Some(p.into());
            }
        }
        if let Ok(t) = std::env::var("SOFTRDMA_TRANSPORT") {
            match t.parse() {
                Ok(t) => self.transport = t,
                Err(e) => eprintln!("softrdma: ignoring SOFTRDMA_TRANSPORT: {e}"),
            }
        }
        if self.fault.is_none() {
            if let Ok(s) = std::env::var("SOFTRDMA_FAULT") {
                match s.parse() {
                    Ok(f) => self.fault = Some(f),
                    Err(e) => eprintln!("softrdma: ignoring SOFTRDMA_FAULT: {e}"),
                }
            }
        }
        self
    }
}

/// The capture file of device `name` at `addr` for the configured
/// `template` (`DeviceConfig::capture`, `SOFTRDMA_CAPTURE`): `%p` becomes
/// this process's id, `%d` the device name, `%a` the device's address
/// (`127.0.0.2-4791`; an IPv6 address with `_` for `:`) and `%%` a `%`,
/// so that processes and devices sharing one setting write files of their
/// own (`SOFTRDMA_CAPTURE=/tmp/cap-%p-%d.pcap`). Any other `%` sequence is
/// an error that names it.
pub fn capture_path(
    template: &std::path::Path,
    name: &str,
    addr: SocketAddr,
) -> Result<PathBuf, Error> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = template.as_os_str().as_bytes();
    if !bytes.contains(&b'%') {
        return Ok(template.to_path_buf());
    }
    let ip = match addr.ip() {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => a.to_string().replace(':', "_"),
    };
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut it = bytes.iter();
    while let Some(&b) = it.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        match it.next() {
            Some(b'p') => out.extend_from_slice(std::process::id().to_string().as_bytes()),
            Some(b'd') => out.extend_from_slice(name.as_bytes()),
            Some(b'a') => out.extend_from_slice(format!("{ip}-{}", addr.port()).as_bytes()),
            Some(b'%') => out.push(b'%'),
            other => {
                let seq = other.map_or("a lone % at the end".to_string(), |&c| {
                    format!("%{}", char::from(c))
                });
                return Err(Error::Config(format!(
                    "capture file {:?}: {seq} is not a substitution (%p process id, %d device name, %a address, %% a %)",
                    template.display().to_string()
                )));
            }
        }
    }
    Ok(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// Parses one `name=address[:port]` entry (one SOFTRDMA_DEVICES item, or
/// the value of a command's `--device`); `source` names where it came from
/// in error messages ("SOFTRDMA_DEVICES entry", "--device").
pub fn parse_device(entry: &str, source: &str) -> Result<DeviceConfig, Error> {
    let entry = entry.trim();
    let (name, addr) = entry.split_once('=').ok_or_else(|| {
        Error::Config(format!(
            "{source} {entry:?} is not name=address (e.g. srx0=192.0.2.1 or srx0=[fd00::2]:4791)"
        ))
    })?;
    let name = name.trim();
    if name.is_empty() {
        return Err(Error::Config(format!(
            "{source} {entry:?} has an empty name"
        )));
    }
    let (addr, net) = match addr.split_once('@') {
        None => (addr.trim(), Net::Udp),
        Some((a, port)) => (a.trim(), parse_net(port.trim(), entry, source)?),
    };
    if addr == "auto" && net != Net::Udp {
        return Err(Error::Config(format!(
            "{source} {entry:?}: an AF_XDP device needs its interface's address, not \"auto\""
        )));
    }
    if addr == "auto" {
        return Ok(DeviceConfig {
            name: name.into(),
            bind: Bind::AutoLoopback { port: ROCE_PORT },
            capture: None,
            fault: None,
            seed: None,
            transport: crate::shm::Transport::Auto,
            gso: true,
            ecn: false,
            congestion: Congestion::FixedWindow,
            event_spin: EVENT_SPIN_DEFAULT,
            net: Net::Udp,
        });
    }
    let sa = if let Ok(sa) = addr.parse::<SocketAddr>() {
        sa
    } else if let Ok(ip) = addr.parse::<IpAddr>() {
        SocketAddr::new(ip, ROCE_PORT)
    } else {
        return Err(Error::Config(format!(
            "{source} {entry:?}: {addr:?} is not an IP address, ip:port, [ipv6]:port or \"auto\""
        )));
    };
    if sa.ip().is_unspecified() {
        return Err(Error::Config(format!(
            "{source} {entry:?}: a device needs a concrete address (its GID), not {}",
            sa.ip()
        )));
    }
    let mut d = DeviceConfig::new(name, sa);
    d.net = net;
    Ok(d)
}

/// Parses the port part after `@`: `xdp:IFACE[/QUEUE]` or
/// `xdp-or-udp:IFACE[/QUEUE]`.
fn parse_net(spec: &str, entry: &str, source: &str) -> Result<Net, Error> {
    let bad = |why: &str| {
        Error::Config(format!(
            "{source} {entry:?}: {why} (the port is @xdp:IFACE, @xdp:IFACE/QUEUE or \
             @xdp-or-udp:IFACE for AF_XDP with a fallback to UDP)"
        ))
    };
    let (kind, iface) = spec
        .split_once(':')
        .ok_or_else(|| bad(&format!("{spec:?} names no interface")))?;
    let fallback_udp = match kind {
        "xdp" => false,
        "xdp-or-udp" => true,
        k => return Err(bad(&format!("{k:?} is not a port kind"))),
    };
    let (iface, queue) = match iface.split_once('/') {
        None => (iface, 0),
        Some((i, q)) => (
            i,
            q.parse()
                .map_err(|_| bad(&format!("queue {q:?} is not a number")))?,
        ),
    };
    if iface.is_empty() || iface.len() > 15 || iface.contains(['/', ' ', ',']) {
        return Err(bad(&format!("{iface:?} is not an interface name")));
    }
    let mut x = XdpConfig::new(iface);
    x.queue = queue;
    x.fallback_udp = fallback_udp;
    Ok(Net::Xdp(x))
}

/// Parses a SOFTRDMA_DEVICES value.
pub fn parse_devices(spec: &str) -> Result<Vec<DeviceConfig>, Error> {
    parse_device_list(
        spec.split(',').map(str::trim).filter(|e| !e.is_empty()),
        "SOFTRDMA_DEVICES",
    )
}

/// Parses device entries from `source` (SOFTRDMA_DEVICES or a command's
/// `--device` options): each `name=address[:port]`, no name twice, at
/// least one.
pub fn parse_device_list<'a>(
    entries: impl IntoIterator<Item = &'a str>,
    source: &str,
) -> Result<Vec<DeviceConfig>, Error> {
    let mut v: Vec<DeviceConfig> = Vec::new();
    let item = if source.starts_with('-') {
        source.to_string()
    } else {
        format!("{source} entry")
    };
    for entry in entries {
        let d = parse_device(entry, &item)?;
        if v.iter().any(|x| x.name == d.name) {
            return Err(Error::Config(format!(
                "{source} names device {:?} twice",
                d.name
            )));
        }
        v.push(d);
    }
    if v.is_empty() {
        return Err(Error::Config(format!("{source} lists no devices")));
    }
    Ok(v)
}

/// The device named `name` in `list`, or an error that lists the devices
/// there are and how to add one.
pub fn select(list: &[DeviceConfig], name: &str) -> Result<DeviceConfig, Error> {
    if let Some(d) = list.iter().find(|d| d.name == name) {
        return Ok(d.clone());
    }
    let have: Vec<String> = list.iter().map(describe).collect();
    Err(Error::Config(format!(
        "no softrdma device named {name:?}; the devices here are: {} \
         (choose one with -d, or add one with --device {name}=IP[:PORT] or SOFTRDMA_DEVICES)",
        have.join(", ")
    )))
}

/// `name (address)` of a configured device.
pub fn describe(d: &DeviceConfig) -> String {
    if let (Net::Xdp(x), Bind::Addr(a)) = (&d.net, &d.bind) {
        return format!("{} ({a} over AF_XDP on {})", d.name, x.iface);
    }
    match &d.bind {
        Bind::Addr(a) => format!("{} ({a})", d.name),
        Bind::AutoLoopback { port } => {
            format!("{} (the first free 127.0.0.N, UDP port {port})", d.name)
        }
    }
}

/// The configured devices: SOFTRDMA_DEVICES, or the default loopback device.
pub fn devices() -> Result<Vec<DeviceConfig>, Error> {
    match std::env::var("SOFTRDMA_DEVICES") {
        Ok(s) if !s.trim().is_empty() => Ok(parse_devices(&s)?
            .into_iter()
            .map(DeviceConfig::with_env)
            .collect()),
        _ => Ok(vec![DeviceConfig::default_loopback()]),
    }
}

/// The candidate addresses of automatic loopback binding.
pub(crate) fn auto_loopback_candidates(port: u16) -> impl Iterator<Item = SocketAddr> {
    (1..=254u8).map(move |n| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries() {
        let v = parse_devices("srx0=192.0.2.1, srx1=[fd00::2]:5000,srx2=auto").unwrap();
        assert_eq!(v[0].bind, Bind::Addr("192.0.2.1:4791".parse().unwrap()));
        assert_eq!(v[1].bind, Bind::Addr("[fd00::2]:5000".parse().unwrap()));
        assert_eq!(v[2].bind, Bind::AutoLoopback { port: 4791 });
    }

    #[test]
    fn rejects_bad_entries_naming_them() {
        let e = parse_devices("srx0").unwrap_err().to_string();
        assert!(e.contains("\"srx0\" is not name=address"), "{e}");
        let e = parse_devices("srx0=nothost").unwrap_err().to_string();
        assert!(e.contains("\"nothost\" is not an IP address"), "{e}");
        let e = parse_devices("a=127.0.0.2,a=127.0.0.3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = parse_devices("a=0.0.0.0").unwrap_err().to_string();
        assert!(e.contains("concrete address"), "{e}");
        let e = parse_device_list(["srx0=10.0.0.1", "srx0=10.0.0.2"], "--device")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--device names device \"srx0\" twice"), "{e}");
        let e = parse_device("srx0", "--device").unwrap_err().to_string();
        assert!(e.contains("--device \"srx0\" is not name=address"), "{e}");
    }

    #[test]
    fn parses_xdp_ports() {
        let v = parse_devices("a=10.1.0.1@xdp:veth0,b=[fd00::1]:4791@xdp-or-udp:eth1/3").unwrap();
        let want = XdpConfig::new("veth0");
        assert_eq!(v[0].net, Net::Xdp(want));
        assert_eq!(v[0].bind, Bind::Addr("10.1.0.1:4791".parse().unwrap()));
        let Net::Xdp(x) = &v[1].net else {
            panic!("{:?}", v[1].net)
        };
        assert_eq!(
            (x.iface.as_str(), x.queue, x.fallback_udp),
            ("eth1", 3, true)
        );
        assert!(describe(&v[0]).contains("over AF_XDP on veth0"));
        for (bad, what) in [
            ("a=10.1.0.1@xdp", "names no interface"),
            ("a=10.1.0.1@dpdk:eth0", "not a port kind"),
            ("a=10.1.0.1@xdp:", "not an interface name"),
            ("a=10.1.0.1@xdp:eth0/x", "not a number"),
            ("a=auto@xdp:eth0", "needs its interface's address"),
        ] {
            let e = parse_devices(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn select_lists_the_devices_there_are() {
        let v = parse_devices("srx0=192.0.2.1,srx1=auto").unwrap();
        assert_eq!(select(&v, "srx1").unwrap().name, "srx1");
        let e = select(&v, "mlx5_0").unwrap_err().to_string();
        assert!(
            e.contains("\"mlx5_0\"") && e.contains("srx0 (192.0.2.1:4791)") && e.contains("srx1 ("),
            "{e}"
        );
    }

    #[test]
    fn capture_names_take_the_process_device_and_address() {
        let v4: SocketAddr = "127.0.0.2:4791".parse().unwrap();
        let v6: SocketAddr = "[fd00::2]:5000".parse().unwrap();
        let pid = std::process::id();
        let p = |t: &str, a| capture_path(std::path::Path::new(t), "srx1", a);
        assert_eq!(
            p("/tmp/plain.pcap", v4).unwrap(),
            PathBuf::from("/tmp/plain.pcap")
        );
        assert_eq!(
            p("/tmp/cap-%p-%d-%a.pcap", v4).unwrap(),
            PathBuf::from(format!("/tmp/cap-{pid}-srx1-127.0.0.2-4791.pcap"))
        );
        assert_eq!(
            p("%a%%.pcap", v6).unwrap(),
            PathBuf::from("fd00__2-5000%.pcap")
        );
        for (bad, what) in [("/tmp/x-%q.pcap", "%q"), ("/tmp/x-%", "a lone %")] {
            let e = p(bad, v4).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains(bad), "{e}");
        }
    }
}

#[cfg(test)]
mod congestion_tests {
    use super::Congestion;
    use std::time::Duration;

    #[test]
    fn softrdma_cc_values() {
        assert_eq!(
            "fixed".parse::<Congestion>().unwrap(),
            Congestion::FixedWindow
        );
        assert_eq!(
            "dcqcn".parse::<Congestion>().unwrap(),
            Congestion::Dcqcn {
                line_bps: 10_000_000_000
            }
        );
        assert_eq!(
            "dcqcn-hpcc:2.5".parse::<Congestion>().unwrap(),
            Congestion::DcqcnHpcc {
                line_bps: 2_500_000_000
            }
        );
        assert_eq!(
            "timely:1:50".parse::<Congestion>().unwrap(),
            Congestion::Timely {
                line_bps: 1_000_000_000,
                min_rtt: Duration::from_micros(50)
            }
        );
        assert!("dcqcn".parse::<Congestion>().unwrap().reads_ecn());
        assert!(!"timely".parse::<Congestion>().unwrap().reads_ecn());
        for bad in ["reno", "dcqcn:0", "dcqcn:x", "dcqcn:1:2"] {
            assert!(bad.parse::<Congestion>().is_err(), "{bad}");
        }
    }
}
