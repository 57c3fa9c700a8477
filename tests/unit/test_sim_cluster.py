"""Replicas behind routers and disaggregated prefill/decode pools."""

from __future__ import annotations

import pytest
from test_sim_helpers import conversations, fitted, write_jsonl

from inferasim.core.layout import Layout
from inferasim.core.spec import StaticWorkload
from inferasim.model.transfer import kv_transfer_time
from inferasim.sim.api import simulate_workload
from inferasim.sim.workload import Driver, load_trace, poisson_requests

SESSIONS = StaticWorkload(kind="multi-turn", sessionsPerSecond=2.0, turns=4, inputTokens=1500, outputTokens=100,
                          userTokensPerTurn=100, thinkTimeS=1.0, numRequests=160)


def test_prefix_router_keeps_sessions_on_their_cache() -> None:
    f = fitted("vllm")
    rr = simulate_workload(f, Layout(tp=1), SESSIONS, replicas=3, router="rr")
    pre = simulate_workload(f, Layout(tp=1), SESSIONS, replicas=3, router="prefix")
    assert len(rr.completed) == len(pre.completed) == 160
    assert pre.prefix_hit_rate > rr.prefix_hit_rate + 0.2
    by_session: dict[int, set[int]] = {}
    for r in pre.requests:
        by_session.setdefault(r.session, set()).add(r.replica)
    assert sum(len(v) == 1 for v in by_session.values()) >= 0.8 * len(by_session)
    assert pre.gpus == 3 and pre.replicas == 3


def test_least_router_balances_and_round_robin_alternates() -> None:
    f = fitted("sglang")
    reqs = poisson_requests(8.0, 300, 1000, 100, seed=1)
    rep = simulate_workload(f, Layout(tp=1), Driver(reqs), replicas=2, router="rr")
    assert [r.replica for r in rep.requests[:6]] == [0, 1, 0, 1, 0, 1]
    least = simulate_workload(f, Layout(tp=1), Driver(poisson_requests(8.0, 300, 1000, 100, seed=1)), replicas=2,
                              router="least")
    counts = [sum(r.replica == i for r in least.requests) for i in (0, 1)]
    assert abs(counts[0] - counts[1]) < 60
    one = simulate_workload(f, Layout(tp=1), Driver(poisson_requests(4.0, 150, 1000, 100, seed=1)))
    # Two replicas at twice the rate behave like one at the rate.
    assert least.tpot["mean"] == pytest.approx(one.tpot["mean"], rel=0.15)


def test_disaggregated_pools_add_the_kv_transfer(tmp_path) -> None:  # noqa: ANN001
    f = fitted("vllm")
    reqs = poisson_requests(2.0, 120, 3000, 120, seed=2)
    colo = simulate_workload(f, Layout(tp=1), Driver(reqs), replicas=2, router="least")
    pd = simulate_workload(f, Layout(tp=1), Driver(poisson_requests(2.0, 120, 3000, 120, seed=2)), disagg=(1, 1))
    assert len(pd.completed) == 120 and pd.gpus == 2 and pd.replicas == 2
    xfer = kv_transfer_time(f.model, f.gpu, 3000, 2.0, same_domain=True)
    assert min(r.ttft for r in pd.requests) > xfer
    # Decode steps carry no prefill chunks: no request sees a prefill-sized gap.
    assert pd.max_itl["p90"] < 0.5 * colo.max_itl["p90"]
    for r in pd.requests:
        assert r.generated == r.output and r.first_token < r.finish
    with pytest.raises(ValueError, match="disagg"):
        simulate_workload(f, Layout(tp=1), Driver([]), disagg="1-2")


def test_disaggregated_sessions_and_prefix_hits_on_the_prefill_pool(tmp_path) -> None:  # noqa: ANN001
    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=8, turns=4, seed=3))
    f = fitted("sglang")
    rep = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)), disagg="2:1", router="prefix")
    assert len(rep.completed) == len(rep.requests) and rep.prefix_hit_rate > 0
    sess = simulate_workload(f, Layout(tp=1), SESSIONS, disagg=(1, 2))
    assert len(sess.completed) == 160 and sess.prefix_hit_rate > 0


def test_bad_arguments_name_the_field() -> None:
    f = fitted("vllm")
    w = StaticWorkload(kind="poisson", requestRate=1.0, numRequests=5)
    for kw, field in ((dict(replicas=0), "replicas"), (dict(router="random"), "router"),
                      (dict(schedule_policy="lpm"), "lpm"), (dict(max_num_seqs=0), "max_num_seqs"),
                      (dict(host_kv_bytes=-1.0), "host_kv_bytes")):
        with pytest.raises(ValueError, match=field):
            simulate_workload(f, Layout(tp=1), w, **kw)


def test_disaggregated_pools_under_a_burst_make_progress(shared_data) -> None:  # noqa: ANN001
    """A decode worker waiting for a KV transfer while the prefill worker is busy must not stall
    the lockstep of the replicas (a trace burst: many requests at once)."""
    from inferasim.core.spec import TraceWorkload

    path = str(shared_data / "traces" / "conversation_trace.jsonl")
    rep = simulate_workload(fitted("vllm"), Layout(tp=1), TraceWorkload(path=path, sample=150), disagg=(1, 1))
    assert len(rep.completed) + len(rep.dropped) == 150 and len(rep.completed) > 100


def test_a_session_that_outgrows_the_context_ends_at_its_refused_turn() -> None:
    """Llama-3-8B holds 8192 tokens: the sixth turn (8000-token prompt + 200) is refused, and the
    client does not send the even longer seventh and eighth."""
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.model.predictor import unanchored

    f = unanchored("vllm", get_model("meta-llama/Meta-Llama-3-8B"), get_gpu("H100"), "bf16", Layout(tp=1))
    w = StaticWorkload(kind="multi-turn", sessionsPerSecond=0.5, turns=8, inputTokens=2000, outputTokens=200,
                       userTokensPerTurn=1000, numRequests=80)
    rep = simulate_workload(f, Layout(tp=1), w)
    by_session: dict[int, list] = {}
    for r in rep.requests:
        by_session.setdefault(r.session, []).append(r)
    assert len(by_session) == 10
    for turns in by_session.values():
        assert [r.prompt for r in turns] == [2000, 3200, 4400, 5600, 6800, 8000]
        assert [bool(r.dropped) for r in turns] == [False] * 5 + [True]
        assert "context length" in (turns[-1].dropped or "")
    text = rep.table()  # the table says why requests were dropped, and that no SLO was asked for
    assert "60 / 50 / 10 (10 context length)" in text and "no SLO given" in text
