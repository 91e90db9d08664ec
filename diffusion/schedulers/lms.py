"""LMS: k-diffusion's linear multistep sampler. Each step integrates, over [sigma_i, sigma_i+1], the polynomial
through the last (up to 4) slopes dx/dsigma; the integrals of its Lagrange basis are the step's coefficients.

diffusers integrates each basis polynomial numerically (scipy's quad); a polynomial's integral is exact in closed
form, so ours needs no scipy and agrees to float rounding."""

from __future__ import annotations

import numpy as np
from numpy.polynomial import polynomial

from .base import F32
from .k_sigmas import KSigmaScheduler

MAX_ORDER = 4  # diffusers' default `order` argument of LMSDiscreteScheduler.step


class LMSDiscreteScheduler(KSigmaScheduler):
    name = "LMSDiscreteScheduler"
    karras_range_from_config = False

    def _timesteps_for(self, steps):
        timesteps, sigmas = self._base_schedule(steps)
        self.sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        return timesteps.astype(F32)

    def _reset(self):
        self._slopes: list[np.ndarray] = []

    def _step(self, model_output, x, noise):
        i = self._index
        sigma = self.sigmas[i]
        self._slopes = (self._slopes + [(x - self._x0(model_output, x, sigma)) / sigma])[-MAX_ORDER:]
        # diffusers sizes the polynomial by the absolute step index, also after img2img's cut, where fewer slopes
        # exist than nodes: only the newest slopes' coefficients are used then (zip stops at the shorter list)
        order = min(i + 1, MAX_ORDER)
        update = sum(
            F32(lms_coefficient(self.sigmas, i, order, k)) * slope
            for k, slope in enumerate(reversed(self._slopes[-order:]))
        )
        return (x + update).astype(F32)


def lms_coefficient(sigmas: np.ndarray, i: int, order: int, k: int) -> float:
    """Integral over [sigmas[i], sigmas[i+1]] of the Lagrange basis polynomial that is 1 at sigmas[i-k] and 0 at the
    other nodes sigmas[i], ..., sigmas[i-order+1]."""
    origin = float(sigmas[i])  # integrate in tau - sigmas[i]: small numbers, no cancellation
    nodes = [float(sigmas[i - j]) - origin for j in range(order)]
    others = [s for j, s in enumerate(nodes) if j != k]
    basis = polynomial.polyfromroots(others) / np.prod([nodes[k] - s for s in others]) if others else np.ones(1)
    return float(polynomial.polyval(float(sigmas[i + 1]) - origin, polynomial.polyint(basis)))
