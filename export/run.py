"""`export_model`: a diffusers folder → checked ONNX files, checkpoints, runtime assets and a recipe, written to a
staging folder beside the output and moved into place only when every component passed its checks."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from enginefarm.cache.progress import ProgressLike, as_progress
from enginefarm.errors import ConfigError
from enginefarm.families import TOKENS, Component, Family, input_ranges, text_length_range

from . import recipe as recipes
from . import resume
from .asset_files import (
    check_assets,
    check_out_apart,
    check_tokenizers,
    copy_file,
    copy_folder,
    roots_of,
    trusted_roots,
)
from .check import Shape, check_contract, compare_with_torch, example_inputs, torch_outputs
from .components import SHARED_CHECKPOINTS, Loaded, wrap, write_checkpoint
from .config_size import check_weight_files
from .memory import check_built_fits, check_fits
from .onnx_file import EXTERNAL_DATA_ABOVE, export_onnx, files_of
from .source import ExportSource, read_source

log = logging.getLogger(__name__)

ASSET_FOLDERS = ("tokenizer", "tokenizer_2", "tokenizer_3")
EXPORT_MODULES = ("torch", "diffusers", "transformers", "safetensors", "onnx", "onnxruntime")


@dataclass(frozen=True)
class ComponentExport:
    name: str
    onnx: Path
    external_data: bool  # weights in `<name>.onnx.data`
    size: int  # bytes of the ONNX file and its data
    seconds: float  # load, export, checks and checkpoint
    deviations: dict[str, float]  # per checked shape: max |ONNX Runtime - torch| over the output range
    checkpoint: Path | None


@dataclass(frozen=True)
class ExportResult:
    family: Family
    name: str
    out: Path
    recipe: Path
    components: tuple[ComponentExport, ...]
    seconds: float


def export_model(
    source: Path,
    out: Path,
    name: str | None = None,
    progress: ProgressLike = None,
    *,
    controlnet: Path | None = None,
    targets=recipes.DEFAULT_TARGETS,
    precisions=recipes.DEFAULT_PRECISIONS,
    batch: tuple[int, int, int] | None = None,
    latent: tuple[int, int, int] | None = None,
    text_length: tuple[int, int, int] | None = None,
    external_data_above: int = EXTERNAL_DATA_ABOVE,
    overwrite: bool = False,
    base: Path | None = None,
    origin: str | None = None,
    memory: int | None = None,
) -> ExportResult:
    """Export the diffusers pipeline (or standalone ControlNet) folder `source` to `out`: `<component>.onnx` (and
    `.onnx.data` for weights above `external_data_above` bytes), `<component>.safetensors`, `assets/`, `recipe.toml`.
    `controlnet`: a ControlNet folder exported with the pipeline as one model of the ControlNet family. `batch`
    and `latent` (min, opt, max) replace the family's profile ranges; `text_length` the T5 token range (the transformer
    families': its opt becomes the pipeline's default count). Nothing is written to `out` unless every
    component matches torch on ONNX Runtime. `source` may be a single-file checkpoint (or VAE file) as model sites ship
    it: `base`, the base model's diffusers folder, gives configs, tokenizers and the names its weights take. `memory`:
    bytes the export may use (default: the machine's whole memory); a model that needs more is refused first."""
    started = time.monotonic()
    if Path(source).is_file() or base is not None:
        return _export_single_file(
            Path(source),
            base,
            Path(out),
            name,
            progress,
            controlnet=controlnet,
            targets=targets,
            precisions=precisions,
            batch=batch,
            latent=latent,
            text_length=text_length,
            external_data_above=external_data_above,
            overwrite=overwrite,
            memory=memory,
        )
    found = read_source(Path(source), controlnet)  # JSON only: a wrong folder fails before torch is imported
    check_out_apart(Path(out), [Path(source), *([Path(controlnet)] if controlnet else [])])
    if text_length is not None:
        from .transformer_sizes import with_text_length

        found = dataclasses.replace(found, sizes=with_text_length(found.family, found.sizes, text_length))
    _check_recipe_choices(tuple(targets), tuple(precisions))
    latent = model_latent_range(found, latent)
    check_shapes(found, latent, text_length)
    check_weight_files(found)  # pickles only: refused before torch.load reads them
    check_fits(found, memory)
    if found.pipeline is not None:
        check_assets(found.pipeline, ASSET_FOLDERS)  # their bytes are published as they are: the source's own only
        check_tokenizers(found)  # read as the runtime reads them: a damaged one fails now, not at the first load
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConfigError(
            f"{out} exists and is not empty", hint="choose a new --out folder, or pass --overwrite to replace it"
        )
    resume.refuse_if_busy(out)  # before torch's import
    _require_export_modules()
    check_built_fits(found, memory)  # the models as their configs build them (files may hold fewer weights)
    name = recipes.model_name(name or Path(source).resolve().name)
    report = as_progress(progress)
    report.message(f"{found.family.title} ({found.family.id}): {', '.join(found.components)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    key = resume.export_key(
        [f for f in (found.pipeline, found.controlnet) if f is not None],
        {"batch": batch, "latent": latent, "text_length": text_length, "external_data_above": external_data_above},
    )
    with resume.staging(out, key, report) as partial:
        staging = partial.folder
        done = _export_components(
            found,
            partial,
            report,
            batch=batch,
            latent=latent,
            text_length=text_length,
            external_data_above=external_data_above,
        )
        (staging / resume.RECORD).unlink()
        shutil.rmtree(staging / "assets", ignore_errors=True)
        _copy_assets(found, staging / "assets")
        checkpoints = {c.name: c.checkpoint.name if c.checkpoint else None for c in done}
        for component, shared in SHARED_CHECKPOINTS.items():
            if component in checkpoints and shared in checkpoints:
                checkpoints[component] = checkpoints[shared]
        text = recipes.recipe_text(
            found,
            name,
            checkpoints,
            targets=tuple(targets),
            precisions=tuple(precisions),
            batch=batch,
            latent=latent,
            text_length=text_length,
            origin=(origin or str(source)) + (f" with ControlNet {controlnet}" if controlnet else ""),
        )
        (staging / "recipe.toml").write_text(text)
        _check_recipe(staging / "recipe.toml")
        _usual_permissions(staging)
        _move_into_place(staging, out)
    moved = tuple(
        ComponentExport(
            c.name,
            out / c.onnx.name,
            c.external_data,
            c.size,
            c.seconds,
            c.deviations,
            out / c.checkpoint.name if c.checkpoint else None,
        )
        for c in done
    )
    return ExportResult(found.family, name, out, out / "recipe.toml", moved, time.monotonic() - started)


def _export_single_file(
    source: Path, base: Path | None, out: Path, name: str | None, progress, **options
) -> ExportResult:
    from enginefarm.weights.single_file import same_family

    from .single_file import stage

    if base is None or not source.is_file():
        raise ConfigError(
            f"{source}: a single-file checkpoint is exported with --base DIR (the base model's diffusers folder)"
            if base is None
            else f"--base is for a single-file SOURCE; {source} is not a file",
            hint="enginefarm export model.safetensors --base BASE_FOLDER --out OUT",
        )
    same_family(
        source, read_source(Path(base), options.get("controlnet")).family.id
    )  # a file for another family: one line
    check_out_apart(out, [source, Path(base)])
    out.parent.mkdir(parents=True, exist_ok=True)
    check_assets(Path(base), ASSET_FOLDERS)  # the staged folder links into --base: checked here
    holder = Path(tempfile.mkdtemp(prefix=f".{out.name}.single-file-", dir=out.parent))
    trusted = trusted_roots.set(tuple(Path(r) for r in roots_of(Path(base))))
    try:
        staged = stage(source, Path(base), holder / "pipeline")
        return export_model(staged, out, name or source.stem, progress, origin=f"{source} over {base}", **options)
    finally:
        trusted_roots.reset(trusted)
        shutil.rmtree(holder, ignore_errors=True)


def _require_export_modules() -> None:
    import importlib

    for module in EXPORT_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                f"`enginefarm export` needs {module}, which is not installed", hint="pip install 'enginefarm[export]'"
            ) from None
    import diffusers
    import transformers

    # Their loading bars and "accelerate not found" notes are noise beside the export's own progress.
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _tracing(family: Family, component: Component):
    """What the tracer needs patched while a component exports: a packed transformer's (Flux's, Chroma's:
    export/flux.py)."""
    if component.kind == "transformer" and family.traits.latent_packing > 1:
        from .flux import traceable_flux

        return traceable_flux()
    return contextlib.nullcontext()


