"""Recipe schema and parsing. Strict: unknown keys are errors, and every error names file, key and reason."""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginefarm.cache import precision_table
from enginefarm.cache.manifest import Target
from enginefarm.cache.names import NAME_CHARS, name_problem
from enginefarm.errors import RecipeError

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class InputShapes:
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class ProfileSpec:
    """A profile as written: dim-name shorthand and/or per-input shapes. Resolved against the model later."""

    name: str
    dims: dict[str, tuple[int, int, int]]
    inputs: dict[str, InputShapes]


@dataclass(frozen=True)
class SampleSpec:
    low: float = -1.0
    high: float = 1.0
    file: Path | None = None  # a .npy used as this input instead of seeded noise


@dataclass(frozen=True)
class ValidateSpec:
    inputs: dict[str, SampleSpec] = field(default_factory=dict)
    samples: Path | None = None  # a .npz with one array per input name
    min_cosine: float | None = None
    max_abs_rel: float | None = None
    noise_floor: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class Source:
    url: str  # as written
    sha256: str | None
    local: Path | None  # for file sources: the resolved path
    external_sha256: tuple[
        tuple[str, str], ...
    ] = ()  # remote sources: (external data file, its sha256), pinned like the .onnx
    size: int | None = None  # remote sources: the .onnx's bytes, pinned beside sha256 (a download stops past it)


@dataclass(frozen=True)
class Resources:
    """What building one job of the component needs; the planner routes jobs only to runners that have it."""

    host_ram_gb: float = 0.0
    gpu_vram_gb: float = 0.0
    # The heads of the component's largest attention: its need adds the attention scores at the profile's largest
    # case (builder/memory.attention_bytes), which outgrow the weights at large images; `attention_downscale`: latent
    # pixels per token side there (0: a diffusion transformer's 2x2 patches plus its text tokens; a UNet's highest
    # attention level, a VAE's mid-block). `activation_channels`: a VAE's widest level, in channels at full image
    # resolution (memory.image_activation_bytes). `enginefarm export` writes them from the component's config.
    attention_heads: int = 0
    attention_downscale: int = 0
    activation_channels: int = 0


@dataclass(frozen=True)
class Exclusion:
    """A precision (or every precision) not to build for a target or a whole backend."""

    target: str  # "backend" or "backend:device"
    precision: str | None = None

    def covers(self, target: Target, precision: str) -> bool:
        return target.matches(self.target) and self.precision in (None, precision)


@dataclass(frozen=True)
class Component:
    name: str
    source: Source
    precisions: tuple[str, ...]
    targets: tuple[Target, ...]
    profiles: dict[str, ProfileSpec]
    validate: ValidateSpec
    resources: Resources = Resources()
    checkpoint: Path | None = None  # the base weights in their native names (.safetensors): the weight map's source
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend → option → value, as written
    exclude: tuple[Exclusion, ...] = ()
    fp16_keep_fp32: tuple[str, ...] = ()  # op types or node names that stay fp32 in fp16 ONNX


@dataclass(frozen=True)
class Recipe:
    path: Path
    digest: str  # sha256 of the recipe file: provenance, not part of the build key
    name: str
    version: str
    description: str
    components: dict[str, Component]
    assets: Path | None = None  # [model] assets: the folder published beside the artifacts (tokenizers, configs)


