"""Memory: honest per-process peaks, per-stage reports, needs known before a job runs, and an executor that keeps
jobs within the machine's memory."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from enginefarm.builder import memory
from enginefarm.builder.executor import run_jobs
from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.hardware import rss

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-process peaks (VmHWM, clear_refs) are Linux's"
)

# A parent that touches 400 MB, frees it, then starts a child which reports its own peak both ways.
_PARENT = """
import json, subprocess, sys
block = bytearray(400 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
del block
child = (
    "import json, resource; from enginefarm.hardware import rss; "
    "print(json.dumps([rss.peak_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))"
)
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
"""


@linux_only
def test_a_child_reports_its_own_peak_not_its_parents():
    out = subprocess.run([sys.executable, "-c", _PARENT], capture_output=True, text=True, check=True).stdout
    own, ru_maxrss = json.loads(out.strip().splitlines()[-1])
    assert own < 200 << 20  # a bare interpreter with numpy-free imports: well under the parent's 400 MB
    assert own <= ru_maxrss  # ru_maxrss can only say more (here it carries the parent's 400 MB over, see rss.py)


@linux_only
def test_the_peak_resets_per_stage():
    from enginefarm.builder.stages import Stages

    stages = Stages()
    with stages.stage("big"):
        block = bytearray(300 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        del block
        rss.give_back_memory()
    with stages.stage("small"):
        pass
    big, small = (r["peak_rss_mb"] for r in stages.records)
    assert big - small > 250  # the second stage does not carry the first one's 300 MB
    assert stages.peak_rss_mb == big


def test_need_is_a_bound_on_weights_with_a_floor():
    assert memory.need_bytes(4 << 30) == 10 << 30  # 2.5x for a model of GBs
    assert memory.need_bytes(1 << 20) == (1 << 20) + memory.BASE  # the interpreter and SDKs for a small one
    assert memory.need_bytes(1 << 20, host_ram_gb=32) == 32e9  # a recipe may ask for more, never less
    assert memory.need_bytes(4 << 30, backend="tensorrt-rtx") == 12 << 30  # NVIDIA's builders hold more (memory.py)
    for backend in ("", "openvino", "tensorrt-rtx"):  # fp16/bf16 jobs hold no fp32 copy of the artifact (memory.py)
        assert memory.need_bytes(4 << 30, backend=backend, precision="fp16") == 8 << 30
        assert memory.need_bytes(4 << 30, backend=backend, precision="bf16") == 8 << 30
    assert memory.need_bytes(1 << 20, precision="fp16") == (1 << 20) + memory.BASE


def test_plan_shows_each_jobs_memory_need(tiny_recipe, tiny_sd, cli):
    rows = json.loads(cli("plan", str(tiny_recipe()), "--format", "json", check=True).stdout)
    weights = tiny_sd.stat().st_size
    assert [r["memory_gb"] for r in rows] == [memory.gb(memory.need_bytes(weights))]
    assert "memory" in cli("plan", str(tiny_recipe()), check=True).stdout


def _starts_and_ends(events):
    order = []
    for job_id, kind, _ in events:
        if kind in ("start", "done"):
            order.append((kind, job_id))
    return order


def test_jobs_wait_until_their_memory_fits(tiny_recipe, tmp_path):
    """-j 2 with memory for one job at a time: the second job starts only once the first is done."""
    planned = plan([load_recipe(tiny_recipe(precisions=("fp32", "fp16")))], tmp_path / "dl")
    jobs = [p.job for p in planned]
    one = max(memory.job_need_bytes(j) for j in jobs)
    events: list = []
    results = run_jobs(
        jobs,
        str(tmp_path / "store"),
        tmp_path / "work",
        parallel=2,
        bench=False,
        memory=one,
        on_event=lambda *e: events.append(e),
    )
    assert [r.status for r in results] == ["built", "built"]
    first, second = jobs[0].id, jobs[1].id
    assert _starts_and_ends(events) == [("start", first), ("done", first), ("start", second), ("done", second)]
    waiting = [
        d
        for job_id, kind, d in events
        if job_id == second and kind == "step" and str(d).startswith("waiting for memory")
    ]
    assert len(waiting) == 1 and f"needs {memory.gb(one):g} GB" in waiting[0]


def test_jobs_that_fit_together_run_together(tiny_recipe, tmp_path):
    planned = plan([load_recipe(tiny_recipe(precisions=("fp32", "fp16")))], tmp_path / "dl")
    jobs = [p.job for p in planned]
    events: list = []
    run_jobs(
        jobs,
        str(tmp_path / "store"),
        tmp_path / "work",
        parallel=2,
        bench=False,
        memory=sum(memory.job_need_bytes(j) for j in jobs),
        on_event=lambda *e: events.append(e),
    )
    order = _starts_and_ends(events)
    assert [kind for kind, _ in order[:2]] == ["start", "start"]


def test_a_job_larger_than_the_budget_still_runs_alone(tiny_recipe, tmp_path):
    (job,) = [p.job for p in plan([load_recipe(tiny_recipe())], tmp_path / "dl")]
    (result,) = run_jobs([job], str(tmp_path / "store"), tmp_path / "work", bench=False, memory=1)
    assert result.status == "built"


def test_a_job_over_the_machines_whole_memory_is_refused_with_where_it_fits(tiny_recipe, tmp_path):
    """T5-XXL's fp16 job needs 38 GB (bench/real_sizes.py): on a 24 GB machine it would swap or be killed after its
    first stages. Without --memory it is not started, and plan and build say what it would take."""
    (planned,) = plan([load_recipe(tiny_recipe())], tmp_path / "dl")
    need = memory.job_need_bytes(planned.job)
    said = memory.too_big_here(need, total=need - 1)
    assert f"needs {memory.gb(need):g} GB" in said and "--runners" in said and "--memory" in said
    assert memory.too_big_here(need, total=need) == ""
    assert planned.status == "to build"  # a tiny job fits this machine
    import psutil

    weights = planned.job.weight_bytes
    huge = replace(planned.job, weight_bytes=psutil.virtual_memory().total)  # a model as large as the machine
    (result,) = run_jobs([huge], str(tmp_path / "store"), tmp_path / "work", bench=False)
    assert result.status == "failed" and "this machine has" in result.reason and "--runners" in result.reason
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("manifests/*.json"))
    assert replace(planned, job=huge).status.startswith("not here: needs")
    assert weights < psutil.virtual_memory().total


def test_build_reports_time_and_peak_memory_per_stage(tiny_recipe, tmp_path, cli):
    report = tmp_path / "report.json"
    cli("build", str(tiny_recipe(precisions=("fp32", "fp16"))), "--report", str(report), "-j", "2", check=True)
    rows = json.loads(report.read_text())
    for row in rows:
        stages = {s["stage"]: s for s in row["stages"]}
        assert list(stages) == ["prep", "compile", "reference", "validate", "benchmark", "publish"]
        assert all(s["seconds"] >= 0 and s["peak_rss_mb"] > 20 for s in stages.values())
        assert row["peak_rss_mb"] == max(s["peak_rss_mb"] for s in stages.values())
        assert stages["benchmark"]["subprocess_peak_rss_mb"] > 20  # the benchmark process measured itself
    # The reference outputs are computed once (by whichever job came first) and read back by the other.
    computed = [row for row in rows if "subprocess_peak_rss_mb" in {s["stage"]: s for s in row["stages"]}["reference"]]
    assert len(computed) == 1


@pytest.mark.parametrize("stored", ["float16", "bfloat16"])
def test_a_half_precision_source_needs_what_its_fp32_weights_would(tmp_path, stored):
    """fp16 and bf16 weights count at 4 bytes an element: the same model saved at fp32 and at half precision
    needs the same memory (the reference and the CPU backends work on fp32 copies)."""
    import numpy as np
    import onnx
    import onnx.helper as h
    import onnx.numpy_helper as nh

    def model(dtype: str, name: str):
        values = np.random.default_rng(0).standard_normal((256, 1024)).astype("float32")
        weight = nh.from_array(values, "w")
        if dtype != "float32":
            weight = h.make_tensor(
                "w",
                onnx.TensorProto.BFLOAT16 if dtype == "bfloat16" else onnx.TensorProto.FLOAT16,
                values.shape,
                np.zeros(values.size, np.uint16).tobytes(),
                raw=True,
            )
        elem = {
            "float32": onnx.TensorProto.FLOAT,
            "float16": onnx.TensorProto.FLOAT16,
            "bfloat16": onnx.TensorProto.BFLOAT16,
        }[dtype]
        graph = h.make_graph(
            [h.make_node("MatMul", ["x", "w"], ["y"])],
            "g",
            [h.make_tensor_value_info("x", elem, [1, 256])],
            [h.make_tensor_value_info("y", elem, [1, 1024])],
            [weight],
        )
        path = tmp_path / name / "model.onnx"
        path.parent.mkdir()
        onnx.save(
            h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10),
            str(path),
            save_as_external_data=True,
            location="model.onnx.data",
            size_threshold=0,
        )
        return path

    full, half = memory.source_weight_bytes(model("float32", "fp32")), memory.source_weight_bytes(model(stored, "half"))
    assert full >= 256 * 1024 * 4
    assert abs(half - full) < 4096  # the graphs' own bytes differ by a few hundred
    assert (
        model(stored, "half2").parent / "model.onnx.data"
    ).stat().st_size == 256 * 1024 * 2  # stored at half the size


def test_a_vae_needs_memory_for_its_largest_image_not_its_weights():
    """Measured (docs/large-models.md): SDXL's VAE decoder job peaked at 6.9 GB at 1024x1024 and SD 1.5's at 2.4 GB
    at 512x512, each with 0.2 GB of weights. A ControlNet's image input and a UNet's latents do not count."""
    from enginefarm.formats.onnx_io import TensorInfo

    latent = (TensorInfo("latent_sample", "float32", ("batch", 4, "height", "width")),)
    image = (TensorInfo("sample", "float32", ("batch", 3, "image_height", "image_width")),)

    def megapixels(inputs, outputs, largest):
        profile = {t.name: {"min": largest, "opt": largest, "max": largest} for t in inputs}
        return memory.image_megapixels(inputs, outputs, profile)

    sdxl_decoder = memory.image_need_gb(megapixels(latent, image, [1, 4, 128, 128]))
    sd15_decoder = memory.image_need_gb(megapixels(latent, image, [1, 4, 64, 64]))
    assert 6.9 <= sdxl_decoder <= 1.3 * 6.9 and 2.4 <= sd15_decoder <= 1.3 * 2.4
    assert megapixels(image, latent, [2, 3, 1024, 1024]) == 2 * 1024 * 1024 / 1e6  # an encoder, at batch 2
    controlnet = (latent[0], TensorInfo("controlnet_cond", "float32", ("batch", 3, "image_height", "image_width")))
    assert megapixels(controlnet, latent, [1, 3, 1024, 1024]) == 0
    assert megapixels(latent, latent, [1, 4, 128, 128]) == 0
    assert memory.image_need_gb(0) == 0


def _transformer_profile(batch: int, latent: int, context: int):
    from enginefarm.formats.onnx_io import TensorInfo

    inputs = (
        TensorInfo("hidden_states", "float32", ("batch", 16, "height", "width")),
        TensorInfo("timestep", "float32", ("batch",)),
        TensorInfo("encoder_hidden_states", "float32", ("batch", "context_tokens", 4096)),
        TensorInfo("pooled_projections", "float32", ("batch", 2048)),
    )
    largest = {
        "hidden_states": [batch, 16, latent, latent],
        "timestep": [batch],
        "encoder_hidden_states": [batch, context, 4096],
        "pooled_projections": [batch, 2048],
    }
    return inputs, {n: {"min": s, "opt": s, "max": s} for n, s in largest.items()}


def test_a_transformers_need_adds_its_attention_at_the_largest_profile():
    """Measured on SD3.5 Medium's transformer (24 heads, 9.0 GB of fp32 weights, batch 2, 589 text tokens;
    docs/large-models.md): its fp16 job peaked at 15.0 GB with a profile up to 768 px, when the fp32 reference still
    ran the whole batch at once (its run at 1024 px passed 21.8 GB before it was stopped; it now runs an item at a
    time). The need covers the first; at 1024 px the attention, not the weights (18 GB), decides it."""
    weights = int(9.0e9)
    needs = {}
    for pixels in (768, 1024):
        inputs, profile = _transformer_profile(2, pixels // 8, 589)
        batch, tokens = memory.attention_tokens(inputs, profile)
        assert (batch, tokens) == (2, (pixels // 16) ** 2 + 589)
        needs[pixels] = memory.need_bytes(weights, 0, "onnxruntime", "fp16", memory.attention_bytes(24, batch, tokens))
    assert needs[768] >= 15.0e9 and needs[1024] > memory.need_bytes(weights, 0, "onnxruntime", "fp16")
    assert needs[768] == memory.need_bytes(weights, 0, "onnxruntime", "fp16")  # the weights' rule still decides there
    # a UNet's latents and a text encoder's sequence alone have no image tokens: nothing added
    inputs, profile = _transformer_profile(2, 128, 77)
    assert memory.attention_tokens(inputs[2:], profile) == (0, 0)
    assert memory.attention_bytes(0, 2, 4685) == 0


def test_plan_counts_the_attention_heads_a_recipe_names(tmp_path, tiny_recipe):
    """`[components.X.resources] attention_heads` raises the job's need by the attention at its profile's max (the
    tiny decoder's 4-D latent input as the image tokens); a value that is not a count is a one-line recipe error."""
    from enginefarm.errors import RecipeError

    path = tiny_recipe()
    text = path.read_text()
    (plain,) = plan([load_recipe(path)], tmp_path / "dl")
    path.write_text(text + "\n[components.decoder.resources]\nattention_heads = 24\n")
    (counted,) = plan([load_recipe(path)], tmp_path / "dl")
    assert counted.job.resources.attention_heads == 24
    tokens = (32 // memory.PATCH) ** 2  # the profile's max: 32 x 32 latent pixels, batch 2
    added = memory.job_need_bytes(counted.job) - memory.job_need_bytes(plain.job)
    assert added == memory.attention_bytes(24, 2, tokens) > 0
    path.write_text(text + '\n[components.decoder.resources]\nattention_heads = "many"\n')
    with pytest.raises(RecipeError, match="attention_heads"):
        load_recipe(path)


def _unet_profile(batch: int, latent: int):
    from enginefarm.formats.onnx_io import TensorInfo

    inputs = (
        TensorInfo("sample", "float32", ("batch", 4, "height", "width")),
        TensorInfo("timestep", "float32", ("batch",)),
        TensorInfo("encoder_hidden_states", "float32", ("batch", 77, 768)),
    )
    largest = {"sample": [batch, 4, latent, latent], "timestep": [batch], "encoder_hidden_states": [batch, 77, 768]}
    return inputs, {n: {"min": s, "opt": s, "max": s} for n, s in largest.items()}


_SD15_UNET = {"down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"], "attention_head_dim": 8}
_SDXL_UNET = {
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "attention_head_dim": [5, 10, 20],
}


def test_a_unets_need_counts_its_attention_at_the_full_latent_resolution():
    """The issue's case: a real-layout SD 1.5 exported with the old default profile (batch 4, 1024 px) holds 34 GB in
    one score matrix of its first level's self-attention, where the plan said 3.3 GB. The heads and the level come
    from the UNet's config (SD 1.x: every latent pixel a token, 8 heads; SDXL: every 2x2, 10 heads); the default
    profile now fits a 24 GB machine with SD 1.5's 3.44 GB of fp32 weights."""
    from enginefarm.export.resources import unet_attention
    from enginefarm.families import FAMILIES, profile_dims

    assert unet_attention(_SD15_UNET) == (8, 1) and unet_attention(_SDXL_UNET) == (10, 2)
    assert unet_attention({}) == (8, 1)  # diffusers' defaults are SD 1.x's
    assert unet_attention({"down_block_types": ["DownBlock2D"] * 2, "mid_block_type": "UNetMidBlock2D"}) == (0, 0)
    inputs, profile = _unet_profile(4, 128)
    batch, tokens = memory.attention_tokens(inputs, profile, 1)
    assert (batch, tokens) == (4, 128 * 128)
    assert memory.attention_bytes(8, batch, tokens) >= batch * 8 * tokens**2 * 4 > 34e9  # at least the batch's one
    assert memory.attention_tokens(inputs, profile, 2) == (4, 64 * 64)  # SDXL's first attention is a level down
    sd1 = FAMILIES["sd1"]
    dims = profile_dims(sd1, sd1.component("unet"), sd1.sizes)
    inputs, profile = _unet_profile(dims["batch"][2], dims["height"][2])
    attention = memory.attention_bytes(8, *memory.attention_tokens(inputs, profile, 1))
    need = memory.need_bytes(int(3.44e9), 0, "onnxruntime", "fp32", attention)
    assert need > memory.need_bytes(int(3.44e9)) and need <= 24e9


def test_a_vaes_need_comes_from_its_own_widths():
    """A VAE's need is read from its config (block_out_channels, its mid-block's attention), not fitted to the real
    SD VAE: the tiny SDXL exported with the defaults was refused as "needs 29.9 GB" (6 GB per megapixel x the
    profile's batch). Real VAEs stay above their measured peaks: SDXL's decoder 6.9 GB at 1024 px, SD 1.5's 2.4 GB at
    512 px (0.2 GB of weights each)."""
    from enginefarm.export.resources import vae_activation_channels

    real, tiny = (vae_activation_channels({"block_out_channels": c}) for c in ([128, 256, 512, 512], [8, 16, 16, 16]))
    assert (real, tiny) == (256, 16)

    def decoder_need(channels: int, pixels: int) -> int:
        latent = pixels // memory.LATENT_SCALE
        attention = memory.attention_bytes(1, 1, latent * latent)  # the mid-block: one head over the latent pixels
        activations = memory.image_activation_bytes(channels, pixels * pixels / 1e6)
        return memory.need_bytes(int(0.2e9), 0, "onnxruntime", "fp32", attention + activations)

    assert 6.9e9 <= decoder_need(real, 1024) <= 1.5 * 6.9e9 and decoder_need(real, 512) >= 2.4e9
    assert decoder_need(tiny, 1024) < 8e9 < 29.9e9


_SCORES_RECIPE = """
[model]
name = "scores"
version = "1"

[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu"]

[components.scores]
source = "models/scores.onnx"

[components.scores.profiles.default]
batch = [1, 1, 1]
tokens = [4, 8, 300000]
"""


def test_a_job_out_of_memory_names_the_size_the_profile_and_the_options(tmp_path, write_recipe, cli):
    """An attention-like score matrix (x @ xᵀ) at the profile's max asks ONNX Runtime for 360 GB at once; the
    build says so with that size, names the profile as the cause and the options that shrink it, and does not
    blame enginefarm (its reference run's error was cut at `AllocateRawInternal(size` and its hint said "a bug in
    enginefarm's reference run")."""
    import onnx
    import onnx.helper as h

    graph = h.make_graph(
        [
            h.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
            h.make_node("MatMul", ["x", "xt"], ["scores"]),
            h.make_node("ReduceSum", ["scores", "axes"], ["y"], keepdims=0),
        ],
        "scores",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "tokens", 8])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch"])],
        [h.make_tensor("axes", onnx.TensorProto.INT64, [2], [1, 2])],
    )
    (tmp_path / "models").mkdir()
    onnx.save(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=9), tmp_path / "models/scores.onnx"
    )
    report = tmp_path / "report.json"
    proc = cli(
        "build",
        str(write_recipe(_SCORES_RECIPE)),
        "--store",
        str(tmp_path / "store"),
        "--no-bench",
        "--report",
        str(report),
    )
    assert proc.returncode != 0
    (row,) = json.loads(report.read_text())
    said = f"{row['reason']} {proc.stdout} {proc.stderr}"
    assert "asked for 360 GB at once" in said and "x [1, 300000, 8]" in said, said
    assert "profile 'default' is too large" in said and "enginefarm export --batch" in said, said
    assert "bug in enginefarm" not in said


