"""`export_filter`: a user's filter file or folder → checked ONNX files, `assets/filter.json` and a recipe that
`enginefarm build` builds, written to a staging folder beside the output and moved into place only when every part
matched torch on ONNX Runtime."""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from enginefarm.cache.progress import ProgressLike, as_progress
from enginefarm.errors import ConfigError, ExportError

from .. import recipe as recipes
from ..check import MAX_DEVIATION, deviation_of
from ..onnx_file import MAX_IR_VERSION, files_of
from .reading import read_filter_source, recognise
from .registry import Part, Parts


@dataclass(frozen=True)
class PartExport:
    name: str
    onnx: Path
    size: int  # bytes of the ONNX file
    seconds: float  # export and checks
    deviations: dict[str, float]  # per checked shape: max |ONNX Runtime - torch| over the output's range


@dataclass(frozen=True)
class FilterExport:
    name: str
    architecture: str  # what was recognised, e.g. "RRDBNet"
    kind: str  # one of enginefarm.filters.KINDS
    out: Path
    recipe: Path
    parts: tuple[PartExport, ...]
    seconds: float


def export_filter(
    source_path: str | Path,
    out: str | Path,
    name: str | None = None,
    *,
    targets=recipes.DEFAULT_TARGETS,
    precisions=recipes.DEFAULT_PRECISIONS,
    overwrite: bool = False,
    progress: ProgressLike = None,
    profile: dict[str, tuple[int, int, int]] | None = None,
) -> FilterExport:
    """Export the filter file or folder `source_path` (an upscaler's .pth, a TAESD folder…) to `out`: one
    `<part>.onnx` per part of its architecture, each checked against its torch module on ONNX Runtime at two shapes,
    `assets/filter.json` (what the runtime's `enginefarm.filters.load` reads) with the architecture's extra files,
    and `recipe.toml`. `name`: the model name in the recipe (default: the file's stem). Nothing is written to `out`
    unless every part passed; an existing non-empty `out` is replaced only with `overwrite`. `profile`: dim name →
    (min, opt, max) replacing the architecture's range for that dim in every part that has it (e.g. an upscaler's
    `height` and `width`); the parts are checked and the recipe written at those."""
    from ..run import _check_recipe, _check_recipe_choices, _move_into_place, _usual_permissions

    started = time.monotonic()
    source_path, out = Path(source_path), Path(out)
    _check_recipe_choices(tuple(targets), tuple(precisions))
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConfigError(
            f"{out} exists and is not empty", hint="choose a new --out folder, or pass --overwrite to replace it"
        )
    source = read_filter_source(source_path)
    architecture = recognise(source)
    parts = with_profile(architecture.build(source), profile or {})
    del source  # the parts hold the weights they use
    name = recipes.model_name(name or (source_path.stem if source_path.is_file() else source_path.resolve().name))
    report = as_progress(progress)
    report.message(f"{architecture.name}: a {parts.kind.replace('_', ' ')}, parts {', '.join(parts.parts)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.filter-", dir=out.parent))
    try:
        done = []
        for index, (part_name, part) in enumerate(parts.parts.items()):
            report.work("export", index, len(parts.parts))
            done.append(_export_part(part_name, part, staging))
            report.message(
                f"{part_name}: {done[-1].seconds:.1f} s, {done[-1].size / 1e6:.1f} MB, "
                f"max deviation from torch {max(done[-1].deviations.values()):.1e}"
            )
        report.work("export", len(parts.parts), len(parts.parts))
        _write_assets(parts, name, staging / "assets")
        text = recipe_text(parts, name, targets=tuple(targets), precisions=tuple(precisions), origin=str(source_path))
        (staging / "recipe.toml").write_text(text)
        _check_recipe(staging / "recipe.toml")
        _usual_permissions(staging)
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    moved = tuple(PartExport(p.name, out / p.onnx.name, p.size, p.seconds, p.deviations) for p in done)
    return FilterExport(
        name, parts.architecture, parts.kind, out, out / "recipe.toml", moved, time.monotonic() - started
    )


