"""The engine schedulers (`inferasim.sim.engines`) under the two event loops that run them (the
trace simulator's `Replica`, the closed-loop `des.Simulator`), against themselves stepping one
iteration at a time, and against the policies' defining behaviours."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_sim_helpers import GPU, MODEL, conversations, fitted, write_jsonl

from inferasim.catalog.gpus import get_gpu
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import StepParams, step_time
from inferasim.sim.api import simulate_workload
from inferasim.sim.des import _lengths, simulate_closed_loop
from inferasim.sim.engines import AtomCore, SglangCore, VllmCore
from inferasim.sim.prefix import KVPool
from inferasim.sim.replica import Replica, StepModel
from inferasim.sim.request import SimRequest
from inferasim.sim.workload import Driver, load_trace


def _closed_new(p, c, s, isl, osl, conc, num, seed, rr, think):  # noqa: ANN001, ANN202
    """`simulate_closed_loop` through the trace simulator's event loop (same draws, same ranks)."""
    rng = np.random.default_rng(seed)
    prompts, outputs = _lengths(rng, isl, num, rr), _lengths(rng, osl, num, rr)
    rep = Replica(p, c, s, delivery_delay=p.t_ttft)
    dp = len(rep.ranks)
    reqs: list[SimRequest] = []
    client_of: list[int] = []

    def issue(client: int, t: float) -> None:
        r = SimRequest(len(reqs), t, int(prompts[len(reqs)]), int(outputs[len(reqs)]))
        reqs.append(r)
        client_of.append(client)
        rep._rr = client % dp
        assert rep.submit(r, t)

    for cl in range(min(conc, num)):
        issue(cl, 0.0)

    def on_finish(r: SimRequest) -> None:
        if len(reqs) < num:
            issue(client_of[r.rid], r.finish + (float(rng.exponential(think)) if think > 0 else 0.0))

    rep.run_until(float("inf"), on_finish)
    return reqs, rep


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
@pytest.mark.parametrize("dp,kv", [(1, None), (2, None), (1, 12000)])
def test_both_event_loops_make_the_same_decisions(engine: str, dp: int, kv: int | None) -> None:
    """Without prefix identities the trace simulator's event loop (prefix cache on, step-time
    table) and the closed-loop one drive the engine's scheduler through the same steps
    (preemptions, retractions, dp lockstep included)."""
    lay = Layout(tp=1, dp=dp)
    p, c = StepParams(), layout_cost(MODEL, GPU, lay)
    s = engine_sched(engine, MODEL, GPU, lay)
    if kv:
        s = dataclasses.replace(s, kv_tokens=kv)
    args = (300, 700, 24, 60, 3, 0.5, 0.02) if kv else (1024, 512, 32, 120, 5, 0.5, 0.01)
    isl, osl, conc, num, seed, rr, think = args
    old = simulate_closed_loop(p, c, s, isl, osl, conc, num_requests=num, seed=seed, range_ratio=rr, think_time=think)
    new, rep = _closed_new(p, c, s, isl, osl, conc, num, seed, rr, think)
    assert rep.steps == old.steps and rep.preemptions == old.preemptions
    if kv:
        assert rep.preemptions > 0
    np.testing.assert_allclose([r.finish for r in new], [r.finish for r in old.requests], rtol=1e-12)
    np.testing.assert_allclose([r.first_token for r in new], [r.first_token for r in old.requests], rtol=1e-12)


def test_step_model_is_step_time() -> None:
    for lay in (Layout(tp=1), Layout(tp=2, pp=2)):
        p, c = StepParams(), layout_cost(MODEL, GPU, lay)
        sm = StepModel(p, c, 4096)
        assert sm.exact
        for args in ((5, 300.0, 0, 0.0), (64, 5000.5, 1000, 400.0), (0, 0.0, 20000, 9000.0)):
            assert sm(*args) == pytest.approx(float(step_time(p, c, *args)), rel=1e-12)
        np.testing.assert_allclose(sm.decode_run(7, 100.5, 50),
                                   step_time(p, c, 7, 100.5 + np.arange(50, dtype=float)), rtol=1e-12)


