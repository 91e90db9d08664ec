"""Seamless (tileable) variants of a stored artifact, derived on this device: `enginefarm.load(..., tiling="xy")`.

A seamless variant is the artifact with every 2D convolution padding circularly in the tiled axes (diffusers with
`padding_mode="circular"` on each Conv2d, as Easy Diffusion does). It is derived here from what the store already
serves, never built by the farm, so every model is tileable without a rebuild:

- **ONNX Runtime**: the artifact's ONNX graph rewritten (builder/seamless_onnx.py); weights untouched.
- **OpenVINO**: the artifact's IR rewritten with OpenVINO's own API (backends/openvino_seamless.py): no ONNX needed.
- **Any other backend** (TensorRT, …): the component's ONNX Runtime artifact of the same source model and precision
  (runner/recompile.py's `onnx_source`) rewritten, and an engine compiled from it here.

The variant is cached like any artifact built here, under a key derived from the base artifact's and the axes, with
`tiling` in its options, so a plain lookup never picks it. Custom weights and LoRAs apply to it as to the base.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from enginefarm.backends.manifest_files import role_entry
from enginefarm.cache.build_keys import build_key
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.locks import file_lock
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.progress import Progress
from enginefarm.cache.stores.base import Store
from enginefarm.errors import ArtifactNotFoundError, ConfigError, IntegrityError

log = logging.getLogger(__name__)

TILINGS = ("x", "y", "xy")


def check_tiling(tiling: str | None) -> str | None:
    """`tiling` in its one spelling ("x", "y", "xy"; "yx" is "xy"), None for none; a ConfigError for anything else."""
    if tiling is None:
        return None
    spelled = "".join(a for a in "xy" if isinstance(tiling, str) and a in tiling)
    if not isinstance(tiling, str) or sorted(tiling) != sorted(spelled) or not spelled:
        raise ConfigError(
            f"tiling={tiling!r}", hint='use "x" (left and right edges meet), "y" (top and bottom) or "xy"'
        )
    return spelled


def seamless_artifact(
    manifest: Manifest, path: Path, tiling: str, cache: DeviceCache, store: Store | None, report: Progress
) -> tuple[Manifest, Path]:
    """The seamless variant of the artifact `manifest` (cached at `path`) for `tiling`: from the cache, or derived
    here once."""
    key = build_key({"base": manifest.build_key, "tiling": tiling})
    with file_lock(cache.locks / f"{key}.lock"):  # a second process waits for the first one's variant
        found = cache.built_here_dir(key)
        if found is not None:
            return cache.manifest_in_use(key), found
        report.message(
            f"making a seamless ({tiling}) {manifest.ref} {manifest.target} {manifest.precision} here (once)"
        )
        started = time.perf_counter()
        workdir = cache.home / "build" / "seamless" / f"{key[:24]}.{time.time_ns()}"
        workdir.mkdir(parents=True)
        try:
            variant = _derive(manifest, path, tiling, key, workdir, cache, store, report)
            cache.add_local(variant, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        log.info("%s: seamless %s variant made in %.1f s", manifest.ref, tiling, time.perf_counter() - started)
    found = cache.verified_dir(key)
    if found is None:
        raise IntegrityError(f"the seamless variant {key[:12]} failed verification right after it was cached", key=key)
    return cache.manifest_in_use(key), found


def _derive(
    manifest: Manifest,
    path: Path,
    tiling: str,
    key: str,
    workdir: Path,
    cache: DeviceCache,
    store: Store | None,
    report: Progress,
) -> Manifest:
    from enginefarm.builder.build import plain_file

    backend = manifest.parsed_target.backend
    if backend == "onnxruntime":
        from enginefarm.builder.seamless_onnx import write_seamless

        model = role_entry(manifest, "model")
        changed = write_seamless(path / model.path, workdir / Path(model.path).parent, tiling)
        rewritten = {model.path}
    elif backend == "openvino":
        from enginefarm.backends import get_backend
        from enginefarm.backends.openvino_seamless import write_seamless as write_ir
        from enginefarm.builder.seamless_onnx import parse_axes

        ir = role_entry(manifest, "ir")
        changed = write_ir(get_backend("openvino").sdk(), path / ir.path, workdir, parse_axes(tiling))
        rewritten = {"model.xml", "model.bin"}
        manifest = replace(  # the compiled blob is of the plain graph: the variant compiles its IR at load
            manifest, files=tuple(f for f in manifest.files if f.role != "engine")
        )
    else:
        return _compiled(manifest, tiling, key, workdir, cache, store, report)
    if not changed:
        raise ConfigError(
            f"{manifest.ref} has no padded 2D convolution, so tiling changes nothing in it",
            hint="tiling is for convolutional components (UNets, VAEs)",
        )
    files = []
    for entry in manifest.files:  # the weight map, external weights: as they are
        if entry.path in rewritten:
            files.append(plain_file(workdir, entry.path, entry.role))
        else:
            (workdir / entry.path).parent.mkdir(parents=True, exist_ok=True)
            if not (workdir / entry.path).exists():
                shutil.copyfile(path / entry.path, workdir / entry.path)
            files.append(entry)
    return _variant(manifest, key, tiling, tuple(files), changed)


def _variant(manifest: Manifest, key: str, tiling: str, files: tuple, changed: int) -> Manifest:
    return replace(
        manifest,
        build_key=key,
        files=files,
        benchmarks=(),
        options={**manifest.options, "tiling": {"axes": tiling, "base": manifest.build_key, "convolutions": changed}},
        validation={"passed": None, "executed": False, "why": f"seamless ({tiling}) variant derived on this device"},
        provenance={**manifest.provenance, "built_on_device": True},
    )


def _compiled(
    manifest: Manifest,
    tiling: str,
    key: str,
    workdir: Path,
    cache: DeviceCache,
    store: Store | None,
    report: Progress,
) -> Manifest:
    """An engine of a backend that runs no rewritten graph of its own, compiled here from the component's stored ONNX
    rewritten."""
    from enginefarm.backends import Feature, get_backend
    from enginefarm.builder.build import plain_file
    from enginefarm.builder.seamless_onnx import write_seamless

    from .recompile import DeviceJob, onnx_source

    try:
        onnx_manifest, onnx_dir = onnx_source(manifest, cache, store, report)
    except ArtifactNotFoundError:
        raise ArtifactNotFoundError(
            f"{manifest.ref} {manifest.target} cannot be made seamless here: its engine has no graph to rewrite, and "
            f"no onnxruntime:cpu {manifest.precision} artifact of the same source model is stored to compile one from",
            hint="add onnxruntime:cpu to the component's targets and build it, or load with target='openvino' or "
            "'onnxruntime' (their artifacts are rewritten directly)",
        ) from None
    model = role_entry(onnx_manifest, "model")
    source = workdir / "onnx"
    changed = write_seamless(onnx_dir / model.path, source, tiling)
    job = DeviceJob(
        f"{manifest.ref} {manifest.precision} {manifest.target} seamless {tiling} (on this device)",
        manifest.component,
        manifest.parsed_target,
        manifest.precision,
        manifest.profile,
        dict(manifest.options),
    )
    outdir = workdir / "artifact"
    outdir.mkdir()
    backend = get_backend(manifest.parsed_target.backend)
    build: Any = backend.build  # those that compile stacks on a device report their phases (Backend.build)
    extra = (
        {"progress": lambda done, total, _phase: report.work("compiling a seamless engine", done, total)}
        if backend.has(Feature.COMPILES_STACKS_ON_DEVICE)
        else {}
    )
    built = build(source / Path(model.path).name, job, outdir, **extra)
    # the artifact's own folder is what add_local copies: move the engine's files up
    for item in outdir.iterdir():
        item.rename(workdir / item.name)
    return _variant(manifest, key, tiling, tuple(plain_file(workdir, b.path, b.role) for b in built.files), changed)
