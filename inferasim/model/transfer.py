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

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.model.disagg import FittedKernelSet, disagg_point, kv_transfer_time
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steptime import StepParams, step_time

# The disaggregated pools live in model.disagg; these names stay importable from here.
__all__ = ["FittedKernelSet", "TransferredStep", "disagg_point", "kv_transfer_time", "naive_step", "reduce_to_node",
           "replica_split", "transfer"]


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
