"""The proof of a bundle (enginefarm/bundle.py): a fresh `python -I -S` whose `sys.path` is the bundle folder and the
standard library only (no site-packages, no PYTHONPATH, no user site) imports enginefarm from the bundle, fetches an
artifact of the bundle's target from a store into an empty cache, verifies and loads it, and runs it on inputs it
draws from the artifact's manifest (the profile's opt shapes). This process then computes the same inputs with ONNX
Runtime and compares. Every module the fresh interpreter imported must come from the bundle or the standard library.

The artifact: `--model MODEL/COMPONENT` from `--store` (the app's own model; the reference is the store's
onnxruntime:cpu fp32 artifact of the same component and version, or where there is none the same artifact through this
environment's full install), or else a small built-in network (two convolutions over a dynamic image) that this process
builds for the target through the builder, which needs the `build` extra, and compares with ONNX Runtime on its ONNX.

A device class this machine cannot run (BundleSpec.runs_here False: an Intel GPU bundle on a farm machine) is proven
only as far as its files load: the backend's bundle_probe runs inside the bundle, and the result says that running on
the device was not proven."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enginefarm.cache import precision_table
from enginefarm.errors import ConfigError, EnginefarmError, ProofFailed

PROOF_MODEL = "bundle-proof/net"


def min_cosine(precision: str) -> float:
    """The validation gate's default for the artifact's precision (the precision table), against an fp32 reference;
    a precision this version does not know gets the loosest the table has."""
    row = precision_table.TABLE.get(precision)
    return row.min_cosine if row is not None else min(p.min_cosine for p in precision_table.TABLE.values())


PROOF_TIMEOUT_S = 600

# Runs as `python -I -S -B -c CHILD BUNDLE REQUEST.json`. -I: no PYTHONPATH, no user site, not the working directory;
# -S: no site-packages; -B: writes no byte code into the bundle, which stays as bundle.json lists it.
CHILD = r"""
import json, sys, sysconfig
bundle, request = sys.argv[1], json.loads(open(sys.argv[2]).read())
sys.path.insert(0, bundle)
result = {"sys_path": list(sys.path)}
if request["probe"]:
    from enginefarm.backends import get_backend
    result["probe"] = get_backend(request["backend"]).bundle_probe(request["device"])
else:
    import numpy as np
    import enginefarm
    session = enginefarm.load(request["model"], precision=request["precision"], device="cpu", target=request["target"])
    art = session.artifact
    rng = np.random.default_rng(0)
    feeds = {}
    for info in art.io.get("inputs", []):
        bounds = art.profile.get(info["name"])
        shape = bounds["opt"] if bounds else [d if isinstance(d, int) and d > 0 else 1 for d in info["shape"]]
        dtype = np.dtype(info["dtype"])
        feeds[info["name"]] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    outputs = session.run(feeds)
    np.savez(request["inputs"], **feeds)
    np.savez(request["outputs"], **outputs)
    result["artifact"] = {"build_key": art.build_key, "model_version": art.model_version, "precision": art.precision,
                          "target": art.target, "runs_in": session.compute_precision}
