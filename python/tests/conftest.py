"""Shared test settings. The native walk of a captured stack is cut at a time bound
(GPUFL_SYNC_PY_UNWIND_US; crates/gpufl-capture/src/stack.rs); on a loaded CI machine a
preemption in the middle of a walk exceeds it and the capture keeps its Python frames only.
These tests check what a capture contains, not the bound (the Rust tests of `unwind` do), so the
bound is widened for every test process and the processes they start."""
import os

os.environ.setdefault("GPUFL_SYNC_PY_UNWIND_US", "1000000")
