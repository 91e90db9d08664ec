"""Reference outputs, computed once per source and set of cases, in their own process, kept on disk.

Every job of a component validates against ONNX Runtime's fp32 run of the original model on the same seeded
cases, so the run is done once and kept in the source's work folder (`references/<digest of the cases>.npz`,
see workcache.py). It runs in a fresh process: the reference model (as large as the artifact, for a UNet
3.4 GB) is gone before the artifact is loaded, and that process measures its own peak memory. Validation reads
the outputs back one case at a time.

Run as `python -m enginefarm.builder.references MODEL CASES_NPZ OUT_NPZ` it computes and writes the outputs,
then prints one JSON line with its peak RSS.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enginefarm.cache.atomic import atomic_writer
from enginefarm.cache.locks import file_lock
from enginefarm.errors import BuildError

from .stages import Probe

if TYPE_CHECKING:
    from .validate import Reference

Cases = list[tuple[str, dict[str, np.ndarray]]]
FORMAT = "v2"  # v2: each case also keeps the magnitude each output carries (the gate's noise floor needs it)


def cases_digest(cases: Cases) -> str:
    digest = hashlib.sha256()
    for corner, feeds in cases:
        digest.update(corner.encode() + b"\0")
        for name in sorted(feeds):
            array = np.ascontiguousarray(feeds[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


class References(Sequence["Reference"]):
    """The outputs of each case, read from the .npz when asked for (one case in memory at a time)."""

    def __init__(self, path: Path, count: int) -> None:
        self.path, self._count = path, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        from .validate import Reference

        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not 0 <= index < self._count:
            raise IndexError(index)
        with np.load(self.path, allow_pickle=False) as data:
            names = [str(n) for n in data["names"]]
            scales = data[f"c{index}_scales"]
            return Reference(
                {name: data[f"c{index}_o{j}"] for j, name in enumerate(names)},
                {name: float(scales[j]) for j, name in enumerate(names)},
            )


def reference_outputs_cached(model: Path, cases: Cases, folder: Path, probe: Probe | None = None) -> References:
    """The fp32 ONNX Runtime outputs of `model` for `cases`, from `folder` or computed now (and kept there)."""
    out = folder / "references" / f"{cases_digest(cases)[:32]}-{FORMAT}.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.with_suffix(".lock")):
        if not out.is_file():
            peak = _compute_in_subprocess(model, cases, out)
            if probe is not None:
                probe.subprocess(peak)
    return References(out, len(cases))


def _compute_in_subprocess(model: Path, cases: Cases, out: Path) -> int:
    feeds_path = out.with_name(f".cases-{secrets.token_hex(4)}.npz")
    np.savez(
        feeds_path,
        allow_pickle=False,  # numbers and names only; explicit, so no array name can set the flag
        **{f"c{i}_{name}": array for i, (_, feeds) in enumerate(cases) for name, array in feeds.items()},
        names=np.array(sorted({name for _, feeds in cases for name in feeds})),
        count=np.array(len(cases)),
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "enginefarm.builder.references", str(model), str(feeds_path), str(out)],
            capture_output=True,
            text=True,
        )
    finally:
        feeds_path.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise _reference_failure(proc)
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_bytes"])


def _reference_failure(proc: subprocess.CompletedProcess) -> BuildError:
    """The job's error, blaming the model only when ONNX Runtime also fails on the bare source (checked once)."""
    from .oom import KILLED, OutOfMemory, asked_bytes

    if proc.returncode == KILLED:  # the kernel's OOM killer sends SIGKILL and leaves no word
        return OutOfMemory("the fp32 reference run (ONNX Runtime, original model) was killed (SIGKILL)", asked=0)
    lines = (proc.stdout or "").strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}, no output"]
        return BuildError(
            f"the fp32 reference run (ONNX Runtime, original model) failed: {tail[0][:300]}",
            hint="the reference process died; check free memory and the model's size",
        )
    for said in (report.get("error") or "", report.get("bare_error") or ""):
        asked = asked_bytes(said)
        if asked is not None:  # the profile's largest case, not the model or enginefarm
            return OutOfMemory(f"the fp32 reference run ran out of memory: {said[:300]}", asked=asked)
    if report.get("bare_error"):
        return BuildError(
            f"the source model does not run on ONNX Runtime's CPU provider: {report['bare_error'][:300]}",
            hint="check the model with onnxruntime.InferenceSession(path) and re-export it",
        )
    return BuildError(
        f"the fp32 reference run failed although ONNX Runtime runs the bare source model: {report['error'][:300]}",
        hint="this is a bug in enginefarm's reference run, not in the model: please report it with this message",
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _bare_run_error(model: Path, cases) -> str | None:
    """What ONNX Runtime says when it runs the source as a user would (by its path, its own outputs), or None."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        for _, feeds in cases:
            session.run(None, feeds)
    except Exception as exc:
        return _one_line(exc)
    return None


def _main(model: str, feeds_path: str, out: str) -> None:
    from enginefarm.hardware import rss

    from .validate import reference_outputs

    with np.load(feeds_path, allow_pickle=False) as data:
        names = [str(n) for n in data["names"]]
        cases = [
            (str(i), {n: data[f"c{i}_{n}"] for n in names if f"c{i}_{n}" in data.files})
            for i in range(int(data["count"]))
        ]
    try:
        references = reference_outputs(Path(model), cases)
    except Exception as exc:  # reported to the parent as data: it decides whose fault it is
        print(json.dumps({"error": _one_line(exc), "bare_error": _bare_run_error(Path(model), cases[:1])}))
        sys.exit(1)
    order = list(references[0].outputs) if references else []
    arrays = {f"c{i}_o{j}": ref.outputs[name] for i, ref in enumerate(references) for j, name in enumerate(order)}
    arrays.update(
        {
            f"c{i}_scales": np.array([ref.scales.get(name, 0.0) for name in order], np.float64)
            for i, ref in enumerate(references)
        }
    )
    with atomic_writer(Path(out)) as handle:
        np.savez(handle, allow_pickle=False, names=np.array(order), **arrays)
    print(json.dumps({"peak_rss_bytes": rss.peak_bytes()}))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
