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

import datetime as dt
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.errors import UserError
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.model.fit import FitPoint, fit_params
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import STEP_MODEL_REVISION, default_params

if TYPE_CHECKING:

    pass

MIN_WINDOWS = 3
MIN_BATCH_SPREAD = 2.0
# Prompt lengths must span this factor across windows for the prefill efficiencies (e_flops,
# e_attn) to be fitted: at one prompt length the prefill time and the per-request TTFT overhead
# add up to one number. Below it they keep the GPU family's defaults, and the anchor says so.
MIN_PROMPT_SPREAD = 1.5
PREFILL_PARAMS = ("e_flops", "e_attn")
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


class NotIdentifiable(UserError):
    """The windows do not pin the parameters; the message says what is missing."""


MIN_REQUESTS = 20.0


def _unusable(w: Window, min_requests: float = MIN_REQUESTS) -> str | None:
    """Why a window cannot be a fit point, or None."""
    if w.requests < min_requests:
        return f"fewer than {min_requests:.0f} finished requests"
    # A closed-loop client at concurrency 1 leaves the engine idle between its requests (0.7-0.9
    # in flight on average): still a batch-1 point once rounded, so only idler windows are dropped.
    if w.in_flight < 0.5:
        return "less than half a request in flight on average"
    if not (w.itl_s or w.ttft_s):
        return "no TTFT or inter-token latency observed"
    if not (w.prompt_tokens > 0 and w.output_tokens > 1):
        return "no prompt or fewer than two output tokens"
    return None


def usable_windows(windows: list[Window], min_requests: float = MIN_REQUESTS) -> list[Window]:
    return [w for w in windows if _unusable(w, min_requests) is None]


def check_identifiable(windows: list[Window], observed: list[Window] | None = None) -> None:
    """NotIdentifiable unless ``windows`` (the usable ones) pin the parameters; ``observed`` (all
    windows) only makes the message say why the others were left out."""
    if len(windows) < MIN_WINDOWS:
        why: dict[str, int] = {}
        for w in observed or []:
            reason = _unusable(w)
            if reason is not None:
                why[reason] = why.get(reason, 0) + 1
        dropped = "; ".join(f"{n} with {r}" for r, n in why.items())
        raise NotIdentifiable(f"{len(windows)} usable windows (at least {MIN_WINDOWS} with >= {MIN_REQUESTS:.0f} "
                              "finished requests and latency series are needed)"
                              + (f"; of {len(observed or [])} observed: {dropped}" if dropped else ""))
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
    check_identifiable(win, windows)
    precision = kernel_set.precision or "auto"
    cost = layout_cost(model, gpu, layout, precision, kernel_set.kv_dtype, kernel_set.engine,
                       kernel_set.engine_version)
    sched = engine_sched(kernel_set.engine, model, gpu, layout, precision, kernel_set.engine_version,
                         kernel_set.kv_dtype)
    points = [FitPoint(isl=max(int(round(w.prompt_tokens)), 1), osl=max(int(round(w.output_tokens)), 2),
                       concurrency=max(int(round(w.in_flight)), 1), ttft=w.ttft_s, tpot=w.itl_s) for w in win]
    # Live traffic is not a lock-stepped benchmark: no arrival waves.
    prior = replace(default_params(gpu, kernel_set.engine, kernel_set.engine_version), burst=0.0)
    free = ("t_fixed", "t_seq", "e_bw", "e_kv", "e_flops", "e_attn", "moe_skew", "t_ttft")
    prompts = np.array([w.prompt_tokens for w in win])
    prompt_spread = float(prompts.max() / max(prompts.min(), 1e-9))
    unidentified = ""
    if prompt_spread < MIN_PROMPT_SPREAD:
        free = tuple(f for f in free if f not in PREFILL_PARAMS)
        unidentified = (f"prefill efficiency ({', '.join(PREFILL_PARAMS)}) not identified: mean prompt lengths "
                        f"spanned {prompts.min():.0f}-{prompts.max():.0f} tokens ({prompt_spread:.2f}x; "
                        f"{MIN_PROMPT_SPREAD:g}x needed), the GPU family's defaults are kept; TTFT at other "
                        "prompt lengths is extrapolated. ")
    result = fit_params(cost, sched, points, prior, free=free)
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
                      converged=result.converged, message=(unidentified + result.message)[:500],
                      step_model=STEP_MODEL_REVISION),
        provenance=Provenance(method="passive", source=source,
                              measured_at=f"{iso_utc(min(w.start for w in win))}/{iso_utc(max(w.end for w in win))}",
                              measured_by="inferasim passive fit", rows=[b.row_id for b in bench],
                              notes=unidentified + "queries: " + " | ".join(queries or [])),
    )


def iso_utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
