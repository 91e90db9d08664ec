"""Several optimization profiles per engine, and the pick of one per request.

TensorRT tunes its kernels for a profile's opt shapes and runs any shape between min and max with them, so a request
at another size runs kernels chosen for a size it is not. A build can add more profiles sharing the job's min and max,
each with its opt at a size users ask often; at run time the session selects the profile whose opt is the request's
shape, else the nearest one that holds it.

Which opts are built is the recipe option `opt_profiles` (each profile multiplies the build's tactic timing, so the
rule is bounded):
    "edges"  the job's opt, then that opt with the image height, the width, or both at the profile's max (at most 4;
             one where the opt is already the max, as for SDXL, SD 2 and the transformer families at 1024 or 768)
    "opt"    the job's opt only (one profile)
Image axes are the last two of a rank-4 input (NCHW: latents, images, ControlNet residuals), so axes tied to one
another (a residual's height at half the latent's) move to their max together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from enginefarm.errors import ConfigError, InputError

Profile = dict[str, dict[str, list[int]]]  # input → {"min", "opt", "max"} shapes
OPT_RULES = ("edges", "opt")
_EDGES = ((True, False), (False, True), (True, True))  # (height at max, width at max)


def optimization_profiles(profile: Mapping[str, Mapping[str, Sequence[int]]], rule: str) -> list[Profile]:
    """The profiles a build adds, the job's own first; all share its min and max. A rule outside OPT_RULES is a
    ConfigError."""
    if rule not in OPT_RULES:
        raise ConfigError(
            f"opt_profiles = {rule!r} is not a rule of optimization profiles",
            hint=f"use one of: {', '.join(OPT_RULES)}",
        )
    first = {name: {k: [int(d) for d in dims] for k, dims in bounds.items()} for name, bounds in profile.items()}
    found = [first]
    if rule == "opt":
        return found
    for tall, wide in _EDGES:
        candidate = {name: {**bounds, "opt": _at_edges(bounds, tall, wide)} for name, bounds in first.items()}
        if candidate not in found:
            found.append(candidate)
    return found


def _at_edges(bounds: dict[str, list[int]], tall: bool, wide: bool) -> list[int]:
    opt = list(bounds["opt"])
    if len(opt) == 4:
        if tall:
            opt[2] = bounds["max"][2]
        if wide:
            opt[3] = bounds["max"][3]
    return opt


Shapes = dict[str, tuple[int, ...]]
Bounds = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # input → (min, opt, max)


class ProfilePicker:
    """The engine's profiles (read once: `get_tensor_profile_shape` per input and profile) and, per set of input
    shapes, the one to run: the profile whose opt is that shape, else the nearest that holds it (the smallest sum
    of |log(shape / opt)| over the axes; ties go to the lower index, the job's own opt first)."""

    def __init__(self, engine, inputs: Sequence[str]) -> None:
        count = int(getattr(engine, "num_optimization_profiles", 1) or 1)
        self.profiles: list[Bounds] = []
        if hasattr(engine, "get_tensor_profile_shape"):
            for index in range(count):
                bounds: Bounds = {}
                for name in inputs:
                    shapes = _profile_shapes(engine, name, index)
                    if shapes is not None:
                        bounds[name] = shapes
                self.profiles.append(bounds)
        self._picked: dict[tuple, int] = {}

    def __len__(self) -> int:
        return max(len(self.profiles), 1)

    def pick(self, shapes: Shapes) -> int:
        """The index of the profile to run `shapes` in; InputError when none holds them."""
        key = tuple(sorted(shapes.items()))
        if key not in self._picked:
            if len(self.profiles) <= 1:  # one profile: the SDK's set_input_shape is the check
                self._picked[key] = 0
            else:
                self._picked[key] = self._nearest(shapes)
        return self._picked[key]

    def _nearest(self, shapes: Shapes) -> int:
        scored = [
            (_distance(bounds, shapes), index)
            for index, bounds in enumerate(self.profiles)
            if all(_holds(bounds[name], shape) for name, shape in shapes.items() if name in bounds)
        ]
        if not scored:
            raise InputError(
                f"input shapes {_describe(shapes)} are outside every optimization profile of this engine",
                hint="its profiles hold " + "; ".join(self.describe(i) for i in range(len(self.profiles))),
            )
        return min(scored)[1]

    def describe(self, index: int) -> str:
        """One profile's ranges: `latent [1, 4, 8, 8] .. [2, 4, 32, 32] (opt [1, 4, 16, 16])`."""
        return ", ".join(
            f"{name} {list(low)} .. {list(high)} (opt {list(opt)})"
            for name, (low, opt, high) in self.profiles[index].items()
        )


def _profile_shapes(engine, name: str, index: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """(min, opt, max) of one input in one profile; None where the SDK has none to give (an input of fixed shape
    may answer empty or negative dims, or refuse), which then constrains no pick."""
    try:
        low, opt, high = (tuple(int(d) for d in dims) for dims in engine.get_tensor_profile_shape(name, index))
    except (RuntimeError, ValueError, TypeError):
        return None
    return (low, opt, high) if low and min(low) >= 0 else None


def _holds(bounds: tuple[tuple[int, ...], ...], shape: tuple[int, ...]) -> bool:
    low, _, high = bounds
    return len(shape) == len(low) and all(a <= s <= b for a, s, b in zip(low, shape, high, strict=True))


def _distance(bounds: Bounds, shapes: Shapes) -> float:
    return sum(
        abs(math.log(max(s, 1) / max(o, 1)))
        for name, shape in shapes.items()
        if name in bounds
        for s, o in zip(shape, bounds[name][1], strict=True)
    )


def _describe(shapes: Shapes) -> str:
    return ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
