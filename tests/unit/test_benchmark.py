"""The steady-state benchmark estimator: closed loop, offline batch, open loop."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import closed_loop, engine_sched, offline_batch, open_loop
from inferasim.model.steptime import StepParams, roofline_floor, step_time

MODEL = "meta-llama/Meta-Llama-3.1-70B"


def setup(engine: str = "vllm", tp: int = 4, gpu: str = "H100", version: str = ""):  # noqa: ANN201
    model, g = get_model(MODEL), get_gpu(gpu)
    lay = Layout(tp=tp)
    return layout_cost(model, g, lay, "fp8", "fp8"), engine_sched(engine, model, g, lay, "fp8", version, "fp8")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_closed_loop_latency_grows_with_concurrency(engine: str) -> None:
    cost, sched = setup(engine)
    conc = np.array([1, 4, 16, 64, 256], dtype=float)
    r = closed_loop(StepParams(), cost, sched, np.full(5, 1024.0), np.full(5, 512.0), conc)
    assert np.all(np.diff(r.tpot) > 0) and np.all(np.diff(r.ttft) > 0)
    assert np.all(np.diff(r.throughput) > 0)  # below saturation more clients, more tokens/s
    assert np.all(r.ttft > 0) and np.all(r.tpot > 0)


def test_throughput_never_above_the_roofline() -> None:
    cost, sched = setup()
    conc = np.array([1, 8, 64, 512], dtype=float)
    r = closed_loop(StepParams(), cost, sched, np.full(4, 1024.0), np.full(4, 1024.0), conc)
    bound = r.running / roofline_floor(cost, r.running, 1024.0 + 512.0)
    assert np.all(r.throughput <= bound)


def test_kv_pool_limits_running_requests_and_queues_clients() -> None:
    cost, sched = setup(tp=2)
    small = replace(sched, kv_tokens=40_000)
    r = closed_loop(StepParams(), cost, small, np.array([8192.0]), np.array([1024.0]), np.array([64.0]))
    assert bool(r.kv_limited[0])
    # The pool holds what the running requests hold on average: the prompt and half the output.
    assert r.running[0] * (8192 + 512) <= 40_000 + 8704
    free = closed_loop(StepParams(), cost, sched, np.array([8192.0]), np.array([1024.0]), np.array([4.0]))
    assert r.ttft[0] > 5 * free.ttft[0]


def test_mixed_and_separate_prefill_scheduling_differ() -> None:
    cost, vllm = setup("vllm")
    assert vllm.mixed
    sglang = replace(vllm, mixed=False)
    p = StepParams(burst=0.0)
    args = (np.array([4096.0]), np.array([256.0]), np.array([64.0]))
    mixed, separate = closed_loop(p, cost, vllm, *args), closed_loop(p, cost, sglang, *args)
    # Separate prefill batches stall every decode for their whole step (host cost and weight read
    # included): TPOT suffers more than with chunks riding in decode steps.
    assert separate.tpot[0] > mixed.tpot[0]
    _, v0 = setup("vllm", version="0.6.1")
    assert not v0.mixed  # vLLM V0 ran prefill apart


def test_offline_batch_latency_and_throughput() -> None:
    cost, sched = setup()
    b = np.array([1, 8, 64, 256], dtype=float)
    r = offline_batch(StepParams(), cost, sched, np.full(4, 512.0), np.full(4, 512.0), b)
    assert np.all(np.diff(r.batch_latency) > 0)
    assert np.all(np.diff(r.throughput) > 0)
    np.testing.assert_allclose(r.throughput, b * 512 / r.batch_latency)


def test_open_loop_little_law_and_saturation() -> None:
    cost, sched = setup()
    rates = np.array([0.5, 2.0, 8.0, 1e4])
    r = open_loop(StepParams(), cost, sched, np.full(4, 1024.0), np.full(4, 256.0), rates)
    assert bool(r.stable[0]) and bool(r.stable[1]) and not bool(r.stable[3])
    ok = r.stable
    np.testing.assert_allclose(r.running[ok], rates[ok] * (r.ttft[ok] + 255 * r.tpot[ok]), rtol=0.05)
    assert np.all(np.diff(r.tpot[ok]) >= 0)


def test_serial_front_end_adds_a_wave_queue_and_old_params_load_without_it() -> None:
    assert StepParams.from_dict({"t_fixed": 4e-3}).t_front == 0.0
    cost, sched = setup("sglang")
    conc = np.array([4, 16, 64], dtype=float)
    isl, osl = np.full(3, 1024.0), np.full(3, 512.0)
    base = closed_loop(StepParams(burst=1.0), cost, sched, isl, osl, conc)
    front = closed_loop(StepParams(burst=1.0, t_front=0.01), cost, sched, isl, osl, conc)
    # A synchronised wave of C arrivals waits (C + 1)/2 x t_front on average; TPOT is untouched.
    np.testing.assert_allclose(front.ttft - base.ttft, (conc + 1.0) / 2.0 * 0.01, rtol=1e-6)
    np.testing.assert_allclose(front.tpot, base.tpot)


def test_a_long_wave_persists_less_under_mixed_steps_than_under_separate_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wave share of mixed chunked steps (vLLM) falls as the wave grows against the steady
    TTFT; separate prefill batches (SGLang) keep the fitted share at every wave length."""
    import inferasim.model.steady as bench

    isl, osl = np.full(5, 8192.0), np.full(5, 1024.0)
    conc = np.array([4, 16, 64, 128, 256], dtype=float)  # 256 fills the KV pool here
    share = {}
    for engine in ("vllm", "sglang"):
        cost, sched = setup(engine)
        steady = closed_loop(StepParams(burst=0.0), cost, sched, isl, osl, conc).ttft
        damped = closed_loop(StepParams(burst=1.0), cost, sched, isl, osl, conc).ttft
        with monkeypatch.context() as m:
            m.setattr(bench, "WAVE_GAMMA_MIXED", 0.0)
            whole = closed_loop(StepParams(burst=1.0), cost, sched, isl, osl, conc).ttft
        assert np.all(whole > steady) and np.all(damped > steady)
        share[engine] = (damped - steady) / (whole - steady)
    assert np.all(np.diff(share["vllm"]) < 0) and share["vllm"][-1] < 0.6
    assert np.allclose(share["sglang"], 1.0)


