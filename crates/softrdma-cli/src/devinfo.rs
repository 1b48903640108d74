//! `softrdma devinfo`: the attributes of softrdma devices, laid out like
//! `ibv_devinfo` (and `ibv_devinfo -v`) so that people who know that tool
//! read it at a glance.
//!
//! Each device is opened only to be queried: opening binds its UDP address
//! (for the default device, the first free 127.0.0.N), which is also what
//! its GID shows. The device is closed before the program exits.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use serde_json::{json, Value};
use softrdma::{Context, DeviceAttr, Gid, Mtu, PortAttr};

/// Options of `softrdma devinfo`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Only this device (default: every device of SOFTRDMA_DEVICES, or srx0).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Also print the device limits and the port's details, like `ibv_devinfo -v`.
    #[arg(short, long)]
    verbose: bool,
    /// Only list the device names.
    #[arg(short, long)]
    list: bool,
    /// One JSON object with every device (all attributes, as with -v).
    #[arg(long)]
    json: bool,
}

pub(crate) struct Info {
    pub name: String,
    pub addr: std::net::SocketAddr,
    pub gid: Gid,
    pub dev: DeviceAttr,
    pub port: PortAttr,
}

pub(crate) fn query(ctx: &Context) -> Info {
    Info {
        name: ctx.name().to_string(),
        addr: ctx.addr(),
        gid: ctx.gid(),
        dev: ctx.query_device(),
        port: ctx.query_port(),
    }
}

/// `xxxx:xxxx:xxxx:xxxx`, as ibv_devinfo prints GUIDs.
fn guid(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The GID as eight groups of four hex digits.
pub fn gid_str(g: &Gid) -> String {
    g.0.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m.to_ibv())
}

pub(crate) fn port_state(s: u32) -> &'static str {
    match s {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        4 => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

pub(crate) fn width(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

pub(crate) fn speed(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        _ => "invalid speed",
    }
}

pub(crate) fn phys_state(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        _ => "invalid physical state",
    }
}

pub(crate) fn link_layer(l: u8) -> &'static str {
    match l {
        2 => "Ethernet",
        _ => "InfiniBand",
    }
}

