"""inferasim.observe against a scripted Prometheus HTTP API (httpx.MockTransport).

The transport answers the exact PromQL the observer sends, so these tests pin the queries of
engine-facts.md section 4 as well as the handling of empty results, NaN, errors and outages.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from inferasim.core.spec import StaticWorkload
from inferasim.observe import ObservationError, PrometheusClient, detect_engine, observe, queries_for, selector_matchers
from inferasim.observed import ObservedWorkload, drift

URL = "http://prometheus.test:9090"
SEL = {"namespace": "llm", "deployment": "chat"}
S = '{deployment="chat",namespace="llm"}'
W = "5m"


def vector(value: float | str | None) -> dict:
    result = [] if value is None else [{"metric": {}, "value": [1700000000.0, str(value)]}]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def transport(answers: dict[str, float | str], seen: list[str] | None = None,
              fallback: Callable[[str], dict] | None = None) -> httpx.MockTransport:
    """Answers each query from ``answers``; unknown queries get an empty vector (no such series)."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query"
        q = request.url.params["query"]
        assert "time" in request.url.params  # all quantities at one instant
        if seen is not None:
            seen.append(q)
        if q in answers:
            return httpx.Response(200, json=vector(answers[q]))
        if fallback is not None:
            return httpx.Response(200, json=fallback(q))
        return httpx.Response(200, json=vector(None))

    return httpx.MockTransport(handler)


def hq(q: float, hist: str) -> str:
    return f"histogram_quantile({q:g}, sum by (le) (rate({hist}_bucket{S}[{W}])))"


def vllm_answers() -> dict[str, float | str]:
    a: dict[str, float | str] = {
        f"sum(rate(vllm:request_success_total{S}[{W}]))": 12.5,
        f"sum(rate(vllm:request_prompt_tokens_sum{S}[{W}])) / sum(rate(vllm:request_prompt_tokens_count{S}[{W}]))":
            1800.4,
        f"sum(rate(vllm:request_generation_tokens_sum{S}[{W}])) / "
        f"sum(rate(vllm:request_generation_tokens_count{S}[{W}]))": 310.0,
        f"sum(rate(vllm:prefix_cache_hits_total{S}[{W}])) / sum(rate(vllm:prefix_cache_queries_total{S}[{W}]))": 0.42,
        f"sum(vllm:num_requests_running{S})": 37,
        f"sum(vllm:num_requests_waiting{S})": 0,
        f"avg(vllm:kv_cache_usage_perc{S})": 0.61,
    }
    for hist, base in (("vllm:request_prompt_tokens", 1000), ("vllm:request_generation_tokens", 200),
                       ("vllm:time_to_first_token_seconds", 0.1), ("vllm:inter_token_latency_seconds", 0.02)):
        for i, q in enumerate((0.5, 0.9, 0.99)):
            a[hq(q, hist)] = base * (1 + i)
    return a


def test_vllm_all_quantities() -> None:
    seen: list[str] = []
    w = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1700000000.0,
                transport=transport(vllm_answers(), seen))
    assert w.engine == "vllm" and w.window == W and w.selector == SEL
    assert w.request_rate == 12.5
    assert w.prompt_tokens_mean == pytest.approx(1800.4) and w.output_tokens_mean == 310
    assert w.prefix_hit_rate == pytest.approx(0.42)
    assert (w.running, w.waiting) == (37, 0)  # a real zero is kept (the series exists)
    assert w.kv_cache_usage == pytest.approx(0.61)
    assert w.prompt_tokens is not None and (w.prompt_tokens.p50, w.prompt_tokens.p99) == (1000, 3000)
    assert w.ttft is not None and w.ttft.p50_ms == pytest.approx(100) and w.ttft.p99_ms == pytest.approx(300)
    assert w.itl is not None and w.itl.p90_ms == pytest.approx(40)
    assert w.unavailable == []
    assert len(seen) == 19 and all("{" + 'deployment="chat",namespace="llm"' + "}" in q for q in seen)
    # camelCase on the wire (it lands in the ServingTuning status)
    d = w.model_dump(by_alias=True)
    assert d["requestRate"] == 12.5 and d["ttft"]["p90Ms"] == pytest.approx(200)


