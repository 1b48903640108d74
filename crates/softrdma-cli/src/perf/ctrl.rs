//! The TCP control connection between the two ends of a perf test: one
//! text line per message. It carries the client's parameters, the QP
//! descriptions (`softrdma::cm::ConnInfo` lines), and a barrier before and
//! after each message size. Lines are split from one buffer we own, so a
//! quick peer's next line is never lost, and the server can look for the
//! client's "done" without blocking.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One end of the control connection.
pub struct Ctrl {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Ctrl {
    /// Wraps a connected stream.
    pub fn new(s: TcpStream) -> Result<Ctrl, String> {
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Ctrl { s, buf: Vec::new() })
    }

    /// Sends one line.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let mut b = Vec::with_capacity(line.len() + 1);
        b.extend_from_slice(line.as_bytes());
        b.push(b'\n');
        self.s
            .write_all(&b)
            .map_err(|e| format!("control connection: {e}"))
    }

    fn take_line(&mut self) -> Option<String> {
        let i = self.buf.iter().position(|&b| b == b'\n')?;
        let line: Vec<u8> = self.buf.drain(..=i).collect();
        Some(String::from_utf8_lossy(&line[..i]).into_owned())
    }

    /// Waits for the next line, up to `timeout` (None: as long as it takes;
    /// the peer closing the connection ends the wait with an error).
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<String, String> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(l) = self.take_line() {
                return Ok(l);
            }
            let left = match deadline {
                Some(d) => {
                    let l = d.saturating_duration_since(Instant::now());
                    if l.is_zero() {
                        return Err("control connection: the peer did not answer in time".into());
                    }
                    Some(l)
                }
                None => None,
            };
            self.s.set_nonblocking(false).map_err(|e| e.to_string())?;
            self.s.set_read_timeout(left).map_err(|e| e.to_string())?;
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("control connection: the peer closed it".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("control connection: {e}")),
            }
        }
    }

    /// The next line if one has arrived, without waiting.
    pub fn try_recv(&mut self) -> Result<Option<String>, String> {
        if let Some(l) = self.take_line() {
            return Ok(Some(l));
        }
        self.s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut chunk = [0u8; 4096];
        let r = self.s.read(&mut chunk);
        self.s.set_nonblocking(false).map_err(|e| e.to_string())?;
        match r {
            Ok(0) => Err("control connection: the peer closed it".into()),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(self.take_line())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(None)
            }
            Err(e) => Err(format!("control connection: {e}")),
        }
    }

    /// Waits for a line starting with `word`; a line `error …` from the
    /// peer becomes our error.
    pub fn expect(&mut self, word: &str, timeout: Option<Duration>) -> Result<String, String> {
        let l = self.recv(timeout)?;
        check_word(l, word)
    }
}

/// `l` if it starts with `word`; the peer's message if it is an error line.
pub fn check_word(l: String, word: &str) -> Result<String, String> {
    if let Some(m) = l.strip_prefix("error ") {
        return Err(format!("the other side failed: {m}"));
    }
    match l.strip_prefix(word) {
        Some(rest) if rest.is_empty() || rest.starts_with(' ') => Ok(rest.trim().to_string()),
        _ => Err(format!(
            "control connection: expected {word:?}, got {:?}",
            l.chars().take(120).collect::<String>()
        )),
    }
}
