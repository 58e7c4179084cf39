//! Paths that are not a user's code: the frames the analysis skips when it looks for "your line"
//! (gpufl-analysis `userframe::BUILTIN_EXCLUDES`) and the recorder's metrics feed skips when it
//! names a process's top sync line. One list, so the two agree.

/// Substrings of a frame's file or module that mark it as not the user's code.
pub const NOT_USER_CODE: &[&str] = &[
    // CUDA, CUPTI and the recorder itself.
    "libcuda.so",
    "libcudart",
    "libcupti",
    "libgpufl_capture",
    "/usr/local/cuda",
    // nvcc's generated host stubs of `kernel<<<…>>>` (`__device_stub__…` in a temporary
    // `tmpxft_…cudafe1.stub.c`): the launch's user frame is the line with the `<<<…>>>`.
    "cudafe1.stub.c",
    "tmpxft_",
    // The C runtime, loader and C++ runtime (and system headers inlined into user code).
    "libc.so",
    "libc-2.",
    "ld-linux",
    "libstdc++",
    "libgcc_s",
    "/usr/include/",
    // The Python interpreter (shared library or executable), its stdlib, installed packages.
    "libpython",
    "/bin/python",
    "/lib/python3.",
    "/lib64/python3.",
    "site-packages",
    "dist-packages",
    "<frozen ",
    // Generated code: torch.compile's output code and Triton launchers in Inductor's default
    // cache directory (`$TMPDIR/torchinductor_<user>/`), Triton's own cache (`~/.triton/cache/`).
    // The user's line is the call of the compiled function.
    "torchinductor_",
    "/.triton/cache/",
    // PyTorch's C++.
    "libtorch",
    "libc10",
];
