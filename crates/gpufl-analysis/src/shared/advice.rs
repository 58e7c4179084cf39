//! Advice for this program: what kind of program a session recorded (C/C++, PyTorch, JAX, CuPy,
//! TensorFlow or other Python), read once from its frames into [`Ctx::program`], and the one
//! function that picks a fix text in that program's words, [`advice`]. A rule's fix is a [`Fix`]:
//! its text for a C/C++ program (the CUDA runtime API: `cudaMallocAsync`, `cudaHostAlloc`,
//! `cudaStreamBeginCapture`…), and where the advice reads differently in a framework, that
//! framework's (`DataLoader(pin_memory=True)`, `jax.jit`, `cupyx.empty_pinned`…).
//!
//! The program kind: a session with no Python frame is C/C++, whatever libraries it links
//! (a LibTorch program gets CUDA's words, not PyTorch's). With Python frames, the framework whose
//! packages hold the most frames — Python frames' files under `site-packages/torch/…` (or
//! `jax`, `jaxlib`, `cupy`, `tensorflow`…), native frames' modules (`libtorch_cuda.so`,
//! `libc10.so`, `xla_cuda_plugin.so`, `cupy_backends/…`, `libtensorflow…`) — else plain Python.
//!
//! [`Ctx::program`]: crate::shared::Ctx

use crate::model::Model;
use gpufl_trace::{FrameId, FrameKind};

/// The kind of program a session recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// No Python frame: C, C++, CUDA C++ (or another native language).
    Native,
    /// Python without a framework [`Program::of`] recognizes (Numba, cuda-python, PyCUDA…).
    Python,
    PyTorch,
    Jax,
    CuPy,
    TensorFlow,
}

/// The frameworks, in the order a tie between their frame counts is settled.
const FRAMEWORKS: [Program; 4] = [
    Program::PyTorch,
    Program::Jax,
    Program::CuPy,
    Program::TensorFlow,
];

/// The framework an installed package belongs to.
fn package_framework(pkg: &str) -> Option<Program> {
    match pkg {
        "torch" | "functorch" | "torchvision" | "torchaudio" => Some(Program::PyTorch),
        "jax" | "jaxlib" | "jax_plugins" | "flax" | "optax" => Some(Program::Jax),
        "cupy" | "cupyx" | "cupy_backends" => Some(Program::CuPy),
        "tensorflow" | "keras" | "tf_keras" => Some(Program::TensorFlow),
        _ => None,
    }
}

/// The framework a frame's file (Python) or module (native) belongs to: by its installed package,
/// else by a native module's name.
fn frame_framework(path: &str, native: bool) -> Option<Program> {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = path.rfind(marker) {
            let pkg = path[i + marker.len()..].split('/').next().unwrap_or("");
            let pkg = pkg.strip_suffix(".py").unwrap_or(pkg);
            if let Some(p) = package_framework(pkg) {
                return Some(p);
            }
        }
    }
    if !native {
        return None;
    }
    let base = path.rsplit('/').next().unwrap_or(path);
    if base.starts_with("libtorch") || base.starts_with("libc10") {
        Some(Program::PyTorch)
    } else if base.starts_with("xla_") || base.starts_with("libjax") {
        Some(Program::Jax)
    } else if base.starts_with("libtensorflow") {
        Some(Program::TensorFlow)
    } else {
        None
    }
}

impl Program {
    /// The program kind of a session, from every frame it recorded (see the module's
    /// documentation).
    pub(crate) fn of(m: &Model) -> Program {
        let mut python = false;
        let mut counts = [0u64; FRAMEWORKS.len()];
        for i in 0..m.frames.len() {
            let Some(f) = m.frame(FrameId(i as u32)) else {
                continue;
            };
            let native = f.kind != FrameKind::Python;
            python |= !native;
            let path = if native { f.module } else { f.file };
            if let Some(p) = path.and_then(|p| frame_framework(p, native)) {
                if let Some(k) = FRAMEWORKS.iter().position(|&q| q == p) {
                    counts[k] += 1;
                }
            }
        }
        if !python {
            return Program::Native;
        }
        // The first of the most counted (`max_by_key` keeps the last of equals: reversed).
        FRAMEWORKS
            .iter()
            .zip(counts)
            .rev()
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(_, n)| *n)
            .map_or(Program::Python, |(&p, _)| p)
    }
}

