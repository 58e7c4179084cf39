//! The text of source lines for `frame` records (`Frame::text`), read on the writer thread the
//! first time a frame is written, so a report can show the line without the source tree.
//!
//! Only regular files of at most [`MAX_FILE`] bytes are read (the file type is checked before
//! opening, and the open is non-blocking, so a FIFO or device named like a source file is never
//! waited on); files are cached whole while the cache holds at most [`MAX_CACHED`] bytes.
//! `GPUFL_SOURCE_TEXT=0` turns it off.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Largest file read.
pub const MAX_FILE: u64 = 4 << 20;
/// Bytes of file contents kept at once (the cache is emptied beyond).
const MAX_CACHED: usize = 64 << 20;
/// Longest text kept, bytes (cut at a character boundary).
pub const MAX_TEXT: usize = 240;

/// A file's contents and the byte offset where each line starts.
type Loaded = (Vec<u8>, Vec<u32>);

/// Per-session cache of source files: path → contents and line starts (None: unreadable).
#[derive(Default)]
pub struct SourceText {
    files: HashMap<String, Option<Loaded>>,
    bytes: usize,
    off: bool,
}

impl SourceText {
    /// A cache that reads files unless `GPUFL_SOURCE_TEXT=0`.
    pub fn from_env() -> SourceText {
        SourceText {
            off: !crate::options::knobs().source_text,
            ..SourceText::default()
        }
    }

    /// The text of line `line` (1-based) of `path`, trimmed and capped; None when the file is not
    /// a readable regular file, the line does not exist or is blank.
    pub fn line(&mut self, path: &str, line: u32) -> Option<String> {
        if self.off || line == 0 || path.starts_with('<') {
            return None;
        }
        if !self.files.contains_key(path) {
            let loaded = load(path);
            let size = loaded.as_ref().map_or(0, |(c, _)| c.len());
            if self.bytes + size > MAX_CACHED {
                self.files.clear();
                self.bytes = 0;
            }
            self.bytes += size;
            self.files.insert(path.to_string(), loaded);
        }
        let (content, starts) = self.files.get(path)?.as_ref()?;
        let i = line as usize - 1;
        let start = *starts.get(i)? as usize;
        let end = starts.get(i + 1).map_or(content.len(), |&e| e as usize);
        let text = String::from_utf8_lossy(&content[start..end]);
        let t = text.trim();
        if t.is_empty() {
            return None;
        }
        let mut cut = t.len().min(MAX_TEXT);
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        Some(t[..cut].to_string())
    }
}

fn load(path: &str) -> Option<Loaded> {
    let md = std::fs::metadata(path).ok()?;
    if !md.is_file() || md.len() > MAX_FILE {
        return None;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut content = Vec::with_capacity(md.len() as usize);
    f.by_ref().take(MAX_FILE).read_to_end(&mut content).ok()?;
    let mut starts = vec![0u32];
    starts.extend(
        content
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .map(|(i, _)| i as u32 + 1),
    );
    Some((content, starts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_trimmed_and_capped() {
        let dir = std::env::temp_dir().join(format!("gpufl-srctext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("train.py");
        let long = "x".repeat(500);
        std::fs::write(&p, format!("import torch\n\n    loss.item()  \n{long}\n")).unwrap();
        let path = p.to_str().unwrap();
        let mut s = SourceText::default();
        assert_eq!(s.line(path, 1).as_deref(), Some("import torch"));
        assert_eq!(s.line(path, 2), None, "blank");
        assert_eq!(s.line(path, 3).as_deref(), Some("loss.item()"));
        assert_eq!(s.line(path, 4).map(|t| t.len()), Some(MAX_TEXT));
        assert_eq!(s.line(path, 9), None);
        assert_eq!(s.line("<frozen importlib._bootstrap>", 1), None);
        assert_eq!(s.line(dir.to_str().unwrap(), 1), None, "a directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_is_never_opened() {
        let dir = std::env::temp_dir().join(format!("gpufl-srcfifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("model.py");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut s = SourceText::default();
        assert_eq!(s.line(p.to_str().unwrap(), 1), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
