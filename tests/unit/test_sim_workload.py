"""Workloads, trace readers and the run report of the trace simulator."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_helpers import conversations, fitted, write_jsonl

from inferasim.core.layout import Layout
from inferasim.core.spec import StaticWorkload, TraceWorkload
from inferasim.sim.api import simulate_workload
from inferasim.sim.cluster import Cluster
from inferasim.sim.workload import (
    ClosedLoop,
    Driver,
    MultiTurn,
    WorkloadError,
    load_trace,
    poisson_requests,
)


def test_mooncake_reader_keeps_prefix_identity_scales_and_samples(tmp_path) -> None:  # noqa: ANN001
    recs = [{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 3000, "input_length": 700, "output_length": 0, "hash_ids": [0, 9]},
            {"timestamp": 2000, "input_length": 600, "output_length": 7, "hash_ids": [5, 1]}]
    path = write_jsonl(tmp_path / "m.jsonl", recs)
    reqs = load_trace(path, time_scale=0.5)
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.0]  # sorted, from 0, scaled
    a, c, b = reqs
    assert (a.prompt, a.output, a.unit, a.id_tokens) == (1100, 5, 512, 1100)
    assert b.output == 1  # at least one token
    assert a.ids[0] == b.ids[0] and a.ids[1] != b.ids[1]  # same first block, then apart
    assert a.ids[1] != c.ids[1]  # equal hash id after a different prefix: another key
    assert len(load_trace(path, sample=2)) == 2
    with pytest.raises(WorkloadError, match="time_scale"):
        load_trace(path, time_scale=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1}\n')
    with pytest.raises(WorkloadError, match="bad.jsonl:1"):
        load_trace(bad)


def test_azure_reader(tmp_path) -> None:  # noqa: ANN001
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    reqs = load_trace(p)
    assert [r.prompt for r in reqs] == [374, 396] and reqs[0].ids is None
    assert reqs[1].arrival == pytest.approx(4.314579, abs=1e-6)
    p.write_text("when,x\n1,2\n")
    with pytest.raises(WorkloadError, match="columns"):
        load_trace(p)


@pytest.mark.parametrize(("line", "field"), [
    ('{"timestamp": 1, "input_length": 10}', "without field 'output_length'"),
    ('{"timestamp": "x", "input_length": 10, "output_length": 2}', "field 'timestamp' must be a finite number"),
    ('{"timestamp": Infinity, "input_length": 10, "output_length": 2}', "field 'timestamp'"),
    ('{"timestamp": 1, "input_length": 1e999, "output_length": 2}', "field 'input_length'"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": 5}', "field 'hash_ids'"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}', "field 'hash_ids'"),
    ('[1, 2]', "JSON object"),
    ('{"timestamp": 1,', "not a JSON line"),
])
def test_a_broken_mooncake_record_is_named_by_line_and_field(tmp_path, line: str, field: str) -> None:  # noqa: ANN001
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}'
    p = tmp_path / "t.jsonl"
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(WorkloadError, match=f"t.jsonl:2: .*{field}"):
        load_trace(p)


def test_traces_that_cannot_be_read_say_why(tmp_path) -> None:  # noqa: ANN001
    import gzip

    with pytest.raises(WorkloadError, match="is not a file"):
        load_trace(tmp_path, fmt="mooncake")
    with pytest.raises(WorkloadError, match="does not exist"):
        load_trace(tmp_path / "none.csv")
    rec = '{"timestamp": 5, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}\n'
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(rec.encode()))
    (r,) = load_trace(gz)  # gzipped traces are read as such
    assert (r.prompt, r.output, len(r.ids)) == (700, 3, 2)
    raw = tmp_path / "t.jsonl"
    raw.write_bytes(gz.read_bytes())
    with pytest.raises(WorkloadError, match="not UTF-8"):
        load_trace(raw)
    az = tmp_path / "a.csv.gz"
    az.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"))
    assert [x.prompt for x in load_trace(az)] == [374]
    plain_gz = tmp_path / "p.jsonl.gz"  # a .gz name over plain text
    plain_gz.write_text(rec)
    with pytest.raises(WorkloadError, match="cannot be read.*is it gzip"):
        load_trace(plain_gz)
    cut = tmp_path / "c.csv.gz"  # a gzip stream cut short
    cut.write_bytes(az.read_bytes()[:30])
    with pytest.raises(WorkloadError, match="cannot be read"):
        load_trace(cut)
    bad = tmp_path / "b.csv"
    for row, col in (("2023-11-16 18:15:46.68,12", "GeneratedTokens"), ("yesterday,1,2", "TIMESTAMP"),
                     ("2023-11-16 18:15:46.68,many,2", "ContextTokens")):
        bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + row + "\n")
        with pytest.raises(WorkloadError, match=f"b.csv:2: column {col}"):
            load_trace(bad)


def test_shared_traces_load(shared_data) -> None:  # noqa: ANN001
    t = shared_data / "traces"
    conv = load_trace(t / "conversation_trace.jsonl")
    assert len(conv) == 12031 and conv[-1].arrival == pytest.approx(3537.0, abs=1.0)
    assert len(load_trace(t / "AzureLLMInferenceTrace_code.csv", sample=100)) == 100


def test_multi_turn_prompts_extend_the_previous_turn_and_hit_it() -> None:
    w = StaticWorkload(kind="multi-turn", sessionsPerSecond=0.5, turns=3, inputTokens=1000, outputTokens=100,
                       userTokensPerTurn=50, thinkTimeS=2.0, numRequests=30)
    rep = simulate_workload(fitted("vllm"), Layout(tp=1), w)
    reqs = rep.requests
    assert len(reqs) == 30 and len(rep.completed) == 30
    by_session: dict[int, list] = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r)
    for turns in by_session.values():
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt == prev.prompt + prev.output + 50
            assert nxt.arrival > prev.finish
            # The previous prompt and answer are cached (all but the partial last block).
            assert nxt.prefix_hit >= (prev.prompt + prev.output - 16) // 16 * 16
    assert rep.prefix_hit_rate > 0.5


def test_closed_loop_keeps_its_clients_busy() -> None:
    w = StaticWorkload(kind="closed", concurrency=8, inputTokens=512, outputTokens=64, numRequests=80)
    rep = simulate_workload(fitted("sglang"), Layout(tp=1), w)
    assert len(rep.completed) == 80
    drv = ClosedLoop(8, 80, 512, 64)
    assert drv.closed and not Driver([]).closed
    # At most 8 requests in flight at any time.
    events = sorted([(r.arrival, 1) for r in rep.requests] + [(r.finish, -1) for r in rep.requests])
    assert max(np.cumsum([e for _, e in events])) <= 8


def test_every_request_finishes_or_is_dropped_with_a_reason(tmp_path) -> None:  # noqa: ANN001
    recs = conversations(n_conv=4, turns=3, seed=9)
    recs.append({"timestamp": recs[-1]["timestamp"] + 10, "input_length": 200_000, "output_length": 10,
                 "hash_ids": [1]})
    trace = write_jsonl(tmp_path / "t.jsonl", recs)
    rep = simulate_workload(fitted("vllm"), Layout(tp=1), Driver(load_trace(trace)))
    assert len(rep.requests) == len(recs)
    for r in rep.requests:
        assert (r.finish is not None and r.first_token is not None and r.generated == r.output) != \
            (r.dropped is not None)
    (big,) = rep.dropped
    assert "context" in big.dropped or "KV pool" in big.dropped
    d = rep.as_dict()
    assert d["completed"] == len(recs) - 1 and d["dropped"] == 1 and sum(d["dropped_reasons"].values()) == 1


def test_littles_law_on_a_long_open_loop_run() -> None:
    """Requests in the system, as the simulator's own state sampled over time, equal the arrival
    rate times the mean time in the system (engine side: without the client's delivery delay)."""
    rate = 6.0
    f = fitted("vllm")
    reqs = poisson_requests(rate, 3000, 1500, 200, seed=11)
    rep = simulate_workload(f, Layout(tp=1), Driver(reqs), sample_dt=0.25)
    done = rep.completed
    assert len(done) == 3000
    t_end = max(r.arrival for r in done)
    s = rep.series
    t = np.array(s["t_s"])
    inside = (t > 20.0) & (t < t_end - 20.0)
    L = (np.array(s["running"]) + np.array(s["waiting"]))[inside].mean()
    delay = f.params.t_ttft
    W = np.mean([r.finish - delay - r.arrival for r in done])
    lam = len(done) / t_end
    assert L == pytest.approx(lam * W, rel=0.05)
    # Stable: the output rate is the offered one.
    assert rep.throughput == pytest.approx(rate * 200, rel=0.05)


def test_same_seed_same_result_and_seed_matters() -> None:
    w = StaticWorkload(kind="multi-turn", sessionsPerSecond=1.0, turns=3, inputTokens=800, outputTokens=80,
                       userTokensPerTurn=40, thinkTimeS=1.0, numRequests=60)
    a = simulate_workload(fitted("sglang"), Layout(tp=1), w, seed=3).as_dict()
    b = simulate_workload(fitted("sglang"), Layout(tp=1), w, seed=3).as_dict()
    c = simulate_workload(fitted("sglang"), Layout(tp=1), w, seed=4).as_dict()
    for d in (a, b, c):
        d.pop("wall_s")
        d.pop("sim_s_per_wall_s")
    assert a == b
    assert a != c


def _exact_itl(cores) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Every inter-token gap of a run as (values, weights), from cores never flushed (whole E)."""
    vals, wts = [], []
    for core in cores:
        if len(core.E) > 1:
            w = np.asarray(core.cont[1:], dtype=float)
            d = np.diff(np.asarray(core.E, dtype=float))
            vals.append(d[w > 0])
            wts.append(w[w > 0])
        vals.append(np.asarray(core.gaps, dtype=float))
        wts.append(np.ones(len(core.gaps)))
    return np.concatenate(vals), np.concatenate(wts)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_itl_distribution_accounts_for_every_gap(engine: str, tmp_path) -> None:  # noqa: ANN001
    """The pooled ITL has one entry per gap (output - 1 per request) and sums to the requests'
    decode spans; each request's largest gap lies between its mean gap and its decode span; the
    streaming report's percentiles are within the sketch's error of the exact ones."""
    from inferasim.sim.report import weighted_percentiles
    from inferasim.sim.sketch import ALPHA
    from inferasim.sim.tally import Tally

    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=10, turns=4, seed=12))
    f = fitted(engine)
    rep = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)))
    tally = Tally()
    streamed = _replica(f, tally)
    Cluster([streamed]).run(Driver(load_trace(trace)))
    streamed.flush(final=True)
    exact = _replica(f, None)
    Cluster([exact]).run(Driver(load_trace(trace)))
    vals, wts = _exact_itl(exact.ranks)
    done = rep.completed
    assert tally.itl.count == pytest.approx(sum(r.output - 1 for r in done))
    assert wts.sum() == pytest.approx(sum(r.output - 1 for r in done))
    assert tally.itl.sum == pytest.approx(sum(r.finish - r.first_token for r in done), rel=1e-9)
    assert rep.itl["mean"] == pytest.approx(1e3 * sum(r.finish - r.first_token for r in done) /
                                            sum(r.output - 1 for r in done), rel=1e-9)
    for r in done:
        if r.output > 2:
            assert r.tpot * (1 - 1e-9) <= r.max_gap <= (r.finish - r.first_token) * (1 + 1e-9)
    assert rep.itl["p50"] <= rep.itl["p90"] <= rep.itl["p99"]
    for q, ref in zip((50, 90, 99), weighted_percentiles(vals, wts), strict=True):
        assert abs(rep.itl[f"p{q}"] / 1e3 - ref) <= ALPHA * ref * (1 + 1e-9)
    # The other latencies against the exact percentiles of the kept records.
    ttft = np.array([r.ttft for r in done])
    mg = np.array([r.max_gap for r in done if r.output > 1])
    for name, v in (("ttft", ttft), ("max_itl", mg)):
        stat = getattr(rep, name)
        assert stat["mean"] == pytest.approx(1e3 * v.mean(), rel=1e-9)
        for q, ref in zip((50, 90, 99), weighted_percentiles(v, np.ones(v.size)), strict=True):
            assert abs(stat[f"p{q}"] / 1e3 - ref) <= ALPHA * ref * (1 + 1e-9)


def test_streaming_report_trims_and_matches_records(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Flushing every few steps (the step-end list trimmed each time) reports the same counts,
    sums and largest gaps as one flush at the end, and keeps no records unless asked."""
    from inferasim.sim import replica as replica_mod

    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=12, turns=4, seed=3))
    f = fitted("vllm")
    once = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)), slo_ttft_ms=120, slo_itl_ms=20)
    monkeypatch.setattr(replica_mod, "FLUSH_STEPS", 7)
    often = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace)), slo_ttft_ms=120, slo_itl_ms=20,
                              records=False)
    assert often.requests == [] and once.requests
    a, b = once.as_dict(series=False), often.as_dict(series=False)
    for key in ("completed", "dropped", "requests", "steps", "itl", "ttft", "tpot", "e2e", "max_itl"):
        assert a[key] == pytest.approx(b[key], rel=1e-9), key
    for key in ("requests_per_s", "tok_s", "fraction"):
        assert a["goodput"][key] == pytest.approx(b["goodput"][key], rel=1e-9), key
    assert 0 < a["goodput"]["fraction"] < 1  # the SLO splits the requests: the test can tell


