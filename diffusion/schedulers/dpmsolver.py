"""DPM-Solver multistep (Lu et al. 2022): "DPM++ 2M" (dpmsolver++, solver_order 2), "DPM++ 2M Karras" with Karras
sigmas, DPM++ 2M SDE (sde-dpmsolver++), and the original DPM-Solver (algorithm_type "dpmsolver", on the noise
prediction; Easy Diffusion's "dpm_solver_stability"). It steps exactly in log-SNR (lambda), reusing the previous steps'
predictions for the higher-order terms."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32
from .config import require
from .log_snr import LogSNRScheduler, alpha_sigma, first_order_update, second_order_update, third_order_update
from .noise_schedule import threshold


class DPMSolverMultistepScheduler(LogSNRScheduler):
    name = "DPMSolverMultistepScheduler"

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "algorithm_type", ("dpmsolver++", "sde-dpmsolver++", "dpmsolver"))
        require(cfg, self.name, "solver_type", ("midpoint", "heun"))
        require(cfg, self.name, "solver_order", (1, 2) if cfg.algorithm_type == "sde-dpmsolver++" else (1, 2, 3))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "final_sigmas_type", ("zero", "sigma_min"))
        require(cfg, self.name, "variance_type", (None,))
        require(cfg, self.name, "use_lu_lambdas", (False,))
        if cfg.algorithm_type == "dpmsolver" and cfg.final_sigmas_type == "zero":
            raise ConfigError(
                f"{self.name}: algorithm_type 'dpmsolver' cannot end at sigma 0 (final_sigmas_type 'zero')",
                hint="set final_sigmas_type to 'sigma_min', as diffusers asks",
            )

    def _timesteps_for(self, steps):
        cfg = self.config
        # lambda_min_clipped (for cosine schedules) cuts off the noisiest training timesteps
        lambdas = np.log(self.alphas_cumprod**0.5) - np.log((1 - self.alphas_cumprod) ** 0.5)
        top = cfg.num_train_timesteps - int(np.searchsorted(lambdas[::-1], cfg.lambda_min_clipped))
        timesteps = self._spaced(steps, cfg.timestep_spacing, top)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            sigmas, timesteps = self._converted(steps, round_karras=cfg.beta_schedule != "squaredcos_cap_v2")
        else:
            sigmas = self._interpolated(timesteps)
        last = self._smallest_train_sigma() if cfg.final_sigmas_type == "sigma_min" else 0.0
        self.sigmas = np.concatenate([sigmas, [last]]).astype(F32)
        return timesteps.astype(np.int64)

    def _reset(self):
        self._history: list[np.ndarray] = []
        self._lower_order_nums = 0

    def _step(self, model_output, x, noise):
        cfg, i, n = self.config, self._index, len(self._all_timesteps)
        few_steps = cfg.lower_order_final and n < 15  # higher orders are unstable with few steps
        last_is_first_order = i == n - 1 and (cfg.euler_at_final or few_steps or cfg.final_sigmas_type == "zero")
        second_to_last = i == n - 2 and few_steps
        self._history = (self._history + [self._converted_output(model_output, x)])[-cfg.solver_order :]
        if cfg.algorithm_type == "sde-dpmsolver++":
            noise = self._noise_like(x, noise)
        if cfg.solver_order == 1 or self._lower_order_nums < 1 or last_is_first_order:
            s, t = self._points(0, 1)
            x_prev = first_order_update(cfg.algorithm_type, x, s, t, self._history[-1], noise)
        elif cfg.solver_order == 2 or self._lower_order_nums < 2 or second_to_last:
            x_prev = self._second_order(x, noise)
        else:
            x_prev = self._third_order(x)
        self._lower_order_nums = min(self._lower_order_nums + 1, cfg.solver_order)
        return x_prev.astype(F32)

    def _converted_output(self, model_output, x):
        """What the algorithm integrates: the clean-sample prediction, or for "dpmsolver" the noise prediction
        (thresholded through the clean sample when the config asks)."""
        if self.config.algorithm_type != "dpmsolver":
            return self._x0(model_output, x)
        eps = self._eps(model_output, x)
        if not self.config.thresholding:
            return eps
        alpha, sigma = alpha_sigma(self.sigmas[self._index])
        x0 = threshold((x - sigma * eps) / alpha, self.config)
        return (x - alpha * x0) / sigma

    def _second_order(self, x, noise):
        s0, t, s1 = self._points(0, 1, -1)
        m0, m1 = self._history[-1], self._history[-2]
        h, h0 = t[2] - s0[2], s0[2] - s1[2]
        d1 = (1.0 / (h0 / h)) * (m0 - m1)
        return second_order_update(self.config.algorithm_type, self.config.solver_type, x, s0, t, m0, d1, noise)

    def _third_order(self, x):
        s0, t, s1, s2 = self._points(0, 1, -1, -2)
        m0, m1, m2 = self._history[-1], self._history[-2], self._history[-3]
        h, h0, h1 = t[2] - s0[2], s0[2] - s1[2], s1[2] - s2[2]
        r0, r1 = h0 / h, h1 / h
        d1_0, d1_1 = (1.0 / r0) * (m0 - m1), (1.0 / r1) * (m1 - m2)
        d1 = d1_0 + r0 / (r0 + r1) * (d1_0 - d1_1)
        d2 = 1.0 / (r0 + r1) * (d1_0 - d1_1)
        return third_order_update(self.config.algorithm_type, x, s0, t, m0, d1, d2)
