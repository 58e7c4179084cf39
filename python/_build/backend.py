"""PEP 517 build backend of the gpufl wheel (pyproject.toml names it): maturin's, after one step.

maturin builds the `gpufl` command (crates/gpufl-cli, bindings "bin": it lands in the
environment's bin/) and packs the Python package python/gpufl. The capture library is the
cdylib of another crate (crates/gpufl-capture), which maturin does not build: `build_wheel`
builds it first with cargo (the workspace), in the same Cargo profile, and copies it stripped into
python/gpufl/, where maturin packs it with the package (git ignores the copy). The Python API
loads it from there (`gpufl.library_path()`), and `gpufl record` finds it from the command.

The Cargo profile is `release` unless GPUFL_WHEEL_PROFILE names another (CI packs its `dev`
build: `GPUFL_WHEEL_PROFILE=dev` reuses what `cargo build --workspace` built). Extra maturin
arguments go in MATURIN_PEP517_ARGS as usual (scripts/build-wheel.sh asks for a manylinux tag).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import maturin
from maturin import (  # noqa: F401  (the rest of the interface is maturin's own)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

ROOT = Path(__file__).resolve().parents[2]
LIB = "libgpufl_capture.so"


def _profile():
    return os.environ.get("GPUFL_WHEEL_PROFILE", "release")


def _target_dir():
    env = os.environ.get("CARGO_TARGET_DIR")
    if env:
        return (ROOT / env).resolve()
    return ROOT / "target"


def _run(cmd):
    print("gpufl wheel: " + " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr)
    sys.stderr.flush()
    subprocess.run(cmd, cwd=ROOT, check=True)


def _build_capture_library():
    """cargo build of the capture library; its stripped copy in python/gpufl/."""
    profile = _profile()
    cargo = os.environ.get("CARGO", "cargo")
    # The whole workspace (the command's crates and the library's): the same build as
    # `cargo build --workspace`, so the one a checkout or CI already has is reused as it is
    # (`-p gpufl-capture` alone would unify features differently and rebuild it).
    _run([cargo, "build", "--profile", profile, "--workspace"])
    out = _target_dir() / ("debug" if profile == "dev" else profile) / LIB
    dst = ROOT / "python" / "gpufl" / LIB
    tmp = dst.with_suffix(".so.tmp")
    shutil.copyfile(out, tmp)
    strip = shutil.which("strip")
    if strip:
        # Symbols and debug info out; the dynamic symbol table (the C API) stays.
        _run([strip, "--strip-unneeded", tmp])
    os.replace(tmp, dst)


def _maturin_args():
    """MATURIN_PEP517_ARGS with this profile, unless it names one already."""
    args = shlex.split(os.environ.get("MATURIN_PEP517_ARGS", ""))
    if not any(a in ("--profile", "--release", "-r") or a.startswith("--profile=") for a in args):
        args += ["--profile", _profile()]
    return shlex.join(args)


def _with_maturin_args(fn, *a):
    saved = os.environ.get("MATURIN_PEP517_ARGS")
    os.environ["MATURIN_PEP517_ARGS"] = _maturin_args()
    try:
        return fn(*a)
    finally:
        if saved is None:
            os.environ.pop("MATURIN_PEP517_ARGS", None)
        else:
            os.environ["MATURIN_PEP517_ARGS"] = saved


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_capture_library()
    return _with_maturin_args(maturin.build_wheel, wheel_directory, config_settings,
                              metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_capture_library()
    return _with_maturin_args(maturin.build_editable, wheel_directory, config_settings,
                              metadata_directory)
