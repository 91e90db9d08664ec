"""Every error the product raises to a user is an `EnginefarmError` importable from `enginefarm.errors`: a class
defined anywhere else (`cache/stores/ranged.py`'s `class BlobChanged(StoreError)`) fails here, so an app catches what
one import names. The few exceptions that never leave their module are listed, with where they are caught."""

from __future__ import annotations

import ast
import builtins
import tomllib
from pathlib import Path

import enginefarm.errors

ROOT = Path(__file__).resolve().parents[1]

# Raised and caught inside the product; a user never sees them (each is turned into a one-line error or a fallback).
INTERNAL = {
    "backends/nvidia/sdk.py:SdkError": "raised in a build's child process; the job's result carries its words",
    "builder/sample_files.py:SampleError": "builder/recipe.py turns it into the recipe's RecipeError",
    "cache/fields.py:FieldError": "store records are checked with it; readers turn it into their own error",
}


def _product_classes() -> dict[str, tuple[str, list[str]]]:
    """'folder/module.py:Name' → (name, its bases as written), for every class in pyproject's package-dir folders."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for folder in package_dir.values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    found[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = (node.name, bases)
    return found


def _exception_classes(classes: dict[str, tuple[str, list[str]]]) -> set[str]:
    """The classes that derive from an exception, through builtins' and each other's names (to a fixed point)."""
    names = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    raised: set[str] = set()
    while True:
        more = {where for where, (name, bases) in classes.items() if set(bases) & names} - raised
        if not more:
            return raised
        raised |= more
        names |= {classes[where][0] for where in more}


def test_every_error_the_product_raises_is_in_enginefarm_errors():
    classes = _product_classes()
    raised = _exception_classes(classes)
    assert "enginefarm/errors.py:InputError" in raised and len(raised) > 25  # the scan saw the tree
    elsewhere = sorted(where for where in raised if not where.startswith("enginefarm/errors.py:"))
    stray = [where for where in elsewhere if where not in INTERNAL]
    assert not stray, "define these in enginefarm/errors.py (or list them in INTERNAL with why):\n" + "\n".join(stray)
    gone = sorted(set(INTERNAL) - set(elsewhere))
    assert not gone, f"INTERNAL lists what is no longer there: {gone}"
    for where in raised - set(INTERNAL):
        error = getattr(enginefarm.errors, classes[where][0])
        assert issubclass(error, enginefarm.errors.EnginefarmError), where  # the CLI prints it as one line


def test_the_modules_that_raise_them_still_name_them():
    """Moved into enginefarm.errors, they stay importable where they were raised (apps that imported them there)."""
    from enginefarm.builder.oom import OutOfMemory
    from enginefarm.bundle_proof import ProofFailed
    from enginefarm.cache.archive import UnsafeArchiveError
    from enginefarm.cache.stores.ranged import BlobChanged, TransferTooSlow
    from enginefarm.cache.stores.small import Unreachable
    from enginefarm.runner.session import InputError

    moved = (OutOfMemory, ProofFailed, UnsafeArchiveError, BlobChanged, TransferTooSlow, Unreachable, InputError)
    assert all(getattr(enginefarm.errors, error.__name__) is error for error in moved)
    assert OutOfMemory("no room", asked=3).asked == 3 and isinstance(OutOfMemory("x"), MemoryError)
