"""Canary anchors: one measured operating point, calibrated onto the kernel set's parent anchor.

A canary runs one short-listed configuration on live traffic for a window. Its series give one
operating point: requests in flight, mean prompt and output lengths, mean inter-token latency and
mean TTFT. One point cannot identify the step-time parameters (DESIGN.md section 3: fixed host
cost and weight-streaming efficiency trade against each other at one batch), so this module fits
only what one point does identify:

* a **step scale** ``s``: every step of the parent anchor, transferred to the canary's layout,
  takes ``s`` times as long (host costs and the collective multiplier times ``s``, efficiencies
  divided by ``s`` and capped at 1, the physical peak). The mean ITL pins it.
* the **per-request TTFT overhead** ``t_ttft`` (API server, tokeniser, first chunk), which the
  mean TTFT pins once the steps are right.

Everything else stays the parent's. Without a parent anchor the measurement-free defaults of the
GPU family are calibrated the same way, and the provenance says so. The result is an
:class:`~inferasim.model.anchors.Anchor` with provenance ``canary``, its measured points, the residuals
before (the parent's prediction error at the canary's point) and after the calibration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.errors import UserError
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.model.fit import predict_points
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import fit_points
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import PARAM_BOUNDS, STEP_MODEL_REVISION, StepParams, default_params

__all__ = [
    "Calibration",
    "CalibrationError",
    "CanaryWindow",
    "SCALE_BOUNDS",
    "calibrate",
    "measure_window",
    "scale_params",
    "window_point",
]

# A canary more than 20x off its parent is not the same kernel set (or not the same machine):
# refuse rather than store a scale that explains nothing.
SCALE_BOUNDS = (0.05, 20.0)
# Parameters that are times (scaled by s) and efficiencies (divided by s) in StepParams.
_TIMES = ("t_fixed", "t_seq", "comm_scale")
_EFFICIENCIES = ("e_bw", "e_kv", "e_flops", "e_attn")
# The solution must reproduce the measured ITL this closely (log units) to count as calibrated.
CONVERGED_LOG = 1e-3


class CalibrationError(UserError):
    """A measurement that cannot be calibrated; the message says which quantity is wrong."""


@dataclass(frozen=True)
class CanaryWindow:
    """What a canary served over its window (means over the window)."""

    in_flight: float  # running + waiting requests
    prompt_tokens: float  # mean prompt length
    output_tokens: float  # mean output length
    itl_s: float | None  # mean inter-token latency
    ttft_s: float | None  # mean time to first token
    queries: tuple[str, ...] = ()  # the PromQL the means came from (provenance)


@dataclass
class Calibration:
    anchor: Anchor
    scale: float
    t_ttft_s: float
    parent_id: str | None
    # log(predicted / measured) per metric, summed over points as an RMS: before (the parent's
    # transferred prediction at the canary's points) and after the calibration.
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)


def _positive(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise CalibrationError(f"{name} was not measured (None); a canary point needs it")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise CalibrationError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise CalibrationError(f"{name} must be a positive finite number, got {value!r}")
    return v


def window_point(w: CanaryWindow, row_id: str = "") -> BenchPoint:
    """The window as a closed-loop benchmark point at concurrency = requests in flight (the model
    passive anchors use: live traffic with that many requests in the engine at a time).
    CalibrationError for garbage: missing, zero, negative or non-finite latencies or lengths."""
    itl = _positive("mean inter-token latency", w.itl_s)
    ttft = _positive("mean time to first token", w.ttft_s, allow_none=True)
    try:
        in_flight = float(w.in_flight)
    except (TypeError, ValueError):
        raise CalibrationError(f"requests in flight must be a number, got {w.in_flight!r}") from None
    # Zero is a real reading: a lightly loaded canary whose requests are shorter than the scrape
    # interval shows an empty engine in most samples. A measured ITL proves tokens were made,
    # each with at least one request in the batch, so the point is taken at concurrency 1.
    if not math.isfinite(in_flight) or in_flight < 0:
        raise CalibrationError(f"requests in flight must be a finite number >= 0, got {w.in_flight!r}")
    prompt = _positive("mean prompt length", w.prompt_tokens)
    output = _positive("mean output length", w.output_tokens)
    assert itl is not None and prompt is not None and output is not None
    if output < 2:
        raise CalibrationError(f"mean output length {output:g} < 2 tokens: no inter-token latency to calibrate on")
    return BenchPoint(isl=max(int(round(prompt)), 1), osl=max(int(round(output)), 2),
                      concurrency=max(int(round(in_flight)), 1), ttft_ms=None if ttft is None else ttft * 1e3,
                      tpot_ms=itl * 1e3, row_id=row_id)


def scale_params(params: StepParams, scale: float) -> StepParams:
    """Every step ``scale`` times as long: times times ``scale``, efficiencies divided by it, capped
    at 1 (the rate the kernels can reach, see steptime.PARAM_BOUNDS: a canary faster than that is
    explained by the host part instead)."""
    d = params.as_dict()
    for k in _TIMES:
        d[k] = d[k] * scale
    for k in _EFFICIENCIES:
        d[k] = min(d[k] / scale, 1.0)
    return StepParams(**d)


def calibrate(kernel_set: KernelSet, layout: Layout, points: Sequence[BenchPoint], parent: Anchor | None, *,
              source: str, measured_at: str = "", measured_by: str = "inferasim canary calibration",
              engine_image: str = "", gpu_seconds: float = 0.0, notes: str = "") -> Calibration:
    """An anchor of ``kernel_set`` at ``layout`` from canary ``points`` (closed-loop points with a
    mean TPOT, optionally a mean TTFT), calibrated on ``parent`` (or on the defaults when None).

    Several points (earlier canaries of the same kernel set and layout) share one scale and one
    TTFT overhead, fitted in least squares on log errors. CalibrationError when the points are
    unusable or the scale would leave SCALE_BOUNDS."""
    if not points:
        raise CalibrationError("no canary point to calibrate on")
    for i, p in enumerate(points):
        if p.scenario != "closed" or p.tpot_ms is None:
            raise CalibrationError(f"point {i} ({p.row_id or 'no id'}): a canary point is closed-loop with a "
                                   "measured mean TPOT")
        _positive(f"point {i} tpot_ms", p.tpot_ms)
        _positive(f"point {i} ttft_ms", p.ttft_ms, allow_none=True)
    try:
        engine = normalize_engine(kernel_set.engine)
        model = get_model(kernel_set.model)
        gpu = get_gpu(kernel_set.gpu)
    except ValueError as exc:
        raise CalibrationError(f"kernel set {kernel_set.describe()}: {exc}") from None
    if parent is not None and not parent.kernel_set.same_kernels(kernel_set):
        diffs = ", ".join(f"{n} ({a!r} vs {b!r})" for n, a, b in parent.kernel_set.differences(kernel_set))
        raise CalibrationError(f"parent anchor {parent.id} measured other kernels: {diffs}")
    if parent is not None:
        if parent.params:
            base = StepParams.from_dict(parent.params)
        else:  # an anchor stored without parameters: fit it as the predictor would
            from inferasim.model.predictor import fitted_from_anchor

            base = fitted_from_anchor(parent).params
    else:
        base = default_params(gpu, engine, kernel_set.engine_version)
    # Live traffic is not a lock-stepped benchmark: no arrival waves (as passive anchors), and
    # not the parent's benchmark client either.
    base = base.without_harness()
    precision = kernel_set.precision or "auto"
    cost = layout_cost(model, gpu, layout, precision, kernel_set.kv_dtype, engine, kernel_set.engine_version)
    sched = engine_sched(engine, model, gpu, layout, precision, kernel_set.engine_version, kernel_set.kv_dtype)
    if sched.kv_tokens <= 0:
        raise CalibrationError(f"{model.name} does not fit {gpu.name} at {layout.label()} by the memory model")
    fpts = fit_points(points)  # validated above: positive TPOT, TTFT positive or None
    meas_tpot = np.array([p.tpot for p in fpts], dtype=float)
    ttft_idx = np.array([i for i, p in enumerate(fpts) if p.ttft is not None], dtype=int)
    meas_ttft = np.array([fpts[i].ttft for i in ttft_idx], dtype=float)
    lo_t, hi_t = max(PARAM_BOUNDS["t_ttft"][0], 1e-4), PARAM_BOUNDS["t_ttft"][1]

    def params_of(z: np.ndarray) -> StepParams:
        p = scale_params(base, float(np.exp(z[0])))
        if len(z) > 1:
            p = replace(p, t_ttft=float(np.exp(z[1])))
        return p

    def residuals(prm: StepParams) -> dict[str, np.ndarray]:
        pred = predict_points(prm, cost, sched, fpts)
        out = {"tpot": np.log(np.maximum(pred["tpot"], 1e-12) / meas_tpot)}
        if ttft_idx.size:
            out["ttft"] = np.log(np.maximum(pred["ttft"][ttft_idx], 1e-12) / meas_ttft)
        return out

    def stacked(z: np.ndarray) -> np.ndarray:
        r = residuals(params_of(z))
        return np.concatenate([r["tpot"], r.get("ttft", np.zeros(0))])

    z0 = [0.0]
    lo, hi = [math.log(SCALE_BOUNDS[0])], [math.log(SCALE_BOUNDS[1])]
    if ttft_idx.size:
        z0.append(math.log(min(max(base.t_ttft, lo_t), hi_t)))
        lo.append(math.log(lo_t))
        hi.append(math.log(hi_t))
    before = residuals(base)
    # Levenberg-Marquardt on the log scale, clipped to the bounds (no scipy in the runtime deps):
    # exact for one consistent point (two equations, two unknowns), the least-squares
    # compromise for several.
    z, success, message = _solve(stacked, np.array(z0), np.array(lo), np.array(hi))
    scale = float(np.exp(z[0]))
    params = params_of(z)
    after = residuals(params)
    at_bound = abs(z[0] - lo[0]) < 1e-6 or abs(z[0] - hi[0]) < 1e-6
    if at_bound:
        raise CalibrationError(f"the canary's ITL needs a step scale outside {SCALE_BOUNDS[0]:g}-{SCALE_BOUNDS[1]:g}x "
                               f"of {'parent ' + parent.id if parent else 'the defaults'}: measured "
                               f"{meas_tpot.mean() * 1e3:.3g} ms vs predicted "
                               f"{meas_tpot.mean() * math.exp(float(before['tpot'].mean())) * 1e3:.3g} ms; "
                               "not the same kernels, or not a usable measurement")

    def rms(a: np.ndarray) -> float:
        return float(np.sqrt(np.mean(a ** 2))) if a.size else 0.0

    all_after = np.concatenate(list(after.values()))
    converged = bool(abs(float(after["tpot"].mean())) <= CONVERGED_LOG) if len(points) == 1 else success
    pred_after = predict_points(params, cost, sched, fpts)
    per_metric = {"tpot": float(np.median(np.abs(pred_after["tpot"] - meas_tpot) / meas_tpot))}
    if ttft_idx.size:
        per_metric["ttft"] = float(np.median(np.abs(pred_after["ttft"][ttft_idx] - meas_ttft) / meas_ttft))
    parent_text = (f"parent anchor {parent.id} ({parent.provenance.method}, measured at "
                   f"{parent.layout.to_layout().label()}) transferred to {layout.label()}" if parent is not None else
                   "no parent anchor: the measurement-free defaults of the GPU family, calibrated the same way")
    t_ttft = params.t_ttft
    text = (f"canary calibration on {parent_text}; step scale {scale:.4f}, t_ttft {base.t_ttft * 1e3:.1f} -> "
            f"{t_ttft * 1e3:.1f} ms, burst 0 (live traffic); one operating point identifies only these two, the "
            f"other parameters are the parent's. Log residuals (predicted/measured) before: "
            + ", ".join(f"{k} {rms(v):+.3f}" if v.size == 1 else f"{k} rms {rms(v):.3f}" for k, v in before.items())
            + "; after: " + ", ".join(f"{k} rms {rms(v):.2e}" for k, v in after.items()))
    if notes:
        text += f". {notes}"
    anchor = Anchor(
        kernel_set=kernel_set, layout=LayoutModel.from_layout(layout), points=list(points),
        params=params.as_dict(),
        fit=FitReport(n_points=len(points), rms_log_error=rms(all_after),
                      max_abs_log_error=float(np.max(np.abs(all_after))) if all_after.size else 0.0,
                      per_metric=per_metric, converged=converged,
                      message=f"canary calibration: scale {scale:.4f}; {message}"[:500],
                      step_model=STEP_MODEL_REVISION),
        provenance=Provenance(method="canary", source=source, measured_at=measured_at, engine_image=engine_image,
                              measured_by=measured_by, rows=[p.row_id for p in points if p.row_id],
                              gpu_seconds=max(gpu_seconds, 0.0), notes=text),
    )
    return Calibration(anchor=anchor, scale=scale, t_ttft_s=t_ttft, parent_id=parent.id if parent else None,
                       before={k: rms(v) if v.size > 1 else float(v[0]) for k, v in before.items()},
                       after={k: rms(v) for k, v in after.items()})


def _solve(f: Any, z: np.ndarray, lo: np.ndarray, hi: np.ndarray, max_iter: int = 60) -> tuple[np.ndarray, bool, str]:
    """Minimise |f(z)|^2 inside [lo, hi] by damped Gauss-Newton with forward differences."""
    r = f(z)
    cost = float(r @ r)
    lam = 1e-3
    for it in range(max_iter):
        if cost < 1e-24:
            return z, True, f"exact after {it} iterations"
        jac = np.empty((r.size, z.size))
        for j in range(z.size):
            dz = np.zeros_like(z)
            dz[j] = 1e-7
            jac[:, j] = (f(z + dz) - r) / 1e-7
        g, h = jac.T @ r, jac.T @ jac
        for _ in range(12):
            z_new = np.clip(z - np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-12), g), lo, hi)
            r_new = f(z_new)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                done = cost - c_new <= 1e-15 * max(cost, 1e-30) or np.max(np.abs(z_new - z)) < 1e-13
                z, r, cost, lam = z_new, r_new, c_new, max(lam / 5.0, 1e-12)
                break
            lam *= 8.0
        else:
            return z, True, f"no further improvement after {it} iterations (residual {cost:.2e})"
        if done:
            return z, True, f"converged after {it + 1} iterations (residual {cost:.2e})"
    return z, False, f"stopped after {max_iter} iterations (residual {cost:.2e})"


# --------------------------------------------------------------------------------------------
# the window means from Prometheus
# --------------------------------------------------------------------------------------------

# Histogram and gauge names per engine (the same families inferasim.observe reads).
_SERIES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
             "ttft": ("vllm:time_to_first_token_seconds",),
             "running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",)},
    "sglang": {"itl": ("sglang:inter_token_latency_seconds",), "ttft": ("sglang:time_to_first_token_seconds",),
               "running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",)},
}


def measurable(engine: str) -> bool:
    """Whether a canary of `engine` can be measured from Prometheus (it exports latency
    histograms; ATOM does not)."""
    return engine in _SERIES


def measure_window(observed: Any, url: str, *, timeout: float = 10.0, transport: Any = None) -> CanaryWindow:
    """The means of one canary's window, evaluated at the same instant as ``observed`` (an
    :class:`inferasim.observed.ObservedWorkload` of the canary's series): mean ITL and TTFT from the
    histograms' ``_sum / _count`` rates, requests in flight as the window's average of running +
    waiting. CalibrationError when the engine exports no latency histograms (ATOM) or a series is
    missing: never a made-up zero."""
    from inferasim.observe import ObservationError, PrometheusClient, selector_matchers

    names = _SERIES.get(observed.engine)
    if names is None:
        raise CalibrationError(f"{observed.engine} exports no latency histograms: a canary of it cannot be "
                               "calibrated from Prometheus")
    s, w, at = selector_matchers(observed.selector), observed.window, observed.observed_at
    used: list[str] = []

    def first(client: PrometheusClient, alternatives: list[str], what: str) -> float:
        for q in alternatives:
            v = client.scalar(q, at)
            if v is not None and math.isfinite(v):
                used.append(q)
                return v
        raise CalibrationError(f"{what}: no data for {s} over {w} (query: {alternatives[0]})")

    try:
        with PrometheusClient(url, timeout=timeout, transport=transport) as client:
            means = {}
            for key in ("itl", "ttft"):
                means[key] = first(client, [f"sum(rate({h}_sum{s}[{w}])) / sum(rate({h}_count{s}[{w}]))"
                                            for h in names[key]], f"mean {key}")
            in_flight = sum(first(client, [f"sum(avg_over_time({g}{s}[{w}]))" for g in names[key]], key)
                            for key in ("running", "waiting"))
    except ObservationError as exc:
        raise CalibrationError(str(exc)) from None
    return CanaryWindow(in_flight=in_flight, prompt_tokens=observed.prompt_tokens_mean,
                        output_tokens=observed.output_tokens_mean, itl_s=means["itl"], ttft_s=means["ttft"],
                        queries=tuple(used))
