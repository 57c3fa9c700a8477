"""The anchor harvester: measure an endpoint, fit the step-time parameters, write an Anchor.

The fit is the predictor's own (`inferasim.model.fit.fit_anchor_params` on closed-loop FitPoints, with the
LayoutCost and EngineSched that `predictor.FittedAnchor.predict_layout` builds for the same
kernel set and layout, and the GPU-family defaults as priors), so the written anchor predicts
other layouts exactly as a shipped anchor would.

Cost accounting: `gpu_seconds` = wall seconds x GPUs x speedup. Against a real engine speedup is
1; against the emulator it counts the engine time the measurement stands for, and the notes
record both the wall and the emulated time.

A harvest refuses to write an anchor whose fit does not reproduce its own points (rms log
error above `max_rms_log_error`, default 0.25): a bad anchor would silently mislead every
prediction carried from it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.harvest.client import (
    CONTROL_TIMEOUT_S,
    HarvestError,
    PointResult,
    base_url,
    layout_mismatch,
    run_point,
    scrape_counters,
    scrape_latency,
    served_engine,
    served_layout,
    served_models,
    server_means,
    warm_up,
)
from inferasim.harvest.plan import PlanPoint, default_plan
from inferasim.model.anchors import (
    Anchor,
    BenchPoint,
    FitReport,
    KernelSet,
    LayoutModel,
    Provenance,
    write_anchor_file,
)
from inferasim.model.fit import (
    CAP_UNEXPLAINED,
    FitPoint,
    FitResult,
    fit_anchor_params,
    predict_points,
    unexplained_ttft,
)
from inferasim.model.layoutcost import LayoutCost, layout_cost
from inferasim.model.steady import EngineSched, engine_sched
from inferasim.model.steptime import STEP_MODEL_REVISION, default_params

DEFAULT_MAX_RMS_LOG_ERROR = 0.25
DEFAULT_BUDGET_S = 900.0
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_POOR_FIT = 3


@dataclass
class HarvestConfig:
    endpoint: str
    model: str
    gpu: str
    engine: str = "vllm"
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    precision: str = "auto"
    kv_dtype: str | None = None  # None: the benchmark rule (fp8 KV for fp8/fp4 weights)
    engine_version: str = ""
    engine_image: str = ""
    served_model_name: str | None = None  # the name requests carry; default: --model
    plan: list[PlanPoint] = field(default_factory=default_plan)
    budget_s: float = DEFAULT_BUDGET_S  # wall seconds for the whole harvest
    speedup: float = 1.0  # the endpoint runs this many times faster than the engine (the emulator)
    max_rms_log_error: float = DEFAULT_MAX_RMS_LOG_ERROR
    request_timeout_s: float = 600.0
    warmup: bool = True
    seed: int = 0
    client: str = "auto"  # measured requests: auto (raw for http://, httpx for https://) | raw | httpx
    # What the anchor's TTFT and TPOT are: "client" = measured by this client, as `vllm bench
    # serve` does (the convention of public benchmark data); "server" = the engine's own
    # histograms at /metrics (TTFT from arrival at its API server), free of the client's and the
    # network's latency. Both are measured whenever /metrics has the histograms; the notes keep both.
    timing: str = "client"

    def layout(self) -> Layout:
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, moe_ep=self.ep)


@dataclass
class HarvestReport:
    config: HarvestConfig
    points: list[PointResult]
    skipped: list[str]
    counters: dict[str, float] | None  # server-side deltas (prompt_tokens, generation_tokens)
    client_tokens: dict[str, int]
    wall_s: float
    fit: FitResult | None = None
    anchor: Anchor | None = None
    exit_code: int = EXIT_OK
    message: str = ""
    warnings: list[str] = field(default_factory=list)  # also kept in the anchor's provenance notes

    @property
    def emulated_s(self) -> float:
        return self.wall_s * self.config.speedup


def _log(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


async def harvest_async(cfg: HarvestConfig, progress: Callable[[str], None] | None = None) -> HarvestReport:
    """Measure, fit, and build the anchor (not written: see `write_anchor`). ValueError for bad
    input; the report's exit_code says whether the measurement and the fit are usable."""
    engine = normalize_engine(cfg.engine)
    model = get_model(cfg.model)
    gpu = get_gpu(cfg.gpu)
    layout = cfg.layout()
    if not cfg.speedup > 0:
        raise ValueError(f"--speedup must be positive, got {cfg.speedup!r}")
    if not cfg.budget_s > 0:
        raise ValueError(f"--budget-s must be positive, got {cfg.budget_s!r}")
    if not cfg.plan:
        raise ValueError("the harvest plan has no points")
    if cfg.client not in ("auto", "raw", "httpx"):
        raise ValueError(f"--client must be auto, raw or httpx, got {cfg.client!r}")
    if cfg.timing not in ("client", "server"):
        raise ValueError(f"--timing must be client or server, got {cfg.timing!r}")
    endpoint = base_url(cfg.endpoint)
    precision = cfg.precision or "auto"
    from inferasim.model.predictor import benchmark_kv_dtype

    kv_dtype = cfg.kv_dtype or benchmark_kv_dtype(precision)
    # Same cost and scheduler limits as FittedAnchor.predict_layout for this kernel set and layout.
    cost = layout_cost(model, gpu, layout, precision, kv_dtype, engine, cfg.engine_version)
    sched = engine_sched(engine, model, gpu, layout, precision, cfg.engine_version, kv_dtype)
    rng = np.random.default_rng(cfg.seed)
    t_start = time.perf_counter()
    deadline = t_start + cfg.budget_s
    points: list[PointResult] = []
    replaced: list[PointResult] = []  # first runs measured again (their tokens still count)
    skipped: list[str] = []
    warnings: list[str] = []
    biggest = max(p.concurrency for p in cfg.plan)
    limits = httpx.Limits(max_connections=biggest + 8, max_keepalive_connections=biggest + 8)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        names = await served_models(client, endpoint, timeout=min(CONTROL_TIMEOUT_S, cfg.budget_s))
        # An anchor of one engine's measurements filed under another's kernel set would price the
        # wrong engine: refuse when the endpoint says which engine it is, and it is not --engine.
        # Control requests share the budget: a /metrics that never answers costs seconds, not minutes.
        def control() -> float:
            return max(min(CONTROL_TIMEOUT_S, deadline - time.perf_counter()), 0.5)

        serving = await served_engine(client, endpoint, control())
        if serving is not None and serving != engine:
            raise HarvestError(f"{endpoint} is a {serving} server (its /metrics series and model list say so), not "
                               f"--engine {engine}: pass --engine {serving}")
        # An anchor records the layout given on the command line: one the endpoint contradicts would
        # price every transfer from the wrong layout. Warned, not refused: --tp names the replica an
        # operator deployed, and a server's own report can lag a relaunch.
        mismatch = layout_mismatch(await served_layout(client, endpoint, engine, control()),
                                   {"tp": cfg.tp, "dp": cfg.dp, "ep": cfg.ep, "pp": cfg.pp})
        if mismatch:
            _log(progress, f"warning: {mismatch}; the anchor records the layout given (--tp {cfg.tp} --dp {cfg.dp} "
                           f"--ep {cfg.ep} --pp {cfg.pp}): rerun with the endpoint's if it is right")
            warnings.append(f"layout: {mismatch}")
        name = cfg.served_model_name or cfg.model
        if name not in names:
            if cfg.served_model_name is None and len(names) == 1:
                _log(progress, f"note: {endpoint} serves {names[0]!r}, not {name!r}; using it")
                name = names[0]
            else:
                raise HarvestError(f"{endpoint} does not serve {name!r}; it serves {names} "
                                   "(pass --served-model-name)")
        if cfg.warmup:
            # Within the budget: an endpoint that lists its model but never answers a request must
            # fail the harvest in --budget-s, not in --request-timeout-s.
            left = max(deadline - time.perf_counter(), 1.0)
            try:
                await warm_up(client, endpoint, name, rng, cfg.client, min(cfg.request_timeout_s, left))
            except (HarvestError, httpx.HTTPError, OSError, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
                raise HarvestError(f"{endpoint} lists {name!r} but answered no 4-token warm-up request within "
                                   f"{min(cfg.request_timeout_s, left):.0f} s (of --budget-s {cfg.budget_s:g}): "
                                   f"{why}") from None
        before = await scrape_counters(client, endpoint, engine, control())

        async def measure(point: PlanPoint) -> PointResult:
            lat_before = await scrape_latency(client, endpoint, engine, control())
            res = await run_point(client, endpoint, name, point, cfg.speedup, deadline, rng, cfg.client,
                                  cfg.request_timeout_s)
            if res.ok:
                res.server = server_means(lat_before, await scrape_latency(client, endpoint, engine, control()),
                                          len(res.requests), point.osl)
                if cfg.timing == "server" and res.server is None:
                    res.failures.append("--timing server: /metrics has no TTFT and e2e histograms counting "
                                        "exactly this point's requests (other traffic, or metrics disabled)")
            if res.ok:
                s = res.summary()
                _log(progress, f"{point.label()}: {s['requests']} requests, TTFT {s['ttft_ms']:.1f} ms, "
                               f"TPOT {s['tpot_ms']:.2f} ms, {s['throughput_tok_s']:.0f} tok/s "
                               f"({res.wall_s:.2f} s wall)")
            return res

        for point in cfg.plan:
            if deadline - time.perf_counter() <= 0:
                skipped.append(f"{point.label()}: skipped, the time budget of {cfg.budget_s:g} s is spent")
                continue
            res = await measure(point)
            if res.ok:
                points.append(res)
            else:
                skipped.append(f"{point.label()}: dropped ({'; '.join(res.failures[:3])})")
                _log(progress, skipped[-1])
        fit = _fit(cost, sched, gpu, engine, cfg, points) if points else None
        if fit is not None:
            # A point whose TTFT no engine step explains waited for something once (a kernel compiled
            # at a new shape's first use, a stall): measured again, the engine is warm for it.
            redo = _unexplained(cost, sched, gpu, engine, cfg, fit, points)
            for i in redo:
                if deadline - time.perf_counter() <= 0:
                    break
                old = points[i]
                _log(progress, f"{old.point.label()}: TTFT {_ttft(old, cfg.timing) * 1e3:.1f} ms is "
                               f"more than {CAP_UNEXPLAINED:g}x what the other points explain; measuring it again")
                res = await measure(old.point)
                if not res.ok:
                    continue
                replaced.append(old)
                points[i] = res
                warnings.append(f"re-measured {old.point.label()}: TTFT {_ttft(old, cfg.timing) * 1e3:.1f} ms "
                                f"-> {_ttft(res, cfg.timing) * 1e3:.1f} ms (the first run waited outside the "
                                "engine's steps)")
            if replaced:
                fit = _fit(cost, sched, gpu, engine, cfg, points)
        after = await scrape_counters(client, endpoint, engine, control())
    wall = time.perf_counter() - t_start
    counters = None
    if before is not None and after is not None:
        counters = {k: after[k] - before[k] for k in before}
    sent = points + replaced
    client_tokens = {"prompt_tokens": sum(r.prompt_tokens for p in sent for r in p.requests),
                     "generation_tokens": sum(r.output_tokens for p in sent for r in p.requests)}
    report = HarvestReport(config=cfg, points=points, skipped=skipped, counters=counters,
                           client_tokens=client_tokens, wall_s=wall, warnings=warnings)
    if fit is None:
        report.exit_code = EXIT_FAILED
        report.message = "no point was measured: " + "; ".join(skipped or ["empty plan"])
        return report
    report.fit = fit
    report.anchor = _anchor(cfg, engine, precision, kv_dtype, layout, points, fit, report)
    if not fit.rms_log_error <= cfg.max_rms_log_error:
        per = ", ".join(f"{k} median error {100 * v:.0f}%" for k, v in sorted(fit.per_metric_mape.items()))
        report.exit_code = EXIT_POOR_FIT
        report.message = (f"fit too poor: rms log error {fit.rms_log_error:.3f} is above the threshold "
                          f"{cfg.max_rms_log_error:g} ({per}); the anchor was not written. Check the endpoint "
                          "(other traffic? preemption?) or raise --max-rms-log-error")
    return report


def _fit_points(points: list[PointResult], timing: str) -> list[FitPoint]:
    return [FitPoint(isl=p.point.isl, osl=p.point.osl, concurrency=p.point.concurrency, scenario="closed",
                     ttft=_ttft(p, timing), tpot=_tpot(p, timing)) for p in points]


def _fit(cost: LayoutCost, sched: EngineSched, gpu: GPU, engine: str, cfg: HarvestConfig,
         points: list[PointResult]) -> FitResult:
    # This client opens a connection per client (httpx.Limits above): no client cap to read.
    return fit_anchor_params(cost, sched, _fit_points(points, cfg.timing),
                             default_params(gpu, engine, cfg.engine_version), read_client_cap=False)


def _unexplained(cost: LayoutCost, sched: EngineSched, gpu: GPU, engine: str, cfg: HarvestConfig, fit: FitResult,
                 points: list[PointResult]) -> list[int]:
    """Points whose TTFT is over CAP_UNEXPLAINED times what the others explain (fit.unexplained_ttft
    against a fit without that point: with it, a few points' fit bends toward the stall and hides it).
    This client holds no requests back (a connection per client), so no client cap explains them."""
    if len(points) < 3:
        return []
    prior = default_params(gpu, engine, cfg.engine_version)
    fit_points = _fit_points(points, cfg.timing)
    out = []
    for i, pt in enumerate(fit_points):
        others = fit_anchor_params(cost, sched, fit_points[:i] + fit_points[i + 1:], prior, read_client_cap=False)
        if unexplained_ttft([pt], predict_points(others.params, cost, sched, [pt])["ttft"]):
            out.append(i)
    return out


def _ttft(p: PointResult, timing: str) -> float:
    return p.server[0] if timing == "server" and p.server is not None else p.ttft_s()


def _tpot(p: PointResult, timing: str) -> float | None:
    v = p.server[1] if timing == "server" and p.server is not None else p.tpot_s()
    return v if math.isfinite(v) and v > 0 else None


# Timings at a speedup: the endpoint's own host work (HTTP, tokenising, streaming) runs at real
# speed and is read back multiplied by the speedup, as is this client's: at 50x, 2 ms of real
# overhead reads as 100 ms of TTFT. Such an anchor tests the pipeline, not the engine.
SPEEDUP_NOTE = ("measured at speedup {s:g}: real host overheads (HTTP, streaming, this client) read {s:g}x too long; "
                "for pipeline tests, not for accuracy")


def _anchor(cfg: HarvestConfig, engine: str, precision: str, kv_dtype: str, layout: Layout,
            points: list[PointResult], fit: FitResult, report: HarvestReport) -> Anchor:
    gpus = layout.gpus
    wall = report.wall_s
    notes = [f"wall {wall:.1f} s, speedup {cfg.speedup:g}, engine time {wall * cfg.speedup:.1f} s",
             *([SPEEDUP_NOTE.format(s=cfg.speedup)] if cfg.speedup > 1 else []),
             f"plan: {', '.join(p.point.label() for p in points)}",
             "timing: " + ("client (this client, as vllm bench serve measures)" if cfg.timing == "client"
                           else "server (the engine's histograms at /metrics)")]
    both = [p for p in points if p.server is not None]
    if both:
        notes.append("TTFT/TPOT ms client vs engine: " + ", ".join(
            f"{p.point.label()} {p.ttft_s() * 1e3:.1f}/{p.server[0] * 1e3:.1f} "  # type: ignore[index]
            f"{p.tpot_s() * 1e3:.2f}/{p.server[1] * 1e3:.2f}" for p in both))  # type: ignore[index]
    if report.skipped:
        notes.append("not measured: " + "; ".join(report.skipped))
    notes += [f"warning: {w}" for w in report.warnings]
    if report.counters is not None:
        notes.append("server counters: prompt tokens +{:.0f} (client {}), generation tokens +{:.0f} (client {})".format(
            report.counters["prompt_tokens"], report.client_tokens["prompt_tokens"],
            report.counters["generation_tokens"], report.client_tokens["generation_tokens"]))
    else:
        notes.append("server counters: /metrics not available")
    bench = [BenchPoint(isl=p.point.isl, osl=p.point.osl, concurrency=p.point.concurrency, scenario="closed",
                        ttft_ms=_ttft(p, cfg.timing) * 1e3,
                        tpot_ms=(_tpot(p, cfg.timing) or 0.0) * 1e3 or None,
                        throughput_tok_s=p.throughput() if math.isfinite(p.throughput()) else None,
                        row_id=f"harvest:{p.point.label()}:n{len(p.requests)}") for p in points]
    return Anchor(
        kernel_set=KernelSet(engine=engine, engine_version=cfg.engine_version, model=cfg.model, gpu=cfg.gpu,
                             precision="" if precision == "auto" else precision, kv_dtype=kv_dtype),
        layout=LayoutModel.from_layout(layout),
        points=bench,
        params=fit.params.as_dict(),
        fit=FitReport(n_points=fit.n_points, rms_log_error=fit.rms_log_error, max_abs_log_error=fit.max_abs_log_error,
                      per_metric=fit.per_metric_mape, converged=fit.converged, message=fit.message,
                      step_model=STEP_MODEL_REVISION),
        provenance=Provenance(
            method="harvest", source=base_url(cfg.endpoint),
            measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), engine_image=cfg.engine_image,
            measured_by="inferasim harvest", rows=[b.row_id for b in bench],
            gpu_seconds=wall * gpus * cfg.speedup, notes="; ".join(notes)),
    )