def latent_multiple(found: ExportSource) -> int:
    """What latent sizes must be multiples of: the UNet's downsampling (8 for the real families), or a transformer's
    patch size (2). The traced graph fixes how each level upsamples, so other sizes would not come out right."""
    if "transformer" in found.configs:
        # Flux and Chroma (patch_size 1 in their configs) are fed 2x2 patches of the latent, packed in the graph
        return found.family.traits.patch_size(found.configs["transformer"])
    denoiser = found.configs.get("unet") or found.configs.get("controlnet") or {}
    return 2 ** (len(denoiser.get("block_out_channels", (0,))) - 1)


def latent_limit(found: ExportSource) -> int | None:
    """The largest latent side the model itself runs: an SD3 transformer's position embedding covers
    `pos_embed_max_size` patches a side (diffusers raises past it); None where nothing in the configs limits it."""
    transformer = found.configs.get("transformer", {})
    patches = transformer.get("pos_embed_max_size")
    return int(patches) * int(transformer.get("patch_size", 1)) if patches else None


def model_latent_range(found: ExportSource, latent: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """The profile's latent range: `latent` as asked (refused past what the model runs), else the family's default
    cut to the model's limit (None when the default fits: the family's range is used)."""
    limit = latent_limit(found)
    if limit is None:
        return latent
    if latent is not None:
        if latent[2] > limit:
            px = found.family.vae_scale_factor
            raise ConfigError(
                f"--latent {','.join(map(str, latent))} goes past {limit} latent pixels ({limit * px} px), the largest "
                f"this transformer's position embedding covers (pos_embed_max_size "
                f"{found.configs['transformer']['pos_embed_max_size']})",
                hint=f"e.g. --latent {min(latent[0], limit)},{min(latent[1], limit)},{limit}",
            )
        return latent
    low, opt, high = found.family.latent_range
    return None if high <= limit else (min(low, limit), min(opt, limit), limit)


def check_shapes(
    found: ExportSource, latent: tuple[int, int, int] | None, text_length: tuple[int, int, int] | None = None
) -> tuple[Shape, Shape]:
    """The export's tracing shape (batch 2, the profile's opt latent, square, the opt T5 token count) and a second
    one with another batch, a non-square latent a UNet level up and down and another token count in the profile, so
    batch, height, width and the text length are each shown to be dynamic."""
    ranges = latent or found.family.latent_range
    step = latent_multiple(found)
    if any(n % step for n in ranges):
        raise ConfigError(
            f"latent sizes {list(ranges)} must be multiples of {step}, the "
            f"{'transformer patch' if 'transformer' in found.configs else 'UNet downsampling'}",
            hint=f"e.g. --latent {step},{2 * step},{4 * step} (image pixels: 8x these)",
        )
    opt = ranges[1]
    low, tokens, high = text_length or text_length_range(found.family, found.sizes)
    other = max(low, tokens // 2) if tokens > low else high  # the traced count must not be the only one checked

    def text(n: int) -> dict[str, int]:
        if not found.family.joint_text:
            return {}
        return dict(text_length=n, context_tokens=found.sizes.context_for(found.family, n))

    wider = opt + step if opt + step <= ranges[2] else opt  # inside the profile (and the model's limit)
    # the second shape runs a UNet at two prompt chunks too, so its text-token axis is shown to be dynamic
    second = Shape(1, max(step, opt - step), wider, **text(other), prompt_tokens=2 * TOKENS)
    return Shape(2, opt, opt, **text(tokens)), second


def _check_recipe_choices(targets: tuple[str, ...], precisions: tuple[str, ...]) -> None:
    """Targets and precisions as `build` will read them, checked before anything is exported."""
    from enginefarm.backends import validate_target
    from enginefarm.cache import precision_table
    from enginefarm.cache.manifest import Target

    if not targets or not precisions:
        raise ConfigError(
            "the recipe needs at least one target and one precision", hint="--targets openvino:cpu --precisions fp32"
        )
    for precision in precisions:
        if precision not in precision_table.NAMES:
            raise ConfigError(f"unknown precision {precision!r}", hint=precision_table.hint())
    for target in targets:
        try:
            problem = validate_target(Target.parse(target))
        except ValueError as exc:
            problem = (str(exc), "a target is backend:device, e.g. openvino:cpu")
        if problem:
            raise ConfigError(problem[0], hint=problem[1])


def _export_components(
    found: ExportSource, partial: resume.Partial, report, *, batch, latent, text_length, external_data_above: int
) -> list[ComponentExport]:
    family, sizes, staging = found.family, found.sizes, partial.folder
    loaded = Loaded(found, found.components)
    shapes = check_shapes(found, latent, text_length)
    done = []
    for index, component_name in enumerate(found.components):
        report.work("export", index, len(found.components))
        start = time.monotonic()
        component = family.component(component_name)
        kept = partial.get(component_name)
        if kept is not None:
            loaded.done(component.folder)
            done.append(_kept(staging, component_name, kept))
            continue
        model = loaded.get(component.folder)
        module = wrap(family, component, model)
        inputs, outputs = component.io(sizes)
        ranges = input_ranges(family, component, sizes, found.vae_scaling_factor)
        cases = [
            (shape, example_inputs(inputs, ranges, shape, family.vae_scale_factor, seed))
            for seed, shape in enumerate(shapes)
        ]
        path = staging / f"{component_name}.onnx"
        with _tracing(family, component):
            external = export_onnx(module, cases[0][1], inputs, outputs, path, external_data_above)
        check_contract(path, component_name, inputs, outputs)
        expected = torch_outputs(module, cases)
        checkpoint = None
        if component_name not in SHARED_CHECKPOINTS:
            checkpoint = write_checkpoint(component, model, staging / f"{component_name}.safetensors")
        del module, model  # the torch weights go before ONNX Runtime loads the file's (SDXL's UNet: 10.3 GB each)
        loaded.done(component.folder)
        gc.collect()
        deviations = compare_with_torch(path, component_name, expected, cases, outputs, family.vae_scale_factor)
        size = sum(p.stat().st_size for p in files_of(path))
        seconds = time.monotonic() - start
        done.append(ComponentExport(component_name, path, external, size, seconds, deviations, checkpoint))
        partial.record(
            component_name,
            {
                "external_data": external,
                "seconds": seconds,
                "deviations": deviations,
                "checkpoint": checkpoint.name if checkpoint else None,
            },
            list(files_of(path)) + ([checkpoint] if checkpoint else []),
        )
        report.message(
            f"{component_name}: {seconds:.1f} s, {size / 1e6:.1f} MB{' (external data)' if external else ''}, "
            f"max deviation from torch {max(deviations.values()):.1e}"
        )
    report.work("export", len(found.components), len(found.components))
    return done


def _kept(staging: Path, name: str, entry: dict) -> ComponentExport:
    path = staging / f"{name}.onnx"
    checkpoint = staging / entry["checkpoint"] if entry["checkpoint"] else None
    return ComponentExport(
        name,
        path,
        entry["external_data"],
        sum(p.stat().st_size for p in files_of(path)),
        entry["seconds"],
        entry["deviations"],
        checkpoint,
    )


def _copy_assets(found: ExportSource, assets: Path) -> None:
    """What a runtime needs beside the engines: tokenizers, the scheduler config, model_index.json and each
    component's config.json in the diffusers layout, and family.json (the family and the sizes the configs decided)."""
    assets.mkdir()
    if found.pipeline is not None:
        roots = roots_of(found.pipeline)  # regular files inside the source only (export/asset_files.py)
        for folder in ASSET_FOLDERS:
            if (found.pipeline / folder).is_dir():
                copy_folder(found.pipeline / folder, assets / folder, folder, roots)
        if (found.pipeline / "scheduler" / "scheduler_config.json").is_file():
            (assets / "scheduler").mkdir()
            copy_file(
                found.pipeline / "scheduler" / "scheduler_config.json",
                assets / "scheduler" / "scheduler_config.json",
                "scheduler/scheduler_config.json",
                roots,
            )
        copy_file(found.pipeline / "model_index.json", assets / "model_index.json", "model_index.json", roots)
    for folder, config in found.configs.items():
        if folder != "scheduler":
            (assets / folder).mkdir(exist_ok=True)
            (assets / folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    description = {
        "family": found.family.id,
        "components": list(found.components),
        "sizes": asdict(found.sizes),
        "vae_scaling_factor": found.vae_scaling_factor,
        "vae_shift_factor": found.family.shift_factor(found.configs.get("vae")),
        "prediction_type": found.prediction_type,
        "latent_multiple": latent_multiple(found),
    }
    (assets / "family.json").write_text(json.dumps(description, indent=2) + "\n")


def _check_recipe(path: Path) -> None:
    """The recipe must load as `enginefarm build` will load it (a bad --targets value fails here, not later)."""
    from enginefarm.builder.recipe import load_recipe

    load_recipe(path)


def _usual_permissions(folder: Path) -> None:
    """mkdtemp makes the staging folder private (0700), and some writers make 0600 files; the export is the user's
    like any folder they create, so it gets the modes the umask gives."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _move_into_place(staging: Path, out: Path) -> None:
    """One rename puts the finished export at `out`; a replaced one is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
