//! Where a Triton kernel that PyTorch Inductor generated is defined: Inductor writes each kernel's
//! source to a Python file in its cache directory (`TORCHINDUCTOR_CACHE_DIR`, by default
//! `/tmp/torchinductor_<user>`), and the module that calls the kernels (the "output code") says
//! above each kernel what it was generated from (`# Topologically Sorted Source Nodes: [...],
//! Original ATen: [...]`). CUPTI names the kernel as its Python function (`triton_poi_fused_…`).
//!
//! The writer thread looks a kernel up the first time it sees its name: the cache is scanned once
//! (bounded: files, bytes and time) into an index of `def triton_…(` lines and output-code notes,
//! and scanned again for a name it does not hold, at most once a second and [`MAX_SCANS`] times a
//! session (kernels compiled later come with new files).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most `.py` files read per scan.
pub const MAX_FILES: usize = 20_000;
/// Largest file read, bytes.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Most bytes read per scan.
pub const MAX_SCAN_BYTES: u64 = 256 << 20;
/// A scan stops after this long (what it read so far is kept).
pub const MAX_SCAN_TIME: Duration = Duration::from_secs(2);
/// Scans per session at most.
pub const MAX_SCANS: u32 = 20;
/// Directory levels below the cache directory walked.
const MAX_DEPTH: usize = 4;
/// Longest note kept, bytes.
const MAX_NOTE: usize = 400;

/// A kernel's generated source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub file: PathBuf,
    /// 1-based line of its `def`.
    pub line: u32,
    /// What the output code says it was generated from.
    pub note: Option<String>,
}

#[derive(Default)]
struct Entry {
    /// `def` in a kernel file of its own (not inside the output code's string).
    own: Option<(PathBuf, u32)>,
    /// `def` inside an output-code module.
    embedded: Option<(PathBuf, u32)>,
    note: Option<String>,
}

/// The index of one or more cache directories.
pub struct Index {
    dirs: Vec<PathBuf>,
    names: HashMap<String, Entry>,
    scans: u32,
    last_scan: Option<Instant>,
}

impl Index {
    /// An index of `dirs` (scanned on the first lookup).
    pub fn new(dirs: Vec<PathBuf>) -> Index {
        Index {
            dirs,
            names: HashMap::new(),
            scans: 0,
            last_scan: None,
        }
    }

    /// An index of Inductor's cache directories on this machine: `TORCHINDUCTOR_CACHE_DIR`, else
    /// the `torchinductor_*` directories this user owns in the temporary directory (`TMPDIR`, else
    /// `/tmp`, as Python's `tempfile.gettempdir()`).
    pub fn from_env() -> Index {
        if let Some(d) = std::env::var_os("TORCHINDUCTOR_CACHE_DIR").filter(|d| !d.is_empty()) {
            return Index::new(vec![PathBuf::from(d)]);
        }
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no failure mode.
        let uid = unsafe { libc::geteuid() };
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("torchinductor_")
            })
            .filter(|e| {
                std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir() && m.uid() == uid)
            })
            .map(|e| e.path())
            .collect();
        dirs.sort();
        dirs.truncate(4);
        Index::new(dirs)
    }

    /// Where kernel `name` is defined, if an Inductor cache holds it.
    pub fn lookup(&mut self, name: &str) -> Option<Found> {
        if !name.starts_with("triton_") || self.dirs.is_empty() {
            return None;
        }
        if !self.names.contains_key(name) && self.may_scan() {
            self.scan();
        }
        let e = self.names.get(name)?;
        let (file, line) = e.own.clone().or_else(|| e.embedded.clone())?;
        Some(Found {
            file,
            line,
            note: e.note.clone(),
        })
    }

    /// Whether a later lookup may still scan (scans left).
    pub fn can_scan_again(&self) -> bool {
        self.scans < MAX_SCANS && !self.dirs.is_empty()
    }

    fn may_scan(&self) -> bool {
        self.scans < MAX_SCANS
            && self
                .last_scan
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
    }

    fn scan(&mut self) {
        self.scans += 1;
        self.last_scan = Some(Instant::now());
        let started = Instant::now();
        let mut budget = Budget {
            files: MAX_FILES,
            bytes: MAX_SCAN_BYTES,
            started,
        };
        // The newest files first: a cache keeps earlier runs' kernels under the same names
        // (Inductor numbers them per compiled graph), and this run's are the newest; a name keeps
        // what its newest file says.
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for d in &self.dirs {
            list(d, 0, &mut files, started);
        }
        files.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
        for (_, len, path) in files {
            if budget.spent() {
                return;
            }
            if len > budget.bytes {
                continue;
            }
            budget.files -= 1;
            budget.bytes -= len;
            if let Ok(text) = std::fs::read(&path) {
                self.read_file(&path, &String::from_utf8_lossy(&text));
            }
        }
    }

    /// Note a file's kernel definitions and output-code notes.
    fn read_file(&mut self, path: &Path, text: &str) {
        let lines: Vec<&str> = text.lines().collect();
        // Kernels this file compiles from a string (an output-code module): their `def` here is
        // embedded.
        let mut compiled: Vec<String> = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            if let Some(name) = assigned_kernel(t) {
                let note = note_above(&lines[..i]);
                let e = self.names.entry(name.to_string()).or_default();
                if e.note.is_none() {
                    e.note = note;
                }
                compiled.push(name.to_string());
            }
        }
        for (i, l) in lines.iter().enumerate() {
            let Some(name) = defined_kernel(l.trim_start()) else {
                continue;
            };
            let at = (path.to_path_buf(), (i + 1) as u32);
            let e = self.names.entry(name.to_string()).or_default();
            if compiled.iter().any(|c| c == name) {
                e.embedded.get_or_insert(at);
            } else {
                e.own.get_or_insert(at);
            }
        }
    }
}

