//! `softrdma ibstat` and `softrdma link`: ibstat's layout line by line and
//! field by field, every value checked against what `softrdma devinfo
//! --json` (the verbs queries) reports for the same device; `rdma link
//! show`'s line; the device given by the global `--device` option.

mod common;

use common::softrdma;

/// A fixed address, so the device (and its GUID) is the same in each run
/// (each test its own: they run in parallel).
const DEV: &str = "--device=srx0=127.0.77.1";
const DEV_LINK: &str = "--device=srx0=127.0.77.3";

fn devinfo(dev: &str) -> serde_json::Value {
    let r = softrdma(&[dev, "devinfo", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["devices"][0].clone()
}

/// devinfo's `xxxx:xxxx:xxxx:xxxx` as ibstat's `0x%016x`.
fn guid_hex(g: &serde_json::Value) -> String {
    format!("0x{}", g.as_str().unwrap().replace(':', ""))
}

#[test]
fn ibstat_layout_field_by_field() {
    let d = devinfo(DEV);
    let p = &d["ports"][0];
    let r = softrdma(&[DEV, "ibstat"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    // Rate: lanes × lane speed: 4X (width 2) at 25 Gb/s (speed 32).
    assert_eq!(
        (&p["active_width"], &p["active_speed"]),
        (&2.into(), &32.into())
    );
    let want = [
        "CA 'srx0'".to_string(),
        "\tCA type: softrdma".into(),
        format!("\tNumber of ports: {}", d["phys_port_cnt"]),
        format!("\tFirmware version: {}", d["fw_ver"].as_str().unwrap()),
        format!("\tHardware version: {}", d["hw_ver"]),
        format!("\tNode GUID: {}", guid_hex(&d["node_guid"])),
        format!("\tSystem image GUID: {}", guid_hex(&d["sys_image_guid"])),
        "\tPort 1:".into(),
        "\t\tState: Active".into(),
        "\t\tPhysical state: LinkUp".into(),
        "\t\tRate: 100".into(),
        format!("\t\tBase lid: {}", p["lid"]),
        "\t\tLMC: 0".into(),
        "\t\tSM lid: 0".into(),
        "\t\tCapability mask: 0x00000000".into(),
        format!("\t\tPort GUID: {}", guid_hex(&d["node_guid"])),
        format!("\t\tLink layer: {}", p["link_layer"].as_str().unwrap()),
    ];
    assert_eq!(lines.len(), want.len(), "{}", r.stdout);
    for (got, want) in lines.iter().zip(&want) {
        assert_eq!(got, want, "in\n{}", r.stdout);
    }
    // The values behind the words.
    assert_eq!(d["phys_port_cnt"], 1);
    assert_eq!(p["state"], "PORT_ACTIVE");
    assert_eq!(p["phys_state"], 5);
    assert_eq!(p["link_layer"], "Ethernet");
    assert_eq!(d["node_guid"].as_str().unwrap().len(), 19);

    // ibstat CA PORT: that port alone, fields without indentation.
    let r = softrdma(&[DEV, "ibstat", "srx0", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let alone: Vec<String> = std::iter::once("CA: 'srx0'".to_string())
        .chain(std::iter::once("Port 1:".to_string()))
        .chain(want[8..].iter().map(|l| l.trim_start().to_string()))
        .collect();
    assert_eq!(r.stdout.lines().collect::<Vec<_>>(), alone);
    // -s: no ports; -l: names; -p: port GUIDs.
    let r = softrdma(&[DEV, "ibstat", "-s"]);
    assert_eq!(r.stdout.lines().collect::<Vec<_>>(), want[..7].to_vec());
    let r = softrdma(&[DEV, "ibstat", "-l"]);
    assert_eq!(r.stdout, "srx0\n");
    let r = softrdma(&[DEV, "ibstat", "-p"]);
    assert_eq!(r.stdout, format!("{}\n", guid_hex(&d["node_guid"])));
    // Errors name what exists.
    let r = softrdma(&[DEV, "ibstat", "srx0", "2"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("'srx0' has no port number 2 - max (1)"),
        "{}",
        r.stderr
    );
    let r = softrdma(&[DEV, "ibstat", "mlx5_0"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains(
            "no softrdma device named \"mlx5_0\"; the devices here are: srx0 (127.0.77.1:4791)"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn link_show_like_rdma() {
    let d = devinfo(DEV_LINK);
    let p = &d["ports"][0];
    for args in [
        &[DEV_LINK, "link"][..],
        &[DEV_LINK, "link", "show"],
        &[DEV_LINK, "link", "show", "srx0/1"],
    ] {
        let r = softrdma(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        assert_eq!(
            r.stdout, "link srx0/1 state ACTIVE physical_state LINK_UP\n",
            "{args:?}"
        );
    }
    let r = softrdma(&[DEV_LINK, "link", "-d"]);
    assert_eq!(
        r.stdout,
        format!(
            "link srx0/1 state ACTIVE physical_state LINK_UP udp 127.0.77.3:4791 gid ::ffff:127.0.77.3 active_mtu {} link_mtu {}\n",
            p["active_mtu"], p["link_mtu"]
        )
    );
    let r = softrdma(&[DEV_LINK, "link", "show", "srx0/2"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("its one port is 1"), "{}", r.stderr);
    // Two devices from two --device options.
    let r = softrdma(&[DEV_LINK, "--device", "srx1=127.0.77.4", "link"]);
    assert_eq!(
        r.stdout,
        "link srx0/1 state ACTIVE physical_state LINK_UP\nlink srx1/1 state ACTIVE physical_state LINK_UP\n",
        "{}",
        r.stderr
    );
}
