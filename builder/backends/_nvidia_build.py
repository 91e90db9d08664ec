"""The build process of the NVIDIA backends: `python -m enginefarm.builder.backends._nvidia_build SPEC RESULT PARENT_PID`.

It imports the SDK itself and writes RESULT (JSON: notes, or the error). If the SDK kills it instead (segfault,
abort, out of memory), RESULT is missing and the parent reports how the process died.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from enginefarm.cache.atomic import write_bytes_atomic

from .. import rss
from ._nvidia import BuildSpec, build_plan, die_with_parent


def main(spec_path: str, result_path: str, parent: str) -> int:
    die_with_parent(int(parent))
    spec = BuildSpec(**json.loads(Path(spec_path).read_text()))
    try:
        notes = build_plan(importlib.import_module(spec.sdk), spec)
    except Exception as exc:  # the SDK's own errors: reported as the job's failure, with the first line
        text = str(exc).strip().splitlines()
        write_bytes_atomic(Path(result_path), json.dumps({"error": f"{type(exc).__name__}: {text[0][:500] if text else ''}"}).encode())
        return 1
    # The build's own peak (this process's VmHWM), which the job's "compile" stage adds to its own memory.
    notes["build_process_peak_rss_mb"] = rss.mb(rss.peak_bytes())
    write_bytes_atomic(Path(result_path), json.dumps({"notes": notes}).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
