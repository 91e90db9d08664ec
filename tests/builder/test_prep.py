"""ONNX prep: checker, simplify (failure recorded, not fatal), fp16 with float32 I/O, external data confined."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from enginefarm.builder import prep
from enginefarm.errors import ModelError
from enginefarm.formats.onnx_io import load_header
from tests import models


def test_fp16_keeps_float32_io_and_stays_close(tiny_sd, tmp_path):
    prepared = prep.prepare(tiny_sd, "fp16", tmp_path / "work")
    model = onnx.load(str(prepared.path))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)
    latent = np.random.default_rng(0).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(str(tiny_sd)).run(None, {"latent": latent})[0]
    got = ort.InferenceSession(str(prepared.path)).run(None, {"latent": latent})[0]
    assert got.dtype == np.float32
    assert np.max(np.abs(got - ref)) < 0.05 * (ref.max() - ref.min())
    assert any("simplified" in note for note in prepared.notes)


def test_simplify_failure_keeps_the_model_and_records_why(tiny_sd, tmp_path, monkeypatch):
    import onnxsim

    def broken(*_args, **_kwargs):
        raise RuntimeError("simulated onnxsim crash")

    monkeypatch.setattr(onnxsim, "simplify", broken)
    prepared = prep.prepare(tiny_sd, "fp32", tmp_path / "work")
    assert any("not simplified: onnxsim failed (RuntimeError: simulated onnxsim crash)" in n for n in prepared.notes)
    assert len(onnx.load(str(prepared.path)).graph.node) == len(onnx.load(str(tiny_sd)).graph.node)


def test_prep_version_is_in_the_toolchain():
    assert prep.prep_versions("fp32")["prep"] == prep.PREP_VERSION
    assert "fp16_converter" in prep.prep_versions("fp16")


def test_the_onnxsim_version_in_build_keys_is_read_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys; from enginefarm.builder.prep import prep_versions; v = prep_versions('fp16')['onnxsim']; "
        "print(v, 'torch' in sys.modules, 'onnxsim' in sys.modules)"
    )
    version, torch_loaded, onnxsim_loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    import onnxsim  # the package's own answer, so build keys stay what they were

    assert version == onnxsim.__version__
    assert (torch_loaded, onnxsim_loaded) == ("False", "False")


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin"])
def test_external_data_leaving_the_folder_is_refused(tmp_path, location):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 256)
    path = models.external_data(tmp_path / "model" / "m.onnx", location)
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_header(path)


def test_external_data_inside_the_folder_is_fine(tmp_path):
    path = models.external_data(tmp_path / "model" / "m.onnx", "weights.bin")
    (tmp_path / "model" / "weights.bin").write_bytes(np.eye(8, dtype=np.float32).tobytes())
    load_header(path)
    prepared = prep.prepare(path, "fp32", tmp_path / "work")
    out = ort.InferenceSession(str(prepared.path)).run(None, {"x": np.arange(8, dtype=np.float32)[None]})[0]
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32)[None])


def test_symlinked_external_data_escaping_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 256)
    path = models.external_data(tmp_path / "model" / "m.onnx", "weights.bin")
    (tmp_path / "model" / "weights.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_header(path)


def test_corrupt_onnx_is_a_model_error(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x12\x34 definitely not a model")
    with pytest.raises(ModelError, match="not a valid ONNX file"):
        load_header(path)


def test_fp16_with_a_shared_float_only_constant_is_valid(tmp_path):
    """onnxsim merges Resize scales into one constant; the fp16 converter then emits identical Casts."""
    source = models.shared_resize_scales(tmp_path / "m.onnx")
    prepared = prep.prepare(source, "fp16", tmp_path / "work")
    onnx.checker.check_model(str(prepared.path))
    names = [n.name for n in onnx.load(str(prepared.path)).graph.node if n.name]
    assert len(names) == len(set(names))
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    ref = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(prepared.path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, atol=1e-2)


def test_safe_fp16_keeps_quantize_islands_and_integer_paths_fp32(tmp_path):
    """A dynamically quantized model (as onnxruntime.quantization writes them): float16 fed into
    DynamicQuantizeLinear is an invalid graph, and an int32 accumulator cast to fp16 saturates at 65504."""
    source = models.dynamic_quantized(tmp_path / "q.onnx")
    prepared = prep.prepare(source, "fp16", tmp_path / "work")
    model = onnx.load(str(prepared.path))
    by_output = {o: n for n in model.graph.node for o in n.output}
    quantize = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    feeding = by_output.get(quantize.input[0])
    assert feeding is None or not (feeding.op_type == "Cast" and feeding.attribute[0].i == onnx.TensorProto.FLOAT16)
    cast = next(
        n
        for n in model.graph.node
        if n.op_type == "Cast" and by_output.get(n.input[0]) and by_output[n.input[0]].op_type == "ConvInteger"
    )
    assert cast.attribute[0].i == onnx.TensorProto.FLOAT  # the accumulator becomes fp32, not fp16
    readers = [n for n in model.graph.node if cast.output[0] in n.input]
    assert [n.op_type for n in readers] == ["Mul"], "no fp16 round trip between the accumulator and its scale"
    assert any("nodes kept fp32" in note for note in prepared.notes)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 8, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(prepared.path)).run(None, {"x": x})[0]
    assert np.isfinite(got).all() and np.max(np.abs(got - want)) < 0.01 * np.max(np.abs(want))


def test_a_recipe_keeps_named_ops_fp32(tmp_path):
    source = models.big_intermediate(tmp_path / "big.onnx")
    plain = onnx.load(str(prep.prepare(source, "fp16", tmp_path / "plain").path))
    kept = onnx.load(str(prep.prepare(source, "fp16", tmp_path / "kept", ("MatMul",)).path))
    weight_type = lambda m: next(i.data_type for i in m.graph.initializer if i.dims == [64, 16])  # noqa: E731
    assert weight_type(plain) == onnx.TensorProto.FLOAT16 and weight_type(kept) == onnx.TensorProto.FLOAT


def test_exclude_drops_one_precision_for_one_target_and_keep_goes_into_the_key(write_recipe, tmp_path):
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe

    models.linear(tmp_path / "models" / "linear.onnx")
    text = """