def _replica(f, tally):  # noqa: ANN001, ANN202
    """A single replica of the fitted anchor on tp1 (the report does not keep its cores)."""
    from inferasim.model.layoutcost import layout_cost
    from inferasim.model.steady import engine_sched
    from inferasim.sim.replica import Replica

    lay = Layout(tp=1)
    return Replica(f.params, layout_cost(f.model, f.gpu, lay, f.precision, f.kv_dtype),
                   engine_sched(f.engine, f.model, f.gpu, lay, f.precision, f.engine_version, f.kv_dtype),
                   delivery_delay=f.params.t_ttft, tally=tally)


def test_trace_workload_spec_and_report_fields(shared_data) -> None:  # noqa: ANN001
    path = shared_data / "traces" / "conversation_trace.jsonl"
    rep = simulate_workload(fitted("vllm"), Layout(tp=1), TraceWorkload(path=str(path), sample=300, timeScale=4.0),
                            slo_ttft_ms=2000, slo_itl_ms=60)
    d = rep.as_dict()
    for key in ("completed", "dropped", "prefix_hit_rate", "throughput_per_gpu", "goodput", "kv", "series"):
        assert key in d
    for key in ("ttft", "itl"):
        assert set(d[key]) == {"mean", "p50", "p90", "p99"}
        assert d[key]["p50"] <= d[key]["p90"] <= d[key]["p99"]
    assert d["ttft_mean_ms"] == d["ttft"]["mean"] and d["itl_mean_ms"] == d["itl"]["mean"]
    assert 0 <= d["goodput"]["fraction"] <= 1 and d["goodput"]["slo"] == "TTFT <= 2000 ms, ITL <= 60 ms"
    assert d["completed"] == 300 and d["prefix_hit_rate"] > 0
    s = d["series"]
    assert len(s["t_s"]) > 10 and max(s["kv_usage"]) <= 1.0
    assert "TTFT (ms)" in rep.table()
    assert isinstance(MultiTurn(1.0, 2, 4, 10, 10, 0), Driver)