def test_a_nightly_vllm_build_schedules_like_the_current_release() -> None:
    _, nightly = setup("vllm", version="nightly-5b8c30d62b754b57")
    _, v0 = setup("vllm", version="0.6.3")
    _, current = setup("vllm", version="0.19.0")
    assert nightly.mixed and current.mixed and not v0.mixed


def test_sglang_wave_needs_a_second_prefill_batch_at_sixteen_1024_token_prompts() -> None:
    # B200 defaults: chunk 16384 = --max-prefill-tokens, so a batch holds 15 whole 1024-token
    # prompts (PrefillAdder refuses the 16th: 1024 >= 1024 tokens left). The 16th client's wave
    # takes a second batch, and the first batch's first tokens then wait for it (overlap
    # scheduler): TTFT jumps between 15 and 16 clients more than between any neighbours around.
    cost, sched = setup("sglang", tp=8, gpu="B200")
    assert sched.prefill_chunk == sched.max_prefill_tokens == 16384
    conc = np.arange(12.0, 20.0)
    p = StepParams(burst=1.0, t_front=0.0)
    r = closed_loop(p, cost, sched, np.full(conc.size, 1024.0), np.full(conc.size, 1024.0), conc)
    steps = np.diff(r.ttft)
    jump = steps[list(conc[1:]).index(16.0)]
    assert jump > 3.0 * np.delete(steps, list(conc[1:]).index(16.0)).max()
    # vLLM's mixed chunked steps have no such edge.
    vcost, vsched = setup("vllm", tp=8, gpu="B200")
    v = closed_loop(p, vcost, vsched, np.full(conc.size, 1024.0), np.full(conc.size, 1024.0), conc)
    assert np.diff(v.ttft).max() < 2.0 * np.diff(v.ttft).min()


def test_sglang_prompts_half_the_prefill_budget_or_longer_go_one_per_batch() -> None:
    # On B200 defaults two 8191-token prompts share a batch and two 8192-token ones do not: the
    # wave's batching, and with it TTFT, changes at that edge and nowhere near it.
    cost, sched = setup("sglang", tp=8, gpu="B200")
    p = StepParams(burst=1.0, t_front=0.0)
    isl = np.array([8190.0, 8191.0, 8192.0, 8193.0])
    r = closed_loop(p, cost, sched, isl, np.full(4, 1024.0), np.full(4, 16.0))
    edge, before, after = abs(r.ttft[2] - r.ttft[1]), abs(r.ttft[1] - r.ttft[0]), abs(r.ttft[3] - r.ttft[2])
    assert edge > 10.0 * max(before, after)