def test_to_static_feeds_tune() -> None:
    w = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(vllm_answers()))
    s = w.to_static()
    assert isinstance(s, StaticWorkload)
    assert (s.kind, s.request_rate, s.input_tokens, s.output_tokens) == ("poisson", 12.5, 1800, 310)
    assert s.prefix_hit_rate == pytest.approx(0.42)


def test_missing_series_is_an_error_naming_the_query() -> None:
    answers = vllm_answers()
    ttft_p50 = hq(0.5, "vllm:time_to_first_token_seconds")
    del answers[ttft_p50]
    with pytest.raises(ObservationError) as err:
        observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert err.value.reason == "MissingSeries"
    assert err.value.query == ttft_p50
    assert "ttft_p50" in str(err.value) and ttft_p50 in str(err.value)


def test_no_traffic_is_not_a_workload() -> None:
    answers = vllm_answers()
    answers[f"sum(rate(vllm:request_success_total{S}[{W}]))"] = 0
    with pytest.raises(ObservationError) as err:
        observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert err.value.reason == "NoTraffic" and "vllm:request_success_total" in err.value.query


def test_nan_quantile_is_an_error_not_a_zero() -> None:
    answers = vllm_answers()
    answers[hq(0.9, "vllm:inter_token_latency_seconds")] = "NaN"
    with pytest.raises(ObservationError) as err:
        observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert "itl_p90" in str(err.value) and err.value.reason == "MissingSeries"


def test_prefix_cache_off_is_null_not_zero() -> None:
    answers = vllm_answers()
    answers[f"sum(rate(vllm:prefix_cache_hits_total{S}[{W}])) / sum(rate(vllm:prefix_cache_queries_total{S}[{W}]))"] \
        = "NaN"
    w = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert w.prefix_hit_rate is None and any(u.startswith("prefix_hit_rate") for u in w.unavailable)
    assert w.to_static().prefix_hit_rate is None


def test_old_vllm_names_are_a_fallback() -> None:
    answers = vllm_answers()
    for q in (0.5, 0.9, 0.99):
        answers[hq(q, "vllm:time_per_output_token_seconds")] = answers.pop(hq(q, "vllm:inter_token_latency_seconds"))
    new_hit = f"sum(rate(vllm:prefix_cache_hits_total{S}[{W}])) / sum(rate(vllm:prefix_cache_queries_total{S}[{W}]))"
    answers[new_hit.replace("vllm:prefix", "vllm:gpu_prefix")] = answers.pop(new_hit)
    answers[f"avg(vllm:gpu_cache_usage_perc{S})"] = answers.pop(f"avg(vllm:kv_cache_usage_perc{S})")
    w = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert w.itl is not None and w.itl.p50_ms == pytest.approx(20)
    assert w.prefix_hit_rate == pytest.approx(0.42) and w.kv_cache_usage == pytest.approx(0.61)


def test_infinite_quantile_is_noted_not_stored() -> None:
    answers = vllm_answers()
    answers[hq(0.99, "vllm:time_to_first_token_seconds")] = "+Inf"
    w = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(answers))
    assert w.ttft is not None and w.ttft.p99_ms is None and w.ttft.p90_ms == pytest.approx(200)
    assert any("top bucket" in u for u in w.unavailable)


def sglang_answers(with_len_hist: bool) -> dict[str, float | str]:
    a: dict[str, float | str] = {
        f"sum(rate(sglang:num_requests_total{S}[{W}]))": 4.0,
        f"sum(rate(sglang:prompt_tokens_total{S}[{W}])) / sum(rate(sglang:num_requests_total{S}[{W}]))": 900.0,
        f"sum(rate(sglang:generation_tokens_total{S}[{W}])) / sum(rate(sglang:num_requests_total{S}[{W}]))": 128.0,
        f"sum(rate(sglang:cached_tokens_total{S}[{W}])) / sum(rate(sglang:prompt_tokens_total{S}[{W}]))": 0.1,
        f"sum(sglang:num_running_reqs{S})": 5, f"sum(sglang:num_queue_reqs{S})": 2,
    }
    hists = ["sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"]
    if with_len_hist:
        hists += ["sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram"]
    for h in hists:
        for q in (0.5, 0.9, 0.99):
            a[hq(q, h)] = q
    return a


