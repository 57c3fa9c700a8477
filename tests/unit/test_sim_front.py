"""The serial front end (`StepParams.t_front`) in the simulators and the emulator: one FIFO server
per replica, t_front per request, between the client and the engine's waiting queue.

Exact checks: a burst of C requests sent at t = 0 through the front end is the same run, step for
step, as the same requests sent at t_front, 2 t_front, ... to an engine without one; so each
request's TTFT is the staggered run's plus k x t_front, and the burst's mean TTFT exceeds the
staggered run's by (C + 1)/2 x t_front to float precision.

Against the burst without a front end, the extra mean TTFT is (C + 1)/2 x t_front plus what the
engine does differently with requests arriving one by one: E_f - E_0, where E_0 is the burst's
mean TTFT without a front end (its prompts prefilled together) and E_f the engine-side time of a
request arriving alone (t_front is above every step time here, so it meets at most one step of
the earlier ones), 0 < E_f < E_0. So |extra - (C + 1)/2 x t_front| < E_0 is the tolerance, with
t_ttft = 0 to keep E_0 small (a few tens of ms against hundreds of ms)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_sim_helpers import GPU, MODEL, fitted, write_jsonl

from inferasim.core.layout import Layout
from inferasim.emulator.engine import EngineLoop
from inferasim.emulator.metrics import EngineMetrics
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.model.steptime import StepParams
from inferasim.sim.api import simulate_workload
from inferasim.sim.des import Simulator, simulate_closed_loop, simulate_offline
from inferasim.sim.replica import Replica
from inferasim.sim.request import SimRequest
from inferasim.sim.request import SimRequest as Request
from inferasim.sim.workload import ClosedLoop, Driver, load_trace, poisson_requests

ENGINES = ("vllm", "sglang")
TF = 0.02  # s: the middle of what the shipped SGLang anchors fit (12-24 ms)


def _setup(engine: str, dp: int = 1):  # noqa: ANN202
    lay = Layout(tp=1, dp=dp)
    return layout_cost(MODEL, GPU, lay), engine_sched(engine, MODEL, GPU, lay)


def _with_front(f, t_front: float):  # noqa: ANN001, ANN202
    """`f` with a per-request front end of `t_front` and no per-token part (exact checks below)."""
    params = dataclasses.replace(f.params, t_front=t_front, t_front_token=0.0)
    return dataclasses.replace(f, fit=dataclasses.replace(f.fit, params=params))


# -- closed-loop DES ------------------------------------------------------------------------------

def _staggered(p: StepParams, c, s, conc: int, isl: int, osl: int, t_front: float) -> list[Request]:  # noqa: ANN001
    """The burst's reference: request k sent at k x t_front to an engine without a front end."""
    sim = Simulator(p, c, s, delivery_delay=p.t_ttft)
    dp = len(sim.ranks)
    reqs, t = [], 0.0
    for i in range(conc):
        t += t_front
        reqs.append(Request(rid=i, arrival=t, prompt=isl, output=osl, rank=i % dp))
        sim.submit(reqs[-1], t)
    sim.run(lambda req: None)
    return reqs


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dp", [1, 2])
def test_des_burst_waits_its_turn_at_the_front_end(engine: str, dp: int) -> None:
    """C clients send at t = 0: the k-th reaches the engine k x t_front later (one server per
    replica, whatever its dp ranks), so the wave's mean TTFT grows by (C + 1)/2 x t_front."""
    c, s = _setup(engine, dp)
    conc, isl, osl = 32, 64, 4
    p0 = StepParams(t_ttft=0.0)
    burst = simulate_closed_loop(p0, c, s, isl, osl, conc, num_requests=conc)
    front = simulate_closed_loop(dataclasses.replace(p0, t_front=TF), c, s, isl, osl, conc, num_requests=conc)
    ref = _staggered(p0, c, s, conc, isl, osl, TF)
    np.testing.assert_allclose([r.first_token for r in front.requests], [r.first_token for r in ref], rtol=1e-12)
    np.testing.assert_allclose([r.finish for r in front.requests], [r.finish for r in ref], rtol=1e-12)
    ref_ttft = np.mean([r.ttft for r in ref])
    assert front.ttft_mean - ref_ttft == pytest.approx((conc + 1) / 2 * TF, rel=1e-9)
    extra = front.ttft_mean - burst.ttft_mean
    assert abs(extra - (conc + 1) / 2 * TF) < burst.ttft_mean < 0.25 * (conc + 1) / 2 * TF


