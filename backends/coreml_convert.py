"""The Core ML conversion pipeline, on torch: ONNX fixes onnx2torch needs, a traceable module, coremltools.

Imported only while building a coreml target (it imports onnx, torch, onnx2torch and coremltools).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.errors import BuildError

from ._coreml_sdk import IO_DTYPES, coremltools
from .build_job import PlannedJob

log = logging.getLogger(__name__)

# Reduce ops whose axes moved from an attribute to an input in opset 18; onnx2torch knows only the older form.
REDUCE_AXES_18 = {
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}


def _since(op_type: str, opset: int, domain: str = "") -> int | None:
    import onnx

    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain).since_version
    except Exception:  # unknown op or domain
        return None


def downgrade_reduce_axes(model):
    """Rewrite opset-18 Reduce ops with constant axes to the opset-17 attribute form, and the model to opset 17,
    when no other op changed between 17 and the model's opset. Otherwise return the model unchanged (the
    unsupported-op check then names what is left)."""
    import onnx
    from onnx import helper, numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 18:
        return model
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in REDUCE_AXES_18:
            if len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
                return model  # axes computed at run time: no attribute form exists
        elif _since(node.op_type, opset) != _since(node.op_type, 17):
            return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for node in fixed.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in REDUCE_AXES_18 and len(node.input) > 1:
            axes = node.input[1]
            del node.input[1:]
            if axes:
                node.attribute.append(
                    helper.make_attribute("axes", [int(a) for a in np.asarray(constants[axes]).ravel()])
                )
    for entry in fixed.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = 17
    log.info("coreml: rewrote opset-%d Reduce ops to the opset-17 attribute form for onnx2torch", opset)
    return fixed


def unsupported_ops(model) -> list[str]:
    """Ops of the main graph that onnx2torch has no converter for, as 'Op (opset N)'."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription

    opsets = {o.domain or "": o.version for o in model.opset_import}
    missing = set()
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = opsets.get(domain, opsets.get("", 0))
        version = _since(node.op_type, opset, domain) or opset
        if OperationDescription(domain=domain, operation_type=node.op_type, version=version) not in _CONVERTER_REGISTRY:
            missing.add(f"{node.op_type} (opset {version}{', domain ' + domain if domain else ''})")
    return sorted(missing)


