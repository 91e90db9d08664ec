"""Fault injection for the test suite: named checkpoints in publish, copy and fetch, where a test can make the
process die (`kill -9`) or the disk fill up (ENOSPC), to prove that every stage leaves a state the next run heals.

    ENGINEFARM_FAULT_AT=STAGE[#N][:ACTION]

STAGE is a checkpoint name (`STAGES`), N the hit that fires (default 1; a stage inside a loop is hit once per
chunk or blob), ACTION `kill` (SIGKILL, the default), `enospc` (an OSError as from a full disk) or `pause` (SIGSTOP:
the test runs another process, e.g. `gc`, at that very point, then sends SIGCONT). Unset, a checkpoint is one
dictionary lookup. The variable is read here and nowhere else; it is not a user setting."""

from __future__ import annotations

import errno
import os
import signal

VARIABLE = "ENGINEFARM_FAULT_AT"
STAGES = (
    "publish:blob",  # after each blob is stored
    "publish:manifest",  # after the manifest is written, before the index
    "publish:index",  # after the index is updated
    "store:blob-temp",  # a local store's blob is written to its temp name, not yet linked into place
    "copy:blob-temp",  # `publish --from --to`: a blob copied into the local temp folder, not yet uploaded
    "fetch:chunk",  # a fetch wrote one more decoded chunk into the cache's tmp/
    "fetch:file",  # a fetch finished one file of the artifact
    "fetch:commit",  # every file is verified; the artifact is about to be moved into place
)
_hits: dict[str, int] = {}


def checkpoint(stage: str) -> None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    where, action = _split(spec)
    name, _, nth = where.partition("#")
    if name != stage:
        return
    _hits[stage] = _hits.get(stage, 0) + 1
    if _hits[stage] != int(nth or 1):
        return
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(injected at {stage})")
    if action == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)  # POSIX only, like the tests that use it
        return
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows has no SIGKILL


def _split(spec: str) -> tuple[str, str]:
    """'publish:blob#2:enospc' → ('publish:blob#2', 'enospc'): stage names hold one ':' themselves."""
    parts = spec.split(":")
    if len(parts) >= 3:
        return ":".join(parts[:2]), parts[2]
    return spec, "kill"