roots = (bundle, *{sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
files = {name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())}
result["outside"] = sorted(f"{name} ({f})" for name, f in files.items() if f and not f.startswith(roots))
result["from_bundle"] = sum(1 for f in files.values() if f and f.startswith(bundle))
print(json.dumps(result))
"""


@dataclass
class Proof:
    ran: bool  # an artifact ran from the bundle (False: a device class proven only as far as its files load)
    passed: bool
    line: str  # what to tell the user, one line
    modules_from_bundle: int = 0
    seconds: float = 0.0
    outputs: dict | None = None  # name -> {"cosine", "max_abs"} against the reference


def prove(
    bundle_dir: Path, target: str, *, model: str | None = None, store: str | None = None, precision: str | None = None
) -> Proof:
    from enginefarm.backends import get_backend
    from enginefarm.bundle import bundle_spec

    parsed, spec = bundle_spec(target)
    bundle_dir = Path(bundle_dir).absolute()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="enginefarm-bundle-proof-") as tmp:
        work = Path(tmp)
        request = {
            "backend": parsed.backend,
            "device": parsed.device,
            "target": str(parsed),
            "probe": not spec.runs_here,
            "precision": precision,
            "inputs": str(work / "inputs.npz"),
            "outputs": str(work / "outputs.npz"),
        }
        env = {"ENGINEFARM_HOME": str(work / "home"), "ENGINEFARM_MEASURE": "off"}
        if not spec.runs_here:
            result = _child(bundle_dir, request, env, work)
            return _probed(result, parsed, spec, get_backend(parsed.backend), time.perf_counter() - started)
        if model is None:
            store, model, onnx_path = _built_in_artifact(str(parsed), work), PROOF_MODEL, work / "model" / "net.onnx"
            precision = request["precision"] = precision_table.REFERENCE
        else:
            onnx_path = None
        if store is None:
            from enginefarm.settings import load_settings

            store = load_settings().store
        store = _absolute(str(store))  # the child runs in its own folder: a relative path would name another store
        request["model"] = model
        env["ENGINEFARM_STORE"] = str(store)
        result = _child(bundle_dir, request, env, work)
        with np.load(str(request["inputs"])) as data:
            feeds = dict(data)
        with np.load(str(request["outputs"])) as data:
            got = dict(data)
        artifact = result["artifact"]
        reference, what = _reference(feeds, onnx_path, model, store, artifact)
        compared = _compare(got, reference, artifact["precision"])
        seconds = time.perf_counter() - started
    worst = min(c["cosine"] for c in compared.values())
    passed = all(c["ok"] for c in compared.values())
    shown = ", ".join(f"{name}: cosine {c['cosine']:.6f}, max abs {c['max_abs']:.2g}" for name, c in compared.items())
    line = (
        f"ran {model} ({artifact['target']} {artifact['precision']}, computes in {artifact['runs_in']}) from the "
        f"bundle in a fresh python -I -S: {'matches' if passed else 'DIFFERS FROM'} {what} ({shown}); "
        f"{result['from_bundle']} modules from the bundle, "
        "none from site-packages"
    )
    if not passed:
        raise ProofFailed(
            line, hint=f"each output needs cosine >= {min_cosine(artifact['precision'])} (worst {worst:.6f})"
        )
    return Proof(True, True, line, result["from_bundle"], seconds, compared)


def _child(bundle_dir: Path, request: dict, env: dict, work: Path) -> dict:
    request_file = work / "request.json"
    request_file.write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", CHILD, str(bundle_dir), str(request_file)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=work,
        timeout=PROOF_TIMEOUT_S,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProofFailed(
            f"the bundle did not {'load' if request['probe'] else 'load and run ' + request['model']} in a fresh "
            f"isolated python: {tail}",
            hint=f"run it yourself: {sys.executable} -I -S -c \"import sys; sys.path.insert(0, '{bundle_dir}'); "
            'import enginefarm"',
        )
    result = json.loads(lines[-1])
    if any("site-packages" in entry for entry in result["sys_path"]) or result["outside"]:
        raise ProofFailed(
            "the proof imported modules from outside the bundle and the standard library: "
            f"{', '.join(result['outside'][:5])}",
            hint="a bug in enginefarm's bundle: please report it",
        )
    return result


def _probed(result: dict, parsed, spec, backend, seconds: float) -> Proof:
    """A bundle whose device is not here: its files must load, and a library the plugin lacks must be the system's."""
    from enginefarm.bundle import _distribution_files

    probe = result["probe"]
    missing = probe.get("missing")
    if missing:
        shipped = {
            Path(rel).name
            for name in spec.distributions
            for _, rel in _distribution_files(name, spec.__class__(spec.distributions), backend.install)[1]
        }
        if missing in shipped:
            raise ProofFailed(
                f"{parsed}: the bundle lacks {missing}, which {', '.join(spec.distributions)} ships and the device "
                "needs",
                hint="a bug in the backend's bundle rules (BundleSpec.keep): please report it",
            )
    line = f"{probe['line']}; running an artifact on a {parsed.device.upper()} was not proven here (no such device)"
    return Proof(False, True, line, result["from_bundle"], seconds)


def _absolute(store: str) -> str:
    """A local store's path (or file:// URL) made absolute; other URLs as they are."""
    if store.startswith("file://"):
        return "file://" + str(Path(store[len("file://") :]).expanduser().absolute())
    return store if "://" in store else str(Path(store).expanduser().absolute())


def _reference(feeds: dict, onnx_path: Path | None, model: str, store: str, artifact: dict) -> tuple[dict, str]:
    """The outputs to compare with: ONNX Runtime on the built-in model's ONNX, or on the store's onnxruntime:cpu fp32
    artifact of the same component and version; else the same artifact through this environment's full install."""
    if onnx_path is not None:
        try:
            import onnxruntime as ort
        except ModuleNotFoundError:
            raise ConfigError(
                "proving a bundle with the built-in model compares with ONNX Runtime, which is not installed here",
                hint="pip install 'enginefarm[build]'",
            ) from None
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True)), f"ONNX Runtime {ort.__version__} on the ONNX"
    from enginefarm.runner.load import load
    from enginefarm.runner.request import Request

    if artifact["target"] != "onnxruntime:cpu" or artifact["precision"] != precision_table.REFERENCE:
        try:
            reference = Request(
                model,
                precision_table.REFERENCE,
                "cpu",
                store,
                target="onnxruntime:cpu",
                version=artifact["model_version"],
            )
            session = load(reference)
            return session.run(
                feeds
            ), f"the store's onnxruntime:cpu fp32 artifact ({session.artifact.build_key[:12]}) in this environment"
        except EnginefarmError:
            pass  # no such artifact, or ONNX Runtime is not installed here: compare with the full install instead
    session = load(Request(model, artifact["precision"], "cpu", store, artifact["target"], artifact["model_version"]))
    return session.run(feeds), "the same artifact through this environment's full install"


