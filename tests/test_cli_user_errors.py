"""Mistakes a new user makes on the command line: each gets its own one-line error and hint, never another's."""

from __future__ import annotations

import json

import numpy as np


def test_a_bare_npy_input_asks_for_its_name(cli, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    proc = cli("run", "m/c", "--input", str(tmp_path / "x.npy"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: --input {tmp_path / 'x.npy'}: give NAME=FILE.npy"), proc.stderr
    assert "hint: only .npz files carry their own names" in proc.stderr and "Traceback" not in proc.stderr


def test_a_lora_strength_typo_is_named(cli, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    (tmp_path / "a.safetensors").write_bytes(b"")
    proc = cli("run", "m/c", "--input", str(tmp_path / "in.npz"), "--lora", f"{tmp_path / 'a.safetensors'}:O.8")
    assert proc.returncode == 1
    assert "strength 'O.8' is not a number" in proc.stderr.splitlines()[-2], proc.stderr
    assert proc.stderr.splitlines()[-1] == "hint: --lora PATH[:STRENGTH], e.g. --lora style.safetensors:0.8"


def test_doctor_gives_each_install_hint_once(cli, tmp_path):
    shim = tmp_path / "shim" / "coremltools"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden for this test', name='coremltools')\n")
    proc = cli("doctor", env={"PYTHONPATH": str(shim.parent), "COLUMNS": "400"}, check=True)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("│ coreml"))
    assert "coremltools is not installed" in row and row.count("pip install 'enginefarm[coreml]'") == 1, row


def test_run_with_nothing_stored_prints_just_the_error(cli, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    proc = cli("run", "nope/decoder", "--input", str(tmp_path / "in.npz"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "error: no artifact of nope/decoder fits this device: no stored artifact for it\nhint: "
    ), repr(proc.stderr)


def test_read_only_commands_see_a_store_that_does_not_exist_yet_as_empty_and_say_so(cli, tmp_path, tiny_recipe):
    """A user's first commands (`plan recipe.toml --store NEW`, then `build`) work: reading a store that is not there
    yet shows it empty, in one line that names the path (a typo shows there too), and creates nothing."""
    missing = tmp_path / "no-such-store"
    note = f"note: no store at {missing} yet: it is empty (`enginefarm build RECIPE` creates it)"
    for args in (("ls",), ("plan", str(tiny_recipe())), ("validate", str(tiny_recipe()))):
        for how in ({"args": ("--store", str(missing))}, {"env": {"ENGINEFARM_STORE": str(missing)}}):
            proc = cli(*args, *how.get("args", ()), env=how.get("env"))
            assert proc.returncode == 0, (args, proc.stderr)
            assert proc.stderr.splitlines() == [note], (args, proc.stderr)
    proc = cli("plan", str(tiny_recipe()), "--store", str(missing), "--format", "json")
    assert [job["status"] for job in json.loads(proc.stdout)] == ["to build"]
    assert not missing.exists()  # looking created nothing
    cli("build", str(tiny_recipe()), "--store", str(missing), "--no-bench", check=True)  # building creates it
    proc = cli("plan", str(tiny_recipe()), "--store", str(missing), check=True)
    assert "note:" not in proc.stderr and "built" in proc.stdout


def test_loading_from_a_store_that_does_not_exist_is_an_error(cli, tmp_path, tiny_recipe):
    """A typo in --store or ENGINEFARM_STORE must not read as 'nothing built' (or serve what the cache holds)."""
    import pytest

    import enginefarm
    from enginefarm.errors import StoreNotFound

    missing = tmp_path / "no-such-store"
    np.savez(tmp_path / "in.npz", latent=np.ones((1, 4, 8, 8), np.float32))
    for args in (("run", "tiny-sd/decoder", "--input", str(tmp_path / "in.npz")), ("fetch", "tiny-sd/decoder")):
        proc = cli(*args, "--store", str(missing))
        assert proc.returncode == 1 and proc.stderr.startswith(f"error: no store at {missing}\nhint: check the path"), (
            args,
            proc.stderr,
        )
        proc = cli(*args, env={"ENGINEFARM_STORE": str(missing)})
        assert proc.stderr.startswith(f"error: no store at {missing}"), (args, proc.stderr)
    with pytest.raises(StoreNotFound, match="no store at"):
        enginefarm.load("tiny-sd/decoder", store=str(missing))
    assert not missing.exists()


def test_missing_optional_extras_are_named_not_raised(cli, tmp_path, tiny_recipe):
    shims = tmp_path / "shims"
    for module in ("tuf", "securesystemslib", "matplotlib"):
        (shims / module).mkdir(parents=True)
        (shims / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError('hidden for this test', name='{module}')\n"
        )
    env = {"PYTHONPATH": str(shims)}
    proc = cli("release", "init", "--keys", str(tmp_path / "keys"), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "hint: pip install 'enginefarm[release]'", proc.stderr
    cli("build", str(tiny_recipe()), check=True)  # with a benchmark, so the report has latencies to chart
    proc = cli("report", "--out", str(tmp_path / "report"), env=env, check=True)
    assert "latency charts need matplotlib: pip install 'enginefarm[report]'" in proc.stderr
    assert (tmp_path / "report" / "report.html").is_file() and not list((tmp_path / "report").glob("*.png"))


def test_a_shape_inside_the_profile_that_breaks_the_models_stride_is_explained(cli, tmp_path, write_recipe):
    import pytest

    import enginefarm
    from enginefarm.errors import InputError
    from tests import models

    models.strided(tmp_path / "m.onnx")
    recipe = write_recipe("""
[model]
name = "strided"
version = "1"
[defaults]
targets = ["onnxruntime:cpu", "openvino:cpu"]
[components.c]
source = "m.onnx"
[components.c.profiles.default]
h = [8, 16, 32]
w = [8, 16, 32]
""")
    cli("build", str(recipe), "--no-bench", check=True)
    for target in ("onnxruntime:cpu", "openvino:cpu"):
        session = enginefarm.load("strided/c", target=target)
        assert session.run({"x": np.ones((1, 1, 16, 24), np.float32)})["y"].shape == (1, 1, 16, 24)
        with pytest.raises(
            InputError, match=r"x axis 2 is 9, every validated size is a multiple of 8 \(try 8 or 16\)"
        ) as refused:
            session.run({"x": np.ones((1, 1, 9, 16), np.float32)})
        assert refused.value.hint.startswith("the backend said: ") and "Traceback" not in refused.value.hint
    np.save(tmp_path / "x.npy", np.ones((1, 1, 9, 16), np.float32))
    proc = cli("run", "strided/c", "--input", f"x={tmp_path / 'x.npy'}")
    assert proc.returncode == 1 and proc.stderr.startswith("error: strided/c: the model cannot run inputs of shape"), (
        proc.stderr
    )


def test_a_mistyped_model_name_lists_what_the_store_holds(cli, tmp_path, tiny_recipe):
    """A typo is not 'nothing built': the error names the models the store holds and the closest one, for
    `enginefarm run` and for a pipeline alike."""
    import pytest

    from enginefarm.diffusion import Pipeline
    from enginefarm.errors import UnknownModelError

    cli("build", str(tiny_recipe()), "--no-bench", check=True)
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    proc = cli("run", "tiny-sdd/decoder", "--input", str(tmp_path / "in.npz"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    error, hint = proc.stderr.splitlines()[-2:]
    assert error.startswith("error: no model 'tiny-sdd' in the store ") and error.endswith("; it holds tiny-sd"), error
    assert hint == "hint: did you mean tiny-sd/decoder?", hint
    with pytest.raises(UnknownModelError) as raised:
        Pipeline.load("tiny-sdd", device="cpu")
    assert raised.value.hint == "did you mean tiny-sd?"
