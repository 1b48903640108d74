//! `softrdma perf reg_mr`: what memory registration costs.
//!
//! Three measurements, each printed as a table:
//!
//! 1. Registration and deregistration time by size, for the three ways a
//!    region comes to be: *pinned* (`Pd::register_raw`: every page faulted
//!    in), *shared* (`Pd::register_raw_shared`, what `ibv_reg_mr` does on a
//!    device with a same-host path: the pages are also moved into a memfd
//!    so that local peers can be granted them, which copies them), and
//!    *odp* (`Pd::register_odp`: nothing is done until an access).
//!    The buffer is one the program has written already (as it would be),
//!    a fresh one per size.
//! 2. The first-touch cost of ODP: the latency of an RDMA WRITE into
//!    memory nobody has touched, the first time and then again, for an
//!    ODP target region and a pinned one (over UDP, both the same path).
//! 3. Register-per-transfer against a reused pool: a loop that registers
//!    its source buffer, WRITEs it and deregisters it, against the same
//!    WRITEs from a buffer registered once.
//!
//! `--svg FILE` draws table 1 as a log-log plot.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use softrdma::shm::Transport;
use softrdma::{
    AccessFlags, ConnectOptions, Context, Cq, DeviceConfig, Mr, Pd, Qp, QpType, SendOp, SendWr,
};

/// `softrdma perf reg_mr`.
#[derive(Debug, Parser)]
#[command(
    name = "softrdma perf reg_mr",
    about = "Memory registration cost: pinned, shared and ODP"
)]
pub struct Args {
    /// Largest region size measured (sizes go from 4 KiB up by 4x).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub max_size: usize,
    /// Registrations per size (fewer for the largest sizes: at most 256 MiB
    /// of registrations per size and kind, at least 3).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Transfers per loop in the register-per-transfer comparison.
    #[arg(long, default_value_t = 200)]
    pub transfers: usize,
    /// Draw the registration table as an SVG plot into this file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1usize << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let v = n.checked_mul(mult).ok_or("size overflows")?;
    if !(4096..=(4usize << 30)).contains(&v) {
        return Err("sizes go from 4K to 4G".into());
    }
    Ok(v)
}

