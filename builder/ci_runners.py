"""The runner labels a job builds on: its backend's (`runner_labels`), or, with a farm's runners file, the runner that
can build it, routed by target and memory:

    [[runner]]
    name = "rtx4090"                                  # optional, for messages
    labels = ["self-hosted", "nvidia", "sm_89"]       # GitHub Actions runs-on labels
    targets = ["tensorrt:sm_89", "tensorrt-rtx:sm_89", "tensorrt:ampere+"]
    ram_gb = 64                                       # host memory a build may use
    vram_gb = 24                                      # GPU memory (0: no GPU, a CPU runner)
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from enginefarm.backends import get_backend
from enginefarm.cache.manifest import Target
from enginefarm.errors import RecipeError

from .recipe import Resources


@dataclass(frozen=True)
class Runner:
    name: str
    labels: tuple[str, ...]
    targets: tuple[str, ...]
    ram_gb: float
    vram_gb: float


def load_runners(path: str | Path) -> list[Runner]:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RecipeError(path, "", "runners file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(path, "", f"not valid TOML: {exc}") from None
    unknown = set(data) - {"runner"}
    if unknown:
        raise RecipeError(path, sorted(unknown)[0], "unknown key", hint="a runners file holds [[runner]] tables only")
    runners = []
    for index, raw in enumerate(data.get("runner", [])):
        key = f"runner[{index}]"
        extra = set(raw) - {"name", "labels", "targets", "ram_gb", "vram_gb"}
        if extra:
            raise RecipeError(
                path, f"{key}.{sorted(extra)[0]}", "unknown key", hint="allowed: name, labels, targets, ram_gb, vram_gb"
            )
        for field in ("labels", "targets"):
            value = raw.get(field)
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise RecipeError(path, f"{key}.{field}", "must be a non-empty list of strings")
        for field in ("ram_gb", "vram_gb"):
            if (
                not isinstance(raw.get(field, 0), (int, float))
                or isinstance(raw.get(field, 0), bool)
                or raw.get(field, 0) < 0
            ):
                raise RecipeError(path, f"{key}.{field}", "must be a number >= 0")
        runners.append(
            Runner(
                str(raw.get("name", "/".join(raw["labels"]))),
                tuple(raw["labels"]),
                tuple(raw["targets"]),
                float(raw.get("ram_gb", 0)),
                float(raw.get("vram_gb", 0)),
            )
        )
    if not runners:
        raise RecipeError(path, "runner", "no runners", hint="add at least one [[runner]] table")
    return runners


def route(
    target: str,
    needs: Resources,
    runners: list[Runner],
    *,
    on_cpu: bool | None = None,
    gpu_needed: tuple[str, str] | None = None,
) -> tuple[Runner | None, str]:
    """The smallest runner that builds `target` with enough memory, or None and why not.

    `on_cpu`: the build uses no GPU (default: CPU targets), so the component's GPU memory does not count.
    `gpu_needed` (why, fix): a job whose options need a GPU at build time goes only to runners that have one."""
    able = [r for r in runners if target in r.targets]
    if not able:
        return None, f"no runner builds {target}"
    if gpu_needed is not None:
        able = [r for r in able if r.vram_gb > 0]
        if not able:
            why, fix = gpu_needed
            return None, f"refused: {why}, and no runner with a GPU builds {target}; {fix}"
    if (
        on_cpu if on_cpu is not None else target.endswith(":cpu")
    ):  # a CPU build uses no GPU memory, whatever the component needs on GPUs
        needs = Resources(needs.host_ram_gb, 0.0)
    fits = [r for r in able if r.ram_gb >= needs.host_ram_gb and r.vram_gb >= needs.gpu_vram_gb]
    if not fits:
        most_ram = max(r.ram_gb for r in able)
        most_vram = max(r.vram_gb for r in able)
        wanted = []
        if needs.host_ram_gb > most_ram:
            wanted.append(f"{math.ceil(needs.host_ram_gb * 10) / 10:g} GB RAM (largest {target} runner: {most_ram:g})")
        if needs.gpu_vram_gb > most_vram:
            wanted.append(f"{needs.gpu_vram_gb:g} GB VRAM (largest {target} runner: {most_vram:g})")
        return None, "no runner has enough memory: needs " + " and ".join(
            wanted or ["more memory than any single runner"]
        )
    return min(fits, key=lambda r: (r.vram_gb, r.ram_gb)), ""


def runner_labels(target: Target, on_cpu: bool = False) -> list[str]:
    """Labels of the runner that builds `target` when no runners file is given; `on_cpu`: one without a GPU does
    (TensorRT-RTX's default jobs)."""
    return get_backend(target.backend).runner_labels(target.device, on_cpu)
