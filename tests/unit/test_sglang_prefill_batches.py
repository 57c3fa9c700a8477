"""SGLang's prefill batches in its engine scheduler (`sim.engines.SglangCore`, which the trace
simulator, the closed-loop simulator and the emulator all run): PrefillAdder's two budgets
(--chunked-prefill-size and --max-prefill-tokens) and the overlap scheduler's late first tokens
after a prefill batch that another prefill batch follows (`steady.SGLANG_CONSECUTIVE_PREFILL_DELAY`)."""

from __future__ import annotations

import dataclasses

import pytest

import inferasim.sim.engines as engines
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import SGLANG_CONSECUTIVE_PREFILL_DELAY, EngineSched, engine_sched
from inferasim.model.steptime import StepParams, step_time
from inferasim.sim.des import simulate_closed_loop
from inferasim.sim.engines import SglangCore
from inferasim.sim.replica import Replica
from inferasim.sim.request import SimRequest

MODEL = get_model("meta-llama/Meta-Llama-3.1-8B")
GPU = get_gpu("H100")
KV = 1_000_000
DELIVERY = 0.05


def _sched(chunk: int, max_prefill: int = 16384) -> EngineSched:
    return EngineSched(engine="sglang", mixed=False, max_num_seqs=1024, max_batched_tokens=chunk, kv_tokens=KV,
                       block_size=1, max_prefill_tokens=max_prefill)


class _Driver:
    """engines.SglangCore driven step by step: batches as lists of prefill chunk sizes."""

    def __init__(self, s: EngineSched, prompts: list[int], output: int = 4) -> None:
        self.core = SglangCore(s, KV, DELIVERY)
        self.reqs = [SimRequest(i, 0.0, n, output) for i, n in enumerate(prompts)]
        for r in self.reqs:
            self.core.enqueue(r)

    def step(self, now: float) -> list[int]:
        b = self.core.schedule(now)
        assert not b.n_dec
        return [chunk for _, chunk, _ in b.pre]

    def commit(self, t_end: float) -> None:
        self.core.commit(t_end)

    def decode(self, now: float, t_end: float) -> None:
        b = self.core.schedule(now)
        assert b.n_dec and not b.pre
        self.core.commit(t_end)

    def add(self, prompt: int, arrival: float) -> None:
        r = SimRequest(len(self.reqs), arrival, prompt, 4)
        self.reqs.append(r)
        self.core.enqueue(r)


# -- PrefillAdder's budgets -------------------------------------------------------------------------

def test_max_prefill_tokens_refuses_the_16th_1024_token_prompt() -> None:
    """16 x 1024 = 16384 would fill --max-prefill-tokens exactly; SGLang refuses the 16th prompt
    (1024 >= the 1024 tokens left) instead of taking it: 15 + 1."""
    d = _Driver(_sched(16384), [1024] * 16)
    assert d.step(0.0) == [1024] * 15
    d.commit(1.0)
    assert d.step(1.0) == [1024]


def test_8192_token_prompts_go_one_per_batch() -> None:
    d = _Driver(_sched(16384), [8192, 8192])
    assert d.step(0.0) == [8192]
    d.commit(1.0)
    assert d.step(1.0) == [8192]


def test_a_smaller_chunk_binds_first_and_chunks_the_last_request() -> None:
    d = _Driver(_sched(8192), [1024] * 10)
    assert d.step(0.0) == [1024] * 8
    d.commit(1.0)
    assert d.step(1.0) == [1024, 1024]

    d = _Driver(_sched(8192), [3000] * 6)
    assert d.step(0.0) == [3000, 3000, 2192]  # the third is chunked to what the chunk has left
    d.commit(1.0)
    assert d.step(1.0) == [808, 3000, 3000, 1384]  # its rest first, then the queue, chunked again
    d.commit(2.0)
    assert d.step(2.0) == [1616]

    # --max-prefill-tokens still binds behind a first entry: 20000 >= 16384 - 1000 is refused, not
    # chunked into the short prompt's batch; it starts the next batch, chunked.
    d = _Driver(_sched(8192), [1000, 20000])
    assert d.step(0.0) == [1000]
    d.commit(1.0)
    assert d.step(1.0) == [8192]


def test_the_first_entry_is_taken_whole_up_to_the_chunk() -> None:
    """--max-prefill-tokens never refuses a batch's first request: with a chunk larger than it, a
    prompt between the two runs whole (and alone), not cut at --max-prefill-tokens."""
    d = _Driver(_sched(32768), [20000, 1000])
    assert d.step(0.0) == [20000]
    d.commit(1.0)
    assert d.step(1.0) == [1000]
    d = _Driver(_sched(32768), [40000])
    assert d.step(0.0) == [32768]


# -- late first tokens after consecutive prefill batches ---------------------------------------------

