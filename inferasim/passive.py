"""Passive anchors: a live deployment's own metrics, fitted like a harvest.

A running engine is a measurement of its kernel set that users already pay for. Each scrape window
of its Prometheus series gives a point: requests in flight (running + waiting), mean prompt and
output lengths, mean inter-token latency and mean TTFT. The closed-loop benchmark model with the
in-flight count as its concurrency describes such a window, so the same bounded fit applies.

Windows identify the step-time parameters only when the load moved: the batch must span at least
a factor MIN_BATCH_SPREAD across windows (else the fixed cost and the per-sequence cost cannot be
told apart). When it did not, the fit is refused with what is missing instead of writing an anchor
that only fits one operating point.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from inferasim.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.fit import FitPoint, fit_params
from inferasim.layout import Layout
from inferasim.sim.benchmark import engine_sched
from inferasim.steptime import default_params, layout_cost

MIN_WINDOWS = 3
MIN_BATCH_SPREAD = 2.0
MAX_RMS_LOG = 0.25


@dataclass(frozen=True)
class Window:
    """One observation window of a live deployment (means over the window)."""

    start: float  # unix seconds
    end: float
    in_flight: float  # running + waiting requests
    prompt_tokens: float  # mean prompt length of finished requests
    output_tokens: float  # mean output length
    itl_s: float | None  # mean inter-token latency
    ttft_s: float | None  # mean time to first token
    requests: float  # finished in the window


class NotIdentifiable(ValueError):
    """The windows do not pin the parameters; the message says what is missing."""


def usable_windows(windows: list[Window], min_requests: float = 20.0) -> list[Window]:
    return [w for w in windows if w.requests >= min_requests and w.in_flight >= 1 and (w.itl_s or w.ttft_s)
            and w.prompt_tokens > 0 and w.output_tokens > 1]


def check_identifiable(windows: list[Window]) -> None:
    if len(windows) < MIN_WINDOWS:
        raise NotIdentifiable(f"{len(windows)} usable windows (at least {MIN_WINDOWS} with >= 20 finished requests "
                              "and latency series are needed)")
    loads = np.array([w.in_flight for w in windows])
    spread = float(loads.max() / max(loads.min(), 1e-9))
    if spread < MIN_BATCH_SPREAD:
        raise NotIdentifiable(f"not enough spread in batch: requests in flight ranged {loads.min():.1f}-"
                              f"{loads.max():.1f} ({spread:.2f}x); a passive fit needs {MIN_BATCH_SPREAD:.0f}x "
                              "(observe a longer window that covers quiet and busy hours)")


def fit_passive(kernel_set: KernelSet, model: ModelSpec, gpu: GPU, layout: Layout, windows: list[Window],
                source: str, queries: list[str] | None = None) -> Anchor:
    """An Anchor with provenance `passive` from observation windows, or NotIdentifiable."""
    win = usable_windows(windows)
    check_identifiable(win)
    precision = kernel_set.precision or "auto"
    cost = layout_cost(model, gpu, layout, precision, kernel_set.kv_dtype)
    sched = engine_sched(kernel_set.engine, model, gpu, layout, precision, kernel_set.engine_version,
                         kernel_set.kv_dtype)
    points = [FitPoint(isl=max(int(round(w.prompt_tokens)), 1), osl=max(int(round(w.output_tokens)), 2),
                       concurrency=max(int(round(w.in_flight)), 1), ttft=w.ttft_s, tpot=w.itl_s) for w in win]
    # Live traffic is not a lock-stepped benchmark: no arrival waves.
    prior = replace(default_params(gpu, kernel_set.engine), burst=0.0)
    result = fit_params(cost, sched, points, prior, free=("t_fixed", "t_seq", "e_bw", "e_kv", "e_flops",
                                                          "e_attn", "moe_skew", "t_ttft"))
    params = result.params
    if result.rms_log_error > MAX_RMS_LOG:
        raise NotIdentifiable(f"the windows do not fit one step-time model (rms log error "
                              f"{result.rms_log_error:.2f} > {MAX_RMS_LOG}): the deployment may have changed "
                              "during the window")
    bench = [BenchPoint(isl=p.isl, osl=p.osl, concurrency=p.concurrency, ttft_ms=p.ttft * 1e3 if p.ttft else None,
                        tpot_ms=p.tpot * 1e3 if p.tpot else None, row_id=f"window@{w.start:.0f}")
             for p, w in zip(points, win, strict=True)]
    return Anchor(
        kernel_set=kernel_set, layout=LayoutModel.from_layout(layout), points=bench,
        params={**params.as_dict(), "burst": 0.0},
        fit=FitReport(n_points=result.n_points, rms_log_error=result.rms_log_error,
                      max_abs_log_error=result.max_abs_log_error, per_metric=result.per_metric_mape,
                      converged=result.converged, message=result.message),
        provenance=Provenance(method="passive", source=source,
                              measured_at=f"{min(w.start for w in win):.0f}-{max(w.end for w in win):.0f}",
                              measured_by="inferasim passive fit", rows=[b.row_id for b in bench],
                              notes="queries: " + " | ".join(queries or [])),
    )
