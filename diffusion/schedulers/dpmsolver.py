"""DPM-Solver++ multistep (Lu et al. 2022): "DPM++ 2M" (solver_order 2), "DPM++ 2M Karras" with Karras sigmas,
and DPM++ 2M SDE (algorithm_type "sde-dpmsolver++"). It predicts x0 and steps exactly in log-SNR (lambda), reusing the
previous steps' predictions for the higher-order terms."""

from __future__ import annotations

import numpy as np

from .base import F32, Scheduler
from .config import require
from .noise_schedule import exponential_sigmas, karras_sigmas, sigma_to_t, threshold, train_alphas_cumprod, train_sigmas


class DPMSolverMultistepScheduler(Scheduler):
    name = "DPMSolverMultistepScheduler"

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "algorithm_type", ("dpmsolver++", "sde-dpmsolver++"))
        require(cfg, self.name, "solver_type", ("midpoint", "heun"))
        require(cfg, self.name, "solver_order", (1, 2, 3) if cfg.algorithm_type == "dpmsolver++" else (1, 2))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "final_sigmas_type", ("zero", "sigma_min"))
        require(cfg, self.name, "variance_type", (None,))
        for flag in ("use_beta_sigmas", "use_lu_lambdas", "use_flow_sigmas", "use_dynamic_shifting"):
            require(cfg, self.name, flag, (False,))
        require(cfg, self.name, "use_exponential_sigmas", (False,) if cfg.use_karras_sigmas else (False, True))
        self.alphas_cumprod = train_alphas_cumprod(cfg)
        if cfg.rescale_betas_zero_snr:
            self.alphas_cumprod[-1] = 2.0**-24
        self._train_sigmas = train_sigmas(self.alphas_cumprod)
        self.sigmas = self._train_sigmas.copy()
        self._reset()

    def _timesteps_for(self, steps):
        cfg, n = self.config, self.config.num_train_timesteps
        # lambda_min_clipped (for cosine schedules) cuts off the noisiest training timesteps
        lambdas = np.log(self.alphas_cumprod**0.5) - np.log((1 - self.alphas_cumprod) ** 0.5)
        top = n - int(np.searchsorted(lambdas[::-1], cfg.lambda_min_clipped))
        if cfg.timestep_spacing == "linspace":
            timesteps = np.linspace(0, top - 1, steps + 1).round()[::-1][:-1].astype(np.int64)
        elif cfg.timestep_spacing == "leading":
            timesteps = (np.arange(steps + 1) * (top // (steps + 1)))[::-1][:-1].astype(np.int64) + cfg.steps_offset
        else:
            timesteps = np.arange(top, 0, -n / steps).round().astype(np.int64) - 1
        log_sigmas = np.log(self._train_sigmas)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            convert = karras_sigmas if cfg.use_karras_sigmas else exponential_sigmas
            # unlike Euler, the range is the whole training schedule's
            sigmas = convert(float(self._train_sigmas[0]), float(self._train_sigmas[-1]), steps)
            timesteps = sigma_to_t(sigmas, log_sigmas)
            if cfg.use_karras_sigmas and cfg.beta_schedule != "squaredcos_cap_v2":
                timesteps = timesteps.round()
        else:
            sigmas = np.interp(timesteps, np.arange(len(self._train_sigmas)), self._train_sigmas)
        if cfg.final_sigmas_type == "sigma_min":
            last = ((1 - self.alphas_cumprod[0]) / self.alphas_cumprod[0]) ** 0.5
        else:
            last = 0.0
        self.sigmas = np.concatenate([sigmas, [last]]).astype(F32)
        return timesteps.astype(np.int64)

    def _reset(self):
        self._x0_history: list[np.ndarray] = []
        self._lower_order_nums = 0

    def add_noise(self, original, noise, t):
        alpha, sigma = _alpha_sigma(self.sigmas[self._lookup_index(t)])
        return (alpha * np.asarray(original, F32) + sigma * np.asarray(noise, F32)).astype(F32)

    def _step(self, model_output, x, noise):
        cfg, i, n = self.config, self._index, len(self._all_timesteps)
        few_steps = cfg.lower_order_final and n < 15  # higher orders are unstable with few steps
        last_is_first_order = i == n - 1 and (cfg.euler_at_final or few_steps or cfg.final_sigmas_type == "zero")
        second_to_last = i == n - 2 and few_steps
        self._x0_history = (self._x0_history + [self._x0(model_output, x)])[-cfg.solver_order :]
        if cfg.algorithm_type == "sde-dpmsolver++":
            noise = self._noise_like(x, noise)
        if cfg.solver_order == 1 or self._lower_order_nums < 1 or last_is_first_order:
            x_prev = self._first_order(x, noise)
        elif cfg.solver_order == 2 or self._lower_order_nums < 2 or second_to_last:
            x_prev = self._second_order(x, noise)
        else:
            x_prev = self._third_order(x)
        self._lower_order_nums = min(self._lower_order_nums + 1, cfg.solver_order)
        return x_prev.astype(F32)

    def _x0(self, model_output, x):
        kind = self.config.prediction_type
        if kind == "sample":
            x0 = model_output
        else:
            alpha, sigma = _alpha_sigma(self.sigmas[self._index])
            if kind == "epsilon":
                x0 = (x - sigma * model_output) / alpha
            else:
                x0 = alpha * x - sigma * model_output
        return threshold(x0, self.config) if self.config.thresholding else x0

    def _lambdas(self, *offsets):
        """(alpha, sigma, lambda = log(alpha / sigma)) at sigmas[index + offset] for each offset, in float32."""
        out = []
        for k in offsets:
            alpha, sigma = _alpha_sigma(self.sigmas[self._index + k])
            with np.errstate(divide="ignore"):  # sigma 0 (the final step) means lambda = +inf: x_prev = x0
                out.append((alpha, sigma, np.log(alpha) - np.log(sigma)))
        return out

    def _first_order(self, x, noise):
        (a_t, s_t, l_t), (_, s_s, l_s) = self._lambdas(1, 0)
        x0 = self._x0_history[-1]
        if s_t == 0:
            return x0
        h = l_t - l_s
        if self.config.algorithm_type == "dpmsolver++":
            return s_t / s_s * x - a_t * (np.exp(-h) - 1.0) * x0
        return (
            s_t / s_s * np.exp(-h) * x + a_t * (1 - np.exp(-2.0 * h)) * x0 + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise
        )

    def _second_order(self, x, noise):
        (a_t, s_t, l_t), (_, s_s0, l_s0), (_, _, l_s1) = self._lambdas(1, 0, -1)
        m0, m1 = self._x0_history[-1], self._x0_history[-2]
        h, h0 = l_t - l_s0, l_s0 - l_s1
        d0, d1 = m0, (1.0 / (h0 / h)) * (m0 - m1)
        midpoint = self.config.solver_type == "midpoint"
        if self.config.algorithm_type == "dpmsolver++":
            base = s_t / s_s0 * x - a_t * (np.exp(-h) - 1.0) * d0
            if midpoint:
                return base - 0.5 * (a_t * (np.exp(-h) - 1.0)) * d1
            return base + a_t * ((np.exp(-h) - 1.0) / h + 1.0) * d1
        base = s_t / s_s0 * np.exp(-h) * x + a_t * (1 - np.exp(-2.0 * h)) * d0
        if midpoint:
            base = base + 0.5 * (a_t * (1 - np.exp(-2.0 * h))) * d1
        else:
            base = base + a_t * ((1.0 - np.exp(-2.0 * h)) / (-2.0 * h) + 1.0) * d1
        return base + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise

    def _third_order(self, x):
        (a_t, s_t, l_t), (_, s_s0, l_s0), (_, _, l_s1), (_, _, l_s2) = self._lambdas(1, 0, -1, -2)
        m0, m1, m2 = self._x0_history[-1], self._x0_history[-2], self._x0_history[-3]
        h, h0, h1 = l_t - l_s0, l_s0 - l_s1, l_s1 - l_s2
        r0, r1 = h0 / h, h1 / h
        d1_0, d1_1 = (1.0 / r0) * (m0 - m1), (1.0 / r1) * (m1 - m2)
        d1 = d1_0 + r0 / (r0 + r1) * (d1_0 - d1_1)
        d2 = 1.0 / (r0 + r1) * (d1_0 - d1_1)
        return (
            s_t / s_s0 * x
            - a_t * (np.exp(-h) - 1.0) * m0
            + a_t * ((np.exp(-h) - 1.0) / h + 1.0) * d1
            - a_t * ((np.exp(-h) - 1.0 + h) / h**2 - 0.5) * d2
        )


def _alpha_sigma(sigma: np.float32) -> tuple[np.float32, np.float32]:
    """From the variance-exploding sigma to the variance-preserving (alpha_t, sigma_t) pair."""
    alpha = F32(1) / (sigma**2 + F32(1)) ** F32(0.5)
    return alpha, sigma * alpha