def test_batches_carry_their_longest_prefill_sequence() -> None:
    """A batch gives the longest prefill sequence (cached prefix included), which decides a DSA
    model's dense or sparse prefill, and the token-weighted mean context of its prefill tokens (a
    chunk of L tokens from position s sees s + L/2); no prefill, no length."""
    from inferasim.sim.request import Batch

    b = Batch(2, 100.0, [(None, 300, 1500), (None, 1000, 0)])  # type: ignore[list-item]
    assert (b.n_pref, b.seq_pref) == (1300, 1800.0)
    assert b.ctx_pref == pytest.approx((300 * 1650.0 + 1000 * 500.0) / 1300)
    assert Batch(2, 100.0, []).seq_pref is None


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_step_model_is_step_time_for_sparse_attention(engine: str) -> None:
    """GLM-5 (DeepSeek sparse attention): dense and sparse prefill, top-k-bounded decode reads."""
    from inferasim.catalog.models import get_model

    for lay in (Layout(tp=8), Layout(tp=4, pp=2)):
        p, c = StepParams(), layout_cost(get_model("zai-org/GLM-5"), get_gpu("B200"), lay, "fp8", "fp8", engine)
        sm = StepModel(p, c, 4096)
        assert sm.exact
        for args in ((5, 300.0, 0, 0.0), (64, 9000.5, 1000, 400.0), (0, 0.0, 8192, 4096.0), (3, 5000.0, 900, 1024.0),
                     (3, 5000.0, 300, 1650.0, 1800.0), (0, 0.0, 5000, 600.0, 3000.0)):
            assert sm(*args) == pytest.approx(float(step_time(p, c, *args)), rel=1e-12)
        np.testing.assert_allclose(sm.decode_run(7, 1900.5, 400), step_time(p, c, 7, 1900.5 + np.arange(400.0)),
                                   rtol=1e-12)


@pytest.mark.parametrize(("engine", "layout"), [("vllm", Layout(tp=1)), ("sglang", Layout(tp=1, dp=2)),
                                               ("atom", Layout(tp=2))])
