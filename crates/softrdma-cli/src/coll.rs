//! `softrdma coll all_reduce_perf` and the other nccl-tests programs, over
//! softrdma-coll: nccl-tests' options and columns, ranks from mpirun or
//! torchrun variables, or `--ranks N` local processes started from here.

use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;
use softrdma_coll::{
    bf16, f16, Algorithm, Communicator, Config, DataType, Element, Launch, ReduceOp, Rendezvous,
};

/// The nccl-tests programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(clippy::enum_variant_names)]
pub enum Test {
    /// All-reduce (busbw = algbw × 2(n−1)/n).
    #[value(name = "all_reduce_perf")]
    AllReducePerf,
    /// Reduce-scatter (busbw = algbw × (n−1)/n).
    #[value(name = "reduce_scatter_perf")]
    ReduceScatterPerf,
    /// All-gather (busbw = algbw × (n−1)/n).
    #[value(name = "all_gather_perf")]
    AllGatherPerf,
    /// Broadcast (busbw = algbw).
    #[value(name = "broadcast_perf")]
    BroadcastPerf,
    /// Reduce (busbw = algbw).
    #[value(name = "reduce_perf")]
    ReducePerf,
    /// All-to-all (busbw = algbw × (n−1)/n).
    #[value(name = "alltoall_perf")]
    AlltoallPerf,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::AllReducePerf => "all_reduce_perf",
            Test::ReduceScatterPerf => "reduce_scatter_perf",
            Test::AllGatherPerf => "all_gather_perf",
            Test::BroadcastPerf => "broadcast_perf",
            Test::ReducePerf => "reduce_perf",
            Test::AlltoallPerf => "alltoall_perf",
        }
    }
    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Test::AllReducePerf => 2.0 * (n - 1.0) / n,
            Test::ReduceScatterPerf | Test::AllGatherPerf | Test::AlltoallPerf => (n - 1.0) / n,
            Test::BroadcastPerf | Test::ReducePerf => 1.0,
        }
    }
    fn reduces(self) -> bool {
        matches!(
            self,
            Test::AllReducePerf | Test::ReduceScatterPerf | Test::ReducePerf
        )
    }
    fn rooted(self) -> bool {
        matches!(self, Test::BroadcastPerf | Test::ReducePerf)
    }
}

/// Where the ranks talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// RoCEv2 over UDP, even on this host.
    Udp,
    /// Shared memory (the same-host path).
    Shm,
    /// Shared memory to peers on this host, UDP otherwise.
    Auto,
}

impl Transport {
    pub(crate) fn lib(self) -> softrdma::shm::Transport {
        match self {
            Transport::Udp => softrdma::shm::Transport::Udp,
            Transport::Shm => softrdma::shm::Transport::Shm,
            Transport::Auto => softrdma::shm::Transport::Auto,
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.as_bytes().last() {
        Some(b'K' | b'k') => (&t[..t.len() - 1], 1usize << 10),
        Some(b'M' | b'm') => (&t[..t.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} overflows"))
}

/// Options: nccl-tests' letters (-b -e -f -n -w -c -d -o -r -z).
#[derive(Debug, Clone, Parser)]
pub struct Args {
    /// The test.
    #[arg(value_enum)]
    pub test: Test,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "128M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Check the results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Data type: float, double, half, bfloat16, int32, int64, uint8.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// 1: in-place only; 0: out-of-place and in-place columns.
    #[arg(short = 'z', default_value_t = 0)]
    pub in_place_only: u8,
    /// Start this many local ranks (processes) instead of joining a
    /// launcher's job (mpirun, torchrun, SOFTRDMA_COLL_*).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Force an algorithm: ring, rhd, tree, innetwork (all-reduce through
    /// --aggd; default: the cost model's choice among the host ones).
    #[arg(long)]
    pub algo: Option<String>,
    /// The in-network aggregation service (`softrdma aggd`) to join.
    #[arg(long, value_name = "HOST:PORT")]
    pub aggd: Option<std::net::SocketAddr>,
    /// Path between the ranks.
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Inject faults on receive, e.g. "loss=0.01,reorder=0.01".
    #[arg(long, value_name = "SPEC")]
    pub fault: Option<String>,
    /// Slot size in bytes.
    #[arg(long, value_parser = parse_size)]
    pub chunk: Option<usize>,
    /// Fix the algorithm choice (bit-identical float results run to run).
    #[arg(long)]
    pub deterministic: bool,
    /// Print JSON (one object) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw busbw against size as SVG: the series of --compare (and of
    /// this run unless --plot-only).
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<std::path::PathBuf>,
    /// A saved table to plot, LABEL=FILE: this command's text output
    /// (in-place busbw) or bench/mpi_allreduce's (size … busbw). Repeatable.
    #[arg(long, value_name = "LABEL=FILE")]
    pub compare: Vec<String>,
    /// Only draw --svg from the --compare tables; run nothing.
    #[arg(long)]
    pub plot_only: bool,
}

/// Reads (size, busbw) from a saved table.
fn read_table(path: &str) -> Result<Vec<(f64, f64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() || f[0].starts_with('#') {
            continue;
        }
        let col = if f.len() >= 12 { 11 } else { 4 };
        let (Some(a), Some(b)) = (f.first(), f.get(col)) else {
            continue;
        };
        if let (Ok(size), Ok(bw)) = (a.parse::<f64>(), b.parse::<f64>()) {
            v.push((size, bw));
        }
    }
    if v.is_empty() {
        return Err(format!("{path}: no rows"));
    }
    Ok(v)
}

fn plot(
    path: &std::path::Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| format!("plot: {e}");
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (xmin, xmax, ymax) = pts.fold((f64::MAX, 1.0f64, 0.01f64), |(a, b, c), &(x, y)| {
        (a.min(x), b.max(x), c.max(y))
    });
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (xmin.max(1.0) * 0.8..xmax * 1.25).log_scale(),
            0.0..ymax * 1.1,
        )
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|v| {
            let v = *v as u64;
            match v {
                v if v >= 1 << 30 => format!("{}G", v >> 30),
                v if v >= 1 << 20 => format!("{}M", v >> 20),
                v if v >= 1 << 10 => format!("{}K", v >> 10),
                v => v.to_string(),
            }
        })
        .draw()
        .map_err(|x| e(&x))?;
    let colors = [
        RED,
        BLUE,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(255, 140, 0),
        RGBColor(128, 0, 128),
    ];
    for (k, (label, pts)) in series.iter().enumerate() {
        let c = colors[k % colors.len()];
        let w = if k < 2 { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(w)))
            .map_err(|x| e(&x))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(w)));
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

