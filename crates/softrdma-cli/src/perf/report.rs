//! Statistics and perftest-compatible output of `softrdma perf`.
//!
//! The text layout follows perftest 4.5 (the version Debian 12 ships), so
//! scripts that parse `ib_write_lat` or `ib_write_bw` output parse ours: an
//! 87-dash rule, a title, key/value lines, the address lines, then the
//! result table with the same column headings and number formats. The
//! statistics are computed as perftest computes them: latency from the
//! intervals between successive posts (half of each for the ping-pong tests,
//! whole for READ and atomics), after dropping the two largest intervals;
//! bandwidth in MB/sec where 1 MB is 2^20 bytes (`--report_gbits`: Gb/sec
//! with 1 Gb = 10^9 bits), peak from the best stretch between a post and a
//! later completion.

use std::fmt::Write as _;

use serde::Serialize;

/// The rule perftest draws between blocks (87 dashes).
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Latency table heading.
pub const LAT_HEAD: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// Latency table heading for timed (-D) runs.
pub const LAT_DUR_HEAD: &str = " #bytes        #iterations       t_avg[usec]    tps average";
/// Bandwidth table heading (MB/sec, 1 MB = 2^20 bytes as in perftest).
pub const BW_HEAD: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// Bandwidth table heading with --report_gbits.
pub const BW_HEAD_G: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// perftest drops this many of the largest latency samples.
const LAT_MEASURE_TAIL: usize = 2;

/// One row of a latency table (microseconds).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatRow {
    pub bytes: u64,
    pub iterations: u64,
    pub t_min: f64,
    pub t_max: f64,
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
}

/// One row of a timed latency run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatDurRow {
    pub bytes: u64,
    pub iterations: u64,
    pub t_avg: f64,
    pub tps: f64,
}

/// One row of a bandwidth table.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct BwRow {
    pub bytes: u64,
    pub iterations: u64,
    pub bw_peak: f64,
    pub bw_average: f64,
    pub msg_rate_mpps: f64,
}

/// Any result row.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Row {
    Lat(LatRow),
    LatDur(LatDurRow),
    Bw(BwRow),
}

impl Row {
    /// The one number `--output` prints (perftest's `%lf`).
    pub fn number(&self, kind: super::OutputKind) -> String {
        use super::OutputKind as K;
        let v = match (self, kind) {
            (Row::Bw(b), K::MessageRate) => b.msg_rate_mpps,
            (Row::Bw(b), _) => b.bw_average,
            (Row::Lat(l), _) => l.t_avg,
            (Row::LatDur(l), _) => l.t_avg,
        };
        format!("{v:.6}")
    }

    /// The row as perftest prints it (without newline).
    pub fn text(&self) -> String {
        match self {
            Row::Lat(r) => format!(
                " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                r.bytes, r.iterations, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99,
                r.p99_9
            ),
            Row::LatDur(r) => format!(
                " {:<7}       {}            {:<7.2}        {:<7.2}",
                r.bytes, r.iterations, r.t_avg, r.tps
            ),
            Row::Bw(r) => format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
                r.bytes, r.iterations, r.bw_peak, r.bw_average, r.msg_rate_mpps
            ),
        }
    }
}

/// Latency statistics from post timestamps (nanoseconds, one per
/// iteration), as perftest's `print_report_lat`.
pub fn lat_row(posted_ns: &[u64], rtt_factor: f64, bytes: u64) -> Option<LatRow> {
    let mut d: Vec<f64> = posted_ns
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64 / 1000.0 / rtt_factor)
        .collect();
    if d.len() <= LAT_MEASURE_TAIL {
        return None;
    }
    d.sort_by(f64::total_cmp);
    let cnt = d.len() - LAT_MEASURE_TAIL;
    let median = if (cnt - 1) % 2 == 1 {
        (d[cnt / 2] + d[cnt / 2 - 1]) / 2.0
    } else {
        d[cnt / 2]
    };
    let avg = d[..cnt].iter().sum::<f64>() / cnt as f64;
    let var = d[..cnt].iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / cnt as f64;
    let i99 = ((cnt as f64) * 0.99).ceil() as usize;
    let i999 = ((cnt as f64) * 0.999).ceil() as usize;
    Some(LatRow {
        bytes,
        iterations: posted_ns.len() as u64,
        t_min: d[0],
        t_max: d[cnt],
        t_typical: median,
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: d[i99.min(d.len() - 1)],
        p99_9: d[i999.min(d.len() - 1)],
    })
}

