"""A benchmark client that keeps at most K requests in flight (StepParams.client_cap): the
closed loop, the discrete-event replay and the anchor fit all see the same cap."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model import fit
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.model.steptime import StepParams, default_params
from inferasim.sim.des import simulate_closed_loop

MODEL = get_model("meta-llama/Meta-Llama-3.1-8B")
GPU = get_gpu("H100")


def _loop(p: StepParams, conc: list[float], engine: str = "vllm", isl: float = 1024.0, osl: float = 512.0):
    cost = layout_cost(MODEL, GPU, Layout())
    sched = engine_sched(engine, MODEL, GPU, Layout())
    n = len(conc)
    return cost, sched, closed_loop(p, cost, sched, np.full(n, isl), np.full(n, osl), np.array(conc, dtype=float))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_cap_holds_the_running_set_and_the_rest_wait_by_littles_law(engine: str) -> None:
    p = replace(default_params(GPU, engine), client_cap=50.0)
    _, _, r = _loop(p, [50.0, 200.0], engine)
    assert r.running.tolist() == [50.0, 200.0 / 4.0]
    assert not r.kv_limited.any()  # the client holds them back, not the KV pool
    # The same 50 requests run, so steps, TPOT and throughput are those of 50 clients ...
    assert r.tpot[1] == pytest.approx(r.tpot[0], rel=1e-9)
    assert r.throughput[1] == pytest.approx(r.throughput[0], rel=1e-9)
    # ... and the other 150 clients wait a cycle of the running set for each 50 ahead of them:
    # C = X x (TTFT + (osl - 1) TPOT) holds for the clients.
    cycle = r.ttft[0] + 511.0 * r.tpot[0]
    assert r.ttft[1] == pytest.approx(r.ttft[0] + 3.0 * cycle, rel=1e-9)
    assert 200.0 / (r.ttft[1] + 511.0 * r.tpot[1]) * 512.0 == pytest.approx(r.throughput[1], rel=1e-9)
    # No cap (0) and a cap above the clients change nothing.
    _, _, free = _loop(replace(p, client_cap=0.0), [50.0, 200.0], engine)
    _, _, high = _loop(replace(p, client_cap=1000.0), [50.0, 200.0], engine)
    assert free.ttft[0] == r.ttft[0] and np.allclose(free.ttft, high.ttft) and free.ttft[1] < r.ttft[1]


def test_the_replay_sends_no_more_than_the_cap_and_agrees_with_the_closed_form() -> None:
    p = replace(StepParams(burst=0.0), client_cap=16.0)
    cost, sched, a = _loop(p, [64.0])
    res = simulate_closed_loop(p, cost, sched, 1024, 512, 64, range_ratio=0.5)
    free = simulate_closed_loop(replace(p, client_cap=0.0), cost, sched, 1024, 512, 64, range_ratio=0.5)
    # At most 16 requests past their first token at any time (the engine never saw more).
    events = sorted([(r.first_token, 1) for r in res.requests] + [(r.finish, -1) for r in res.requests])
    assert max(np.cumsum([e[1] for e in events])) <= 16
    assert res.throughput == pytest.approx(a.throughput[0], rel=0.15)
    assert res.means(first_rid=64)["ttft"] == pytest.approx(a.ttft[0], rel=0.35)
    assert res.throughput < free.throughput and res.ttft_mean > 2.0 * free.ttft_mean


def _points(p: StepParams, conc: list[float]) -> tuple[object, object, list[fit.FitPoint]]:
    cost, sched, r = _loop(p, conc)
    pts = [fit.FitPoint(isl=1024, osl=512, concurrency=int(c), ttft=float(t), tpot=float(o))
           for c, t, o in zip(conc, r.ttft, r.tpot, strict=True)]
    return cost, sched, pts


def test_an_anchor_that_shows_a_cap_is_fitted_with_it_and_one_that_does_not_is_not() -> None:
    truth = replace(default_params(GPU, "vllm"), client_cap=100.0, t_fixed=6e-3)
    conc = [8.0, 32.0, 128.0, 256.0, 512.0]
    cost, sched, pts = _points(truth, conc)
    plain = fit.fit_params(cost, sched, pts, default_params(GPU, "vllm"))
    capped = fit.fit_anchor_params(cost, sched, pts, default_params(GPU, "vllm"))
    assert capped.params.client_cap == pytest.approx(100.0, rel=0.1)
    assert capped.rms_log_error < plain.rms_log_error / 3.0
    assert "client cap" in capped.message
    # The same deployment without a client limit: nothing to find, no cap; the fit is the plain one
    # (or, from the second start of the weight tile, one that explains the points at least as well).
    cost, sched, pts = _points(replace(truth, client_cap=0.0), conc)
    again = fit.fit_anchor_params(cost, sched, pts, default_params(GPU, "vllm"))
    plain = fit.fit_params(cost, sched, pts, default_params(GPU, "vllm"))
    assert again.params.client_cap == 0.0 and "client cap" not in again.message
    assert again.objective <= plain.objective


def test_in_flight_is_littles_law_and_needs_both_metrics() -> None:
    pt = fit.FitPoint(isl=1024, osl=101, concurrency=10, ttft=1.0, tpot=0.01)
    assert fit.in_flight(pt) == pytest.approx(10 * 1.0 / 2.0)
    assert fit.in_flight(replace(pt, tpot=None)) is None
    assert fit.in_flight(replace(pt, scenario="offline")) is None


def test_live_traffic_is_not_held_to_the_anchors_client() -> None:
    """The cap belongs to the harness that measured the anchor: Poisson arrivals (open_loop) and the
    search's estimates see the engine's own limits."""
    from inferasim.model.steady import open_loop

    cost = layout_cost(MODEL, GPU, Layout())
    sched = engine_sched("vllm", MODEL, GPU, Layout())
    p = default_params(GPU, "vllm")
    a = open_loop(p, cost, sched, np.array([1024.0]), np.array([512.0]), np.array([5.0]))
    b = open_loop(replace(p, client_cap=8.0), cost, sched, np.array([1024.0]), np.array([512.0]), np.array([5.0]))
    assert b.capacity[0] == a.capacity[0] > 0 and b.ttft[0] == a.ttft[0]


def test_without_harness_drops_what_the_anchors_benchmark_added_and_keeps_the_engine() -> None:
    p = replace(default_params(GPU, "sglang"), client_cap=99.0, burst=0.8)
    q = p.without_harness()
    assert q.client_cap == 0.0 and q.burst == 0.0
    assert replace(q, client_cap=99.0, burst=0.8) == p
