"""Choosing: objectives, the Pareto front, and a short list that differs where it matters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from inferasim.core.spec import Objective
from inferasim.search.estimate import Estimate


def objective_value(e: Estimate, objective: Objective, osl: float, rate: float | None,
                    price_per_gpu_hour: float | None) -> float:
    """Higher is better, whatever the objective (minimisations are negated)."""
    if objective.minimize == "gpus":
        return -float(e.gpus) if e.meets_slo else -math.inf
    if objective.minimize == "costPerMillionTokens":
        cost = cost_per_million_tokens(e, osl, price_per_gpu_hour or 1.0)
        return -cost if e.meets_slo else -math.inf
    if objective.maximize == "goodput":
        if rate is None:
            return e.max_rate_slo * e.replicas * osl
        return min(rate, e.max_rate_slo * e.replicas) * osl
    return e.per_gpu_at_slo(osl)


def cost_per_million_tokens(e: Estimate, osl: float, price_per_gpu_hour: float) -> float:
    """$ per million output tokens at the SLO operating point of one replica."""
    tokens_per_hour = e.max_rate_slo * osl * 3600.0
    if tokens_per_hour <= 0:
        return math.inf
    return price_per_gpu_hour * e.candidate.gpus_per_replica / tokens_per_hour * 1e6


@dataclass(frozen=True)
class ParetoPoint:
    label: str
    engine: str
    tokens_per_user: float  # tok/s seen by one user (1 / TPOT)
    throughput_per_gpu: float  # tok/s per GPU
    concurrency: float

    def as_dict(self) -> dict[str, float | str]:
        return {"label": self.label, "engine": self.engine, "tokens_per_s_per_user": self.tokens_per_user,
                "throughput_per_gpu": self.throughput_per_gpu, "concurrency": self.concurrency}


def pareto_front(estimates: list[Estimate], osl: float) -> list[ParetoPoint]:
    """Non-dominated (tokens/s per user, tokens/s per GPU) points over every candidate's curve
    (numpy over all points; objects only for the front)."""
    if not estimates:
        return []
    per_user = np.concatenate([1.0 / np.maximum(e.curve_tpot, 1e-9) for e in estimates])
    per_gpu = np.concatenate([e.curve_rate * osl / e.candidate.gpus_per_replica for e in estimates])
    owner = np.concatenate([np.full(e.curve_tpot.size, i) for i, e in enumerate(estimates)])
    conc = np.concatenate([e.curve_conc for e in estimates])
    order = np.lexsort((-per_gpu, -per_user))  # by tokens/s per user, then per GPU, both descending
    best = np.maximum.accumulate(per_gpu[order])
    prev = np.concatenate([[-np.inf], best[:-1]])
    keep = order[per_gpu[order] > prev]
    return [ParetoPoint(estimates[int(owner[k])].candidate.label(), estimates[int(owner[k])].candidate.engine,
                        float(per_user[k]), float(per_gpu[k]), float(conc[k])) for k in keep]


def shortlist(ranked: list[Estimate], n: int = 5) -> list[Estimate]:
    """The best candidate of each distinct shape (engine, precision, layout or disaggregation), in
    rank order; if fewer shapes exist, fill with the next best of any shape."""
    out: list[Estimate] = []
    seen: set[str] = set()
    for e in ranked:
        if e.candidate.shape not in seen:
            out.append(e)
            seen.add(e.candidate.shape)
        if len(out) == n:
            return out
    for e in ranked:
        if e not in out:
            out.append(e)
        if len(out) == n:
            break
    return out
