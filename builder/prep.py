"""ONNX prep: check, simplify (kept optional), shape inference, fp16 with float32 I/O: by path, for any size."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from enginefarm.cache import precision_table, workdirs
from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.locks import file_lock
from enginefarm.errors import ModelError
from enginefarm.formats.onnx_data import (
    converter_reads_no_weights,
    data_files,
    external_tensors,
    rename_data_file,
    write_model,
)

log = logging.getLogger(__name__)

# Bump when any step below changes what it writes: it is part of every build key.
PREP_VERSION = "4"  # 4: folded float constants kept as initializers (_constants_to_initializers)
LAST_USED = ".last_used"  # touched by every job that uses a prep folder; old folders are pruned (workcache.py)
EXTERNAL_ABOVE = 64 << 20  # a prepared model larger than this keeps its weights in `<name>.data`
# Bump when the rules for what stays fp32 in an fp16 model change: it is part of fp16 build keys.
FP16_KEEP_VERSION = "1"
# Bump when the bf16 retyping (formats/bf16.py) changes what it writes: it is part of bf16 build keys.
BF16_VERSION = "1"


@dataclass
class Prepared:
    path: Path
    notes: list[str] = field(default_factory=list)


def prep_versions(precision: str) -> dict[str, str]:
    import onnx

    versions = {"prep": PREP_VERSION, "onnx": onnx.__version__, "onnxsim": _onnxsim_version() or "absent"}
    if precision_table.reduced(precision):  # cast by onnxruntime's float16 converter
        import onnxruntime

        versions["fp16_converter"] = f"onnxruntime-{onnxruntime.__version__}+keep{FP16_KEEP_VERSION}"
    if precision == "bf16":
        versions["bf16_retype"] = BF16_VERSION
    return versions


def _onnxsim_version() -> str | None:
    """onnxsim's own version string, read from its version.py without importing the package: importing it loads
    torch (2+ s), which every plan and build paid just to compute a build key."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("onnxsim")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        try:
            found = re.search(r"^version\s*=\s*['\"]([^'\"]+)['\"]", (Path(folder) / "version.py").read_text(), re.M)
        except OSError:
            continue
        if found:
            return found.group(1)
    try:  # a layout without version.py: ask the package
        import onnxsim
    except ImportError:
        return None
    return str(getattr(onnxsim, "__version__", "unknown"))


def prepare(source: Path, precision: str, workdir: Path, fp16_keep: tuple[str, ...] = ()) -> Prepared:
    """The prepared model for `precision` in `workdir`, the source's own prep folder (one per source digest and
    prep toolchain): `prepared-fp32.onnx` (checked, simplified, shapes inferred) and `prepared-fp16.onnx`
    (converted from the fp32 one; `prepared-bf16.onnx` the same graph retyped to bfloat16), each with its weights in
    `<name>.data` when it has external data. `fp16_keep`: op types or node names that stay fp32 in the fp16 model
    besides those `fp16_blocked` keeps (such a model is its own file, `prepared-fp16-keep-<digest>.onnx`).

    Each is made once and reused by every job of the source, parallel ones included: a lock saves duplicate work,
    and the result appears by rename, so a reader never sees half a model even where the lock does not hold. A
    prep that fails is remembered (`prepared-<precision>.failed.json`) and fails every later job the same way
    instead of running again. No step holds the whole model as one protobuf message, so any size works."""
    fp32 = _once(workdir, "fp32", lambda out: _prepare_fp32(source, out))
    if not precision_table.reduced(precision):
        return fp32
    variant = (
        precision
        if not fp16_keep
        else f"{precision}-keep-" + hashlib.sha256("\n".join(sorted(fp16_keep)).encode()).hexdigest()[:12]
    )
    half = _once(workdir, variant, lambda out: _prepare_half(fp32.path, out, source, fp16_keep, precision))
    return Prepared(half.path, fp32.notes + half.notes)


def _once(workdir: Path, precision: str, make) -> Prepared:
    out = workdir / f"prepared-{precision}.onnx"
    notes_file = out.with_suffix(".notes")
    failed = out.with_suffix(".failed.json")
    workdir.mkdir(parents=True, exist_ok=True)
    with file_lock(workdir / f".prepared-{precision}.lock"):
        (workdir / LAST_USED).touch()
        if out.is_file() and notes_file.is_file():
            return Prepared(out, notes_file.read_text().splitlines())
        if failed.is_file():
            known = json.loads(failed.read_text())
            raise ModelError(known["message"], hint=known.get("hint"))
        # A prep killed while it wrote (kill -9, a runner's timeout) left its staging folder: a model's size each time,
        # which nothing else would ever remove while the folder is in use. Its owner is gone, so it goes now.
        freed = workdirs.reclaim(workdir, f".staging-{precision}")
        if freed:
            log.info("prep: removed %.1f GB a killed prep left in %s", freed / 1e9, workdir)
        staging = workdirs.fresh(workdir, f".staging-{precision}")
        try:
            notes = make(staging / out.name)
            data = staging / f"{out.name}.data"
            if data.exists():  # the weights first: a visible .onnx always has its data beside it
                os.replace(data, workdir / data.name)
            os.replace(staging / out.name, out)
        except ModelError as exc:
            write_bytes_atomic(failed, json.dumps({"message": str(exc), "hint": exc.hint}).encode())
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_bytes_atomic(notes_file, "\n".join(notes).encode())
    return Prepared(out, notes)


