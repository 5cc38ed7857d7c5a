//! Numbers as people read them, for summaries and warnings on both paths.

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Parses a size: `1500000000`, `512M`, `1.5G`, `64KiB`, `2gb`... Suffixes
/// are case-insensitive and all binary (K = 1024), as in cgroup files,
/// systemd and docker. The error says what is wrong with it.
pub fn parse_size(text: &str) -> Result<u64, &'static str> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, suffix) = (&t[..split], t[split..].trim_start());
    if number.is_empty() {
        return Err("it does not start with a number");
    }
    let mult: u128 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err("unknown unit (use K, M, G or T, optionally followed by B or iB)"),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
        return Err("malformed number");
    }
    if frac.len() > 9 {
        return Err("more than 9 decimal places");
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| "number too large")?;
    let bytes = mantissa.checked_mul(mult).ok_or("number too large")? / 10u128.pow(frac.len() as u32);
    u64::try_from(bytes).map_err(|_| "number too large")
}