def harvest(cfg: HarvestConfig, progress: Callable[[str], None] | None = None) -> HarvestReport:
    """Synchronous `harvest_async` (its own event loop)."""
    return asyncio.run(harvest_async(cfg, progress))


def write_anchor(anchor: Anchor, out: str | Path,
                 on_replace: Callable[[Path, Path], None] | None = None) -> Path | None:
    """Write to a file, into a folder (under the anchor's own file name), or to stdout for '-'.
    A different anchor already in the file is moved to ``replaced/`` beside it, never dropped;
    ``on_replace(path, kept)`` is told where it went."""
    if str(out) == "-":
        import sys

        sys.stdout.write(anchor.model_dump_json(indent=2) + "\n")
        sys.stdout.flush()
        return None
    path = Path(out)
    # A folder: one that exists, or one named with a trailing slash (created, as `anchors/` asks).
    if path.is_dir() or str(out).endswith(("/", os.sep)):
        path = path / anchor.filename()
    kept = write_anchor_file(anchor, path)
    if kept is not None and on_replace is not None:
        on_replace(path, kept)
    return path


__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_MAX_RMS_LOG_ERROR", "EXIT_FAILED", "EXIT_OK", "EXIT_POOR_FIT",
           "HarvestConfig", "HarvestError", "HarvestReport", "harvest", "harvest_async", "write_anchor"]