def _prepare_fp32(source: Path, out: Path) -> list[str]:
    import onnx

    notes: list[str] = []
    try:
        onnx.checker.check_model(str(source), full_check=False)  # by path: reads the graph, not the weights
        header = onnx.load(str(source), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{source}: fails the ONNX checker: {_first_line(exc)}", hint="re-export the model") from None
    with _model_errors(source, "cannot write the prepared model", "re-export the model"):
        if _simplify(source, out, len(header.graph.node), notes):
            _gather_data(out)
        else:
            write_model(header, source.parent, out)
        promoted = _constants_to_initializers(out)
        if promoted:
            notes.append(f"{promoted} folded constant(s) kept as initializers (weights the weight map can place)")
        if out.stat().st_size > EXTERNAL_ABOVE:
            _externalize(out)
    try:
        onnx.shape_inference.infer_shapes_path(str(out), str(out))
    except Exception as exc:
        notes.append(f"shape inference skipped: {_first_line(exc, 200)}")
    return notes


PROMOTE_FROM = 16  # elements: smaller float constants (scalars, eps, shapes) stay Constant nodes


def _constants_to_initializers(path: Path) -> int:
    """Turn the Constant nodes that hold float tensors of PROMOTE_FROM elements or more into initializers of the same
    name. The simplifier folds weights into such nodes (CLIP's position embedding, gathered by constant position ids,
    becomes a [1, 77, width] Constant); as initializers they are weights every backend can patch or refit by name,
    and the weight map finds them like any other. The graph computes the same. Reads the graph only: external
    tensors stay where they are."""
    import math

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
    keep, promoted = [], []
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and value is not None
            and value.data_type in floats
            and math.prod(value.dims) >= PROMOTE_FROM
        ):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            promoted.append(tensor)
        else:
            keep.append(node)
    if promoted:
        del model.graph.node[:]
        model.graph.node.extend(keep)
        model.graph.initializer.extend(promoted)
        onnx.save(model, str(path))
    return len(promoted)


def _externalize(path: Path) -> None:
    """Move an inline model's weights to `<name>.data` (onnxsim writes models under 2 GB inline), so the fp16
    conversion and every backend see the graph without the weights. Loading it whole is bounded: it is under 2 GB."""
    import onnx

    model = onnx.load(str(path))
    moved = path.parent / "external" / path.name
    moved.parent.mkdir()
    onnx.save(
        model,
        str(moved),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )
    del model
    os.replace(moved.with_name(f"{path.name}.data"), path.with_name(f"{path.name}.data"))
    os.replace(moved, path)