def test_first_tokens_of_a_prefill_batch_followed_by_a_prefill_leave_late() -> None:
    d = _Driver(_sched(16384), [1024] * 16)
    assert len(d.step(2.0)) == 15
    d.commit(2.8)
    assert [r.first_token for r in d.reqs[:15]] == [2.8 + DELIVERY] * 15  # until the next batch shows
    assert len(d.step(2.8)) == 1
    d.commit(3.0)  # another prefill, launched at once: the 15 leave 0.3 of it late, before it ends
    late = 2.8 + SGLANG_CONSECUTIVE_PREFILL_DELAY * 0.2 + DELIVERY
    assert [r.first_token for r in d.reqs[:15]] == pytest.approx([late] * 15, rel=1e-12)
    assert 2.8 + DELIVERY < late < 3.0 + DELIVERY
    assert d.reqs[15].first_token == 3.0 + DELIVERY
    d.decode(3.0, 3.01)  # a decode batch follows the 16th: it stays on time
    assert d.reqs[15].first_token == 3.0 + DELIVERY


def test_a_chunked_request_going_on_makes_the_next_batch_a_prefill() -> None:
    d = _Driver(_sched(8192), [3000] * 3)
    d.step(0.0)
    d.commit(1.0)
    assert d.step(1.0) == [808]
    d.commit(1.5)
    late = 1.0 + SGLANG_CONSECUTIVE_PREFILL_DELAY * 0.5 + DELIVERY
    assert [r.first_token for r in d.reqs[:2]] == pytest.approx([late] * 2, rel=1e-12)
    assert d.reqs[2].first_token == 1.5 + DELIVERY


def test_a_one_token_request_is_handed_back_on_time() -> None:
    d = _Driver(_sched(16384), [1024] * 16, output=1)
    d.step(0.0)
    d.commit(1.0)
    d.step(1.0)
    d.commit(1.2)
    for r in d.reqs[:15]:
        assert r.first_token == r.finish == 1.0 + DELIVERY


def test_a_prefill_after_an_idle_gap_delays_nothing() -> None:
    # The overlap scheduler reads a batch's results at once when nothing else is launched.
    d = _Driver(_sched(16384), [1024] * 15)
    d.step(0.0)
    d.commit(1.0)
    d.add(1024, 2.0)
    assert d.step(2.0) == [1024]
    d.commit(2.3)
    assert [r.first_token for r in d.reqs[:15]] == [1.0 + DELIVERY] * 15


def test_without_the_delay_first_tokens_are_batch_end_plus_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "SGLANG_CONSECUTIVE_PREFILL_DELAY", 0.0)  # every simulator uses it there
    d = _Driver(_sched(16384), [1024] * 16)
    d.step(2.0)
    d.commit(2.8)
    d.step(2.8)
    d.commit(3.0)
    assert [r.first_token for r in d.reqs[:15]] == [2.8 + DELIVERY] * 15
    assert d.reqs[15].first_token == 3.0 + DELIVERY


# -- through the simulators ---------------------------------------------------------------------------

def test_both_event_loops_price_the_late_wave_of_16_prompts() -> None:
    """16 x 1024 prompts at t = 0 (B200-style chunk = --max-prefill-tokens = 16384): a batch of
    15 ends at t1, the 16th runs alone for t2 right after it, and the 15 first tokens leave 0.3 t2
    late; the 16th is on time."""
    lay = Layout(tp=1)
    p, c = StepParams(), layout_cost(MODEL, GPU, lay)
    s = dataclasses.replace(engine_sched("sglang", MODEL, GPU, lay), max_batched_tokens=16384,
                            max_prefill_tokens=16384)
    t1 = float(step_time(p, c, 0.0, 0.0, 15 * 1024, 512.0))
    t2 = float(step_time(p, c, 0.0, 0.0, 1024, 512.0))
    want = [t1 + SGLANG_CONSECUTIVE_PREFILL_DELAY * t2 + p.t_ttft] * 15 + [t1 + t2 + p.t_ttft]

    old = simulate_closed_loop(p, c, s, 1024, 8, 16, num_requests=16)
    assert [r.first_token for r in old.requests] == pytest.approx(want, rel=1e-12)

    rep = Replica(p, c, s, delivery_delay=p.t_ttft)
    reqs = [SimRequest(i, 0.0, 1024, 8) for i in range(16)]
    for r in reqs:
        assert rep.submit(r, 0.0)
    rep.run_until(float("inf"), lambda r: None)
    assert [r.first_token for r in reqs] == pytest.approx(want, rel=1e-12)


def test_a_late_first_token_never_follows_the_second() -> None:
    # Short outputs right behind a long batch: the second token must not beat the first.
    lay = Layout(tp=1)
    p, c = StepParams(), layout_cost(MODEL, GPU, lay)
    s = dataclasses.replace(engine_sched("sglang", MODEL, GPU, lay), max_batched_tokens=16384,
                            max_prefill_tokens=16384)
    for osl in (2, 3):
        res = simulate_closed_loop(p, c, s, 1024, osl, 16, num_requests=64)
        assert all(r.finish >= r.first_token for r in res.requests)
        assert res.tpot_mean > 0
