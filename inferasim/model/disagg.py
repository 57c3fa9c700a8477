"""Disaggregated prefill/decode pools in steady state: `disagg_point`.

A disaggregated deployment (SGLang `--disaggregation-mode prefill|decode`, vLLM's KV connectors
such as NixlConnector) runs two pools behind a router: prefill workers that run prompts only, and
decode workers whose batches never prefill. A request is prefilled on one prefill worker, its KV
moved to one decode worker, and decoded there. The closed-loop benchmark (N clients) is solved as
a whole: the arrival rate x is the one both pools sustain, and Little's law places the clients
(N = x x (TTFT + (osl - 1) TPOT)).

Pieces, each from the engines' P/D mechanics:
- Decode pool: the batch a decode worker runs is the requests decoding there, x (osl - 1) TPOT /
  workers by Little's law, not the clients / workers: when the prefill pool is the bottleneck the
  other clients wait ahead of it, not in the decode batch (`decode_batch`).
- Prefill pool: full chunks at the pool's rate, an M/D/1 wait ahead of it, and the benchmark's
  arrival wave at the anchor's share.
- KV transfer: the prompt's KV bytes over the link (`kv_transfer_time`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Protocol

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.memory import kv_dtype_bytes
from inferasim.model.steptime import StepParams, step_time

# Fixed-point iterations of the closed loop's rate (damped by half each step) and of the decode
# batch at a given rate.
RATE_ITERATIONS = 40
BATCH_ITERATIONS = 30
# Decode batches (per worker) at which the decode step is tabulated for the fixed points.
BATCH_GRID = 48


class FittedKernelSet(Protocol):
    """What pricing needs of a fitted anchor (predictor.FittedAnchor is one): its kernel set and
    its step-time parameters."""

    engine: str
    engine_version: str
    model: ModelSpec
    gpu: GPU
    precision: str
    kv_dtype: str

    @property
    def params(self) -> StepParams: ...


def kv_transfer_time(model: ModelSpec, gpu: GPU, tokens: float, kv_dtype_bytes: float = 2.0,
                     same_domain: bool = False) -> float:
    """Moving one request's KV cache from a prefill to a decode worker: bytes over the scale-up
    link when both sit in one NVLink/xGMI domain, else over the scale-out NIC, plus latency."""
    nbytes = model.kv_bytes_per_token(kv_dtype_bytes, context=tokens) * tokens
    link = gpu.scale_up if same_domain else gpu.scale_out
    return link.latency + nbytes / link.bandwidth


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """np.interp of one point, float for float (the same search, slope and sum), without numpy's
    per-call overhead: the decode batch's fixed point calls it thousands of times per search."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect_right(xs, x) - 1
    if x == xs[j]:
        return ys[j]
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    y = slope * (x - xs[j]) + ys[j]
    return y if y == y else slope * (x - xs[j + 1]) + ys[j + 1]  # numpy's fallback for a NaN


def decode_batch(rate: float, osl: int, grid: np.ndarray | list[float], t_grid: np.ndarray | list[float],
                 limit: float) -> tuple[float, float]:
    """(batch, step time) of one decode worker serving `rate` requests/s of `osl` tokens each.

    A request decodes osl - 1 steps there, so by Little's law the worker holds rate x (osl - 1) x
    t_step(batch) requests: the smallest batch that solves it, or `limit` (the worker's KV and
    max-running cap, or its share of the clients) when none below it does (the pool saturated).
    `t_grid` is the step time at the batches of `grid` (ascending)."""
    xs = grid if isinstance(grid, list) else [float(v) for v in grid]
    ys = t_grid if isinstance(t_grid, list) else [float(v) for v in t_grid]
    k = rate * (osl - 1)
    x0, x_last, y0, y_last = xs[0], xs[-1], ys[0], ys[-1]
    b = x0
    for _ in range(BATCH_ITERATIONS):
        # _interp(b, xs, ys), written out: this loop runs some 50,000 times in one search.
        if b <= x0:
            t = y0
        elif b >= x_last:
            t = y_last
        else:
            j = bisect_right(xs, b) - 1
            xj = xs[j]
            if b == xj:
                t = ys[j]
            else:
                yj = ys[j]
                slope = (ys[j + 1] - yj) / (xs[j + 1] - xj)
                t = slope * (b - xj) + yj
                if t != t:
                    t = slope * (b - xs[j + 1]) + ys[j + 1]
        b_new = k * t
        if b_new > limit:
            b_new = limit
        if abs(b_new - b) <= 1e-6 * (b if b > 1.0 else 1.0):
            b = b_new
            break
        b = b_new
    b = max(b, x0)
    return b, _interp(b, xs, ys)