def with_profile(parts: Parts, profile: dict[str, tuple[int, int, int]]) -> Parts:
    """`parts` with the named dims' ranges replaced; ConfigError for a dim no part has or a range out of order."""
    known = {dim for part in parts.parts.values() for dim in part.profile}
    for dim, triple in profile.items():
        if dim not in known:
            raise ConfigError(
                f"{parts.architecture} has no profile dim {dim!r}", hint=f"its dims: {', '.join(sorted(known))}"
            )
        if len(triple) != 3 or not 0 < triple[0] <= triple[1] <= triple[2]:
            raise ConfigError(f"profile {dim} {list(triple)} is not MIN, OPT, MAX", hint="e.g. (64, 256, 512)")
    if parts.details.get("tile") and profile:  # a window-attention net: one fixed tile, not a range
        from .swinir import with_fixed_tile

        return with_fixed_tile(parts, profile)
    replaced = {
        name: dataclasses.replace(part, profile={dim: _triple(profile.get(dim, r)) for dim, r in part.profile.items()})
        for name, part in parts.parts.items()
    }
    return dataclasses.replace(parts, parts=replaced)


def _triple(values) -> tuple[int, int, int]:
    low, opt, high = (int(v) for v in values)
    return low, opt, high


def is_filter_source(path: str | Path, *, base: Path | None = None, controlnet: Path | None = None) -> bool:
    """Whether `enginefarm export PATH` means a filter: a file given without --base (a single-file checkpoint needs
    one), or a folder with a config.json that is neither a diffusers pipeline nor a ControlNet (a TAESD or safety
    checker folder). A folder with neither file is the pipeline export's to refuse (it names model_index.json)."""
    from ..source import _is_controlnet_folder

    path = Path(path)
    if base is not None or controlnet is not None:
        return False
    if path.is_file():
        return True
    if not path.is_dir() or (path / "model_index.json").is_file() or _is_controlnet_folder(path):
        return False
    return (path / "config.json").is_file()


def check_points(part: Part) -> list[dict[str, int]]:
    """Where a part is traced and checked: every profile dim at its opt, then at another value in the profile
    (alternating min and max, so height and width differ and each is shown to be dynamic on its own)."""
    first = {dim: opt for dim, (_, opt, _) in part.profile.items()}
    second = {}
    for index, (dim, (low, opt, high)) in enumerate(part.profile.items()):
        other = low if index % 2 == 0 else high
        second[dim] = other if other != opt else (high if other == low else low)
    return [first, second] if second != first else [first]


def _example(part: Part, point: dict[str, int], seed: int) -> tuple:
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for input_name, dims in part.inputs.items():
        size = [d if isinstance(d, int) else point[d] for d in dims]
        low, high = part.ranges.get(input_name, (-1.0, 1.0))
        tensors.append(low + (high - low) * torch.rand(size, generator=generator, dtype=torch.float32))
    return tuple(tensors)


def _export_part(part_name: str, part: Part, staging: Path) -> PartExport:
    import torch

    start = time.monotonic()
    unknown = {d for dims in part.inputs.values() for d in dims if isinstance(d, str)} - set(part.profile)
    if unknown:
        raise ExportError(f"{part_name}: input dims {sorted(unknown)} have no profile range (an architecture bug)")
    points = check_points(part)
    cases = [_example(part, point, seed) for seed, point in enumerate(points)]
    path = staging / f"{part_name}.onnx"
    _write_onnx(part, cases[0], path)
    expected = []
    for example in cases:
        with torch.no_grad():
            result = part.module(*example)
        expected.append([t.numpy() for t in (result if isinstance(result, tuple | list) else (result,))])
    gc.collect()
    got = _run_onnx(path, part, cases)
    deviations: dict[str, float] = {}
    for point, want_all, have_all in zip(points, expected, got, strict=True):
        label = ", ".join(f"{d} {v}" for d, v in point.items())
        worst = 0.0
        for (output_name, dims), want, have in zip(part.outputs.items(), want_all, have_all, strict=True):
            fixed_ok = len(dims) == want.ndim and all(
                not isinstance(d, int) or d == n for d, n in zip(dims, want.shape, strict=True)
            )
            if want.shape != have.shape or not fixed_ok:
                raise ExportError(
                    f"{part_name}: output {output_name} is {list(have.shape)} on ONNX Runtime, {list(want.shape)} on "
                    f"torch, {list(dims)} declared, at {label}"
                )
            worst = max(worst, deviation_of(want, have, part_name, f"{output_name} at {label}", MAX_DEVIATION))
        deviations[label] = worst
    size = sum(p.stat().st_size for p in files_of(path))
    return PartExport(part_name, path, size, time.monotonic() - start, deviations)


