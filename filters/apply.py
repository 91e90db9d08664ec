"""Filters run on a generated image in the order an SD app runs them (Easy Diffusion's: the safety check on the
image as generated, then face restoration, then upscaling), and a ControlNet's control image made from a photo.

    done = enginefarm.filters.apply(image, safety="sd-safety-checker", face_fix="gfpgan-v1.4",
                                    upscale="realesrgan-x4plus", store=STORE)
    done.image, done.flagged, done.ran  # float [H', W', 3]; whether the checker flagged it; what ran, in order

    control = enginefarm.filters.control_from(photo, "canny")  # or a preprocessor's name in the store

Each filter is given by its name in the store (loaded, run and closed here) or as a filter already loaded (run and
left open, for an app that keeps them). A flagged image is blurred (Easy Diffusion's choice, the default), made
black (diffusers' choice) or refused (`image` None); face fixing and upscaling are skipped for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from enginefarm.errors import ConfigError

from .base import Filter

if TYPE_CHECKING:
    from enginefarm.cache.progress import ProgressLike

ON_FLAGGED = ("blur", "black", "refuse")
# Easy Diffusion (sdkit's nsfw_checker) blurs a flagged image with PIL's GaussianBlur(75): a 75-pixel sigma.
BLUR_SIGMA = 75.0


@dataclass
class Filtered:
    """What `apply` made: the image (None when a flagged image was refused), whether the safety check flagged it
    and its scores, the filters that ran in order ("safety", "face_fix", "upscale", "blur"…), seconds per step."""

    image: np.ndarray | None
    flagged: bool = False
    scores: dict[str, Any] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def apply(
    image: np.ndarray,
    *,
    safety: str | Filter | None = None,
    face_fix: str | Filter | None = None,
    upscale: str | Filter | None = None,
    on_flagged: str = "blur",
    face_strength: float = 1.0,
    tile: int | None = None,
    upscale_by: float | None = None,
    store: str | None = None,
    precision: str | None = None,
    target: str | None = None,
    device: str = "auto",
    progress: ProgressLike = None,
) -> Filtered:
    """Run the filters given on one image, in Easy Diffusion's order: safety check → face fix → upscale.

    Each filter is a name in the store (loaded for this call and closed after it) or a loaded `Filter`.

    Args:
        image: float [H, W, 3] in [0, 1].
        safety: A safety checker; a flagged image gets `on_flagged` and no face fix or upscale.
        face_fix: A face restorer.
        upscale: An upscaler.
        on_flagged: "blur" (Easy Diffusion's), "black" (diffusers') or "refuse" (`Filtered.image` is None).
        face_strength: 1 pastes the restored faces whole, as Easy Diffusion's GFPGAN does; 0 keeps the image.
        tile: Upscale in tiles of this many pixels (large images in little memory); default whole.
        upscale_by: Another factor than the model's (2 with an x4 model, resized with Lanczos), as Easy
            Diffusion's "upscale by".
        store: Where the names are loaded from, with `precision`, `target`, `device` and `progress` as
            `enginefarm.filters.load` takes them.
        precision: See `enginefarm.filters.load`.
        target: See `enginefarm.filters.load`.
        device: See `enginefarm.filters.load`.
        progress: See `enginefarm.filters.load`.

    Returns:
        The image, whether it was flagged (and the scores), the filters that ran and their seconds.

    Raises:
        ConfigError: An image that is not [H, W, 3], an unknown `on_flagged`, a name the store lacks or a filter of
            another kind, in one line.
    """
    if on_flagged not in ON_FLAGGED:
        raise ConfigError(f"on_flagged={on_flagged!r}", hint=f"use one of {', '.join(ON_FLAGGED)}")
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ConfigError(f"filters take one image [H, W, 3], got shape {list(image.shape)}", hint="apply per image")
    options = dict(store=store, precision=precision, target=target, device=device, progress=progress)
    done = Filtered(image)
    if safety is not None:
        with _opened(safety, "safety_checker", "--safety", options) as checker:
            started = time.perf_counter()
            done.flagged, done.scores = checker(image)
            _ran(done, "safety", started)
        if done.flagged:
            started = time.perf_counter()
            if on_flagged == "refuse":
                done.image = None
            else:
                done.image = blur(image) if on_flagged == "blur" else np.zeros_like(image)
                _ran(done, on_flagged, started)
            return done
    if face_fix is not None:
        with _opened(face_fix, "face_restorer", "--face-fix", options) as restorer:
            started = time.perf_counter()
            done.image = restorer(done.image, strength=face_strength)
            _ran(done, "face_fix", started)
    if upscale is not None:
        with _opened(upscale, "upscaler", "--upscale", options) as upscaler:
            started = time.perf_counter()
            done.image = upscaler(done.image, tile=tile, outscale=upscale_by)
            _ran(done, "upscale", started)
    return done


def control_from(
    image: np.ndarray,
    source: str | Filter,
    *,
    low: float = 100,
    high: float = 200,
    detect_resolution: int | None = None,
    store: str | None = None,
    precision: str | None = None,
    target: str | None = None,
    device: str = "auto",
    progress=None,
    safe: bool = False,
    scribble: bool = False,
    seed: int | None = None,
) -> np.ndarray:
    """A ControlNet's control image float32 [H, W, 3] in [0, 1] from a photo float [H, W, 3]: `source` "canny"
    (numpy, thresholds `low`/`high` as cv2.Canny's) or a preprocessor filter (its name in the store, or loaded).
    A soft-edge filter takes the modes `safe`/`scribble`, or in the name: `NAME:scribble,safe`, or Easy
    Diffusion's names (`softedge_pidsafe`, `scribble_hed`…: the filters `pidinet`, `hed`; filters/softedge.py).
    "shuffle" needs no network either: the photo's content shuffled by `seed`'s smooth noise (filters/shuffle.py)."""
    if isinstance(source, str) and source == "canny":
        from .canny import canny_control

        return canny_control(image, low, high)
    if isinstance(source, str) and source == "shuffle":
        from .shuffle import content_shuffle

        return content_shuffle(np.asarray(image, np.float32)[:, :, :3], seed)
    options = dict(store=store, precision=precision, target=target, device=device, progress=progress)
    if isinstance(source, str):
        from .openpose_names import POSE_NAMES, named_pose_control

        if source in POSE_NAMES:  # Easy Diffusion's openpose_face, _faceonly, _full: two or three filters at once
            return named_pose_control(image, source, detect_resolution, **options)
        from .softedge import control_source

        source, named_safe, named_scribble = control_source(source)
        safe, scribble = safe or named_safe, scribble or named_scribble
    with _opened(source, "preprocessor", "--control-from", options) as preprocessor:
        modes = {"safe": True} if safe else {}
        if scribble:
            modes["scribble"] = True
        return preprocessor(image, detect_resolution=detect_resolution, **modes)


def blur(image: np.ndarray, sigma: float = BLUR_SIGMA) -> np.ndarray:
    """A separable Gaussian blur of `image` [H, W, C], its weights renormalised at the borders (no dark rim)."""
    rows, cols = _gaussian(image.shape[0], sigma), _gaussian(image.shape[1], sigma)
    out = np.einsum("hy,yxc->hxc", rows, image.astype(np.float64), optimize=True)
    return np.einsum("wx,hxc->hwc", cols, out, optimize=True).astype(np.float32)


def _gaussian(size: int, sigma: float) -> np.ndarray:
    offsets = np.arange(size)[:, None] - np.arange(size)[None, :]
    weights = np.exp(-0.5 * (offsets / sigma) ** 2)
    return weights / weights.sum(axis=1, keepdims=True)


def _ran(done: Filtered, step: str, started: float) -> None:
    done.ran.append(step)
    done.timings[step] = time.perf_counter() - started


class _opened:
    """A filter for one use: loaded by name (and closed after), or the caller's loaded one (left open); either
    checked to be of `kind`, `option` naming the setting in messages."""

    def __init__(self, given: str | Filter, kind: str, option: str, options: dict):
        self.given, self.kind, self.option, self.options = given, kind, option, options
        self.loaded: Filter | None = None

    def __enter__(self) -> Any:
        given = self.given
        if isinstance(given, str):
            given = self.loaded = load_named(given, self.option, **self.options)
        if given.kind != self.kind:
            self.__exit__()
            raise ConfigError(
                f"{self.option} {given.name}: {_a(given.kind)}, not {_a(self.kind)}",
                hint=f"give {self.option} the name of {_a(self.kind)} filter",
            )
        return given

    def __exit__(self, *exc) -> None:
        if self.loaded is not None:
            self.loaded.close()


def find(name: str, kind: str, option: str, *, store: str | None = None, device: str = "auto", progress=None):
    """The FilterInfo of `name` in the store, checked to be of `kind`, without loading its engines: what a command
    checks before it generates anything. One ConfigError line when it is missing or of another kind."""
    from enginefarm.errors import UnknownModelError
    from enginefarm.runner.request import Request

    from .info import FilterInfo
    from .loading import fetch_filter_assets

    try:
        info = FilterInfo.from_folder(fetch_filter_assets(Request(name, device=device, store=store), progress), name)
    except UnknownModelError as exc:
        raise _missing(name, option, exc) from None
    if info.kind != kind:
        raise ConfigError(
            f"{option} {name}: {_a(info.kind)}, not {_a(kind)}",
            hint=f"give {option} the name of {_a(kind)} filter",
        )
    return info


def _a(kind: str) -> str:
    """The kind as a message says it: "an upscaler", "a face restorer"."""
    words = kind.replace("_", " ")
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _missing(name: str, option: str, exc) -> ConfigError:
    near = f"; did you mean {exc.closest}?" if exc.closest else ""
    return ConfigError(
        f"{option} {name}: {name} is not in the store{near}",
        hint="build its recipe: `enginefarm export FILE --out DIR`, then `enginefarm build DIR/recipe.toml --store "
        "STORE`",
    )


def load_named(name: str, option: str = "filter", **options) -> Filter:
    """`enginefarm.filters.load(name, **options)`, a name the store lacks said in one line."""
    from enginefarm.errors import UnknownModelError

    from .loading import load

    try:
        return load(name, **options)
    except UnknownModelError as exc:
        raise _missing(name, option, exc) from None
