"""Fit of step-time parameters to isolated step timings (an anchor's `steps`).

A benchmark point (model.fit) sees a step only through a closed loop; a step point is one
iteration timed on its own: B decodes at context C plus a prefill chunk of T tokens, in
milliseconds. Its prediction is `steptime.step_time` itself, so the fit is a direct least squares
of log step time over the parameters the steps can identify, with the same log-normal priors as
the benchmark fit where a term is not exercised (no prefill step leaves e_attn at its prior).

Which parameters a grid identifies: the weight read (e_bw) at B = 1 and short C; the per-step
fixed cost (t_fixed) against it only through B = 1 steps of models of different sizes, so the
prior holds the split at one model (as in model.fit); the KV read (e_kv) at large B x C; GEMM
efficiency (e_flops) and the weight tile (m_tile) at large B and in prefill; attention FLOPs
(e_attn) in long prefills.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from inferasim.model.anchors import StepPoint
from inferasim.model.fit import PRIOR_SIGMA, TILE_START
from inferasim.model.layoutcost import LayoutCost
from inferasim.model.lsq import bounded_lm
from inferasim.model.steptime import PARAM_BOUNDS, StepParams, step_time

# What isolated steps can speak to: no request-level term (TTFT, front end, waves, client cap).
STEP_FREE: tuple[str, ...] = ("t_fixed", "t_seq", "e_bw", "e_kv", "e_flops", "e_attn", "m_tile")
# The weight tile needs a decode batch sweep (as model.fit.MIN_TILE_CONCURRENCIES for benchmarks).
MIN_TILE_BATCHES = 3
_FLOOR = {"t_seq": 1e-7}
# Spread of a step's log time around the model, against which the priors weigh: the step law's own
# error on measured steps (rms log error 0.07-0.10 over the H200 grids of benchmarks/measured), not
# the timer's (under 1% over the repeats). A benchmark fit (model.fit) reads its points as far
# noisier (unit spread), since harness behaviour sits between the steps and what it measures.
STEP_LOG_SIGMA = 0.1


@dataclass
class StepFit:
    params: StepParams
    free: tuple[str, ...]
    rms_log_error: float
    max_abs_log_error: float
    median_abs_error: float  # median |predicted / measured - 1|
    n_points: int
    iterations: int
    converged: bool
    residuals: list[float] = field(default_factory=list)  # log(predicted / measured), per step
    objective: float = 0.0


def _arrays(steps: Sequence[StepPoint]) -> tuple[np.ndarray, ...]:
    return (np.array([s.n_decode for s in steps], dtype=float),
            np.array([s.decode_context for s in steps], dtype=float),
            np.array([s.n_prefill_tokens for s in steps], dtype=float),
            np.array([s.prefill_context for s in steps], dtype=float),
            np.array([s.step_ms for s in steps], dtype=float) / 1e3)


def predict_steps(params: StepParams, cost: LayoutCost, steps: Sequence[StepPoint]) -> np.ndarray:
    """Predicted seconds of each step."""
    n_dec, ctx_dec, n_pref, prefix, _ = _arrays(steps)
    # step_time takes the prefill tokens' mean visible context: a causal chunk of T tokens after a
    # cached prefix P sees P + T/2 on average (as model.steady prices a prompt at isl / 2); its
    # longest sequence is P + T (one chunk per step).
    return np.asarray(step_time(params, cost, n_dec, ctx_dec, n_pref, prefix + n_pref / 2.0,
                                seq_pref=prefix + n_pref), dtype=float)


def identifiable(cost: LayoutCost, steps: Sequence[StepPoint], free: Sequence[str] = STEP_FREE) -> tuple[str, ...]:
    """The parameters of `free` that `steps` exercise at all (the rest stay at the prior)."""
    decode_batches = {s.n_decode for s in steps if s.n_decode}
    out = []
    for name in free:
        if name == "e_attn" and not any(s.n_prefill_tokens for s in steps):
            continue
        if name in ("e_kv", "t_seq") and not decode_batches:
            continue
        if name == "m_tile" and len(decode_batches) < MIN_TILE_BATCHES:
            continue
        out.append(name)
    return tuple(out)


def _fit_once(cost: LayoutCost, steps: Sequence[StepPoint], prior: StepParams, free: tuple[str, ...],
              start: dict[str, float]) -> StepFit:
    measured = _arrays(steps)[-1]
    prior_d = prior.as_dict()

    def floor(name: str) -> float:
        return max(PARAM_BOUNDS[name][0], _FLOOR.get(name, PARAM_BOUNDS[name][0]))

    def to_params(z: np.ndarray) -> StepParams:
        d = dict(prior_d)
        for name, zi in zip(free, z, strict=True):
            d[name] = float(np.clip(np.exp(zi), floor(name), PARAM_BOUNDS[name][1]))
        return StepParams(**d)

    def residuals(z: np.ndarray) -> np.ndarray:
        pred = predict_steps(to_params(z), cost, steps)
        parts = [np.log(np.maximum(pred, 1e-12) / measured) / STEP_LOG_SIGMA]
        for name, zi in zip(free, z, strict=True):
            sigma = PRIOR_SIGMA[name]
            if np.isfinite(sigma):  # m_tile has no typical value to be near (model.fit)
                parts.append(np.array([(zi - np.log(max(prior_d[name], floor(name)))) / sigma]) * 0.5)
        return np.concatenate(parts)

    first = {**prior_d, **start}
    z0 = np.array([np.log(max(first[f], floor(f))) for f in free])
    lo = np.array([np.log(floor(f)) for f in free])
    hi = np.array([np.log(PARAM_BOUNDS[f][1]) for f in free])
    z, objective, iterations, converged = bounded_lm(residuals, z0, lo, hi)
    params = to_params(z)
    pred = predict_steps(params, cost, steps)
    logs = np.log(pred / measured)
    return StepFit(params=params, free=free, rms_log_error=float(np.sqrt(np.mean(logs ** 2))),
                   max_abs_log_error=float(np.max(np.abs(logs))),
                   median_abs_error=float(np.median(np.abs(pred / measured - 1.0))), n_points=len(steps),
                   iterations=iterations, converged=converged, residuals=logs.tolist(), objective=objective)


def fit_steps(cost: LayoutCost, steps: Sequence[StepPoint], prior: StepParams,
              free: Sequence[str] = STEP_FREE) -> StepFit:
    """Fit the parameters `steps` identify, from the prior; where a batch sweep allows a weight
    tile, from a few-row tile too, keeping the start that explains the steps better (priors
    included), as model.fit does for benchmark sweeps. ValueError without steps."""
    if not steps:
        raise ValueError("a step fit needs at least one measured step")
    names = identifiable(cost, steps, free)
    best = _fit_once(cost, steps, prior, names, {})
    if "m_tile" in names:
        other = _fit_once(cost, steps, prior, names, {"m_tile": TILE_START})
        if other.objective < best.objective:
            best = other
    return best


# The GPU terms a step harness measures. The host terms (t_fixed, t_seq, the request-level
# costs) of a harness are not an engine's: under CUDA graphs its fixed cost per step is the
# GPU's kernel floor of unfused small kernels, and it has no scheduler, tokenizer or API server.
GPU_TERMS: tuple[str, ...] = ("e_bw", "e_kv", "e_flops", "e_attn", "m_tile")


def engine_params_from_steps(cost: LayoutCost, steps: Sequence[StepPoint],
                             prior: StepParams) -> tuple[StepParams, StepFit]:
    """An engine's parameters from isolated step timings: the GPU terms the steps fit, the host
    terms of the engine's own prior (`prior`, steptime.default_params), and the fit itself."""
    fit = fit_steps(cost, steps, prior)
    fitted = fit.params.as_dict()
    merged = {**prior.as_dict(), **{name: fitted[name] for name in GPU_TERMS}}
    return StepParams(**merged), fit
