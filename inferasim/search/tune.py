"""`inferasim tune`: space -> stage 1 (vectorised estimates) -> stage 2 (simulator on the best) ->
recommendation, Pareto front and a short list of five."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferasim.catalog.checkpoints import priced_precision
from inferasim.catalog.gpus import GPU, get_gpu, siblings
from inferasim.catalog.models import ModelSpec, context_error, get_model, resolve_model_name
from inferasim.catalog.precision import weight_class
from inferasim.core.spec import SLO, TuningSpec
from inferasim.harvest.plan import engine_startup_s, harvest_gpu_hours
from inferasim.model.anchor_store import AnchorStore, method_rank
from inferasim.model.anchors import SHIPPED_ANCHORS, Anchor
from inferasim.model.measurement_free import measurement_free
from inferasim.model.predictor import FittedAnchor, benchmark_kv_dtype, carry_to_gpu, fitted_from_anchor
from inferasim.search.capacity import answer as capacity_answer
from inferasim.search.estimate import (
    Estimate,
    blocked,
    blocking_notes,
    estimate_disagg,
    estimate_group,
    operate,
    slo_ok,
)
from inferasim.search.select import ParetoPoint, cost_per_million_tokens, objective_value, pareto_front, shortlist
from inferasim.search.space import Candidate, Space, build_space
from inferasim.search.stage2 import (
    Replays,
    apply_replay,
    copy_estimate,
    replay_the_shortlist,
    run_stage2,
    with_shapes,
)
from inferasim.search.workload import WorkloadShape, shape_of

STAGE2_TOP = 50
# Stage-2 misses given more replicas (see _add_replicas): candidates tried, replicas added at most.
STAGE2_RETRY_CANDIDATES = 10
STAGE2_RETRY_REPLICAS = 4
CANARY_MINUTES = 30.0  # the default confirmation window of a ServingTuning
MAX_DISAGG_PER_KERNEL = 48  # pools are priced point by point; the smallest shapes first

Progress = Callable[[str, int, int], None]


@dataclass
class TuneResult:
    spec: TuningSpec
    model: ModelSpec
    gpu: GPU
    workload: WorkloadShape
    space: Space
    ranked: list[Estimate]
    pareto: list[ParetoPoint]
    missing_anchors: list[dict[str, Any]]
    timings: dict[str, float]
    anchors_used: dict[str, str] = field(default_factory=dict)
    proposals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def recommendation(self) -> Estimate | None:
        return self.ranked[0] if self.ranked else None

    def shortlist(self) -> list[Estimate]:
        return shortlist(self.ranked, 5)

    def entry(self, e: Estimate) -> dict[str, Any]:
        c = e.candidate
        osl = self.workload.osl
        isl = int(self.workload.isl)
        # Held against the anchor's sweep: requests in flight per replica at the operating point
        # (a request-rate workload has no client count of its own).
        conc = max(int(round(e.conc)), 1) if math.isfinite(e.conc) else None
        spread = e.fitted.spread(not e.anchored or e.fitted.beyond_measured(conc or 1, isl, int(osl)), c.layout,
                                  isl, int(osl), concurrency=conc)
        price = self.spec.hardware.price_per_gpu_hour
        d: dict[str, Any] = {
            "engine": c.engine, "precision": c.precision, "layout": c.layout.as_dict(),
            "layout_label": c.layout.label(), "shape": c.disagg.label() if c.disagg else c.layout.label(),
            "replicas": e.replicas, "gpus": e.gpus,
            "gpus_per_replica": c.gpus_per_replica,
            "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_batched_tokens,
            "chunked_prefill": c.chunked_prefill, "spec_method": c.spec_method,
            "disaggregation": None if c.disagg is None else {
                "prefill_workers": c.disagg.prefill_workers, "prefill_layout": c.disagg.prefill.as_dict(),
                "decode_workers": c.disagg.decode_workers, "decode_layout": c.disagg.decode.as_dict()},
            "predicted": {
                "throughput_per_gpu_at_slo": e.per_gpu_at_slo(osl),
                "max_request_rate_per_replica_at_slo": e.max_rate_slo,
                "ttft_ms": _ms(e.ttft), "tpot_ms": _ms(e.tpot), "ttft_p90_ms": _ms(e.ttft_p90),
                "itl_p90_ms": _ms(e.itl_p90), "tokens_per_s_per_user": (1.0 / e.tpot) if e.tpot > 0 else None,
                "interval_log": spread, "stage": e.stage,
                # Two operating points: the *_at_slo figures are at the highest rate a replica serves
                # within the SLO (tpot_at_slo_ms: the TPOT there); the latencies and tokens per user
                # at the rate the workload gives each replica.
                "tpot_at_slo_ms": _ms(e.slo_tpot),
                "workload_request_rate_per_replica": (self.workload.rate / e.replicas
                                                      if self.workload.rate is not None else None),
            },
            "meets_slo": e.meets_slo, "extrapolated": not e.anchored,
            # what the prediction carries from its anchor (what `interval_log` is wide for)
            "carries": e.fitted.carries(c.layout, isl, int(osl), conc),
            "anchor": e.fitted.anchor_id if e.anchored else None,
            "mode": "anchored" if e.anchored else "unanchored: ranked within its engine only",
            "notes": e.notes,
        }
        if price is not None:
            d["predicted"]["cost_per_million_tokens"] = cost_per_million_tokens(e, osl, price)
            # Confirming on hardware: a canary of this deployment for CANARY_MINUTES.
            d["confirm_gpu_hours"] = c.gpus_per_replica * CANARY_MINUTES / 60.0
            d["confirm_cost"] = d["confirm_gpu_hours"] * price
        return d

    def as_dict(self) -> dict[str, Any]:
        rec = self.recommendation
        return {
            "model": self.model.name, "gpu": self.gpu.name, "workload": self.workload.describe(),
            "objective": self.spec.objective.model_dump(by_alias=True, exclude_none=True),
            "recommendation": self.entry(rec) if rec else None,
            "shortlist": [self.entry(e) for e in self.shortlist()],
            "pareto": [p.as_dict() for p in self.pareto],
            "missing_anchors": self.missing_anchors,
            "anchors_used": self.anchors_used,
            "space": {"candidates": len(self.space.candidates), "pruned": len(self.space.pruned),
                      "pruned_reasons": [{"what": w, "why": r} for w, r in self.space.pruned[:200]],
                      "excluded": [{"what": w, "why": r} for w, r in self.space.excluded]},
            "timings_s": self.timings,
            "proposals": self.proposals,
            "capacity": capacity_answer(self),
        }


def _ms(v: float) -> float | None:
    return None if not math.isfinite(v) else v * 1e3


def _weights(precision: str, model_id: str, model: ModelSpec) -> str | None:
    """The weight class (catalog.precision.weight_class: the 16-bit formats one class, NVFP4 and MXFP4
    another) a precision of ``model_id`` runs at; an empty or `auto` precision (a data row that
    names none) is the checkpoint's own (catalog.checkpoints.priced_precision): a Qwen3-32B anchor recorded as
    "" is a bf16 one, and was passed over for a bf16 request."""
    return weight_class(priced_precision(precision or "auto", model_id, model))


def _anchor_for(store: AnchorStore, engine: str, model: ModelSpec, gpu: GPU, precision: str,
                kv_dtype: str | None = None) -> Anchor | None:
    """The best stored anchor of (engine, model, GPU, precision), any engine version: the newest
    measurements a user would deploy. Anchors measured on purpose (public data, harvest, PyTorch)
    come before those taken from live traffic (passive, canary), as in the store's own ranking, so
    that a live fit never silently replaces a measurement; then more points, then the newest version.
    ``kv_dtype``, when given, must match too (another KV dtype is another kernel set)."""
    hits = []
    for a in store.all():
        ks = a.kernel_set
        if ks.engine != engine:
            continue
        try:
            same_model = resolve_model_name(ks.model) == model.name
            same_gpu = get_gpu(ks.gpu).name == gpu.name
        except ValueError:
            continue
        if kv_dtype not in (None, "", "auto") and (ks.kv_dtype or "auto") != kv_dtype:
            continue
        if same_model and same_gpu and _weights(ks.precision, ks.model, model) == _weights(precision, model.name,
                                                                                            model):
            hits.append(a)
    return max(hits, key=_anchor_rank) if hits else None


def _anchor_rank(a: Anchor) -> tuple[int, int, str]:
    """Which of several anchors of one kernel set predictions use (the higher): measured on purpose
    before live traffic, then more points, then the newest engine version."""
    return -method_rank(a), len(a.points), a.kernel_set.engine_version


def anchored_fit(store: AnchorStore, engine: str, model: ModelSpec, gpu: GPU, precision: str,
                 kv_dtype: str | None = None) -> tuple[FittedAnchor, Anchor] | None:
    """The fitted anchor predictions of (engine, model, GPU, precision) use, with the stored anchor
    it came from: the GPU's own best anchor (_anchor_for), else the best anchor of a sibling GPU
    (the same die: H100 for an H200) carried to it (predictor.carry_to_gpu); None when neither
    exists."""
    own = _anchor_for(store, engine, model, gpu, precision, kv_dtype)
    if own is not None:
        return fitted_from_anchor(own), own
    found = [a for name in siblings(gpu)
             if (a := _anchor_for(store, engine, model, get_gpu(name), precision, kv_dtype)) is not None]
    if not found:
        return None
    best = max(found, key=_anchor_rank)
    return carry_to_gpu(fitted_from_anchor(best), gpu), best


def _slo_ratios(e: Estimate, slo: SLO) -> list[tuple[str, float, float, float]]:
    """(term, value in s, target in ms, value / target) of each p90 term the SLO sets; the ratio
    is inf where the value is not finite (the workload exceeds the capacity)."""
    return [(name, v, t, v * 1e3 / t if math.isfinite(v) else math.inf)
            for name, v, t in (("TTFT p90", e.ttft_p90, slo.ttft_p90_ms), ("ITL p90", e.itl_p90, slo.itl_p90_ms))
            if t is not None]


def slo_excess(e: Estimate, slo: SLO) -> float:
    """How far `e` is from its SLO: the largest ratio of a percentile to its target (below 1 when
    every term holds; inf where the workload exceeds the capacity)."""
    return max((ratio for *_, ratio in _slo_ratios(e, slo)), default=0.0)


def slo_miss(e: Estimate, slo: SLO) -> str:
    """The SLO term `e` misses the most, in words ('' when it meets every term)."""
    missed = [r for r in _slo_ratios(e, slo) if r[3] > 1.0]
    if not missed:
        return ""
    name, v, t, _ = max(missed, key=lambda r: r[3])
    return (f"{name} {v * 1e3:,.0f} ms against {t:g} ms" if math.isfinite(v) else
            f"{name} unbounded (the workload's rate exceeds what the budget serves)")


def _replay_within_slo(e: Estimate, slo: SLO) -> bool:
    """Stage 2's simulated p90s within the SLO's p90 terms."""
    return (slo.ttft_p90_ms is None or e.ttft_p90 * 1e3 <= slo.ttft_p90_ms) and \
        (slo.itl_p90_ms is None or e.itl_p90 * 1e3 <= slo.itl_p90_ms)


def _simulated_slo_ok(e: Estimate, slo: SLO) -> bool:
    """The SLO on stage 2's simulated percentiles (and no budget, capacity or drop note)."""
    return _replay_within_slo(e, slo) and not blocked(e, ("dropped",))