@pytest.mark.parametrize("engine", ENGINES)
def test_des_lone_request_pays_t_front_once(engine: str) -> None:
    """One client: no queue at the front end; every request pays exactly t_front more, and the
    engine runs the same steps, shifted."""
    c, s = _setup(engine)
    base = simulate_closed_loop(StepParams(), c, s, 512, 64, 1, num_requests=5)
    front = simulate_closed_loop(StepParams(t_front=TF), c, s, 512, 64, 1, num_requests=5)
    assert front.steps == base.steps
    for a, b in zip(front.requests, base.requests, strict=True):
        assert a.ttft - b.ttft == pytest.approx(TF, abs=1e-9)
        assert a.finish - a.first_token == pytest.approx(b.finish - b.first_token, rel=1e-9)


def test_des_front_end_serves_in_order_of_sending_not_of_submission() -> None:
    """A request sent earlier but submitted later (a client's think time) is served first."""
    c, s = _setup("vllm")
    sim = Simulator(StepParams(t_front=0.05, t_ttft=0.0), c, s)
    late = Request(rid=0, arrival=0.01, prompt=64, output=2)
    early = Request(rid=1, arrival=0.0, prompt=64, output=2)
    sim.submit(late, late.arrival)
    sim.submit(early, early.arrival)
    sim.run(lambda req: None)
    assert early.first_token < late.first_token
    # early: through the front end at 0.05; late: behind it, at 0.10 (then one short prefill step each)
    assert 0.05 < early.first_token < 0.06 and 0.10 < late.first_token < 0.11


@pytest.mark.parametrize("engine", ENGINES)
def test_des_invariants_with_front_end_and_think_time(engine: str) -> None:
    c, s = _setup(engine)
    res = simulate_closed_loop(StepParams(t_front=TF), c, s, 512, 128, 16, num_requests=120,
                               range_ratio=0.3, think_time=0.05, seed=4)
    assert len(res.requests) == 120
    for r in res.requests:
        assert r.first_token is not None and r.finish is not None and r.generated == r.output
        assert r.ttft > TF
    assert res.kv_peak_tokens <= res.kv_capacity_tokens


@pytest.mark.parametrize("engine", ENGINES)
def test_offline_batch_passes_the_front_end(engine: str) -> None:
    """`benchmark.offline_batch` prices the front end for the offline batch too: (B + 1)/2 x t_front."""
    c, s = _setup(engine)
    batch = 16
    base = simulate_offline(StepParams(), c, s, 64, 4, batch)
    front = simulate_offline(StepParams(t_front=TF), c, s, 64, 4, batch)
    assert abs(front.ttft_mean - base.ttft_mean - (batch + 1) / 2 * TF) < base.ttft_mean
    assert front.ttft_mean - base.ttft_mean > 0.8 * (batch + 1) / 2 * TF


def test_fast_replica_makes_the_reference_decisions_with_front_end() -> None:
    """The trace simulator's replica and the closed-loop DES agree step for step with t_front
    (think times submit requests out of their sending order)."""
    from test_sim_engines import _closed_new

    c, s = _setup("sglang", dp=2)
    p = StepParams(t_front=0.01)
    old = simulate_closed_loop(p, c, s, 1024, 256, 24, num_requests=100, seed=5, range_ratio=0.5, think_time=0.02)
    new, rep = _closed_new(p, c, s, 1024, 256, 24, 100, 5, 0.5, 0.02)
    assert rep.steps == old.steps
    np.testing.assert_allclose([r.first_token for r in new], [r.first_token for r in old.requests], rtol=1e-12)
    np.testing.assert_allclose([r.finish for r in new], [r.finish for r in old.requests], rtol=1e-12)