/// Bytes per second → the report unit.
pub fn bw_unit(bytes_per_s: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_s * 8.0 / 1e9
    } else {
        bytes_per_s / (1u64 << 20) as f64
    }
}

/// A bandwidth in `from` units (`bw_unit`'s `gbits`) in `to` units.
pub fn bw_convert(v: f64, from: bool, to: bool) -> f64 {
    let bytes_per_s = if from {
        v * 1e9 / 8.0
    } else {
        v * (1u64 << 20) as f64
    };
    bw_unit(bytes_per_s, to)
}

/// Best per-message time (ns) over every stretch from a post to a later
/// completion record, like perftest's peak (start points are thinned out to
/// keep long runs cheap). `posted[i]` is when message `i` was posted;
/// `completed` holds (messages completed so far, time).
pub fn peak_ns_per_msg(posted: &[u64], completed: &[(u64, u64)]) -> Option<f64> {
    if posted.is_empty() || completed.is_empty() {
        return None;
    }
    let step = (posted.len() / 4000).max(1);
    let mut best = f64::INFINITY;
    let mut first = 0;
    for i in (0..posted.len()).step_by(step) {
        while first < completed.len() && completed[first].0 <= i as u64 {
            first += 1;
        }
        for &(n, t) in &completed[first..] {
            let msgs = n - i as u64;
            let per = t.saturating_sub(posted[i]) as f64 / msgs as f64;
            if per < best {
                best = per;
            }
        }
    }
    best.is_finite().then_some(best)
}

/// What the header block shows.
pub struct Header<'a> {
    pub title: String,
    pub device: &'a str,
    pub qps: u32,
    pub conn: &'a str,
    pub tx_depth: Option<u32>,
    pub rx_depth: Option<u32>,
    pub cq_mod: Option<u32>,
    pub mtu: u32,
    /// Max inline data, or outstanding reads for READ and atomics.
    pub inline: Option<u32>,
    pub out_reads: Option<u32>,
    pub events: bool,
    pub transport: &'a str,
    pub duration: Option<f64>,
    /// QPs connected through the connection manager (-R).
    pub rdma_cm: bool,
}

impl Header<'_> {
    /// The block from the first rule to the rule before the addresses.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "{RULE}");
        let _ = writeln!(o, "                    {}", self.title);
        if self.events {
            let _ = writeln!(o, " Test with events. Using {}_comp0", self.device);
        }
        let _ = writeln!(
            o,
            " Dual-port       : OFF\t\tDevice         : {}",
            self.device
        );
        let _ = writeln!(o, " Number of qps   : {}\t\tTransport type : IB", self.qps);
        let _ = writeln!(
            o,
            " Connection type : {}\t\tUsing SRQ      : OFF",
            self.conn
        );
        if let Some(t) = self.tx_depth {
            let _ = writeln!(o, " TX depth        : {t}");
        }
        if let Some(r) = self.rx_depth {
            let _ = writeln!(o, " RX depth        : {r}");
        }
        if let Some(c) = self.cq_mod {
            let _ = writeln!(o, " CQ Moderation   : {c}");
        }
        let _ = writeln!(o, " Mtu             : {}[B]", self.mtu);
        let _ = writeln!(o, " Link type       : Ethernet");
        let _ = writeln!(o, " GID index       : 0");
        if let Some(i) = self.inline {
            let _ = writeln!(o, " Max inline data : {i}[B]");
        }
        if let Some(r) = self.out_reads {
            let _ = writeln!(o, " Outstand reads  : {r}");
        }
        let _ = writeln!(
            o,
            " rdma_cm QPs\t : {}",
            if self.rdma_cm { "ON" } else { "OFF" }
        );
        let _ = writeln!(o, " Data ex. method : Ethernet");
        let _ = writeln!(o, " softrdma path   : {}", self.transport);
        if let Some(d) = self.duration {
            let _ = writeln!(o, " Duration        : {d}[s]");
        }
        let _ = writeln!(o, "{RULE}");
        o
    }
}

/// C's `%#0Nx`: `0x` and zero-padded hex filling N characters; a zero
/// value prints as N zeros (C omits the prefix for 0).
pub fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        "0".repeat(width)
    } else {
        format!("{v:#0width$x}")
    }
}

/// What the address line of one side shows.
#[derive(Debug, Clone, Serialize)]
pub struct Addr {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub out_reads: u32,
    pub gid: [u8; 16],
}