def _gather_data(path: Path) -> None:
    """Backends expect one data file, `<name>.data`; onnxsim names its own (a UUID) or writes one per tensor."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    files = data_files(model)
    want = f"{path.name}.data"
    if files <= {want}:
        return
    if len(files) == 1:  # one file under another name: rename it, and point the graph at the new name
        os.replace(path.parent / files.pop(), path.parent / want)
        rename_data_file(model, want)
        onnx.save(model, str(path))
        return
    gathered = path.parent / "gathered" / path.name  # the same names, so the graph points at the final file
    gathered.parent.mkdir()
    write_model(model, path.parent, gathered)
    os.replace(gathered.with_name(want), path.with_name(want))
    os.replace(gathered, path)


def _prepare_half(fp32: Path, out: Path, source: Path, keep: tuple[str, ...], precision: str) -> list[str]:
    """The fp32 prepared graph, converted to fp16 (or bf16) without its weights in memory: the converter retypes
    the external tensors it keeps as float16, and `write_model` converts their values one tensor at a time."""
    import onnx

    notes: list[str] = []
    model = onnx.load(str(fp32), load_external_data=False)
    was_float = frozenset(t.name for t in external_tensors(model) if t.data_type == onnx.TensorProto.FLOAT)
    with _model_errors(source, f"{precision} conversion failed", "build fp32 meanwhile"), converter_reads_no_weights():
        if precision == "bf16":
            converted = _to_bf16(model, notes, keep)
            write_model(converted, fp32.parent, out, to_bf16=was_float)
        else:
            converted = _to_fp16(model, notes, keep)
            write_model(converted, fp32.parent, out, to_fp16=was_float)
    return notes


@contextmanager
def _model_errors(source: Path, what: str, hint: str):
    """What the model causes becomes a ModelError (and is remembered as the prep's failure); what the machine
    causes (a full disk, no memory) is raised as it is, so the next job tries again."""
    try:
        yield
    except (ModelError, OSError, MemoryError):
        raise
    except Exception as exc:
        raise ModelError(f"{source}: {what}: {_first_line(exc)}", hint=hint) from exc


def _simplify(source: Path, out: Path, nodes_before: int, notes: list[str]) -> Path | None:
    """onnxsim's simplification of `source`, written to `out` (by path, weights and all), or None with a note."""
    try:
        import onnxsim
    except ImportError:
        notes.append("not simplified: onnxsim is not installed")
        return None
    try:
        with _printed_to(out.with_name(out.name + ".onnxsim.log")) as log:
            simplified, ok = onnxsim.simplify(str(source), check_n=0, output_path=str(out))
    except TypeError as exc:
        if "output_path" not in str(exc):
            notes.append(f"not simplified: onnxsim failed (TypeError: {_first_line(exc, 200)})")
            return None
        notes.append(
            "not simplified: this onnxsim cannot write a model by path (onnxsim with simplify(output_path=...) can)"
        )
        return None
    except Exception as exc:  # onnxsim fails on some exotic graphs; the unsimplified model is still correct
        notes.append(
            f"not simplified: onnxsim failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
        )
        return None
    if not ok or not out.is_file():
        notes.append("not simplified: onnxsim could not verify the result")
        return None
    notes.append(f"simplified by onnxsim ({nodes_before} → {len(simplified.graph.node)} nodes)")
    warned = sum(line.startswith("WARNING") for line in log.read_text(errors="replace").splitlines())
    if warned:
        notes.append(f"onnxsim left {warned} op(s) unfolded (its warnings)")
    return out


@contextmanager
def _printed_to(path: Path):
    """What onnxsim's C++ prints (a WARNING per op it cannot fold: hundreds for a CLIP encoder) goes to `path`, not to
    the build's output; the process's own stdout and stderr come back afterwards."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield path
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def _to_fp16(model, notes: list[str], keep: tuple[str, ...] = ()):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from enginefarm.formats.fp16_rules import elide_round_trips, fp16_blocked

    ops, nodes = fp16_blocked(model, keep)
    # keep_io_types: callers feed and read float32; the casts live inside the graph.
    converted = convert_float_to_float16(
        model, keep_io_types=True, disable_shape_infer=False, op_block_list=sorted(ops), node_block_list=sorted(nodes)
    )
    elide_round_trips(converted.graph)
    removed = _drop_duplicate_nodes(converted.graph)
    _sort_topologically(converted.graph)
    kept = sum(1 for n in converted.graph.node if n.op_type in ops or n.name in nodes)
    notes.append(
        "converted to fp16 (float32 inputs and outputs)"
        + (f"; {kept} nodes kept fp32 ({_summary(converted, ops, nodes)})" if kept else "")
        + (f"; merged {removed} duplicate casts" if removed else "")
    )
    return converted


def _to_bf16(model, notes: list[str], keep: tuple[str, ...] = ()):
    """The fp16 conversion's graph (same borders, same ops kept fp32), retyped to bfloat16 from the fp32 weights."""
    from enginefarm.formats.bf16 import float_initializers, retype

    originals = float_initializers(model)
    converted = _to_fp16(model, notes, keep)
    rounded = retype(converted, originals)
    notes[-1] = (
        notes[-1].replace("converted to fp16", "converted to bf16", 1) + f"; {rounded} weights rounded from fp32"
    )
    return converted


def _summary(model, ops: set[str], nodes: set[str]) -> str:
    from collections import Counter

    counts = Counter(n.op_type for n in model.graph.node if n.op_type in ops or n.name in nodes)
    return ", ".join(f"{op} ×{count}" for op, count in counts.most_common(6)) + (", …" if len(counts) > 6 else "")


def _sort_topologically(graph) -> None:
    """The converter appends its input Casts at the end; ONNX requires producers before consumers.
    Stable: nodes keep their order wherever it is already valid. (Subgraph inputs from outer scope are
    treated as available, which is all the top-level order needs.)"""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    produced_later = {o for n in pending for o in n.output}
    ordered = []
    while pending:
        progressed = False
        rest = []
        for node in pending:
            if all(i in available or i not in produced_later for i in node.input):
                ordered.append(node)
                available.update(node.output)
                progressed = True
            else:
                rest.append(node)
        if not progressed:
            raise ModelError(
                "fp16 conversion produced a graph with a cycle", hint="report this model; build fp32 meanwhile"
            )
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def _drop_duplicate_nodes(graph) -> int:
    """The converter inserts one Cast per consumer of a float-only input (Resize scales). When onnxsim has merged
    those constants into one, the Casts come out identical, name and output included, which ONNX forbids.
    Identical nodes compute the same value, so the first one serves every consumer."""
    seen: dict[str, bytes] = {}
    keep = []
    for node in graph.node:
        body = node.SerializeToString(deterministic=True)
        for output in node.output:
            if output in seen and seen[output] != body:
                raise ModelError(
                    f"fp16 conversion produced two different nodes writing {output!r}",
                    hint="report this model; build fp32 meanwhile",
                )
        if node.output and all(seen.get(o) == body for o in node.output):
            continue
        seen.update({o: body for o in node.output})
        keep.append(node)
    removed = len(graph.node) - len(keep)
    if removed:
        del graph.node[:]
        graph.node.extend(keep)
    return removed
