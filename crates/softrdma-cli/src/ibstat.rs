//! `softrdma ibstat` and `softrdma link`: the device and port views of
//! infiniband-diags' `ibstat` and iproute2's `rdma link show`, for people
//! (and scripts) that start a check with those tools.
//!
//! Like `devinfo`, each device is opened just long enough to be queried;
//! the values are those the verbs queries (and the C ABI) report.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use softrdma::{Context, DeviceConfig};

use crate::devinfo::{self, Info};

/// Options of `softrdma ibstat` (ibstat's).
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Only this CA (device).
    ca: Option<String>,
    /// Only this port of the CA (softrdma devices have port 1).
    port: Option<u32>,
    /// List the CA names only.
    #[arg(short = 'l', long = "list_of_cas")]
    list: bool,
    /// Short output: the CAs without their ports.
    #[arg(short = 's', long = "short")]
    short: bool,
    /// List the port GUIDs only.
    #[arg(short = 'p', long = "port_list")]
    port_list: bool,
}

/// Options of `softrdma link` (`rdma link show [DEV[/PORT]]`).
#[derive(Debug, ClapArgs)]
pub struct LinkArgs {
    /// `show` (the only action; optional).
    #[arg(value_parser = ["show", "list"])]
    action: Option<String>,
    /// Only this device, or DEV/PORT.
    dev: Option<String>,
    /// Also show the addresses and MTUs (like `rdma -d link`).
    #[arg(short = 'd', long)]
    details: bool,
}

/// ibstat's port state names.
fn state(s: u32) -> &'static str {
    match s {
        1 => "Down",
        2 => "Initializing",
        3 => "Armed",
        4 => "Active",
        _ => "???",
    }
}

/// ibstat's physical state names.
fn phys(s: u8) -> &'static str {
    match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "No state change",
    }
}

/// The port rate in Gb/s: lanes × lane speed, as ibstat prints it.
fn rate(width: u8, speed: u8) -> String {
    let lanes: f64 = devinfo::width(width).parse().unwrap_or(0.0);
    let gbps: f64 = devinfo::speed(speed)
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let r = lanes * gbps;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r}")
    }
}

/// The port GUID: the node GUID, as a one-port RoCE device reports it.
fn port_guid(i: &Info) -> u64 {
    i.dev.node_guid
}

/// The ibstat text of one CA (all its ports unless `short`).
pub(crate) fn ibstat_text(i: &Info, short: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "CA '{}'", i.name);
    let _ = writeln!(o, "\tCA type: softrdma");
    let _ = writeln!(o, "\tNumber of ports: {}", i.dev.phys_port_cnt);
    let _ = writeln!(o, "\tFirmware version: {}", i.dev.fw_ver);
    let _ = writeln!(o, "\tHardware version: {}", i.dev.hw_ver);
    let _ = writeln!(o, "\tNode GUID: 0x{:016x}", i.dev.node_guid);
    let _ = writeln!(o, "\tSystem image GUID: 0x{:016x}", i.dev.sys_image_guid);
    if !short {
        o.push_str(&port_text(i, "\t", "\t\t"));
    }
    o
}

fn port_text(i: &Info, head: &str, pre: &str) -> String {
    let p = &i.port;
    let mut o = String::new();
    let _ = writeln!(o, "{head}Port 1:");
    let _ = writeln!(o, "{pre}State: {}", state(p.state));
    let _ = writeln!(o, "{pre}Physical state: {}", phys(p.phys_state));
    let _ = writeln!(o, "{pre}Rate: {}", rate(p.active_width, p.active_speed));
    let _ = writeln!(o, "{pre}Base lid: {}", p.lid);
    let _ = writeln!(o, "{pre}LMC: 0");
    let _ = writeln!(o, "{pre}SM lid: 0");
    // What ibv_query_port reports for port_cap_flags.
    let _ = writeln!(o, "{pre}Capability mask: 0x{:08x}", 0);
    let _ = writeln!(o, "{pre}Port GUID: 0x{:016x}", port_guid(i));
    let _ = writeln!(o, "{pre}Link layer: {}", devinfo::link_layer(p.link_layer));
    o
}

/// Opens and queries each device of `list`, reporting failures.
fn infos(list: &[DeviceConfig], tool: &str) -> (Vec<Info>, bool) {
    let mut failed = false;
    let mut v = Vec::new();
    for cfg in list {
        match Context::open_with(cfg) {
            Ok(ctx) => v.push(devinfo::query(&ctx)),
            Err(e) => {
                eprintln!("softrdma {tool}: {}: {e}", cfg.name);
                failed = true;
            }
        }
    }
    (v, failed)
}

fn chosen(devices: &[String], only: Option<&str>) -> Result<Vec<DeviceConfig>, String> {
    let list = crate::hosts::devices(devices)?;
    match only {
        Some(n) => softrdma::config::select(&list, n)
            .map(|d| vec![d])
            .map_err(|e| e.to_string()),
        None => Ok(list),
    }
}

/// Runs `softrdma ibstat`.
pub fn run(args: &Args, devices: &[String]) -> ExitCode {
    let list = match chosen(devices, args.ca.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma ibstat: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(p) = args.port.filter(|&p| p != 1) {
        eprintln!(
            "softrdma ibstat: '{}' has no port number {p} - max (1)",
            list[0].name
        );
        return ExitCode::from(1);
    }
    if args.list {
        for d in &list {
            println!("{}", d.name);
        }
        return ExitCode::SUCCESS;
    }
    let (infos, failed) = infos(&list, "ibstat");
    for i in &infos {
        if args.port_list {
            println!("0x{:016x}", port_guid(i));
        } else if args.port.is_some() {
            print!("CA: '{}'\n{}", i.name, port_text(i, "", ""));
        } else {
            print!("{}", ibstat_text(i, args.short));
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// rdma's state names.
fn link_state(s: u32) -> &'static str {
    match s {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        _ => "NOP",
    }
}

/// The `rdma link show` line of one device's port.
pub(crate) fn link_line(i: &Info, details: bool) -> String {
    let p = &i.port;
    let mut o = format!(
        "link {}/1 state {} physical_state {}",
        i.name,
        link_state(p.state),
        devinfo::phys_state(p.phys_state)
    );
    if details {
        let _ = write!(
            o,
            " udp {} gid {} active_mtu {} link_mtu {}",
            i.addr,
            std::net::Ipv6Addr::from(i.gid.0),
            p.active_mtu.bytes(),
            p.link_mtu
        );
    }
    o
}

/// Runs `softrdma link [show] [DEV[/PORT]]`.
pub fn link(args: &LinkArgs, devices: &[String]) -> ExitCode {
    let (name, port) = match args
        .dev
        .as_deref()
        .map(|d| d.split_once('/').unwrap_or((d, "")))
    {
        Some((n, p)) => (Some(n), p),
        None => (None, ""),
    };
    if !port.is_empty() && port != "1" {
        eprintln!(
            "softrdma link: {port:?} is not a port of {} (its one port is 1)",
            name.unwrap_or("")
        );
        return ExitCode::from(1);
    }
    let list = match chosen(devices, name) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma link: {e}");
            return ExitCode::from(1);
        }
    };
    let (infos, failed) = infos(&list, "link");
    for i in &infos {
        println!("{}", link_line(i, args.details));
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
    fn rate_is_lanes_times_lane_speed() {
        assert_eq!(rate(2, 32), "100");
        assert_eq!(rate(1, 1), "2.5");
        assert_eq!(rate(2, 1), "10");
    }
}
