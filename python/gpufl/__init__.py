"""gpufl: the Python side of the gpufl flight recorder (pure Python, ctypes).

    import gpufl
    gpufl.init(app_name="train")           # not needed under `gpufl record`
    with gpufl.scope("forward"):
        loss = model(x)
    @gpufl.scope("step")
    def step(): ...
    gpufl.shutdown()
    gpufl.upload()                         # to a gpufl server: GPUFL_SERVER, GPUFL_API_KEY

The capture library is found, in order: the one CUDA loaded under `gpufl record`
(``CUDA_INJECTION64_PATH``), ``GPUFL_CAPTURE_LIB``, the one bundled in this package (the wheel's:
``pip install <gpufl checkout>``), or ``libgpufl_capture.so`` next to the ``gpufl`` executable on
PATH (same directory or ``../lib``). Without one every call is a no-op (one warning).

``python -m gpufl ARGS…`` runs the ``gpufl`` command (``python -m gpufl record -- python
train.py``).
"""

import ctypes
import functools
import os
import shutil
import warnings

__all__ = ["init", "shutdown", "scope", "pause", "resume", "capture_window", "session_dir",
           "upload", "UploadError", "library_path"]

OK, ALREADY_RUNNING, DISABLED, INTERNAL_ERROR = 0, 1, 2, 3
_LIB_NAME = "libgpufl_capture.so"

_lib = None
_lib_path = None
_looked = False


def _candidates():
    for var in ("CUDA_INJECTION64_PATH", "GPUFL_CAPTURE_LIB"):
        p = os.environ.get(var)
        if p and os.path.basename(p).startswith("libgpufl_capture"):
            yield p
    yield os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)
    exe = shutil.which("gpufl")
    if exe:
        d = os.path.dirname(os.path.realpath(exe))
        yield os.path.join(d, _LIB_NAME)
        yield os.path.join(d, "..", "lib", _LIB_NAME)


def _load():
    global _lib, _lib_path, _looked
    if _looked:
        return _lib
    _looked = True
    for p in _candidates():
        if not os.path.exists(p):
            continue
        try:
            # Under `gpufl record` the driver loaded it already: dlopen returns the same handle.
            lib = ctypes.CDLL(p)
        except OSError:
            continue
        lib.gpufl_init.argtypes = [ctypes.c_void_p]
        lib.gpufl_init.restype = ctypes.c_int
        lib.gpufl_scope_push.argtypes = [ctypes.c_char_p]
        lib.gpufl_scope_push.restype = None
        lib.gpufl_scope_pop.argtypes = []
        lib.gpufl_scope_pop.restype = None
        lib.gpufl_pause.restype = ctypes.c_int
        lib.gpufl_resume.restype = ctypes.c_int
        if hasattr(lib, "gpufl_capture_window"):
            lib.gpufl_capture_window.argtypes = [ctypes.c_double]
            lib.gpufl_capture_window.restype = ctypes.c_int
        lib.gpufl_session_dir.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.gpufl_session_dir.restype = ctypes.c_ssize_t
        if hasattr(lib, "gpufl_upload_logs"):
            lib.gpufl_upload_logs.argtypes = [ctypes.c_void_p]
            lib.gpufl_upload_logs.restype = ctypes.c_int
        _lib, _lib_path = lib, os.path.abspath(p)
        return _lib
    warnings.warn(
        "gpufl: capture library not found (install the gpufl wheel, set GPUFL_CAPTURE_LIB or put "
        "`gpufl` on PATH); "
        "gpufl calls do nothing",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def library_path():
    """Path of the capture library in use, or None."""
    _load()
    return _lib_path


class _Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("app_name", ctypes.c_char_p),
        ("log_path", ctypes.c_char_p),
        ("enable_synchronization", ctypes.c_int),
        ("enable_stack_trace", ctypes.c_int),
        ("backend_url", ctypes.c_char_p),
        ("api_key", ctypes.c_char_p),
        ("mode", ctypes.c_int),
        ("kernel_detail", ctypes.c_char_p),
    ]


def _b(s):
    return None if s is None else str(s).encode()


