"""What the Python tests run: the source tree's package and debug build (default: python/ on
PYTHONPATH, target/debug/gpufl and libgpufl_capture.so, or $GPUFL_CAPTURE_LIB), or, with
GPUFL_TEST_INSTALLED=1, the installed wheel (the `gpufl` package this interpreter imports, its
bundled capture library, and the `gpufl` command installed beside the interpreter): CI installs
the wheel into a fresh venv and runs these tests with that venv's Python.
"""

import os
import shutil
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("GPUFL_TEST_INSTALLED") == "1"


def _installed():
    import gpufl
    import gpufl.__main__

    pkg = Path(gpufl.__file__).resolve().parent
    assert not str(pkg).startswith(str(REPO_ROOT / "python")), (
        f"GPUFL_TEST_INSTALLED=1 but gpufl is imported from the source tree ({pkg})")
    cli = gpufl.__main__.command()
    return pkg, Path(cli) if cli else Path(sysconfig.get_path("scripts")) / "gpufl"


if INSTALLED:
    PACKAGE_DIR, CLI = _installed()
    LIB = Path(os.environ.get("GPUFL_CAPTURE_LIB", PACKAGE_DIR / "libgpufl_capture.so"))
    PYTHONPATH = None
else:
    PACKAGE_DIR = REPO_ROOT / "python" / "gpufl"
    CLI = REPO_ROOT / "target" / "debug" / "gpufl"
    LIB = Path(os.environ.get("GPUFL_CAPTURE_LIB",
                              REPO_ROOT / "target" / "debug" / "libgpufl_capture.so"))
    PYTHONPATH = REPO_ROOT / "python"

LIBDIR = LIB.parent


def with_package(env):
    """`env` with PYTHONPATH set so that a child Python imports the package under test."""
    if PYTHONPATH is not None:
        env["PYTHONPATH"] = str(PYTHONPATH) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def package_copy_without_library(dest):
    """A copy of the package's Python files under `dest` (no capture library in it): a
    directory to put on PYTHONPATH for a package that finds no library of its own."""
    out = Path(dest) / "gpufl"
    shutil.copytree(PACKAGE_DIR, out, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return Path(dest)


__all__ = ["REPO_ROOT", "INSTALLED", "PACKAGE_DIR", "CLI", "LIB", "LIBDIR", "PYTHONPATH",
           "with_package", "package_copy_without_library"]