const PAGE: usize = 4096;

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// An anonymous private mapping (page-aligned, so the shared kind can move it).
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Self, String> {
        // SAFETY: a fresh anonymous mapping, owned by the returned value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes failed"));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
    /// Writes every page, as a program that filled its buffer has.
    fn touch(&self) {
        for off in (0..self.len).step_by(PAGE) {
            // SAFETY: inside the mapping.
            unsafe { self.ptr.add(off).write_volatile(1) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once, after every
        // region over it was dropped (the regions are dropped first).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Pinned,
    Shared,
    Odp,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Pinned, Kind::Shared, Kind::Odp];
    fn name(self) -> &'static str {
        match self {
            Kind::Pinned => "pinned",
            Kind::Shared => "shared",
            Kind::Odp => "odp",
        }
    }
    fn register(self, pd: &Pd, m: &Mapping) -> Result<Mr, String> {
        // SAFETY: the mapping outlives the region (each caller drops the
        // region before the mapping); nobody else writes it meanwhile.
        let r = unsafe {
            match self {
                Kind::Pinned => pd.register_raw(m.ptr, m.len, m.ptr as u64, access()),
                Kind::Shared => pd.register_raw_shared(m.ptr, m.len, m.ptr as u64, access()),
                Kind::Odp => pd.register_odp(m.ptr, m.len, m.ptr as u64, access()),
            }
        };
        r.map_err(|e| format!("{} registration of {} bytes: {e}", self.name(), m.len))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One row of table 1: median registration and deregistration time in
/// microseconds, by kind.
struct RegRow {
    size: usize,
    reg: [f64; 3],
    dereg: [f64; 3],
}

fn reg_table(pd: &Pd, args: &Args) -> Result<Vec<RegRow>, String> {
    let mut rows = Vec::new();
    let mut size = 4096usize;
    println!("Registration and deregistration time (median, microseconds)");
    println!(
        " {:>10} {:>6}  {:>12} {:>12}  {:>12} {:>12}  {:>12} {:>12}",
        "#bytes", "iters", "pinned reg", "dereg", "shared reg", "dereg", "odp reg", "dereg"
    );
    while size <= args.max_size {
        let iters = args.iters.min((256usize << 20) / size).max(3);
        let m = Mapping::new(size)?;
        m.touch();
        let mut row = RegRow {
            size,
            reg: [0.0; 3],
            dereg: [0.0; 3],
        };
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            let (mut r, mut d) = (Vec::new(), Vec::new());
            for _ in 0..iters {
                let t = Instant::now();
                let mr = kind.register(pd, &m)?;
                r.push(us(t.elapsed()));
                let t = Instant::now();
                drop(mr);
                d.push(us(t.elapsed()));
            }
            row.reg[k] = median(&mut r);
            row.dereg[k] = median(&mut d);
        }
        println!(
            " {:>10} {:>6}  {:>12.2} {:>12.2}  {:>12.2} {:>12.2}  {:>12.2} {:>12.2}",
            size,
            iters,
            row.reg[0],
            row.dereg[0],
            row.reg[1],
            row.dereg[1],
            row.reg[2],
            row.dereg[2]
        );
        rows.push(row);
        size = match size.checked_mul(4) {
            Some(s) => s,
            None => break,
        };
    }
    Ok(rows)
}

/// Two UDP devices on loopback with a connected RC pair, A → B.
struct Link {
    pa: Pd,
    pb: Pd,
    ca: Cq,
    qa: Qp,
    _keep: (Context, Context, Cq, Qp),
}

fn link() -> Result<Link, String> {
    let e = |e: softrdma::Error| e.to_string();
    let mut cfg = DeviceConfig::default_loopback();
    cfg.transport = Transport::Udp;
    let a = Context::open_with(&cfg).map_err(e)?;
    let b = Context::open_with(&cfg).map_err(e)?;
    let (pa, pb) = (a.alloc_pd().map_err(e)?, b.alloc_pd().map_err(e)?);
    let (ca, cb) = (a.create_cq(64).map_err(e)?, b.create_cq(64).map_err(e)?);
    let qa = pa.create_qp(QpType::Rc, &ca, &ca).build().map_err(e)?;
    let qb = pb.create_qp(QpType::Rc, &cb, &cb).build().map_err(e)?;
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .map_err(e)?;
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .map_err(e)?;
    Ok(Link {
        pa,
        pb,
        ca,
        qa,
        _keep: (a, b, cb, qb),
    })
}

impl Link {
    /// One RDMA WRITE of `len` bytes from `src` to `dst` + `off`, waited for.
    fn write(&self, src: &Mr, dst: &Mr, off: u64, len: usize) -> Result<Duration, String> {
        let t = Instant::now();
        self.qa
            .post_send(&SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: dst.addr() + off,
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, len as u32)],
            ))
            .map_err(|e| e.to_string())?;
        self.ca
            .wait_ok(Duration::from_secs(30))
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed())
    }
}

/// Minor page faults of this process so far (both devices live in it).
fn minor_faults() -> u64 {
    // SAFETY: getrusage writes the struct we pass, nothing else.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt as u64
    }
}

/// Table 2: first-touch and steady-state WRITE latency into ODP and pinned
/// target regions, and the page faults each WRITE took. Round `r` writes
/// the fresh, untouched span `r` (first touch) and then the same span again
/// (steady state), so both see the same machine; medians over the rounds.
fn first_touch(l: &Link, args: &Args) -> Result<(), String> {
    println!();
    println!("RDMA WRITE into untouched memory: first touch vs steady state (median microseconds and page faults per WRITE, UDP)");
    println!(
        " {:>10}  {:>10} {:>10} {:>7} {:>7}  {:>10} {:>10} {:>7} {:>7}",
        "#bytes",
        "odp first",
        "steady",
        "faults",
        "steady",
        "pin first",
        "steady",
        "faults",
        "steady"
    );
    let rounds = 15usize;
    for size in [4096usize, 65536, 1 << 20] {
        if size > args.max_size {
            break;
        }
        let src_map = Mapping::new(size)?;
        src_map.touch();
        let src = Kind::Pinned.register(&l.pa, &src_map)?;
        let mut cells = Vec::new();
        for kind in [Kind::Odp, Kind::Pinned] {
            let m = Mapping::new(size * rounds)?;
            let dst = kind.register(&l.pb, &m)?;
            let (mut first, mut steady) = (Vec::new(), Vec::new());
            let (mut ff, mut sf) = (Vec::new(), Vec::new());
            for r in 0..rounds {
                let off = (r * size) as u64;
                for (t, f) in [(&mut first, &mut ff), (&mut steady, &mut sf)] {
                    let f0 = minor_faults();
                    t.push(us(l.write(&src, &dst, off, size)?));
                    f.push(minor_faults().saturating_sub(f0) as f64);
                }
            }
            cells.extend([
                median(&mut first),
                median(&mut steady),
                median(&mut ff),
                median(&mut sf),
            ]);
            drop(dst);
        }
        println!(
            " {:>10}  {:>10.2} {:>10.2} {:>7} {:>7}  {:>10.2} {:>10.2} {:>7} {:>7}",
            size, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], cells[7]
        );
    }
    Ok(())
}

