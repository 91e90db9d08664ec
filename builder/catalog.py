"""Catalog recipes: a published model as its publisher ships it, from pinned source files to engines.

    [model]
    name = "sd-1.5"
    version = "1"

    [export]
    family = "sd1"                     # families/table.py's id: what the export must find
    configs = "sd-1.5"                 # a config set shipped with enginefarm (builder/catalog_configs.py); optional
    licence = "CreativeML OpenRAIL-M"
    gated = false                      # true: the Hub asks for the licence to be accepted, and HF_TOKEN

    [export.checkpoint]                # a single-file checkpoint, exported over the configs and files; optional
    source = "hf://org/repo/file.safetensors@<40-hex revision>"
    sha256 = "…"                       # both, or neither (unlocked: `enginefarm lock` records them)
    size = 4265146304

    # batch = [1, 2, 2], latent = [64, 96, 128]: the export's profile ranges (`enginefarm export --batch/--latent`)

    [export.files]                     # diffusers-folder files, by their path in the folder
    "tokenizer/vocab.json" = { source = "hf://org/repo/tokenizer/vocab.json@<revision>" }

    [defaults]                         # as in every recipe: what to build the exported components for
    targets = ["onnxruntime:cpu"]
    precisions = ["fp16"]

A filter (`kind = "filter"`, no family) is one checkpoint, or a folder's files (a TAESD folder, named after the
model: its latent space is read from that name), that the filter exporter turns into a filter recipe. Pins
missing from the recipe are read from the lock file beside it (`<recipe>.lock`, written by `enginefarm lock`)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from enginefarm.errors import RecipeError

_SHA256 = re.compile(r"[0-9a-f]{64}")
REVISION = re.compile(r"[0-9a-f]{40}")
KINDS = ("pipeline", "filter")
CHECKPOINT = "checkpoint"  # the path a checkpoint takes among a recipe's files


@dataclass(frozen=True)
class PinnedFile:
    """One source file: where it comes from and, once pinned or locked, its sha256 and size in bytes."""

    path: str  # in the assembled diffusers folder, or CHECKPOINT
    url: str  # hf://org/repo/path@revision or https://
    sha256: str | None
    size: int | None

    @property
    def pinned(self) -> bool:
        return self.sha256 is not None and self.size is not None

    @property
    def revision(self) -> str | None:
        """The Hub revision an hf:// source names (None for https://)."""
        if not self.url.startswith("hf://"):
            return None
        return self.url.rpartition("@")[2] if "@" in self.url else None


@dataclass(frozen=True)
class CatalogRecipe:
    path: Path
    name: str
    version: str
    description: str
    kind: str
    family: str | None
    configs: str | None
    licence: str
    gated: bool
    files: tuple[PinnedFile, ...]  # the checkpoint (if any) first
    targets: tuple[str, ...]
    precisions: tuple[str, ...]
    defaults: dict[str, Any]  # the [defaults] table as written, handed to the exported recipe
    # `enginefarm export --batch/--latent` (min, opt, max), replacing the family's default profile ranges
    ranges: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def checkpoint(self) -> PinnedFile | None:
        return next((f for f in self.files if f.path == CHECKPOINT), None)

    @property
    def unlocked(self) -> tuple[PinnedFile, ...]:
        return tuple(f for f in self.files if not f.pinned)

    @property
    def download_bytes(self) -> int:
        """The pinned files' bytes (unlocked files count 0: their size is not known offline)."""
        return sum(f.size or 0 for f in self.files)


def is_catalog_recipe(path: Path) -> bool:
    """A recipe with an [export] table (read cheaply: the TOML only)."""
    try:
        return "export" in tomllib.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):  # not one: the recipe reader says what is wrong with it
        return False


def catalog_paths(paths: list[Path] | tuple[Path, ...]) -> list[Path]:
    """Recipe files, with each folder given replaced by the catalog recipes under it (sorted)."""
    found: list[Path] = []
    for path in paths:
        if Path(path).is_dir():
            found += sorted(p for p in Path(path).rglob("*.toml") if is_catalog_recipe(p))
        else:
            found.append(Path(path))
    return found


