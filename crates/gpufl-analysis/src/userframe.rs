//! Choosing the *user frame* of a stack: the innermost frame that belongs to the user's code rather
//! than to CUDA, the recorder, the C library, the Python interpreter and its standard library,
//! installed packages or PyTorch's C++.

use crate::error::AnalysisError;
use crate::ids::StackIx;
use crate::model::Model;
use gpufl_trace::FrameKind;
use serde::{Deserialize, Serialize};

/// Where the user frame comes from.
#[derive(Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FrameOrigin {
    /// A Python frame (file, line and qualified function name from the interpreter).
    Python,
    /// A native frame with debug information (C, C++, CUDA host code…).
    Native,
    /// No frame of the stack belongs to the user: a synchronization the CUDA runtime or a framework
    /// issued on its own (e.g. at context teardown), or a stack that could not be resolved.
    DriverInternal,
    /// Not a frame: the finding is about a whole GPU (telemetry rules); `file` names the device
    /// (`GPU 0`), there is no line.
    Device,
    /// Not a frame: a kernel rule's location when no launch of the kernel has a call-site stack;
    /// `file` is the kernel's short name and `function` its full name.
    Kernel,
}

/// A source location in the user's code, with the library line that issued the call when the user's
/// line called into a library (docs/insights.md, "Locations: user frame and library frame").
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct SourceLoc {
    /// Source file as recorded (full path); `"<driver-internal>"` when there is no user frame.
    pub file: String,
    pub line: Option<u32>,
    pub function: Option<String>,
    pub origin: FrameOrigin,
    /// The text of the line, when the recorder stored it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The innermost library frame inside the user's line (e.g. `transformers/trainer.py:2612 in
    /// _inner_training_loop` under `train.py:16`): the innermost Python frame, inner to the user
    /// frame, of an installed package that is not a framework core (torch, jax, numpy…) nor the
    /// standard library. Locations with different library frames are different locations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<Box<SourceLoc>>,
}

/// `file` of a [`SourceLoc`] with no user frame.
pub const DRIVER_INTERNAL: &str = "<driver-internal>";

impl SourceLoc {
    /// The location of syncs without a user frame.
    pub fn driver_internal() -> SourceLoc {
        SourceLoc {
            file: DRIVER_INTERNAL.to_string(),
            line: None,
            function: None,
            origin: FrameOrigin::DriverInternal,
            text: None,
            library: None,
        }
    }

    /// The location of a finding about a whole device, which no source line causes
    /// (throttling, memory pressure, ECC errors): `GPU <dev>`, no line, origin [`FrameOrigin::Device`].
    pub fn device(dev: u32) -> SourceLoc {
        SourceLoc {
            file: format!("GPU {dev}"),
            line: None,
            function: None,
            origin: FrameOrigin::Device,
            text: None,
            library: None,
        }
    }

    /// Last path component of `file`.
    pub fn basename(&self) -> &str {
        self.file.rsplit('/').next().unwrap_or(&self.file)
    }

    /// `basename:line` (or `basename` alone when the line is unknown); with a library frame,
    /// `trainer.py:2612 ← train.py:16` (the library line, then the user's).
    pub fn short(&self) -> String {
        let own = match self.line {
            Some(l) => format!("{}:{l}", self.basename()),
            None => self.basename().to_string(),
        };
        match &self.library {
            Some(lib) => format!("{} ← {own}", lib.short()),
            None => own,
        }
    }

    /// The user's part alone (`train.py:16`), without the library frame.
    pub fn user_short(&self) -> String {
        match self.line {
            Some(l) => format!("{}:{l}", self.basename()),
            None => self.basename().to_string(),
        }
    }

    /// A library path shortened to the package: `…/site-packages/transformers/trainer.py` →
    /// `transformers/trainer.py`.
    pub fn package_path(&self) -> &str {
        for marker in ["/site-packages/", "/dist-packages/"] {
            if let Some(i) = self.file.rfind(marker) {
                return &self.file[i + marker.len()..];
            }
        }
        &self.file
    }

    /// True when neither a user frame nor a library frame names a line.
    pub fn is_unattributed(&self) -> bool {
        self.origin == FrameOrigin::DriverInternal && self.library.is_none()
    }
}

/// Packages whose frames are never a location's library frame: the frameworks' own tensor
/// libraries, whose lines say how an operation is implemented rather than which library call
/// issued it (their frames are still in every stack).
pub const FRAMEWORK_CORES: &[&str] = &[
    "torch",
    "jax",
    "jaxlib",
    "numpy",
    "cupy",
    "cupyx",
    "cupy_backends",
    "triton",
    "nvidia",
];