[model]
name = "lin"
version = "1"
[defaults]
precisions = ["fp32", "fp16"]
targets = ["onnxruntime:cpu", "openvino:cpu"]
exclude = [{ target = "onnxruntime:cpu", precision = "fp16" }]
[components.c]
source = "models/linear.onnx"
KEEP
[components.c.profiles.default]
batch = [1, 2, 4]
"""
    jobs = expand(load_recipe(write_recipe(text.replace("KEEP", ""))), tmp_path / "dl")
    assert sorted((str(j.target), j.precision) for j in jobs) == [
        ("onnxruntime:cpu", "fp32"),
        ("openvino:cpu", "fp16"),
        ("openvino:cpu", "fp32"),
    ]
    keyed = {(str(j.target), j.precision): j.key(j.toolchain()) for j in jobs}
    kept = expand(load_recipe(write_recipe(text.replace("KEEP", 'fp16_keep_fp32 = ["MatMul"]'))), tmp_path / "dl")
    # OpenVINO converts from the fp32 ONNX itself and keeps the list in its fp16 IR (openvino_precise): that one
    # rebuilds, the fp32 jobs do not
    rekeyed = {(str(j.target), j.precision): j.key(j.toolchain()) for j in kept}
    assert {k for k in keyed if keyed[k] != rekeyed[k]} == {("openvino:cpu", "fp16")}
    text = text.replace(
        'exclude = [{ target = "onnxruntime:cpu", precision = "fp16" }]', 'exclude = [{ target = "openvino" }]'
    )
    fp16 = [
        j for j in expand(load_recipe(write_recipe(text.replace("KEEP", ""))), tmp_path / "dl") if j.precision == "fp16"
    ]
    fp16_kept = [
        j
        for j in expand(load_recipe(write_recipe(text.replace("KEEP", 'fp16_keep_fp32 = ["MatMul"]'))), tmp_path / "dl")
        if j.precision == "fp16"
    ]
    assert [str(j.target) for j in fp16] == ["onnxruntime:cpu"]
    assert fp16[0].key(fp16[0].toolchain()) != fp16_kept[0].key(fp16_kept[0].toolchain())


def test_each_source_is_prepared_once(tiny_sd, tmp_path, monkeypatch):
    """fp16 is made from the cached fp32 prep: onnxsim runs once per source, whatever the precisions."""
    import onnxsim

    calls = []
    real = onnxsim.simplify
    monkeypatch.setattr(onnxsim, "simplify", lambda *a, **k: calls.append(a) or real(*a, **k))
    fp32 = prep.prepare(tiny_sd, "fp32", tmp_path / "work")
    inode = fp32.path.stat().st_ino
    fp16 = prep.prepare(tiny_sd, "fp16", tmp_path / "work")
    again = prep.prepare(tiny_sd, "fp32", tmp_path / "work")
    assert len(calls) == 1
    assert again.path.stat().st_ino == inode and fp16.path.parent == fp32.path.parent
    assert fp16.notes[: len(fp32.notes)] == fp32.notes


def test_a_prep_killed_while_it_wrote_leaves_nothing_the_next_one_keeps(tiny_sd, tmp_path):
    """A prep killed mid-write (kill -9, a runner's timeout) leaves its staging folder, a model's size; the next prep
    of that precision removes it and builds. Met at real size: T5-XXL's 17 GB staging stayed beside the new prep."""
    import subprocess
    import sys

    work = tmp_path / "work"
    killed = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from enginefarm.builder import prep\n"
        "def half_written(out):\n"
        "    Path(out).with_name(Path(out).name + '.data').write_bytes(os.urandom(1 << 20))\n"
        "    os._exit(9)\n"
        "prep._once(Path(sys.argv[1]), 'fp32', half_written)\n"
    )
    assert subprocess.run([sys.executable, "-c", killed, str(work)]).returncode == 9
    (left,) = [p for p in work.iterdir() if p.name.startswith(".staging-fp32")]
    assert (left / "prepared-fp32.onnx.data").stat().st_size == 1 << 20
    prepared = prep.prepare(tiny_sd, "fp32", work)
    assert prepared.path.is_file() and not left.exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".staging")]


