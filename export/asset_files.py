"""The source files an export copies as they are (tokenizers, the scheduler config, model_index.json): regular files
inside the source folder only.

Those bytes are published to the store with the engines. A link in a source folder that points elsewhere (a user's
`~/.aws/credentials`, `/etc/hostname`) would otherwise be exported as a plain asset file, so each link must resolve
inside the source folder, or, for a Hugging Face cache snapshot (`models--ORG--NAME/snapshots/REV/`, whose files are
links), inside that repository's `blobs/`. Anything else, and anything that is not a regular file (a FIFO, a
device), is refused in one line before the export starts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

from enginefarm.errors import ConfigError

# Folders a staged source may link into besides its own (a single-file export stages links into its --base).
trusted_roots: ContextVar[tuple[Path, ...]] = ContextVar("trusted_roots", default=())


def roots_of(source: Path) -> tuple[str, ...]:
    """The real folders the files of `source` may resolve into: itself, a snapshot's `blobs/`, and `trusted_roots`."""
    source = Path(source)
    found = [os.path.realpath(source)]
    if source.parent.name == "snapshots" and (source.parent.parent / "blobs").is_dir():
        found.append(os.path.realpath(source.parent.parent / "blobs"))
    found += [os.path.realpath(r) for r in trusted_roots.get()]
    return tuple(found)


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def checked_file(path: Path, shown: str, roots: tuple[str, ...]) -> str:
    """The real path of `path`, a regular file that resolves inside `roots`; else a one-line ConfigError."""
    real = os.path.realpath(path)
    if not _inside(real, roots):
        raise ConfigError(
            f"{shown} in the source is a link to {real}, outside the source folder: exports copy only the source's "
            "own files",
            hint="copy that file into the folder (a Hugging Face snapshot's links into its blobs/ are fine)",
        )
    if not os.path.isfile(real):
        raise ConfigError(
            f"{shown} in the source is not a regular file",
            hint="replace it with the file itself (exports copy regular files only)",
        )
    return real


def _walk(folder: Path, shown: str, roots: tuple[str, ...], seen: frozenset[str]) -> Iterator[tuple[str, str]]:
    """(real file, path relative to `folder`) for each file below `folder`, every link checked."""
    real = os.path.realpath(folder)
    if not _inside(real, roots):
        raise ConfigError(
            f"{shown} in the source is a link to {real}, outside the source folder: exports copy only the source's "
            "own files",
            hint="copy that folder into the source folder",
        )
    if real in seen:
        return  # a link to a folder above: copied once
    with os.scandir(real) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            here = f"{shown}/{entry.name}"
            if entry.is_dir():  # follows links: the target is checked by the call
                for file, rel in _walk(Path(entry.path), here, roots, seen | {real}):
                    yield file, f"{entry.name}/{rel}"
            else:
                yield checked_file(Path(entry.path), here, roots), entry.name


def check_folder(folder: Path, shown: str, roots: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every file below `folder` as (real path, relative path), or a one-line ConfigError for the first link that
    leaves `roots` or the first entry that is not a regular file."""
    return list(_walk(folder, shown, roots, frozenset()))


def copy_folder(folder: Path, into: Path, shown: str, roots: tuple[str, ...]) -> None:
    """Copy the files below `folder` to `into` as plain files, each checked as `check_folder` does."""
    for real, rel in check_folder(folder, shown, roots):
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real, into / rel)


def copy_file(path: Path, to: Path, shown: str, roots: tuple[str, ...]) -> None:
    """Copy one file, checked as `checked_file` does."""
    shutil.copyfile(checked_file(path, shown, roots), to)


def check_assets(pipeline: Path, folders: Iterable[str]) -> None:
    """Refuse, before anything is exported, a pipeline folder whose asset files (`folders`, the scheduler config,
    model_index.json) include a link out of the source or something that is not a regular file."""
    roots = roots_of(pipeline)
    for folder in folders:
        if (pipeline / folder).is_dir():
            check_folder(pipeline / folder, folder, roots)
    for rel in ("scheduler/scheduler_config.json", "model_index.json"):
        if os.path.lexists(pipeline / rel):
            checked_file(pipeline / rel, rel, roots)


def check_out_apart(out: Path, sources: Iterable[Path]) -> None:
    """Refuse an --out that is a source folder, holds one or lies inside one: replacing --out (--overwrite, or the
    move into place) would delete the source, or the folder's other files."""
    there = os.path.realpath(out)
    for source in sources:
        real = os.path.realpath(source)
        how = (
            "is"
            if there == real
            else "holds"
            if _inside(real, [there])
            else "is inside"
            if _inside(there, [real])
            else None
        )
        if how is not None:
            raise ConfigError(
                f"--out {out} {how} the source {source}: the export replaces --out whole",
                hint="choose an --out folder apart from the source, e.g. beside it",
            )


def check_tokenizers(found) -> None:
    """Load each tokenizer folder of `found` (an ExportSource) as the runtime will (diffusion/tokenizer.py): a
    tokenizer.json cut short or a config it cannot use is refused now, in one line, not at the first load of the
    published model."""
    from enginefarm.diffusion.tokenizer import ClipTokenizer, T5Tokenizer

    if found.pipeline is None:
        return
    for name in found.family.text_encoders:
        folder = found.pipeline / ("tokenizer" + name.removeprefix("text_encoder"))
        if name in found.components and folder.is_dir():
            t5 = found.family.component(name).tokenizer == "t5"
            (T5Tokenizer if t5 else ClipTokenizer).from_folder(folder)
