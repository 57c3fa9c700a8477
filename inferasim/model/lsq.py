"""Bounded Levenberg-Marquardt: the one least-squares solver the step-time fits share.

Both fits (benchmark points in `model.fit`, isolated step timings in `model.stepfit`) minimise a
sum of squared log-errors over log-parameters inside box bounds. The problems are small (a dozen
parameters, tens of residuals) and the residuals are cheap, so a forward-difference Jacobian and a
damped Gauss-Newton step are enough; no solver library is needed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Residuals = Callable[[np.ndarray], np.ndarray]


def bounded_lm(residuals: Residuals, z0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               max_iter: int = 40) -> tuple[np.ndarray, float, int, bool]:
    """Minimise |residuals(z)|^2 from `z0`, every step clipped into [lo, hi].

    Returns (z, objective, iterations, converged). Converged means the last accepted step improved
    the objective by less than 1e-6 relative, or no damped step improved it."""
    z = np.array(z0, dtype=float)
    r = residuals(z)
    cost_val = float(r @ r)
    lam = 1e-2
    iterations = 0
    converged = False
    for _ in range(max_iter):
        iterations += 1
        jac = np.empty((r.size, z.size))
        for j in range(z.size):
            dz = np.zeros_like(z)
            dz[j] = 1e-4
            jac[:, j] = (residuals(z + dz) - r) / 1e-4
        g = jac.T @ r
        h = jac.T @ jac
        improved = False
        for _ in range(8):
            step = -np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-9), g)
            # Keep z inside the bounds so that clipping inside the model does not hide the gradient.
            z_new = np.clip(z + step, lo, hi)
            r_new = residuals(z_new)
            c_new = float(r_new @ r_new)
            if c_new < cost_val:
                rel = (cost_val - c_new) / max(cost_val, 1e-12)
                z, r, cost_val = z_new, r_new, c_new
                lam = max(lam / 3.0, 1e-6)
                improved = True
                if rel < 1e-6:
                    converged = True
                break
            lam *= 4.0
        if not improved or converged:
            converged = True
            break
    return z, cost_val, iterations, converged
