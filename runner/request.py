"""What a load asks for, as one value: made once where a caller's arguments come in (`enginefarm.load`,
`Pipeline.load`, `enginefarm.filters.load`, the CLI) and handed down to the lookup, the fetch, the warm start and the
custom-weights step, which read it instead of taking its fields one by one.

Standard library only: `import enginefarm` may name it without loading the runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

LoraSpec = str | Path | tuple[str | Path, float]  # a file (strength 1) or (file, strength)


@dataclass(frozen=True)
class Request:
    """One load's question: which artifact, from where, for what, with which of the user's own weights.

    Args:
        ref: "MODEL/COMPONENT"; or "MODEL" for a whole model (a pipeline's, a filter's), whose components are each
            asked with `component(name)`.
        precision: "fp32", "fp16", "bf16", or None for the fastest measured.
        device: "auto", "cpu", "nvidia", "intel"...
        store: a store URL; None: ENGINEFARM_STORE.
        target: a backend or target that must serve it ("openvino", "openvino:cpu"); None: any.
        version: the model version (the recipe's `model.version`); None: the newest usable here.
        weights: a custom checkpoint applied to the stored artifact.
        loras: LoRA files, each a path (strength 1) or (path, strength), applied in order.
        recipe: compile here from this recipe when nothing stored fits.
        channel: load only what this signed release channel holds (with `trusted_root`).
        trusted_root: the channel's root.json, shipped with the app.
        tiling: "x", "y" or "xy": the artifact's seamless variant.
    """

    ref: str
    precision: str | None = None
    device: str = "auto"
    store: str | None = None
    target: str | None = None
    version: str | None = None
    weights: str | Path | None = None
    loras: Sequence[LoraSpec] = ()
    recipe: str | Path | None = None
    channel: str | None = None
    trusted_root: str | Path | None = None
    tiling: str | None = None

    def __post_init__(self) -> None:
        # a list of LoRAs kept as a tuple, so that a request is a value; one path is left for Stack.parse to refuse
        if not isinstance(self.loras, str | Path | tuple):
            object.__setattr__(self, "loras", tuple(self.loras or ()))

    @property
    def model(self) -> str:
        """The model's name: the ref before its "/"."""
        return self.ref.partition("/")[0]

    @property
    def custom(self) -> bool:
        """The user's own weights or LoRAs come with it (they bring their own code: runner/custom.py)."""
        return self.weights is not None or bool(self.loras)

    @property
    def plain(self) -> bool:
        """Nothing beyond the stored artifact is asked (no custom weights, channel or seamless variant): a warm start
        may answer it (runner/warm.py)."""
        return not self.custom and self.channel is None and self.trusted_root is None and self.tiling is None

    def component(self, name: str, **changes: Any) -> Request:
        """The same request for component `name` of this request's model, with `changes` to its fields."""
        return replace(self, ref=f"{self.model}/{name}", **changes)