def to_traceable_torch(onnx_path: Path):
    """The ONNX model as a torch.fx module whose trace keeps dynamic shapes dynamic."""
    import onnx
    from onnx2torch import convert

    model = downgrade_reduce_axes(onnx.load(str(onnx_path)))
    missing = unsupported_ops(model)
    if missing:
        raise BuildError(
            f"onnx2torch cannot convert {', '.join(missing)} for Core ML",
            hint="re-export the model at another opset, or leave coreml out of this component's targets",
        )
    try:
        module = convert(model).eval()
    except Exception as exc:  # onnx2torch raises plain exceptions for unsupported attributes and exports
        raise BuildError(
            f"onnx2torch failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        ) from exc
    return _dynamic_reshapes(module)


def _dynamic_reshapes(module):
    """onnx2torch's Reshape turns its shape tensor into Python ints, which a trace records as constants: the
    converted model would accept only the traced shape. Rewrite the common cases to `reshape` with sizes read
    from tensors (`x.size(i)`), which a trace keeps dynamic: a constant shape whose 0s copy input dims, and a
    shape that is another tensor's whole Shape."""
    import torch
    from onnx2torch.node_converters.reshape import OnnxReshape
    from onnx2torch.node_converters.shape import OnnxShape

    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(module.get_submodule(node.target), OnnxReshape):
            continue
        data, shape = node.args[0], node.args[1]
        dims = None
        if shape.op == "get_attr":
            owner, _, name = shape.target.rpartition(".")
            value = getattr(module.get_submodule(owner) if owner else module, name)
            with graph.inserting_before(node):
                dims = [
                    graph.call_method("size", (data, i)) if int(v) == 0 else int(v)
                    for i, v in enumerate(value.tolist())
                ]
        elif shape.op == "call_module" and isinstance(module.get_submodule(shape.target), OnnxShape):
            source = module.get_submodule(shape.target)
            if getattr(source, "_start", None) in (None, 0) and getattr(source, "_end", None) is None:
                with graph.inserting_before(node):
                    dims = graph.call_method("size", (shape.args[0],))
        if dims is None:
            continue  # left as onnx2torch made it; validation across the profile catches a baked shape
        with graph.inserting_before(node):
            replacement = graph.call_function(torch.reshape, (data, dims))
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()
    return module


_FIXED = False


def _register_int_fix(ct) -> None:
    """coremltools 9 folds a traced size to a 1-element array and then calls int() on it, which numpy >= 2.4
    refuses; convert such constants with .item(). Registered through coremltools' documented op registry."""
    global _FIXED
    if _FIXED:
        return
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op

    def _int(context, node):
        x = ops._get_inputs(context, node, expected=1)[0]
        if x.can_be_folded_to_const() and np.ndim(x.val) > 0 and np.size(x.val) == 1:
            context.add(mb.const(val=np.int32(np.asarray(x.val).item()), name=node.name), node.name)
            return
        ops._int(context, node)

    register_torch_op(_int, torch_alias=["int"], override=True)
    _FIXED = True


def input_types(ct, job: PlannedJob, shapes: str) -> list:

    types = []
    for tensor in job.inputs:
        bounds = job.profile[tensor.name]
        dtype = IO_DTYPES.get(tensor.dtype, np.float32)
        if bounds["min"] == bounds["max"]:
            shape = tuple(bounds["min"])
        elif shapes == "enumerated":
            corners = [tuple(bounds[c]) for c in ("min", "opt", "max")]
            shape = ct.EnumeratedShapes(shapes=[list(s) for s in dict.fromkeys(corners)], default=list(bounds["opt"]))
        else:
            dims = [
                lo if lo == hi else ct.RangeDim(lower_bound=lo, upper_bound=hi, default=opt)
                for lo, opt, hi in zip(bounds["min"], bounds["opt"], bounds["max"], strict=True)
            ]
            shape = ct.Shape(shape=dims)
        types.append(ct.TensorType(name=tensor.name, shape=shape, dtype=dtype))
    return types


def convert_to_mlprogram(traced, job: PlannedJob) -> tuple[Any, str]:  # coremltools' MLModel (untyped SDK)
    """(MLModel, how shapes were made flexible). Ranges that coremltools cannot convert fall back to the
    profile's enumerated min/opt/max shapes, and the build notes say so."""

    ct = coremltools()
    _register_int_fix(ct)
    precision = ct.precision.FLOAT16 if job.precision == "fp16" else ct.precision.FLOAT32
    target = getattr(ct.target, job.options.get("deployment_target", "macOS13"))
    wanted = job.options.get("shapes", "range")
    outputs = [ct.TensorType(name=t.name) for t in job.outputs]

    def convert(shapes: str):
        return ct.convert(
            traced,
            inputs=input_types(ct, job, shapes),
            outputs=outputs,
            convert_to="mlprogram",
            compute_precision=precision,
            minimum_deployment_target=target,
        )

    try:
        return convert(wanted), wanted
    except Exception as exc:
        if wanted != "range":
            raise BuildError(
                f"coremltools could not convert: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300] if str(exc) else ''}"
            ) from exc
        log.warning(
            "coreml: flexible ranges failed (%s); trying the profile's enumerated shapes",
            str(exc).splitlines()[0][:200] if str(exc) else exc,
        )
        try:
            return convert("enumerated"), "enumerated (ranges failed)"
        except Exception as again:
            raise BuildError(
                f"coremltools could not convert: {type(again).__name__}: "
                f"{str(again).splitlines()[0][:300] if str(again) else ''}"
            ) from again