def test_short_decode_runs_stepped_in_python_match_numpy(engine: str, layout: Layout,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica._jump steps short decode runs in Python: bit for bit what the numpy path gives,
    sliding-window layers and several attention-dp ranks included."""
    import inferasim.sim.replica as replica_mod
    from inferasim.catalog.models import get_model
    from inferasim.core.spec import StaticWorkload
    from inferasim.model.predictor import unanchored

    f = unanchored(engine, get_model("openai/gpt-oss-20b"), GPU, "bf16", layout)
    w = StaticWorkload(kind="multi-turn", sessionsPerSecond=3.0, turns=3, inputTokens=1500, outputTokens=150,
                       userTokensPerTurn=100, thinkTimeS=1.0, numRequests=150)
    assert StepModel(f.params, layout_cost(f.model, f.gpu, layout, f.precision, f.kv_dtype)).kv_win
    runs = []
    for short in (replica_mod.SHORT_RUN, 0):
        monkeypatch.setattr(replica_mod, "SHORT_RUN", short)
        runs.append(simulate_workload(f, layout, w, seed=3))
    py, ref = runs
    assert py.steps == ref.steps
    assert [(r.first_token, r.finish, r.max_gap) for r in py.requests] == \
        [(r.first_token, r.finish, r.max_gap) for r in ref.requests]
    assert py.as_dict(series=False)["itl"] == ref.as_dict(series=False)["itl"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_jumping_is_exact_with_prefix_cache_and_pressure(engine: str, tmp_path) -> None:  # noqa: ANN001
    """Decode-run jumps only skip work, also with prefix hits, evictions and preemptions."""
    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=10, turns=5, seed=1))
    f = fitted(engine)
    s = engine_sched(engine, f.model, f.gpu, Layout(tp=1), "bf16")
    small = 60000 / s.kv_tokens  # a tight pool
    f.fit = dataclasses.replace(f.fit, params=dataclasses.replace(f.params, kv_scale=small))
    runs = [simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)), jump=j) for j in (True, False)]
    fast, slow = runs
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.prefix_hit_rate == slow.prefix_hit_rate > 0
    np.testing.assert_allclose([r.finish for r in fast.requests], [r.finish for r in slow.requests], rtol=1e-9)
    np.testing.assert_allclose([r.first_token for r in fast.requests], [r.first_token for r in slow.requests],
                               rtol=1e-9)
    assert fast.itl == pytest.approx(slow.itl, rel=1e-9)


def _sched(engine: str, **kw) -> object:  # noqa: ANN003
    s = engine_sched(engine, MODEL, GPU, Layout(tp=1))
    return dataclasses.replace(s, **kw) if kw else s


def test_atom_runs_prefill_only_batches_and_vllm_mixes() -> None:
    for cls, engine, mixed_expected in ((AtomCore, "atom", False), (VllmCore, "vllm", True)):
        core = cls(_sched(engine), 200_000)
        now, mixed_seen, prefill_only = 0.0, False, False
        for rid in range(6):
            core.enqueue(SimRequest(rid, now, 600, 40))
            for _ in range(3):
                b = core.schedule(now)
                mixed_seen |= b.n_dec > 0 and b.n_pref > 0
                prefill_only |= b.n_dec == 0 and b.n_pref > 0
                now += 0.01
                core.commit(now)
        assert mixed_seen is mixed_expected, engine
        assert prefill_only


def test_atom_allocates_whole_sequences_and_preempts_the_newest() -> None:
    core = AtomCore(_sched("atom", max_num_seqs=8), 16 * 100)  # 100 blocks of 16
    for rid in range(3):
        core.enqueue(SimRequest(rid, 0.0, 500, 400))  # 32 blocks each at admission
    b = core.schedule(0.0)
    assert [row.req.rid for row, _, _ in b.pre] == [0, 1, 2]
    assert core.kv.used == 3 * 32
    core.commit(0.01)
    t = 0.01
    while not core.preemptions:
        b = core.schedule(t)
        assert b.n_pref == 0 or b.n_dec == 0  # never mixed
        t += 0.01
        core.commit(t)
    assert core.waiting[0].rid == 2  # the newest went back to the head of the queue
    assert core.kv.used <= core.kv.total


def test_sglang_lpm_admits_the_longest_cached_prefix_first() -> None:
    s = _sched("sglang", max_batched_tokens=1024)
    core = SglangCore(s, 400_000, policy="lpm")
    ids = tuple(range(1, 9))
    warm = SimRequest(0, 0.0, 4000, 2, ids[:8], 512, 4000)
    core.enqueue(warm)
    t = 0.0
    while core.n_alive or core.waiting:
        core.schedule(t)
        t += 0.01
        core.commit(t)
    # Queue: no reuse first, then 1 shared unit, then 6 shared units.
    a = SimRequest(1, t, 900, 2, (101, 102), 512, 900)
    b = SimRequest(2, t, 900, 2, ids[:1] + (201,), 512, 900)
    c = SimRequest(3, t, 3500, 2, ids[:7], 512, 3500)
    for r in (a, b, c):
        core.enqueue(r)
    batch = core.schedule(t)
    assert batch.pre[0][0].req is c
    assert c.prefix_hit == 3499 and b.prefix_hit in (-1, 512)
    fcfs = SglangCore(s, 400_000, policy="fcfs")
    fcfs.enqueue(SimRequest(9, 0.0, 900, 2))
    fcfs.enqueue(SimRequest(10, 0.0, 900, 2))
    assert fcfs.schedule(0.0).pre[0][0].req.rid == 9


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_kv_never_exceeds_capacity_and_nothing_leaks(engine: str, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=12, turns=5, seed=2))
    seen = {"allocs": 0}
    orig = KVPool.alloc

    def checked(self: KVPool, blocks: int) -> None:
        orig(self, blocks)
        seen["allocs"] += 1
        assert 0 <= self.evictable <= self.used <= self.total
        assert self.in_use <= self.total

    monkeypatch.setattr(KVPool, "alloc", checked)
    f = fitted(engine)
    s = engine_sched(engine, f.model, f.gpu, Layout(tp=1), "bf16")
    f.fit = dataclasses.replace(f.fit, params=dataclasses.replace(f.params, kv_scale=50000 / s.kv_tokens))
    rep = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)))
    assert seen["allocs"] > 100
    assert len(rep.completed) == len(rep.requests)
    assert rep.kv["peak_fraction"] <= 1.0
    assert rep.prefix_hit_rate > 0


def test_no_blocks_leak_after_a_run(tmp_path) -> None:  # noqa: ANN001
    """When every request is done, the pool holds only cached (unreferenced) blocks."""
    from inferasim.sim.cluster import Cluster

    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=8, turns=4, seed=3))
    f = fitted("vllm")
    s = engine_sched("vllm", f.model, f.gpu, Layout(tp=1), "bf16")
    s = dataclasses.replace(s, kv_tokens=20000)
    rep = Replica(f.params, layout_cost(f.model, f.gpu, Layout(tp=1)), s, delivery_delay=0.0)
    Cluster([rep]).run(Driver(load_trace(trace)))
    kv = rep.ranks[0].kv
    assert kv.in_use == 0
    assert kv.used == kv.evictable == sum(n.blocks for n in kv.nodes.values())
    assert all(n.ref == 0 for n in kv.nodes.values())
    assert kv.evicted_blocks > 0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_prefilled_requests_wait_for_their_kv_then_decode(engine: str) -> None:
    """A decode worker allocates a prefilled request's KV, waits for the transfer, forwards the
    first token, then decodes the rest (one-token requests are done when the KV arrives)."""
    from inferasim.sim.cluster import Cluster

    f = fitted(engine)
    lay = Layout(tp=1)
    rep = Replica(f.params, layout_cost(f.model, f.gpu, lay), engine_sched(engine, f.model, f.gpu, lay),
                  delivery_delay=0.0)
    reqs = []
    for i, out in enumerate((1, 50, 50)):
        r = SimRequest(i, 0.1 * i, 2000, out)
        r.prebuilt, r.load_s = True, 0.25
        reqs.append(r)
    Cluster([rep]).run(Driver(reqs))
    for r in reqs:
        assert r.first_token == pytest.approx(r.arrival + 0.25)
        assert r.generated == r.output and r.finish >= r.first_token
    assert reqs[0].finish == reqs[0].first_token
    assert rep.ranks[0].prefill_tokens == 0  # nothing computed again


@pytest.mark.parametrize(("engine", "mixed"), [("vllm", None), ("sglang", None), ("sglang", True), ("atom", None)])
def test_batches_keep_to_the_sequence_and_token_limits(engine: str, mixed: bool | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a queue that never empties, no step runs more than max_num_seqs requests or more
    tokens than the engine's budget; only vLLM and SGLang with --enable-mixed-chunk put prefill
    chunks into decode steps."""
    max_seqs, budget = 6, 1024
    seen = {"steps": 0, "mixed": 0, "full": 0}
    for cls in (VllmCore, SglangCore, AtomCore):
        def checked(self, now: float, _orig=cls.schedule):  # noqa: ANN001, ANN202
            b = _orig(self, now)
            assert self.n_alive <= max_seqs
            if engine == "sglang":
                assert b.n_pref + (b.n_dec if b.n_pref else 0) <= min(max(budget, 256), self.max_prefill)
            elif b.n_pref:
                assert b.n_pref + b.n_dec <= budget
            assert b.n_dec <= max_seqs
            seen["steps"] += 1
            seen["mixed"] += bool(b.n_dec and b.n_pref)
            seen["full"] += self.n_alive == max_seqs
            return b

        monkeypatch.setattr(cls, "schedule", checked)
    reqs = [SimRequest(i, 0.05 * i, 2000 + 37 * (i % 7), 60) for i in range(80)]
    rep = simulate_workload(fitted(engine), Layout(tp=1), Driver(reqs), max_num_seqs=max_seqs,
                            max_batched_tokens=budget, mixed=mixed)
    assert len(rep.completed) == 80
    assert seen["steps"] > 100 and seen["full"] > 10  # the limit was reached, not just respected
    assert bool(seen["mixed"]) is (engine == "vllm" or bool(mixed))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_a_request_cut_short_finishes_at_its_next_token(engine: str) -> None:
    """The emulator's abort (Core.cut_short): a decoding request finishes at its next sampled
    token, a prefilling one with its first, and the policy's aggregates stay those of the rows
    (SGLang's clipped remaining outputs, the finish heap)."""
    core = {"vllm": VllmCore, "sglang": SglangCore, "atom": AtomCore}[engine](_sched(engine), 200_000)
    reqs = [SimRequest(i, 0.0, 300, 5000) for i in range(3)]
    for r in reqs:
        core.enqueue(r)
    t = 0.0
    while core.prows or core.waiting:
        core.schedule(t)
        t += 0.01
        core.commit(t)
    for _ in range(3):
        core.schedule(t)
        t += 0.01
        core.commit(t)
    assert core.cut_short(reqs[1]) and not core.cut_short(SimRequest(9, 0.0, 10, 10))
    core.schedule(t)
    t += 0.01
    assert core.commit(t) == [reqs[1]] and reqs[1].generated == 5
    if engine == "sglang":
        rem = sum(min(r.out - (r.gb + core.G), 4096) for r in core.drows)
        assert core._clipped_rem_d() == rem
    late = SimRequest(3, t, 300, 50)
    core.enqueue(late)
    core.schedule(t)
    assert core.cut_short(late)
    t += 0.01
    done = core.commit(t)
    while late not in done:
        core.schedule(t)
        t += 0.01
        done = core.commit(t)
    assert late.generated == 1 and late.first_token == late.finish