def _compare(got: dict, want: dict, precision: str) -> dict:
    if set(got) != set(want):
        raise ProofFailed(f"the bundle's outputs {sorted(got)} are not the reference's {sorted(want)}")
    floor = min_cosine(precision)
    compared = {}
    for name in sorted(got):
        a, b = got[name].astype(np.float64).ravel(), want[name].astype(np.float64).ravel()
        if a.shape != b.shape or not np.isfinite(a).all():
            compared[name] = {"cosine": 0.0, "max_abs": float("inf"), "ok": False}
            continue
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosine = float(a @ b / norm) if norm else float(np.array_equal(a, b))
        compared[name] = {
            "cosine": cosine,
            "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0,
            "ok": cosine >= floor,
        }
    return compared


def _proof_onnx(path: Path) -> Path:
    """Two 3x3 convolutions with a ReLU and a sigmoid over a 1x3xHxW image: small, deterministic, and it makes a
    device's convolution kernels and dynamic shapes do real work."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1, b1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, rng.standard_normal(8).astype(np.float32) * 0.1
    w2, b2 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2, rng.standard_normal(4).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bundle_proof",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "h", "w"])],
        [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


RECIPE = """
[model]
name = "bundle-proof"
version = "1"

[defaults]
precisions = ["fp32"]
targets = ["{target}"]

[components.net]
source = "net.onnx"

[components.net.profiles.default]
h = [16, 32, 64]
w = [16, 32, 64]
"""


def _built_in_artifact(target: str, work: Path) -> str:
    """Build the built-in network for `target` into a store under `work` (validated, not benchmarked); its URL."""
    try:
        from enginefarm.builder.build import build
        from enginefarm.builder.planner import expand
        from enginefarm.builder.recipe import load_recipe
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"proving a bundle with the built-in model builds it here, which needs {exc.name} (the build extra)",
            hint="pip install 'enginefarm[build]', or prove with an artifact you built: --store URL --model "
            "MODEL/COMPONENT",
        ) from None
    from enginefarm.cache.stores import open_store

    _proof_onnx(work / "model" / "net.onnx")
    recipe_path = work / "model" / "recipe.toml"
    recipe_path.write_text(RECIPE.format(target=target))
    store_dir = work / "store"
    store_dir.mkdir()
    store = open_store(str(store_dir))
    (job,) = [j for j in expand(load_recipe(recipe_path), work / "downloads", offline=True) if str(j.target) == target]
    result = build(job, store, work / "build", bench=False)
    if result.status != "built":
        raise ProofFailed(
            f"could not build the built-in proof model for {target} here: {result.reason}",
            hint="prove with an artifact you built: --store URL --model MODEL/COMPONENT",
        )
    return str(store_dir)
