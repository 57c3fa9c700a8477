"""Prefix caching and the host KV tier of the trace simulator."""

from __future__ import annotations

import dataclasses

import pytest
from test_sim_helpers import conversations, fitted, shared_prefix_tokens, write_jsonl

from inferasim.core.layout import Layout
from inferasim.model.steady import engine_sched
from inferasim.sim.api import simulate_workload
from inferasim.sim.prefix import KVPool
from inferasim.sim.request import SimRequest
from inferasim.sim.workload import Driver, chain_keys, load_trace


def _tight(f, engine: str, tokens: int):  # noqa: ANN001, ANN202
    s = engine_sched(engine, f.model, f.gpu, Layout(tp=1), "bf16")
    f.fit = dataclasses.replace(f.fit, params=dataclasses.replace(f.params, kv_scale=tokens / s.kv_tokens))
    return f


@pytest.mark.parametrize("engine,block", [("vllm", 16), ("sglang", 1), ("atom", 16)])
def test_sequential_hits_equal_the_shared_prefix(engine: str, block: int, tmp_path) -> None:  # noqa: ANN001
    """Requests one at a time with an ample cache: each one finds exactly the prefix it shares
    with an earlier one, less the last prompt token, in whole blocks (vLLM, ATOM) or tokens (SGLang)."""
    recs = conversations(n_conv=6, turns=5, seed=4)
    for i, r in enumerate(recs):
        r["timestamp"] = i * 1_000_000  # 1000 s apart: each is done before the next
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    rep = simulate_workload(fitted(engine), Layout(tp=1), Driver(load_trace(trace)))
    shared = shared_prefix_tokens(recs)
    want = [min(s, r["input_length"] - 1) // block * block for s, r in zip(shared, recs, strict=True)]
    got = [r.prefix_hit for r in rep.requests]
    assert got == want
    assert rep.prefix_hit_rate == pytest.approx(sum(want) / sum(r["input_length"] for r in recs))
    assert rep.prefill_tokens == sum(r["input_length"] for r in recs) - sum(want)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_hits_never_exceed_the_shared_prefix_under_pressure(engine: str, tmp_path) -> None:  # noqa: ANN001
    recs = conversations(n_conv=14, turns=5, seed=5)
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    rep = simulate_workload(_tight(fitted(engine), engine, 45000), Layout(tp=1), Driver(load_trace(trace)))
    assert rep.preemptions > 0 or rep.kv["peak_fraction"] > 0.5
    shared = shared_prefix_tokens(recs)
    for r, s in zip(rep.requests, shared, strict=True):
        assert 0 <= r.prefix_hit <= s
        assert r.prefix_hit <= r.prompt - 1
    assert 0 < rep.prefix_hit_rate < 1


def test_a_trace_without_reuse_has_no_hits(tmp_path) -> None:  # noqa: ANN001
    recs = conversations(n_conv=8, turns=4, seed=6, system_blocks=0)
    uid = 10_000
    for r in recs:  # fresh ids everywhere: nothing is shared
        r["hash_ids"] = list(range(uid, uid + len(r["hash_ids"])))
        uid += len(r["hash_ids"])
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    for engine in ("vllm", "sglang"):
        rep = simulate_workload(fitted(engine), Layout(tp=1), Driver(load_trace(trace)))
        assert rep.prefix_hit_rate == 0.0
        assert all(r.prefix_hit == 0 for r in rep.requests)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_caching_off_computes_every_prompt_token(engine: str, tmp_path) -> None:  # noqa: ANN001
    recs = conversations(n_conv=8, turns=4, seed=7)
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    off = simulate_workload(fitted(engine), Layout(tp=1), Driver(load_trace(trace)), prefix_caching=False)
    on = simulate_workload(fitted(engine), Layout(tp=1), Driver(load_trace(trace)))
    total = sum(r["input_length"] for r in recs)
    assert off.preemptions == 0 and off.prefix_hit_rate == 0.0
    assert off.prefill_tokens == total
    assert on.prefill_tokens == total - sum(r.prefix_hit for r in on.requests) < total
    assert on.ttft["mean"] < off.ttft["mean"]


def test_pool_evicts_least_recently_used_from_the_tail() -> None:
    kv = KVPool(16 * 20, 16)  # 20 blocks

    class _Row:  # what register() needs of an engine row
        def __init__(self, req: SimRequest) -> None:
            self.req, self.nodes, self.reg_tok, self.tail_open, self.reg_stop, self.shared = req, [], 0, False, False, 0

    def put(ids: tuple[int, ...], tokens: int) -> _Row:
        req = SimRequest(0, 0.0, tokens + 1, 1, chain_keys(ids), 64, tokens)
        row = _Row(req)
        kv.alloc(kv.blocks_for(tokens))
        kv.register(row, tokens)
        kv.release(kv.blocks_for(tokens) - row.shared)
        kv.drop(row.nodes)
        return row

    put((1, 2, 3), 192)  # 12 blocks, older
    put((7, 8), 96)  # 6 blocks, newer
    assert kv.used == 18 and kv.evictable == 18 and kv.in_use == 0 and kv.free == 20
    a = kv.match(chain_keys((1, 2, 3)), 64, 192, 500)
    assert a.gpu == 192 and a.revived == 12
    kv.alloc(5)  # 2 free, 3 evicted from the tail of the oldest entry
    assert kv.used == 20 and kv.evictable == 15
    assert kv.match(chain_keys((1, 2, 3)), 64, 192, 500).gpu == 144  # 3 blocks of unit 3 gone
    assert kv.match(chain_keys((7, 8)), 64, 96, 500).gpu == 96  # the newer one intact
    kv.alloc(13)  # the rest of the oldest (9 blocks), then 4 from the tail of the newer
    assert kv.match(chain_keys((1, 2, 3)), 64, 192, 500).gpu == 0
    assert kv.match(chain_keys((7, 8)), 64, 96, 500).gpu == 32
    assert kv.in_use == 18 and kv.used == 20


def test_host_tier_brings_back_evicted_prefixes(tmp_path) -> None:  # noqa: ANN001
    recs = conversations(n_conv=16, turns=5, seed=8, gap_s=1.0)
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    base = simulate_workload(_tight(fitted("vllm"), "vllm", 40000), Layout(tp=1), Driver(load_trace(trace)))
    host = simulate_workload(_tight(fitted("vllm"), "vllm", 40000), Layout(tp=1), Driver(load_trace(trace)),
                             host_kv_bytes=20e9)
    assert base.host_hit_rate == 0.0
    assert host.host_hit_rate > 0.0
    assert host.prefix_hit_rate > base.prefix_hit_rate
    assert host.prefill_tokens < base.prefill_tokens
    assert len(host.completed) == len(recs)


def test_host_tier_has_its_own_capacity_and_reloads_over_the_host_link(tmp_path,  # noqa: ANN001
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The host tier holds at most its own capacity (LRU beyond it), a larger tier finds more, and
    a reload takes the host link's time before the request's prefill."""
    recs = conversations(n_conv=16, turns=5, seed=8, gap_s=1.0)
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    fill: list[float] = []
    orig = KVPool._to_host

    def checked(self: KVPool, *args) -> None:  # noqa: ANN002
        orig(self, *args)
        assert 0 <= self.host_used <= self.host_cap
        fill.append(self.host_used / self.host_cap)

    monkeypatch.setattr(KVPool, "_to_host", checked)
    kv_bytes = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B bf16: K and V, 32 layers, 8 KV heads of 128
    rates = []
    for gb in (2, 20):
        rep = simulate_workload(_tight(fitted("vllm"), "vllm", 40000), Layout(tp=1), Driver(load_trace(trace)),
                                host_kv_bytes=gb * 1e9)
        assert rep.config["host_kv_tokens_per_rank"] == int(gb * 1e9 / kv_bytes)
        assert len(rep.completed) == len(recs)
        rates.append(rep.host_hit_rate)
        if gb == 2:
            assert max(fill) > 0.99  # the small tier filled up and dropped its oldest entries
    assert 0 < rates[0] < rates[1]
    f = _tight(fitted("vllm"), "vllm", 40000)
    f.gpu = dataclasses.replace(f.gpu, host_link=dataclasses.replace(f.gpu.host_link, latency=3.0))
    slow = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)), host_kv_bytes=20e9)
    reloaded = [r for r in slow.requests if r.host_hit > 0]
    assert reloaded and all(r.ttft >= 3.0 for r in reloaded)
    assert len(slow.completed) == len(recs)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_prefix_evicted_to_the_host_is_found_whole(engine: str) -> None:
    """An eviction that splits a 512-token unit once lost the rest of the prefix for good: the host
    tier indexes whole units and a lookup enters it only at a unit boundary. A 20,480-token prefix
    pushed out of a 40k-token pool by fillers is found again whole (but its last token)."""
    prefix = chain_keys(range(1000, 1040))  # 40 units = 20,480 tokens
    reqs = [SimRequest(0, 0.0, 20480, 1, prefix, 512, 20480)]
    for i in range(4):  # fillers of their own, 12,300 tokens each: the pool must drop the prefix
        ids = chain_keys(range(10000 * (i + 1), 10000 * (i + 1) + 25))
        reqs.append(SimRequest(len(reqs), 10.0 * (i + 1), 12300, 1, ids, 512, 12300))
    reqs.append(SimRequest(len(reqs), 100.0, 20480, 1, prefix, 512, 20480))
    f = _tight(fitted(engine), engine, 40000)
    off = simulate_workload(f, Layout(tp=1), reqs)
    assert off.requests[-1].prefix_hit < 20480 // 2  # without a host tier most of it is gone
    reqs = [SimRequest(r.rid, r.arrival, r.prompt, r.output, r.ids, r.unit, r.id_tokens) for r in reqs]
    on = simulate_workload(f, Layout(tp=1), reqs, host_kv_bytes=1e12)
    last = on.requests[-1]
    block = 16 if engine == "vllm" else 1
    assert last.prefix_hit == (20480 - 1) // block * block and last.host_hit > 0
