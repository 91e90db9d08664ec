"""Work folders are per process (issue 17, finding 5): two builds sharing ENGINEFARM_HOME never clobber each other,
and what a killed build left is reclaimed by the next run and by `gc`. Hostile recipe inputs (finding 8) are one
clear error each: nesting, corrupt or bomb-sized samples, names with a trailing newline."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.errors import IntegrityError, RecipeError, StoreError
from tests import models
from tests.conftest import profile_tables


@pytest.mark.slow
def test_two_builds_sharing_one_home_both_complete(tiny_sd, write_recipe, tmp_path):
    recipe = write_recipe(f"""
[model]
name = "shared"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu"]
[components.decoder]
source = "models/tiny_sd.onnx"
{profile_tables(3)}
""")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enginefarm.cli",
                "build",
                str(recipe),
                "--no-bench",
                "--store",
                str(tmp_path / f"store{i}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-800:] + o[0][-800:] for o in outs]
    for i in range(2):
        assert len(list(open_store(tmp_path / f"store{i}").list_manifest_keys())) == 3
    jobs = tmp_path / "home" / "build" / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_builds_work_folder_is_reclaimed_and_counted(tmp_path, cli, tiny_recipe):
    home = tmp_path / "home"
    left = home / "build" / "jobs" / f"{'a' * 24}.{dead_pid()}-12345"
    left.mkdir(parents=True)
    (left / "model.onnx").write_bytes(os.urandom(100_000))
    mine = (
        home / "build" / "jobs" / f"{'b' * 24}.{os.getpid()}-1"
    )  # a pid that runs, but started at another time: dead too
    mine.mkdir()
    cache = DeviceCache(home)
    assert cache.size() >= 100_000, "leftovers count against the quota"
    proc = cli("cache", "gc")
    assert proc.returncode == 0, proc.stderr
    assert not left.exists() and not mine.exists()


def test_a_live_builds_work_folder_is_left_alone(tmp_path):
    from enginefarm.cache import workdirs

    folder = workdirs.own(tmp_path / "home" / "build" / "jobs", "c" * 24)
    folder.mkdir(parents=True)
    DeviceCache(tmp_path / "home").gc(0, max_tmp_age=0)
    assert folder.exists()


# Hostile recipe inputs ---------------------------------------------------------------------------------------
RECIPE_HEAD = """
[model]
name = "lin"
version = "1"
[defaults]
targets = ["onnxruntime:cpu"]
[components.lin]
source = "m.onnx"
[components.lin.profiles.default]
batch = [1, 2, 4]
"""


def test_deeply_nested_recipe_is_a_recipe_error(write_recipe, cli):
    recipe = write_recipe('[model]\nname = "x"\nversion = "1"\nextra = ' + "[" * 600 + "]" * 600 + "\n")
    proc = cli("plan", str(recipe))
    assert proc.returncode == 1 and "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_corrupt_samples_npz_is_a_recipe_error(tmp_path, write_recipe):
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe

    models.linear(tmp_path / "m.onnx")
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones((2, 8), np.float32))
    (tmp_path / "samples.npz").write_bytes(good.read_bytes()[:60])  # a zip header, then nothing: BadZipFile before
    recipe = write_recipe(RECIPE_HEAD + '[components.lin.validate]\nsamples = "samples.npz"\n')
    with pytest.raises(RecipeError, match="cannot read samples.npz: not a numpy .npz file"):
        expand(load_recipe(recipe), tmp_path / "sources")


def test_a_truncated_npy_input_is_a_recipe_error(tmp_path, write_recipe):
    from enginefarm.builder.recipe import load_recipe

    models.linear(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    (tmp_path / "x.npy").write_bytes((tmp_path / "x.npy").read_bytes()[:-8])
    recipe = write_recipe(RECIPE_HEAD + '[components.lin.validate.inputs.x]\nfile = "x.npy"\n')
    with pytest.raises(RecipeError, match="truncated"):
        load_recipe(recipe)


def npz_bomb(path: Path, shape: tuple[int, ...]) -> None:
    """An .npz whose one array is all zeros: a few MB compressed, shape's worth of bytes inflated. Written in
    pieces, so making it costs no memory."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros((0,), np.float32))
    header["shape"] = shape
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            zeros = bytes(16 << 20)
            for _ in range(int(np.prod(shape)) * 4 // len(zeros)):
                member.write(zeros)


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_samples_zip_bomb_does_not_blow_up_plan(tmp_path, write_recipe):
    """A 2 MB .npz took `plan` to 2.1 GB RSS (the array was inflated to read its shape). Shapes now come from the
    header; the declared size is bounded. Measured from the planning process itself."""
    models.linear(tmp_path / "m.onnx")
    npz_bomb(tmp_path / "samples.npz", (1, 8 * 32 << 20))  # 1 GiB of float32 zeros
    assert (tmp_path / "samples.npz").stat().st_size < 4 << 20
    recipe = write_recipe(RECIPE_HEAD + '[components.lin.validate]\nsamples = "samples.npz"\n')
    code = (
        "import resource, sys\nfrom enginefarm.builder.planner import expand\nfrom enginefarm.builder.recipe import "
        "load_recipe\nfrom enginefarm.errors import RecipeError\n"
        f"try:\n    expand(load_recipe({str(recipe)!r}), __import__('pathlib').Path({str(tmp_path / 'src')!r}))\n"
        "except RecipeError as exc:\n    print('refused:', exc)\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so it would report the test runner's size
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "print('rss_mb', int(hwm[0].split()[1]) // 1024 if hwm else "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rss = int(out.stdout.split("rss_mb")[1])
    assert "refused:" in out.stdout and ("outside profile" in out.stdout or "more than" in out.stdout), out.stdout
    assert rss < 600, f"planning a 1 GiB sample bomb used {rss} MB"


def test_a_huge_frame_table_is_an_integrity_error_not_a_memory_error(tmp_path):
    from enginefarm.cache import weight_codec

    raw = 1 << 40
    forged = tmp_path / "forged"
    forged.write_bytes(weight_codec._HEADER.pack(weight_codec.MAGIC, 4, 1, 0, raw, 1 << 16, raw >> 16) + b"\0" * 1000)
    with open(forged, "rb") as handle, pytest.raises(IntegrityError, match="truncated|frames"):
        list(weight_codec.decode_frames(handle, raw))
    frames = (1 << 32) - 1  # a 48 GiB frame table: before, read() asked for it at once (an empty MemoryError)
    forged.write_bytes(weight_codec._HEADER.pack(weight_codec.MAGIC, 4, 1, 0, frames, 1, frames))
    with open(forged, "rb") as handle, pytest.raises(IntegrityError, match="forged frame table"):
        list(weight_codec.decode_frames(handle, frames))


@pytest.mark.parametrize("name", ["a" * 64 + "\n", "A" * 64])
def test_store_names_with_a_trailing_newline_are_refused(name, tmp_path):
    with pytest.raises(StoreError):
        open_store(tmp_path / "store").get_manifest_bytes(name)


def test_a_model_name_with_a_trailing_newline_is_a_recipe_error(write_recipe, tmp_path):
    from enginefarm.builder.recipe import load_recipe

    models.linear(tmp_path / "m.onnx")
    recipe = write_recipe('[model]\nname = "x\\n"\nversion = "1"\n[components.c]\nsource = "m.onnx"\n')
    with pytest.raises(RecipeError, match=r": model\.name: "):
        load_recipe(recipe)
