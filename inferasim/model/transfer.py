"""Transfer laws: carry a fitted anchor to another deployment of the same kernel set.

The law (DESIGN.md section 3): keep what belongs to the kernels — the host cost per step
(`t_fixed`, `t_seq`) and the fitted efficiencies — and recompute what belongs to the layout:
per-GPU weight bytes and FLOPs (tp, ep, pp), KV bytes per GPU (heads split down to one per GPU,
MLA latent replicated), distinct experts touched and the busiest expert rank (ep), per-layer
collectives on the link the ranks actually share (scale-up inside the domain, scale-out beyond:
the multi-node *restore*), pipeline hops and bubbles (pp), and the tokens each attention-dp rank
sees. Replicas multiply throughput and divide the offered load.

The naive alternative — scale the whole measured step by the GPU ratio — is kept here as
`naive_step` so that tests and benchmarks can show how wrong it is when the host part is large.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steptime import StepParams, step_time


class FittedKernelSet(Protocol):
    """What a transfer needs of a fitted anchor (predictor.FittedAnchor is one): its kernel set and
    its step-time parameters."""

    engine: str
    engine_version: str
    model: ModelSpec
    gpu: GPU
    precision: str
    kv_dtype: str

    @property
    def params(self) -> StepParams: ...


@dataclass(frozen=True)
class TransferredStep:
    """Step-time function of a target layout, from parameters fitted at a source layout."""

    params: StepParams
    model: ModelSpec
    gpu: GPU
    source: Layout
    target: Layout
    precision: str = "auto"

    def step(self, n_dec: float | np.ndarray, ctx: float | np.ndarray, n_pref: float | np.ndarray = 0.0,
             ctx_pref: float | np.ndarray = 0.0) -> np.ndarray:
        cost = layout_cost(self.model, self.gpu, self.target, self.precision)
        return step_time(self.params, cost, n_dec, ctx, n_pref, ctx_pref)

    def host_part(self, n_dec: float | np.ndarray) -> np.ndarray:
        return self.params.t_fixed + self.params.t_seq * np.asarray(n_dec, dtype=float)


def transfer(params: StepParams, model: ModelSpec, gpu: GPU, source: Layout, target: Layout,
             precision: str = "auto") -> TransferredStep:
    """The law: same parameters, target layout's per-GPU work."""
    return TransferredStep(params, model, gpu, source, target, precision)


def naive_step(source_step: float, source: Layout, target: Layout) -> float:
    """What the naive rule predicts: the whole step divided by the GPU ratio."""
    return source_step * source.gpus / target.gpus


def reduce_to_node(layout: Layout, gpu: GPU) -> Layout:
    """A multi-node layout's single-node stand-in for measurement: one pipeline stage per node,
    tensor and expert width capped at the node (or scale-up domain). The law restores the
    original with `collective_time`, which prices ranks beyond the domain on the scale-out link."""
    per_node = min(gpu.gpus_per_node, gpu.scale_up.domain) if gpu.scale_up.domain > 1 else gpu.gpus_per_node
    if layout.gpus <= per_node:
        return layout
    tp = min(layout.tp, per_node)
    dp = max(1, min(layout.dp, per_node // tp))
    ep = min(layout.moe_ep, tp * dp)
    while (tp * dp) % ep:
        ep -= 1
    return Layout(tp=tp, pp=1, dp=dp, moe_ep=ep)


def replica_split(concurrency: int, replicas: int) -> list[int]:
    """Clients per replica under round-robin routing (the first ones get the remainder)."""
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    base, extra = divmod(concurrency, replicas)
    return [base + (1 if i < extra else 0) for i in range(replicas)]


def kv_transfer_time(model: ModelSpec, gpu: GPU, tokens: float, kv_dtype_bytes: float = 2.0,
                     same_domain: bool = False) -> float:
    """Moving one request's KV cache from a prefill to a decode worker: bytes over the scale-up
    link when both sit in one NVLink/xGMI domain, else over the scale-out NIC, plus latency."""
    nbytes = model.kv_bytes_per_token(kv_dtype_bytes, context=tokens) * tokens
    link = gpu.scale_up if same_domain else gpu.scale_out
    return link.latency + nbytes / link.bandwidth


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
    per_worker = min(max(concurrency / dws, 1.0), cap)
    tpot = float(step_time(prm, dc, per_worker / decode_layout.dp, isl + osl / 2.0))
    # Prefill pool: tokens/s of one worker running full chunks.
    chunk = float(max(min(psched.max_batched_tokens, 16384), 1024))
    rate = chunk / float(step_time(prm, pc, 0.0, 0.0, chunk, isl / 2.0)) * prefill_layout.dp
    own = float(np.ceil(isl / chunk)) * float(step_time(prm, pc, 0.0, 0.0, min(chunk, isl), isl / 2.0))
    xfer = kv_transfer_time(model, gpu, isl, same_domain=gpu.scale_up.domain >= 8 * gpu.gpus_per_node)
    ttft = own + xfer
    # The prefill pool admits at most this many requests per second: past it, requests queue for
    # prefill (in TTFT, through `admission` below), whatever the decode pool could take. The M/D/1
    # wait alone, its utilisation capped, let the rate run past the pool (with no wave term to slow
    # it, a P1+D4 pool of 70B on MI355X read 62 req/s where its one prefill GPU holds about 20).
    x_cap = pws * rate / max(isl, 1)
    x = min(concurrency / (ttft + (osl - 1) * tpot), x_cap)
    for _ in range(30):
        u = min(x * isl / (pws * rate), 0.95)
        steady = own + u * own / (2 * (1 - u))
        wave = (min(concurrency, cap * dws) / pws * isl / rate + isl / rate) / 2.0
        ttft = xfer + (1 - prm.burst) * steady + prm.burst * max(wave, steady)
        service = ttft + (osl - 1) * tpot
        x_new = min(min(concurrency, cap * dws) / service, x_cap)
        x = 0.5 * x + 0.5 * x_new
    admission = max(concurrency / x - (ttft + (osl - 1) * tpot), 0.0)
    # The serial front end, as model.steady.closed_loop prices it: each prefill worker has its own
    # and takes 1/pws of the requests.
    steady_wait, wave_wait = front_end_wait(float(prm.front_time(isl)), x / pws, min(concurrency, cap * dws) / pws)
    front_steady, front_wave = float(steady_wait), float(wave_wait)
    front = (1 - prm.burst) * front_steady + prm.burst * max(front_wave, front_steady)
    return {"ttft": ttft + admission + prm.t_ttft + front, "tpot": tpot}
