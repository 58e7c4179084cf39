"""pytorch_train_upload.py - gpufl example: record in-process, then upload to a gpufl server.

The seed's C++ snippet (init, workload, shutdown, deferred upload) in Python: gpufl.init() with
the server and key from GPUFL_SERVER / GPUFL_API_KEY, the training loop of pytorch_train_sync.py
(its in-loop torch.cuda.synchronize(), the planted line there; none in this file), gpufl.shutdown(),
and then, only when GPUFL_SERVER is set, gpufl.upload(): every session under --log-path goes to the
server (one line each on stderr), after the workload, never during it.

Run:    GPUFL_SERVER=http://host:8470 GPUFL_API_KEY=gfl_up_... \
          PYTHONPATH=python GPUFL_CAPTURE_LIB=target/release/libgpufl_capture.so \
          python examples/pytorch_train_upload.py [--steps 50] [--warmup 5] [--log-path DIR]
Prints: "final loss X.XXXXXX" (as pytorch_train_sync.py); exit 1 when a session failed to upload.
"""
import argparse
import os
import sys

import gpufl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_train_sync  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--steps", type=int, default=50)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--log-path", default="gpufl-sessions")
args = ap.parse_args()

gpufl.init(
    app_name="pytorch_train_upload",
    log_path=args.log_path,
    enable_stack_trace=True,
    backend_url=os.environ.get("GPUFL_SERVER"),  # None is fine
    api_key=os.environ.get("GPUFL_API_KEY"),
)
loss = pytorch_train_sync.main(args.steps, args.warmup)
gpufl.shutdown()
print(f"final loss {loss:.6f}")

if os.environ.get("GPUFL_SERVER"):
    # Deferred upload: after shutdown, never during the workload. Raises gpufl.UploadError when
    # nothing could be sent (no key, no session); returns the number of sessions that failed.
    failed = gpufl.upload()
    sys.exit(1 if failed else 0)
