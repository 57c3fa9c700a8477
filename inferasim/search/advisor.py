"""Batching advisor, after SLIM ("Saturation-Aware Lightweight Performance Modeling for LLM
Serving"): for one deployment and a latency target, the largest batch limit (`max_num_seqs`) that
meets it, and how much KV memory can be given back for at most a stated throughput loss.

Why it matters: decode throughput saturates once KV traffic fills the HBM bandwidth; past that
point a larger batch buys little throughput and costs latency and KV memory that another model
or a larger prefix cache could use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from inferasim.model.layoutcost import layout_cost
from inferasim.model.memory import kv_bytes_per_token_per_gpu, plan_memory
from inferasim.model.predictor import FittedAnchor
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.search.estimate import ITL_P90_RATIO

BATCH_GRID = np.array([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024], dtype=float)


@dataclass(frozen=True)
class BatchAdvice:
    max_num_seqs: int  # largest batch limit meeting the latency target
    tpot_ms: float  # mean TPOT there
    throughput: float  # output tok/s of the replica there
    saturating_batch: int  # smallest limit within `max_loss` of that throughput
    throughput_at_saturating: float
    kv_gb_needed: float  # per GPU, at the saturating limit
    kv_gb_pool: float  # per GPU, what the engine would reserve
    kv_gb_returnable: float  # per GPU
    memory_fraction: float  # gpu_memory_utilization / mem_fraction_static that gives it back
    curve: list[dict[str, float]]

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items()}


def advise_batch(fitted: FittedAnchor, isl: int, osl: int, itl_p90_ms: float, max_loss: float = 0.05,
                 layout=None) -> BatchAdvice:  # noqa: ANN001
    layout = layout or fitted.layout
    if not 0.0 <= max_loss < 1.0:
        raise ValueError(f"max_loss={max_loss} must be a fraction in [0, 1)")
    if itl_p90_ms <= 0:
        raise ValueError("the ITL target must be positive (ms)")
    cost = layout_cost(fitted.model, fitted.gpu, layout, fitted.precision, fitted.kv_dtype, fitted.engine,
                       fitted.engine_version)
    base = engine_sched(fitted.engine, fitted.model, fitted.gpu, layout, fitted.precision, fitted.engine_version,
                        fitted.kv_dtype)
    sched = replace(base, max_num_seqs=BATCH_GRID * 1.0)
    params = fitted.params.without_harness()  # the engine's limits, not a harness's
    n = BATCH_GRID.size
    r = closed_loop(params, cost, sched, np.full(n, float(isl)), np.full(n, float(osl)), BATCH_GRID * layout.dp)
    ok = r.tpot * ITL_P90_RATIO * 1e3 <= itl_p90_ms
    if not ok.any():
        raise ValueError(f"no batch limit meets ITL p90 {itl_p90_ms} ms: even one sequence takes "
                         f"{r.tpot[0] * ITL_P90_RATIO * 1e3:.1f} ms; choose a wider layout or a faster GPU")
    i_max = int(np.nonzero(ok)[0].max())
    thr_max = float(r.throughput[i_max])
    within = np.nonzero(r.throughput[: i_max + 1] >= (1.0 - max_loss) * thr_max)[0]
    i_sat = int(within.min())
    per_tok = kv_bytes_per_token_per_gpu(fitted.model, layout, fitted.kv_dtype, fitted.engine)
    need = BATCH_GRID[i_sat] * (isl + osl) * per_tok
    plan = plan_memory(fitted.model, fitted.gpu, layout, engine=fitted.engine, precision=fitted.precision,
                       kv_dtype=fitted.kv_dtype)
    returnable = max(plan.kv_bytes - need, 0.0)
    frac = plan.memory_fraction - returnable / fitted.gpu.hbm_bytes
    curve = [{"max_num_seqs": float(b), "tpot_ms": float(t * 1e3), "throughput": float(x)}
             for b, t, x in zip(BATCH_GRID, r.tpot, r.throughput, strict=True)]
    return BatchAdvice(
        max_num_seqs=int(BATCH_GRID[i_max]), tpot_ms=float(r.tpot[i_max] * 1e3), throughput=thr_max,
        saturating_batch=int(BATCH_GRID[i_sat]), throughput_at_saturating=float(r.throughput[i_sat]),
        kv_gb_needed=float(need) / 1e9, kv_gb_pool=float(plan.kv_bytes) / 1e9,
        kv_gb_returnable=float(returnable) / 1e9, memory_fraction=round(float(frac), 3), curve=curve,
    )