def test_sglang_length_histograms_are_optional() -> None:
    w = observe({"url": URL, "selector": SEL, "window": W}, "sglang", at=1.0,
                transport=transport(sglang_answers(False)))
    assert w.request_rate == 4 and w.prompt_tokens_mean == 900 and w.output_tokens_mean == 128
    assert w.prompt_tokens is None and w.output_tokens is None and w.kv_cache_usage is None
    assert any("sglang:prompt_tokens_histogram_bucket" in u for u in w.unavailable)
    assert w.ttft is not None and w.ttft.p90_ms == pytest.approx(900)
    w2 = observe({"url": URL, "selector": SEL, "window": W}, "sglang", at=1.0,
                 transport=transport(sglang_answers(True)))
    assert w2.prompt_tokens is not None and w2.prompt_tokens.p90 == pytest.approx(0.9)


def test_atom_without_latency_histograms() -> None:
    a = {
        f"sum(rate(atom:requests_finished_total{S}[{W}]))": 2.0,
        f"sum(rate(atom:prompt_tokens_total{S}[{W}])) / sum(rate(atom:requests_finished_total{S}[{W}]))": 3000,
        f"sum(rate(atom:generation_tokens_total{S}[{W}])) / sum(rate(atom:requests_finished_total{S}[{W}]))": 500,
        f"avg(atom:prefix_cache_hit_ratio{S})": 0.3,
        f"sum(atom:requests_running{S})": 3, f"sum(atom:requests_waiting{S})": 1,
    }
    seen: list[str] = []
    w = observe({"url": URL, "selector": SEL, "window": W}, "atom", at=1.0, transport=transport(a, seen))
    assert w.prefix_hit_rate == pytest.approx(0.3)  # the gauge, after the counter ratio was empty
    assert w.ttft is None and w.itl is None
    assert any("ATOM exports no latency" in u for u in w.unavailable)
    assert not any("histogram_quantile" in q for q in seen)


def test_detect_engine() -> None:
    sel = {"job": "emu"}
    answers = {'count({__name__=~"sglang:.+",job="emu"})': 14}
    with PrometheusClient(URL, transport=transport(answers)) as c:
        assert detect_engine(c, sel, 1.0) == "sglang"
    with PrometheusClient(URL, transport=transport({})) as c, pytest.raises(ObservationError) as err:
        detect_engine(c, sel, 1.0)
    assert err.value.reason == "MissingSeries"
    with PrometheusClient(URL, transport=transport({'count({__name__=~"vllm:.+"})': 3})) as c:
        assert detect_engine(c, {}, 1.0) == "vllm"


def test_auto_engine_in_observe() -> None:
    answers = vllm_answers()
    answers['count({__name__=~"vllm:.+",deployment="chat",namespace="llm"})'] = 50
    w = observe({"url": URL, "selector": SEL, "window": W}, at=1.0, transport=transport(answers))
    assert w.engine == "vllm"


def test_unreachable_prometheus() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ObservationError) as err:
        observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=httpx.MockTransport(refuse))
    assert err.value.reason == "Unreachable" and "vllm:request_success_total" in err.value.query
    assert "prometheus.test" in str(err.value)


@pytest.mark.parametrize("status,body,reason", [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}, "QueryError"),
    (503, "<html>unavailable</html>", "Unreachable"),
    (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, "QueryError"),
])
def test_query_errors(status: int, body: object, reason: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    with pytest.raises(ObservationError) as err:
        observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=httpx.MockTransport(handler))
    assert err.value.reason == reason and err.value.query


