//! Which devices a `softrdma` command uses: the `--device NAME=IP[:PORT]`
//! options when given (each may also hold a comma-separated list), else
//! SOFTRDMA_DEVICES, else the default loopback device. Entries are parsed
//! by the library's one parser (`softrdma::config::parse_device_list`), so
//! the option and the variable accept exactly the same text.

use softrdma::config::{parse_device_list, select};
use softrdma::DeviceConfig;

/// The device list of this command.
pub fn devices(opts: &[String]) -> Result<Vec<DeviceConfig>, String> {
    if opts.is_empty() {
        return softrdma::devices().map_err(|e| e.to_string());
    }
    let entries = opts
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty());
    let list = parse_device_list(entries, "--device").map_err(|e| e.to_string())?;
    Ok(list.into_iter().map(DeviceConfig::with_env).collect())
}

/// The device `name` (or the first one) of this command's list; an unknown
/// name gets the list of devices there are.
pub fn device(opts: &[String], name: Option<&str>) -> Result<DeviceConfig, String> {
    let list = devices(opts)?;
    match name {
        Some(n) => select(&list, n).map_err(|e| e.to_string()),
        None => list
            .into_iter()
            .next()
            .ok_or_else(|| "no devices configured".to_string()),
    }
}
