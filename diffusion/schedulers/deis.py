"""DEIS multistep (Zhang & Chen 2022, "log-rho" variant): an exponential integrator on the noise prediction whose
higher-order terms integrate the Lagrange polynomial through the previous noise predictions exactly in log(rho),
rho = sigma_t / alpha_t. Its first step is DDIM's (DPM-Solver's first-order "dpmsolver" update)."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32
from .config import require
from .log_snr import LogSNRScheduler, alpha_sigma, first_order_update


class DEISMultistepScheduler(LogSNRScheduler):
    name = "DEISMultistepScheduler"
    defaults = {"algorithm_type": "deis", "solver_type": "logrho"}
    ignored = {"rescale_betas_zero_snr": False}  # diffusers' class has no such setting

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "solver_order", (1, 2, 3))
        # as diffusers: other solvers' names for these settings mean DEIS's own
        if cfg.algorithm_type not in ("deis", "dpmsolver", "dpmsolver++"):
            raise ConfigError(
                f"{self.name}: algorithm_type={cfg.algorithm_type!r} is not supported (supported: 'deis')",
                hint="pick another scheduler or change the setting in the scheduler config",
            )
        if cfg.solver_type not in ("logrho", "midpoint", "heun", "bh1", "bh2"):
            raise ConfigError(
                f"{self.name}: solver_type={cfg.solver_type!r} is not supported (supported: 'logrho')",
                hint="pick another scheduler or change the setting in the scheduler config",
            )
        self.config = cfg.replace(algorithm_type="deis", solver_type="logrho")

    def _timesteps_for(self, steps):
        timesteps = self._spaced(steps, self.config.timestep_spacing)
        if self.config.use_karras_sigmas or self.config.use_exponential_sigmas:
            sigmas, timesteps = self._converted(steps)
            sigmas = np.concatenate([sigmas, sigmas[-1:]])  # as diffusers: the last step stays where it is
        else:
            sigmas = np.concatenate([self._interpolated(timesteps), [self._smallest_train_sigma()]])
        self.sigmas = sigmas.astype(F32)
        return timesteps.astype(np.int64)

    def _reset(self):
        self._history: list[np.ndarray] = []
        self._lower_order_nums = 0

    def _step(self, model_output, x, noise):
        cfg, i, n = self.config, self._index, len(self._all_timesteps)
        few_steps = cfg.lower_order_final and n < 15
        alpha, sigma = alpha_sigma(self.sigmas[i])
        eps = (x - alpha * self._x0(model_output, x)) / sigma
        self._history = (self._history + [eps])[-cfg.solver_order :]
        if cfg.solver_order == 1 or self._lower_order_nums < 1 or (i == n - 1 and few_steps):
            s, t = self._points(0, 1)
            x_prev = first_order_update("dpmsolver", x, s, t, eps)
        elif cfg.solver_order == 2 or self._lower_order_nums < 2 or (i == n - 2 and few_steps):
            x_prev = self._multistep(x, 2)
        else:
            x_prev = self._multistep(x, 3)
        self._lower_order_nums = min(self._lower_order_nums + 1, cfg.solver_order)
        return x_prev.astype(F32)

    def _multistep(self, x, order):
        """x_t = alpha_t (x / alpha_s0 + sum_k c_k eps_k), c_k the integral of the k-th Lagrange basis polynomial
        (in log rho, times rho) from rho_s0 to rho_t."""
        points = [alpha_sigma(self.sigmas[self._index + k]) for k in range(1, -order, -1)]  # t, s0, s1[, s2]
        (alpha_t, _), (alpha_s0, _) = points[0], points[1]
        rho_t, *rho_s = [s / a for a, s in points]
        basis = _basis_integral2 if order == 2 else _basis_integral3
        total = x / alpha_s0
        for k in range(order):
            others = rho_s[k + 1 :] + rho_s[:k]  # the other nodes, in diffusers' argument order
            coef = basis(rho_t, rho_s[k], *others) - basis(rho_s[0], rho_s[k], *others)
            total = total + coef * self._history[-1 - k]
        return alpha_t * total


def _basis_integral2(t, b, c):
    """Antiderivative at rho = t of rho-weighted Lagrange basis through log b (zero at log c)."""
    return t * (-np.log(c) + np.log(t) - 1) / (np.log(b) - np.log(c))


def _basis_integral3(t, b, c, d):
    """As `_basis_integral2` for three nodes: the basis through log b, zero at log c and log d."""
    lt, lc, ld = np.log(t), np.log(c), np.log(d)
    numerator = t * (lc * (ld - lt + 1) - ld * lt + ld + lt**2 - 2 * lt + 2)
    return numerator / ((np.log(b) - lc) * (np.log(b) - ld))
