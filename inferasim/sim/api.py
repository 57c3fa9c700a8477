"""Python API of the trace simulator: `simulate_workload` runs a deployment against a workload
(DESIGN.md section 4); the search calls it in stage 2, `inferasim simulate` from the command line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from inferasim.core.layout import Layout
from inferasim.core.spec import StaticWorkload, TraceWorkload
from inferasim.model.layoutcost import layout_cost
from inferasim.model.memory import kv_dtype_bytes
from inferasim.model.predictor import FittedAnchor
from inferasim.model.steady import engine_sched
from inferasim.model.transfer import kv_transfer_time
from inferasim.sim.cluster import ROUTERS, Cluster
from inferasim.sim.collector import paused_collector
from inferasim.sim.replica import Replica
from inferasim.sim.report import SimReport, build_report
from inferasim.sim.request import SimRequest
from inferasim.sim.tally import Tally
from inferasim.sim.workload import Driver, driver_for

POLICIES = ("fcfs", "lpm")
SAMPLES = 400  # points of the KV / hit-rate series over a trace's span


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _pd(disagg: tuple[int, int] | str | None) -> tuple[int, int] | None:
    if disagg is None:
        return None
    if isinstance(disagg, str):
        parts = disagg.replace("/", ":").split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"disagg (prefill:decode replicas) must look like 1:2, got {disagg!r}")
        disagg = (int(parts[0]), int(parts[1]))
    p, d = disagg
    _positive_int("disagg prefill replicas", p)
    _positive_int("disagg decode replicas", d)
    return p, d


def simulate_workload(fitted: FittedAnchor, layout: Layout,
                      workload: StaticWorkload | TraceWorkload | Driver | list[SimRequest],
                      replicas: int = 1, max_num_seqs: int | None = None, max_batched_tokens: int | None = None,
                      mixed: bool | None = None, seed: int = 0, *, router: str = "rr", prefix_caching: bool = True,
                      host_kv_bytes: float = 0.0, disagg: tuple[int, int] | str | None = None,
                      schedule_policy: str = "fcfs", slo_ttft_ms: float | None = None,
                      slo_itl_ms: float | None = None, jump: bool = True, sample_dt: float | None = None,
                      progress: Callable[[float], None] | None = None, records: bool = True) -> SimReport:
    """Simulate `replicas` replicas of `layout` (the step-time parameters of `fitted`, moved to
    this layout by the transfer law) serving `workload`, request by request.

    `max_num_seqs`, `max_batched_tokens`: the engine's limits (default: its own). `mixed`:
    prefill chunks ride in decode steps (default: the engine's own; False for vLLM means V0-style
    prefill-first steps, True for SGLang means `--enable-mixed-chunk`; ATOM never mixes).
    `router`: rr | least | prefix. `prefix_caching`: the engine's prefix cache (on by default, as
    in the engines). `host_kv_bytes`: host memory for offloaded KV per replica (0 = no host tier).
    `disagg`: (prefill replicas, decode replicas) — a prefill pool and a decode pool of `layout`
    replicas instead of `replicas` colocated ones. `schedule_policy`: SGLang's fcfs or lpm.
    `slo_*`: goodput counts the requests within them (TTFT, and mean inter-token latency).
    `records`: keep the client requests in the report (`SimReport.requests`); without them the
    report's memory does not grow with the workload (a streaming driver's neither)."""
    # The run allocates many small objects and frees none that need the cycle collector: pause
    # the collector until `_simulate` has returned, so that the simulation's state is freed by
    # reference counting first (the report keeps only the requests) and the collector never
    # scans it; re-enabling it while the state is alive would cost a full scan of it (~10% of a run).
    with paused_collector():
        return _simulate(fitted, layout, workload, replicas, max_num_seqs, max_batched_tokens, mixed, seed, router,
                         prefix_caching, host_kv_bytes, disagg, schedule_policy, slo_ttft_ms, slo_itl_ms, jump,
                         sample_dt, progress, records)


def same_replay_under(limits: dict[str, int], max_num_seqs: int) -> bool:
    """True when a run whose report carries `limits` (SimReport.limits) is, step for step, the run
    of the same deployment and workload with `max_num_seqs` instead (when the scheduler limits
    differ in that alone: see `differ_in_max_num_seqs_only`). Every sequence-limit check compares
    the requests a rank holds with the limit; a run whose peak stayed below its own limit never
    saw a check fail, and a limit above that peak fails none either."""
    peak, own = limits.get("peak_running_per_rank"), limits.get("max_num_seqs_per_rank")
    return peak is not None and own is not None and peak < own and peak < max_num_seqs


def differ_in_max_num_seqs_only(fitted: FittedAnchor, layout: Layout, a: int, b: int,
                                max_batched_tokens: int | None) -> bool:
    """The engine's scheduler limits and KV pool under `max_num_seqs` a and b are the same but for
    that limit (the KV rule may reserve memory per sequence)."""
    def sched(n: int) -> Any:
        return replace(engine_sched(fitted.engine, fitted.model, fitted.gpu, layout, fitted.precision,
                                    fitted.engine_version, fitted.kv_dtype, max_num_seqs=n,
                                    max_batched_tokens=max_batched_tokens), max_num_seqs=0)

    return a == b or sched(a) == sched(b)


def _simulate(fitted: FittedAnchor, layout: Layout,
              workload: StaticWorkload | TraceWorkload | Driver | list[SimRequest], replicas: int,
              max_num_seqs: int | None, max_batched_tokens: int | None, mixed: bool | None, seed: int, router: str,
              prefix_caching: bool, host_kv_bytes: float, disagg: tuple[int, int] | str | None,
              schedule_policy: str, slo_ttft_ms: float | None, slo_itl_ms: float | None, jump: bool,
              sample_dt: float | None, progress: Callable[[float], None] | None, records: bool) -> SimReport:
    _positive_int("replicas", replicas)
    if router not in ROUTERS:
        raise ValueError(f"router {router!r} is not one of {', '.join(ROUTERS)}")
    if schedule_policy not in POLICIES:
        raise ValueError(f"schedule_policy {schedule_policy!r} is not one of {', '.join(POLICIES)}")
    engine = fitted.engine
    if schedule_policy == "lpm" and engine != "sglang":
        raise ValueError("schedule_policy lpm (longest prefix match) is SGLang's; vLLM and ATOM schedule fcfs")
    if max_num_seqs is not None:
        _positive_int("max_num_seqs", max_num_seqs)
    if max_batched_tokens is not None:
        _positive_int("max_batched_tokens", max_batched_tokens)
    if not host_kv_bytes >= 0:
        raise ValueError(f"host_kv_bytes must be >= 0, got {host_kv_bytes!r}")
    pd = _pd(disagg)
    model, gpu = fitted.model, fitted.gpu
    p = fitted.params
    c = layout_cost(model, gpu, layout, fitted.precision, fitted.kv_dtype, fitted.engine, fitted.engine_version)
    sched = engine_sched(engine, model, gpu, layout, fitted.precision, fitted.engine_version, fitted.kv_dtype,
                         max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens)
    if sched.kv_tokens <= 0:
        raise ValueError(f"{model.name} does not fit {gpu.name} at {layout.label()}: no memory is left for the "
                         "KV cache (choose a larger tp/pp or a smaller precision)")
    if mixed is not None:
        sched = replace(sched, mixed=bool(mixed) if engine != "sglang" else sched.mixed)
    use_mixed = sched.mixed if mixed is None else bool(mixed)
    if engine == "atom":
        use_mixed = False
    # Host tier: a token of one rank's KV takes kv_tok_gpu bytes on each of the rank's tp x pp GPUs;
    # the replica's host memory is shared out equally over its dp ranks.
    kv_tok_gpu = float(c.kv_stored_bytes(1.0)) - float(c.state_bytes)
    rank_gpus = layout.tp * layout.pp
    host_tokens = int(host_kv_bytes / (kv_tok_gpu * rank_gpus)) if host_kv_bytes and kv_tok_gpu > 0 else 0
    link = gpu.host_link

    def load_time(tokens: int) -> float:
        # Each GPU reloads its own slice over its own host link, in parallel.
        return link.latency + (float(c.kv_stored_bytes(float(tokens))) - float(c.state_bytes)) / link.bandwidth

    driver = driver_for(workload, seed)
    span = driver.span
    if sample_dt is None:
        sample_dt = max(span / SAMPLES, 0.05) if span > 0 else 1.0
    n_rep = (pd[0] + pd[1]) if pd else replicas
    tally = Tally(slo_ttft_ms, slo_itl_ms)

    def make(i: int, delay: float) -> Replica:
        return Replica(p, c, sched, engine=engine, mixed=use_mixed, delivery_delay=delay, jump=jump,
                       prefix_caching=prefix_caching, host_kv_tokens=host_tokens,
                       load_time=load_time, policy=schedule_policy, max_context=model.max_context,
                       sample_dt=sample_dt, index=i, progress=progress if i == 0 else None, tally=tally)

    if pd:
        pool = [make(i, 0.0) for i in range(pd[0])]
        dpool = [make(pd[0] + i, p.t_ttft) for i in range(pd[1])]
        same = n_rep * layout.gpus <= gpu.scale_up.domain
        kv_b = kv_dtype_bytes(fitted.kv_dtype)

        moved: dict[int, float] = {}

        def transfer(tokens: int) -> float:
            # Memoised: the model's KV bytes walk every layer (10% of a disaggregated replay),
            # and a workload's prompts repeat few lengths (a session's turns, the same ones).
            got = moved.get(tokens)
            if got is None:
                got = moved[tokens] = kv_transfer_time(model, gpu, tokens, kv_b, same_domain=same)
            return got

        cluster = Cluster(pool, router, dpool, transfer, client_delay=p.t_ttft)
    else:
        cluster = Cluster([make(i, p.t_ttft) for i in range(replicas)], router)
    t0 = time.perf_counter()
    cluster.run(driver)
    wall = time.perf_counter() - t0
    reps = cluster.replicas
    for rep in reps:
        rep.flush(final=True)
    cores = [core for rep in reps for core in rep.ranks]
    config = {
        "engine": engine, "engine_version": fitted.engine_version, "model": model.name, "gpu": gpu.name,
        "precision": fitted.precision, "kv_dtype": fitted.kv_dtype, "layout": layout.as_dict(),
        "layout_label": layout.label(), "replicas": replicas if not pd else None,
        "disagg": {"prefill": pd[0], "decode": pd[1]} if pd else None, "router": router,
        "max_num_seqs": sched.max_num_seqs, "max_batched_tokens": sched.max_batched_tokens,
        "block_size": sched.block_size, "mixed": use_mixed, "prefix_caching": prefix_caching,
        "schedule_policy": schedule_policy, "host_kv_bytes": host_kv_bytes,
        "host_kv_tokens_per_rank": host_tokens // layout.dp,
        "anchor": fitted.anchor_id, "params": p.as_dict(), "seed": seed,
        "assumptions": [
            "host-tier reloads run on a copy stream, overlapped with other requests' steps; the loading "
            "request starts its prefill when its reload is done; offload on eviction is free (write-through)",
            "disaggregated: the decode worker allocates the prompt's KV, then waits for the transfer; the "
            "prefill worker's first token reaches the client when the transfer is done",
        ],
    }
    kv = {
        "capacity_tokens_per_rank": reps[0].ranks[0].kv.capacity_tokens,
        "peak_fraction": max(rep.kv_peak_fraction() for rep in reps),
        "block_size": sched.block_size,
    }
    report = build_report(tally, driver.requests if records else [], cores, gpus=n_rep * layout.gpus,
                          replicas=n_rep, steps=sum(rep.steps for rep in reps),
                          preemptions=sum(rep.preemptions for rep in reps), kv=kv, series=_series(reps, sample_dt),
                          config=config)
    report.wall_s = wall
    return report


def _series(reps: list[Replica], dt: float) -> dict[str, list[float]]:
    """KV usage, cached share, prefix hit rate (cumulative), running and waiting requests over
    time, summed (KV: averaged by capacity) over the replicas."""
    n = max((len(r.series) for r in reps), default=0)
    if n == 0:
        return {"t_s": [], "kv_usage": [], "kv_cached": [], "prefix_hit_rate": [], "running": [], "waiting": []}
    caps = [sum(k.kv.total for k in r.ranks) for r in reps]
    tot_cap = sum(caps) or 1
    out: dict[str, list[float]] = {k: [] for k in ("t_s", "kv_usage", "kv_cached", "prefix_hit_rate", "running",
                                                   "waiting")}
    for i in range(n):
        use = cached = 0.0
        hits = queried = running = waiting = 0
        for r, cap in zip(reps, caps, strict=True):
            if not r.series:
                continue
            s = r.series[min(i, len(r.series) - 1)]
            use += s[1] * cap
            cached += s[2] * cap
            hits += s[3]
            queried += s[4]
            if i < len(r.series):
                running += s[5]
                waiting += s[6]
        out["t_s"].append(i * dt)
        out["kv_usage"].append(use / tot_cap)
        out["kv_cached"].append(cached / tot_cap)
        out["prefix_hit_rate"].append(hits / queried if queried else math.nan)
        out["running"].append(running)
        out["waiting"].append(waiting)
    return out
