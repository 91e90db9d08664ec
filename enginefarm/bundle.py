"""`enginefarm bundle`: the smallest set of files an app needs to load and run one target's artifacts, written into one
folder that the app puts on `sys.path`. It holds enginefarm's runtime modules (no builder, no CLI, not this module),
the runtime's own dependencies trimmed of what running never imports (numpy's tests, f2py and stubs; zstandard's
cffi backend), and the target's vendor runtime trimmed to its device class: the backend's `bundles` (BundleSpec)
say which of its distributions' files to keep. What belongs to which distribution comes from its installed file
list (RECORD); `bundle.json` records each copied file with its size, the distribution's version and the rules, so a
bundle can be rebuilt and audited. The bundle is for the Python (version, ABI, platform) that wrote it.

`bundle_proof.py` proves a bundle by running an artifact from it in a fresh isolated interpreter."""

from __future__ import annotations

import fnmatch
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import secrets
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from enginefarm.backends import BundleSpec, get_backend, registry
from enginefarm.cache.manifest import Target
from enginefarm.errors import BackendUnavailable, ConfigError

log = logging.getLogger(__name__)

FORMAT = 1
# enginefarm's runtime, package → folder in the bundle. The builder (enginefarm.builder) stays out: an app that
# compiles on the device installs the `build` extra instead.
RUNTIME_PACKAGES = {
    "enginefarm": "enginefarm",
    "enginefarm.backends": "enginefarm/backends",
    "enginefarm.cache": "enginefarm/cache",
    "enginefarm.cache.stores": "enginefarm/cache/stores",
    "enginefarm.cache.trust": "enginefarm/cache/trust",
    "enginefarm.hardware": "enginefarm/hardware",
    "enginefarm.runner": "enginefarm/runner",
    "enginefarm.sessions": "enginefarm/sessions",
}
NOT_RUNTIME = ("cli*.py", "bundle*.py")  # the command (click, rich) and the bundler itself

# The runtime's own dependencies (pyproject's core list), trimmed to what importing and running them use.
SUPPORT: dict[str, BundleSpec] = {
    # Tests, f2py, the typing stubs, headers, static libraries, Cython declarations and the PyInstaller hooks are for
    # developing against numpy; `import numpy` and the array code never load them.
    "numpy": BundleSpec(
        ("numpy",),
        drop=(
            "*/tests/*",
            "numpy/f2py/*",
            "numpy/typing/*",
            "numpy/_typing/*.pyi",
            "numpy/_pyinstaller/*",
            "numpy/distutils/*",
            "numpy/_core/include/*",
            "numpy/_core/lib/*",
            "*.pyi",
            "*.pxd",
            "*.h",
            "*.a",
            "numpy/_core/_*_tests.*.so",
            "numpy/_core/_*_tests.*.pyd",
            "numpy/py.typed",
        ),
    ),
    # Two 12 MB backends ship; zstandard imports the C one whenever it loads (the cffi one is the fallback).
    "zstandard": BundleSpec(("zstandard",), drop=("zstandard/_cffi.*", "zstandard/backend_cffi.py", "*.pyi")),
    "platformdirs": BundleSpec(("platformdirs",), drop=("*.pyi",)),
    "psutil": BundleSpec(("psutil",), drop=("psutil/tests/*",)),
    "packaging": BundleSpec(("packaging",), drop=("*.pyi",)),
}
# Kept from each distribution's .dist-info: its metadata (importlib.metadata.version works) and its licences.
DIST_INFO_KEEP = (
    "*.dist-info/METADATA",
    "*.dist-info/LICENSE*",
    "*.dist-info/licenses/*",
    "*.dist-info/COPYING*",
    "*.dist-info/NOTICE*",
)
PARTS = ("enginefarm", "numpy", "zstandard", "vendor runtime", "other")


@dataclass
class Part:
    """One distribution's share of a bundle."""

    part: str  # one of PARTS
    name: str
    version: str
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in the bundle, bytes)
    rules: dict[str, list[str]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)


@dataclass
class Bundle:
    target: str
    folder: Path
    parts: list[Part]
    notes: str = ""

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    def size_by_part(self) -> dict[str, int]:
        sizes = dict.fromkeys(PARTS, 0)
        for p in self.parts:
            sizes[p.part] += p.size
        return sizes

    def as_json(self) -> dict:
        return {
            "format": FORMAT,
            "target": self.target,
            "python": platform.python_version(),
            "abi": sys.implementation.cache_tag,
            "platform": sysconfig.get_platform(),
            "size": self.size,
            "size_by_part": self.size_by_part(),
            "notes": self.notes,
            "parts": [
                {
                    "part": p.part,
                    "name": p.name,
                    "version": p.version,
                    "size": p.size,
                    "rules": p.rules,
                    "files": [{"path": path, "size": size} for path, size in p.files],
                }
                for p in self.parts
            ],
        }


def bundlable_targets() -> list[str]:
    found = []
    for name in registry():
        try:
            found += [f"{name}:{device_class}" for device_class in get_backend(name).bundles]
        except BackendUnavailable:
            continue
    return found


def bundle_spec(target: str) -> tuple[Target, BundleSpec]:
    """The parsed target and what its bundle holds; a target that cannot be bundled is a one-line error."""
    hint = f"bundlable targets: {', '.join(bundlable_targets())}"
    try:
        parsed = Target.parse(target)
    except ValueError:
        raise ConfigError(f"--target {target!r} is not BACKEND:DEVICE", hint=hint) from None
    if parsed.backend not in registry():
        raise ConfigError(f"unknown backend {parsed.backend!r} in --target {target}", hint=hint)
    spec = get_backend(parsed.backend).bundles.get(parsed.device)
    if spec is None:
        raise ConfigError(
            f"{target} cannot be bundled: enginefarm knows no trimmed runtime for that device class", hint=hint
        )
    return parsed, spec


