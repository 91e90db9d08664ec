"""UniPC multistep (Zhao et al. 2023): a predictor (UniP) extrapolates from the previous model outputs, then at the
next evaluation a corrector (UniC) refines the latent the predictor produced, using the new output, at no extra model
cost. solver_type "bh1" or "bh2" picks the B(h) function of the paper; predict_x0 whether it integrates the clean
sample (default) or the noise prediction. Easy Diffusion's "unipc_tu" (bh2) and "unipc_tu_2" (bh1) are this class."""

from __future__ import annotations

import math

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32
from .config import require
from .log_snr import LogSNRScheduler


class UniPCMultistepScheduler(LogSNRScheduler):
    name = "UniPCMultistepScheduler"
    defaults = {"solver_type": "bh2"}
    karras_range_from_config = True

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "final_sigmas_type", ("zero", "sigma_min"))
        require(cfg, self.name, "shift_terminal", (None,))  # diffusers: only with flow sigmas
        if cfg.solver_order < 1:
            raise ConfigError(f"{self.name}: solver_order must be at least 1", hint="UniPC's default is 2")
        if cfg.extra.get("solver_p") is not None:
            raise ConfigError(f"{self.name}: a solver_p scheduler is not supported", hint="remove solver_p")
        if cfg.solver_type in ("midpoint", "heun", "logrho"):  # as diffusers: other solvers' names mean bh2
            self.config = cfg = cfg.replace(solver_type="bh2")
        require(cfg, self.name, "solver_type", ("bh1", "bh2"))
        if cfg.final_sigmas_type == "zero" and (cfg.solver_type == "bh1" or not cfg.predict_x0):
            # the last step's coefficients are inf * 0 there: diffusers returns NaN
            raise ConfigError(
                f"{self.name}: solver_type {cfg.solver_type!r} with predict_x0={cfg.predict_x0} cannot end at sigma 0",
                hint="set final_sigmas_type to 'sigma_min', or use solver_type 'bh2' with predict_x0",
            )

    def _schedule(self, steps, strength):
        timesteps, begin = super()._schedule(steps, strength)
        cfg = self.config
        if cfg.final_sigmas_type == "zero" and not cfg.lower_order_final and len(timesteps) - begin > 1:
            # a multistep last step to sigma 0 divides by zero: diffusers returns NaN or fails to solve
            raise ConfigError(
                f"{self.name}: without lower_order_final the last step cannot end at sigma 0",
                hint="set lower_order_final, or final_sigmas_type to 'sigma_min'",
            )
        return timesteps, begin

    def _timesteps_for(self, steps):
        cfg = self.config
        timesteps = self._spaced(steps, cfg.timestep_spacing)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            sigmas, timesteps = self._converted(steps)
            last = sigmas[-1]
        else:
            sigmas = self._interpolated(timesteps)
            last = self._smallest_train_sigma()
        self.sigmas = np.concatenate([sigmas, [last if cfg.final_sigmas_type == "sigma_min" else 0.0]]).astype(F32)
        return timesteps.astype(np.int64)

    def _reset(self):
        self._history: list[np.ndarray] = []
        self._lower_order_nums = 0
        self._last_sample: np.ndarray | None = None
        self._this_order = 1

    def _step(self, model_output, x, noise):
        cfg, i = self.config, self._index
        converted = self._x0(model_output, x) if cfg.predict_x0 else self._eps(model_output, x)
        if i > 0 and i - 1 not in cfg.disable_corrector and self._last_sample is not None:
            x = self._correct(converted, self._last_sample, self._this_order)
        self._history = (self._history + [converted])[-cfg.solver_order :]
        order = min(cfg.solver_order, len(self._all_timesteps) - i) if cfg.lower_order_final else cfg.solver_order
        self._this_order = min(order, self._lower_order_nums + 1)  # warm-up: no more history than steps run
        self._last_sample = x
        x_prev = self._predict(x, self._this_order)
        self._lower_order_nums = min(self._lower_order_nums + 1, cfg.solver_order)
        return x_prev.astype(F32)

    def _predict(self, x, order):
        """UniP: from x at sigmas[index] to sigmas[index + 1], extrapolating the last `order` outputs."""
        base, scale, diffs, b, r = self._terms(x, 0, order)
        if not diffs:
            return base
        rhos = np.array([0.5], F32) if order == 2 else np.linalg.solve(r[:-1, :-1], b[:-1]).astype(F32)
        return base - scale * _weighted(rhos, diffs)

    def _correct(self, this_output, last_sample, order):
        """UniC: redo the last step from `last_sample` with the output just computed at its end."""
        base, scale, diffs, b, r = self._terms(last_sample, -1, order)
        rhos = np.array([0.5], F32) if order == 1 else np.linalg.solve(r, b).astype(F32)
        correction = rhos[-1] * (this_output - self._history[-1])
        if diffs:
            correction = _weighted(rhos[:-1], diffs) + correction
        return base - scale * correction

    def _terms(self, x, offset, order):
        """The step from sigmas[index + offset] to the next sigma: the first-order result, the factor of the
        higher-order part, the outputs' scaled differences and the linear system for their weights."""
        (a_s0, s_s0, l_s0), (a_t, s_t, l_t) = self._points(offset, offset + 1)
        m0 = self._history[-1]
        h = l_t - l_s0
        if h == 0:  # Karras sigmas ending at sigma_min repeat the last sigma: the step is the identity
            return x, F32(0), [], np.zeros(order, F32), np.eye(order, dtype=F32)
        rks, diffs = [], []
        for k in range(1, order):
            l_sk = self._points(offset - k)[0][2]
            rk = (l_sk - l_s0) / h
            rks.append(rk)
            diffs.append((self._history[-(k + 1)] - m0) / rk)
        rks.append(F32(1.0))
        hh = -h if self.config.predict_x0 else h
        h_phi_1 = np.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        b_h = hh if self.config.solver_type == "bh1" else np.expm1(hh)
        r = np.stack([np.array(rks, F32) ** (k - 1) for k in range(1, order + 1)])
        b = []
        for k in range(1, order + 1):
            b.append(h_phi_k * math.factorial(k) / b_h)
            h_phi_k = h_phi_k / hh - 1 / math.factorial(k + 1)
        if self.config.predict_x0:
            base, scale = s_t / s_s0 * x - a_t * h_phi_1 * m0, a_t * b_h
        else:
            base, scale = a_t / a_s0 * x - s_t * h_phi_1 * m0, s_t * b_h
        return base, scale, diffs, np.array(b, F32), r


def _weighted(weights: np.ndarray, arrays: list[np.ndarray]) -> np.ndarray:
    return sum((w * a for w, a in zip(weights, arrays, strict=True)), np.zeros_like(arrays[0]))
