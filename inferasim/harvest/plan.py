"""What the harvester measures: a few closed-loop benchmark points chosen to pin the step time.

Why these points (DESIGN.md section 3): at (isl, osl) = (512, 128) concurrency 1 -> 64 moves the
decode step from the fixed host cost plus one weight read (t_fixed, e_bw) to the per-sequence
and KV-read terms (t_seq, e_kv) and the prefill share of mixed steps (e_flops); a long prompt
(4096, 64) at moderate concurrency weighs prefill compute and attention (e_flops, e_attn) and
the API latency in TTFT (t_ttft). Each point is run like `vllm bench serve --max-concurrency C
--num-prompts N` with fixed lengths and ignore_eos.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.model.memory import weight_bytes_per_gpu

# Requests per point: at least MIN_REQUESTS, and REQUESTS_PER_CLIENT per client so that each
# client runs a few requests back to back (the start-up wave is then a third of the sample).
MIN_REQUESTS = 12
REQUESTS_PER_CLIENT = 3


@dataclass(frozen=True)
class PlanPoint:
    isl: int
    osl: int
    concurrency: int
    requests: int

    def label(self) -> str:
        return f"{self.isl}x{self.osl}@c{self.concurrency}"


def requests_for(concurrency: int, min_requests: int = MIN_REQUESTS, per_client: int = REQUESTS_PER_CLIENT) -> int:
    return max(min_requests, per_client * concurrency)


DEFAULT_PLAN_TEXT = "512x128@1,4,16,64;4096x64@8"


def parse_plan(text: str, min_requests: int = MIN_REQUESTS, per_client: int = REQUESTS_PER_CLIENT) -> list[PlanPoint]:
    """`ISLxOSL@C1,C2,...;ISLxOSL@C...` -> points, in the order given. ValueError naming the bad part."""
    points: list[PlanPoint] = []
    for group in (g.strip() for g in text.split(";")):
        if not group:
            continue
        lengths, sep, concs = group.partition("@")
        isl_s, x, osl_s = lengths.lower().partition("x")
        try:
            if not sep or not x:
                raise ValueError
            isl, osl = int(isl_s), int(osl_s)
            cs = [int(c) for c in concs.split(",") if c.strip()]
        except ValueError:
            raise ValueError(f"--plan part {group!r} is not ISLxOSL@C1,C2,... (e.g. {DEFAULT_PLAN_TEXT!r})") from None
        if isl < 1 or osl < 1 or not cs or min(cs) < 1:
            raise ValueError(f"--plan part {group!r}: lengths and concurrencies must be positive")
        if osl < 2:
            raise ValueError(f"--plan part {group!r}: osl must be at least 2 to measure a time per output token")
        points.extend(PlanPoint(isl, osl, c, requests_for(c, min_requests, per_client)) for c in cs)
    if not points:
        raise ValueError("--plan has no points")
    return points


def default_plan() -> list[PlanPoint]:
    return parse_plan(DEFAULT_PLAN_TEXT)


# Time an engine takes before it serves: process start, distributed init, weight loading, and the
# warm-up that vLLM and SGLang do before they report healthy (torch.compile, CUDA/HIP graph capture
# for each batch size; a few minutes on current releases). Weight loading is the part that grows
# with the model: each node reads its GPUs' shards, here at WEIGHT_LOAD_BYTES_PER_S from the
# model cache (a PVC or local NVMe holding the checkpoint; a first download from the Hub is
# slower and is not what a harvest should be sized for).
ENGINE_INIT_S = 300.0
WEIGHT_LOAD_BYTES_PER_S = 1e9
# What the default plan's measurement takes after start-up (inferasim harvest run --budget-s default).
MEASURE_S = 900.0


def engine_startup_s(model: ModelSpec, layout: Layout, precision: str, gpus_per_node: int) -> float:
    """Seconds from an engine's start to its first healthy answer, for sizing a harvest's time:
    ENGINE_INIT_S plus the weights of the busiest node at WEIGHT_LOAD_BYTES_PER_S."""
    per_gpu = weight_bytes_per_gpu(model, layout, precision)["total"]
    node = per_gpu * max(min(layout.gpus, max(gpus_per_node, 1)), 1)
    return ENGINE_INIT_S + node / WEIGHT_LOAD_BYTES_PER_S


def harvest_gpu_hours(model: ModelSpec, layout: Layout, precision: str, gpus_per_node: int) -> float:
    """GPU-hours one harvest of `layout` takes: start-up plus the measurement, on every GPU."""
    return layout.gpus * (engine_startup_s(model, layout, precision, gpus_per_node) + MEASURE_S) / 3600.0