def disagg_point(fitted: FittedKernelSet, prefill_layout: Layout, prefill_workers: int, decode_layout: Layout,
                 decode_workers: int, isl: int, osl: int, concurrency: int) -> dict[str, float]:
    """Closed-loop TTFT/TPOT of a disaggregated deployment priced from a colocated anchor:
    the prefill pool from prefill-only steps, the decode pool from decode-only steps, plus the KV
    transfer; the arrival rate is the one both pools sustain (their rates matched). The anchor's
    per-request overhead and wave share carry over: they belong to the engine and the harness."""
    from inferasim.model.steady import engine_sched, front_end_wait

    model, gpu, prm = fitted.model, fitted.gpu, fitted.params
    version = fitted.engine_version
    pc = layout_cost(model, gpu, prefill_layout, fitted.precision, fitted.kv_dtype, fitted.engine, version)
    dc = layout_cost(model, gpu, decode_layout, fitted.precision, fitted.kv_dtype, fitted.engine, version)
    psched = engine_sched(fitted.engine, model, gpu, prefill_layout, fitted.precision, fitted.engine_version,
                          fitted.kv_dtype)
    dsched = engine_sched(fitted.engine, model, gpu, decode_layout, fitted.precision, fitted.engine_version,
                          fitted.kv_dtype)
    dws, pws = max(decode_workers, 1), max(prefill_workers, 1)
    cap = max(dsched.kv_tokens * prm.kv_scale // (isl + osl), 1) * decode_layout.dp
    cap = min(cap, dsched.max_num_seqs * decode_layout.dp)
    # Clients one decode worker could hold at most: its cap, or its share of the clients.
    limit = float(min(max(concurrency / dws, 1.0), cap))
    grid = np.unique(np.geomspace(1.0, max(limit, 1.0), BATCH_GRID))
    t_grid = np.asarray(step_time(prm, dc, grid / decode_layout.dp, isl + osl / 2.0), dtype=float)
    grid_l, t_grid_l = grid.tolist(), t_grid.tolist()  # plain floats for the fixed points below
    # Prefill pool: tokens/s of one worker running full chunks.
    chunk = float(max(min(psched.max_batched_tokens, 16384), 1024))
    rate = chunk / float(step_time(prm, pc, 0.0, 0.0, chunk, isl / 2.0)) * prefill_layout.dp
    own = float(np.ceil(isl / chunk)) * float(step_time(prm, pc, 0.0, 0.0, min(chunk, isl), isl / 2.0))
    # The prompt's KV moves in the cache's own dtype (an FP8 cache sends one byte per element).
    xfer = kv_transfer_time(model, gpu, isl, kv_dtype_bytes(fitted.kv_dtype),
                            same_domain=gpu.scale_up.domain >= 8 * gpu.gpus_per_node)
    ttft = own + xfer
    # The prefill pool admits at most this many requests per second: past it, requests queue for
    # prefill (in TTFT, through `admission` below), whatever the decode pool could take. The M/D/1
    # wait alone, its utilisation capped, let the rate run past the pool (with no wave term to slow
    # it, a P1+D4 pool of 70B on MI355X read 62 req/s where its one prefill GPU holds about 20).
    x_cap = pws * rate / max(isl, 1)
    tpot = float(t_grid[-1])
    x = min(concurrency / (ttft + (osl - 1) * tpot), x_cap)
    for _ in range(RATE_ITERATIONS):
        _, tpot = decode_batch(x / dws, osl, grid_l, t_grid_l, limit)
        u = min(x * isl / (pws * rate), 0.95)
        steady = own + u * own / (2 * (1 - u))
        wave = (min(concurrency, cap * dws) / pws * isl / rate + isl / rate) / 2.0
        ttft = xfer + (1 - prm.burst) * steady + prm.burst * max(wave, steady)
        service = ttft + (osl - 1) * tpot
        x_new = min(min(concurrency, cap * dws) / service, x_cap)
        x = 0.5 * x + 0.5 * x_new
    _, tpot = decode_batch(x / dws, osl, grid_l, t_grid_l, limit)
    admission = max(concurrency / x - (ttft + (osl - 1) * tpot), 0.0)
    # The serial front end, as model.steady.closed_loop prices it: each prefill worker has its own
    # and takes 1/pws of the requests.
    steady_wait, wave_wait = front_end_wait(float(prm.front_time(isl)), x / pws, min(concurrency, cap * dws) / pws)
    front_steady, front_wave = float(steady_wait), float(wave_wait)
    front = (1 - prm.burst) * front_steady + prm.burst * max(front_wave, front_steady)
    return {"ttft": ttft + admission + prm.t_ttft + front, "tpot": tpot}