def test_sglang_keeps_part_of_a_wave_prefilled_one_prompt_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """8192-token prompts go one per SGLang prefill batch on B200 defaults: the TTFT excess of
    such a wave over the steady state is kept at SGLANG_SINGLE_PROMPT_WAVE_SHARE. A wave of
    1024-token prompts, up to 15 per batch, keeps all of it, as does vLLM's."""
    import inferasim.model.steady as bench

    conc = np.array([4.0, 16.0, 64.0])
    for engine, isl, expect in (("sglang", 8192.0, bench.SGLANG_SINGLE_PROMPT_WAVE_SHARE),
                                ("sglang", 1024.0, 1.0), ("vllm", 8192.0, None)):
        cost, sched = setup(engine, tp=8, gpu="B200")
        args = (cost, sched, np.full(3, isl), np.full(3, 1024.0), conc)
        steady = closed_loop(StepParams(burst=0.0), *args).ttft
        kept = closed_loop(StepParams(burst=1.0), *args).ttft
        with monkeypatch.context() as m:
            m.setattr(bench, "SGLANG_SINGLE_PROMPT_WAVE_SHARE", 1.0)
            whole = closed_loop(StepParams(burst=1.0), *args).ttft
        assert np.all(whole > steady)
        if expect is None:
            np.testing.assert_allclose(kept, whole)
        else:
            np.testing.assert_allclose((kept - steady) / (whole - steady), expect, rtol=1e-9)
    assert 0.0 < bench.SGLANG_SINGLE_PROMPT_WAVE_SHARE < 1.0


