"""What one anchor identifies: per step-time parameter, fitted from its points or left to its prior.

An anchor is a few measured points of one layout. The fit (`model.fit`) frees a parameter only
where the points can move it at all (t_front needs a concurrency sweep, the weight tile a batch
sweep on AMD), and weighs each freed parameter's data against its prior. Where the data carry
little (`data_share` near 0), the fitted value is the prior's: fine at the anchor's own points,
which by construction barely depend on it, and a guess wherever a prediction depends on it more
than those points did. Issue 26's first failure class is of that kind: a saturated sweep that
runs each length pair at its own concurrency fits the arrival wave (`burst`) at one point and
carries it to long outputs where prefills have spread out.

So this module answers, per anchor: which parameters its points decide, which the prior decides,
which sit at a bound of the fit (an efficiency at its ceiling that still leaves the anchor's own
TTFT unexplained hints that its prompts were partly cached or shorter than stated), and, per
prediction, which prior-led parameters the prediction leans on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from inferasim.model.fit import (
    FREE_PARAMS,
    FitPoint,
    FitProblem,
    first_run_points,
    fit_problem,
    predict_points,
    unexplained_ttft,
)
from inferasim.model.layoutcost import LayoutCost
from inferasim.model.steady import EngineSched
from inferasim.model.steptime import PARAM_BOUNDS, StepParams

# A freed parameter whose information is at least this share from the points counts as measured.
DATA_LED = 0.5
# A prediction leans on a prior-led parameter when its log moves, per e-fold of that parameter,
# this much more than any of the anchor's own measured points did (0.1: an error of a factor 2 in
# the parameter, ln 2 = 0.69, moves the prediction ~7% beyond what the anchor could see).
LEAN_SLOPE = 0.1
# Not a guess when left unfitted: the weight tile is one pass over the weights (a kernel law, see
# steptime.StepParams.m_tile), the client cap a harness fact read from the points.
_NOT_PRIORS = ("m_tile",)
# Relative step of the finite-difference sensitivities (log units).
_STEP = 0.05
METRICS = ("ttft", "tpot", "throughput", "batch_latency")


@dataclass(frozen=True)
class ParamIdentity:
    """One step-time parameter of one anchor's fit."""

    name: str
    value: float
    share: float | None  # of its information from the points; None: not freed by this anchor
    pinned: str = ""  # "low" | "high": at a bound of the fit

    @property
    def source(self) -> str:
        if self.share is None:
            return "prior only"
        return "data" if self.share >= DATA_LED else "mostly prior"

    @property
    def prior_led(self) -> bool:
        return self.name not in _NOT_PRIORS and (self.share is None or self.share < DATA_LED)


@dataclass(frozen=True)
class Identification:
    """What one anchor's points decide, and what they leave to priors."""

    params: tuple[ParamIdentity, ...]
    hints: tuple[str, ...]
    n_points: int

    def prior_led(self) -> list[str]:
        return [p.name for p in self.params if p.prior_led]

    def data_led(self) -> list[str]:
        return [p.name for p in self.params if not p.prior_led and p.share is not None]

    def as_dict(self) -> dict[str, object]:
        return {"n_points": self.n_points, "hints": list(self.hints),
                "params": {p.name: {"value": p.value, "source": p.source, "data_share": p.share,
                                    "pinned": p.pinned or None} for p in self.params}}


def _pinned(name: str, value: float) -> str:
    lo, hi = PARAM_BOUNDS[name]
    if value >= hi * (1.0 - 1e-3):
        return "high"
    # A lower bound of 0 is a floor the parameter may legitimately sit at (no such cost).
    if lo > 0 and value <= lo * (1.0 + 1e-3):
        return "low"
    return ""


def _hints(prob: FitProblem, params: StepParams, idents: Sequence[ParamIdentity]) -> list[str]:
    out: list[str] = []
    pts = [p for p in prob.points if p.scenario != "offline"]
    if len(prob.points) == 1:
        out.append("one measured point: only what that point shows is fitted; the rest are priors")
    pairs: dict[tuple[int, int], set[int]] = {}
    for p in pts:
        pairs.setdefault((p.isl, p.osl), set()).add(p.concurrency)
    if len(pairs) >= 2 and all(len(c) == 1 for c in pairs.values()) and len({min(c) for c in pairs.values()}) > 1:
        out.append("each length pair measured at one concurrency of its own (a max-throughput sweep): the "
                   "first-token wave is fitted at saturation only; TTFT at other concurrencies leans on priors")
    by_name = {p.name: p for p in idents}
    pred = predict_points(params, prob.cost, prob.sched, prob.points)
    if "ttft" in prob.metrics:
        idx, meas = prob.metrics["ttft"]
        excess = float(np.median(np.log(np.maximum(pred["ttft"][idx], 1e-12) / meas)))
        ceiling = [n for n in ("e_flops", "e_attn") if n in by_name and by_name[n].pinned == "high"]
        if ceiling and excess > 0.05:
            out.append(f"{' and '.join(ceiling)} at the compute ceiling and TTFT still {math.expm1(excess):.0%} "
                       "above the anchor's own: its prompts were likely partly cached (a repeated prompt set "
                       "with prefix caching) or shorter than the stated input length")
    if "ttft" in prob.metrics and params.client_cap <= 0.0:
        out += _unexplained_ttft(prob, pred["ttft"])
    for p in idents:
        # The weight tile's upper bound is its law (one pass over the weights for any batch).
        if p.pinned and p.share is not None and p.name not in ("e_flops", "e_attn") and \
                not (p.name == "m_tile" and p.pinned == "high"):
            side = "upper" if p.pinned == "high" else "lower"
            out.append(f"{p.name} pinned at its {side} bound {p.value:.4g}: the points ask for more than the "
                       "step model allows")
    return out


