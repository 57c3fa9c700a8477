"""The discrete-event simulator against its invariants and against the analytic estimator.

What differs from `inferasim.model.steady.closed_loop`, and why the comparisons look as they do:
- The analytic estimator describes a steady state in which arrivals are spread out, plus a fitted
  `burst` term for the start-up wave. A deterministic replay with fixed ISL/OSL never leaves the
  waves: requests prefilled in the same step finish in the same step and come back together. So
  TTFT is compared (a) on random lengths (`range_ratio`), which desynchronise the clients, over
  the requests after the first wave, against the analytic steady state (burst = 0); and (b) on
  fixed lengths, for the SGLang-style scheduler whose whole wave stays in lockstep, against the
  analytic burst term alone (burst = 1).
- Throughput and TPOT are compared over the whole run, start-up wave and drain tail included, as
  `vllm bench serve` reports them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import LayoutCost, layout_cost
from inferasim.model.steady import EngineSched, closed_loop, engine_sched, offline_batch
from inferasim.model.steptime import StepParams, roofline_floor
from inferasim.sim.des import SimResult, simulate_closed_loop, simulate_offline
from inferasim.sim.engines import make_core
from inferasim.sim.prefix import KVPool, KVPoolFull
from inferasim.sim.request import SimRequest

MODEL = get_model("meta-llama/Meta-Llama-3.1-8B")
GPU = get_gpu("H100")
ENGINES = ("vllm", "sglang", "atom")


def _setup(engine: str, layout: Layout | None = None) -> tuple[LayoutCost, EngineSched]:
    layout = layout or Layout(tp=1)
    return layout_cost(MODEL, GPU, layout), engine_sched(engine, MODEL, GPU, layout)


def _analytic(p: StepParams, c: LayoutCost, s: EngineSched, isl: int, osl: int, conc: int):
    return closed_loop(p, c, s, np.array([isl]), np.array([osl]), np.array([conc]))


def _check_records(res: SimResult, n: int) -> None:
    assert len(res.requests) == n
    for r in res.requests:
        assert r.first_token is not None and r.finish is not None, r
        assert r.first_token <= r.finish
        assert r.ttft > 0.0
        assert r.generated == r.output
    assert 0 < res.kv_peak_tokens <= res.kv_capacity_tokens


# -- invariants ---------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_all_requests_finish_in_order_of_events(engine: str) -> None:
    c, s = _setup(engine)
    res = simulate_closed_loop(StepParams(), c, s, 512, 128, 16, range_ratio=0.3)
    _check_records(res, 160)
    assert res.preemptions == 0
    # The client-side latency is part of TTFT, as in the analytic estimator.
    assert min(r.ttft for r in res.requests) > StepParams().t_ttft
    d = res.as_dict()
    assert d["requests"] == 160 and d["ttft_p99_s"] >= d["ttft_p50_s"] > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_small_kv_preempts_and_never_overflows(engine: str) -> None:
    p, (c, s) = StepParams(), _setup(engine)
    small = dataclasses.replace(s, kv_tokens=12000)  # ~7 requests of 1024 + 512 fit at their end
    res = simulate_closed_loop(p, c, small, 1024, 512, 32)
    _check_records(res, 320)
    assert res.kv_capacity_tokens == int(12000 * p.kv_scale) // s.block_size * s.block_size
    assert res.preemptions > 0  # vLLM preempts by recompute, SGLang retracts
    assert sum(r.preemptions for r in res.requests) == res.preemptions


def test_kv_pool_refuses_overflow_and_the_core_counts_decode_blocks() -> None:
    kv = KVPool(100, 16, caching=False)
    assert kv.total == 6 and kv.capacity_tokens == 96
    kv.alloc(6)
    with pytest.raises(KVPoolFull):
        kv.alloc(1)
    kv.release(6)
    # Blocks that k decode steps of every running request open, from the core's aggregates,
    # against counting them request by request.
    _, s = _setup("vllm")
    prompts = [1, 2, 15, 16, 17, 31, 32, 100]
    for block in (16, 1):
        core = make_core(dataclasses.replace(s, block_size=block), 100_000)
        for rid, n in enumerate(prompts):
            core.enqueue(SimRequest(rid, 0.0, n, 1000))
        t = 0.0
        while core.prows or core.waiting:
            core.schedule(t)
            t += 0.01
            core.commit(t)
        held = np.array(prompts)  # decoding: the prompt's KV is written, the first token's not yet
        steps = np.arange(1, 60)
        brute = np.array([int(np.sum(-(-(held + j) // block) - -(-held // block))) for j in steps])
        np.testing.assert_array_equal(core.blocks_upto(59), brute)


def test_request_that_cannot_fit_is_refused() -> None:
    c, s = _setup("vllm")
    with pytest.raises(ValueError, match="cannot fit"):
        simulate_closed_loop(StepParams(), c, dataclasses.replace(s, kv_tokens=1000), 1024, 64, 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_jumping_over_decode_runs_is_exact(engine: str) -> None:
    """The event jumps only skip work: stepping every iteration gives the same records."""
    c, s = _setup(engine)
    s = dataclasses.replace(s, kv_tokens=12000)  # with preemptions and block boundaries
    kw = dict(num_requests=60, range_ratio=0.5, think_time=0.02, seed=3)
    fast = simulate_closed_loop(StepParams(), c, s, 300, 700, 24, **kw)
    slow = simulate_closed_loop(StepParams(), c, s, 300, 700, 24, jump=False, **kw)
    assert fast.preemptions > 0
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    np.testing.assert_allclose([r.finish for r in fast.requests], [r.finish for r in slow.requests], rtol=1e-9)
    np.testing.assert_allclose([r.first_token for r in fast.requests],
                               [r.first_token for r in slow.requests], rtol=1e-9)


def test_schedulers_mix_or_separate_prefill_and_decode() -> None:
    """vLLM V1 rides prefill chunks on decode steps; SGLang (no mixed chunk) and ATOM never do."""
    for engine, mixed_seen_expected in (("vllm", True), ("sglang", False), ("atom", False)):
        _, s = _setup(engine)
        sch = make_core(s, 100_000)
        mixed_seen = False
        now = 0.0
        for rid in range(6):
            sch.enqueue(SimRequest(rid, 0.0, 600, 40))
            for _ in range(3):
                b = sch.schedule(now)
                mixed_seen |= b.n_dec > 0 and b.n_pref > 0
                now += 0.01
                sch.commit(now)
        assert mixed_seen is mixed_seen_expected, engine


def test_same_seed_same_result_and_seed_matters() -> None:
    c, s = _setup("vllm")
    kw = dict(num_requests=80, range_ratio=0.4, think_time=0.05)
    a = simulate_closed_loop(StepParams(), c, s, 800, 200, 16, seed=7, **kw)
    b = simulate_closed_loop(StepParams(), c, s, 800, 200, 16, seed=7, **kw)
    other = simulate_closed_loop(StepParams(), c, s, 800, 200, 16, seed=8, **kw)
    assert a.as_dict() == b.as_dict()
    assert [(r.first_token, r.finish) for r in a.requests] == [(r.first_token, r.finish) for r in b.requests]
    assert other.as_dict() != a.as_dict()


@pytest.mark.parametrize("engine", ENGINES)
def test_throughput_within_roofline(engine: str) -> None:
    """No step can beat the roofline floor of its batch, so C sequences at context >= isl make
    at most C / floor(C, isl) tokens per second."""
    p, (c, s) = StepParams(), _setup(engine)
    isl, osl = 1024, 256
    for conc in (1, 16, 128):
        res = simulate_closed_loop(p, c, s, isl, osl, conc, num_requests=max(2 * conc, 20))
        bound = conc / float(roofline_floor(c, conc, isl))
        assert res.throughput <= bound, (conc, res.throughput, bound)


@pytest.mark.parametrize("engine", ENGINES)
def test_tpot_grows_with_concurrency(engine: str) -> None:
    c, s = _setup(engine)
    tpots = [simulate_closed_loop(StepParams(), c, s, 1024, 512, conc).tpot_mean for conc in (1, 8, 64)]
    assert tpots == sorted(tpots), tpots


# -- against the analytic estimator -----------------------------------------------------------------

# Points where the KV pool does not bind (C x (isl + osl) well below the pool).
POINTS = [(1024, 1024, 8), (1024, 1024, 64), (4096, 512, 32), (128, 1024, 128)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("isl,osl,conc", POINTS)
def test_closed_loop_matches_analytic_steady_state(engine: str, isl: int, osl: int, conc: int) -> None:
    p, (c, s) = StepParams(burst=0.0), _setup(engine)
    a = _analytic(p, c, s, isl, osl, conc)
    assert not a.kv_limited[0]
    res = simulate_closed_loop(p, c, s, isl, osl, conc, range_ratio=0.5)
    assert res.preemptions == 0
    assert res.tpot_mean == pytest.approx(a.tpot[0], rel=0.15)
    assert res.throughput == pytest.approx(a.throughput[0], rel=0.15)
    # TTFT after the start-up wave (the analytic one without its burst term).
    assert res.means(first_rid=conc)["ttft"] == pytest.approx(a.ttft[0], rel=0.35)


# The closed form (the fast path of predict, validate and tune) against each engine's scheduler
# (the one the trace simulator and the emulator run) replayed request by request, one rank, the KV
# pool not binding, random lengths (range 0.5). Measured 2026-12-05 for vLLM, SGLang and ATOM on
# Llama-3.1-8B bf16 tp1 and Llama-3.1-70B fp8 tp4 (H100) at 1-256 clients: TPOT within 4.4% and
# throughput within 4.9% at this test's points (5.8% at 8B's 128/1024 x 128 of POINTS).
# Throughput sits 2-6% low at every concurrency above 1 for a known reason: a replay counts its
# start-up wave and its drain tail, when fewer clients are busy, as `vllm bench serve` does, while
# the closed form is the steady state. The tolerances, 6% and 8%, are those worst cases with about
# a third more room; a policy change that moves either by more is one the two must be reconciled
# over. Not dp > 1: ranks step in lockstep, so with random lengths a step lasts as long as its
# slowest rank, which the closed form does not price (TPOT up to 24% higher in the replay at 64
# clients over 2 ranks); test_attention_dp_ranks_step_in_lockstep uses fixed lengths.
CLOSED_FORM_TPOT_TOL = 0.06
CLOSED_FORM_THROUGHPUT_TOL = 0.08


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("name", "tp", "precision"), [("meta-llama/Meta-Llama-3.1-8B", 1, "bf16"),
                                                       ("meta-llama/Llama-3.1-70B", 4, "fp8")])
def test_closed_form_tracks_the_engine_scheduler(engine: str, name: str, tp: int, precision: str) -> None:
    model, lay = get_model(name), Layout(tp=tp)
    c = layout_cost(model, GPU, lay, precision, precision)
    s = engine_sched(engine, model, GPU, lay, precision, "", precision)
    p = StepParams(burst=0.0)
    for isl, osl, conc in ((1024, 512, 1), (1024, 512, 16), (2048, 256, 64), (512, 512, 256)):
        a = closed_loop(p, c, s, np.array([isl]), np.array([osl]), np.array([conc]))
        assert not a.kv_limited[0]
        res = simulate_closed_loop(p, c, s, isl, osl, conc, range_ratio=0.5)
        assert res.preemptions == 0
        assert res.tpot_mean == pytest.approx(a.tpot[0], rel=CLOSED_FORM_TPOT_TOL), (isl, osl, conc)
        assert res.throughput == pytest.approx(a.throughput[0], rel=CLOSED_FORM_THROUGHPUT_TOL), (isl, osl, conc)


@pytest.mark.parametrize("engine", ENGINES)
def test_fixed_lengths_match_analytic_throughput(engine: str) -> None:
    p, (c, s) = StepParams(burst=0.0), _setup(engine)
    for isl, osl, conc in ((1024, 1024, 8), (1024, 1024, 64), (8192, 1024, 16)):
        a = _analytic(p, c, s, isl, osl, conc)
        res = simulate_closed_loop(p, c, s, isl, osl, conc)
        assert res.throughput == pytest.approx(a.throughput[0], rel=0.15)
        assert res.tpot_mean == pytest.approx(a.tpot[0], rel=0.15)


def test_fixed_lengths_keep_sglang_waves_as_the_burst_term_says() -> None:
    """SGLang prefills the whole wave before decoding it, so with fixed lengths the clients stay
    in one wave; its TTFT is what the analytic burst term (burst = 1) describes."""
    p, (c, s) = StepParams(burst=1.0), _setup("sglang")
    for isl, osl, conc in ((1024, 1024, 64), (4096, 512, 32)):
        a = _analytic(p, c, s, isl, osl, conc)
        res = simulate_closed_loop(p, c, s, isl, osl, conc)
        assert res.ttft_mean == pytest.approx(a.ttft[0], rel=0.15)


def test_attention_dp_ranks_step_in_lockstep() -> None:
    p = StepParams(burst=0.0)
    c1, s1 = _setup("vllm", Layout(tp=1))
    c2, s2 = _setup("vllm", Layout(tp=1, dp=2))
    one = simulate_closed_loop(p, c1, s1, 1024, 512, 32)
    two = simulate_closed_loop(p, c2, s2, 1024, 512, 64)
    # Same per-rank load: about twice the throughput, TPOT no better than one rank's.
    assert two.throughput == pytest.approx(2.0 * one.throughput, rel=0.1)
    assert two.tpot_mean >= one.tpot_mean * 0.999
    a = _analytic(p, c2, s2, 1024, 512, 64)
    assert two.throughput == pytest.approx(a.throughput[0], rel=0.15)


@pytest.mark.parametrize("engine", ENGINES)
def test_offline_batch_latency_grows_and_matches_analytic(engine: str) -> None:
    p, (c, s) = StepParams(), _setup(engine)
    isl, osl = 1024, 1024
    lat = []
    for batch in (1, 16, 64, 128):
        res = simulate_offline(p, c, s, isl, osl, batch)
        _check_records(res, batch)
        a = offline_batch(p, c, s, np.array([isl]), np.array([osl]), np.array([batch]))
        assert res.duration == pytest.approx(a.batch_latency[0], rel=0.15)
        lat.append(res.duration)
    assert lat == sorted(lat)


def test_target_speed() -> None:
    """The acceptance case of the issue: C = 256, 1024/1024, 2560 requests in well under 2 s."""
    import time

    c, s = _setup("vllm")
    t0 = time.perf_counter()
    res = simulate_closed_loop(StepParams(), c, s, 1024, 1024, 256)
    assert len(res.requests) == 2560
    assert time.perf_counter() - t0 < 4.0  # 0.5 s on the machine this was written on; slack for CI
