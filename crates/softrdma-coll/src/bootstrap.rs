//! Bootstrap: ranks meet at a TCP rendezvous address (rank 0 listens),
//! send their hello line (world size, slot geometry, receive region, one
//! QP endpoint per peer), and get back every rank's line. Then every rank
//! connects its QPs and a last round trip ("ready"/"go") makes sure no
//! rank writes before all QPs are connected.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::net::Hello;
use crate::Error;

/// Where the ranks meet.
#[derive(Debug)]
pub enum Rendezvous {
    /// Rank 0 listens on this address; the others connect to it.
    Addr(SocketAddr),
    /// Rank 0 already holds the listening socket (tests: a free port).
    Listener(TcpListener),
}

/// Rank, size and rendezvous as a launcher gives them.
#[derive(Debug)]
pub struct Launch {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Where they meet.
    pub rendezvous: SocketAddr,
    /// Which launcher's variables were read.
    pub source: &'static str,
}

const MAX_LINE: u64 = 1 << 20;
/// Ranks allowed in one communicator (bounds every table read from peers).
pub const MAX_RANKS: usize = 4096;

fn var(get: &dyn Fn(&str) -> Option<String>, k: &str) -> Option<String> {
    get(k).filter(|v| !v.is_empty())
}

fn num(get: &dyn Fn(&str) -> Option<String>, k: &str) -> Result<Option<usize>, Error> {
    match var(get, k) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| Error::Bootstrap(format!("{k}={v:?} is not a number"))),
    }
}

