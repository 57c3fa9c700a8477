"""Prediction error of a running configuration: what its anchors predict for the workload it is
serving, against what it serves.

For the observed workload (request rate, mean prompt and output length, requests in flight and,
where known, the prefix-cache hit rate) the anchored step-time model predicts TTFT and inter-token
latency in closed loop at the observed requests in flight per replica, and the throughput that
follows by Little's law (in flight x output length / predicted request latency, all replicas).
The observed throughput is request rate x mean output length. Relative errors are
``observed / predicted - 1``: +1.0 means the deployment is twice as slow (or, for throughput,
serves twice as much) as predicted.

Either observation works: a :class:`~inferasim.passive.Window` (means over a range, from
:func:`inferasim.observe.observe_windows`; preferred) or an :class:`~inferasim.observed.ObservedWorkload`
(instant view of :func:`inferasim.observe.observe`, whose latencies are histogram medians and whose
in-flight count is one sample, so its errors are coarser).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferasim.core.config import ServingConfig
from inferasim.deployment import LiveDeployment, kernel_set_of
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import FittedAnchor, fitted_from_anchor
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.observed import ObservedWorkload
from inferasim.passive import Window

__all__ = ["METRICS", "PredictionError", "prediction_error"]

METRICS: tuple[str, ...] = ("ttft", "itl", "throughput")


@dataclass(frozen=True)
class PredictionError:
    """Observed and predicted TTFT (ms), ITL (ms) and output throughput (tokens/s, all replicas)."""

    anchor_id: str
    concurrency: float  # requests in flight per replica the prediction was made at
    observed: dict[str, float | None]
    predicted: dict[str, float]
    relative: dict[str, float] = field(default_factory=dict)  # observed / predicted - 1, observed metrics only

    def worst(self) -> float:
        """Largest |relative error| over the observed metrics (0 when none was observed)."""
        return max((abs(v) for v in self.relative.values()), default=0.0)

    def exceeds(self, threshold: float) -> bool:
        """True when any observed metric is off by more than ``threshold`` (a fraction: 0.25 = 25%)."""
        if not threshold > 0:
            raise ValueError(f"threshold must be a positive fraction (0.25 = 25%), got {threshold!r}")
        return self.worst() > threshold

    def as_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor_id, "concurrency_per_replica": self.concurrency,
                "observed": dict(self.observed), "predicted": dict(self.predicted),
                "relative_error": dict(self.relative), "worst": self.worst()}


def _observed(obs: ObservedWorkload | Window) -> tuple[float, float, float, float, float | None, float | None,
                                                       float]:
    """(request rate, prompt, output, in flight, ttft s, itl s, prefix hit)."""
    if isinstance(obs, Window):
        span = obs.end - obs.start
        if not span > 0:
            raise ValueError(f"window {obs.start}-{obs.end} has no duration")
        return (obs.requests / span, obs.prompt_tokens, obs.output_tokens, obs.in_flight, obs.ttft_s, obs.itl_s,
                0.0)
    ttft = obs.ttft.p50_ms / 1e3 if obs.ttft is not None and obs.ttft.p50_ms is not None else None
    itl = obs.itl.p50_ms / 1e3 if obs.itl is not None and obs.itl.p50_ms is not None else None
    return (obs.request_rate, obs.prompt_tokens_mean, obs.output_tokens_mean, obs.running + obs.waiting, ttft, itl,
            obs.prefix_hit_rate or 0.0)


def prediction_error(config: ServingConfig | LiveDeployment, observed: ObservedWorkload | Window,
                     predictor: AnchorStore | FittedAnchor, *, speedup: float = 1.0) -> PredictionError:
    """Compare what ``config`` serves (``observed``) with what ``predictor`` predicts for it.

    ``predictor`` is a fitted anchor, or a store in which the configuration's kernel set is looked
    up at its layout (:meth:`AnchorStore.find`: harvested before passive; NoCompatibleAnchor when
    none). ``speedup`` is engine seconds per wall second: 1 for a real engine, the emulator's
    ``--speedup`` for an emulated one (its histograms record engine seconds, but Prometheus rates
    are per wall second). Raises ValueError when nothing was in flight or no request finished.
    """
    if not speedup > 0:
        raise ValueError(f"speedup must be positive, got {speedup!r}")
    live = config if isinstance(config, LiveDeployment) else None
    cfg = live.config if live is not None else config
    if isinstance(predictor, AnchorStore):
        ks = live.kernel_set() if live is not None else kernel_set_of(cfg)
        fitted = fitted_from_anchor(predictor.find(ks, cfg.layout))
    else:
        fitted = predictor
    rate, isl, osl, in_flight, ttft_obs, itl_obs, hit = _observed(observed)
    rate /= speedup
    if not (in_flight > 0 and rate > 0):
        raise ValueError(f"nothing to compare: {in_flight:g} requests in flight, {rate:g} finished per second")
    if not (isl > 0 and osl >= 1):
        raise ValueError(f"observed lengths are not usable: prompt {isl:g}, output {osl:g} tokens")
    conc = in_flight / cfg.replicas
    layout = cfg.layout
    cost = layout_cost(fitted.model, fitted.gpu, layout, fitted.precision, fitted.kv_dtype, fitted.engine,
                       fitted.engine_version)
    sched = engine_sched(fitted.engine, fitted.model, fitted.gpu, layout, fitted.precision, fitted.engine_version,
                         fitted.kv_dtype)
    # Live traffic does not arrive in a benchmark's lock-stepped waves: the anchor's wave share
    # (`burst`, a property of the benchmark harness that measured it) does not apply here, nor
    # does that harness's cap on requests in flight (`client_cap`).
    params = fitted.params.without_harness()
    r = closed_loop(params, cost, sched, np.array([float(isl)]), np.array([float(osl)]), np.array([conc]), hit)
    ttft, tpot = float(r.ttft[0]), float(r.tpot[0])
    # Little's law with the predicted request latency: what `conc` requests in flight deliver.
    throughput = conc * osl / (ttft + max(osl - 1.0, 0.0) * tpot) * cfg.replicas
    predicted = {"ttft": ttft * 1e3, "itl": tpot * 1e3, "throughput": throughput}
    obs = {"ttft": None if ttft_obs is None else ttft_obs * 1e3, "itl": None if itl_obs is None else itl_obs * 1e3,
           "throughput": rate * osl}
    relative = {m: obs[m] / predicted[m] - 1.0 for m in METRICS  # type: ignore[operator]
                if obs[m] is not None and math.isfinite(obs[m]) and predicted[m] > 0}  # type: ignore[arg-type]
    return PredictionError(anchor_id=fitted.anchor_id, concurrency=conc, observed=obs, predicted=predicted,
                           relative=relative)
