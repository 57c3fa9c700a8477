"""Closed-loop and offline numbers of the simulator pinned before the prefix cache, the host tier,
routers and workloads were added: requests without a prefix identity must run exactly as before."""

from __future__ import annotations

import dataclasses

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import StepParams
from inferasim.sim.des import simulate_closed_loop, simulate_offline

MODEL = get_model("meta-llama/Meta-Llama-3.1-8B")
GPU = get_gpu("H100")

# engine, dp -> (ttft_mean, tpot_mean, throughput, steps, preemptions, duration)
CLOSED = {
    ("vllm", 1): (0.21718887058613093, 0.014138448820654804, 1924.1238749433478, 2330, 0, 32.31340809688286),
    ("vllm", 2): (0.15546354153778025, 0.012385331654711888, 2182.810086529427, 2327, 0, 28.483925552522777),
    ("sglang", 1): (0.2122755834431181, 0.014513291633487713, 1883.9164215070236, 2411, 0, 33.003056446773584),
    ("sglang", 2): (0.1402398670568266, 0.012569419573890527, 2159.0645887296705, 2371, 0, 28.797193156959665),
}
SMALL_KV = {
    "vllm": (1.2661656882322754, 0.012953735334669175, 1305.4813744111168, 2996, 73, 32.86067564108381),
    "sglang": (3.6514961732646376, 0.010992361173484039, 1184.4914821415844, 3432, 6, 36.21722962704447),
}
OFFLINE = {"vllm": (20.19504802176494, 1032), "sglang": (20.18291013497794, 1031)}


@pytest.fixture(autouse=True)
def _step_model_of_the_pinned_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numbers pin the simulator's scheduling; they were taken before the step-time model got
    its GEMM shape factor and before SGLang's consecutive-prefill delay, so both are off here (the
    delay has tests of its own in test_sglang_prefill_batches.py)."""
    import inferasim.model.steptime as steptime
    import inferasim.sim.engines as engines

    monkeypatch.setattr(engines, "SGLANG_CONSECUTIVE_PREFILL_DELAY", 0.0)  # (every simulator reads it there)

    monkeypatch.setattr(steptime, "GEMM_M0", 0.0)
    monkeypatch.setattr(steptime, "GEMM_N0", 0.0)


def _numbers(r) -> tuple:  # noqa: ANN001
    return (r.ttft_mean, r.tpot_mean, r.throughput, r.steps, r.preemptions, r.duration)


@pytest.mark.parametrize("engine,dp", sorted(CLOSED))
def test_closed_loop_numbers_unchanged(engine: str, dp: int) -> None:
    lay = Layout(tp=1, dp=dp)
    res = simulate_closed_loop(StepParams(), layout_cost(MODEL, GPU, lay), engine_sched(engine, MODEL, GPU, lay),
                               1024, 512, 32, num_requests=120, range_ratio=0.5, think_time=0.01, seed=5)
    assert _numbers(res) == pytest.approx(CLOSED[(engine, dp)], rel=1e-9)


@pytest.mark.parametrize("engine", sorted(SMALL_KV))
def test_closed_loop_with_preemption_unchanged(engine: str) -> None:
    lay = Layout(tp=1)
    s = dataclasses.replace(engine_sched(engine, MODEL, GPU, lay), kv_tokens=12000)
    res = simulate_closed_loop(StepParams(), layout_cost(MODEL, GPU, lay), s, 300, 700, 24, num_requests=60,
                               range_ratio=0.5, think_time=0.02, seed=3)
    assert _numbers(res) == pytest.approx(SMALL_KV[engine], rel=1e-9)


@pytest.mark.parametrize("engine", sorted(OFFLINE))
def test_offline_unchanged(engine: str) -> None:
    lay = Layout(tp=1)
    res = simulate_offline(StepParams(), layout_cost(MODEL, GPU, lay), engine_sched(engine, MODEL, GPU, lay),
                           1024, 1024, 64)
    assert (res.duration, res.steps) == pytest.approx(OFFLINE[engine], rel=1e-9)