def test_two_series_means_the_query_is_not_aggregated() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        two = [{"metric": {"a": "1"}, "value": [1, "1"]}, {"metric": {"a": "2"}, "value": [1, "2"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": two}})

    with PrometheusClient(URL, transport=httpx.MockTransport(handler)) as c, pytest.raises(ObservationError):
        c.scalar("up")


def test_selector_escaping_and_validation() -> None:
    assert selector_matchers({"b": 'x"y', "a": "back\\slash"}) == '{a="back\\\\slash",b="x\\"y"}'
    assert selector_matchers({}) == "{}"
    with pytest.raises(ObservationError, match="selector"):
        selector_matchers({"bad-name": "x"})
    with pytest.raises(ObservationError, match="window"):
        queries_for("vllm", {}, "five minutes")
    with pytest.raises(ObservationError, match="engine"):
        queries_for("trtllm", {}, "5m")
    with pytest.raises(ObservationError, match="url"):
        PrometheusClient("prometheus:9090")


def test_drift() -> None:
    base = observe({"url": URL, "selector": SEL, "window": W}, "vllm", at=1.0, transport=transport(vllm_answers()))
    assert drift(base, base) == 0
    moved = base.model_copy(update={"request_rate": base.request_rate * 1.5})
    assert drift(base, moved) == pytest.approx(0.5)
    # the stored (camelCase) status form works as the old value
    assert drift(base.model_dump(by_alias=True), moved) == pytest.approx(0.5)
    hit = base.model_copy(update={"prefix_hit_rate": 0.72})
    assert drift(base, hit) == pytest.approx(0.30)
    assert not math.isnan(drift(base.model_copy(update={"prefix_hit_rate": None}), base))
    assert isinstance(ObservedWorkload.model_validate(base.model_dump(by_alias=True)), ObservedWorkload)


def test_quantile_bound_is_the_bucket_a_read_back_quantile_can_reach() -> None:
    from inferasim.catalog.engines import VLLM_ITL_BUCKETS
    from inferasim.observe import quantile_bound

    assert quantile_bound("vllm", "itl", 0.013 * 1.25) == 0.025
    assert quantile_bound("vllm", "itl", 0.025) == 0.025  # a bound itself
    assert quantile_bound("sglang", "itl", 0.013) == 0.015
    assert quantile_bound("vllm", "ttft", 1e4) == 1e4  # past the last bucket
    assert quantile_bound("atom", "itl", 0.02) == 0.02  # no histogram
    with pytest.raises(ValueError, match="positive"):
        quantile_bound("vllm", "itl", 0.0)

    # What Prometheus' histogram_quantile reads back: cumulative `le` counts, linear inside the bucket.
    def read_back(values: list[float], q: float = 0.9) -> float:
        bounds = np.array(VLLM_ITL_BUCKETS)
        counts = np.array([np.sum(np.array(values) <= b) for b in bounds], dtype=float)
        rank = q * len(values)
        i = int(np.searchsorted(counts, rank))
        lo, below = (0.0, 0.0) if i == 0 else (bounds[i - 1], counts[i - 1])
        return float(lo + (bounds[i] - lo) * (rank - below) / (counts[i] - below))

    steady = [0.013] * 100  # exactly as predicted: 13 ms
    assert read_back(steady) > 0.013 * 1.25  # a naive check would fail it ...
    assert read_back(steady) <= quantile_bound("vllm", "itl", 0.013 * 1.25)  # ... the bound does not
    slow = [0.03] * 100  # a bucket beyond: caught
    assert read_back(slow) > quantile_bound("vllm", "itl", 0.013 * 1.25)


def test_quantile_agrees_at_the_histograms_resolution() -> None:
    from inferasim.observe import quantile_agrees

    # vLLM ITL buckets ... 0.01, 0.025, 0.05 ...: a true 13 ms p90 reads back anywhere in (10, 25] ms.
    assert quantile_agrees("vllm", "itl", 0.0235, 0.013, 0.25)
    assert quantile_agrees("vllm", "itl", 0.0101, 0.013, 0.25)
    assert not quantile_agrees("vllm", "itl", 0.030, 0.013, 0.25)  # a bucket above
    assert not quantile_agrees("sglang", "itl", 0.0235, 0.013, 0.25)  # SGLang's finer buckets: 20-25 ms is out
    assert quantile_agrees("sglang", "itl", 0.0145, 0.013, 0.25)
    assert not quantile_agrees("sglang", "itl", 0.0075, 0.013, 0.25)  # below 0.75 x 13 ms = 9.75 -> floor 8 ms
    assert quantile_agrees("atom", "itl", 0.0125, 0.013, 0.25) and not quantile_agrees("atom", "itl", 0.02, 0.013, 0.25)
    with pytest.raises(ValueError):
        quantile_agrees("vllm", "itl", 0.01, 0.0, 0.25)


def test_an_empty_prometheus_url_says_where_the_default_comes_from() -> None:
    from inferasim.observe import PrometheusClient

    with pytest.raises(ObservationError, match=r"workload\.prometheus\.url is empty.*prometheus\.url"):
        PrometheusClient("")
