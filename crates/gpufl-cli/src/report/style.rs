//! The look of the text report (and of `gpufl diff`'s): colours (ANSI escapes, as `--color`
//! decides), severity labels, durations, and names cut to a width. Escaping of strings from a trace is `crate::term::esc`.

use gpufl_analysis::Severity;

/// Whether the text is coloured, and how.
pub(crate) struct Style {
    pub(crate) color: bool,
}

impl Style {
    pub(crate) fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub(crate) fn severity(&self, s: Severity) -> String {
        match s {
            Severity::High => self.paint("1;31", "HIGH  "),
            Severity::Medium => self.paint("1;33", "MEDIUM"),
            Severity::Low => self.paint("2", "LOW   "),
        }
    }
}

/// A duration in s, ms or µs, two or one decimals.
pub(crate) fn secs(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// A name of at most `n` characters, then `…` where it was longer (`n + 1` in all).
pub(crate) fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A title of at most `n` characters, the last one `…` where it was cut.
pub(crate) fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}
