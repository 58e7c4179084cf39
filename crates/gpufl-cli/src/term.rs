//! Terminal output: strings from a trace made safe to print, and writes to stdout / stderr that
//! end the program quietly when the reader went away (`gpufl report … | head`).

use std::borrow::Cow;
use std::io::Write;

/// Whether `c` must not reach a terminal raw: C0 controls (ESC, CR, LF, TAB, BEL, …), DEL, C1
/// controls (CSI U+009B, OSC U+009D, …), Unicode's line and paragraph separators and the
/// bidirectional formatting characters (an override can make text display in another order than
/// it is stored: "Trojan Source").
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// A string from a trace (or a path from the file system), safe to print on a terminal: every
/// character of [`unsafe_char`] is written as a `\u{..}` escape, so a crafted kernel name, file
/// path or command line cannot clear the screen, retitle the terminal, reorder text or fake a line
/// of the report. JSON output does not use this (serde escapes exactly).
pub fn esc(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`esc`] of a path.
pub fn esc_path(p: &std::path::Path) -> String {
    esc(&p.to_string_lossy()).into_owned()
}

/// The error of a write to stdout whose reader went away: the program ends quietly, status 0
/// (see `main`).
#[derive(Debug)]
pub struct ClosedPipe;

impl std::fmt::Display for ClosedPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout closed")
    }
}

impl std::error::Error for ClosedPipe {}

/// Write `s` to stdout and flush. A closed pipe gives [`ClosedPipe`] (never a panic, never a
/// message); another write error is returned as it is.
pub fn print(s: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ClosedPipe.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// A buffered stdout for output written piece by piece (`gpufl dump`).
pub struct Stdout {
    w: std::io::BufWriter<std::io::StdoutLock<'static>>,
}

impl Stdout {
    pub fn new() -> Self {
        Stdout {
            w: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
        }
    }

    /// Append a line (a newline is added).
    pub fn line(&mut self, s: &str) -> anyhow::Result<()> {
        let r = self
            .w
            .write_all(s.as_bytes())
            .and_then(|_| self.w.write_all(b"\n"));
        pipe(r)
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        pipe(self.w.flush())
    }
}

fn pipe(r: std::io::Result<()>) -> anyhow::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ClosedPipe.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// One line to stderr, ignoring a closed stderr (a message is never worth a panic).
pub fn eprint_line(s: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(s.as_bytes()).and_then(|_| e.write_all(b"\n"));
}

/// Whether an error is (or was caused by) [`ClosedPipe`].
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<ClosedPipe>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn control_characters_from_a_trace_are_escaped() {
        assert_eq!(esc("train.py"), "train.py");
        assert_eq!(esc("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(esc("x\nfix: rm -rf /"), "x\\u{a}fix: rm -rf /");
        assert_eq!(esc("x\rfix"), "x\\u{d}fix");
        assert_eq!(esc("t\x1b]0;title\x07"), "t\\u{1b}]0;title\\u{7}");
        assert_eq!(esc("\u{9b}31m"), "\\u{9b}31m", "C1 CSI");
        assert_eq!(esc("\u{9d}0;t\u{9c}"), "\\u{9d}0;t\\u{9c}", "C1 OSC, ST");
        assert_eq!(esc("a\u{7f}"), "a\\u{7f}");
        assert_eq!(
            esc("abc\u{202e}fdp.exe"),
            "abc\\u{202e}fdp.exe",
            "bidi override"
        );
        assert_eq!(
            esc("\u{2066}x\u{2069}"),
            "\\u{2066}x\\u{2069}",
            "bidi isolates"
        );
        assert_eq!(esc("a\u{2028}b"), "a\\u{2028}b", "line separator");
        assert_eq!(esc("µs ← ok ▁▂ 日本"), "µs ← ok ▁▂ 日本");
    }
}