def lock_path(recipe: Path) -> Path:
    return recipe.with_name(recipe.name + ".lock")


def load_catalog_recipe(path: str | Path) -> CatalogRecipe:
    """Parse a catalog recipe, strictly (every error names the file and the dotted key), with its lock file's pins."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RecipeError(path, "", "recipe file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(path, "", f"not valid TOML: {exc}") from None
    fail = _failer(path)
    _keys(fail, data, "", {"model", "export", "defaults"}, ("model", "export"))
    model = _keys(fail, data["model"], "model", {"name", "version", "description"}, ("name", "version"))
    export = _keys(
        fail,
        data["export"],
        "export",
        {"kind", "family", "configs", "licence", "gated", "checkpoint", "files", "batch", "latent"},
        ("licence", "gated"),
    )
    kind = export.get("kind", "pipeline")
    if kind not in KINDS:
        raise fail("export.kind", f"unknown kind {kind!r}", f"one of: {', '.join(KINDS)}")
    family = _family(fail, export, kind)
    configs = export.get("configs")
    if configs is not None:
        from .catalog_configs import CONFIGS

        if configs not in CONFIGS:
            raise fail("export.configs", f"no shipped config set {configs!r}", f"one of: {', '.join(CONFIGS)}")
    if not isinstance(export["gated"], bool):
        raise fail("export.gated", "must be true or false")
    if not isinstance(export["licence"], str) or not export["licence"].strip():
        raise fail("export.licence", "must name the licence")
    files = []
    if "checkpoint" in export:
        files.append(_file(fail, export["checkpoint"], "export.checkpoint", CHECKPOINT))
    for relative, spec in _keys(fail, export.get("files", {}), "export.files", None).items():
        if relative == CHECKPOINT or relative.startswith(("/", "..")) or "/../" in relative or "\\" in relative:
            raise fail(f"export.files.{relative}", "must be a relative path inside the model's folder")
        files.append(_file(fail, spec, f"export.files.{relative}", relative))
    if not files:
        raise fail("export", "no source files", "add [export.checkpoint] or [export.files]")
    if kind == "filter" and CHECKPOINT in (f.path for f in files) and len(files) > 1:
        raise fail("export", "a filter is one [export.checkpoint] file, or its folder's [export.files]")
    if configs is None and CHECKPOINT in (f.path for f in files) and kind == "pipeline" and len(files) == 1:
        raise fail("export.configs", "a single-file checkpoint needs a config set", 'name one, e.g. configs = "sd-1.5"')
    defaults = _keys(fail, data.get("defaults", {}), "defaults", None)
    targets = tuple(defaults.get("targets", ()))
    precisions = tuple(defaults.get("precisions", ("fp32",)))
    if not targets:
        raise fail("defaults.targets", "the build matrix is empty", "set targets in [defaults]")
    _check_matrix(fail, targets, precisions)
    recipe = CatalogRecipe(
        path=path,
        name=_string(fail, model["name"], "model.name"),
        version=_string(fail, model["version"], "model.version"),
        description=str(model.get("description", "")),
        kind=kind,
        family=family,
        configs=configs,
        licence=export["licence"],
        gated=export["gated"],
        files=tuple(files),
        targets=targets,
        precisions=precisions,
        defaults=dict(defaults),
        ranges={name: _range(fail, export[name], f"export.{name}") for name in ("batch", "latent") if name in export},
    )
    return with_lock(recipe)


def with_lock(recipe: CatalogRecipe) -> CatalogRecipe:
    """The recipe with its lock file's pins filled in where the recipe has none (the recipe's own pins win)."""
    lock = lock_path(recipe.path)
    if not lock.is_file():
        return recipe
    try:
        locked = tomllib.loads(lock.read_text()).get("files", {})
    except (OSError, ValueError) as exc:
        raise RecipeError(
            lock, "", f"not a readable lock file: {exc}", hint="delete it and run `enginefarm lock`"
        ) from None
    fail = _failer(lock)
    files = []
    for f in recipe.files:
        entry = locked.get(f.url)
        if f.pinned or entry is None:
            files.append(f)
            continue
        files.append(_file(fail, {"source": f.url, **entry}, f"files.{f.url}", f.path, commit=False))
    return replace(recipe, files=tuple(files))


def _failer(path: Path):
    def fail(key: str, reason: str, hint: str | None = None) -> RecipeError:
        return RecipeError(path, key, reason, hint=hint)

    return fail


def _keys(fail, value: Any, key: str, allowed: set[str] | None, required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(key, f"must be a table, got {type(value).__name__}")
    for name in value:
        if allowed is not None and name not in allowed:
            raise fail(f"{key}.{name}" if key else name, "unknown key", f"allowed here: {', '.join(sorted(allowed))}")
    for name in required:
        if name not in value:
            raise fail(f"{key}.{name}" if key else name, "is required")
    return value


def _string(fail, value: Any, key: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise fail(key, "must be a non-empty string")
    return value


def _family(fail, export: dict[str, Any], kind: str) -> str | None:
    family = export.get("family")
    if kind == "filter":
        if family is not None:
            raise fail("export.family", "a filter has no family", 'leave family out for kind = "filter"')
        return None
    from enginefarm.families import FAMILIES

    if family not in FAMILIES:
        raise fail("export.family", f"unknown family {family!r}", f"one of: {', '.join(FAMILIES)}")
    return str(family)


def _file(fail, spec: Any, key: str, path: str, commit: bool = True) -> PinnedFile:
    """`commit`: a pin written in the recipe names the commit; a lock file's may keep the branch it locked (the digest
    is checked either way: a moved branch is refused at download)."""
    spec = _keys(fail, spec, key, {"source", "sha256", "size"}, ("source",))
    url = _string(fail, spec["source"], f"{key}.source")
    if url.startswith("hf://"):
        rest, _, revision = url[len("hf://") :].partition("@")
        if len(rest.split("/")) < 3 or not all(rest.split("/")):
            raise fail(f"{key}.source", "expected hf://org/repo/path@revision")
        # A pinned file names the commit it was pinned at; an unlocked one may name a branch until it is locked.
        if not revision or (commit and "sha256" in spec and not REVISION.fullmatch(revision)):
            raise fail(
                f"{key}.source",
                "an hf:// source names its revision after @ (a pinned one: the commit, 40 hex digits)",
                "a branch name moves; the commit does not (the Hub's file page shows it)",
            )
    elif not url.startswith("https://"):
        raise fail(f"{key}.source", "must be hf://org/repo/path@revision or https://")
    sha = spec.get("sha256")
    size = spec.get("size")
    if (sha is None) != (size is None):
        raise fail(key, "pin sha256 and size together", "or leave both out and run `enginefarm lock`")
    if sha is not None and (not isinstance(sha, str) or not _SHA256.fullmatch(sha)):
        raise fail(f"{key}.sha256", "must be 64 lowercase hex digits")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise fail(f"{key}.size", "must be a positive number of bytes")
    return PinnedFile(path, url, sha, size)


def _range(fail, value: Any, key: str) -> tuple[int, int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        or not value[0] <= value[1] <= value[2]
    ):
        raise fail(key, f"must be [min, opt, max] positive integers in order, got {value!r}")
    return (value[0], value[1], value[2])


def _check_matrix(fail, targets: tuple[str, ...], precisions: tuple[str, ...]) -> None:
    from enginefarm.backends import validate_target
    from enginefarm.cache import precision_table
    from enginefarm.cache.manifest import Target

    for text in targets:
        try:
            problem = validate_target(Target.parse(text))
        except ValueError as exc:
            raise fail("defaults.targets", str(exc), "write targets as backend:device") from None
        if problem:
            raise fail("defaults.targets", problem[0], problem[1])
    for precision in precisions:
        if precision not in precision_table.NAMES:
            raise fail("defaults.precisions", f"unknown precision {precision!r}", precision_table.hint())