/// Labelled (size, busbw) curves.
type Series = Vec<(String, Vec<(f64, f64)>)>;

fn compare_series(args: &Args) -> Result<Series, String> {
    args.compare
        .iter()
        .map(|c| {
            let (l, f) = c
                .split_once('=')
                .ok_or_else(|| format!("--compare {c:?}: want LABEL=FILE"))?;
            Ok((l.to_string(), read_table(f)?))
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct Cell {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
}

#[derive(Debug, Serialize)]
struct Row {
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    dtype: String,
    redop: String,
    root: i64,
    algorithm: String,
    out_of_place: Option<Cell>,
    in_place: Cell,
}

#[derive(Debug, Serialize)]
struct Report {
    test: &'static str,
    nranks: usize,
    transport: String,
    alpha_us: f64,
    bw_gbps: f64,
    reduce_gbps: f64,
    rows: Vec<Row>,
    avg_busbw: f64,
    wrong: u64,
}

struct ChildGuard(Vec<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    match run_inner(args, devices) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("softrdma coll: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &Args, devices: &[String]) -> Result<bool, String> {
    if args.plot_only {
        let svg = args.svg.as_ref().ok_or("--plot-only needs --svg")?;
        plot(
            svg,
            &format!("{} busbw by size", args.test.name()),
            &compare_series(args)?,
        )?;
        return Ok(true);
    }
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let algo: Option<Algorithm> = args.algo.as_deref().map(str::parse).transpose()?;
    if args.step_factor < 2 && args.min_bytes != args.max_bytes {
        return Err("-f must be at least 2".into());
    }
    if args.min_bytes > args.max_bytes || args.max_bytes > 16 << 30 {
        return Err("need -b <= -e <= 16G".into());
    }
    let mut dev = crate::hosts::device(devices, None)?;
    if let Some(t) = args.transport {
        dev = dev.transport(t.lib());
    }
    if let Some(f) = &args.fault {
        dev = dev.fault(f.parse().map_err(|e| format!("--fault: {e}"))?);
    }
    let mut cfg = Config {
        device: dev,
        ..Config::default()
    }
    .with_env()
    .map_err(|e| e.to_string())?;
    if let Some(c) = args.chunk {
        cfg.chunk = Some(c);
    }
    if algo.is_some() {
        cfg.algorithm = algo;
    }
    if args.aggd.is_some() {
        cfg.aggd = args.aggd;
    }
    cfg.deterministic |= args.deterministic;
    let mut guard = ChildGuard(Vec::new());
    let comm = match (args.ranks, Launch::from_env().map_err(|e| e.to_string())?) {
        (Some(n), _) => {
            if n == 0 || n > 64 {
                return Err("--ranks takes 1..64".into());
            }
            let listener =
                TcpListener::bind("127.0.0.1:0").map_err(|e| format!("rendezvous: {e}"))?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
            let argv: Vec<String> = std::env::args().skip(1).collect();
            let mut rest = Vec::new();
            let mut skip = false;
            for a in argv {
                if skip {
                    skip = false;
                } else if a == "--ranks" {
                    skip = true;
                } else if !a.starts_with("--ranks=") {
                    rest.push(a);
                }
            }
            for r in 1..n {
                let child = Command::new(&exe)
                    .args(&rest)
                    .env("SOFTRDMA_COLL_RANK", r.to_string())
                    .env("SOFTRDMA_COLL_SIZE", n.to_string())
                    .env("SOFTRDMA_COLL_ADDR", addr.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .map_err(|e| format!("cannot start rank {r}: {e}"))?;
                guard.0.push(child);
            }
            Communicator::new(0, n, Rendezvous::Listener(listener), cfg)
        }
        (None, Some(l)) => Communicator::new(l.rank, l.size, Rendezvous::Addr(l.rendezvous), cfg),
        (None, None) => Communicator::new(
            0,
            1,
            Rendezvous::Listener(TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?),
            cfg,
        ),
    }
    .map_err(|e| e.to_string())?;
    let ok = match dtype {
        DataType::F32 => bench::<f32>(args, comm, op),
        DataType::F64 => bench::<f64>(args, comm, op),
        DataType::F16 => bench::<f16>(args, comm, op),
        DataType::Bf16 => bench::<bf16>(args, comm, op),
        DataType::I32 => bench::<i32>(args, comm, op),
        DataType::I64 => bench::<i64>(args, comm, op),
        DataType::U8 => bench::<u8>(args, comm, op),
    }?;
    let mut all_ok = ok;
    for mut c in std::mem::take(&mut guard.0) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match c.try_wait() {
                Ok(Some(st)) => {
                    all_ok &= st.success();
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    all_ok = false;
                    break;
                }
            }
        }
    }
    Ok(all_ok)
}

/// Rank `r`'s value at `i`: small integers (exact sums and products in
/// every type, also for 8 ranks in bfloat16).
fn value<T: Element>(op: ReduceOp, r: usize, i: usize) -> T {
    match op {
        ReduceOp::Prod => T::from_f64(((i + r) % 2 + 1) as f64),
        _ => T::from_f64(((i * 7 + r * 3) % 13) as f64),
    }
}

fn expected<T: Element>(op: ReduceOp, n: usize, i: usize) -> f64 {
    let mut acc: T = value(op, 0, i);
    for r in 1..n {
        acc = T::combine(op, acc, value(op, r, i));
    }
    if op == ReduceOp::Avg {
        // As the library does: the sum, then a division in the type.
        acc = acc.div_n(n);
    }
    acc.to_f64()
}

fn count_wrong<T: Element>(got: &[T], want: impl Fn(usize) -> f64, offset: usize) -> u64 {
    got.iter()
        .enumerate()
        .filter(|(i, g)| {
            let w = want(offset + i);
            let d = (g.to_f64() - w).abs();
            d.is_nan() || d > 1e-3 * w.abs().max(1.0)
        })
        .count() as u64
}

fn bench<T: Element>(args: &Args, mut c: Communicator, op: ReduceOp) -> Result<bool, String> {
    let (n, r) = (c.size(), c.rank());
    let test = args.test;
    let es = std::mem::size_of::<T>();
    let e = |x: softrdma_coll::Error| x.to_string();
    if test.rooted() && args.root >= n {
        return Err(format!("-r {} but {n} ranks", args.root));
    }
    let model = c.cost_model();
    let tr = match args.transport {
        Some(Transport::Udp) => "udp",
        Some(Transport::Shm) => "shm",
        _ => "auto",
    };
    let print = r == 0 && !args.json;
    if print {
        println!(
            "# softrdma coll {}: nranks {n}, transport {tr}, device {} ({})",
            test.name(),
            c.context().name(),
            c.context().addr()
        );
        println!(
            "# cost model: alpha {:.2} us, beta {:.3} GB/s, gamma {:.3} GB/s{}",
            model.alpha * 1e6,
            1e-9 / model.beta,
            1e-9 / model.gamma,
            if args.deterministic {
                " (deterministic: fixed model for the choice)"
            } else {
                ""
            }
        );
        if c.in_network() || args.aggd.is_some() {
            println!("# aggregation service: {}", c.aggd_status());
        }
        println!("#");
        println!("#                                                              out-of-place                       in-place          ");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  algo");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)            ");
    }
    let mut rows = Vec::new();
    let mut wrong_total = 0u64;
    let mut bus_sum = 0.0;
    let mut size = args.min_bytes;
    loop {
        // Element counts as nccl-tests: all-gather and reduce-scatter
        // carry `size` in total, `count` per rank.
        let per_rank_split = matches!(
            test,
            Test::AllGatherPerf | Test::ReduceScatterPerf | Test::AlltoallPerf
        );
        let unit = if per_rank_split { es * n } else { es };
        let total = (size / unit) * unit / es;
        let count = if per_rank_split { total / n } else { total };
        let bytes = total * es;
        let mut cells = Vec::new();
        let placements: &[bool] = if args.in_place_only == 1 {
            &[true]
        } else {
            &[false, true]
        };
        let coll = match test {
            Test::AllReducePerf => softrdma_coll::Collective::AllReduce,
            Test::ReduceScatterPerf => softrdma_coll::Collective::ReduceScatter,
            Test::AllGatherPerf => softrdma_coll::Collective::AllGather,
            Test::BroadcastPerf => softrdma_coll::Collective::Broadcast,
            Test::ReducePerf => softrdma_coll::Collective::Reduce,
            Test::AlltoallPerf => softrdma_coll::Collective::AllToAll,
        };
        let alg = if matches!(test, Test::AlltoallPerf) {
            "direct".to_string()
        } else {
            c.algorithm_for(coll, bytes).to_string()
        };
        for &inplace in placements {
            // Inputs.
            let (in_len, out_len) = match test {
                Test::AllReducePerf | Test::BroadcastPerf | Test::ReducePerf => (total, total),
                Test::ReduceScatterPerf => (total, count),
                Test::AllGatherPerf => (count, total),
                Test::AlltoallPerf => (total, total),
            };
            let src: Vec<T> = match test {
                Test::AllGatherPerf => (0..in_len).map(|i| value(op, r, r * count + i)).collect(),
                Test::BroadcastPerf => (0..in_len).map(|i| value(op, args.root, i)).collect(),
                _ => (0..in_len).map(|i| value(op, r, i)).collect(),
            };
            let mut buf: Vec<T> = if inplace {
                vec![T::default(); in_len.max(out_len)]
            } else {
                vec![T::default(); out_len]
            };
            let run_once =
                |c: &mut Communicator, buf: &mut Vec<T>| -> Result<(), softrdma_coll::Error> {
                    if inplace {
                        match test {
                            Test::AllGatherPerf => {
                                buf[r * count..(r + 1) * count].copy_from_slice(&src)
                            }
                            Test::BroadcastPerf if r != args.root => {}
                            _ => buf[..in_len].copy_from_slice(&src),
                        }
                    }
                    match (test, inplace) {
                        (Test::AllReducePerf, false) => c.all_reduce(&src, buf, op),
                        (Test::AllReducePerf, true) => c.all_reduce_in_place(buf, op),
                        (Test::ReduceScatterPerf, false) => c.reduce_scatter(&src, buf, op),
                        (Test::ReduceScatterPerf, true) => c.reduce_scatter_in_place(buf, op),
                        (Test::AllGatherPerf, false) => c.all_gather(&src, buf),
                        (Test::AllGatherPerf, true) => c.all_gather_in_place(buf),
                        (Test::BroadcastPerf, false) => {
                            if r == args.root {
                                buf.copy_from_slice(&src);
                            }
                            c.broadcast(buf, args.root)
                        }
                        (Test::BroadcastPerf, true) => c.broadcast(buf, args.root),
                        (Test::ReducePerf, false) => c.reduce(&src, buf, op, args.root),
                        (Test::ReducePerf, true) => c.reduce_in_place(buf, op, args.root),
                        (Test::AlltoallPerf, _) => {
                            let s = src.clone();
                            c.all_to_all(&s, buf)
                        }
                    }
                };
            for _ in 0..args.warmup {
                run_once(&mut c, &mut buf).map_err(e)?;
            }
            c.barrier().map_err(e)?;
            let t = Instant::now();
            for _ in 0..args.iters.max(1) {
                run_once(&mut c, &mut buf).map_err(e)?;
            }
            let mut secs = [t.elapsed().as_secs_f64() / args.iters.max(1) as f64];
            c.set_algorithm(Some(Algorithm::Rhd));
            c.all_reduce_in_place(&mut secs, ReduceOp::Max).map_err(e)?;
            c.set_algorithm(args.algo.as_deref().map(|a| a.parse().expect("checked")));
            let mut wrong = 0u64;
            if args.check == 1 {
                wrong = match test {
                    Test::AllReducePerf => {
                        count_wrong(&buf[..total], |i| expected::<T>(op, n, i), 0)
                    }
                    Test::ReducePerf if r == args.root => {
                        count_wrong(&buf[..total], |i| expected::<T>(op, n, i), 0)
                    }
                    Test::ReducePerf => 0,
                    Test::ReduceScatterPerf => {
                        let off = if inplace { r * count } else { 0 };
                        count_wrong(
                            &buf[off..off + count],
                            |i| expected::<T>(op, n, i),
                            r * count,
                        )
                    }
                    Test::AllGatherPerf => count_wrong(
                        &buf[..total],
                        |i| value::<T>(op, i / count.max(1), i).to_f64(),
                        0,
                    ),
                    Test::BroadcastPerf => {
                        count_wrong(&buf[..total], |i| value::<T>(op, args.root, i).to_f64(), 0)
                    }
                    Test::AlltoallPerf => count_wrong(
                        &buf[..total],
                        |i| value::<T>(op, i / count.max(1), r * count + i % count.max(1)).to_f64(),
                        0,
                    ),
                };
                let mut w = [wrong as i64];
                c.all_reduce_in_place(&mut w, ReduceOp::Sum).map_err(e)?;
                wrong = w[0] as u64;
            }
            let secs = secs[0];
            let algbw = bytes as f64 / secs / 1e9;
            cells.push(Cell {
                time_us: secs * 1e6,
                algbw,
                busbw: algbw * test.bus_factor(n),
                wrong,
            });
        }
        let ip = cells.pop().expect("in-place cell");
        let oop = cells.pop();
        wrong_total += ip.wrong + oop.as_ref().map_or(0, |c| c.wrong);
        bus_sum += ip.busbw;
        let row = Row {
            size: bytes,
            count,
            dtype: T::DTYPE.to_string(),
            redop: if test.reduces() {
                op.to_string()
            } else {
                "none".into()
            },
            root: if test.rooted() { args.root as i64 } else { -1 },
            algorithm: alg,
            out_of_place: oop,
            in_place: ip,
        };
        if print {
            let fmt = |c: &Cell| {
                let w = if args.check == 1 {
                    c.wrong.to_string()
                } else {
                    "N/A".into()
                };
                format!(
                    "{:>8} {:>7.2} {:>7.2} {:>6}",
                    fmt_time(c.time_us),
                    c.algbw,
                    c.busbw,
                    w
                )
            };
            let oop = row
                .out_of_place
                .as_ref()
                .map_or(format!("{:>8} {:>7} {:>7} {:>6}", "-", "-", "-", "-"), fmt);
            println!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}  {}",
                row.size,
                row.count,
                row.dtype,
                row.redop,
                row.root,
                oop,
                fmt(&row.in_place),
                row.algorithm
            );
        }
        rows.push(row);
        if size >= args.max_bytes {
            break;
        }
        size = size
            .saturating_mul(args.step_factor.max(2))
            .min(args.max_bytes);
    }
    let avg = bus_sum / rows.len().max(1) as f64;
    if r == 0 {
        if let Some(svg) = &args.svg {
            let mut series = vec![(
                format!("softrdma coll ({tr}, in place)"),
                rows.iter()
                    .map(|w| (w.size as f64, w.in_place.busbw))
                    .collect::<Vec<_>>(),
            )];
            series.extend(compare_series(args)?);
            plot(
                svg,
                &format!("{} busbw by size, {n} ranks", test.name()),
                &series,
            )?;
        }
        if args.json {
            let rep = Report {
                test: test.name(),
                nranks: n,
                transport: tr.into(),
                alpha_us: model.alpha * 1e6,
                bw_gbps: 1e-9 / model.beta,
                reduce_gbps: 1e-9 / model.gamma,
                rows,
                avg_busbw: avg,
                wrong: wrong_total,
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&rep).map_err(|e| e.to_string())?
            );
        } else {
            println!(
                "# Out of bounds values : {wrong_total} {}",
                if wrong_total == 0 { "OK" } else { "FAILED" }
            );
            println!("# Avg bus bandwidth    : {avg:.4} ");
            println!("#");
        }
    }
    Ok(wrong_total == 0)
}

/// nccl-tests prints times with 2 decimals below 10 ms, 1 below 100 ms.
fn fmt_time(us: f64) -> String {
    if us < 10_000.0 {
        format!("{us:.2}")
    } else if us < 100_000.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}
