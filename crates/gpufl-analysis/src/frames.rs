//! Which frames of a stack are shown: a recorded stack (innermost first) begins inside the
//! recorder's callback, CUPTI and the driver, then the CUDA runtime's internals — six
//! `?? [libcupti.so…]` frames and a `?? [libcuda.so…]` one in every stack of a CUDA 13 session —
//! before it reaches the call the program made. [`first_shown_frame`] says where the shown part
//! begins; every view of a stack (`gpufl dump`, `gpufl export`, the dashboard's line page and the
//! server's line API) starts there unless asked for every frame (`--all-frames`).
//!
//! Hidden, only while they lead the stack (a frame after the first shown one is never hidden):
//!
//! - the recorder's frames (module `libgpufl_capture…`), CUPTI's (`libcupti…`) and the driver's
//!   (`libcuda.so…`), named or not: the driver API's entry points (`cuStreamSynchronize` in
//!   `libcuda.so`, which JAX calls directly) go too, since the record they belong to already
//!   names the call (its sync kind, its call site's API) and the frame under them says who made it;
//! - the CUDA runtime's internals: frames of `libcudart…` whose function is unnamed or not a
//!   public entry point (`cuda…`), and, in a program that links the runtime statically, frames
//!   named `cudart::…` or `__cudart…` in any module.
//!
//! Kept as the first frame shown: the runtime's public entry point (`cudaStreamSynchronize
//! [libcudart.so.13]`, `cudaMemcpy [app]` for a static runtime), which names the call, then
//! everything outward of it. Python frames are never hidden. A stack whose every frame is hidden
//! (a walk cut short inside CUDA, see `userframe::is_cut_in_cuda`) shows no frame.

use crate::lines::StackFrame;
use crate::views::FrameView;
use gpufl_trace::{Frame, FrameKind, Symbols};

/// What [`first_shown_frame`] reads of a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameParts<'a> {
    /// A Python frame (never hidden).
    pub python: bool,
    /// Shared object or executable path (native frames).
    pub module: Option<&'a str>,
    /// Function name (`None` or `??` when unresolved).
    pub function: Option<&'a str>,
}

impl<'a> FrameParts<'a> {
    /// A trace file's frame record, its strings resolved in `syms`.
    pub fn of_record(f: &Frame, syms: &'a Symbols) -> FrameParts<'a> {
        FrameParts {
            python: f.kind == FrameKind::Python,
            module: syms.opt_str(f.module),
            function: syms.opt_str(f.func),
        }
    }

    /// Whether this frame is hidden when it leads a stack.
    fn hidden(&self) -> bool {
        if self.python {
            return false;
        }
        let module = self.module.map(|m| m.rsplit('/').next().unwrap_or(m));
        let function = self.function.filter(|f| !f.is_empty() && *f != "??");
        if let Some(m) = module {
            if ["libgpufl_capture", "libcupti", "libcuda.so"]
                .iter()
                .any(|p| m.starts_with(p))
            {
                return true;
            }
            if m.starts_with("libcudart") {
                return !function.is_some_and(|f| f.starts_with("cuda"));
            }
        }
        function.is_some_and(|f| f.starts_with("cudart::") || f.starts_with("__cudart"))
    }
}

impl<'a> From<&'a StackFrame> for FrameParts<'a> {
    fn from(f: &'a StackFrame) -> Self {
        FrameParts {
            python: f.kind == "python",
            module: f.module.as_deref(),
            function: f.function.as_deref(),
        }
    }
}

impl<'a> From<&FrameView<'a>> for FrameParts<'a> {
    fn from(f: &FrameView<'a>) -> Self {
        FrameParts {
            python: f.kind == FrameKind::Python,
            module: f.module,
            function: f.func,
        }
    }
}

/// The index of the first frame shown of a stack given innermost first: the number of its
/// leading frames that belong to the recorder, CUPTI, the driver or the CUDA runtime's internals
/// (the module's documentation says which). Show `&frames[first_shown_frame(…)..]`; the stack's
/// length when every frame is hidden.
pub fn first_shown_frame<'a>(frames: impl IntoIterator<Item = FrameParts<'a>>) -> usize {
    frames.into_iter().take_while(FrameParts::hidden).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native<'a>(module: &'a str, function: Option<&'a str>) -> FrameParts<'a> {
        FrameParts {
            python: false,
            module: Some(module),
            function,
        }
    }

    #[test]
    fn leading_cuda_frames_are_hidden_up_to_the_runtime_entry_point() {
        let cupti = native("/usr/local/cuda/lib64/libcupti.so.13", None);
        let driver = native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", None);
        let inner = native("/x/libcudart.so.13", Some("??"));
        let entry = native("/x/libcudart.so.13", Some("cudaStreamSynchronize"));
        let torch = native("/x/libtorch_cuda.so", Some("at::native::copy_"));
        let s = [cupti, cupti, driver, inner, entry, torch, cupti];
        assert_eq!(
            first_shown_frame(s),
            4,
            "the runtime's entry point is shown"
        );
        // Nothing after the first shown frame is hidden, however it looks.
        assert_eq!(first_shown_frame([torch, cupti, driver]), 0);
        // The driver's named entry point goes (JAX calls the driver API).
        let cu = native("/x/libcuda.so.1", Some("cuStreamSynchronize"));
        let xla = native("/x/xla_cuda_plugin.so", Some("stream_executor::gpu::X"));
        assert_eq!(first_shown_frame([cupti, driver, cu, xla]), 3);
        // The recorder's own frames.
        let rec = native("/x/site-packages/gpufl/libgpufl_capture.so", Some("cb"));
        assert_eq!(first_shown_frame([rec, cupti, entry]), 2);
        // A static runtime: its internals are named `cudart::…`, its entry points `cuda…`.
        let st = native("/home/u/app", Some("cudart::cudaApiMemcpy(void*)"));
        let st_entry = native("/home/u/app", Some("cudaMemcpy"));
        assert_eq!(first_shown_frame([cupti, driver, st, st_entry]), 3);
        // All hidden: nothing shown. Python frames never hidden; unknown frames kept.
        assert_eq!(first_shown_frame([cupti, driver]), 2);
        let py = FrameParts {
            python: true,
            module: Some("libcuda.so.1"),
            function: None,
        };
        assert_eq!(first_shown_frame([py, cupti]), 0);
        assert_eq!(first_shown_frame([FrameParts::default(), cupti]), 0);
        // libcudart is not libcuda.so, libcuda.so.1 is.
        assert_eq!(
            first_shown_frame([native("libcudart.so", Some("cudaFree"))]),
            0
        );
    }
}
