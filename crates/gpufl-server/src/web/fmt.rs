//! How the pages write numbers: durations, bytes, shares, wall-clock times, severities.
//! Plain text (templates escape it).

/// A duration: `73.58s`, `12.4ms`, `140.2µs`, `850ns`.
pub fn dur(ns: i64) -> String {
    let n = ns.unsigned_abs() as f64;
    let sign = if ns < 0 { "-" } else { "" };
    if n >= 1e9 {
        format!("{sign}{:.2}s", n / 1e9)
    } else if n >= 1e6 {
        format!("{sign}{:.2}ms", n / 1e6)
    } else if n >= 1e3 {
        format!("{sign}{:.1}µs", n / 1e3)
    } else {
        format!("{sign}{n}ns")
    }
}

/// [`dur`] of an unsigned count of ns.
pub fn dur_u(ns: u64) -> String {
    dur(ns.min(i64::MAX as u64) as i64)
}

/// A byte count: `5.7 KiB`, `1.2 GiB`.
pub fn bytes(b: i64) -> String {
    let n = b.max(0) as f64;
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{} B", b.max(0))
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// A share 0..100 as `42.1%`.
pub fn pct(p: f64) -> String {
    if p.is_finite() {
        format!("{p:.1}%")
    } else {
        "–".into()
    }
}

/// A count with thousands separators: `1,234,567`.
pub fn count(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Wall-clock time (UTC) of ns since the Unix epoch: `2026-11-26 14:03:39`.
pub fn time(unix_ns: i64) -> String {
    if unix_ns <= 0 {
        return "–".into();
    }
    let secs = unix_ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Severity rank (1..3) as its name; empty for none.
pub fn severity(n: i64) -> &'static str {
    match n {
        1 => "LOW",
        2 => "MEDIUM",
        3 => "HIGH",
        _ => "",
    }
}

/// The CSS class of a severity rank: `sev-high`, `sev-medium`, `sev-low`, `sev-none`.
pub fn severity_class(n: i64) -> &'static str {
    match n {
        1 => "sev-low",
        2 => "sev-medium",
        3 => "sev-high",
        _ => "sev-none",
    }
}

/// Rank of a severity name as the analysis writes it (`HIGH`, `High`, `high`).
pub fn severity_rank(s: &str) -> i64 {
    match s.to_ascii_uppercase().as_str() {
        "LOW" => 1,
        "MEDIUM" => 2,
        "HIGH" => 3,
        _ => 0,
    }
}

/// The last `n` characters of a path, with `…` in front when cut (for chips and tables; the
/// whole path goes in the `title`).
pub fn short_path(p: &str, n: usize) -> String {
    let count = p.chars().count();
    if count <= n {
        return p.to_string();
    }
    let tail: String = p.chars().skip(count - n + 1).collect();
    format!("…{tail}")
}

/// A library file as its package names it: the path after the last `site-packages/` or
/// `dist-packages/`, then whole components dropped from the left (`…/`) until it fits in `n`
/// characters (the file name alone is kept whatever its length).
pub fn lib_path(p: &str, n: usize) -> String {
    let rel = ["site-packages/", "dist-packages/"]
        .iter()
        .filter_map(|m| p.rfind(m).map(|i| &p[i + m.len()..]))
        .min_by_key(|r| r.len())
        .unwrap_or(p);
    if rel.chars().count() <= n {
        return rel.to_string();
    }
    let mut rest = rel;
    while let Some((_, tail)) = rest.split_once('/') {
        rest = tail;
        if rest.chars().count() + 2 <= n {
            break;
        }
    }
    format!("…/{rest}")
}

/// The first `n` characters of `s`, with `…` at the end when cut.
pub fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `file:line` with the file shortened to its last `n` characters ([`short_path`]); the file
/// alone without a line.
pub fn loc(file: &str, line: Option<u32>, n: usize) -> String {
    match line {
        Some(l) => format!("{}:{l}", short_path(file, n)),
        None => short_path(file, n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(dur(73_580_000_000), "73.58s");
        assert_eq!(dur(140_200), "140.2µs");
        assert_eq!(dur(850), "850ns");
        assert_eq!(dur(-2_500_000), "-2.50ms");
        assert_eq!(bytes(5_837), "5.7 KiB");
        assert_eq!(bytes(12), "12 B");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(-1_000), "-1,000");
        assert_eq!(count(999), "999");
        assert_eq!(time(1_795_702_721_992_287_729), "2026-11-26 14:18:41");
        assert_eq!(time(0), "–");
        assert_eq!(short_path("/a/b/c/train.py", 8), "…rain.py");
        assert_eq!(
            lib_path("/usr/lib/python3/site-packages/transformers/trainer.py", 48),
            "transformers/trainer.py"
        );
        assert_eq!(
            lib_path("/opt/cuda/include/cub/device/x.cuh", 16),
            "…/device/x.cuh"
        );
        assert_eq!(
            lib_path("/a/very_long_file_name.py", 8),
            "…/very_long_file_name.py"
        );
        assert_eq!(cut("python3 train.py", 8), "python3…");
        assert_eq!(cut("short", 8), "short");
        assert_eq!(loc("/a/b/c/train.py", Some(9), 8), "…rain.py:9");
        assert_eq!(loc("k", None, 8), "k");
        assert_eq!(severity(3), "HIGH");
        assert_eq!(severity_rank("Medium"), 2);
    }
}
