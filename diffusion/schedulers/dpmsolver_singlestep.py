"""DPM-Solver singlestep (Lu et al. 2022): each second- (third-) order step spends two (three) model evaluations
between two points of the schedule, the first ones landing on intermediate points with first-order updates. Easy
Diffusion's "dpmpp_2s_a" is this class with Karras sigmas.

Like diffusers, every `step` is one model evaluation: the solver order of each evaluation follows a fixed pattern
(1, 2, 1, 2, ... for order 2), an order-k evaluation finishing the step that began k - 1 evaluations earlier.
"""

from __future__ import annotations

import numpy as np

from .base import F32
from .config import require
from .log_snr import LogSNRScheduler, first_order_update, second_order_update, third_order_update


class DPMSolverSinglestepScheduler(LogSNRScheduler):
    name = "DPMSolverSinglestepScheduler"
    defaults = {"lower_order_final": False}
    # diffusers' class has none of these: always linspace, no zero-SNR rescale
    ignored = {"timestep_spacing": "linspace", "rescale_betas_zero_snr": False, "euler_at_final": False}

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "algorithm_type", ("dpmsolver++", "sde-dpmsolver++", "dpmsolver"))
        require(cfg, self.name, "solver_type", ("midpoint", "heun"))
        require(cfg, self.name, "solver_order", (1, 2, 3))
        require(cfg, self.name, "final_sigmas_type", ("zero", "sigma_min"))
        require(cfg, self.name, "variance_type", (None,))
        if cfg.algorithm_type == "dpmsolver":
            # diffusers refuses the first; its thresholding on the noise prediction fails (it indexes by None)
            require(cfg, self.name, "final_sigmas_type", ("sigma_min",))
            require(cfg, self.name, "thresholding", (False,))

    def _timesteps_for(self, steps):
        cfg = self.config
        lambdas = np.log(self.alphas_cumprod**0.5) - np.log((1 - self.alphas_cumprod) ** 0.5)
        top = cfg.num_train_timesteps - int(np.searchsorted(lambdas[::-1], cfg.lambda_min_clipped))
        timesteps = self._spaced(steps, "linspace", top)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            sigmas, timesteps = self._converted(steps)
        else:
            sigmas = self._interpolated(timesteps)
        last = self._smallest_train_sigma() if cfg.final_sigmas_type == "sigma_min" else 0.0
        self.sigmas = np.concatenate([sigmas, [last]]).astype(F32)
        if not cfg.lower_order_final and (steps % cfg.solver_order or cfg.final_sigmas_type == "zero"):
            # diffusers switches it on for good (register_to_config) when the steps do not divide into full steps
            self.config = cfg = cfg.replace(lower_order_final=True)
        self._orders = _orders(steps, cfg.solver_order, cfg.lower_order_final, cfg.final_sigmas_type == "zero")
        return timesteps.astype(np.int64)

    def _reset(self):
        self._outputs: list[np.ndarray | None] = [None] * self.config.solver_order
        self._start: np.ndarray | None = None  # the latent this multi-evaluation step started from

    def _step(self, model_output, x, noise):
        cfg = self.config
        m = self._x0(model_output, x) if cfg.algorithm_type != "dpmsolver" else self._eps(model_output, x)
        self._outputs = self._outputs[1:] + [m]
        if cfg.algorithm_type == "sde-dpmsolver++":
            noise = self._noise_like(x, noise)
        order = self._orders[self._index]
        while self._outputs[-order] is None:  # img2img may start mid-pattern
            order -= 1
        if order == 1:
            self._start = x
        start, ms = self._start, self._outputs
        if order == 1:
            s, t = self._points(0, 1)
            x_prev = first_order_update(cfg.algorithm_type, start, s, t, m, noise)
        elif order == 2:
            s1, s0, t = self._points(-1, 0, 1)
            r0 = (s0[2] - s1[2]) / (t[2] - s1[2])
            d1 = (1.0 / r0) * (ms[-1] - ms[-2])
            x_prev = second_order_update(cfg.algorithm_type, cfg.solver_type, start, s1, t, ms[-2], d1, noise)
        else:
            x_prev = self._third_order(start, noise)
        return x_prev.astype(F32)

    def _third_order(self, start, noise):
        cfg = self.config
        s2, s1, s0, t = self._points(-2, -1, 0, 1)
        m0, m1, m2 = self._outputs[-1], self._outputs[-2], self._outputs[-3]
        h = t[2] - s2[2]
        r0, r1 = (s0[2] - s2[2]) / h, (s1[2] - s2[2]) / h
        d1_0, d1_1 = (1.0 / r1) * (m1 - m2), (1.0 / r0) * (m0 - m2)
        if cfg.solver_type == "midpoint":
            # the midpoint third-order step weighs the last difference as a Heun second-order step does
            return second_order_update(cfg.algorithm_type, "heun", start, s2, t, m2, d1_1, noise)
        d1 = (r0 * d1_0 - r1 * d1_1) / (r0 - r1)
        d2 = 2.0 * (d1_1 - d1_0) / (r0 - r1)
        return third_order_update(cfg.algorithm_type, start, s2, t, m2, d1, d2, noise)


def _orders(steps: int, order: int, lower_order_final: bool, final_is_zero: bool) -> list[int]:
    """The solver order of each evaluation, as diffusers' get_order_list."""
    if lower_order_final:
        cycles, rest = divmod(steps, order)
        if order == 1:
            orders = [1] * steps
        elif rest == 0:
            orders = list(range(1, order + 1)) * (cycles - 1) + list(range(1, order)) + [1]
        else:
            orders = list(range(1, order + 1)) * cycles + list(range(1, rest + 1))
    else:
        orders = list(range(1, order + 1)) * (steps // order)
    if final_is_zero:
        orders[-1] = 1
    return orders
