"""Capacity answers from a tune result: the most a GPU budget serves, or the GPUs a rate needs.

Each ranked candidate already carries the highest request rate one replica serves within the
SLO (Estimate.max_rate_slo, from its latency curve; replayed where stage 2 ran). Replicas are
independent, so:

- maxRate: replicas = budget // GPUs per replica, rate = replicas x max_rate_slo;
- gpusForRate: replicas = ceil(rate / max_rate_slo), GPUs = replicas x GPUs per replica.

The 90% band comes from the candidate's own prediction band (interval_log, the same one its
latencies carry): a replica's rate within the SLO scales inversely with its step time, so the
rate spans [rate / f, rate x f] with f = exp(interval_log), and the GPUs follow from those rates.
One answer per deployment shape (engine, precision, layout or P/D shape), best first.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from inferasim.core.spec import TuningSpec
from inferasim.search.estimate import Estimate
from inferasim.search.workload import WorkloadShape

TOP = 5


class TuneResult(Protocol):
    """What the answers read of a tune result (search.tune.TuneResult is one)."""

    spec: TuningSpec
    workload: WorkloadShape
    ranked: list[Estimate]

    def entry(self, e: Estimate) -> dict[str, Any]: ...


def _best_per_shape(result: TuneResult) -> list[tuple[Any, dict[str, Any]]]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for e in result.ranked:
        if not e.max_rate_slo > 0 or not math.isfinite(e.max_rate_slo):
            continue
        entry = result.entry(e)
        key = (entry["engine"], entry["precision"], entry["shape"])
        if key in seen:
            continue
        seen.add(key)
        out.append((e, entry))
    return out


def _row(e: Any, entry: dict[str, Any], replicas: int, rate: float, f: float) -> dict[str, Any]:
    return {"engine": entry["engine"], "precision": entry["precision"], "shape": entry["shape"],
            "max_num_seqs": entry["max_num_seqs"], "max_num_batched_tokens": entry["max_num_batched_tokens"],
            "gpus_per_replica": e.candidate.gpus_per_replica, "replicas": replicas,
            "gpus": replicas * e.candidate.gpus_per_replica, "rate_per_replica": e.max_rate_slo,
            "anchored": e.anchored, "interval_factor_90": f, "rate": rate}


def max_rate(result: TuneResult, budget: int) -> list[dict[str, Any]]:
    """The most requests/s within the SLO on at most `budget` GPUs, per shape, best first."""
    rows = []
    for e, entry in _best_per_shape(result):
        replicas = budget // e.candidate.gpus_per_replica
        if replicas < 1:
            continue
        rate = replicas * e.max_rate_slo
        f = math.exp(entry["predicted"]["interval_log"])
        rows.append({**_row(e, entry, replicas, rate, f), "rate_interval": [rate / f, rate * f]})
    # Anchored answers before measurement-free ones, as the recommendation ranks them.
    rows.sort(key=lambda r: (not r["anchored"], -r["rate"]))
    return rows[:TOP]


def gpus_for_rate(result: TuneResult, rate: float) -> list[dict[str, Any]]:
    """The fewest GPUs that serve `rate` requests/s within the SLO, per shape, fewest first."""
    rows = []
    for e, entry in _best_per_shape(result):
        f = math.exp(entry["predicted"]["interval_log"])
        per = e.candidate.gpus_per_replica

        def replicas_at(per_replica: float) -> int:
            return max(math.ceil(rate / per_replica - 1e-9), 1)

        replicas = replicas_at(e.max_rate_slo)
        rows.append({**_row(e, entry, replicas, replicas * e.max_rate_slo, f),
                     "gpus_interval": [replicas_at(e.max_rate_slo * f) * per, replicas_at(e.max_rate_slo / f) * per]})
    rows.sort(key=lambda r: (not r["anchored"], r["gpus"], -r["rate"]))
    return rows[:TOP]


def answer(result: TuneResult) -> dict[str, Any] | None:
    """The spec's capacity question answered (None when it asks none)."""
    cap = result.spec.capacity
    if cap is None:
        return None
    if cap.question == "maxRate":
        budget = result.spec.hardware.max_gpus
        rows = max_rate(result, budget)
        return {"question": "maxRate", "gpus": budget, "answers": rows,
                "headline": (f"at most {rows[0]['rate']:.2f} req/s [90%: {rows[0]['rate_interval'][0]:.2f}, "
                             f"{rows[0]['rate_interval'][1]:.2f}] within the SLO on {budget} GPUs: "
                             f"{rows[0]['engine']} {rows[0]['precision']} {rows[0]['shape']} x{rows[0]['replicas']}")
                if rows else f"no deployment serves any rate within the SLO on {budget} GPUs"}
    rate = cap.request_rate if cap.request_rate is not None else result.workload.rate
    if rate is None or not rate > 0:
        return {"question": "gpusForRate", "answers": [],
                "headline": "gpusForRate needs capacity.requestRate (the workload gives no request rate)"}
    rows = gpus_for_rate(result, rate)
    return {"question": "gpusForRate", "request_rate": rate, "answers": rows,
            "headline": (f"{rate:g} req/s within the SLO needs {rows[0]['gpus']} GPUs [90%: "
                         f"{rows[0]['gpus_interval'][0]}, {rows[0]['gpus_interval'][1]}]: {rows[0]['engine']} "
                         f"{rows[0]['precision']} {rows[0]['shape']} x{rows[0]['replicas']}")
            if rows else "no deployment serves that rate within the SLO"}
