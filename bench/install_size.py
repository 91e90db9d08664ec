"""Installed size of the runtime: `pip install enginefarm` alone and with each backend's runtime extra, in fresh venvs.

    python bench/install_size.py [--extras "",openvino,onnxruntime,tensorrt-rtx] [--keep DIR]

Prints MB per installed distribution (site-packages, pip and setuptools excluded), enginefarm's own share (everything
but numpy and the vendor runtime), and whether onnx / onnxsim came along. Needs the network (or a pip cache)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ("openvino", "onnxruntime", "tensorrt", "nvidia", "cuda")  # distribution name prefixes of the vendor runtimes
SKIP = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _by_distribution(site: Path) -> dict[str, int]:
    """Bytes per distribution, from each dist-info's RECORD (files it installed)."""
    sizes: dict[str, int] = {}
    for info in site.glob("*.dist-info"):
        name = info.name.split("-")[0].lower()
        if name in SKIP:
            continue
        record = info / "RECORD"
        total = 0
        if record.is_file():
            for line in record.read_text().splitlines():
                file = site / line.split(",")[0]
                if file.is_file():
                    total += file.stat().st_size
        sizes[name] = total
    return sizes


def measure(extra: str, folder: Path) -> dict[str, int]:
    venv = folder / (extra or "core")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    spec = f"{ROOT}[{extra}]" if extra else str(ROOT)
    # A regular (not editable) install, as an app gets it from the wheel.
    subprocess.run([str(python), "-m", "pip", "install", "-q", spec], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    return _by_distribution(site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default=",openvino,onnxruntime,tensorrt-rtx")
    parser.add_argument("--keep", type=Path, help="keep the venvs here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for extra in args.extras.split(","):
            sizes = measure(extra, folder)
            mb = lambda n: n / 1e6  # noqa: E731
            total = sum(sizes.values())
            vendor = sum(v for k, v in sizes.items() if k.startswith(VENDOR))
            own = total - vendor - sizes.get("numpy", 0)
            top = ", ".join(f"{k} {mb(v):.1f}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:8])
            print(
                f"core{'+' + extra if extra else ''}: {mb(total):.0f} MB (vendor runtime {mb(vendor):.0f}, numpy "
                f"{mb(sizes.get('numpy', 0)):.0f}, enginefarm's own share {mb(own):.1f}); onnx installed: "
                f"{'onnx' in sizes}, onnxsim: {'onnxsim' in sizes}"
            )
            print(f"    largest: {top}")


if __name__ == "__main__":
    main()