fn resolve(host: &str, port: u16, what: &str) -> Result<SocketAddr, Error> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::Bootstrap(format!("{what} {host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| Error::Bootstrap(format!("{what} {host}:{port} resolves to nothing")))
}

fn parse_addr(v: &str, what: &str) -> Result<SocketAddr, Error> {
    if let Ok(a) = v.parse() {
        return Ok(a);
    }
    let (h, p) = v
        .rsplit_once(':')
        .ok_or_else(|| Error::Bootstrap(format!("{what}={v:?} is not HOST:PORT")))?;
    let p: u16 = p
        .parse()
        .map_err(|_| Error::Bootstrap(format!("{what}={v:?}: bad port")))?;
    resolve(h, p, what)
}

impl Launch {
    /// Reads the launcher's variables from the environment: Open MPI
    /// (`OMPI_COMM_WORLD_RANK`/`_SIZE`, rendezvous from
    /// `SOFTRDMA_COLL_ADDR`, else 127.0.0.1 and a port derived from the
    /// job's `PMIX_NAMESPACE`/`OMPI_MCA_orte_hnp_uri`), torchrun
    /// (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), or
    /// softrdma's own (`SOFTRDMA_COLL_RANK`, `_SIZE`, `_ADDR`).
    pub fn from_env() -> Result<Option<Launch>, Error> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }

    /// As [`Launch::from_env`] with the variables from `get`.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Launch>, Error> {
        let check = |rank: usize, size: usize, src: &str| -> Result<(), Error> {
            if size == 0 || size > MAX_RANKS || rank >= size {
                return Err(Error::Bootstrap(format!(
                    "{src}: rank {rank} of world size {size} (1..={MAX_RANKS} ranks)"
                )));
            }
            Ok(())
        };
        let explicit = var(get, "SOFTRDMA_COLL_ADDR")
            .map(|v| parse_addr(&v, "SOFTRDMA_COLL_ADDR"))
            .transpose()?;
        if let (Some(r), Some(s)) = (
            num(get, "SOFTRDMA_COLL_RANK")?,
            num(get, "SOFTRDMA_COLL_SIZE")?,
        ) {
            check(r, s, "SOFTRDMA_COLL_RANK/SIZE")?;
            let rendezvous = explicit.ok_or_else(|| {
                Error::Bootstrap("SOFTRDMA_COLL_RANK is set but SOFTRDMA_COLL_ADDR is not".into())
            })?;
            return Ok(Some(Launch {
                rank: r,
                size: s,
                rendezvous,
                source: "softrdma",
            }));
        }
        if let (Some(r), Some(s)) = (
            num(get, "OMPI_COMM_WORLD_RANK")?,
            num(get, "OMPI_COMM_WORLD_SIZE")?,
        ) {
            check(r, s, "OMPI_COMM_WORLD_RANK/SIZE")?;
            let rendezvous = match explicit {
                Some(a) => a,
                None => {
                    // One host: every rank derives the same port from the job id.
                    let job = var(get, "PMIX_NAMESPACE")
                        .or_else(|| var(get, "OMPI_MCA_orte_hnp_uri"))
                        .or_else(|| var(get, "OMPI_MCA_ess_base_jobid"))
                        .ok_or_else(|| {
                            Error::Bootstrap(
                                "mpirun job without SOFTRDMA_COLL_ADDR and without a job id \
                                 (PMIX_NAMESPACE) to derive a rendezvous port from"
                                    .into(),
                            )
                        })?;
                    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                    });
                    SocketAddr::from(([127, 0, 0, 1], 20000 + (h % 20000) as u16))
                }
            };
            return Ok(Some(Launch {
                rank: r,
                size: s,
                rendezvous,
                source: "mpirun",
            }));
        }
        if let (Some(r), Some(s)) = (num(get, "RANK")?, num(get, "WORLD_SIZE")?) {
            check(r, s, "RANK/WORLD_SIZE")?;
            let host = var(get, "MASTER_ADDR").ok_or_else(|| {
                Error::Bootstrap("RANK/WORLD_SIZE set but MASTER_ADDR is not".into())
            })?;
            let port = var(get, "MASTER_PORT")
                .ok_or_else(|| Error::Bootstrap("MASTER_ADDR set but MASTER_PORT is not".into()))?;
            let port: u16 = port
                .trim()
                .parse()
                .map_err(|_| Error::Bootstrap(format!("MASTER_PORT={port:?} is not a port")))?;
            // torchrun's own store listens on MASTER_PORT: meet one above it.
            let port = port.checked_add(1).ok_or_else(|| {
                Error::Bootstrap("MASTER_PORT 65535 leaves no port above it".into())
            })?;
            let rendezvous = resolve(&host, port, "MASTER_ADDR/MASTER_PORT")?;
            return Ok(Some(Launch {
                rank: r,
                size: s,
                rendezvous,
                source: "torchrun",
            }));
        }
        Ok(None)
    }
}

fn read_line(r: &mut BufReader<TcpStream>, what: &str) -> Result<String, Error> {
    let mut s = String::new();
    let n = r
        .by_ref()
        .take(MAX_LINE)
        .read_line(&mut s)
        .map_err(|e| Error::Bootstrap(format!("reading {what}: {e}")))?;
    if n == 0 || !s.ends_with('\n') {
        return Err(Error::Bootstrap(format!(
            "{what}: connection closed or line too long"
        )));
    }
    s.pop();
    Ok(s)
}

fn write_line(s: &mut TcpStream, line: &str, what: &str) -> Result<(), Error> {
    s.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Error::Bootstrap(format!("sending {what}: {e}")))
}

/// Exchanges hellos: returns every rank's, indexed by rank, and a closure
/// that runs the final ready/go round once the QPs are connected.
pub(crate) struct Exchange {
    streams: Vec<BufReader<TcpStream>>,
    root: bool,
}

