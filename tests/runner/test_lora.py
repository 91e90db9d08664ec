"""Custom weights and LoRA stacks on real artifacts (ONNX Runtime and OpenVINO on CPU), checked against ONNX
Runtime running the model with the weights merged by numpy."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import enginefarm
from enginefarm.builder.build import build
from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.errors import ConfigError, WeightsError
from tests import models
from tests.conftest import builds

TARGETS = ("onnxruntime:cpu", "openvino:cpu")
RECIPE = """
[model]
name = "net"
version = "1"
[defaults]
precisions = ["fp32", "fp16"]
targets = ["onnxruntime:cpu", "openvino:cpu"]
[components.body]
source = "net.onnx"
checkpoint = "base.safetensors"
[components.body.profiles.default]
batch = [1, 1, 2]
[components.plain]
source = "net.onnx"
precisions = ["fp32"]
targets = ["onnxruntime:cpu"]
[components.plain.profiles.default]
batch = [1, 1, 2]
"""
X = np.random.default_rng(7).normal(size=(2, 4, 8, 8)).astype(np.float32)
BASE = models.lora_net_checkpoint()
# LoRA A: Linear (transposed initializer) + 1×1 Conv (anonymous) + 3×3 Conv (named) + a block of the fused k/v weight;
# B: Linear (same layer as A) + 3×3 Conv + the other block of the fused weight.
LAYERS_A = {
    "attn.to_q": (*models.lora_pair((16, 8), 4, 1), 2.0),
    "mid.conv": (*models.lora_pair((8, 8, 1, 1), 2, 2), None),
    "conv_in": (*models.lora_pair((8, 4, 3, 3), 3, 3), 6.0),
    "attn.to_k": (*models.lora_pair((16, 8), 2, 7), None),
}
LAYERS_B = {
    "attn.to_q": (*models.lora_pair((16, 8), 2, 4), 1.0),
    "attn.to_out": (*models.lora_pair((8, 16), 8, 5), 4.0),
    "conv_in": (*models.lora_pair((8, 4, 3, 3), 1, 6), None),
    "attn.to_v": (*models.lora_pair((16, 8), 3, 8), 1.5),
}


@pytest.fixture(scope="module")
@builds
def farm(tmp_path_factory):
    return build_farm(tmp_path_factory.mktemp("lora"), RECIPE)


def build_farm(root, recipe: str):
    """The LoRA test net and its base checkpoint, every job of `recipe` built into root/store; then LoRA A (kohya
    and PEFT names), LoRA B (PEFT) and a custom checkpoint (fp32 and fp16) beside it."""
    models.lora_net(root / "net.onnx")
    models.write_safetensors(root / "base.safetensors", BASE)
    (root / "recipe.toml").write_text(recipe)
    store = open_store(str(root / "store"))
    for job in expand(load_recipe(root / "recipe.toml"), root / "dl"):
        result = build(job, store, root / "work", bench=False)
        assert result.status == "built", result.reason
    models.lora_file(root / "a_kohya.safetensors", LAYERS_A, "kohya")
    models.lora_file(root / "a_peft.safetensors", LAYERS_A, "peft")
    models.lora_file(root / "b.safetensors", LAYERS_B, "peft")
    custom = models.lora_net_checkpoint(seed=3)
    custom["extra.weight"] = BASE["extra.weight"]  # unused by the graph: accepted because it equals the base
    models.write_safetensors(root / "custom.safetensors", custom)
    models.write_safetensors(root / "custom_fp16.safetensors", {k: v.astype(np.float16) for k, v in custom.items()})
    return root


@pytest.fixture
def store(farm, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_STORE", str(farm / "store"))
    return farm


def reference(tmp_path, weights: dict[str, np.ndarray]) -> np.ndarray:
    path = models.lora_net(tmp_path / f"ref-{len(list(tmp_path.glob('ref-*')))}.onnx", weights)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def cosine(a, b) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


def run(target, precision="fp32", **stack) -> np.ndarray:
    session = enginefarm.load("net/body", precision=precision, device="cpu", target=target, **stack)
    return session.run({"x": X})["y"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("style", ["kohya", "peft"])
def test_lora_matches_numpy_merge(store, tmp_path, target, style):
    out = run(target, loras=[(store / f"a_{style}.safetensors", 0.8)])
    ref = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.8)]))
    assert cosine(out, ref) >= 0.9999
    assert np.allclose(out, ref, atol=1e-4)
    assert cosine(out, run(target)) < 0.999  # it changed something


@pytest.mark.parametrize("target", TARGETS)
def test_two_loras_on_the_same_layer_add_up(store, tmp_path, target):
    out = run(target, loras=[(store / "a_peft.safetensors", 0.6), (store / "b.safetensors", -0.3)])
    ref = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.6), (LAYERS_B, -0.3)]))
    assert cosine(out, ref) >= 0.9999 and np.allclose(out, ref, atol=1e-4)
    only_a = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.6)]))
    assert not np.allclose(out, only_a, atol=1e-3)


@pytest.mark.parametrize("target", TARGETS)
def test_custom_checkpoint_with_a_lora(store, tmp_path, target):
    custom = models.lora_net_checkpoint(seed=3)
    out = run(target, weights=store / "custom.safetensors", loras=[(store / "b.safetensors", 0.5)])
    ref = reference(tmp_path, models.merged(custom, [(LAYERS_B, 0.5)]))
    assert cosine(out, ref) >= 0.9999 and np.allclose(out, ref, atol=1e-4)
    # an fp16 copy of the same checkpoint is accepted and merged in fp32
    half = run(target, weights=store / "custom_fp16.safetensors")
    assert (
        cosine(half, reference(tmp_path, {k: v.astype(np.float16).astype(np.float32) for k, v in custom.items()}))
        >= 0.9999
    )


@pytest.mark.parametrize("target", TARGETS)
def test_fp16_artifacts_merge_in_fp32_then_cast(store, tmp_path, target):
    out = run(target, "fp16", loras=[(store / "a_kohya.safetensors", 1.0)])
    assert cosine(out, reference(tmp_path, models.merged(BASE, [(LAYERS_A, 1.0)]))) >= 0.999


@pytest.mark.parametrize("target", TARGETS)
def test_a_merge_past_fp16_is_refused_on_fp16_artifacts_only(store, tmp_path, target):
    """Finite in float32, past float16's 65504: an fp16 artifact would compute with Inf, so it is refused in one
    line."""
    up, down = models.lora_pair((16, 8), 1, 9)
    loud = models.lora_file(tmp_path / "loud.safetensors", {"attn.to_q": (up * 3000, down * 3000, None)}, "peft")
    with pytest.raises(WeightsError, match="loud.safetensors: merging into attn.to_q.weight gives Inf or NaN"):
        run(target, "fp16", loras=[(loud, 1.0)])
    assert np.isfinite(run(target, "fp32", loras=[(loud, 1.0)])).all()


@pytest.mark.parametrize("target", TARGETS)
def test_strength_zero_is_the_base_exactly(store, target):
    base = enginefarm.load("net/body", precision="fp32", device="cpu", target=target)
    zero = enginefarm.load(
        "net/body", precision="fp32", device="cpu", target=target, loras=[(store / "a_peft.safetensors", 0.0)]
    )
    assert zero.artifact.build_key == base.artifact.build_key
    assert np.array_equal(zero.run({"x": X})["y"], base.run({"x": X})["y"])


@pytest.mark.parametrize("target", TARGETS)
def test_no_residue_between_stacks(store, tmp_path, monkeypatch, target):
    """A, then B, then none in one process; each equals the same stack applied in a fresh cache."""
    a = [(store / "a_kohya.safetensors", 0.9)]
    b = [(store / "b.safetensors", 0.7)]
    in_order = [run(target, loras=a), run(target, loras=b), run(target)]
    fresh = []
    for i, stack in enumerate((a, b, ())):
        monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / f"fresh-{i}"))
        fresh.append(run(target, loras=stack))
    for got, want in zip(in_order, fresh, strict=True):
        assert np.array_equal(got, want)
    assert np.allclose(in_order[1], reference(tmp_path, models.merged(BASE, [(LAYERS_B, 0.7)])), atol=1e-4)


def test_no_residue_across_processes(store, tmp_path, cli):
    """The CLI in three processes sharing one cache: A, B, none; each equals its in-process result."""
    np.save(tmp_path / "x.npy", X)
    outputs = []
    for i, extra in enumerate(
        (["--lora", f"{store / 'a_peft.safetensors'}:0.9"], ["--lora", str(store / "b.safetensors")], [])
    ):
        proc = cli(
            "run",
            "net/body",
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--output",
            str(tmp_path / f"out{i}.npz"),
            "--precision",
            "fp32",
            "--target",
            "openvino:cpu",
            "--explain",
            *extra,
            check=True,
        )
        assert ("weights: applied in memory at load" in proc.stdout) == bool(extra)
        outputs.append(np.load(tmp_path / f"out{i}.npz")["y"])
    assert np.array_equal(outputs[0], run("openvino:cpu", loras=[(store / "a_peft.safetensors", 0.9)]))
    assert np.array_equal(outputs[1], run("openvino:cpu", loras=[(store / "b.safetensors", 1.0)]))
    assert np.array_equal(outputs[2], run("openvino:cpu"))
    proc = cli(
        "run",
        "net/body",
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--output",
        str(tmp_path / "w.npz"),
        "--precision",
        "fp32",
        "--target",
        "onnxruntime:cpu",
        "--weights",
        str(store / "custom.safetensors"),
        "--lora",
        f"{store / 'b.safetensors'}:-0.25",
        check=True,
    )
    want = run("onnxruntime:cpu", weights=store / "custom.safetensors", loras=[(store / "b.safetensors", -0.25)])
    assert np.array_equal(np.load(tmp_path / "w.npz")["y"], want)


@pytest.mark.parametrize("target", TARGETS)
def test_stacks_are_applied_in_memory_and_cost_no_cache_space(store, tmp_path, monkeypatch, target):
    from enginefarm.backends import get_backend

    plain = enginefarm.load("net/body", precision="fp32", device="cpu", target=target)
    size = sum(f.stat().st_size for f in (tmp_path / "home").rglob("*") if f.is_file())
    backend = get_backend(target.split(":")[0])
    monkeypatch.setattr(backend, "patch_weights", lambda *args: pytest.fail("a stack was written to disk"))
    first = enginefarm.load(
        "net/body", precision="fp32", device="cpu", target=target, loras=[(store / "a_peft.safetensors", 0.5)]
    )
    other = enginefarm.load(
        "net/body", precision="fp32", device="cpu", target=target, loras=[(store / "a_peft.safetensors", 0.6)]
    )
    assert "weights: applied in memory at load (nothing cached)" in first.explain()
    assert first.artifact.options["stack"]["base"] == plain.artifact.build_key and "stack" not in plain.artifact.options
    assert np.allclose(other.run({"x": X})["y"], reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.6)])), atol=1e-4)
    assert not np.allclose(first.run({"x": X})["y"], other.run({"x": X})["y"], atol=1e-3)
    assert (
        sum(f.stat().st_size for f in (tmp_path / "home").rglob("*") if f.is_file()) <= size + 4096
    )  # locks and bookkeeping only
    assert np.array_equal(
        enginefarm.load("net/body", precision="fp32", device="cpu", target=target).run({"x": X})["y"],
        plain.run({"x": X})["y"],
    )


def test_a_patched_artifact_is_cached_and_keyed_by_strength(store, tmp_path, monkeypatch):
    """The path that TensorRT-RTX takes without a GPU (runner/recompile.py): a patched ONNX copy, cached per stack."""
    from enginefarm.backends import get_backend
    from enginefarm.cache.progress import Progress
    from enginefarm.runner.custom import Stack, patched_artifact
    from enginefarm.runner.load import fetch
    from enginefarm.runner.request import Request

    manifest, path, _ = fetch(Request("net/body", "fp32", "cpu", target="onnxruntime:cpu"))
    backend, cache = get_backend("onnxruntime"), DeviceCache(tmp_path / "home")
    stack = lambda s: Stack.parse(None, [(store / "a_peft.safetensors", s)])  # noqa: E731
    first, _, how = patched_artifact(stack(0.5), manifest, path, backend, cache, Progress())
    calls = []
    real = backend.patch_weights
    monkeypatch.setattr(backend, "patch_weights", lambda *args: calls.append(1) or real(*args))
    again, _, how_again = patched_artifact(stack(0.5), manifest, path, backend, cache, Progress())
    assert (
        calls == []
        and again.build_key == first.build_key
        and how == "patched and compiled on this device"
        and "earlier (cached)" in how_again
    )
    other, other_dir, _ = patched_artifact(stack(0.6), manifest, path, backend, cache, Progress())
    assert calls == [1] and other.build_key != first.build_key  # another strength is another artifact
    out = backend.load(other_dir, other, "cpu").run({"x": X})["y"]
    assert np.allclose(out, reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.6)])), atol=1e-4)


def refit_backend(tmp_path):
    """A backend with Feature.REFIT (as TensorRT has): ONNX Runtime over the artifact with the weights it is given."""
    from enginefarm.backends import Feature
    from enginefarm.backends.onnxruntime import OnnxRuntime, OrtSession

    class RefitBackend(OnnxRuntime):
        features = frozenset({Feature.REFIT, Feature.PATCH_WEIGHTS, Feature.WEIGHTS_AT_LOAD})  # refit comes first

        def __init__(self):
            self.tmp, self.calls = tmp_path, []

        def refit(self, artifact_dir, manifest, weights, device):
            self.calls.append(weights)
            out = self.tmp / f"refit-{len(self.calls)}"
            out.mkdir()
            self.patch_weights(artifact_dir, manifest, weights, out)
            return OrtSession(out / "model.onnx", device, manifest.precision)

        def check_refit(self, manifest):
            return None

    return RefitBackend()


def test_refit_gets_every_mapped_weight_and_caches_the_merge(store, tmp_path):
    from enginefarm.formats.weightmap import read_map
    from enginefarm.runner.custom import Stack, apply
    from enginefarm.runner.load import fetch
    from enginefarm.runner.request import Request

    manifest, path, _ = fetch(Request("net/body", "fp32", "cpu", target="onnxruntime:cpu"))
    backend, cache = refit_backend(tmp_path), DeviceCache(tmp_path / "home")
    covered = {m.initializer for m in read_map(path, manifest).mapped.values()}
    from enginefarm.cache.progress import Progress

    a = apply(Stack.parse(None, [(store / "a_peft.safetensors", 1.0)]), manifest, path, backend, cache, Progress())
    b = apply(Stack.parse(None, [(store / "b.safetensors", 1.0)]), manifest, path, backend, cache, Progress())
    assert all(set(call) == covered for call in backend.calls)  # base values too: nothing of A can stay behind
    base = backend.read_weights(path, manifest, covered)
    assert np.array_equal(backend.calls[1]["onnx::Conv_7"], base["onnx::Conv_7"])  # A touched it, B does not
    assert np.allclose(
        b.session.run({"x": X})["y"], reference(tmp_path, models.merged(BASE, [(LAYERS_B, 1.0)])), atol=1e-4
    )
    assert a.how == "refit in place"
    again = apply(Stack.parse(None, [(store / "a_peft.safetensors", 1.0)]), manifest, path, backend, cache, Progress())
    assert again.how == "refit in place from cached merged weights"
    assert all(np.array_equal(backend.calls[2][k], backend.calls[0][k]) for k in covered)


# Errors: one clear error that lists every offender; nothing is cached.


def test_custom_checkpoint_errors_list_every_offender(store, tmp_path):
    bad = models.lora_net_checkpoint(seed=3)
    bad["attn.to_q.weight"] = np.zeros((8, 16), np.float32)  # transposed by mistake
    bad["conv_in.bias"] = np.arange(8, dtype=np.int32)  # not float
    bad["unknown.weight"] = np.zeros(3, np.float32)
    bad["extra.weight"] = np.ones(3, np.float32)  # the graph does not use it, but it differs from the base
    path = models.write_safetensors(tmp_path / "bad.safetensors", bad)
    with pytest.raises(WeightsError) as caught:
        run("onnxruntime:cpu", weights=path)
    text = str(caught.value)
    assert "4 tensor(s) do not fit" in text
    for part in (
        "attn.to_q.weight: shape [8, 16], the base has [16, 8]",
        "conv_in.bias: dtype I32",
        "unknown.weight: not in the base checkpoint",
        "extra.weight: differs from the base",
    ):
        assert part in text
    cached = list(DeviceCache(tmp_path / "home").entries())
    assert cached and not any(
        "stack" in c.manifest.options for c in cached
    )  # the base was fetched; nothing patched was kept


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            {
                "lora_unet_nowhere_conv.lora_down.weight": np.zeros((2, 8)),
                "lora_unet_nowhere_conv.lora_up.weight": np.zeros((16, 2)),
            },
            "lora_unet_nowhere_conv: names no module of the checkpoint",
        ),
        ({"attn.to_q.lora_A.weight": np.zeros((2, 8))}, "attn.to_q: needs both up and down tensors, has down"),
        (
            {"attn.to_q.lora_A.weight": np.zeros((2, 8)), "attn.to_q.lora_B.weight": np.zeros((16, 3))},
            "disagree on the rank",
        ),
        (
            {"attn.to_q.lora_A.weight": np.zeros((2, 9)), "attn.to_q.lora_B.weight": np.zeros((16, 2))},
            "the weight attn.to_q.weight is [16, 8]",
        ),
        (
            {
                "lora_te_attn_to_z.lora_down.weight": np.zeros((1, 3)),
                "lora_te_attn_to_z.lora_up.weight": np.zeros((3, 1)),
            },
            "names no module",
        ),
        ({"something_else": np.zeros(3)}, "something_else: not a LoRA tensor"),
        (
            {
                "attn.to_q.lora_A.weight": np.zeros((2, 8)),
                "attn.to_q.lora_B.weight": np.zeros((16, 2)),
                "attn.to_q.alpha": np.zeros(2),
            },
            "alpha must be one",
        ),
    ],
)
def test_lora_errors_name_the_module(store, tmp_path, tensors, message):
    path = models.write_safetensors(
        tmp_path / "bad_lora.safetensors", {k: v.astype(np.float32) for k, v in tensors.items()}
    )
    with pytest.raises(WeightsError, match="problem\\(s\\) in this LoRA") as caught:
        run("openvino:cpu", loras=[(path, 1.0)])
    assert message in str(caught.value) and "kohya" in caught.value.hint


def test_a_lora_on_a_tensor_the_map_could_not_place_says_why(store, tmp_path):
    path = models.write_safetensors(
        tmp_path / "l.safetensors",
        {
            "lora_unet_extra.lora_down.weight": np.zeros((1, 3), np.float32),
            "lora_unet_extra.lora_up.weight": np.zeros((3, 1), np.float32),
        },
    )
    with pytest.raises(
        WeightsError, match="lora_unet_extra → extra.weight: has no weight in the artifact \\(no initializer holds"
    ):
        run("onnxruntime:cpu", loras=[(path, 1.0)])


def test_garbage_files_and_bad_arguments(store, tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(WeightsError, match="not a valid safetensors file"):
        run("onnxruntime:cpu", loras=[(tmp_path / "junk.safetensors", 1.0)])
    with pytest.raises(WeightsError, match="file not found"):
        run("onnxruntime:cpu", weights=tmp_path / "missing.safetensors")
    with pytest.raises(ConfigError, match="not a finite number"):
        run("onnxruntime:cpu", loras=[(store / "b.safetensors", float("nan"))])
    with pytest.raises(ConfigError, match="is not \\(path, strength\\)"):
        run("onnxruntime:cpu", loras=[(store / "b.safetensors", 1.0, 2.0)])


def test_an_artifact_without_a_map_says_how_to_get_one(store):
    with pytest.raises(WeightsError, match="has no weight map") as caught:
        enginefarm.load("net/plain", device="cpu", loras=[(store / "b.safetensors", 1.0)])
    assert "checkpoint =" in caught.value.hint


def test_cli_prints_one_line_for_a_bad_lora(store, tmp_path, cli):
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "junk.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"{broken}")
    proc = cli(
        "run", "net/body", "--input", f"x={tmp_path / 'x.npy'}", "--lora", f"{tmp_path / 'junk.safetensors'}:0.5"
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert (
        lines[-2].startswith("error: ")
        and "not a valid safetensors file" in lines[-2]
        and lines[-1].startswith("hint: ")
    )


def test_two_processes_applying_one_stack_at_once(store, tmp_path):
    import os
    import subprocess
    import sys

    np.save(tmp_path / "x.npy", X)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enginefarm.cli",
                "run",
                "net/body",
                "--input",
                f"x={tmp_path / 'x.npy'}",
                "--output",
                str(tmp_path / f"c{i}.npz"),
                "--precision",
                "fp32",
                "--target",
                "openvino:cpu",
                "--lora",
                f"{store / 'a_kohya.safetensors'}:0.3",
            ],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
    assert np.array_equal(np.load(tmp_path / "c0.npz")["y"], np.load(tmp_path / "c1.npz")["y"])
    stacks = [c for c in DeviceCache(tmp_path / "home").entries() if "stack" in c.manifest.options]
    assert not stacks and not list(
        (tmp_path / "home" / "build" / "stacks").glob("*")
    )  # applied in memory: nothing cached


def test_compiled_on_device_then_stacked_when_nothing_is_stored(farm, tmp_path, monkeypatch):
    (tmp_path / "empty-store").mkdir()
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "empty-store"))
    session = enginefarm.load(
        "net/body",
        precision="fp32",
        device="cpu",
        target="onnxruntime:cpu",
        recipe=farm / "recipe.toml",
        loras=[(farm / "b.safetensors", 0.4)],
    )
    assert "compiled on this device" in session.explain() and "weights: applied in memory at load" in session.explain()
    assert np.allclose(
        session.run({"x": X})["y"], reference(tmp_path, models.merged(BASE, [(LAYERS_B, 0.4)])), atol=1e-4
    )


def test_a_lora_given_in_the_command_lines_form_or_as_one_string_is_named(tmp_path):
    from enginefarm.errors import ConfigError
    from enginefarm.runner.custom import Stack

    lora = models.lora_file(tmp_path / "a.safetensors", {"m": (*models.lora_pair((4, 4), 2, 0), None)}, "peft")
    with pytest.raises(ConfigError, match="PATH:STRENGTH is the command line's form") as caught:
        Stack.parse(None, [f"{lora}:0.8"])
    assert caught.value.hint == f'loras=[("{lora}", 0.8)]'
    with pytest.raises(ConfigError, match="is one path, not a list of LoRAs"):
        Stack.parse(None, str(lora))
    ((parsed, strength),) = Stack.parse(None, [str(lora)]).loras  # read once, here
    assert (parsed.path, strength, [layer.module for layer in parsed.layers]) == (lora, 1.0, ["m"])


# A LoRA that is a special file or a hostile header (issue 25, "crashes and hangs") --------------------------------
def test_a_lora_that_is_a_fifo_is_refused_at_once(store, tmp_path):
    """Before: the read blocked for good (here: until the watchdog opened the FIFO's other end, then a wrong reason)."""
    import os
    import threading
    import time

    fifo = tmp_path / "lora.safetensors"
    os.mkfifo(fifo)
    watchdog = threading.Timer(
        15, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    )  # unblocks a hung reader
    watchdog.start()
    started = time.monotonic()
    try:
        with pytest.raises(WeightsError, match=f"^{fifo}: not a regular file; refusing to read it$") as caught:
            run("onnxruntime:cpu", loras=[(fifo, 1.0)])
    finally:
        watchdog.cancel()
    assert time.monotonic() - started < 10 and caught.value.hint


def test_a_lora_header_nested_too_deep_is_one_line_and_keeps_the_cached_base(store, tmp_path):
    """Before: RecursionError, reported as "no artifact fits", and the good cached base artifact was evicted."""
    base = enginefarm.load("net/body", precision="fp32", device="cpu", target="onnxruntime:cpu")
    cache = DeviceCache(tmp_path / "home")
    assert cache.manifest(base.artifact.build_key) is not None
    header = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = tmp_path / "deep.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(WeightsError, match="not a valid safetensors file: header is nested deeper than") as caught:
        run("onnxruntime:cpu", loras=[(path, 1.0)])
    assert "\n" not in str(caught.value)
    assert cache.manifest(base.artifact.build_key) == base.artifact and cache.problems(base.artifact.build_key) == []
    again = enginefarm.load("net/body", precision="fp32", device="cpu", target="onnxruntime:cpu")
    assert np.array_equal(again.run({"x": X})["y"], base.run({"x": X})["y"])
