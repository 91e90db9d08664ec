"""Resolve a recipe profile against the model's inputs: every input gets full min/opt/max shapes."""

from __future__ import annotations

from pathlib import Path

from enginefarm.errors import RecipeError
from enginefarm.formats.onnx_io import TensorInfo

from .recipe import ProfileSpec

Resolved = dict[str, dict[str, list[int]]]  # input → {"min": [...], "opt": [...], "max": [...]}

STATIC_PROFILE = "static"


def _describe(dim: int | str | None) -> str:
    return "unnamed ('?' or -1)" if dim is None else repr(dim)


def resolve_profile(spec: ProfileSpec | None, inputs: list[TensorInfo], recipe: Path, key: str) -> Resolved:
    names = {t.name for t in inputs}
    dim_names = sorted({d for t in inputs for d in t.dims if isinstance(d, str)})
    if spec is not None:
        for name in spec.inputs:
            if name not in names:
                raise RecipeError(
                    recipe,
                    f"{key}.inputs.{name}",
                    f"the model has no input {name!r}",
                    hint=f"model inputs: {', '.join(sorted(names))}",
                )
        for named in spec.dims:
            if named not in dim_names:
                hint = (
                    f"named dims: {', '.join(dim_names)}"
                    if dim_names
                    else "this model has no named dims; use inputs.NAME.min/opt/max"
                )
                raise RecipeError(recipe, f"{key}.{named}", f"no model input has a dim named {named!r}", hint=hint)

    resolved: Resolved = {}
    for tensor in inputs:
        if spec is not None and tensor.name in spec.inputs:
            resolved[tensor.name] = _explicit(spec, tensor, recipe, f"{key}.inputs.{tensor.name}")
            continue
        lo, opt, hi = [], [], []
        for axis, dim in enumerate(tensor.dims):
            if isinstance(dim, int):
                triple = (dim, dim, dim)
            elif spec is not None and isinstance(dim, str) and dim in spec.dims:
                triple = spec.dims[dim]
            else:
                hint = f"add {dim} = [min, opt, max] to the profile" if isinstance(dim, str) else ""
                hint = hint or f"give the whole shape in [{key}.inputs.{tensor.name}] with min/opt/max"
                where = key if spec is not None else key.rsplit(".", 1)[0]
                raise RecipeError(
                    recipe,
                    where,
                    f"input {tensor.name!r} axis {axis} is dynamic, {_describe(dim)}, and has no range",
                    hint=hint,
                )
            lo.append(triple[0])
            opt.append(triple[1])
            hi.append(triple[2])
        resolved[tensor.name] = {"min": lo, "opt": opt, "max": hi}
    return resolved


def _explicit(spec: ProfileSpec, tensor: TensorInfo, recipe: Path, key: str) -> dict[str, list[int]]:
    shapes = spec.inputs[tensor.name]
    if len(shapes.min) != len(tensor.dims):
        raise RecipeError(
            recipe, key, f"has rank {len(shapes.min)} but input {tensor.name!r} has rank {len(tensor.dims)}"
        )
    for axis, dim in enumerate(tensor.dims):
        if isinstance(dim, int) and not (shapes.min[axis] == shapes.opt[axis] == shapes.max[axis] == dim):
            raise RecipeError(
                recipe, key, f"axis {axis} of {tensor.name!r} is fixed at {dim}, the profile says otherwise"
            )
    return {"min": list(shapes.min), "opt": list(shapes.opt), "max": list(shapes.max)}


def is_static(inputs: list[TensorInfo]) -> bool:
    return all(isinstance(d, int) for t in inputs for d in t.dims)
