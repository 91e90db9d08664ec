"""Installed sizes of an app's options, and the import time of the runtime:

    python bench/bundle_size.py [--installs ",cli,onnxruntime,openvino"]
                                [--targets openvino:cpu,openvino:gpu,onnxruntime:cpu] [--runs 7]

- fresh venv installs of enginefarm with each extra (site-packages without pip and setuptools, from each RECORD:
  bench/install_size.py), MB;
- `enginefarm bundle` of each target, written from this environment and proven (MB by part);
- `import enginefarm.runner.load` in a fresh process, median of --runs: in the core venv, and from the openvino:cpu
  bundle under `python -I -S`.
Installing needs the network (or a pip cache); the bundles need this environment's vendor runtimes."""

from __future__ import annotations

import argparse
import compileall
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from install_size import VENDOR, measure

IMPORT = "import time; t = time.perf_counter(); import enginefarm.runner.load; print(time.perf_counter() - t)"


def import_seconds(python: str, runs: int, bundle: Path | None = None) -> float:
    """Median of `runs` fresh processes; the first run (which may write byte code) is not counted. Run outside the
    checkout, whose enginefarm/ folder would otherwise shadow the installed package."""
    code = IMPORT if bundle is None else f"import sys; sys.path.insert(0, {str(bundle)!r}); {IMPORT}"
    flags = ["-I", "-S"] if bundle is not None else []
    times = [
        float(
            subprocess.run(
                [python, *flags, "-c", code], capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()
            ).stdout
        )
        for _ in range(runs + 1)
    ]
    return statistics.median(times[1:])


def byte_code_size(bundle: Path) -> int:
    """What compiling the bundle's Python files adds (a bundle ships none; an app's installer may compile them)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "b"
        shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns("*.so", "*.so.*", "*.dll", "*.dylib", "*.json"))
        compileall.compile_dir(str(copy), quiet=2)
        return sum(p.stat().st_size for p in copy.rglob("*.pyc"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--installs", default=",cli,onnxruntime,openvino")
    parser.add_argument("--targets", default="openvino:cpu,openvino:gpu,onnxruntime:cpu")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="keep the venvs and bundles here (default: a temporary folder)")
    args = parser.parse_args()
    mb = lambda n: f"{n / 1e6:.1f}"  # noqa: E731
    from enginefarm.bundle import write_bundle
    from enginefarm.bundle_proof import prove

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print("| install | total MB | enginefarm | numpy | zstandard | vendor runtime | the rest |")
        print("|---|---|---|---|---|---|---|")
        core_python = None
        for extra in args.installs.split(","):
            sizes = measure(extra, folder)
            if not extra:
                core_python = str(folder / "core" / "bin" / "python")
            vendor = sum(v for k, v in sizes.items() if k.startswith(VENDOR))
            named = sizes.get("enginefarm", 0) + sizes.get("numpy", 0) + sizes.get("zstandard", 0) + vendor
            rest = sorted(
                (
                    (k, v)
                    for k, v in sizes.items()
                    if k not in ("enginefarm", "numpy", "zstandard") and not k.startswith(VENDOR)
                ),
                key=lambda kv: -kv[1],
            )
            print(
                f"| `enginefarm{f'[{extra}]' if extra else ''}` | {mb(sum(sizes.values()))} | "
                f"{mb(sizes.get('enginefarm', 0))} | {mb(sizes.get('numpy', 0))} | {mb(sizes.get('zstandard', 0))} | "
                f"{mb(vendor)} | {mb(sum(sizes.values()) - named)} ({', '.join(f'{k} {mb(v)}' for k, v in rest[:5])}) |"
            )
        print()
        print(
            "| bundle | total MB | enginefarm | numpy | zstandard | vendor runtime | other | + byte code if compiled "
            "| proof |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        bundles = {}
        for target in args.targets.split(","):
            bundle = write_bundle(target, folder / "bundles" / target.replace(":", "-"))
            bundles[target] = bundle.folder
            proof = prove(bundle.folder, target)
            by = bundle.size_by_part()
            print(
                f"| {target} | {mb(bundle.size)} | {mb(by['enginefarm'])} | {mb(by['numpy'])} | {mb(by['zstandard'])} "
                f"| {mb(by['vendor runtime'])} | {mb(by['other'])} | {mb(byte_code_size(bundle.folder))} | "
                f"{'ran, matches ONNX Runtime' if proof.ran else 'files load; not run (no device)'} |"
            )
        print()
        from importlib.metadata import version

        print(f"bundles written from this environment: numpy {version('numpy')}, zstandard {version('zstandard')}")
        if core_python:
            print(
                f"import enginefarm.runner.load, core venv: median {import_seconds(core_python, args.runs):.3f} s of "
                f"{args.runs} fresh processes"
            )
        for target, where in bundles.items():
            print(
                f"import enginefarm.runner.load, {target} bundle (python -I -S; byte code written by a first, "
                f"uncounted run): median {import_seconds(sys.executable, args.runs, where):.3f} s of {args.runs}"
            )


if __name__ == "__main__":
    main()
