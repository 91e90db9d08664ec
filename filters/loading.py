"""`enginefarm.filters.load`: a filter's description from the store, its components loaded like any artifact, and
the kind's class around them."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from enginefarm.errors import ConfigError

from .base import Filter
from .info import FilterInfo

if TYPE_CHECKING:
    from enginefarm.cache.progress import ProgressLike
    from enginefarm.runner.request import Request

# kind → "module:Class" in this package, imported only when a filter of that kind loads
KIND_CLASSES = {
    "upscaler": "upscale:Upscaler",
    "face_restorer": "faces:FaceRestorer",
    "face_detector": "faces:FaceDetector",
    "preview_decoder": "preview:PreviewDecoder",
    "safety_checker": "safety:SafetyChecker",
    "preprocessor": "preprocess:Preprocessor",
}


def kind_class(kind: str) -> type[Filter]:
    module_name, _, class_name = KIND_CLASSES[kind].partition(":")
    try:
        module = importlib.import_module(f"{__package__}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.{module_name}":
            raise
        raise ConfigError(f"this enginefarm cannot run {kind} filters yet", hint="update enginefarm") from None
    return getattr(module, class_name)


def load(
    name: str,
    *,
    store: str | None = None,
    precision: str | None = None,
    target: str | None = None,
    device: str = "auto",
    version: str | None = None,
    progress: ProgressLike = None,
    assets: str | Path | None = None,
) -> Filter:
    """The filter `name` from the store, its engines picked for this device (as `enginefarm.load` picks), verified
    and loaded. Close it (or use `with`) to give its memory back.

    Args:
        name: The filter's model name in the store (`enginefarm export FILE --name NAME`).
        store: A store URL or folder; default ENGINEFARM_STORE.
        precision: "fp32", "fp16" or "bf16"; default the fastest measured for this device.
        target: A backend or target ("openvino", "onnxruntime:cpu"); default any this device runs.
        device: "auto", "cpu", "nvidia", "intel"…
        version: The model version; default the newest usable here.
        progress: A callable receiving messages, or a `Progress`.
        assets: The folder `enginefarm export` wrote (`DIR/assets`), to skip fetching it from the store.

    Returns:
        The loaded filter, of its kind's class (`Upscaler`, `FaceRestorer`, `SafetyChecker`…).

    Raises:
        UnknownModelError: The store holds no model `name` (the message lists what it holds).
        ConfigError: The model is not a filter, or is a filter of an unknown kind.
    """
    from enginefarm.runner.load import load as load_session  # `enginefarm.load` itself, without the root package
    from enginefarm.runner.request import Request

    request = Request(name, precision, device, store, target, version)
    folder = Path(assets) if assets is not None else fetch_filter_assets(request, progress)
    info = FilterInfo.from_folder(folder, name)
    cls = kind_class(info.kind)
    uses: dict[str, Filter] = {}
    sessions: dict = {}
    try:
        for role, other in dict(info.details.get("uses", {})).items():
            uses[role] = _load_used(
                other, store=store, precision=precision, target=target, device=device, progress=progress
            )
        for component in info.components:
            sessions[component] = load_session(request.component(component), progress=progress)
        return cls(info, sessions, uses)
    except BaseException:
        for session in sessions.values():
            session.close()
        for other_filter in uses.values():
            other_filter.close()
        raise


def _load_used(name: str, *, precision: str | None, **options) -> Filter:
    """A filter another one runs (a face restorer's detector), at the asked precision where the store has it, else
    at the fastest it has: a helper network need not be built at every precision its user is."""
    from enginefarm.errors import ArtifactNotFoundError

    try:
        return load(name, precision=precision, **options)
    except ArtifactNotFoundError:
        if precision is None:
            raise
        return load(name, precision=None, **options)


def fetch_filter_assets(request: Request, progress) -> Path:
    """The filter's assets folder (`NAME/assets`: filter.json and what its kind reads), fetched and verified; `request`
    names the filter and where it is stored."""
    from enginefarm.runner.assets import fetch_assets

    hint = "build the recipe `enginefarm export FILE` wrote for it: its assets say what kind of filter it is"
    return fetch_assets(request, progress, missing_hint=hint)