def init(app_name=None, log_path=None, enable_synchronization=True, enable_stack_trace=True,
         mode="default", kernel_detail=None, backend_url=None, api_key=None):
    """Start recording this process. Returns 0 (recording), 1 (already recording, e.g. under
    `gpufl record`), 2 (GPU capture unavailable: scopes are still recorded when possible) or 3;
    -1 when the library is missing. Synchronizations are recorded with the CPU stack that
    issued them (Python and native `file:line`), as under `gpufl record`;
    `enable_stack_trace=False` records them without (like `gpufl record --no-stacks`).
    `mode` is "default" or "always-on" (see the README).
    `kernel_detail` (docs/kernel-detail.md): an int N looks inside the top N kernels
    by GPU time, a string of comma-separated name fragments inside those kernels.
    `backend_url` and `api_key` (a gpufl server and an upload key) are what `upload()` uses when
    not given its own. GPUFL_* environment variables override the arguments."""
    if mode not in ("default", "always-on"):
        raise ValueError(f"mode must be 'default' or 'always-on', not {mode!r}")
    lib = _load()
    if lib is None:
        return -1
    # NVTX ranges (torch.cuda.nvtx.range, emit_nvtx) become scopes: NVTX loads the library
    # named here at its first call, which hands over to CUPTI.
    os.environ.setdefault("NVTX_INJECTION64_PATH", _lib_path)
    o = _Options(
        ctypes.sizeof(_Options),
        _b(app_name),
        _b(log_path),
        int(bool(enable_synchronization)),
        int(bool(enable_stack_trace)),
        _b(backend_url),
        _b(api_key),
        1 if mode == "always-on" else 0,
        _b(kernel_detail),
    )
    return lib.gpufl_init(ctypes.byref(o))


def shutdown():
    """Flush and close the session (also done at process exit)."""
    lib = _load()
    if lib is not None:
        lib.gpufl_shutdown()


def pause():
    """Pause recording; False when this process is not recording."""
    lib = _load()
    return lib is not None and lib.gpufl_pause() == OK


def resume():
    """Resume recording; False when this process is not recording."""
    lib = _load()
    return lib is not None and lib.gpufl_resume() == OK


def capture_window(seconds=10.0):
    """In always-on mode, record everything for the next `seconds` (a full-detail window).
    False when this process is not recording in always-on mode."""
    lib = _load()
    if lib is None or not hasattr(lib, "gpufl_capture_window"):
        return False
    return lib.gpufl_capture_window(float(seconds)) == OK


def session_dir():
    """The session directory, or None when not recording."""
    lib = _load()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(4096)
    n = lib.gpufl_session_dir(buf, len(buf))
    return buf.value.decode() if n > 0 else None


class _UploadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("log_path", ctypes.c_char_p),
        ("backend_url", ctypes.c_char_p),
        ("api_key", ctypes.c_char_p),
    ]


class UploadError(RuntimeError):
    """`upload()` could not start: no server or key, an unusable address, no session, or no
    capture library. `code` is gpufl_upload_logs' result (below 0), or None without a library."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


_UPLOAD_ERRORS = {
    -1: "no server or no key configured (pass server= and api_key=, or give init() backend_url "
        "and api_key, or set GPUFL_SERVER and GPUFL_API_KEY)",
    -2: "the server's address is unusable (it must be http://… or https://…)",
    -3: "no gpufl session under the log directory (or it cannot be read)",
    -4: "internal error in the capture library",
}


def upload(path=None, server=None, api_key=None):
    """Upload the sessions under `path` to a gpufl server (docs/server-api.md), as `gpufl upload`
    does; call it after `shutdown()`. Every session found under `path` is sent, not only this
    process's (the server stores each once); one still being recorded goes up to its last closed
    block. Arguments left None fall back to what `init()` was given (after the GPUFL_* variables),
    then to GPUFL_SERVER and ./gpufl-sessions. One line per session on stderr.

    Returns the number of sessions that failed (0: all stored). Raises UploadError when nothing
    could be uploaded (no server or key, a bad address, no session there, no library)."""
    lib = _load()
    if lib is None or not hasattr(lib, "gpufl_upload_logs"):
        raise UploadError(
            "gpufl.upload: " + ("capture library not found (set GPUFL_CAPTURE_LIB or put `gpufl` "
                                "on PATH)" if lib is None else
                                f"{_lib_path} is too old to upload (no gpufl_upload_logs)"))
    o = _UploadOptions(ctypes.sizeof(_UploadOptions), _b(path and os.fspath(path)), _b(server),
                       _b(api_key))
    rc = lib.gpufl_upload_logs(ctypes.byref(o))
    if rc < 0:
        raise UploadError(f"gpufl.upload: {_UPLOAD_ERRORS.get(rc, f'error {rc}')}", rc)
    return rc


class scope:
    """A named scope: ``with gpufl.scope("forward"):`` or ``@gpufl.scope("step")``."""

    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = str(name).encode()

    def __enter__(self):
        lib = _lib if _looked else _load()
        if lib is not None:
            lib.gpufl_scope_push(self._name)
        return self

    def __exit__(self, *exc):
        if _lib is not None:
            _lib.gpufl_scope_pop()
        return False

    def __call__(self, fn):
        name = self._name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            lib = _lib if _looked else _load()
            if lib is None:
                return fn(*args, **kwargs)
            lib.gpufl_scope_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                lib.gpufl_scope_pop()

        return wrapper
