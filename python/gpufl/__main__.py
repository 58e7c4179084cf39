"""``python -m gpufl ARGS…``: the ``gpufl`` command with ARGS (``python -m gpufl record -- python
train.py``, ``python -m gpufl report gpufl-sessions``).

The command is the one installed with this package (the wheel puts it in the environment's
scripts directory, next to this interpreter's ``bin/``, or the user's with ``pip install
--user``), else the first ``gpufl`` on PATH; `record` uses the capture library bundled in this
package (unless GPUFL_CAPTURE_LIB names one).
"""

import os
import shutil
import sys
import sysconfig


def command():
    """Path of the ``gpufl`` executable, or None."""
    dirs = [sysconfig.get_path("scripts")]
    try:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    dirs.append(os.path.dirname(sys.executable))
    for d in dirs:
        p = os.path.join(d, "gpufl") if d else None
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which("gpufl")


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    exe = command()
    if exe is None:
        sys.stderr.write("gpufl: the gpufl command is not installed (pip install <gpufl "
                         "checkout>, or put `gpufl` on PATH)\n")
        return 127
    # The capture library of this package for `record`, unless one is named already.
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgpufl_capture.so")
    if os.path.isfile(bundled):
        os.environ.setdefault("GPUFL_CAPTURE_LIB", bundled)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *args])


if __name__ == "__main__":
    sys.exit(main())
