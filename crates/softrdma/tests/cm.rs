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

#[test]
fn connect_failure_names_the_address_and_the_time_waited() {
    // A port with no listener: bind one, note its port, close it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mine = ConnInfo::from_line(LINE).unwrap();
    let e = cm::connect(("127.0.0.1", port), &mine, Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "cannot connect to the peer at 127.0.0.1:{port} after trying for 0."
        )) && e.contains("Connection refused"),
        "{e}"
    );
}

#[test]
fn a_path_mtu_above_both_ends_is_refused_at_connect() {
    use softrdma::{ConnectOptions, Context, DeviceConfig, Mtu, QpType};
    let ctx = Context::open_with(&DeviceConfig::default_loopback()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let peer = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    // The peer says its MTU is 1024 (a 1500-byte Ethernet); we ask for 4096.
    let mut remote = peer.endpoint();
    remote.mtu = Mtu::Mtu1024;
    let o = ConnectOptions {
        mtu: Some(Mtu::Mtu4096),
        ..ConnectOptions::default()
    };
    let e = qp.connect(&remote, &o).unwrap_err().to_string();
    assert!(
        e.contains("path MTU 4096 is larger than the MTU both ends support (1024")
            && e.contains("the peer's 1024")
            && e.contains("connect with an MTU of 1024 or less"),
        "{e}"
    );
    // Nothing changed: the QP connects with an MTU both ends support.
    let o = ConnectOptions {
        mtu: Some(Mtu::Mtu1024),
        ..ConnectOptions::default()
    };
    qp.connect(&remote, &o).unwrap();
}

#[test]
fn a_loopback_gid_is_not_offered_to_another_host() {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // Loopback GID, remote peer: refused; same host or loopback peer: fine.
    assert!(cm::unreachable_gid(
        ip("127.0.0.2"),
        ip("10.0.0.1"),
        ip("10.0.0.2")
    ));
    assert!(cm::unreachable_gid(ip("::1"), ip("fd00::1"), ip("fd00::2")));
    assert!(!cm::unreachable_gid(
        ip("127.0.0.2"),
        ip("127.0.0.1"),
        ip("127.0.0.1")
    ));
    assert!(!cm::unreachable_gid(
        ip("127.0.0.2"),
        ip("10.0.0.1"),
        ip("10.0.0.1")
    ));
    assert!(!cm::unreachable_gid(
        ip("10.0.0.1"),
        ip("10.0.0.1"),
        ip("10.0.0.2")
    ));
}
