"""inferasim.observe.observe_windows against a scripted Prometheus range API (httpx.MockTransport):
the exact PromQL per step, the arithmetic of a Window, steps without finished requests, old metric
names, missing series and ATOM's refusal."""

from __future__ import annotations

import httpx
import pytest

from inferasim.observe import ObservationError, observe_windows, parse_duration, range_queries

URL = "http://prometheus.test:9090"
SEL = {"namespace": "llm"}
S = '{namespace="llm"}'
T0, STEP = 1_700_000_000.0, 60.0


def matrix(values: dict[float, float] | None) -> dict:
    result = [] if values is None else [{"metric": {}, "values": [[ts, str(v)] for ts, v in values.items()]}]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def transport(answers: dict[str, dict[float, float]], seen: list[dict[str, str]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/query":  # engine detection
            q = request.url.params["query"]
            hit = "vllm:" in q and "vllm" in " ".join(answers)
            sg = "sglang:" in q and "sglang" in " ".join(answers)
            res = [{"metric": {}, "value": [T0, "5"]}] if hit or sg else []
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": res}})
        assert request.url.path == "/api/v1/query_range"
        seen.append(dict(request.url.params))
        return httpx.Response(200, json=matrix(answers.get(request.url.params["query"])))

    return httpx.MockTransport(handler)


def ts(i: int) -> float:
    return T0 + STEP * i


def test_vllm_windows_per_step() -> None:
    q = range_queries("vllm", SEL, STEP)
    assert q["requests"] == (f"sum(increase(vllm:request_success_total{S}[60s]))",)
    assert q["itl"][0] == (f"sum(increase(vllm:inter_token_latency_seconds_sum{S}[60s])) / "
                           f"sum(increase(vllm:inter_token_latency_seconds_count{S}[60s]))")
    steps = {ts(1): 0, ts(2): 1, ts(3): 2}
    answers = {
        q["requests"][0]: {ts(1): 0.0, ts(2): 30.0, ts(3): 90.0},
        q["prompt_tokens"][0]: {ts(1): float("nan"), ts(2): 1000.0, ts(3): 1200.0},
        q["output_tokens"][0]: {ts(1): float("nan"), ts(2): 200.0, ts(3): 250.0},
        q["running"][0]: {t: 4.0 * (1 + i) for t, i in steps.items()},
        q["waiting"][0]: {t: 0.5 for t in steps},
        q["ttft"][0]: {ts(2): 0.1, ts(3): 0.2},
        # only the pre-0.11 name has data: the alternative is used
        q["itl"][1]: {ts(2): 0.02, ts(3): 0.03},
    }
    seen: list[dict[str, str]] = []
    wins = observe_windows({"url": URL, "selector": SEL}, T0, ts(3), STEP, "vllm", transport=transport(answers, seen))
    # the idle first step (nothing finished) is left out
    assert [(w.start, w.end) for w in wins] == [(ts(1), ts(2)), (ts(2), ts(3))]
    w = wins[1]
    assert (w.in_flight, w.prompt_tokens, w.output_tokens, w.ttft_s, w.itl_s, w.requests) == (12.5, 1200.0, 250.0,
                                                                                              0.2, 0.03, 90.0)
    # every query spans the range from the end of the first step, one step apart
    assert {(s["start"], s["end"], s["step"]) for s in seen} == {(f"{ts(1):.3f}", f"{ts(3):.3f}", "60")}


def test_sglang_lengths_from_counters() -> None:
    q = range_queries("sglang", SEL, 30)
    assert q["prompt_tokens"] == (f"sum(increase(sglang:prompt_tokens_total{S}[30s])) / "
                                  f"sum(increase(sglang:num_requests_total{S}[30s]))",)
    assert q["running"] == (f"sum(avg_over_time(sglang:num_running_reqs{S}[30s]))",)


def test_missing_series_names_the_query() -> None:
    q = range_queries("vllm", SEL, STEP)
    answers = {q["requests"][0]: {ts(1): 5.0}}
    with pytest.raises(ObservationError) as err:
        observe_windows({"url": URL, "selector": SEL}, T0, ts(1), STEP, "vllm", transport=transport(answers, []))
    assert err.value.reason == "MissingSeries" and err.value.query == q["prompt_tokens"][0]


def test_atom_and_bad_ranges_are_refused() -> None:
    with pytest.raises(ObservationError, match="ATOM exports no TTFT") as err:
        range_queries("atom", SEL, STEP)
    assert err.value.reason == "Unsupported"
    with pytest.raises(ObservationError, match="shorter than one step"):
        observe_windows({"url": URL, "selector": SEL}, T0, T0 + 30, STEP, "vllm")
    with pytest.raises(ObservationError, match="at least 1s"):
        range_queries("vllm", SEL, 0.5)


def test_refused_range_query_is_an_observation_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "exceeded maximum"})

    with pytest.raises(ObservationError, match="bad_data") as err:
        observe_windows({"url": URL, "selector": SEL}, T0, ts(2), STEP, "vllm", transport=httpx.MockTransport(handler))
    assert err.value.reason == "QueryError" and "vllm:request_success_total" in err.value.query


def test_parse_duration() -> None:
    assert (parse_duration("1h"), parse_duration("1m30s"), parse_duration("500ms")) == (3600.0, 90.0, 0.5)
    with pytest.raises(ObservationError, match="--window: '1 hour'"):
        parse_duration("1 hour", "--window")