class _Reader:
    """Walks a TOML table, checking keys and types, and names the dotted key in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, reason: str, hint: str | None = None) -> RecipeError:
        return RecipeError(self.path, key, reason, hint=hint)

    def table(self, value: Any, key: str, allowed: set[str] | None, required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        if allowed is not None:
            for name in value:
                if name not in allowed:
                    raise self.fail(_join(key, name), "unknown key", hint=f"allowed here: {', '.join(sorted(allowed))}")
        for name in required:
            if name not in value:
                raise self.fail(_join(key, name), "is required")
        return value

    def string(self, value: Any, key: str) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "must be a non-empty string")
        return value

    def number(self, value: Any, key: str, low: float | None = None, high: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"must be a number, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, f"{value} is outside [{low}, {high}]")
        return float(value)

    def strings(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of strings")
        return tuple(value)

    def ints(self, value: Any, key: str, length: int | None = None) -> tuple[int, ...]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.fail(key, f"must be a list of integers, got {value!r}")
        if length is not None and len(value) != length:
            raise self.fail(key, f"must have {length} entries, got {len(value)}")
        if any(v < 1 for v in value):
            raise self.fail(key, f"dimensions must be >= 1, got {value}")
        return tuple(value)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(path, "", "recipe file not found") from None
    except OSError as exc:
        raise RecipeError(path, "", f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(path, "", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise RecipeError(
            path,
            "",
            "not a usable recipe: arrays or tables nested too deeply",
            hint="a recipe needs at most a few levels",
        ) from None
    return parse_recipe(data, path, hashlib.sha256(raw).hexdigest())


def parse_recipe(data: dict[str, Any], path: Path, digest: str = "") -> Recipe:
    from enginefarm.backends import validate_target  # the backend registry knows each backend's device classes

    r = _Reader(path)
    r.table(data, "", {"model", "defaults", "components"}, ("model", "components"))
    model = r.table(data["model"], "model", {"name", "version", "description", "assets"}, ("name", "version"))
    name = r.string(model["name"], "model.name")
    if not NAME_CHARS.fullmatch(name):
        raise r.fail("model.name", f"{name!r} may use only letters, digits, '_', '.', '-'")
    if problem := name_problem(name):
        raise r.fail("model.name", problem, hint="choose a name every store and file system can hold")
    version = r.string(model["version"], "model.version")
    description = r.string(model["description"], "model.description") if "description" in model else ""
    assets = _assets_folder(r, model["assets"], "model.assets") if "assets" in model else None

    defaults = r.table(
        data.get("defaults", {}), "defaults", {"precisions", "targets", "options", "exclude", "fp16_keep_fp32"}
    )
    default_options = _options(r, defaults.get("options", {}), "defaults.options")
    default_precisions = _precisions(r, defaults.get("precisions", [precision_table.REFERENCE]), "defaults.precisions")
    default_targets = _targets(r, defaults.get("targets", []), "defaults.targets", validate_target)
    default_exclude = _exclusions(r, defaults.get("exclude", []), "defaults.exclude", validate_target)
    default_keep = r.strings(defaults.get("fp16_keep_fp32", []), "defaults.fp16_keep_fp32")

    components_raw = r.table(data["components"], "components", None)
    if not components_raw:
        raise r.fail("components", "no components", hint="add a [components.NAME] table with a source")
    components: dict[str, Component] = {}
    for comp_name, comp_raw in components_raw.items():
        key = f"components.{comp_name}"
        if not NAME_CHARS.fullmatch(comp_name):
            raise r.fail(key, "component names may use only letters, digits, '_', '.', '-'")
        if problem := name_problem(comp_name):
            raise r.fail(key, problem, hint="choose a name every store and file system can hold")
        comp = r.table(
            comp_raw,
            key,
            {
                "source",
                "sha256",
                "size",
                "external_sha256",
                "checkpoint",
                "precisions",
                "targets",
                "profiles",
                "validate",
                "resources",
                "options",
                "exclude",
                "fp16_keep_fp32",
            },
            ("source",),
        )
        precisions = (
            _precisions(r, comp["precisions"], f"{key}.precisions") if "precisions" in comp else default_precisions
        )
        targets = (
            _targets(r, comp["targets"], f"{key}.targets", validate_target) if "targets" in comp else default_targets
        )
        if not precisions or not targets:
            missing = "precisions" if not precisions else "targets"
            raise r.fail(f"{key}.{missing}", "the build matrix is empty", hint=f"set {missing} here or in [defaults]")
        components[comp_name] = Component(
            name=comp_name,
            source=_source(r, comp, key),
            precisions=precisions,
            targets=targets,
            profiles=_profiles(r, comp.get("profiles", {}), f"{key}.profiles"),
            validate=_validate(r, comp.get("validate", {}), f"{key}.validate"),
            resources=_resources(r, comp.get("resources", {}), f"{key}.resources"),
            checkpoint=_checkpoint(r, comp["checkpoint"], f"{key}.checkpoint") if "checkpoint" in comp else None,
            options=_merge_options(default_options, _options(r, comp.get("options", {}), f"{key}.options")),
            exclude=default_exclude + _exclusions(r, comp.get("exclude", []), f"{key}.exclude", validate_target),
            fp16_keep_fp32=tuple(
                dict.fromkeys(default_keep + r.strings(comp.get("fp16_keep_fp32", []), f"{key}.fp16_keep_fp32"))
            ),
        )
    return Recipe(path, digest, name, version, description, components, assets)


def _precisions(r: _Reader, value: Any, key: str) -> tuple[str, ...]:
    items = r.strings(value, key)
    for item in items:
        if item not in precision_table.NAMES:
            raise r.fail(key, f"unknown precision {item!r}", hint=precision_table.hint())
    return tuple(dict.fromkeys(items))


def _targets(r: _Reader, value: Any, key: str, validate_target) -> tuple[Target, ...]:
    targets = []
    for text in r.strings(value, key):
        try:
            target = Target.parse(text)
        except ValueError as exc:
            raise r.fail(key, str(exc), hint="write targets as backend:device, e.g. openvino:cpu") from None
        problem = validate_target(target)
        if problem:
            reason, hint = problem
            raise r.fail(key, reason, hint=hint)
        targets.append(target)
    return tuple(dict.fromkeys(targets))


def _exclusions(r: _Reader, value: Any, key: str, validate_target) -> tuple[Exclusion, ...]:
    """`exclude = [{ target = "onnxruntime:cpu", precision = "fp16" }, { target = "openvino" }]`"""
    if not isinstance(value, list):
        raise r.fail(
            key, "must be a list of tables", hint='exclude = [{ target = "onnxruntime:cpu", precision = "fp16" }]'
        )
    found = []
    for index, item in enumerate(value):
        ikey = f"{key}[{index}]"
        table = r.table(item, ikey, {"target", "precision"}, ("target",))
        target = r.string(table["target"], f"{ikey}.target")
        try:
            parsed = Target.parse(target) if ":" in target else Target(target, "")
        except ValueError as exc:
            raise r.fail(f"{ikey}.target", str(exc), hint="a target (openvino:cpu) or a backend (openvino)") from None
        problem = validate_target(parsed)
        if problem and (
            parsed.device or problem[0].startswith("unknown backend")
        ):  # a bare backend has no device to check
            raise r.fail(f"{ikey}.target", problem[0], hint=problem[1])
        precision = table.get("precision")
        if precision is not None and r.string(precision, f"{ikey}.precision") not in precision_table.NAMES:
            raise r.fail(f"{ikey}.precision", f"unknown precision {precision!r}", hint=precision_table.hint())
        found.append(Exclusion(target, precision))
    return tuple(found)


def _source(r: _Reader, comp: dict[str, Any], key: str) -> Source:
    url = r.string(comp["source"], f"{key}.source")
    sha = comp.get("sha256")
    if sha is not None:
        sha = r.string(sha, f"{key}.sha256").lower()
        if not _SHA256.fullmatch(sha):
            raise r.fail(f"{key}.sha256", "must be 64 hex digits")
    scheme = url.partition("://")[0].lower() if "://" in url else "file"
    if scheme in ("https", "http", "hf"):
        if sha is None:
            raise r.fail(
                f"{key}.sha256",
                f"is required for a {scheme}:// source",
                hint="run `sha256sum` on the file and paste the digest",
            )
        pins = _external_pins(r, comp.get("external_sha256", {}), f"{key}.external_sha256")
        return Source(url, sha, None, pins, _size_pin(r, comp.get("size"), f"{key}.size"))
    if "size" in comp:
        raise r.fail(f"{key}.size", "is for https:// and hf:// sources", hint="a local model's size is its file's")
    if "external_sha256" in comp:
        raise r.fail(
            f"{key}.external_sha256",
            "is for https:// and hf:// sources",
            hint="a local model's external data is read beside it",
        )
    if scheme != "file":
        raise r.fail(
            f"{key}.source", f"unsupported source scheme {scheme}://", hint="use a path, file://, https:// or hf://"
        )
    rel = url[len("file://") :] if url.startswith("file://") else url
    local = Path(rel).expanduser()
    if not local.is_absolute():
        local = (r.path.parent / local).resolve()
    if not local.is_file():
        raise r.fail(f"{key}.source", f"file not found: {local}", hint="paths are relative to the recipe file")
    return Source(url, sha, local)


def _size_pin(r: _Reader, value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise r.fail(key, f"must be the file's size in bytes, not {value!r}", hint="run `stat -c %s FILE`")
    return value


def _external_pins(r: _Reader, value: Any, key: str) -> tuple[tuple[str, str], ...]:
    table = r.table(value, key, None)
    pins = []
    for name, digest in table.items():
        digest = r.string(digest, f"{key}.{name}").lower()
        if not _SHA256.fullmatch(digest):
            raise r.fail(f"{key}.{name}", "must be 64 hex digits")
        pins.append((name, digest))
    return tuple(sorted(pins))


def _profiles(r: _Reader, value: Any, key: str) -> dict[str, ProfileSpec]:
    profiles: dict[str, ProfileSpec] = {}
    for name, raw in r.table(value, key, None).items():
        pkey = f"{key}.{name}"
        table = r.table(raw, pkey, None)
        dims: dict[str, tuple[int, int, int]] = {}
        inputs: dict[str, InputShapes] = {}
        for dim, spec in table.items():
            if dim == "inputs":
                continue
            lo, opt, hi = r.ints(spec, f"{pkey}.{dim}", 3)
            _check_order(r, f"{pkey}.{dim}", (lo,), (opt,), (hi,))
            dims[dim] = (lo, opt, hi)
        for input_name, spec in r.table(table.get("inputs", {}), f"{pkey}.inputs", None).items():
            ikey = f"{pkey}.inputs.{input_name}"
            shapes = r.table(spec, ikey, {"min", "opt", "max"}, ("min", "opt", "max"))
            low = r.ints(shapes["min"], f"{ikey}.min")
            usual = r.ints(shapes["opt"], f"{ikey}.opt", len(low))
            high = r.ints(shapes["max"], f"{ikey}.max", len(low))
            _check_order(r, ikey, low, usual, high)
            inputs[input_name] = InputShapes(low, usual, high)
        if not dims and not inputs:
            raise r.fail(pkey, "profile is empty", hint="give dim names (batch = [1, 1, 4]) or inputs.NAME.min/opt/max")
        profiles[name] = ProfileSpec(name, dims, inputs)
    return profiles


def _check_order(r: _Reader, key: str, lo, opt, hi) -> None:
    for axis, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
        where = f" (axis {axis})" if len(lo) > 1 else ""
        if a > b:
            raise r.fail(key, f"min {a} > opt {b}{where}", hint="a profile needs min <= opt <= max")
        if b > c:
            raise r.fail(key, f"opt {b} > max {c}{where}", hint="a profile needs min <= opt <= max")


def _validate(r: _Reader, value: Any, key: str) -> ValidateSpec:
    table = r.table(value, key, {"inputs", "samples", "min_cosine", "max_abs_rel", "noise_floor", "seed"})
    inputs: dict[str, SampleSpec] = {}
    for name, spec in r.table(table.get("inputs", {}), f"{key}.inputs", None).items():
        ikey = f"{key}.inputs.{name}"
        spec = r.table(spec, ikey, {"low", "high", "file"})
        low = r.number(spec.get("low", -1.0), f"{ikey}.low")
        high = r.number(spec.get("high", 1.0), f"{ikey}.high")
        if low > high:
            raise r.fail(ikey, f"low {low} > high {high}")
        file = _sample_file(r, spec["file"], f"{ikey}.file", (".npy",)) if "file" in spec else None
        inputs[name] = SampleSpec(low, high, file)
    samples = _sample_file(r, table["samples"], f"{key}.samples", (".npz",)) if "samples" in table else None
    return ValidateSpec(
        inputs=inputs,
        samples=samples,
        min_cosine=r.number(table["min_cosine"], f"{key}.min_cosine", -1.0, 1.0) if "min_cosine" in table else None,
        max_abs_rel=r.number(table["max_abs_rel"], f"{key}.max_abs_rel", 0.0) if "max_abs_rel" in table else None,
        noise_floor=r.number(table["noise_floor"], f"{key}.noise_floor", 0.0) if "noise_floor" in table else None,
        seed=int(r.number(table.get("seed", 0), f"{key}.seed", 0)),
    )


def _resources(r: _Reader, value: Any, key: str) -> Resources:
    table = r.table(
        value, key, {"host_ram_gb", "gpu_vram_gb", "attention_heads", "attention_downscale", "activation_channels"}
    )
    return Resources(
        host_ram_gb=r.number(table.get("host_ram_gb", 0), f"{key}.host_ram_gb", 0, 4096),
        gpu_vram_gb=r.number(table.get("gpu_vram_gb", 0), f"{key}.gpu_vram_gb", 0, 4096),
        attention_heads=int(r.number(table.get("attention_heads", 0), f"{key}.attention_heads", 0, 1024)),
        attention_downscale=int(r.number(table.get("attention_downscale", 0), f"{key}.attention_downscale", 0, 64)),
        activation_channels=int(r.number(table.get("activation_channels", 0), f"{key}.activation_channels", 0, 65536)),
    )


def _assets_folder(r: _Reader, value: Any, key: str) -> Path:
    text = r.string(value, key)
    if "://" in text:
        raise r.fail(key, "must be a local folder", hint='a path relative to the recipe file, e.g. "assets"')
    path = (r.path.parent / Path(text).expanduser()).resolve()
    if not path.is_dir():
        raise r.fail(key, f"folder not found: {path}", hint="paths are relative to the recipe file")
    if not any(p.is_file() for p in path.rglob("*")):
        raise r.fail(key, f"{path} holds no files", hint="point it at the assets/ folder `enginefarm export` wrote")
    return path


def _checkpoint(r: _Reader, value: Any, key: str) -> Path:
    text = r.string(value, key)
    if "://" in text and not text.startswith("file://"):
        raise r.fail(key, "must be a local file", hint="a path relative to the recipe, or file://")
    path = Path(text[len("file://") :] if text.startswith("file://") else text).expanduser()
    if not path.is_absolute():
        path = (r.path.parent / path).resolve()
    if not path.is_file():  # before the suffix, so a mistyped path is not reported as the wrong format
        raise r.fail(key, f"file not found: {path}", hint="paths are relative to the recipe file")
    if path.suffix != ".safetensors":
        raise r.fail(key, "must be a .safetensors file", hint="convert the checkpoint with the safetensors package")
    return path


def _options(r: _Reader, value: Any, key: str) -> dict[str, dict[str, Any]]:
    """[options.BACKEND] tables. Each backend module declares OPTIONS = {name: default}; a tuple default lists the
    allowed strings, the first being the default. Anything else must have its default's type."""
    from enginefarm.backends import get_backend, registry

    found: dict[str, dict[str, Any]] = {}
    for backend, table in r.table(value, key, set(registry())).items():
        declared = get_backend(backend).options
        table = r.table(table, f"{key}.{backend}", set(declared))
        for name, given in table.items():
            _check_option(r, f"{key}.{backend}.{name}", given, declared[name])
        found[backend] = dict(table)
    return found


