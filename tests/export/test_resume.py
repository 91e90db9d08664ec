"""A failed or interrupted export keeps the components that passed their checks, and the same command resumes."""

from __future__ import annotations

import pytest

from enginefarm.cache.progress import Progress
from enginefarm.export import export_model
from enginefarm.export.resume import RECORD, partial_folder
from enginefarm.export.source import read_source

LATENT = (8, 8, 16)


class CtrlC(Progress):
    """Ctrl-C as the export starts its `at`th component (the signal lands while the progress line is drawn)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def work(self, name: str, done: int, total: int) -> None:
        if done == self.at:
            raise KeyboardInterrupt


@pytest.fixture
def source(tiny):
    return tiny("sd1")


def test_an_interrupted_export_resumes_where_it_stopped(source, tmp_path):
    out = tmp_path / "out"
    first = CtrlC(at=2)
    with pytest.raises(KeyboardInterrupt):
        export_model(source, out, latent=LATENT, progress=first)
    assert not out.exists()
    kept = partial_folder(out)
    assert (kept / RECORD).is_file()
    assert any("kept 2 finished component(s)" in m and "the same command resumes" in m for m in first.messages), (
        first.messages
    )
    names = [c.name for c in read_source(source, None).family.components][:2]
    stamps = {n: (kept / f"{n}.onnx").stat().st_mtime_ns for n in names}
    third = read_source(source, None).family.components[2].name
    (kept / f".raw-{third}").mkdir()  # what a kill while tracing the third leaves (no `finally` runs)
    (kept / f".raw-{third}" / f"{third}.onnx").write_bytes(b"half a graph")

    again = CtrlC(at=-1)
    result = export_model(source, out, latent=LATENT, progress=again)
    assert any(m.startswith(f"resuming: {', '.join(names)} kept") for m in again.messages), again.messages
    assert {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in names} == stamps  # taken over, not exported again
    assert len(result.components) == 4 and all(max(c.deviations.values()) < 1e-3 for c in result.components)
    assert not (out / RECORD).exists() and (out / "recipe.toml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "store") == ["out"]  # no staging folder, no lock file


def test_a_damaged_component_or_other_options_are_exported_again(source, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        export_model(source, out, latent=LATENT, progress=CtrlC(at=1))
    damaged = next(partial_folder(out).glob("*.onnx"))
    damaged.write_bytes(damaged.read_bytes()[:100])  # a disk error, or a hand edit
    with pytest.raises(KeyboardInterrupt):
        export_model(source, out, latent=LATENT, progress=(again := CtrlC(at=1)))
    assert "resuming: nothing kept from an earlier run of this export" in again.messages, again.messages
    assert damaged.stat().st_size > 100  # exported again

    with pytest.raises(KeyboardInterrupt):  # another latent range: what was kept does not fit it
        export_model(source, out, latent=(8, 16, 16), progress=(other := CtrlC(at=1)))
    assert not any(m.startswith("resuming") for m in other.messages), other.messages


def test_a_failure_before_any_component_finished_leaves_nothing(source, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        export_model(source, tmp_path / "out", latent=LATENT, progress=CtrlC(at=0))
    assert [p.name for p in tmp_path.iterdir() if p.name != "store"] == []


def test_the_resume_key_sees_a_same_size_change_with_the_mtime_kept(tmp_path):
    """`cp -p` or `rsync -t` of another checkpoint of the same size keeps the mtime: the key must still change."""
    import os

    from enginefarm.export.resume import export_key

    folder = tmp_path / "src"
    (folder / "unet").mkdir(parents=True)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"\x01" * 4096)
    before = export_key([folder], {"latent": None})
    stat = weights.stat()
    with open(weights, "r+b") as f:  # in place, as `cp -p` over it does
        f.seek(2048)
        f.write(b"\x02")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert export_key([folder], {"latent": None}) != before
    assert export_key([folder], {"latent": None}) == export_key([folder], {"latent": None})


def test_a_second_export_to_the_same_out_is_refused_before_torch_is_imported(source, tmp_path):
    """Before, the second waited for torch's import (24 s on the shared VM) before the lock refused it."""
    import subprocess
    import sys

    from enginefarm.cache.locks import file_lock

    out = tmp_path / "out"
    code = (
        "import sys\nfrom enginefarm.errors import ConfigError\nfrom enginefarm.export import export_model\n"
        f"try:\n    export_model({str(source)!r}, {str(out)!r})\nexcept ConfigError as e:\n"
        "    print(e.message, 'torch' in sys.modules)\n"
    )
    with file_lock(tmp_path / ".out.export-lock", timeout=0) as taken:  # another export is writing `out`
        assert taken
        said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert said.strip() == f"another `enginefarm export` is writing {out} False"