# -- trace simulator ------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_trace_burst_ttft_rises_with_t_front(engine: str, tmp_path) -> None:  # noqa: ANN001
    """`inferasim simulate` on a trace burst of C simultaneous requests: mean TTFT rises with
    t_front, by (C + 1)/2 x t_front against the same requests sent t_front apart."""
    conc = 24
    trace = write_jsonl(tmp_path / "burst.jsonl",
                        [{"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [i]}
                         for i in range(conc)])
    f = fitted(engine)
    ttft = {tf: simulate_workload(_with_front(f, tf), Layout(tp=1), Driver(load_trace(trace))).ttft["mean"] / 1e3
            for tf in (0.0, 0.005, 0.01, TF)}
    assert ttft[0.0] < ttft[0.005] < ttft[0.01] < ttft[TF]
    assert abs(ttft[TF] - ttft[0.0] - (conc + 1) / 2 * TF) < ttft[0.0] - f.params.t_ttft
    times = np.cumsum(np.full(conc, TF))
    stag = simulate_workload(_with_front(f, 0.0), Layout(tp=1),
                             Driver([SimRequest(i, float(times[i]), 64, 4) for i in range(conc)]))
    assert ttft[TF] - stag.ttft["mean"] / 1e3 == pytest.approx((conc + 1) / 2 * TF, rel=1e-9)


def test_trace_disaggregated_request_pays_the_front_end_once() -> None:
    """A disaggregated request passes the prefill worker's front end; its decode phase, which
    arrives with its KV, does not queue at another one."""
    f = fitted("vllm")
    for disagg in (None, (1, 1)):
        ttft = [simulate_workload(_with_front(f, tf), Layout(tp=1), Driver(poisson_requests(0.2, 3, 1000, 16, seed=1)),
                                  disagg=disagg).requests for tf in (0.0, TF)]
        for a, b in zip(ttft[1], ttft[0], strict=True):
            assert a.ttft - b.ttft == pytest.approx(TF, abs=1e-9)


def test_trace_littles_law_counts_the_front_end_queue() -> None:
    """Requests queued at (or passing) the front end are in the system: the sampled running +
    waiting still equals the arrival rate times the time in the system, with a front end busy
    most of the time."""
    rate, tf = 6.0, 0.12  # front-end utilisation 0.72: about 1.6 requests there on average
    f = _with_front(fitted("vllm"), tf)
    rep = simulate_workload(f, Layout(tp=1), Driver(poisson_requests(rate, 3000, 1500, 200, seed=11)), sample_dt=0.25)
    done = rep.completed
    assert len(done) == 3000
    t_end = max(r.arrival for r in done)
    t = np.array(rep.series["t_s"])
    inside = (t > 20.0) & (t < t_end - 20.0)
    L = (np.array(rep.series["running"]) + np.array(rep.series["waiting"]))[inside].mean()
    W = np.mean([r.finish - f.params.t_ttft - r.arrival for r in done])
    assert L == pytest.approx(len(done) / t_end * W, rel=0.05)


def test_closed_loop_driver_through_replica_front_end() -> None:
    f = _with_front(fitted("sglang"), TF)
    rep = simulate_workload(f, Layout(tp=1), ClosedLoop(8, 40, 256, 32, think_time=0.1, seed=2))
    assert len(rep.completed) == 40
    assert min(r.ttft for r in rep.completed) > TF


def test_replica_front_end_off_leaves_no_state() -> None:
    c, s = _setup("vllm")
    rep = Replica(StepParams(), c, s)
    assert not rep.front.on and rep.front.t_front == 0.0 and not rep.front.queue


# -- emulator -------------------------------------------------------------------------------------

class _FrozenClock:
    speedup = 1.0

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def test_emulator_burst_reaches_the_engine_t_front_apart() -> None:
    c, s = _setup("sglang")
    p = StepParams(t_ttft=0.03, t_front=TF)
    metrics = EngineMetrics("sglang", "m", 1, 4096, s.block_size, s.kv_tokens)
    clock = _FrozenClock(5.0)
    loop = EngineLoop(p, c, s, metrics, clock)  # type: ignore[arg-type]
    reqs = [loop.submit(64, 4, 4, "length", lambda r: True) for _ in range(8)]
    enq = np.array([r.enq_v for r in reqs])
    np.testing.assert_allclose(enq, 5.0 + 0.03 + TF * np.arange(1, 9), rtol=1e-12)
    assert all(r.sim.arrival == r.enq_v for r in reqs)
    # Once the front end is idle again, a request waits t_front only.
    clock.t = 10.0
    assert loop.submit(64, 4, 4, "length", lambda r: True).enq_v == pytest.approx(10.03 + TF, rel=1e-12)
    # t_front = 0: the stamp is arrival + t_ttft, as before.
    loop.set_params(StepParams(t_ttft=0.03))
    assert loop.submit(64, 4, 4, "length", lambda r: True).enq_v == 10.0 + 0.03


@pytest.mark.parametrize("engine", ENGINES)
def test_des_front_end_per_token_part_follows_each_prompt(engine: str) -> None:
    """`t_front_token`: a request holds the front end t_front + t_front_token x its prompt, so a
    burst of different prompts reaches the engine at the running sum of those times, the same run
    as sending each then to an engine without a front end."""
    c, s = _setup(engine)
    prompts = [64, 512, 128, 1024, 256, 64, 2048, 32]
    per_token = 2e-5  # s per token: 1.3 ms for a 64-token prompt, 41 ms for 2048
    p0 = StepParams(t_ttft=0.0)
    sim = Simulator(dataclasses.replace(p0, t_front=TF / 4, t_front_token=per_token), c, s, delivery_delay=0.0)
    burst = [Request(rid=i, arrival=0.0, prompt=n, output=4) for i, n in enumerate(prompts)]
    for req in burst:
        sim.submit(req, 0.0)
    sim.run(lambda req: None)
    ref_sim = Simulator(p0, c, s, delivery_delay=0.0)
    sent = np.cumsum([TF / 4 + per_token * n for n in prompts])
    ref = [Request(rid=i, arrival=float(t), prompt=n, output=4)
           for i, (n, t) in enumerate(zip(prompts, sent, strict=True))]
    for req in ref:
        ref_sim.submit(req, req.arrival)
    ref_sim.run(lambda req: None)
    np.testing.assert_allclose([r.first_token for r in burst], [r.first_token for r in ref], rtol=1e-12)


def test_trace_front_end_per_token_part_follows_each_prompt() -> None:
    """The trace simulator's front end holds each request t_front + t_front_token x its prompt: a
    burst of different prompts runs as the same requests sent at the running sum of those times
    to a replica without a front end."""
    f = fitted("vllm")
    prompts = [64, 512, 128, 1024, 256, 64, 2048, 32]
    per_token = 2e-5
    params = dataclasses.replace(f.params, t_front=TF / 4, t_front_token=per_token)
    with_front = dataclasses.replace(f, fit=dataclasses.replace(f.fit, params=params))
    burst = simulate_workload(with_front, Layout(tp=1),
                              Driver([SimRequest(i, 0.0, n, 4) for i, n in enumerate(prompts)])).requests
    sent = np.cumsum([TF / 4 + per_token * n for n in prompts])
    ref = simulate_workload(_with_front(f, 0.0), Layout(tp=1),
                            Driver([SimRequest(i, float(t), n, 4) for i, (n, t) in enumerate(zip(prompts, sent,
                                                                                                  strict=True))])).requests
    np.testing.assert_allclose([r.ttft + 0.0 for r in burst],
                               [r.ttft + t for r, t in zip(ref, sent, strict=True)], rtol=1e-9)


def test_closed_loop_estimator_charges_the_front_end_per_prompt_token() -> None:
    """One client (no queue at the front end to speak of): TTFT rises by t_front_token x prompt."""
    c, s = _setup("vllm")
    for isl in (1024, 8192):
        base, tok = (closed_loop(StepParams(t_front_token=t), c, s, np.array([float(isl)]), np.array([256.0]),
                                 np.array([1.0])).ttft[0] for t in (0.0, 2e-5))
        assert tok - base == pytest.approx(2e-5 * isl, rel=0.05)


def _drive(loop: EngineLoop, clock: _FrozenClock, until_done: list) -> None:  # noqa: ANN001
    """Run the emulator's loop with perfect wakes: always at the time it asks for."""
    for _ in range(100000):
        wake = loop._advance(clock.t)
        if all(r.finished for r in until_done):
            return
        assert wake is not None
        clock.t = max(clock.t, wake)
    raise AssertionError("the emulated engine did not finish")


def test_emulator_hands_out_sglang_first_tokens_late_as_the_simulator_does() -> None:
    """SGLang's overlap scheduler releases a prefill batch's first tokens only after launching the
    next batch: in a wave of consecutive prefill batches they leave part-way into the next one.
    The emulator must stamp and deliver them then, at the same times as the DES, and not sooner."""
    from inferasim.sim import engines as sched_mod

    c, s = _setup("sglang")
    p = StepParams(t_ttft=0.0)
    n, prompt, output = 24, 1024, 8
    metrics = EngineMetrics("sglang", "m", 1, 4096, s.block_size, s.kv_tokens)
    clock = _FrozenClock(0.0)
    loop = EngineLoop(p, c, s, metrics, clock)  # type: ignore[arg-type]
    seen: dict[int, float] = {}

    def sink(req) -> bool:  # noqa: ANN001
        if req.emitted >= 1 and req.serial not in seen:
            seen[req.serial] = clock.t
        return True

    reqs = [loop.submit(prompt, output, output, "length", sink) for _ in range(n)]
    _drive(loop, clock, reqs)

    def des(delay: float) -> list[float]:
        old = sched_mod.SGLANG_CONSECUTIVE_PREFILL_DELAY
        sched_mod.SGLANG_CONSECUTIVE_PREFILL_DELAY = delay
        try:
            sim = Simulator(p, c, s, delivery_delay=0.0)
            burst = [Request(rid=i, arrival=0.0, prompt=prompt, output=output) for i in range(n)]
            for req in burst:
                sim.submit(req, 0.0)
            sim.run(lambda req: None)
            return [float(r.first_token) for r in burst]
        finally:
            sched_mod.SGLANG_CONSECUTIVE_PREFILL_DELAY = old

    late, on_time = des(sched_mod.SGLANG_CONSECUTIVE_PREFILL_DELAY), des(0.0)
    assert sum(a > b + 1e-9 for a, b in zip(late, on_time, strict=True)) >= n // 2  # the wave has late tokens
    stamped = [r.first_tok_v for r in reqs]
    np.testing.assert_allclose(sorted(stamped), sorted(late), rtol=1e-9)
    # delivered when stamped: not at the end of their own batch, not a step later
    for r in reqs:
        assert seen[r.serial] == pytest.approx(r.first_tok_v, abs=1e-9)


def _deliveries(engine: str, dp: int = 1):  # noqa: ANN202
    """An SGLang emulator on a frozen clock whose sink records (clock, serial, tokens, finished)."""
    c, s = _setup(engine, dp)
    clock = _FrozenClock(0.0)
    loop = EngineLoop(StepParams(t_ttft=0.0), c, s, EngineMetrics(engine, "m", dp, 4096, s.block_size, s.kv_tokens),
                      clock)  # type: ignore[arg-type]
    log: list[tuple[float, int, int, bool]] = []

    def sink(req) -> bool:  # noqa: ANN001
        log.append((clock.t, req.serial, req.emitted, req.finished))
        return True
    return loop, clock, log, sink


def test_emulator_wakes_for_a_late_first_token_without_sending_the_step_in_progress() -> None:
    """A wakes part-way into the prefill batch after its own to hand out its late first token;
    B (one output token) is prefilled in that batch and must reach the client at its end, not at
    A's wake (the old wake flushed everything marked, B's finish included)."""
    loop, clock, log, sink = _deliveries("sglang")
    a = loop.submit(2048, 8, 8, "length", sink)
    wake = loop._advance(clock.t)  # A's prefill batch
    clock.t = wake / 2
    b = loop.submit(2048, 1, 1, "length", sink)  # arrives during it: prefilled right after
    for _ in range(4):
        clock.t = wake
        wake = loop._advance(clock.t)
    first_a = next(t for t, serial, n, _ in log if serial == a.serial and n >= 1)
    assert a.first_tok_v < b.finish_v and first_a == pytest.approx(a.first_tok_v, abs=1e-12)
    b_sent = [t for t, serial, _, _ in log if serial == b.serial]
    assert b_sent and min(b_sent) == pytest.approx(b.finish_v, abs=1e-12)


def test_emulator_sends_an_on_time_first_token_at_its_stamp_not_a_step_later() -> None:
    """dp 2: A's prefill batch on rank 0 is followed by A's decode while rank 1 prefills B. A's
    first token is on time (a decode follows) and leaves when that step is committed, not with
    A's second token at its end."""
    loop, clock, log, sink = _deliveries("sglang", dp=2)
    a = loop.submit(2048, 8, 8, "length", sink)
    wake = loop._advance(clock.t)
    clock.t = wake / 2
    b = loop.submit(2048, 8, 8, "length", sink)
    assert a.rank != b.rank
    for _ in range(50):
        clock.t = wake
        wake = loop._advance(clock.t)
        if a.emitted:
            break
    first_a = next(t for t, serial, n, _ in log if serial == a.serial and n >= 1)
    assert first_a == pytest.approx(a.first_tok_v, abs=1e-12)
    assert next(n for _, serial, n, _ in log if serial == a.serial) == 1  # the first token alone


def test_emulator_keeps_the_first_token_of_a_request_retracted_right_after_its_prefill(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request retracted (KV full) in the step right after its prefill batch has still sampled
    its first token: the emulator stamps it then, as the DES does (the old emulator lost it and
    stamped the token of the request's second prefill instead)."""
    from inferasim.sim.engines import SglangCore

    retracted_held = [0]
    preempt = SglangCore._preempt

    def spy(self, row, to_head: bool = True) -> None:  # noqa: ANN001
        gen = row.gb + self.G if row.in_d else row.gen
        retracted_held[0] += gen == 1 and any(x is row.req for x in self.held_first_tokens)
        preempt(self, row, to_head)
    monkeypatch.setattr(SglangCore, "_preempt", spy)

    rng = np.random.default_rng(0)
    lay = Layout(tp=1)
    c = layout_cost(MODEL, GPU, lay)
    s = dataclasses.replace(engine_sched("sglang", MODEL, GPU, lay), kv_tokens=1500)
    p = StepParams(t_ttft=0.0, t_front=0.0, t_front_token=0.0)
    n = 1500
    arrivals = np.cumsum(rng.exponential(1 / 300.0, n))
    prompts, outs = rng.integers(50, 400, n), rng.integers(2, 10, n)
    clock = _FrozenClock(0.0)
    loop = EngineLoop(p, c, s, EngineMetrics("sglang", "m", 1, 4096, s.block_size, s.kv_tokens), clock)  # type: ignore[arg-type]
    emu: list = []
    wake = loop._advance(clock.t)
    i = 0
    for _ in range(10**6):
        if i == n and all(r.finished for r in emu):
            break
        if i < n and (wake is None or arrivals[i] < wake):
            clock.t = max(clock.t, float(arrivals[i]))
            emu.append(loop.submit(int(prompts[i]), int(outs[i]), int(outs[i]), "length", lambda r: True))
            i += 1
            if wake is None or not loop._busy():
                wake = loop._advance(clock.t)
        else:
            clock.t = max(clock.t, wake)
            wake = loop._advance(clock.t)
    assert retracted_held[0] >= 1  # the case under test happened
    sim = Simulator(p, c, s, delivery_delay=0.0)
    des = [Request(rid=k, arrival=float(arrivals[k]), prompt=int(prompts[k]), output=int(outs[k])) for k in range(n)]
    for r in des:
        sim.submit(r, r.arrival)
    sim.run(lambda r: None)
    np.testing.assert_allclose([r.first_tok_v for r in emu], [r.first_token for r in des], rtol=0, atol=1e-9)


def test_a_client_that_breaks_on_its_late_first_token_is_aborted_not_kept() -> None:
    """The wake for a late first token delivers through the client's sink; a sink that raises
    there aborts its request (as any delivery does), and the engine goes on with the others."""
    c, s = _setup("sglang")
    clock = _FrozenClock(0.0)
    loop = EngineLoop(StepParams(t_ttft=0.0), c, s, EngineMetrics("sglang", "m", 1, 4096, s.block_size, s.kv_tokens),
                      clock)  # type: ignore[arg-type]

    def broken(req) -> bool:  # noqa: ANN001
        if req.emitted:
            raise ConnectionResetError("client gone")
        return True

    a = loop.submit(2048, 8, 8, "length", broken)
    wake = loop._advance(clock.t)
    clock.t = wake / 2
    b = loop.submit(2048, 8, 8, "length", lambda r: True)
    for _ in range(50):  # up to the wake that hands A's late first token out
        clock.t = wake
        wake = loop._advance(clock.t)
        if a.error:
            break
    assert a.error.startswith("delivery failed") and a.aborted  # at that wake, not a step later
    _drive(loop, clock, [b])
    assert b.finished and not b.error


def test_a_long_running_emulator_keeps_no_token_records() -> None:
    """The shared schedulers keep per-step token times for the trace simulator's report; the
    emulator, which may run for days, drops them as it goes (Core.drop_records), and what it
    delivers is unchanged by that."""
    c, s = _setup("vllm")
    clock = _FrozenClock(0.0)
    loop = EngineLoop(StepParams(t_ttft=0.0), c, s, EngineMetrics("vllm", "m", 1, 4096, s.block_size, s.kv_tokens),
                      clock)  # type: ignore[arg-type]
    reqs = []
    for _ in range(12):  # one at a time: about 12 x 800 decode steps
        reqs.append(loop.submit(64, 800, 800, "length", lambda r: True))
        _drive(loop, clock, reqs)
    clock.t += 1.0
    loop._advance(clock.t)  # the last finish is delivered at the next wake
    core = loop.ranks[0]
    assert core.e_off > 0 and len(core.E) <= 4096 + 512 and len(core.finished) <= 4096
    assert [(r.emitted, r.finished) for r in reqs] == [(800, True)] * 12