/// A fix in each program's words. `native` is the C/C++ text (the CUDA runtime API), the only
/// one required, and never names a framework; a Python program without its own text gets
/// `python`, else `native`; a framework without its own text gets `python`, else `native`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fix {
    pub native: &'static str,
    pub python: Option<&'static str>,
    pub torch: Option<&'static str>,
    pub jax: Option<&'static str>,
    pub cupy: Option<&'static str>,
}

impl Fix {
    /// A fix that reads the same in every program.
    pub(crate) const fn any(text: &'static str) -> Fix {
        Fix {
            native: text,
            python: None,
            torch: None,
            jax: None,
            cupy: None,
        }
    }
}

/// The text of `fix` for a `program`: its framework's, else its generic Python one (any Python
/// program), else the C/C++ one. The one place fix texts are chosen by program.
pub(crate) fn advice(program: Program, fix: &Fix) -> &'static str {
    let own = match program {
        Program::Native => return fix.native,
        Program::PyTorch => fix.torch,
        Program::Jax => fix.jax,
        Program::CuPy => fix.cupy,
        Program::Python | Program::TensorFlow => None,
    };
    own.or(fix.python).unwrap_or(fix.native)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_name_their_framework() {
        let torch = "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
        assert_eq!(frame_framework(torch, false), Some(Program::PyTorch));
        // A virtualenv under a directory named torch says nothing.
        let np = "/opt/torch/.venv/lib/python3.12/site-packages/numpy/core/x.py";
        assert_eq!(frame_framework(np, false), None);
        let jax = "/opt/torch/.venv/lib/python3.12/site-packages/jax/_src/pjit.py";
        assert_eq!(frame_framework(jax, false), Some(Program::Jax));
        let plugin = "/v/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so";
        assert_eq!(frame_framework(plugin, true), Some(Program::Jax));
        assert_eq!(
            frame_framework("/usr/lib/libtorch_cuda.so", true),
            Some(Program::PyTorch)
        );
        assert_eq!(
            frame_framework("/v/site-packages/cupy_backends/cuda/api/runtime.so", true),
            Some(Program::CuPy)
        );
        assert_eq!(frame_framework("/home/u/app", true), None);
    }

    #[test]
    fn bundled_sessions_are_the_programs_they_recorded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
        for (dir, want) in [
            ("ping_pong-959-20261122T091718Z", Program::Native),
            ("malloc_free_loop-613-20261127T204121Z", Program::Native),
            ("hf_trainer-1609-20261124T064244Z", Program::PyTorch),
            ("pytorch_empty_cache-759-20261127T204130Z", Program::PyTorch),
            ("jax_train-1284-20261124T064215Z", Program::Jax),
        ] {
            let mut r = gpufl_trace::SessionReader::open(&root.join(dir)).expect(dir);
            let m = Model::load(r.by_ref());
            assert_eq!(Program::of(&m), want, "{dir}");
        }
    }

    #[test]
    fn advice_falls_back_to_python_then_native() {
        let f = Fix {
            native: "n",
            python: Some("p"),
            torch: Some("t"),
            jax: None,
            cupy: None,
        };
        assert_eq!(advice(Program::Native, &f), "n");
        assert_eq!(advice(Program::PyTorch, &f), "t");
        assert_eq!(advice(Program::Jax, &f), "p");
        assert_eq!(advice(Program::TensorFlow, &f), "p");
        let g = Fix { python: None, ..f };
        assert_eq!(advice(Program::Python, &g), "n");
        assert_eq!(advice(Program::Native, &Fix::any("a")), "a");
    }
}