/// Table 3: register-per-transfer against a pool registered once. The
/// three loops are interleaved transfer by transfer (so that they share
/// whatever else the machine does), and each cell is the median time of
/// one transfer, registration and deregistration included where the loop
/// has them.
fn per_transfer(l: &Link, args: &Args) -> Result<(), String> {
    println!();
    println!(
        "Register per transfer vs a reused pool: {} RDMA WRITEs each (median microseconds per transfer, UDP)",
        args.transfers
    );
    println!(
        " {:>10}  {:>12} {:>14} {:>10}  {:>14} {:>10}",
        "#bytes", "pool", "pinned/xfer", "lost", "odp/xfer", "lost"
    );
    let dst_map = Mapping::new(args.max_size.min(16 << 20))?;
    let dst = Kind::Pinned.register(&l.pb, &dst_map)?;
    for size in [4096usize, 65536, 1 << 20, 16 << 20] {
        if size > args.max_size {
            break;
        }
        let m = Mapping::new(size)?;
        m.touch();
        let n = args.transfers.min((1usize << 30) / size).max(3);
        let pool = Kind::Pinned.register(&l.pa, &m)?;
        let (mut p, mut pin, mut odp) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            p.push(us(l.write(&pool, &dst, 0, size)?));
            for (kind, v) in [(Kind::Pinned, &mut pin), (Kind::Odp, &mut odp)] {
                let t = Instant::now();
                let mr = kind.register(&l.pa, &m)?;
                l.write(&mr, &dst, 0, size)?;
                drop(mr);
                v.push(us(t.elapsed()));
            }
        }
        drop(pool);
        let (p, pin, odp) = (median(&mut p), median(&mut pin), median(&mut odp));
        println!(
            " {:>10}  {:>12.2} {:>14.2} {:>9.0}%  {:>14.2} {:>9.0}%",
            size,
            p,
            pin,
            100.0 * (pin - p) / p,
            odp,
            100.0 * (odp - p) / p
        );
    }
    Ok(())
}

fn svg(path: &std::path::Path, rows: &[RegRow]) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| format!("plot: {e}");
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = rows.last().map_or(4096.0, |r| r.size as f64);
    let ymax = rows
        .iter()
        .flat_map(|r| r.reg.iter().chain(&r.dereg))
        .fold(1.0f64, |a, &b| a.max(b));
    let ymin = rows
        .iter()
        .flat_map(|r| r.reg.iter().chain(&r.dereg))
        .fold(f64::MAX, |a, &b| a.min(b))
        .max(0.01);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "softrdma: memory registration time by size",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (4096.0f64..xmax * 1.2).log_scale(),
            (ymin * 0.5..ymax * 2.0).log_scale(),
        )
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("region size (bytes)")
        .y_desc("time (microseconds, median)")
        .x_label_formatter(&|v| human(*v))
        .draw()
        .map_err(|x| e(&x))?;
    let colors = [RED, BLUE, GREEN];
    for (k, kind) in Kind::ALL.into_iter().enumerate() {
        let c = colors[k];
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.size as f64, r.reg[k])),
                c.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(format!("{} ibv_reg_mr", kind.name()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.size as f64, r.dereg[k])),
                c.stroke_width(1),
            ))
            .map_err(|x| e(&x))?
            .label(format!("{} ibv_dereg_mr", kind.name()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

fn human(v: f64) -> String {
    let v = v as u64;
    match v {
        v if v >= 1 << 30 => format!("{}G", v >> 30),
        v if v >= 1 << 20 => format!("{}M", v >> 20),
        v if v >= 1 << 10 => format!("{}K", v >> 10),
        v => v.to_string(),
    }
}

/// Runs the benchmark.
pub fn run(args: &Args) -> ExitCode {
    let r = (|| -> Result<(), String> {
        let l = link()?;
        // The registration table on a device with the same-host path (the
        // default), so that the shared kind moves pages as ibv_reg_mr does.
        let ctx =
            Context::open_with(&DeviceConfig::default_loopback()).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let rows = reg_table(&pd, args)?;
        if let Some(p) = &args.svg {
            svg(p, &rows)?;
            println!("plot written to {}", p.display());
        }
        first_touch(&l, args)?;
        per_transfer(&l, args)?;
        Ok(())
    })();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma perf reg_mr: {e}");
            ExitCode::from(2)
        }
    }
}