def test_an_observed_prefix_hit_rate_becomes_a_shared_prompt_head() -> None:
    for kind, extra in (("poisson", {"requestRate": 2.0}), ("closed", {"concurrency": 4})):
        w = StaticWorkload(kind=kind, inputTokens=2000, outputTokens=50, numRequests=40, prefixHitRate=0.4, **extra)
        rep = simulate_workload(fitted("vllm"), Layout(tp=1), w)
        # 768 of 2000 tokens (whole 64-token units) are shared; the first requests, prefilled
        # together before anything is cached, miss.
        assert all(r.prefix_hit in (0, 768) for r in rep.requests)
        assert all(r.prefix_hit == 768 for r in rep.requests[10:])
        assert 0.3 < rep.prefix_hit_rate <= 768 / 2000


def test_goodput_counts_the_requests_within_both_slos() -> None:
    reqs = poisson_requests(9.0, 400, 1500, 120, seed=13)
    base = simulate_workload(fitted("vllm"), Layout(tp=1), Driver(reqs))
    ttft_ms, itl_ms = base.ttft["p50"], base.tpot["p90"]
    rep = simulate_workload(fitted("vllm"), Layout(tp=1), Driver(poisson_requests(9.0, 400, 1500, 120, seed=13)),
                            slo_ttft_ms=ttft_ms, slo_itl_ms=itl_ms)
    ok = [r for r in rep.completed if r.ttft * 1e3 <= ttft_ms and r.tpot * 1e3 <= itl_ms]
    g = rep.goodput
    assert 0.2 < g["fraction"] < 0.5  # TTFT <= its p50 alone keeps at least half: the ITL limit binds too
    assert g["fraction"] == pytest.approx(len(ok) / len(rep.completed))
    assert g["requests_per_s"] == pytest.approx(len(ok) / rep.duration)
    assert g["tok_s"] == pytest.approx(sum(r.output for r in ok) / rep.duration)
    assert g["slo"] == f"TTFT <= {ttft_ms:g} ms, ITL <= {itl_ms:g} ms"
    assert simulate_workload(fitted("vllm"), Layout(tp=1), Driver(poisson_requests(9.0, 400, 1500, 120, seed=13))
                             ).goodput["fraction"] == 1.0  # no SLO: every completed request counts


def test_stream_driver_replays_as_the_list(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A streamed trace (read in batches as the replay reaches them) gives the list's report; out
    of order, it is refused."""
    from inferasim.sim.workload import StreamDriver, WorkloadError

    trace = write_jsonl(tmp_path / "t.jsonl", conversations(n_conv=12, turns=4, seed=5))
    f = fitted("vllm")
    ref = simulate_workload(f, Layout(tp=1), Driver(load_trace(trace))).as_dict(series=False)
    monkeypatch.setattr(StreamDriver, "BATCH", 5)
    reqs = load_trace(trace)
    got = simulate_workload(f, Layout(tp=1), StreamDriver(iter(reqs), reqs[-1].arrival),
                            records=False).as_dict(series=False)
    for key in ("completed", "requests", "itl", "ttft", "tpot", "max_itl", "throughput_tok_s", "prefix_hit_rate"):
        assert got[key] == pytest.approx(ref[key], rel=1e-6), key
    shuffled = load_trace(trace)
    shuffled[3], shuffled[9] = shuffled[9], shuffled[3]
    with pytest.raises(WorkloadError, match="order of arrival"):
        simulate_workload(f, Layout(tp=1), StreamDriver(shuffled), records=False)