# The fp32 reference runs a build's validation cases in one ONNX Runtime session, smallest first. A self-attention
# graph (scores [b, n, n]) and the cases min, opt, max: the largest case's score matrices are 2 x 4096² fp32 (134 MB).
_REFERENCE_PEAK = """
import json, sys
import numpy as np, onnx
from onnx import TensorProto, helper
from enginefarm.builder.validate import reference_outputs
from enginefarm.hardware import rss

path = sys.argv[1]
x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", "n", 8]) for name in ("x", "y"))
nodes = [
    helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
    helper.make_node("MatMul", ["x", "xt"], ["scores"]),
    helper.make_node("Softmax", ["scores"], ["weights"], axis=-1),
    helper.make_node("MatMul", ["weights", "x"], ["y"]),
]
graph = helper.make_graph(nodes, "attention", [x], [y])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
sizes = {"all": [(1, 2048), (1, 4096), (2, 4096)], "one": [(2, 4096)], "item": [(1, 4096)]}[sys.argv[2]]
cases = [(f"{b}x{n}", {"x": np.random.default_rng(0).random((b, n, 8), dtype=np.float32)}) for b, n in sizes]
(reference,) = reference_outputs(__import__("pathlib").Path(path), cases[-1:])
import onnxruntime as ort
whole = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], cases[-1][1])[0]
assert reference.outputs["y"].shape == whole.shape and np.allclose(reference.outputs["y"], whole, rtol=1e-5, atol=1e-6)
reference_outputs(__import__("pathlib").Path(path), cases)
print(json.dumps(rss.peak_bytes()))
"""


