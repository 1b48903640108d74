//! The TCP connection helper (`softrdma::cm`): lines round-trip, and an
//! exchange leaves whatever the peer sent after its line on the stream (a
//! second exchange, a `sync`), so it can be followed by more traffic.

use softrdma::{Qpn, Rkey};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use softrdma::cm::{self, ConnInfo};

const LINE: &str = "softrdma-conn/1 gid=::ffff:127.0.0.9 qpn=0x11 psn=0x5 mtu=4096 qkey=0x1 addr=0x7f0000001000 rkey=0x1234 len=4096";

#[test]
fn conn_line_round_trips() {
    let c = ConnInfo::from_line(LINE).unwrap();
    assert_eq!(c.endpoint.qpn, Qpn::from_raw(0x11));
    assert_eq!(c.region.unwrap().rkey, Rkey::from_raw(0x1234));
    assert_eq!(ConnInfo::from_line(&c.to_line()).unwrap(), c);
    assert!(ConnInfo::from_line("hello").is_err());
}

#[test]
fn exchange_keeps_what_the_peer_sends_after_its_line() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // A peer that sends its line, a second line and a sync byte in one write.
    let peer = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("{LINE}\n{LINE}\nS").as_bytes())
            .unwrap();
        // Wait for our two lines and the sync byte before closing.
        let mut got = Vec::new();
        let mut b = [0u8; 512];
        while !got.ends_with(b"S") {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        got
    });
    let mine = ConnInfo::from_line(LINE).unwrap();
    let (mut s, first) = cm::accept(&l, &mine).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let second = cm::exchange(&mut s, &mine).unwrap();
    assert_eq!((first, second), (mine, mine));
    cm::sync(&mut s).expect("the sync byte sent right after the lines is still there");
    let got = String::from_utf8(peer.join().unwrap()).unwrap();
    assert_eq!(got, format!("{LINE}\n{LINE}\nS"));
}