@pytest.mark.parametrize("gpu", ["B200", "H100"])
def test_sglang_single_prompt_share_never_makes_ttft_fall_as_prompts_grow(
        gpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The share falls to SGLANG_SINGLE_PROMPT_WAVE_SHARE as prompts reach a batch of their own
    (8192 tokens on B200 defaults, the 8192-token chunk on H100) about as fast as the wave's
    excess grows: wherever TTFT rose with the prompt without the share it still does, to within
    0.5% per 64-token step (the fixed part of each batch makes the excess grow slightly slower
    than the prompt), where a step at that edge once made it fall by 40-45%."""
    import inferasim.model.steady as bench

    model, g, lay = get_model("Qwen/Qwen3.5-397B-A17B"), get_gpu(gpu), Layout(tp=8)
    cost, sched = layout_cost(model, g, lay, "fp8"), engine_sched("sglang", model, g, lay, "fp8", "", "fp8")
    isl = np.arange(4096.0, 16385.0, 64.0)
    for conc in (8.0, 64.0):
        args = (cost, sched, isl, np.full(isl.size, 1024.0), np.full(isl.size, conc))
        ttft = closed_loop(StepParams(burst=1.0), *args).ttft
        with monkeypatch.context() as m:
            m.setattr(bench, "SGLANG_SINGLE_PROMPT_WAVE_SHARE", 1.0)
            plain = np.diff(closed_loop(StepParams(burst=1.0), *args).ttft)
        rising = plain > 0
        relative = np.diff(ttft) / ttft[:-1]
        assert np.all(relative[rising] > -0.005), isl[1:][rising][relative[rising] <= -0.005]
    edge = 8192.0
    r = closed_loop(StepParams(burst=1.0), cost, sched, np.array([edge - 64.0, edge]), np.full(2, 1024.0),
                    np.full(2, 64.0))
    assert r.ttft[1] > r.ttft[0]


def test_closed_loop_steady_state_is_converged_near_prefill_saturation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long prompts and short outputs keep the prefill server near saturation: the steady state is
    a root, not whatever an iteration count happens to give. Halving the bisection budget (but
    keeping it ample) changes nothing, and a one-token-longer prompt moves TTFT by well under 1%
    (a damped fixed-point iteration once flipped 13.05 s <-> 5.70 s between 14208 and 14209)."""
    import inferasim.model.steady as bench

    cost, sched = setup(tp=4)
    model, g = get_model(MODEL), get_gpu("H100")
    cost = layout_cost(model, g, Layout(tp=4), "bf16")
    sched = engine_sched("vllm", model, g, Layout(tp=4), "bf16", "", "bf16")
    args = (cost, sched, np.array([14208.0, 14209.0]), np.full(2, 64.0), np.full(2, 16.0))
    r = closed_loop(StepParams(), *args)
    assert abs(r.ttft[1] / r.ttft[0] - 1.0) < 0.01 and abs(r.tpot[1] / r.tpot[0] - 1.0) < 0.01
    monkeypatch.setattr(bench, "FIXED_POINT_ITERATIONS", 40)
    r40 = closed_loop(StepParams(), *args)
    np.testing.assert_allclose(r40.ttft, r.ttft, rtol=1e-6)
    # Throughput never beats the prefill server: each request costs its rank p_req of prefill.
    conc = np.array([8.0, 32.0, 128.0, 1024.0])
    big = closed_loop(StepParams(), cost, sched, np.full(4, 32768.0), np.full(4, 256.0), conc)
    t_dec = step_time(StepParams(), cost, big.running, 32768.0 + 128.0)
    chunk = sched.max_batched_tokens - big.running
    p_req = 32768.0 * (step_time(StepParams(), cost, big.running, 32768.0 + 128.0, chunk, 16384.0) - t_dec) / chunk
    assert np.all(big.throughput <= 256.0 / p_req * 1.001)


def test_throughput_is_flat_once_the_kv_pool_is_full() -> None:
    """Clients beyond what the KV pool runs queue for a slot: the running set, and with it the
    output rate, stays what it is however many clients wait (it once grew 2.3x past the cap)."""
    cost, sched = setup(tp=2)
    small = replace(sched, kv_tokens=60_000)
    conc = np.array([8.0, 16.0, 64.0, 256.0, 1024.0])
    r = closed_loop(StepParams(), cost, small, np.full(5, 8192.0), np.full(5, 512.0), conc)
    full = r.kv_limited
    assert full.sum() >= 3 and np.all(r.running[full] == r.running[full][0])
    np.testing.assert_allclose(r.throughput[full], r.throughput[full][0], rtol=1e-9)
    assert np.all(np.diff(r.ttft[full]) > 0)  # the queue is in TTFT


def test_a_pool_just_short_of_full_length_costs_little_and_one_far_short_costs_a_cycle() -> None:
    """KV admission when the pool is short (issue 26, class 4): engines allocate KV as tokens are
    written and preempt when it runs out, so a pool 1% short of every request at full length
    loses a little near the end of each cycle, not a whole cycle for the client left out (70B
    fp8 on one B200 at 64 clients of 1024 + 8192 tokens: 4.2 s predicted, 0.38 s measured)."""
    cost, sched = setup(tp=2)
    isl, osl, conc = 1024.0, 8192.0, 64.0
    roomy = closed_loop(StepParams(), cost, replace(sched, kv_tokens=int(2 * conc * (isl + osl))),
                        np.array([isl]), np.array([osl]), np.array([conc]))
    just = closed_loop(StepParams(), cost, replace(sched, kv_tokens=int(0.99 * conc * (isl + osl))),
                       np.array([isl]), np.array([osl]), np.array([conc]))
    assert just.running[0] == conc and not just.kv_limited[0]
    assert just.ttft[0] < 1.2 * roomy.ttft[0]
    # Short by a third of the pool: the preempted requests lose most of a cycle each.
    short = closed_loop(StepParams(), cost, replace(sched, kv_tokens=int(0.66 * conc * (isl + osl))),
                        np.array([isl]), np.array([osl]), np.array([conc]))
    cycle = roomy.ttft[0] + (osl - 1) * roomy.tpot[0]
    assert short.ttft[0] > roomy.ttft[0] + 0.05 * cycle
    assert short.throughput[0] < roomy.throughput[0]


def test_sglang_batches_short_prompts_that_arrive_together() -> None:
    """At a high arrival rate SGLang prefills the prompts waiting at a step boundary in one batch,
    sharing its host cost and weight read; priced as a batch per prompt, DeepSeek-R1 on B200 at
    128/64 and 480 clients gave a third of the discrete-event simulator's throughput."""
    from inferasim.sim.des import simulate_closed_loop

    model, g, lay = get_model("deepseek-ai/DeepSeek-R1"), get_gpu("B200"), Layout(tp=8)
    cost = layout_cost(model, g, lay, "fp8")
    sched = engine_sched("sglang", model, g, lay, "fp8", "", "fp8")
    p = StepParams(burst=0.0)
    r = closed_loop(p, cost, sched, np.array([128.0]), np.array([64.0]), np.array([480.0]))
    d = simulate_closed_loop(p, cost, sched, 128, 64, 480, num_requests=6 * 480, range_ratio=0.2, seed=1)
    assert abs(r.throughput[0] / d.throughput - 1.0) < 0.15
    # At one client no batch holds more than its own prompt: nothing changes.
    one = closed_loop(p, cost, sched, np.array([128.0]), np.array([64.0]), np.array([1.0]))
    alone = step_time(p, cost, 0.0, 0.0, 128.0, 64.0)
    t_dec = step_time(p, cost, 1.0, 160.0)
    assert one.ttft[0] == pytest.approx(0.5 * t_dec + alone + p.t_ttft, rel=0.05)


def test_sglang_one_client_pays_no_wave_for_its_own_chunks() -> None:
    """One client whose prompt needs two prefill chunks has no wave-mates: its TPOT and TTFT stay
    continuous across the chunk edge (one more token once added a 35% phantom stall to TPOT)."""
    model, g, lay = get_model(MODEL), get_gpu("H200"), Layout(tp=4)
    cost = layout_cost(model, g, lay, "fp8")
    sched = engine_sched("sglang", model, g, lay, "fp8", "", "fp8")
    edge = float(sched.prefill_chunk)
    r = closed_loop(StepParams(burst=1.0), cost, sched, np.array([edge, edge + 1.0]), np.full(2, 64.0),
                    np.ones(2))
    assert r.tpot[1] == pytest.approx(r.tpot[0], rel=0.01)
    assert r.ttft[1] >= r.ttft[0]


def test_open_loop_is_stable_exactly_below_its_capacity() -> None:
    """The capacity is the rate with every running slot busy; rates below it are stable, with TTFT
    growing with the rate, and rates at or above it are not, whatever the rate."""
    cost, sched = setup(tp=8, gpu="H200")
    rates = np.linspace(0.2, 6.0, 30)
    r = open_loop(StepParams(), cost, sched, np.full(rates.size, 8192.0), np.full(rates.size, 512.0), rates)
    cap = float(r.capacity[0])
    np.testing.assert_array_equal(r.stable, rates < cap)
    assert r.stable.any() and not r.stable.all()
    ok = r.stable
    assert np.all(np.diff(r.ttft[ok]) >= 0)
    np.testing.assert_allclose(r.throughput, np.minimum(rates, cap) * 512.0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_lone_client_waits_for_no_wave(engine: str) -> None:
    """One client has no wave-mates: how synchronised clients are (`burst`) cannot change its TTFT
    (half a phantom prefill batch once made a lone 8192-token prompt 13-40% slower)."""
    cost, sched = setup(engine)
    one = [closed_loop(StepParams(burst=b), cost, sched, np.array([8192.0]), np.array([256.0]), np.array([1.0]))
           for b in (0.0, 1.0)]
    assert one[1].ttft[0] == pytest.approx(one[0].ttft[0], rel=1e-9)
    two = [closed_loop(StepParams(burst=b), cost, sched, np.array([8192.0]), np.array([256.0]), np.array([2.0]))
           for b in (0.0, 1.0)]
    assert two[1].ttft[0] > two[0].ttft[0]  # a second client brings the wave back


def test_a_prefill_bound_mixed_loop_queues_in_ttft_not_in_tpot() -> None:
    """vLLM gives every running decode a token in every step and no step more than its token
    budget: TPOT never exceeds one full mixed step. Past the prompt rate the budget admits, the
    clients wait for their prefill (TTFT), as the discrete-event replay of the same loop shows
    (the stretch T_dec / (1 - u) once put a 7x TPOT there)."""
    from inferasim.sim.des import simulate_closed_loop

    model, g, lay = get_model(MODEL), get_gpu("H100"), Layout(tp=8)
    cost = layout_cost(model, g, lay, "fp8", "fp8")
    sched = engine_sched("vllm", model, g, lay, "fp8", "", "fp8")
    p = StepParams()
    conc = np.array([16.0, 64.0, 256.0, 512.0])
    r = closed_loop(p, cost, sched, np.full(4, 8192.0), np.full(4, 128.0), conc)
    full = float(sched.max_batched_tokens)
    n = min(full * 127.0 / (8192.0 + 127.0), 512.0)
    assert np.all(r.tpot <= step_time(p, cost, n, 8192.0 + 64.0, full - n, 4096.0) * (1 + 1e-9))
    assert np.all(np.diff(r.ttft) > 0) and np.all(np.diff(r.tpot) >= -1e-12)
    # Flat past saturation; 512 clients run more requests than fit at full length, and the
    # preemptions' recompute costs a little (0.01% here).
    assert np.all(np.diff(r.throughput) >= -1e-3 * r.throughput[:-1])
    des = simulate_closed_loop(p, cost, sched, 8192, 128, 512, num_requests=2048)
    assert r.tpot[3] == pytest.approx(des.tpot_mean, rel=0.25)
    assert r.ttft[3] == pytest.approx(des.ttft_mean, rel=0.25)
    assert r.throughput[3] == pytest.approx(des.throughput, rel=0.15)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_poisson_arrivals_at_a_trickle_see_an_idle_replica(engine: str) -> None:
    """At one request every 1000 s a request has the replica to itself: the TTFT and TPOT of a lone
    client, not those of one client looping back to back (whose own prefill once stretched its
    TPOT 1.7x); and more load never makes a request faster."""
    cost, sched = setup(engine)
    lone = closed_loop(StepParams(), cost, sched, np.array([16384.0]), np.array([128.0]), np.array([1.0]))
    rates = np.array([1e-3, 1e-2, 1e-1, 0.3])
    r = open_loop(StepParams(), cost, sched, np.full(4, 16384.0), np.full(4, 128.0), rates)
    assert r.tpot[0] == pytest.approx(float(step_time(StepParams(), cost, 1.0, 16384.0 + 64.0)), rel=0.01)
    assert r.ttft[0] == pytest.approx(lone.ttft[0], rel=0.02)
    assert np.all(np.diff(r.ttft) >= 0) and np.all(np.diff(r.tpot) >= 0)


def test_poisson_arrivals_wait_for_a_slot_when_the_kv_pool_holds_few_requests() -> None:
    """A pool of two long requests at 70% of capacity: arrivals that find both slots busy wait (an
    M/D/2 queue), which the running count alone does not show."""
    from inferasim.model.steady import erlang_c, slot_wait

    assert erlang_c(np.array([1.0]), np.array([0.5]))[0] == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(np.array([2.0]), np.array([1.0]))[0] == pytest.approx(1.0 / 3.0)
    assert slot_wait(np.array([500.0]), np.array([250.0]), np.array([10.0]))[0] < 1e-9
    model, g, lay = get_model(MODEL), get_gpu("H100"), Layout(tp=1)
    cost = layout_cost(model, g, lay, "fp8", "fp8")
    sched = engine_sched("vllm", model, g, lay, "fp8", "", "fp8")
    cap = open_loop(StepParams(), cost, sched, np.array([16384.0]), np.array([128.0]), np.array([1e-3])).capacity[0]
    r = open_loop(StepParams(), cost, sched, np.full(2, 16384.0), np.full(2, 128.0), np.array([0.1, 0.7]) * cap)
    assert r.stable.all() and r.ttft[1] > 1.5 * r.ttft[0]


def test_engine_version_reads_its_leading_release() -> None:
    """vLLM before 0.7 schedules prefill apart (V0); the release is read with or without a "v"."""
    from inferasim.catalog.engines import release_of, vllm_v0

    assert release_of("v0.6.1") == release_of("0.6.1") == (0, 6, 1)
    assert release_of("0.9.2+rocm700") == (0, 9) and release_of("nightly-5b8c30d") == ()
    # V1 by default from 0.8 upstream, from 0.9.1 in ROCm builds; an unnumbered build is current.
    assert vllm_v0("0.7.3", "nvidia") and not vllm_v0("0.8.0", "nvidia")
    assert vllm_v0("0.9.0.1", "amd") and not vllm_v0("0.9.1", "amd") and not vllm_v0("", "amd")
