"""`Source`: where a diffusers tensor lives in an original layout, and how its value differs; shared by the layouts
of `layouts.py` and `transformer_layouts.py`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Source:
    """Where a diffusers tensor lives in the original layout, and how its value differs."""

    key: str
    # (start, stop, n): rows start..stop of n equal units along axis 0 (OpenCLIP's in_proj and MMDiT's qkv: (1, 2, 3)
    # is k; Flux's single-block linear1 is q, k, v and an MLP four units wide: (3, 7, 7) is the MLP)
    take: tuple[int, int, int] | None = None
    transpose: bool = False  # OpenCLIP's text_projection is [width, projection], applied as x @ P
    squeeze: bool = False  # the VAE's mid attention: 1×1 convolutions [C, C, 1, 1] for diffusers' Linear [C, C]
    swap: bool = (
        False  # the original's (shift, scale) halves along axis 0 are diffusers' (scale, shift): the final adaLN
    )

    def shape(self, original: tuple[int, ...]) -> tuple[int, ...]:
        shape = tuple(original)
        if self.take is not None:
            start, stop, n = self.take
            shape = (shape[0] // n * (stop - start), *shape[1:])
        if self.transpose:
            shape = shape[::-1]
        if self.squeeze:
            shape = shape[:2]
        return shape

    def convert(self, value):
        """The original tensor (a numpy array) as diffusers holds it."""
        if self.take is not None:
            start, stop, n = self.take
            unit = value.shape[0] // n
            value = value[start * unit : stop * unit]
        if self.swap:
            half = value.shape[0] // 2
            value = np.concatenate([value[half:], value[:half]])
        if self.transpose:
            value = value.T
        if self.squeeze:
            value = value.reshape(value.shape[:2])
        return value