def _write_onnx(part: Part, example: tuple, path: Path) -> None:
    """The part traced at `example` (TorchScript exporter, opset 17), every named dim dynamic and declared."""
    import onnx
    import torch

    from ..onnx_file import OPSET

    declared = {**part.inputs, **part.outputs}
    axes = {n: {a: d for a, d in enumerate(dims) if isinstance(d, str)} for n, dims in declared.items()}
    raw = path.with_name(f".raw-{path.name}")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python branches on shapes
            torch.onnx.export(
                part.module,
                example,
                str(raw),
                input_names=list(part.inputs),
                output_names=list(part.outputs),
                dynamic_axes=axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        proto = onnx.load(str(raw))
    finally:
        raw.unlink(missing_ok=True)
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    for values in (proto.graph.input, proto.graph.output):
        for value in values:
            if value.name not in declared:
                continue
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for dim in declared[value.name]:
                entry = shape.dim.add()
                if isinstance(dim, int):
                    entry.dim_value = dim
                else:
                    entry.dim_param = dim
    names = ([v.name for v in proto.graph.input], [v.name for v in proto.graph.output])
    if names != (list(part.inputs), list(part.outputs)):
        raise ExportError(
            f"{path.stem}: the ONNX graph's inputs/outputs are {names}, the architecture declares "
            f"{list(part.inputs)} / {list(part.outputs)}"
        )
    onnx.save_model(proto, str(path))


def _run_onnx(path: Path, part: Part, cases: list[tuple]) -> list[list]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [session.run(None, {n: t.numpy() for n, t in zip(part.inputs, example, strict=True)}) for example in cases]


def _write_assets(parts: Parts, name: str, assets: Path) -> None:
    from enginefarm.filters.info import INFO_FILE, FilterInfo

    assets.mkdir()
    info = FilterInfo(name, parts.kind, parts.architecture, tuple(parts.parts), dict(parts.details))
    (assets / INFO_FILE).write_text(info.to_json())
    for relative, data in parts.assets.items():
        target = (assets / relative).resolve()
        if assets.resolve() not in target.parents:
            raise ExportError(f"asset path {relative!r} leaves the assets folder (an architecture bug)")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def recipe_text(parts: Parts, name: str, *, targets, precisions, origin: str) -> str:
    """The recipe of a filter export: one component per part, its profile and validation ranges."""
    from ..recipe import _key, _list, _toml

    kind = parts.kind.replace("_", " ")
    description = f"{parts.architecture} {kind}, exported from {Path(origin).name}"
    lines = [
        f"# Written by `enginefarm export` from {origin} ({parts.architecture}; kind: {kind}).",
        "# Build it with `enginefarm build recipe.toml`; edit the profiles and targets as you need.",
        "",
        "[model]",
        f"name = {_toml(name)}",
        'version = "1"',
        f"description = {_toml(description)}",
        'assets = "assets"  # filter.json: the kind and details enginefarm.filters.load reads',
        "",
        "[defaults]",
        f"precisions = {_list(precisions)}",
        f"targets = {_list(targets)}",
    ]
    for part_name, part in parts.parts.items():
        lines += ["", f"[components.{part_name}]", f"source = {_toml(part_name + '.onnx')}"]
        if part.precisions is not None:
            kept = [p for p in precisions if p in part.precisions] or list(part.precisions)
            if kept != list(precisions):
                lines.append(f"precisions = {_list(kept)}  # what the architecture builds at")
        if part.resources:
            lines += ["", f"[components.{part_name}.resources]"]
            lines += [f"{_key(key)} = {int(value)}" for key, value in part.resources.items()]
        lines += ["", f"[components.{part_name}.profiles.default]"]
        lines += [f"{_key(dim)} = {_list(r)}" for dim, r in part.profile.items()]
        if part.ranges:
            spec = ", ".join(
                f"{_key(n)} = {{ low = {_toml(float(lo))}, high = {_toml(float(hi))} }}"
                for n, (lo, hi) in part.ranges.items()
            )
            lines += ["", f"[components.{part_name}.validate]", f"inputs = {{ {spec} }}"]
    return "\n".join(lines) + "\n"