fn text(i: &Info, verbose: bool) -> String {
    let d = &i.dev;
    let p = &i.port;
    let mut o = String::new();
    let _ = writeln!(o, "hca_id:\t{}", i.name);
    let _ = writeln!(o, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(o, "\tfw_ver:\t\t\t\t{}", d.fw_ver);
    let _ = writeln!(o, "\tnode_guid:\t\t\t{}", guid(d.node_guid));
    let _ = writeln!(o, "\tsys_image_guid:\t\t\t{}", guid(d.sys_image_guid));
    let _ = writeln!(o, "\tvendor_id:\t\t\t0x{:04x}", d.vendor_id);
    let _ = writeln!(o, "\tvendor_part_id:\t\t\t{}", d.vendor_part_id);
    let _ = writeln!(o, "\thw_ver:\t\t\t\t0x{:X}", d.hw_ver);
    let _ = writeln!(o, "\tphys_port_cnt:\t\t\t{}", d.phys_port_cnt);
    if verbose {
        let _ = writeln!(o, "\tmax_mr_size:\t\t\t0x{:x}", d.max_mr_size);
        let _ = writeln!(o, "\tpage_size_cap:\t\t\t0x{:x}", d.page_size_cap);
        let _ = writeln!(o, "\tmax_qp:\t\t\t\t{}", d.max_qp);
        let _ = writeln!(o, "\tmax_qp_wr:\t\t\t{}", d.max_qp_wr);
        let _ = writeln!(o, "\tmax_sge:\t\t\t{}", d.max_sge);
        let _ = writeln!(o, "\tmax_cq:\t\t\t\t{}", d.max_cq);
        let _ = writeln!(o, "\tmax_cqe:\t\t\t{}", d.max_cqe);
        let _ = writeln!(o, "\tmax_mr:\t\t\t\t{}", d.max_mr);
        let _ = writeln!(o, "\tmax_pd:\t\t\t\t{}", d.max_pd);
        let _ = writeln!(o, "\tmax_qp_rd_atom:\t\t\t{}", d.max_qp_rd_atom);
        let _ = writeln!(o, "\tmax_qp_init_rd_atom:\t\t{}", d.max_qp_init_rd_atom);
        let atomic = if d.atomic_cap == 1 {
            "ATOMIC_HCA"
        } else {
            "ATOMIC_NONE"
        };
        let _ = writeln!(o, "\tatomic_cap:\t\t\t{atomic} ({})", d.atomic_cap);
        let _ = writeln!(o, "\tmax_srq:\t\t\t{}", d.max_srq);
        let _ = writeln!(o, "\tmax_srq_wr:\t\t\t{}", d.max_srq_wr);
        let _ = writeln!(o, "\tmax_srq_sge:\t\t\t{}", d.max_srq_sge);
        let _ = writeln!(o, "\tmax_inline_data:\t\t{}", d.max_inline_data);
        let _ = writeln!(o, "\tmax_pkeys:\t\t\t{}", p.pkey_tbl_len);
    }
    let _ = writeln!(o, "\t\tport:\t1");
    let _ = writeln!(o, "\t\t\tstate:\t\t\t{} ({})", port_state(p.state), p.state);
    let _ = writeln!(o, "\t\t\tmax_mtu:\t\t{}", mtu(p.max_mtu));
    let _ = writeln!(o, "\t\t\tactive_mtu:\t\t{}", mtu(p.active_mtu));
    let _ = writeln!(o, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(o, "\t\t\tport_lid:\t\t{}", p.lid);
    let _ = writeln!(o, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(o, "\t\t\tlink_layer:\t\t{}", link_layer(p.link_layer));
    if verbose {
        let _ = writeln!(o, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
        let _ = writeln!(o, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        let _ = writeln!(o, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        let _ = writeln!(
            o,
            "\t\t\tactive_width:\t\t{}X ({})",
            width(p.active_width),
            p.active_width
        );
        let _ = writeln!(
            o,
            "\t\t\tactive_speed:\t\t{} ({})",
            speed(p.active_speed),
            p.active_speed
        );
        let _ = writeln!(
            o,
            "\t\t\tphys_state:\t\t{} ({})",
            phys_state(p.phys_state),
            p.phys_state
        );
        let _ = writeln!(o, "\t\t\tlink_mtu:\t\t{}", p.link_mtu);
    }
    let _ = writeln!(o, "\t\t\tudp_address:\t\t{}", i.addr);
    let _ = writeln!(o, "\t\t\tGID[  0]:\t\t{}, RoCE v2", gid_str(&i.gid));
    o.push('\n');
    o
}

fn to_json(i: &Info) -> Value {
    let d = &i.dev;
    let p = &i.port;
    let port = json!({
        "port": 1,
        "state": port_state(p.state),
        "state_num": p.state,
        "max_mtu": p.max_mtu.bytes(),
        "active_mtu": p.active_mtu.bytes(),
        "link_layer": link_layer(p.link_layer),
        "lid": p.lid,
        "max_msg_sz": p.max_msg_sz,
        "pkey_tbl_len": p.pkey_tbl_len,
        "gid_tbl_len": p.gid_tbl_len,
        "active_width": p.active_width,
        "active_speed": p.active_speed,
        "phys_state": p.phys_state,
        "link_mtu": p.link_mtu,
        "udp_address": i.addr.to_string(),
        "gids": [{"index": 0, "gid": gid_str(&i.gid), "type": "RoCE v2"}],
    });
    let mut v = json!({
        "hca_id": i.name,
        "transport": "InfiniBand",
        "fw_ver": d.fw_ver,
        "node_guid": guid(d.node_guid),
        "sys_image_guid": guid(d.sys_image_guid),
        "vendor_id": d.vendor_id,
        "vendor_part_id": d.vendor_part_id,
        "hw_ver": d.hw_ver,
        "phys_port_cnt": d.phys_port_cnt,
        "max_mr_size": d.max_mr_size,
        "page_size_cap": d.page_size_cap,
        "max_qp": d.max_qp,
        "max_qp_wr": d.max_qp_wr,
        "max_sge": d.max_sge,
        "max_cq": d.max_cq,
        "max_cqe": d.max_cqe,
        "max_mr": d.max_mr,
        "max_pd": d.max_pd,
    });
    let more = json!({
        "max_qp_rd_atom": d.max_qp_rd_atom,
        "max_qp_init_rd_atom": d.max_qp_init_rd_atom,
        "atomic_cap": d.atomic_cap,
        "max_srq": d.max_srq,
        "max_srq_wr": d.max_srq_wr,
        "max_srq_sge": d.max_srq_sge,
        "max_inline_data": d.max_inline_data,
        "ports": [port],
    });
    if let (Some(a), Value::Object(b)) = (v.as_object_mut(), more) {
        a.extend(b);
    }
    v
}

/// Runs `softrdma devinfo`.
pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    let list = match crate::hosts::devices(devices) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma devinfo: {e}");
            return ExitCode::from(1);
        }
    };
    let chosen: Vec<_> = match &args.device {
        Some(name) => match list.iter().find(|d| &d.name == name) {
            Some(d) => vec![d.clone()],
            None => {
                let e = softrdma::config::select(&list, name).err();
                eprintln!(
                    "softrdma devinfo: IB device '{name}' wasn't found: {}",
                    e.map(|e| e.to_string()).unwrap_or_default()
                );
                return ExitCode::from(1);
            }
        },
        None => list,
    };
    if args.list && !args.json {
        let n = chosen.len();
        println!("{n} HCA{} found:", if n == 1 { "" } else { "s" });
        for d in &chosen {
            println!("\t{}", d.name);
        }
        println!();
        return ExitCode::SUCCESS;
    }
    let mut failed = false;
    let mut infos = Vec::new();
    for cfg in &chosen {
        match Context::open_with(cfg) {
            Ok(ctx) => infos.push(query(&ctx)),
            Err(e) => {
                eprintln!("softrdma devinfo: {}: {e}", cfg.name);
                failed = true;
            }
        }
    }
    if args.json {
        let v = json!({ "devices": infos.iter().map(to_json).collect::<Vec<_>>() });
        println!("{v}");
    } else {
        for i in &infos {
            print!("{}", text(i, args.verbose));
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_guids_and_gids() {
        assert_eq!(guid(0x0250_56ff_7f00_0002), "0250:56ff:7f00:0002");
        let g = Gid::from_ip("127.0.0.2".parse().unwrap());
        assert_eq!(gid_str(&g), "0000:0000:0000:0000:0000:ffff:7f00:0002");
    }
}
