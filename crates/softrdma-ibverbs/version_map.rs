// Shared by the build scripts of softrdma-ibverbs and softrdma-rdmacm
// (included with `include!`): a GNU ld version script's exported symbols.

/// (symbol, version node) of every plain symbol in a version script;
/// `what` names the file in the panics that reject a malformed one.
fn parse_version_map(text: &str, what: &str) -> Vec<(String, String)> {
    let mut version: Option<String> = None;
    let mut syms = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(name) = line.strip_suffix('{').map(str::trim) {
            version = Some(name.to_string());
            continue;
        }
        if line.starts_with('}') {
            version = None;
            continue;
        }
        let Some(sym) = line.strip_suffix(';') else {
            continue;
        };
        if sym.contains(':') || sym.contains('*') || sym.is_empty() {
            continue;
        }
        let v = version
            .clone()
            .unwrap_or_else(|| panic!("{what}: {sym} outside a version node"));
        assert!(
            sym.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{what}: bad symbol name {sym:?}"
        );
        syms.push((sym.to_string(), v));
    }
    syms
}