/// The `.py` files under `dir` (at most [`MAX_FILES`] × 4 listed, within the scan's time), with
/// their modification time and size.
fn list(
    dir: &Path,
    depth: usize,
    out: &mut Vec<(std::time::SystemTime, u64, PathBuf)>,
    started: Instant,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if out.len() >= MAX_FILES * 4 || started.elapsed() >= MAX_SCAN_TIME {
            return;
        }
        let Ok(ft) = e.file_type() else { continue };
        let path = e.path();
        if ft.is_dir() && depth < MAX_DEPTH {
            list(&path, depth + 1, out, started);
        } else if ft.is_file() && path.extension().is_some_and(|x| x == "py") {
            let Ok(meta) = e.metadata() else { continue };
            if meta.len() <= MAX_FILE_BYTES {
                let t = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                out.push((t, meta.len(), path));
            }
        }
    }
}

struct Budget {
    files: usize,
    bytes: u64,
    started: Instant,
}

impl Budget {
    fn spent(&self) -> bool {
        self.files == 0 || self.bytes == 0 || self.started.elapsed() >= MAX_SCAN_TIME
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `def triton_…(` → the kernel's name.
fn defined_kernel(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("def ")?;
    let end = rest.find(|c: char| !is_name_char(c))?;
    let (name, after) = rest.split_at(end);
    (name.starts_with("triton_") && after.starts_with('(')).then_some(name)
}

/// `triton_… = async_compile.triton('triton_…', …` → the kernel's name.
fn assigned_kernel(line: &str) -> Option<&str> {
    let end = line.find(|c: char| !is_name_char(c))?;
    let (name, after) = line.split_at(end);
    (name.starts_with("triton_")
        && after
            .trim_start()
            .strip_prefix('=')?
            .trim_start()
            .starts_with("async_compile.triton("))
    .then_some(name)
}

/// The comment lines right above a kernel in the output code that say what it was generated from.
fn note_above(before: &[&str]) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for l in before.iter().rev().take(400) {
        let t = l.trim();
        let Some(c) = t.strip_prefix('#') else { break };
        let c = c.trim();
        if c.starts_with("Topologically Sorted Source Nodes:")
            || c.starts_with("Source Nodes:")
            || c.starts_with("Original ATen:")
        {
            parts.push(c);
        }
    }
    parts.reverse();
    let mut note = parts.join(" ");
    if note.is_empty() {
        return None;
    }
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push('…');
    }
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "gpufl-inductor-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("ab")).unwrap();
        std::fs::create_dir_all(root.join("xy")).unwrap();
        // A kernel file of its own.
        std::fs::write(
            root.join("ab/cabkernel.py"),
            "import triton\nimport triton.language as tl\n\n@triton.jit\n\
             def triton_poi_fused_relu_0(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):\n    pass\n",
        )
        .unwrap();
        // The output code: a note above the kernel, its source inside a string.
        std::fs::write(
            root.join("xy/cxyoutput.py"),
            "from torch._inductor.async_compile import AsyncCompile\n\
             async_compile = AsyncCompile()\n\n\
             # kernel path: /tmp/torchinductor_u/ab/cabkernel.py\n\
             # Topologically Sorted Source Nodes: [x_1, relu], Original ATen: [aten.relu]\n\
             # Source node to ATen node mapping:\n\
             #   relu => relu\n\
             triton_poi_fused_relu_0 = async_compile.triton('triton_poi_fused_relu_0', '''\n\
             import triton\n\
             @triton.jit\n\
             def triton_poi_fused_relu_0(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):\n    pass\n\
             ''', device_str='cuda')\n\n\
             triton_red_fused_sum_1 = async_compile.triton('triton_red_fused_sum_1', '''\n\
             def triton_red_fused_sum_1(in_ptr0, out_ptr0):\n    pass\n''')\n",
        )
        .unwrap();
        root
    }

    #[test]
    fn finds_the_kernel_file_and_the_output_codes_note() {
        let root = tree();
        let mut ix = Index::new(vec![root.clone()]);
        let f = ix.lookup("triton_poi_fused_relu_0").unwrap();
        assert_eq!(f.file, root.join("ab/cabkernel.py"));
        assert_eq!(f.line, 5);
        assert_eq!(
            f.note.as_deref(),
            Some("Topologically Sorted Source Nodes: [x_1, relu], Original ATen: [aten.relu]")
        );
        // Only in the output code: its line there, without a note.
        let f = ix.lookup("triton_red_fused_sum_1").unwrap();
        assert_eq!(f.file, root.join("xy/cxyoutput.py"));
        assert_eq!(f.line, 16);
        assert_eq!(f.note, None);
        assert_eq!(ix.lookup("cutlass_gemm"), None);
        assert_eq!(ix.scans, 1);
        // An unknown name scans again, but not more than once a second.
        assert_eq!(ix.lookup("triton_per_fused_mean_9"), None);
        assert_eq!(ix.scans, 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn kernels_compiled_later_are_found_by_a_later_scan() {
        let root = tree();
        let mut ix = Index::new(vec![root.clone()]);
        assert!(ix.lookup("triton_poi_fused_relu_0").is_some());
        std::fs::write(
            root.join("ab/later.py"),
            "@triton.jit\ndef triton_per_fused_mean_2(x):\n    pass\n",
        )
        .unwrap();
        ix.last_scan = Some(Instant::now() - Duration::from_secs(2));
        let f = ix.lookup("triton_per_fused_mean_2").unwrap();
        assert_eq!((f.line, ix.scans), (2, 2));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn of_two_files_defining_a_name_the_newest_wins() {
        let root = tree();
        let old = root.join("ab/old.py");
        std::fs::write(&old, "\n\n\ndef triton_poi_fused_relu_0(x):\n    pass\n").unwrap();
        let f = std::fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(86_400))
            .unwrap();
        drop(f);
        let mut ix = Index::new(vec![root.clone()]);
        let found = ix.lookup("triton_poi_fused_relu_0").unwrap();
        assert_eq!((found.file, found.line), (root.join("ab/cabkernel.py"), 5));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn parsing_is_strict_about_names() {
        assert_eq!(defined_kernel("def triton_x(a):"), Some("triton_x"));
        assert_eq!(defined_kernel("def triton_x (a):"), None);
        assert_eq!(defined_kernel("def helper(a):"), None);
        assert_eq!(defined_kernel("def triton_x"), None);
        assert_eq!(
            assigned_kernel("triton_x = async_compile.triton('triton_x', '''"),
            Some("triton_x")
        );
        assert_eq!(assigned_kernel("triton_x = something_else()"), None);
        assert_eq!(assigned_kernel("x = async_compile.triton("), None);
        let long = format!("# Original ATen: [{}]", "aten.add, ".repeat(100));
        let n = note_above(&[long.as_str()]).unwrap();
        assert!(n.len() <= MAX_NOTE + '…'.len_utf8() && n.ends_with('…'));
    }
}