/// Whether a Python frame's file can be a library frame: in an installed package (site-packages or
/// dist-packages) other than the [`FRAMEWORK_CORES`].
pub fn is_library_file(file: &str) -> bool {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            let rest = &file[i + marker.len()..];
            let pkg = rest.split('/').next().unwrap_or("");
            let pkg = pkg.strip_suffix(".py").unwrap_or(pkg);
            return !pkg.is_empty() && !FRAMEWORK_CORES.contains(&pkg);
        }
    }
    false
}

/// Which frames count as the user's code. Patterns are matched against a frame's source file and its
/// module (shared object or executable) path: a pattern with `*` or `?` must match the whole path
/// (`*` matches any run of characters, `/` included; `?` one character), any other pattern matches
/// as a substring. A frame is the user's if an `include` pattern matches it, or else if no `exclude`
/// pattern matches it and it has a source file: **include wins over exclude**.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameFilter {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

/// The built-in excludes of [`FrameFilter::default`]: frames that are not the user's code
/// ([`gpufl_trace::userpaths::NOT_USER_CODE`], shared with the recorder's metrics feed).
pub const BUILTIN_EXCLUDES: &[&str] = gpufl_trace::userpaths::NOT_USER_CODE;

impl Default for FrameFilter {
    /// No includes; the [`BUILTIN_EXCLUDES`]. Frames without a source file are never user frames
    /// unless an include matches their module.
    fn default() -> Self {
        FrameFilter {
            include: Vec::new(),
            exclude: BUILTIN_EXCLUDES.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl FrameFilter {
    /// Check the patterns (an empty pattern would match every frame).
    pub fn validate(&self) -> Result<(), AnalysisError> {
        match self
            .include
            .iter()
            .chain(&self.exclude)
            .find(|p| p.is_empty())
        {
            Some(_) => Err(AnalysisError::EmptyPattern),
            None => Ok(()),
        }
    }

    fn any_match(patterns: &[String], paths: &[Option<&str>]) -> bool {
        patterns
            .iter()
            .filter(|p| !p.is_empty())
            .any(|p| paths.iter().flatten().any(|path| pattern_matches(p, path)))
    }

    /// Whether a frame with this source file and module is the user's.
    pub fn is_user(&self, file: Option<&str>, module: Option<&str>) -> bool {
        let paths = [file, module];
        if Self::any_match(&self.include, &paths) {
            return true;
        }
        file.is_some() && !Self::any_match(&self.exclude, &paths)
    }
}

/// Substring match, or whole-path glob when `pattern` has `*` or `?`.
pub fn pattern_matches(pattern: &str, path: &str) -> bool {
    if pattern.contains(['*', '?']) {
        glob(pattern.as_bytes(), path.as_bytes())
    } else {
        path.contains(pattern)
    }
}

/// Iterative wildcard match (`*` any run, `?` one byte), linear-ish with backtracking to the last star.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The innermost frame of `stack` that belongs to the user's code (per `f`), as a source location;
/// [`SourceLoc::driver_internal`] if there is none (or the stack was never defined).
/// Whether a stack is a walk cut short inside CUDA: no frames, or only native frames of CUPTI, the
/// driver, the runtime or the recorder (a call site's walk is bounded by a few µs, and the first,
/// cold walks of a thread can end before they leave those libraries). Such a stack says nothing
/// about the call's line: it is no `<driver-internal>` vote (a stack that reaches the program's
/// entry or a thread's start without a user frame is).
pub fn is_cut_in_cuda(m: &Model, stack: StackIx) -> bool {
    let Some(frames) = m.stack(stack) else {
        return true;
    };
    frames.iter().all(|&id| {
        m.frame(id).is_some_and(|fr| {
            fr.kind != FrameKind::Python
                && fr.module.is_some_and(|md| {
                    ["libcupti", "libcuda.so", "libcudart", "libgpufl_capture"]
                        .iter()
                        .any(|lib| md.contains(lib))
                })
        })
    })
}

pub fn user_frame(m: &Model, stack: StackIx, f: &FrameFilter) -> SourceLoc {
    let Some(frames) = m.stack(stack) else {
        return SourceLoc::driver_internal();
    };
    // nvcc compiles `kernel<<<…>>>(…)` into a host function named like the kernel (at the
    // `__global__` line) that calls `__device_stub__…` (in a generated `.stub.c`): the frame just
    // outside a stub is that wrapper, not the user's launch line.
    let mut after_stub = false;
    let mut library: Option<Box<SourceLoc>> = None;
    for &id in frames {
        let Some(fr) = m.frame(id) else { continue };
        if library.is_none()
            && fr.kind == FrameKind::Python
            && fr.file.is_some_and(is_library_file)
            && !f.is_user(fr.file, fr.module)
        {
            library = Some(Box::new(SourceLoc {
                file: fr.file.unwrap_or("?").to_string(),
                line: fr.line,
                function: fr.func.map(str::to_string),
                origin: FrameOrigin::Python,
                text: fr.text.map(str::to_string),
                library: None,
            }));
        }
        let stub = fr.func.is_some_and(|n| n.starts_with("__device_stub__"))
            || fr.file.is_some_and(|p| p.ends_with(".stub.c"));
        if stub {
            after_stub = true;
            continue;
        }
        if std::mem::take(&mut after_stub) {
            continue;
        }
        if !f.is_user(fr.file, fr.module) {
            continue;
        }
        let origin = match fr.kind {
            FrameKind::Python => FrameOrigin::Python,
            _ => FrameOrigin::Native,
        };
        return SourceLoc {
            // An included frame without a file is located by its module.
            file: fr.file.or(fr.module).unwrap_or("?").to_string(),
            line: fr.line,
            function: fr.func.map(str::to_string),
            origin,
            text: fr.text.map(str::to_string),
            library,
        };
    }
    SourceLoc {
        library,
        ..SourceLoc::driver_internal()
    }
}

/// The caller of a stack's user frame: the next frame outward that is the user's code and in
/// another function (`busy_host_work()` at `train.py:38` is called at `train.py:71` in `main()`);
/// None when there is none.
pub fn user_caller(m: &Model, stack: StackIx, f: &FrameFilter) -> Option<SourceLoc> {
    let frames = m.stack(stack)?;
    let mut inner: Option<Option<&str>> = None;
    for &id in frames {
        let Some(fr) = m.frame(id) else { continue };
        if !f.is_user(fr.file, fr.module) {
            continue;
        }
        match inner {
            None => inner = Some(fr.func),
            // Python's module level calling `main()` says nothing.
            Some(_) if fr.func == Some("<module>") => return None,
            Some(func) if func != fr.func => {
                return Some(SourceLoc {
                    file: fr.file.or(fr.module).unwrap_or("?").to_string(),
                    line: fr.line,
                    function: fr.func.map(str::to_string),
                    origin: match fr.kind {
                        FrameKind::Python => FrameOrigin::Python,
                        _ => FrameOrigin::Native,
                    },
                    text: fr.text.map(str::to_string),
                    library: None,
                });
            }
            Some(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_and_substring() {
        assert!(pattern_matches("*/bin/python*", "/usr/bin/python3.12"));
        assert!(!pattern_matches("*/bin/python*", "/home/u/train.py"));
        assert!(pattern_matches(
            "*/lib/python3.*",
            "/usr/lib/python3.12/threading.py"
        ));
        assert!(!pattern_matches(
            "*/lib/python3.*",
            "/home/u/lib/python2/x.py"
        ));
        assert!(pattern_matches("a?c", "abc"));
        assert!(!pattern_matches("a?c", "abbc"));
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("libtorch", "/x/libtorch_cuda.so"));
    }

    #[test]
    fn filter_rules() {
        let f = FrameFilter::default();
        assert!(f.is_user(Some("/home/u/train.py"), None));
        assert!(!f.is_user(
            Some("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"),
            None
        ));
        assert!(!f.is_user(Some("/usr/lib/python3.12/threading.py"), None));
        assert!(!f.is_user(None, Some("/home/u/app")), "no file, no include");
        assert!(!f.is_user(
            Some("/usr/include/c++/13/bits/std_function.h"),
            Some("/home/u/app")
        ));
        assert!(!f.is_user(Some("x.cpp"), Some("/usr/lib/libtorch_cuda.so")));
        let mut g = f.clone();
        g.include.push("site-packages/mylib".into());
        assert!(g.is_user(Some("/venv/lib/python3.12/site-packages/mylib/a.py"), None));
        assert!(g.validate().is_ok());
        g.exclude.push(String::new());
        assert!(g.validate().is_err());
    }
}