/// Which fields the address line carries (perftest prints RKey/VAddr for
/// WRITE and READ, OUT for READ, neither for SEND and atomics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrKind {
    Basic,
    Rdma,
    Read,
}

impl Addr {
    /// ` local address: LID 0000 QPN 0x0011 …` and the GID line.
    pub fn text(&self, side: &str, kind: AddrKind) -> String {
        let mut o = format!(
            " {side} address: LID {} QPN {} PSN {}",
            c_alt_hex(self.lid.into(), 4),
            c_alt_hex(self.qpn.into(), 6),
            c_alt_hex(self.psn.into(), 6)
        );
        if kind == AddrKind::Read {
            let _ = write!(o, " OUT {}", c_alt_hex(self.out_reads.into(), 4));
        }
        if kind != AddrKind::Basic {
            let _ = write!(
                o,
                " RKey {} VAddr {}",
                c_alt_hex(self.rkey.into(), 8),
                c_alt_hex(self.vaddr, 16)
            );
        }
        o.push_str("\n GID: ");
        let parts: Vec<String> = self.gid.iter().map(|b| format!("{b:02}")).collect();
        o.push_str(&parts.join(":"));
        o.push('\n');
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_is_87_dashes() {
        assert_eq!(RULE.len(), 87);
        assert!(RULE.bytes().all(|b| b == b'-'));
    }

    #[test]
    fn c_alt_hex_matches_printf() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0x24a8d, 6), "0x24a8d");
        assert_eq!(c_alt_hex(0x4d6, 8), "0x0004d6");
        assert_eq!(c_alt_hex(0x55b6f2b06000, 16), "0x0055b6f2b06000");
    }

    #[test]
    fn address_line_like_perftest() {
        let a = Addr {
            lid: 0,
            qpn: 0x11,
            psn: 0x24a8d,
            rkey: 0x4d6,
            vaddr: 0x55b6f2b06000,
            out_reads: 16,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 127, 0, 0, 2],
        };
        assert_eq!(
            a.text("local", AddrKind::Rdma),
            " local address: LID 0000 QPN 0x0011 PSN 0x24a8d RKey 0x0004d6 VAddr 0x0055b6f2b06000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:02\n"
        );
        assert!(a.text("remote", AddrKind::Read).contains(" OUT 0x10 RKey"));
        assert!(!a.text("remote", AddrKind::Basic).contains("RKey"));
    }

    #[test]
    fn latency_statistics_like_perftest() {
        // Intervals 1..=10 µs (RTT), the two largest dropped.
        let mut t = vec![0u64];
        for i in 1..=10u64 {
            t.push(t.last().unwrap() + i * 1000);
        }
        let r = lat_row(&t, 2.0, 8).unwrap();
        assert_eq!(r.iterations, 11);
        assert_eq!(r.t_min, 0.5);
        // cnt = 8 (1..=8 µs kept); t_max is the first dropped one, 9 µs.
        assert_eq!(r.t_max, 4.5);
        assert_eq!(r.t_typical, (4.0 + 5.0) / 2.0 / 2.0);
        assert_eq!(r.t_avg, 4.5 / 2.0);
        assert!(r.t_stdev > 0.0);
        assert!(lat_row(&[0, 1, 2], 1.0, 8).is_none());
    }

    #[test]
    fn rows_format_like_perftest() {
        let r = Row::Bw(BwRow {
            bytes: 65536,
            iterations: 5000,
            bw_peak: 1234.5,
            bw_average: 1200.25,
            msg_rate_mpps: 0.019204,
        });
        assert_eq!(
            r.text(),
            " 65536      5000             1234.50            1200.25\t\t     0.019204"
        );
        let l = Row::Lat(LatRow {
            bytes: 2,
            iterations: 1000,
            t_min: 5.14,
            t_max: 20.38,
            t_typical: 5.37,
            t_avg: 5.48,
            t_stdev: 0.54,
            p99: 6.82,
            p99_9: 20.38,
        });
        assert_eq!(
            l.text(),
            " 2       1000          5.14           20.38        5.37     \t       5.48        \t0.54   \t\t6.82    \t\t20.38  "
        );
    }

    #[test]
    fn peak_is_the_best_stretch() {
        // 4 messages posted at 0,10,20,30; completions after 2 (at 100) and 4 (at 120).
        let p = [0, 10, 20, 30];
        let c = [(2, 100), (4, 120)];
        let best = peak_ns_per_msg(&p, &c).unwrap();
        // From post 0 to the completion of all 4 (t=120): 120 ns / 4 msgs.
        assert_eq!(best, 30.0);
    }
}
