"""ONNX prep: check, shape inference, simplify (kept optional), fp16 with float32 I/O."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.locks import file_lock
from enginefarm.errors import ModelError

log = logging.getLogger(__name__)

# Bump when any step below changes what it writes: it is part of every build key.
PREP_VERSION = "2"
_EXTERNAL_THRESHOLD = 1_800_000_000  # protobuf cannot serialize a single message over 2 GB
# Bump when the rules for what stays fp32 in an fp16 model change: it is part of fp16 build keys.
FP16_KEEP_VERSION = "1"
# Bump when the bf16 retyping (builder/bf16.py) changes what it writes: it is part of bf16 build keys.
BF16_VERSION = "1"


@dataclass
class Prepared:
    path: Path
    notes: list[str] = field(default_factory=list)


def prep_versions(precision: str) -> dict[str, str]:
    import onnx

    versions = {"prep": PREP_VERSION, "onnx": onnx.__version__, "onnxsim": _onnxsim_version() or "absent"}
    if precision in ("fp16", "bf16"):
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
    """Write the prepared model to `workdir/prepared-<precision>.onnx`. Reuses it if already there.
    `fp16_keep`: op types or node names that stay fp32 in an fp16 model, besides those `fp16_blocked` keeps.

    Parallel jobs share one prep per (source, precision): a lock saves the duplicate work, and the result
    appears by rename, so a reader never sees half a model even where the lock does not hold."""
    out = workdir / f"prepared-{precision}.onnx"
    notes_file = out.with_suffix(".notes")
    workdir.mkdir(parents=True, exist_ok=True)
    with file_lock(workdir / f".prepared-{precision}.lock"):
        if out.is_file() and notes_file.is_file():
            return Prepared(out, notes_file.read_text().splitlines())
        notes, model = _prepared_model(source, precision, fp16_keep)
        import onnx

        large = model.ByteSize() > _EXTERNAL_THRESHOLD
        staging = workdir / f".staging-{precision}-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            onnx.save(model, str(staging / out.name), save_as_external_data=large, location=f"{out.name}.data" if large else None)
            if large:
                os.replace(staging / f"{out.name}.data", workdir / f"{out.name}.data")
            os.replace(staging / out.name, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_bytes_atomic(notes_file, "\n".join(notes).encode())
    return Prepared(out, notes)


def _prepared_model(source: Path, precision: str, fp16_keep: tuple[str, ...] = ()):
    import onnx

    notes: list[str] = []
    try:
        onnx.checker.check_model(str(source), full_check=False)
        model = onnx.load(str(source), load_external_data=True)
    except Exception as exc:
        raise ModelError(f"{source}: fails the ONNX checker: {str(exc).splitlines()[0][:300]}", hint="re-export the model") from None
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        notes.append(f"shape inference skipped: {str(exc).splitlines()[0][:200]}")
    model = _simplify(model, notes)
    if precision == "fp16":
        model = _to_fp16(model, notes, fp16_keep)
    elif precision == "bf16":
        model = _to_bf16(model, notes, fp16_keep)
    return notes, model


def _simplify(model, notes: list[str]):
    try:
        import onnxsim
    except ImportError:
        notes.append("not simplified: onnxsim is not installed")
        return model
    try:
        simplified, ok = onnxsim.simplify(model, check_n=0)
    except Exception as exc:  # onnxsim fails on some exotic graphs; the unsimplified model is still correct
        notes.append(f"not simplified: onnxsim failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})")
        return model
    if not ok:
        notes.append("not simplified: onnxsim could not verify the result")
        return model
    notes.append(f"simplified by onnxsim ({len(model.graph.node)} → {len(simplified.graph.node)} nodes)")
    return simplified


def _to_fp16(model, notes: list[str], keep: tuple[str, ...] = ()):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from .fp16_rules import elide_round_trips, fp16_blocked

    ops, nodes = fp16_blocked(model, keep)
    # keep_io_types: callers feed and read float32; the casts live inside the graph.
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False, op_block_list=sorted(ops),
                                         node_block_list=sorted(nodes))
    elide_round_trips(converted.graph)
    removed = _drop_duplicate_nodes(converted.graph)
    _sort_topologically(converted.graph)
    kept = sum(1 for n in converted.graph.node if n.op_type in ops or n.name in nodes)
    notes.append("converted to fp16 (float32 inputs and outputs)" + (f"; {kept} nodes kept fp32 ({_summary(converted, ops, nodes)})" if kept else "")
                 + (f"; merged {removed} duplicate casts" if removed else ""))
    return converted


def _to_bf16(model, notes: list[str], keep: tuple[str, ...] = ()):
    """The fp16 conversion's graph (same borders, same ops kept fp32), retyped to bfloat16 from the fp32 weights."""
    from .bf16 import float_initializers, retype

    originals = float_initializers(model)
    converted = _to_fp16(model, notes, keep)
    rounded = retype(converted, originals)
    notes[-1] = notes[-1].replace("converted to fp16", "converted to bf16", 1) + f"; {rounded} weights rounded from fp32"
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
            raise ModelError("fp16 conversion produced a graph with a cycle", hint="report this model; build fp32 meanwhile")
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
                raise ModelError(f"fp16 conversion produced two different nodes writing {output!r}", hint="report this model; build fp32 meanwhile")
        if node.output and all(seen.get(o) == body for o in node.output):
            continue
        seen.update({o: body for o in node.output})
        keep.append(node)
    removed = len(graph.node) - len(keep)
    if removed:
        del graph.node[:]
        graph.node.extend(keep)
    return removed