def test_a_failed_prep_is_remembered_not_retried(tmp_path, monkeypatch):
    source = models.failing_checker(tmp_path / "bad.onnx")
    with pytest.raises(ModelError, match="fails the ONNX checker") as first:
        prep.prepare(source, "fp16", tmp_path / "work")
    assert (tmp_path / "work" / "prepared-fp32.failed.json").is_file()
    checked = []
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: checked.append(a))
    with pytest.raises(ModelError) as second:
        prep.prepare(source, "fp32", tmp_path / "work")
    assert str(second.value) == str(first.value) and second.value.hint == first.value.hint
    assert checked == []  # answered from the remembered failure


def test_fp16_of_external_data_converts_one_tensor_at_a_time(tmp_path, monkeypatch):
    """Weights in external data stay external: the converter retypes them, prep converts their values. (onnxsim
    would make a model this small inline; with onnxsim failing, the model keeps its layout. The >2 GB test in
    test_large_model.py covers the same path through onnxsim.)"""
    import onnxsim

    monkeypatch.setattr(onnxsim, "simplify", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("simulated")))
    path = models.external_data(tmp_path / "model" / "m.onnx", "weights.bin")
    weights = np.random.default_rng(3).normal(0, 1, (8, 8)).astype(np.float32)
    weights[0, 0] = 1e6  # beyond float16: clamped to its largest finite value, as the converter clamps inline weights
    (tmp_path / "model" / "weights.bin").write_bytes(weights.tobytes())
    prepared = prep.prepare(path, "fp16", tmp_path / "work")
    header = onnx.load(str(prepared.path), load_external_data=False)
    (table,) = header.graph.initializer
    assert table.data_type == onnx.TensorProto.FLOAT16 and table.data_location == onnx.TensorProto.EXTERNAL
    stored = np.fromfile(prepared.path.with_name(prepared.path.name + ".data"), dtype=np.float16)
    expected = weights.copy()
    expected[0, 0] = 65504.0
    np.testing.assert_array_equal(stored, expected.astype(np.float16).ravel())
    x = np.arange(8, dtype=np.float32)[None]
    got = ort.InferenceSession(str(prepared.path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ expected.astype(np.float16).astype(np.float32), rtol=2e-3)


def test_a_kept_scope_keeps_its_nodes_and_the_constants_only_they_read():
    """A sinusoidal embedding of t·1000: sin(t · freqs) with freqs a Constant. Kept by its scope, the Constant stays
    fp32 too (rounded to fp16 it moves sin's argument by up to a radian), and the result is exact to fp32."""
    from onnx import TensorProto, helper

    from enginefarm.formats.fp16_rules import fp16_blocked

    freqs = np.exp(-np.log(10000.0) * np.arange(8) / 8).astype(np.float32)
    nodes = [
        helper.make_node(
            "Constant", [], ["freqs"], name="/model/time_proj/Constant", value=onnx.numpy_helper.from_array(freqs)
        ),
        helper.make_node("Mul", ["t", "freqs"], ["args"], name="/model/time_proj/Mul"),
        helper.make_node("Sin", ["args"], ["emb"], name="/model/time_proj/Sin"),
        helper.make_node("Add", ["emb", "emb"], ["y"], name="/model/linear/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, kept = fp16_blocked(model, ("/model/time_proj/",))
    assert kept == {"/model/time_proj/Constant", "/model/time_proj/Mul", "/model/time_proj/Sin"}
    t = np.array([[873.4]], np.float32)
    exact = 2 * np.sin(t * freqs)

    def run(m):
        return ort.InferenceSession(m.SerializeToString()).run(None, {"t": t})[0]

    assert (
        np.abs(
            run(prep._to_fp16(onnx.load_from_string(model.SerializeToString()), [], ("/model/time_proj/",))) - exact
        ).max()
        < 2e-3
    )
    assert np.abs(run(prep._to_fp16(onnx.load_from_string(model.SerializeToString()), [], ())) - exact).max() > 0.1


def test_an_input_path_keeps_the_arithmetic_before_the_first_weights(write_recipe, tmp_path):
    """`input:t`: what a timestep goes through before a layer with weights (Flux: t / 1000, · 1000 in the model, then
    its sinusoidal embedding), with the Constants only those nodes read; not the MatMul after it. OpenVINO keeps
    them (tests/backends/test_openvino.py); the ONNX fp16 conversion leaves input paths alone (ONNX Runtime's CPU
    kernels compute that arithmetic through fp32 casts already). The planner takes an input path for an input the
    model has, and names a wrong one."""
    from onnx import TensorProto, helper

    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.errors import RecipeError
    from enginefarm.formats.fp16_rules import fp16_blocked, kept_nodes

    freqs = np.exp(-np.log(10000.0) * np.arange(8) / 8).astype(np.float32)
    weight = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)

    def constant(name, value):
        return helper.make_node("Constant", [], [name], name=name, value=onnx.numpy_helper.from_array(value))

    nodes = [
        constant("thousand", np.array(1000.0, np.float32)),
        constant("freqs", freqs),
        constant("weight", weight),
        helper.make_node("Div", ["t", "thousand"], ["scaled"], name="/Div"),
        helper.make_node("Mul", ["scaled", "thousand"], ["back"], name="/model/Mul"),
        helper.make_node("Mul", ["back", "freqs"], ["args"], name="/model/time_proj/Mul"),
        helper.make_node("Sin", ["args"], ["emb"], name="/model/time_proj/Sin"),
        helper.make_node("MatMul", ["emb", "weight"], ["y"], name="/model/linear/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, kept = kept_nodes(model, ("input:t",))
    assert kept == {"/Div", "/model/Mul", "/model/time_proj/Mul", "/model/time_proj/Sin", "thousand", "freqs"}
    assert fp16_blocked(model, ("input:t",))[1] == set()

    onnx.save(model, str(tmp_path / "t.onnx"))
    text = (
        '[model]\nname = "t"\nversion = "1"\n[components.c]\nsource = "t.onnx"\nprecisions = ["fp16"]\ntargets = '
        '["onnxruntime:cpu"]\nKEEP\n'
    )
    jobs = expand(load_recipe(write_recipe(text.replace("KEEP", 'fp16_keep_fp32 = ["input:t"]'))), tmp_path / "dl")
    assert jobs[0].fp16_keep == ("input:t",)
    with pytest.raises(RecipeError, match="no op or node named 'input:time'"):
        expand(load_recipe(write_recipe(text.replace("KEEP", 'fp16_keep_fp32 = ["input:time"]'))), tmp_path / "dl")


def test_a_round_trip_cast_that_an_if_branch_reads_is_kept():
    """The converter's fp16 → fp32 round trip `h` → `back`, where the If's then-branch reads `h` and its else-branch
    reads `back` from the outer scope (issue 25, review). Before: both casts were dropped, the branches read names no
    longer defined, and the model that was valid before the pass failed onnx.checker after it."""
    from onnx import TensorProto, helper

    from enginefarm.formats.fp16_rules import elide_round_trips

    then = helper.make_graph(
        [helper.make_node("Cast", ["h"], ["t"], to=TensorProto.FLOAT)],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["back"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["back"], to=TensorProto.FLOAT),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Cast", ["x"], ["h2"], to=TensorProto.FLOAT16),  # a round trip no branch reads: dropped
        helper.make_node("Cast", ["h2"], ["back2"], to=TensorProto.FLOAT),
        helper.make_node("Neg", ["back2"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    x = np.array([1.0001, -3.5], np.float32)
    run = lambda m, c: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {"x": x, "cond": np.array(c)}
    )[0]
    before = [run(model, c) for c in (True, False)]
    assert elide_round_trips(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    for c, want in zip((True, False), before, strict=True):
        np.testing.assert_array_equal(run(model, c), want)
    assert [n.op_type for n in model.graph.node] == ["Cast", "Cast", "If", "Neg"]


def _plain_clip_text_encoder(path: Path) -> Path:
    """transformers' CLIP text encoder traced as it is, input_ids only: its causal mask is built from constants that
    onnxsim tries and fails to fold (the exporter's own encoder takes an attention mask, which it does not)."""
    import warnings

    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=1000, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4
    )
    model = CLIPTextModel(config).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python branches
        torch.onnx.export(
            model,
            (torch.zeros((1, 77), dtype=torch.int64),),
            path,
            input_names=["input_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    return path


def test_onnxsim_warnings_are_counted_not_printed(tmp_path, capfd):
    """onnxsim prints a WARNING per op it cannot fold (a CLIP text encoder's causal mask: hundreds at real size) to the
    process's stdout; the build's output stays readable and the prep notes count them."""
    pytest.importorskip("transformers")
    source = _plain_clip_text_encoder(tmp_path / "text_encoder.onnx")
    capfd.readouterr()
    prepared = prep.prepare(source, "fp32", tmp_path / "work")
    printed = capfd.readouterr()
    assert "WARNING" not in printed.out + printed.err
    counted = [n for n in prepared.notes if n.startswith("onnxsim left")]
    assert counted and int(counted[0].split()[2]) > 0, prepared.notes
    print("after the simplification, the process prints again")
    assert "prints again" in capfd.readouterr().out