def _unexplained_ttft(prob: FitProblem, fitted: np.ndarray) -> list[str]:
    out = []
    for i in unexplained_ttft(prob.points, fitted):
        pt = prob.points[i]
        out.append(f"TTFT at {pt.concurrency} clients ({pt.isl}x{pt.osl}) is {pt.ttft / fitted[i]:.1f}x what the "  # type: ignore[operator]
                   "fitted engine explains, with no client cap in the points: a wait outside the engine's steps "
                   "(a warm-up, a stalled client, an unrecorded setting); re-measure that point")
    return out


def identify(prob: FitProblem, params: StepParams) -> Identification:
    """The identification of `params` as a solution of `prob`."""
    shares = prob.data_shares(prob.at(params)) if prob.free else {}
    d = params.as_dict()
    # Parameters the kernel set does not have: expert skew of a dense model, a per-prompt-token
    # front-end cost of an engine without one (its default is 0).
    absent = {"moe_skew"} if prob.cost.n_experts == 0 else set()
    if prob.prior.t_front_token <= 0.0:
        absent.add("t_front_token")
    idents = tuple(ParamIdentity(name=n, value=float(d[n]), share=shares.get(n),
                                 pinned=_pinned(n, float(d[n])) if n in shares else "")
                   for n in FREE_PARAMS if n not in absent)
    return Identification(params=idents, hints=tuple(_hints(prob, params, idents)), n_points=len(prob.points))


def identify_fit(cost: LayoutCost, sched: EngineSched, points: Sequence[FitPoint], prior: StepParams,
                 params: StepParams) -> Identification:
    """The identification of an anchor's fitted `params` against its points and default prior, as
    `fit.fit_anchor_params` posed it (first-run points left out, the client cap the fit kept)."""
    warm = first_run_points(points)
    kept = [p for i, p in enumerate(points) if i not in warm] if warm and len(warm) < len(points) else list(points)
    prob = fit_problem(cost, sched, kept, replace(prior, client_cap=params.client_cap))
    return identify(prob, params)


def _slopes(params: StepParams, names: Sequence[str], cost: LayoutCost, sched: EngineSched,
            points: Sequence[FitPoint]) -> dict[str, dict[str, np.ndarray]]:
    """d log(metric) / d log(parameter) at each point, by forward differences (one closed-form
    evaluation per parameter: this runs per prediction)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    d = params.as_dict()
    base = predict_points(params, cost, sched, points)
    for n in names:
        v = float(d[n])
        if v <= 0.0:
            continue
        up = predict_points(replace(params, **{n: v * math.exp(_STEP)}), cost, sched, points)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[n] = {m: (np.log(up[m]) - np.log(base[m])) / _STEP for m in METRICS}
    return out


def anchor_slopes(ident: Identification, params: StepParams, cost: LayoutCost, sched: EngineSched,
                  points: Sequence[FitPoint]) -> dict[str, dict[str, float]]:
    """Per prior-led parameter and metric, the largest |slope| among the anchor's own points: how
    much of that parameter the anchor could see (0 for a metric none of its points has)."""
    out: dict[str, dict[str, float]] = {}
    for n, by_metric in _slopes(params, ident.prior_led(), cost, sched, points).items():
        out[n] = {}
        for m, slope in by_metric.items():
            ref = slope[np.isfinite(slope)]
            out[n][m] = float(np.max(np.abs(ref))) if ref.size else 0.0
    return out


def leaning(seen: dict[str, dict[str, float]], params: StepParams, cost: LayoutCost, sched: EngineSched,
            target: FitPoint) -> dict[str, dict[str, float]]:
    """Per metric, the prior-led parameters (the keys of `seen`, from anchor_slopes) a prediction at
    `target` leans on, each with its excess slope: the prediction moves with it at least LEAN_SLOPE
    more (per e-fold) than the most sensitive of the anchor's own points did."""
    out: dict[str, dict[str, float]] = {}
    for n, by_metric in _slopes(params, list(seen), cost, sched, [target]).items():
        for m, slope in by_metric.items():
            excess = abs(float(slope[0])) - seen[n][m]
            if math.isfinite(excess) and excess >= LEAN_SLOPE:
                out.setdefault(m, {})[n] = excess
    return out