def _check_option(r: _Reader, key: str, given: Any, declared: Any) -> None:
    if isinstance(declared, tuple):
        if r.string(given, key) not in declared:
            raise r.fail(key, f"unknown value {given!r}", hint=f"use one of: {', '.join(declared)}")
    elif type(given) is not type(declared):
        raise r.fail(
            key, f"must be a {type(declared).__name__}, got {given!r}", hint=f"default: {str(declared).lower()}"
        )


def _merge_options(defaults: dict[str, dict[str, Any]], own: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {backend: {**defaults.get(backend, {}), **own.get(backend, {})} for backend in defaults.keys() | own.keys()}


def _sample_file(r: _Reader, value: Any, key: str, suffixes: tuple[str, ...]) -> Path:
    path = Path(r.string(value, key)).expanduser()
    if not path.is_absolute():
        path = (r.path.parent / path).resolve()
    if path.suffix not in suffixes:
        raise r.fail(key, f"must be a {' or '.join(suffixes)} file")
    if not path.is_file():
        raise r.fail(key, f"file not found: {path}")
    from .sample_files import SampleError, npy_shape

    if path.suffix == ".npy":
        try:
            npy_shape(path)
        except SampleError as exc:
            raise r.fail(key, f"cannot read {path.name}: {exc}", hint="save it with numpy.save(path, array)") from None
    return path
