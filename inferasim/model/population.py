"""Measurement-free predictions from the population of fitted anchors (model.priors).

`Population` holds every fitted kernel set of a run (validate's anchors, or the shipped store)
and prices a kernel set that has no anchor of its own from the others: the population prior's
centre as its parameters, and as its interval the error the population makes on anchors it did
not learn from. That error is measured, not assumed: each member's own anchor points predicted
from the book without it (leave one kernel set out), pooled per metric over the members other
than the one being priced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.model.fit import FitPoint, FitResult, predict_points
from inferasim.model.layoutcost import layout_cost
from inferasim.model.priors import Member, PriorBook, member
from inferasim.model.steady import engine_sched

Key = tuple[str, ...]
# The band's share: a 90% interval, like every other band inferasim prints.
SPREAD_QUANTILE = 0.9
# Metrics whose leave-one-out residuals size a population prediction's interval.
METRICS: tuple[str, ...] = ("ttft", "tpot", "batch_latency", "throughput")


@dataclass
class FittedMember:
    """What the population needs of one fitted kernel set."""

    key: Key
    engine: str
    engine_version: str
    model: ModelSpec
    gpu: GPU
    precision: str
    kv_dtype: str
    layout: object  # core.layout.Layout
    params: object  # steptime.StepParams
    points: Sequence[FitPoint]


def _residuals(book: PriorBook, m: FittedMember) -> dict[str, np.ndarray]:
    prior = book.prior(m.engine, m.engine_version, m.model, m.gpu, m.precision)
    cost = layout_cost(m.model, m.gpu, m.layout, m.precision, m.kv_dtype, m.engine, m.engine_version)  # type: ignore[arg-type]
    sched = engine_sched(m.engine, m.model, m.gpu, m.layout, m.precision, m.engine_version, m.kv_dtype)  # type: ignore[arg-type]
    pred = predict_points(prior.params, cost, sched, list(m.points))
    out: dict[str, np.ndarray] = {}
    for name in METRICS:
        meas = np.array([getattr(p, name) if getattr(p, name) is not None else np.nan for p in m.points], dtype=float)
        ok = np.isfinite(meas) & (meas > 0) & np.isfinite(pred[name]) & (pred[name] > 0)
        if ok.any():
            out[name] = np.log(pred[name][ok] / meas[ok])
    return out


class Population:
    """Fitted kernel sets, their population book, and each one's leave-one-out error."""

    def __init__(self, members: Mapping[Key, FittedMember]) -> None:
        self.fitted = dict(members)
        self._members: dict[Key, Member] = {
            k: member(k, m.engine, m.engine_version, m.model, m.gpu, m.precision, m.params)  # type: ignore[arg-type]
            for k, m in self.fitted.items()}
        self.book = PriorBook(self._members.values())
        self._loo: dict[Key, dict[str, np.ndarray]] = {}
        for k, m in self.fitted.items():
            try:
                self._loo[k] = _residuals(self.book.without(k), m)
            except ValueError:  # a member the model cannot price at its own layout adds no residual
                self._loo[k] = {}

    def __len__(self) -> int:
        return len(self.fitted)

    def book_without(self, key: Key) -> PriorBook:
        return self.book.without(key) if key in self._members else self.book

    def pooled_residuals(self, key: Key) -> dict[str, list[float]]:
        """Leave-one-out log residuals of every member but `key`, per metric."""
        out: dict[str, list[float]] = {}
        for k, res in self._loo.items():
            if k == key:
                continue
            for name, values in res.items():
                out.setdefault(name, []).extend(values.tolist())
        return out

    def loo_error(self) -> dict[str, float]:
        """Median |exp(residual) - 1| per metric over all members' own anchor points."""
        pooled = self.pooled_residuals(())
        return {k: float(np.median(np.abs(np.expm1(v)))) for k, v in pooled.items() if v}

    def fit_for(self, key: Key, engine: str, engine_version: str, model: ModelSpec, gpu: GPU,
                precision: str) -> tuple[FitResult, dict[str, float]]:
        """The FitResult a measurement-free prediction of `key` carries (the population prior
        without `key` itself, the others' leave-one-out residuals as its error) and each metric's
        90% half-width (log): the 90th percentile of those residuals' size, so that the band
        holds what the population's own leave-one-out predictions held."""
        prior = self.book_without(key).prior(engine, engine_version, model, gpu, precision)
        pooled = self.pooled_residuals(key)
        rms = float(np.sqrt(np.mean(np.square(np.concatenate([np.asarray(v) for v in pooled.values()]))))) \
            if pooled else 0.35
        fit = FitResult(params=prior.params, rms_log_error=rms, max_abs_log_error=rms, per_metric_mape={},
                        n_points=0, iterations=0, converged=True, residuals=pooled,
                        message=f"measurement-free: {prior.describe()} (engine, GPU vendor, precision, "
                                f"dense/MoE), not its own anchor")
        spread = {name: float(np.quantile(np.abs(v), SPREAD_QUANTILE)) for name, v in pooled.items() if v}
        # Throughput of a closed row follows TTFT and TPOT; offline metrics read as TPOT does.
        for name in ("batch_latency", "throughput"):
            spread.setdefault(name, spread.get("tpot", rms * 1.64))
        spread.setdefault("tpot", rms * 1.64)
        spread.setdefault("ttft", spread["tpot"])
        return fit, spread