def _matches(path: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _distribution_files(name: str, spec: BundleSpec, install_hint: str) -> tuple[str, list[tuple[Path, str]]]:
    """(version, [(installed file, path in the bundle)]) of one distribution under `spec`'s rules."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise BackendUnavailable(
            f"{name} is not installed here, so there is nothing to bundle", hint=install_hint
        ) from None
    chosen = []
    for entry in dist.files or ():
        rel = entry.as_posix()
        if rel.startswith("../") or "__pycache__/" in rel or rel.endswith((".pyc", ".pyo")):
            continue  # scripts outside site-packages; byte code (the app's installer may compile its own)
        if ".dist-info/" in rel:
            if _matches(rel, DIST_INFO_KEEP):
                chosen.append(rel)
            continue
        if _matches(rel, spec.drop) and not _matches(rel, spec.keep):
            continue
        chosen.append(rel)
    files = []
    for rel in chosen:
        source = Path(str(dist.locate_file(rel)))
        if source.is_file():
            files.append((source, rel))
        else:
            log.warning("bundle: %s lists %s, which is not installed; left out", name, rel)
    if not any(".dist-info/" not in rel for _, rel in files):
        raise BackendUnavailable(
            f"{name} {dist.version} is installed without its files, so there is nothing to bundle", hint=install_hint
        )
    return dist.version, files


def _runtime_files() -> list[tuple[Path, str]]:
    """enginefarm's runtime modules, found by package so that an editable install bundles the same files as a wheel."""
    suffixes = (".py", *importlib.machinery.EXTENSION_SUFFIXES)
    files = []
    for package, folder in RUNTIME_PACKAGES.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"enginefarm's package {package} is not importable here", hint="reinstall enginefarm")
        where = Path(next(iter(spec.submodule_search_locations)))
        for source in sorted(where.iterdir()):
            if not source.is_file() or not source.name.endswith(suffixes):
                continue
            if package == "enginefarm" and _matches(source.name, NOT_RUNTIME):
                continue
            files.append((source, f"{folder}/{source.name}"))
    return files


def collect(target: str) -> tuple[Target, BundleSpec, list[tuple[Part, list[tuple[Path, str]]]]]:
    """What a bundle of `target` holds, part by part, without writing anything."""
    parsed, spec = bundle_spec(target)
    backend = get_backend(parsed.backend)
    import enginefarm

    planned = [
        (
            Part(
                "enginefarm",
                "enginefarm",
                enginefarm.__version__,
                rules={"packages": list(RUNTIME_PACKAGES), "drop": list(NOT_RUNTIME)},
            ),
            _runtime_files(),
        )
    ]
    for name, support in SUPPORT.items():
        version, files = _distribution_files(name, support, "pip install enginefarm")
        part = name if name in ("numpy", "zstandard") else "other"
        planned.append(
            (Part(part, name, version, rules={"drop": list(support.drop), "keep": list(support.keep)}), files)
        )
    for name in spec.distributions:
        version, files = _distribution_files(name, spec, backend.install)
        planned.append(
            (Part("vendor runtime", name, version, rules={"drop": list(spec.drop), "keep": list(spec.keep)}), files)
        )
    return parsed, spec, planned


def earlier_bundle(folder: Path) -> bool:
    """Whether `folder` is a bundle this command wrote, and nothing more: its bundle.json is one `write_bundle`
    writes, and every file in the folder is listed there (byte code an app's runs wrote in `__pycache__/` aside).
    Only such a folder may be replaced, since replacing deletes all it holds."""
    try:
        listing = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
        if not (
            isinstance(listing, dict) and listing.get("format") == FORMAT and isinstance(listing.get("target"), str)
        ):
            return False
        listed = {str(f["path"]) for part in listing["parts"] for f in part["files"]}
        for root, dirs, files in os.walk(folder):
            here = Path(root).relative_to(folder)
            for name in files:
                rel = (here / name).as_posix()
                if (
                    rel != "bundle.json"
                    and rel not in listed
                    and not (here.name == "__pycache__" and name.endswith(".pyc"))
                ):
                    return False
            if any(os.path.islink(os.path.join(root, d)) for d in dirs):
                return False  # the command writes no links
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def write_bundle(target: str, out: Path) -> Bundle:
    """Copy the bundle of `target` into `out` (a new or empty folder, or an earlier bundle, which is replaced whole:
    the new one is written beside it and renamed into place, so `out` is never half a bundle)."""
    out = Path(out).absolute()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not earlier_bundle(out))):
        raise ConfigError(
            f"--out {out} exists and is not a bundle (or holds files its bundle.json does not list)",
            hint="give a new or empty folder (an earlier bundle there is replaced whole; move your own files out)",
        )
    parsed, spec, planned = collect(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"
    try:
        parts = []
        for part, files in planned:
            for source, rel in files:
                dest = partial / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)
                part.files.append((rel, dest.stat().st_size))
            parts.append(part)
        bundle = Bundle(str(parsed), out, parts, spec.notes)
        (partial / "bundle.json").write_text(json.dumps(bundle.as_json(), indent=1) + "\n")
        if out.exists():
            old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
            os.replace(out, old)
            os.replace(partial, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return bundle