@linux_only
def test_the_reference_run_holds_no_more_after_smaller_cases_than_the_largest_alone(tmp_path):
    def peak(which: str) -> int:
        args = [sys.executable, "-c", _REFERENCE_PEAK, str(tmp_path / f"{which}.onnx"), which]
        return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()[-1])

    largest_matrix = 2 * 4096 * 4096 * 4
    # ONNX Runtime's arena, kept from run to run, held 0.6 of a largest matrix more (80 MB; a real-layout SD 1.5 UNet's
    # reference at 768 px: 16.5 GB) until each run gave its free chunks back
    assert peak("all") - peak("one") < 0.3 * largest_matrix


@linux_only
def test_the_reference_runs_a_batch_an_item_at_a_time(tmp_path):
    """Its unfused attention then holds one item's score matrices, not the batch's; the outputs are the batch's."""

    def peak(which: str) -> int:
        args = [sys.executable, "-c", _REFERENCE_PEAK, str(tmp_path / f"{which}.onnx"), which]
        return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()[-1])

    item_matrix = 4096 * 4096 * 4
    assert peak("one") - peak("item") < 0.3 * item_matrix  # batch 2 held as much as batch 1, not 2 matrices more


def test_a_graph_without_a_shared_batch_axis_runs_whole(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from enginefarm.builder.validate import batch_axis_everywhere

    def session(input_dims, output_dims):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, input_dims)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_dims)
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    assert batch_axis_everywhere(session(["batch", 4], ["batch", 4]), ["y"])
    assert not batch_axis_everywhere(session([2, 4], [2, 4]), ["y"])  # a fixed leading size: not a batch
    assert not batch_axis_everywhere(session(["batch", 4], ["rows", 4]), ["y"])
