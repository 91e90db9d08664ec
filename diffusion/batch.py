"""More than one image per call (`num_images_per_prompt`): each image's noise from its own seed, the conditioning
repeated per image, and the denoiser's batch cut into calls its engine's profile takes.

Image i of a batch is the image a one-image call with seed + i makes (Easy Diffusion's convention): its start noise
comes from `default_rng(seed + i)` and its scheduler's fresh noise from `default_rng([seed + i, 1])`, the streams a
one-image call draws from, so a batch never shifts one image's draws onto another's."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import cast, overload

import numpy as np

from enginefarm.errors import ConfigError

from .denoiser import BoundDenoiser
from .prompts import TextConditioning

BATCHED_LATENT = ("sample", "hidden_states")  # the denoiser input whose first axis is the batch


class SeedNoise:
    """Gaussian draws for a batch, image i's from its own generator: `standard_normal((N, ...))` stacks N draws of
    shape (...), each exactly what a one-image call's generator draws for (1, ...); schedulers take it as `rng`."""

    def __init__(self, seeds: list[int], stream: int | None = None) -> None:
        self.generators = [np.random.default_rng(s if stream is None else [s, stream]) for s in seeds]

    def standard_normal(self, shape, dtype=np.float64) -> np.ndarray:
        shape = tuple(shape)
        if not shape or shape[0] != len(self.generators):
            raise ValueError(f"a draw of shape {shape} for a batch of {len(self.generators)}")
        return np.stack([g.standard_normal(shape[1:], dtype=dtype) for g in self.generators])

    def __getattr__(self, name: str):  # any other draw: one image's generator, as before batches existed
        if len(self.generators) == 1:
            return getattr(self.generators[0], name)
        raise AttributeError(f"SeedNoise draws standard_normal only (asked for {name!r} with a batch)")


def noise_streams(seeds: list[int], stream: int | None = None) -> np.random.Generator:
    """The generator a call draws from: one image's own `default_rng(seed)` (or `[seed, stream]`), as before batches
    existed; for a batch, a `SeedNoise` over every image's (duck-typed: schedulers call `standard_normal` only)."""
    if len(seeds) == 1:
        return np.random.default_rng(seeds[0] if stream is None else [seeds[0], stream])
    return cast(np.random.Generator, SeedNoise(seeds, stream))


def seeds_for(seed: int, count: int) -> list[int]:
    """The seed of each image of a batch: seed, seed + 1, …"""
    return [seed + i for i in range(count)]


def check_count(count) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ConfigError(f"num_images_per_prompt={count!r}", hint="use a whole number of images, 1 or more")
    return int(count)


@overload
def per_image(array: np.ndarray, count: int) -> np.ndarray: ...
@overload
def per_image(array: None, count: int) -> None: ...
def per_image(array: np.ndarray | None, count: int) -> np.ndarray | None:
    """Rows repeated per image, in order: [negative, positive] → [negative × N, positive × N] (diffusers' layout
    under classifier-free guidance: the unconditional half first)."""
    if array is None or count == 1:
        return array
    return np.repeat(array, count, axis=0)


def per_image_text(text: TextConditioning, count: int) -> TextConditioning:
    """A prompt's conditioning ([negative, positive] or [positive]) for N images: each row repeated N times."""
    if count == 1:
        return text
    return dataclasses.replace(
        text,
        hidden=per_image(text.hidden, count),
        pooled=per_image(text.pooled, count),
        mask=per_image(text.mask, count),
    )


def row_limit(sessions) -> int | None:
    """The largest batch every session of a denoising step takes (its profile's max of the latent input), or None
    where a profile does not say."""
    limits = []
    for session in sessions:
        artifact = getattr(session, "artifact", None)
        profile = getattr(artifact, "profile", None) or {}
        for name in BATCHED_LATENT:
            if name in profile:
                limits.append(int(profile[name]["max"][0]))
    return min(limits) if limits else None


class ChunkedDenoiser:
    """The denoiser over a batch of rows, in calls of at most `rows` rows each (the engine's profile, or less).

    Every input whose first axis is the batch is cut the same way. Each chunk keeps its own binding of the inputs fixed
    over the loop (its rows of the text states), so a one-chunk batch runs exactly as a one-image call did."""

    def __init__(self, session, bind: bool, rows: int | None) -> None:
        self._session, self._bind, self._rows = session, bind, rows
        self._bound: dict[tuple[int, int], BoundDenoiser] = {}
        self._closing = contextlib.ExitStack()

    def __call__(self, feeds: dict[str, np.ndarray], run=None) -> np.ndarray:
        """The output for all rows. `run(feeds) -> output` replaces the bound session (the ControlNet's two calls)."""
        total = next(feeds[n] for n in BATCHED_LATENT if n in feeds).shape[0]
        step = total if self._rows is None else max(1, self._rows)
        outputs = []
        for start in range(0, total, step):
            stop = min(start + step, total)
            part = feeds if (start, stop) == (0, total) else _rows(feeds, start, stop, total)
            outputs.append(run(part) if run is not None else self._denoiser(start, stop)(part))
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def _denoiser(self, start: int, stop: int) -> BoundDenoiser:
        key = (start, stop)
        if key not in self._bound:
            self._bound[key] = self._closing.enter_context(BoundDenoiser(self._session, self._bind))
        return self._bound[key]

    def close(self) -> None:
        self._bound.clear()
        self._closing.close()

    def __enter__(self) -> ChunkedDenoiser:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _rows(feeds: dict[str, np.ndarray], start: int, stop: int, total: int) -> dict[str, np.ndarray]:
    return {n: v[start:stop] if np.ndim(v) and np.shape(v)[0] == total else v for n, v in feeds.items()}