def _add_replicas(top: list[Estimate], w: WorkloadShape, slo: SLO, max_gpus: int,
                  replays: Replays | None = None) -> list[Estimate]:
    """Stage 1 sizes replicas from mean-based percentiles; where the simulation then misses the
    SLO at a request rate (ITL spikes of chunked prefill, TTFT tails), the SLO capacity per
    replica is below the rate each replica got: it is capped there, and the candidate is simulated
    again with one more replica at a time while the GPU budget allows (the first
    STAGE2_RETRY_CANDIDATES such candidates, STAGE2_RETRY_REPLICAS more at most). Without this, a
    3-GPU budget was reported as meeting no SLO while three tp1 replicas met it."""
    if w.rate is None:
        return top
    replays = replays if replays is not None else Replays(w)
    out, retried = [], 0
    for e in top:
        fixable = e.stage == 2 and not e.meets_slo and e.candidate.disagg is None and \
            not blocked(e, ("dropped", "completed no"))
        if not fixable:
            out.append(e)
            continue
        e.max_rate_slo = min(e.max_rate_slo, w.rate / e.replicas)
        budget = max(max_gpus // e.candidate.gpus_per_replica, 1)
        if retried >= STAGE2_RETRY_CANDIDATES or e.replicas >= budget:
            out.append(e)
            continue
        retried += 1
        best = e
        for replicas in range(e.replicas + 1, min(budget, e.replicas + STAGE2_RETRY_REPLICAS) + 1):
            more = copy_estimate(e)
            more.replicas = replicas
            more = apply_replay(more, replays.get(more))
            more.meets_slo = _simulated_slo_ok(more, slo)
            best = more
            if more.meets_slo:
                # The replay met the SLO at the rate each of these replicas got: its capacity is at
                # least that (the copy carries the capacity the failed replica count was cut to).
                more.max_rate_slo = max(more.max_rate_slo, w.rate / replicas)
                more.notes.append(f"{replicas} replicas: stage 1's {e.replicas} missed the SLO in simulation")
                break
            more.max_rate_slo = min(more.max_rate_slo, w.rate / replicas)
        out.append(best)
    return out


def _trust_the_replay(e: Estimate, w: WorkloadShape, slo: SLO) -> None:
    """A replay that served the workload's whole rate within the SLO, dropping nothing, outweighs
    stage 1's reading that the replicas cannot ("needs N replicas", "exceeds its capacity"): those
    notes go, and the SLO capacity is at least the rate each replica served. Without this a
    disaggregated candidate the replay showed within the SLO at 4 req/s stayed "SLO no: needs 3
    replicas" from a closed form the replay had just contradicted."""
    if e.stage != 2 or w.rate is None or not _replay_within_slo(e, slo):
        return
    capacity = blocking_notes(e)
    if not capacity or blocking_notes(e, ("dropped", "completed no")):
        return
    e.notes = [n for n in e.notes if n not in capacity]
    e.max_rate_slo = max(e.max_rate_slo, w.rate / e.replicas)
    e.notes.append(f"the replay served {w.rate:.2f} req/s on {e.replicas} replica(s) within the SLO: stage 1's "
                   "capacity estimate was low")


def _recalibrate_capacity(before: Estimate, after: Estimate, w: WorkloadShape, slo: SLO) -> None:
    """Scale `after`'s SLO capacity by what the simulation found at the workload's own operating
    point. Stage 1 reads the capacity (the highest rate within the SLO) off its closed-form
    curves; where the replay of the workload is slower than those curves at the workload's rate
    (ITL tails of chunked prefill, TTFT tails of bursts), the same factor holds at the higher rates
    the capacity comes from, and an unscaled capacity overstated the tok/s/GPU at the SLO the
    ranking uses (3-8x for gpt-oss-120b on 8 H100 at dp8). Only lowers it: a replay faster than the
    curve at one point is no evidence the curve is pessimistic everywhere else."""
    if after.stage != 2 or after.max_rate_slo <= 0:
        return
    factors = []
    for sim, est in ((after.ttft_p90, before.ttft_p90), (after.itl_p90, before.itl_p90)):
        factors.append(sim / est if math.isfinite(sim) and math.isfinite(est) and est > 0 else 1.0)
    k_ttft, k_itl = (max(f, 1.0) for f in factors)
    if k_ttft == 1.0 and k_itl == 1.0:
        return
    ok = slo_ok(after.curve_ttft * k_ttft, after.curve_tpot * k_itl, slo,
                None if after.curve_itl_p90 is None else after.curve_itl_p90 * k_itl)
    scaled = float(after.curve_rate[ok].max()) if ok.any() else 0.0
    # The replay itself met the SLO at the rate each replica got: the capacity is at least that.
    floor = w.rate / after.replicas if w.rate is not None and _simulated_slo_ok(after, slo) else 0.0
    capacity = max(scaled, floor)
    if capacity < after.max_rate_slo:
        after.notes.append(f"SLO capacity {after.max_rate_slo:.2f} -> {capacity:.2f} req/s per replica: the "
                           f"replay's p90s at the workload's rate were {k_ttft:.2f}x (TTFT) and {k_itl:.2f}x (ITL) "
                           "the estimate's")
        after.max_rate_slo = capacity


_DISAGG_JOB: tuple[list[Candidate], dict[tuple[str, str], FittedAnchor], WorkloadShape, SLO, int] | None = None


def _disagg_job() -> list[Estimate]:
    """In the forked process: the disaggregated candidates' stage-1 estimates, without their
    FittedAnchor (the parent has it; no need to pickle it back)."""
    assert _DISAGG_JOB is not None
    cands, fitted_by, w, slo, max_gpus = _DISAGG_JOB
    out = [operate(estimate_disagg(fitted_by[(c.engine, c.precision)], c, w), w, slo, max_gpus) for c in cands]
    for e in out:
        e.fitted = None  # type: ignore[assignment]
    return out


def _start_disagg(cands: list[Candidate], fitted_by: dict[tuple[str, str], FittedAnchor], w: WorkloadShape,
                  slo: SLO, max_gpus: int) -> Callable[[], list[Estimate]]:
    """Estimate `cands` in a forked process; returns the call that waits for the estimates."""
    global _DISAGG_JOB
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    _DISAGG_JOB = (cands, fitted_by, w, slo, max_gpus)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork"))
    try:
        fut = pool.submit(_disagg_job)  # forks here, with _DISAGG_JOB set
    finally:
        _DISAGG_JOB = None

    def wait() -> list[Estimate]:
        try:
            out = fut.result()
        finally:
            pool.shutdown()
        for e in out:
            e.fitted = fitted_by[(e.candidate.engine, e.candidate.precision)]
        return out

    return wait


def tune(spec: TuningSpec, anchor_dirs: list[Path] | None = None, progress: Progress | None = None,
         stage2_top: int = STAGE2_TOP, propose_with: tuple[str, str] | None = None,
         workers: int | None = None, store: AnchorStore | None = None, stage2_prune: bool = True) -> TuneResult:
    """`propose_with` = (endpoint, model) turns on the LLM proposer (off by default). `workers`
    processes run stage 2 (default: up to 2, the cores of the target machine). `store`, when given,
    is the anchor store already read (instead of reading `anchor_dirs`, default the shipped ones).
    `stage2_prune`: leave out the replays that cannot change the short list (inferasim.search.stage2);
    False replays all of the best `stage2_top`."""
    import os
    import threading

    if workers is None:
        # Forking is safe from the main thread of a CLI; inside a threaded server (the operator)
        # another thread may hold a lock at fork time, so stay in-process there.
        main = threading.current_thread() is threading.main_thread()
        workers = max(1, min(2, os.cpu_count() or 1)) if main else 1
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model = get_model(spec.model)
    gpu = get_gpu(spec.hardware.gpu)
    if spec.workload.static is None:
        raise ValueError("workload: tune reads `static` workloads here; `prometheus` workloads are observed by "
                         "the operator (or `inferasim observe`) and `trace` workloads by `inferasim simulate`")
    w = shape_of(spec.workload.static)
    beyond = context_error(model, w.isl)
    if beyond:
        raise ValueError(f"workload.static: {beyond}; shorten inputTokens (or pick a longer-context model)")
    precisions = [priced_precision(p, spec.model, model) for p in spec.precision]
    space = build_space(model, gpu, spec.engines, precisions, spec.hardware.max_gpus, spec.hardware.gpus_per_node,
                        spec.search, model_id=spec.model)
    timings["space"] = time.perf_counter() - t0
    if store is None:
        store = AnchorStore(*(anchor_dirs or [SHIPPED_ANCHORS]))
    fitted_by: dict[tuple[str, str], FittedAnchor] = {}
    missing: list[dict[str, Any]] = []
    anchors_used: dict[str, str] = {}
    groups: dict[tuple[str, str, Any], list[Candidate]] = defaultdict(list)
    disagg: list[Candidate] = []
    for cand in space.candidates:
        key = (cand.engine, cand.precision)
        if key not in fitted_by:
            found = anchored_fit(store, cand.engine, model, gpu, cand.precision)
            kv = benchmark_kv_dtype(cand.precision)
            if found is not None:
                fitted_by[key], anchor = found
                anchors_used[f"{cand.engine}/{cand.precision}"] = anchor.id
            else:
                fitted_by[key] = measurement_free(store, cand.engine, model, gpu, cand.precision, cand.layout,
                                                  kv_dtype=kv)
            if found is None or fitted_by[key].measured_on:
                # No anchor of this GPU (a sibling's carried one still wants its own measurement).
                # The fewest GPUs; among those the plainest layout (no pipeline stages, attention dp
                # or expert parallelism to carry back out), then the larger KV pool (tp over pp):
                # 70B bf16 on two H100 as tp2, not as pp2 with half the KV.
                smallest = min((c.layout for c in space.candidates if (c.engine, c.precision) == key),
                               key=lambda lay: (lay.gpus, lay.pp > 1, lay.dp > 1, lay.moe_ep > 1, -lay.tp))
                # The engine's start-up (weights loading, warm-up) on top of the measurement.
                per_node = spec.hardware.gpus_per_node
                hours = harvest_gpu_hours(model, smallest, cand.precision, per_node)
                price = spec.hardware.price_per_gpu_hour
                missing.append({"engine": cand.engine, "model": model.name, "gpu": gpu.name,
                                "precision": cand.precision, "harvest_layout": smallest.as_dict(),
                                "harvest_gpu_hours": hours,
                                "harvest_startup_s": round(engine_startup_s(model, smallest, cand.precision, per_node)),
                                "harvest_cost": None if price is None else hours * price})
        if cand.disagg is not None:
            disagg.append(cand)
        else:
            groups[(cand.engine, cand.precision, cand.layout)].append(cand)
    t1 = time.perf_counter()
    per_kernel: dict[tuple[str, str], int] = defaultdict(int)
    priced: list[Candidate] = []
    for cand in disagg:
        key = (cand.engine, cand.precision)
        if per_kernel[key] >= MAX_DISAGG_PER_KERNEL:
            continue
        per_kernel[key] += 1
        priced.append(cand)
    slo, max_gpus = spec.objective.slo, spec.hardware.max_gpus
    # The disaggregated shapes (priced point by point, about a third of stage 1) go to a second
    # core while this one sweeps the colocated groups; the list order is the same either way.
    pending = _start_disagg(priced, fitted_by, w, slo, max_gpus) if workers > 1 and len(priced) > 8 else None
    estimates: list[Estimate] = []
    total = len(groups)
    if progress:
        progress("stage 1", 0, total)
    for i, ((engine, precision, _lay), cands) in enumerate(groups.items(), 1):
        for e in estimate_group(fitted_by[(engine, precision)], cands, w):
            estimates.append(operate(e, w, slo, max_gpus))
        if progress:
            progress("stage 1", i, total)
    if pending is not None:
        estimates.extend(pending())
    else:
        for cand in priced:
            estimates.append(operate(estimate_disagg(fitted_by[(cand.engine, cand.precision)], cand, w), w, slo,
                                     max_gpus))
    timings["stage1"] = time.perf_counter() - t1
    price = spec.hardware.price_per_gpu_hour

    def score(e: Estimate) -> tuple[int, int, float]:
        # Anchored before unanchored, SLO met before not, then the objective; among misses, the
        # closest to the SLO first (their objective at the SLO is mostly nil).
        if not e.meets_slo:
            return (int(e.anchored), 0, -slo_excess(e, spec.objective.slo))
        return (int(e.anchored), 1, objective_value(e, spec.objective, w.osl, w.rate, price))

    ranked = sorted(estimates, key=score, reverse=True)
    proposals: list[dict[str, Any]] = []
    if propose_with is not None:
        from inferasim.search.proposer import propose

        tmp = TuneResult(spec, model, gpu, w, space, ranked, [], missing, timings, anchors_used)
        best = [tmp.entry(e) for e in ranked[:5]]
        known = {e.candidate for e in estimates}
        for prop in propose(propose_with[0], propose_with[1], space, best, spec.engines, precisions,
                            spec.hardware.max_gpus):
            verdict = "accepted" if prop.candidate is not None else "rejected"
            proposals.append({"proposal": prop.raw, "verdict": verdict, "reason": prop.reason})
            cand = prop.candidate
            if cand is None or cand in known:
                continue
            new = estimate_group(fitted_by[(cand.engine, cand.precision)], [cand], w)
            for e in new:
                operate(e, w, spec.objective.slo, spec.hardware.max_gpus)
                e.notes.append("proposed by the LLM proposer; scored by the predictor")
            estimates.extend(new)
            known.add(cand)
        ranked = sorted(estimates, key=score, reverse=True)
    t2 = time.perf_counter()
    slo = spec.objective.slo

    def finish(before: Estimate, e: Estimate) -> None:
        if e.stage == 2:
            _trust_the_replay(e, w, slo)
            e.meets_slo = _simulated_slo_ok(e, slo)
            _recalibrate_capacity(before, e, w, slo)

    def final(e: Estimate) -> tuple[tuple[int, int, float], str] | None:
        # Within the SLO, a candidate's score is final (_add_replicas retries misses only).
        return (score(e), e.candidate.shape) if e.meets_slo else None

    def upper(e: Estimate) -> tuple[int, int, float]:
        # The best its replay could make it: the SLO met, and the capacity at the largest value
        # stage 2 sets (the stage-1 one, or the rate each replica got where the replay met the SLO).
        best = copy_estimate(e)
        best.meets_slo = True
        if w.rate is not None:
            best.max_rate_slo = max(best.max_rate_slo, w.rate / best.replicas)
        return score(best)

    replays = Replays(w)
    # The short list takes five shapes: where the top holds fewer, the first candidates of the
    # next shapes join stage 2 (replayed in its first round, not one by one after it). No stage 2
    # (stage2_top 0) replays nothing.
    honest = 5 if stage2_top > 0 else 0
    head, rest = with_shapes(ranked[:stage2_top], ranked[stage2_top:], honest)
    top = run_stage2(head, w, workers, progress, finish=finish,
                     final=final if stage2_prune else None, upper=upper, replays=replays,
                     shapes=len({e.candidate.shape for e in ranked}))
    # Replayed candidates come back as refined copies; the ones left out as they were.
    timings["stage2_replays"] = sum(a is not b for a, b in zip(head, top, strict=True))
    top = _add_replicas(top, w, slo, spec.hardware.max_gpus, replays)
    ranked = replay_the_shortlist(top, rest, score, finish,
                                   lambda e: _add_replicas([e], w, slo, spec.hardware.max_gpus, replays)[0],
                                   replays, limit=STAGE2_TOP if honest else 0)
    timings["stage2_simulations"] = replays.simulations
    timings["stage2"] = time.perf_counter() - t2
    front = pareto_front(estimates, w.osl)
    timings["total"] = time.perf_counter() - t0
    timings["candidates_per_s"] = len(space.candidates) / max(timings["stage1"], 1e-9)
    result = TuneResult(spec, model, gpu, w, space, ranked, front, missing, timings, anchors_used, proposals)
    rank_harvests(result)
    return result


# Ranked candidates whose bands a harvest is credited for narrowing (the short list and the
# candidates just behind it, which an anchor may lift into it).
INFORMATIVE_TOP = 20


def rank_harvests(result: TuneResult) -> None:
    """Order the missing anchors most informative first: by how much of the leading candidates'
    90% bands rests on each one. A candidate at rank r of kernel set K contributes its band's log
    half-width / r to K's harvest (anchoring K replaces that band by an anchored one, and the
    higher a candidate ranks, the more the recommendation depends on it). Recorded as
    `band_weight`; ties keep the cheaper harvest first."""
    weight: dict[tuple[str, str], float] = defaultdict(float)
    isl, osl = int(result.workload.isl), int(result.workload.osl)
    for r, e in enumerate(result.ranked[:INFORMATIVE_TOP], 1):
        if e.anchored:
            continue
        c = e.candidate
        band = e.fitted.spread(True, c.layout, isl, osl)
        weight[(c.engine, c.precision)] += band / r
    for m in result.missing_anchors:
        m["band_weight"] = round(weight.get((m["engine"], m["precision"]), 0.0), 6)
    result.missing_anchors.sort(key=lambda m: (-m["band_weight"], m.get("harvest_gpu_hours", 0.0)))
