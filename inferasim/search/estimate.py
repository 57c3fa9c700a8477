"""Stage 1: a vectorised steady-state estimate of every candidate.

For each candidate the closed-loop estimator sweeps the number of requests in flight per replica
(a grid of concurrencies) in one numpy call per layout: that sweep *is* the candidate's
throughput-latency curve. From it: the highest request rate the replica serves within the SLO,
the per-GPU throughput there, the latency at the workload's own rate, and the points of the Pareto
front. Percentiles come from means through fixed ratios (stage 2 replaces them with simulated
ones): P90 TTFT = 1.6 x mean (queueing tails), P90 ITL = 1.25 x mean TPOT (chunked-prefill
spikes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from inferasim.core.spec import SLO
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import FittedAnchor
from inferasim.model.steady import closed_loop, engine_sched, rank_chunk
from inferasim.model.transfer import disagg_point
from inferasim.search.space import Candidate
from inferasim.search.workload import WorkloadShape

CONC_GRID = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], dtype=float)
DISAGG_GRID = np.array([4, 16, 64, 256, 1024], dtype=float)  # pools are priced point by point
TTFT_P90_RATIO = 1.6
ITL_P90_RATIO = 1.25
TTFT_P99_RATIO = 2.5
ITL_P99_RATIO = 1.6


@dataclass
class Estimate:
    candidate: Candidate
    fitted: FittedAnchor
    anchored: bool
    curve_conc: np.ndarray  # per replica
    curve_rate: np.ndarray  # req/s per replica
    curve_ttft: np.ndarray  # s, mean
    curve_tpot: np.ndarray  # s, mean
    max_rate_slo: float = 0.0  # req/s per replica within the SLO
    ttft: float = float("nan")  # at the operating point
    tpot: float = float("nan")
    # Requests in flight per replica at the operating point (the clients of a closed loop, the
    # steady running count at a request rate): what the anchor's concurrency sweep is held against.
    conc: float = float("nan")
    replicas: int = 1
    meets_slo: bool = False
    stage: int = 1
    ttft_p90: float = float("nan")
    itl_p90: float = float("nan")
    slo_tpot: float = float("nan")  # mean TPOT at the highest rate within the SLO (a point of the curve)
    notes: list[str] = field(default_factory=list)
    # s, ITL p90 along the curve where it is not the mean's ITL_P90_RATIO (lockstep ranks: lockstep_itl_p90)
    curve_itl_p90: np.ndarray | None = None

    @property
    def gpus(self) -> int:
        return self.candidate.gpus_per_replica * self.replicas

    def per_gpu_at_slo(self, osl: float) -> float:
        return self.max_rate_slo * osl / self.candidate.gpus_per_replica


def lockstep_itl_p90(tpot: np.ndarray, step_decode: np.ndarray, step_prefill: np.ndarray, dp: int) -> np.ndarray:
    """ITL p90 of attention-dp ranks that run every MoE layer in lockstep (vLLM DP+EP, SGLang and
    ATOM DP attention): a step lasts as long as the slowest rank's, so a rank's decodes wait
    whenever any of the dp ranks runs a prefill. A rank prefills a share u = 1 - t_dec / TPOT of
    its time (the closed loop's stretch); some rank does 1 - (1 - u)^dp of the time, and once that
    passes a tenth, the 90th percentile gap is a step that carries a prefill."""
    u = np.clip(1.0 - step_decode / np.maximum(tpot, 1e-12), 0.0, 1.0)
    some_rank = 1.0 - np.power(1.0 - u, dp)
    mean_based = tpot * ITL_P90_RATIO
    return np.where(some_rank > 0.1, np.maximum(mean_based, step_prefill), mean_based)


def slo_ok(ttft: np.ndarray, tpot: np.ndarray, slo: SLO, itl_p90: np.ndarray | None = None) -> np.ndarray:
    """Where the curve meets the SLO; `itl_p90` (s) where it is not the mean's ITL_P90_RATIO."""
    ok = np.ones_like(ttft, dtype=bool)
    if slo.ttft_p90_ms is not None:
        ok &= ttft * TTFT_P90_RATIO * 1e3 <= slo.ttft_p90_ms
    if slo.itl_p90_ms is not None:
        ok &= (tpot * ITL_P90_RATIO if itl_p90 is None else itl_p90) * 1e3 <= slo.itl_p90_ms
    if slo.ttft_p99_ms is not None:
        ok &= ttft * TTFT_P99_RATIO * 1e3 <= slo.ttft_p99_ms
    if slo.itl_p99_ms is not None:
        ok &= tpot * ITL_P99_RATIO * 1e3 <= slo.itl_p99_ms
    return ok


def estimate_group(fitted: FittedAnchor, candidates: list[Candidate], w: WorkloadShape) -> list[Estimate]:
    """All colocated candidates of one (engine, precision, layout), in one vectorised call."""
    first = candidates[0]
    cost = layout_cost(fitted.model, fitted.gpu, first.layout, fitted.precision, fitted.kv_dtype, fitted.engine,
                       fitted.engine_version)
    base = engine_sched(fitted.engine, fitted.model, fitted.gpu, first.layout, fitted.precision,
                        fitted.engine_version, fitted.kv_dtype)
    n, g = len(candidates), CONC_GRID.size
    mns = np.repeat([float(c.max_num_seqs) for c in candidates], g)
    flag = np.repeat([float(c.max_batched_tokens) for c in candidates], g)
    # The flag's per-rank budget (SGLang divides its chunk by dp_size under DP attention).
    mbt = np.repeat([float(rank_chunk(base.engine, c.max_batched_tokens, first.layout.dp) or 0)
                     for c in candidates], g)
    conc = np.tile(CONC_GRID, n)
    out: list[Estimate] = []
    # Mixed vs separate prefill is a branch of the estimator: evaluate the two groups apart.
    for mixed in (True, False):
        idx = [i for i, c in enumerate(candidates) if (c.chunked_prefill and base.mixed) == mixed]
        if not idx:
            continue
        sel = np.concatenate([np.arange(i * g, (i + 1) * g) for i in idx])
        # A larger SGLang chunk is deployed with --max-prefill-tokens raised to match (render.py).
        sched = replace(base, mixed=mixed, max_num_seqs=mns[sel], max_batched_tokens=mbt[sel],
                        max_prefill_tokens=np.maximum(base.max_prefill_tokens, flag[sel]))
        # Real traffic is not a lock-stepped benchmark: no wave term, and not the anchor's client.
        params = fitted.params.without_harness()
        r = closed_loop(params, cost, sched, np.full(sel.size, w.isl), np.full(sel.size, w.osl), conc[sel], w.hit)
        dp = first.layout.dp
        lockstep = dp > 1 and fitted.model.is_moe  # attention dp ranks meet at every MoE layer
        itl = lockstep_itl_p90(r.tpot, r.step_decode, r.step_prefill, dp) if lockstep else None
        for k, i in enumerate(idx):
            s = slice(k * g, (k + 1) * g)
            rate = r.throughput[s] / w.osl
            out.append(Estimate(candidates[i], fitted, fitted.anchor_id != "unanchored", r.running[s],
                                rate, r.ttft[s], r.tpot[s], curve_itl_p90=None if itl is None else itl[s]))
    return out


def estimate_disagg(fitted: FittedAnchor, cand: Candidate, w: WorkloadShape) -> Estimate:
    d = cand.disagg
    assert d is not None
    # Real traffic is not a lock-stepped benchmark: no wave term, as estimate_group prices the
    # colocated candidates (with the anchor's wave share the TTFT p90 of P3xtp2+D1xtp2 for Llama-3.1-70B
    # on H100 read 848 ms where the replay gives 182 ms, and disaggregation ranked low by construction).
    calm = replace(fitted, fit=replace(fitted.fit, params=fitted.params.without_harness()))
    ttft, tpot, rate = [], [], []
    for c in DISAGG_GRID:
        pt = disagg_point(calm, d.prefill, d.prefill_workers, d.decode, d.decode_workers, int(w.isl * (1 - w.hit))
                          or 1, int(w.osl), int(c))
        ttft.append(pt["ttft"])
        tpot.append(pt["tpot"])
        rate.append(c / (pt["ttft"] + (w.osl - 1) * pt["tpot"]))
    return Estimate(cand, fitted, fitted.anchor_id != "unanchored", DISAGG_GRID.copy(), np.array(rate),
                    np.array(ttft), np.array(tpot))


def _slo_ok_point(ttft: float, tpot: float, slo: SLO, itl_p90: float | None = None) -> bool:
    """`slo_ok` of one point, in Python floats (the same operations: the same answer)."""
    if slo.ttft_p90_ms is not None and not ttft * TTFT_P90_RATIO * 1e3 <= slo.ttft_p90_ms:
        return False
    itl = tpot * ITL_P90_RATIO if itl_p90 is None else itl_p90
    if slo.itl_p90_ms is not None and not itl * 1e3 <= slo.itl_p90_ms:
        return False
    if slo.ttft_p99_ms is not None and not ttft * TTFT_P99_RATIO * 1e3 <= slo.ttft_p99_ms:
        return False
    return not (slo.itl_p99_ms is not None and not tpot * ITL_P99_RATIO * 1e3 <= slo.itl_p99_ms)


def operate(e: Estimate, w: WorkloadShape, slo: SLO, max_gpus: int) -> Estimate:
    """Fill in the SLO capacity, the replica count for the workload and the latency there."""
    # Called once per candidate group (thousands of times): each numpy call on these short curves
    # costs more than its arithmetic, so none is made twice.
    ok = slo_ok(e.curve_ttft, e.curve_tpot, slo, e.curve_itl_p90)
    e.itl_p90 = float("nan")  # read off the curve below, or from the mean
    rates = e.curve_rate
    if ok.any():
        within = rates[ok]
        best = int(np.argmax(within))
        e.max_rate_slo = float(within[best])
        e.slo_tpot = float(e.curve_tpot[int(np.flatnonzero(ok)[best])])
    else:
        e.max_rate_slo = 0.0
    budget_replicas = max(max_gpus // e.candidate.gpus_per_replica, 1)
    if w.rate is not None:
        need = int(np.ceil(w.rate / e.max_rate_slo)) if e.max_rate_slo > 0 else budget_replicas
        e.replicas = max(1, min(need, budget_replicas))
        per_replica = w.rate / e.replicas
        top = rates.max()
        if per_replica > top:
            e.ttft, e.tpot = float("inf"), float("inf")
            e.conc = float(e.curve_conc.max())  # in flight beyond capacity: the curve's last point
            e.notes.append(f"{per_replica:.2f} req/s per replica exceeds its capacity {top:.2f}")
        else:
            order = np.argsort(rates)
            xp = rates[order]
            e.ttft = float(np.interp(per_replica, xp, e.curve_ttft[order]))
            e.tpot = float(np.interp(per_replica, xp, e.curve_tpot[order]))
            if e.curve_itl_p90 is not None:
                e.itl_p90 = float(np.interp(per_replica, xp, e.curve_itl_p90[order]))
            e.conc = float(np.interp(per_replica, xp, e.curve_conc[order]))
        if e.max_rate_slo <= 0:
            # No rate meets the SLO on one replica: no replica count would (not "needs N").
            e.notes.append("no request rate meets the SLO on one replica")
        elif need > budget_replicas:
            e.notes.append(f"needs {need} replicas for {w.rate:.2f} req/s; the budget allows {budget_replicas}")
    else:
        conc = float(w.concurrency or 1)
        e.replicas = 1
        e.ttft = float(np.interp(conc, e.curve_conc, e.curve_ttft))
        e.tpot = float(np.interp(conc, e.curve_conc, e.curve_tpot))
        if e.curve_itl_p90 is not None:
            e.itl_p90 = float(np.interp(conc, e.curve_conc, e.curve_itl_p90))
        e.conc = conc
    e.ttft_p90 = e.ttft * TTFT_P90_RATIO
    if not math.isfinite(e.itl_p90):  # no curve of its own, or a rate beyond the curve
        e.itl_p90 = e.tpot * ITL_P90_RATIO
    e.meets_slo = _slo_ok_point(e.ttft, e.tpot, slo, e.itl_p90) and not blocked(e)
    return e


# Notes that say a candidate cannot serve the workload within the budget, whatever its latency.
BLOCKING_NOTES = ("exceeds", "needs", "no request rate")


def blocking_notes(e: Estimate, words: tuple[str, ...] = BLOCKING_NOTES) -> list[str]:
    """The notes of `e` that say it cannot serve the workload (holding any of `words`)."""
    return [n for n in e.notes if any(word in n for word in words)]


def blocked(e: Estimate, more: tuple[str, ...] = ()) -> bool:
    """Whether a note of `e` says it cannot serve the workload (BLOCKING_NOTES, or `more`)."""
    return bool(blocking_notes(e, BLOCKING_NOTES + more))