impl Exchange {
    pub fn run(
        rdv: Rendezvous,
        mine: &Hello,
        timeout: Duration,
    ) -> Result<(Vec<Hello>, Exchange), Error> {
        let size = mine.size;
        let deadline = Instant::now() + timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        if mine.rank == 0 {
            let listener = match rdv {
                Rendezvous::Listener(l) => l,
                Rendezvous::Addr(a) => TcpListener::bind(a)
                    .map_err(|e| Error::Bootstrap(format!("rank 0 cannot listen on {a}: {e}")))?,
            };
            listener
                .set_nonblocking(true)
                .map_err(|e| Error::Bootstrap(e.to_string()))?;
            let mut table: Vec<Option<Hello>> = (0..size).map(|_| None).collect();
            let mut streams: Vec<Option<BufReader<TcpStream>>> = (0..size).map(|_| None).collect();
            let mut joined = 1;
            while joined < size {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false)
                            .map_err(|e| Error::Bootstrap(e.to_string()))?;
                        s.set_read_timeout(Some(left()))
                            .map_err(|e| Error::Bootstrap(e.to_string()))?;
                        let mut r = BufReader::new(s);
                        let line = read_line(&mut r, "a hello")?;
                        let h = Hello::parse(&line, size)?;
                        if h.rank == 0 || table[h.rank].is_some() {
                            return Err(Error::Bootstrap(format!("rank {} joined twice", h.rank)));
                        }
                        let k = h.rank;
                        streams[k] = Some(r);
                        table[k] = Some(h);
                        joined += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err(Error::Timeout(format!(
                                "rendezvous: {joined} of {size} ranks joined within {timeout:?}"
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(Error::Bootstrap(format!("accept: {e}"))),
                }
            }
            let mut lines = vec![mine.to_line()];
            lines.extend(
                table[1..]
                    .iter()
                    .map(|h| h.as_ref().expect("all joined").to_line()),
            );
            let all = lines.join("\n");
            for s in streams.iter_mut().flatten() {
                write_line(s.get_mut(), &all, "the table")?;
            }
            table[0] = Some(Hello::parse(&lines[0], size)?);
            let table = table.into_iter().map(|h| h.expect("all joined")).collect();
            let streams = streams.into_iter().flatten().collect();
            Ok((
                table,
                Exchange {
                    streams,
                    root: true,
                },
            ))
        } else {
            let addr = match rdv {
                Rendezvous::Addr(a) => a,
                Rendezvous::Listener(l) => l
                    .local_addr()
                    .map_err(|e| Error::Bootstrap(e.to_string()))?,
            };
            let s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(e) => {
                        if Instant::now() > deadline {
                            return Err(Error::Timeout(format!(
                                "rank {}: no rendezvous at {addr} within {timeout:?}: {e}",
                                mine.rank
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            };
            s.set_read_timeout(Some(left()))
                .map_err(|e| Error::Bootstrap(e.to_string()))?;
            let _ = s.set_nodelay(true);
            let mut r = BufReader::new(s);
            write_line(r.get_mut(), &mine.to_line(), "the hello")?;
            let mut table = Vec::with_capacity(size);
            for j in 0..size {
                let h = Hello::parse(&read_line(&mut r, "the table")?, size)?;
                if h.rank != j {
                    return Err(Error::Bootstrap(format!(
                        "table line {j} is rank {}",
                        h.rank
                    )));
                }
                table.push(h);
            }
            if table[mine.rank].to_line() != mine.to_line() {
                return Err(Error::Bootstrap(
                    "the table does not hold this rank's hello".into(),
                ));
            }
            Ok((
                table,
                Exchange {
                    streams: vec![r],
                    root: false,
                },
            ))
        }
    }

    /// The last round: every rank says it is connected, rank 0 says go.
    pub fn finish(mut self) -> Result<(), Error> {
        if self.root {
            for r in &mut self.streams {
                let l = read_line(r, "ready")?;
                if l != "ready" {
                    return Err(Error::Bootstrap(format!("expected ready, got {l:?}")));
                }
            }
            for r in &mut self.streams {
                write_line(r.get_mut(), "go", "go")?;
            }
        } else {
            let r = &mut self.streams[0];
            write_line(r.get_mut(), "ready", "ready")?;
            let l = read_line(r, "go")?;
            if l != "go" {
                return Err(Error::Bootstrap(format!("expected go, got {l:?}")));
            }
        }
        Ok(())
    }
}
