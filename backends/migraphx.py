"""AMD MIGraphX: compiled .mxr programs per gfx target, with dynamic-dimension bounds from the profile.

Written against MIGraphX's Python API (src/py/migraphx_py.cpp): `parse_onnx(map_input_dims=…,
map_dyn_input_dims=…)`, `shape.dynamic_dimension(min, max, optimals)`, `quantize_fp16`, `program.compile(
get_target("gpu"))`, `save`/`load`, `program.run({name: argument})`. MIGraphX compiles its kernels for the
gfx architecture the HIP runtime reports for the current device; there is no target option. So the build runs
in a subprocess whose environment picks a GPU of the wanted gfx (HIP_VISIBLE_DEVICES) or, when the host has
none, makes ROCm report the wanted one (HSA_OVERRIDE_GFX_VERSION): a cross-compile. A crash in the SDK then
fails only the job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from enginefarm.errors import BackendUnavailable, BuildError
from enginefarm.hardware.device_info import amd_gpus

from .base import Availability, Backend, Built, BuiltFile, Feature, Rank
from .build_job import BuildJob
from .manifest_files import role_file

log = logging.getLogger(__name__)

PROGRAM = "model.mxr"
BUILD_TIMEOUT_S = 4 * 3600


def _mgx():
    return BACKEND.sdk()


def gfx_version(gfx: str) -> str:
    """gfx1100 → 11.0.0, gfx90a → 9.0.10: the form HSA_OVERRIDE_GFX_VERSION takes (major, minor, stepping)."""
    digits = gfx.removeprefix("gfx")
    return f"{int(digits[:-2])}.{int(digits[-2], 16)}.{int(digits[-1], 16)}"


def build_env(gfx: str, base: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """The environment that makes MIGraphX compile for `gfx` on this host, and how (for the build notes)."""
    env = dict(os.environ if base is None else base)
    gpus, _ = amd_gpus()
    index = next((i for i, g in enumerate(gpus) if g["gfx"] == gfx), None)
    if index is not None:
        env["HIP_VISIBLE_DEVICES"] = str(index)
        env.pop("HSA_OVERRIDE_GFX_VERSION", None)
        return env, f"compiled on GPU {index} ({gpus[index]['name']}, {gfx})"
    env["HSA_OVERRIDE_GFX_VERSION"] = gfx_version(gfx)
    host = ", ".join(sorted({g["gfx"] for g in gpus})) or "no GPU"
    return env, f"cross-compiled for {gfx} on {host} (HSA_OVERRIDE_GFX_VERSION={env['HSA_OVERRIDE_GFX_VERSION']})"


def parse_plan(job: BuildJob) -> dict:
    """What the build subprocess does: fixed dims when every input is static, else min/max/opt per dimension."""
    static = all(shapes["min"] == shapes["max"] for shapes in job.profile.values())
    inputs = {
        name: {"min": shapes["min"], "opt": shapes["opt"], "max": shapes["max"]} for name, shapes in job.profile.items()
    }
    return {"static": static, "inputs": inputs, "fp16": job.precision == "fp16"}


def _compile(onnx_path: str, plan_path: str, out_path: str) -> None:
    """Runs in the build subprocess."""
    mgx = _mgx()
    plan = json.loads(Path(plan_path).read_text())
    if plan["static"]:
        program = mgx.parse_onnx(onnx_path, map_input_dims={n: s["min"] for n, s in plan["inputs"].items()})
    else:
        dims = {
            name: [
                mgx.shape.dynamic_dimension(lo, hi, {opt})
                for lo, opt, hi in zip(s["min"], s["opt"], s["max"], strict=True)
            ]
            for name, s in plan["inputs"].items()
        }
        program = mgx.parse_onnx(onnx_path, map_dyn_input_dims=dims)
    if plan["fp16"]:
        mgx.quantize_fp16(program)
    program.compile(mgx.get_target("gpu"), offload_copy=True)
    mgx.save(program, out_path, format="msgpack")


class MigraphxSession:
    def __init__(self, program, input_names: list[str], output_names: list[str], precision: str) -> None:
        self._program = program
        self.input_names = input_names
        self.output_names = output_names
        self.compute_precision = precision

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mgx = _mgx()
        # The arguments borrow the arrays' memory: keep them alive until run returns.
        arrays = {name: np.ascontiguousarray(feeds[name]) for name in self.input_names}
        results = self._program.run({name: mgx.argument(array) for name, array in arrays.items()})
        return {name: np.array(result, copy=True) for name, result in zip(self.output_names, results, strict=True)}

    def close(self) -> None:
        self._program = None


class MIGraphX(Backend):
    probes = ("amd",)
    name = "migraphx"
    sdk_module = "migraphx"
    devices = re.compile(r"^gfx[0-9a-f]{3,4}$")
    device_hint = "a gfx target such as gfx1100, gfx1030, gfx90a"
    install = (
        "install ROCm's MIGraphX: apt install migraphx, from ROCm's apt repository (the PyPI 'migraphx' is a "
        "placeholder)"
    )
    onnx_precision = "fp32"  # fp16 is MIGraphX's own quantize_fp16, which keeps float32 inputs and outputs
    vendor_label = "amd"
    example_device = "gfx1100"
    features = frozenset({Feature.OWN_VALIDATION})

    def available(self, device: str) -> Availability:
        try:
            self.sdk()
        except BackendUnavailable as exc:
            return Availability.missing(str(exc))
        gpus, why = amd_gpus()
        if not gpus:
            return Availability.missing(f"MIGraphX is installed but there is no AMD GPU to compile on: {why}")
        if not any(g["gfx"] == device for g in gpus):
            here = ", ".join(sorted({g["gfx"] for g in gpus}))
            return Availability(
                True, False, f"no {device} GPU here (found {here}): builds are cross-compiled and not run"
            )
        return Availability(True, True)

    def constraints(self, job: BuildJob) -> dict:
        # A saved program holds code objects for one gfx, serialized by one MIGraphX release.
        return {"runtime": {"migraphx": "==" + self.versions()["migraphx"]}, "arch": job.target.device, "os": ["linux"]}

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        plan_path = workdir.parent / "migraphx-plan.json"
        plan_path.write_text(json.dumps(parse_plan(job)))
        env, how = build_env(job.target.device)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "enginefarm.backends.migraphx",
                str(prepared_onnx),
                str(plan_path),
                str(workdir / PROGRAM),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=BUILD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit status {proc.returncode}"]
            raise BuildError(f"{job.label}: MIGraphX build process failed ({how}): {lines[-1][:300]}")
        return Built([BuiltFile(PROGRAM, "engine")], {"migraphx": how})

    def load(self, artifact_dir: Path, manifest, device: str = "") -> MigraphxSession:
        mgx = self.sdk()
        gfx = manifest.parsed_target.device
        avail = self.available(gfx)
        if not avail.can_load:
            raise BackendUnavailable(f"cannot run a {gfx} program here: {avail.reason}")
        path = role_file(manifest, "engine")
        program = mgx.load(str(Path(artifact_dir) / path), format="msgpack")
        inputs = [t["name"] for t in manifest.io.get("inputs", [])] or list(program.get_parameter_names())
        outputs = [t["name"] for t in manifest.io.get("outputs", [])]
        return MigraphxSession(program, inputs, outputs, manifest.precision)

    def validation_session(self, artifact_dir: Path, manifest, device: str):
        """The program itself where a GPU of its gfx is here; a cross-compiled program is recorded as not run."""
        here = self.available(device)
        if here.can_load:
            return self.load(artifact_dir, manifest, device), {}
        return None, {"why": here.reason}

    def device_classes(self, device) -> tuple[str, ...]:
        gfx = device.info.get("gfx")
        return (gfx,) if device.kind == "amd" and gfx else ()

    def rank(self, device_class: str) -> Rank:
        return Rank.EXACT_ARCH  # a saved program holds code objects for one gfx


BACKEND = MIGraphX()


if __name__ == "__main__":
    _compile(*sys.argv[1:4])
