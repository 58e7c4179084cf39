//! Numbers and names as the analysis writes them: a share of a whole, a duration, bytes, a C++
//! function's name without its parameters. A lower module: the model, the kernel table and the
//! telemetry summary use these as the rules do, without depending on the rules
//! ([`crate::insight`] re-exports them as part of the rules' contract).

/// `part / whole` clamped to 0..1 (0 for an empty whole).
pub(crate) fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).min(1.0)
    }
}

/// `73.58s`, `12.40ms`, `710.2µs` or `850ns`.
pub fn fmt_duration(ns: u64) -> String {
    let n = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.2}s", n / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2}ms", n / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1}µs", n / 1e3)
    } else {
        format!("{ns}ns")
    }
}

/// Bytes for prose: `512 B`, `8.0 MiB`, `7.50 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if f >= KIB * KIB * KIB {
        format!("{:.2} GiB", f / (KIB * KIB * KIB))
    } else if f >= KIB * KIB {
        format!("{:.1} MiB", f / (KIB * KIB))
    } else if f >= KIB {
        format!("{:.1} KiB", f / KIB)
    } else {
        format!("{b} B")
    }
}

/// A function name for prose: the C++ parameter list dropped (`step(CUstream_st*, int)` →
/// `step`), so that `in {name}()` reads well.
pub fn short_function(name: &str) -> &str {
    let t = name.trim_end();
    if !t.ends_with(')') {
        return t;
    }
    let mut depth = 0i32;
    for (i, c) in t.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return if i == 0 { t } else { &t[..i] };
                }
            }
            _ => {}
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_function_names() {
        assert_eq!(fmt_duration(73_580_000_000), "73.58s");
        assert_eq!(fmt_duration(12_400_000), "12.40ms");
        assert_eq!(fmt_duration(710_200), "710.2µs");
        assert_eq!(fmt_duration(850), "850ns");
        assert_eq!(
            short_function("step(CUstream_st*, int, float const*)"),
            "step"
        );
        assert_eq!(short_function("train_step"), "train_step");
        assert_eq!(
            short_function("ns::f<int (*)(int)>(int)"),
            "ns::f<int (*)(int)>"
        );
        assert_eq!(short_function("(anonymous)"), "(anonymous)");
    }

    #[test]
    fn shares_are_clamped() {
        assert_eq!(share(5, 0), 0.0);
        assert_eq!(share(1, 4), 0.25);
        assert_eq!(share(9, 4), 1.0);
    }
}
