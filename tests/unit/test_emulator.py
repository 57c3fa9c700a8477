"""The emulator's API, SSE format, usage counts, metrics and timing (in-process, 127.0.0.1 only).

Timing checks read the emulator's own histograms: they record emulated seconds from the virtual
clock, so they are exact whatever the host's scheduling noise; client-side timing (which carries
the host's latency) is checked in tests/integration.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferasim.cli.emulate import add_cli
from inferasim.emulator import EmulatorConfig, EmulatorHandle, start_emulator
from inferasim.emulator.api import merge_params
from inferasim.emulator.config import resolve
from inferasim.emulator.metrics import (
    SGLANG_E2E_BUCKETS,
    SGLANG_ITL_BUCKETS,
    SGLANG_TTFT_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
    BulkHistogram,
    request_token_buckets,
)
from inferasim.emulator.sinks import VOCAB
from inferasim.model.steptime import StepParams, step_time

MODEL = "meta-llama/Llama-3.1-8B"
PARAMS = StepParams(t_fixed=5e-3, t_seq=3e-5, e_bw=0.7, e_kv=0.5, e_flops=0.5, e_attn=0.35, t_ttft=0.03)
SPEEDUP = 50.0


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    h = start_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=2, speedup=SPEEDUP, params=PARAMS, seed=1))
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def client(emu: EmulatorHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emu.url, timeout=30.0) as c:
        yield c


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def sse_events(c: httpx.Client, path: str, body: dict[str, object]) -> list[str]:
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    assert text.endswith("\n\n")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events[:3]
    return [e[len("data: "):] for e in events]


# -- API basics -------------------------------------------------------------------------------------

def test_health_models_version(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 131072
    assert "version" in client.get("/version").json()


def test_completion_usage_counts_words_and_token_ids(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "one two  three\nfour", "max_tokens": 5,
                                             "ignore_eos": True})
    assert r.status_code == 200
    d = r.json()
    assert d["object"] == "text_completion" and d["model"] == MODEL
    assert d["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9, "prompt_tokens_details": None}
    (choice,) = d["choices"]
    assert choice["finish_reason"] == "length"
    words = choice["text"].split()
    assert len(words) == 5 and set(words) <= set(VOCAB)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(100, 137)), "max_tokens": 3,
                                             "ignore_eos": True})
    assert r.json()["usage"]["prompt_tokens"] == 37
    # A batch of prompts: one choice each, usage summed.
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": ["a b", "c d e"], "max_tokens": 2,
                                             "ignore_eos": True})
    d = r.json()
    assert [c["index"] for c in d["choices"]] == [0, 1]
    assert d["usage"]["prompt_tokens"] == 5 and d["usage"]["completion_tokens"] == 4


def test_default_max_tokens_and_natural_stop(client: httpx.Client) -> None:
    d = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "ignore_eos": True}).json()
    assert d["usage"]["completion_tokens"] == 16  # OpenAI / vLLM default for completions
    # Without ignore_eos the emulated model stops by itself, never beyond max_tokens.
    for _ in range(5):
        d = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 40,
                                                 "min_tokens": 3}).json()
        n = d["usage"]["completion_tokens"]
        assert 3 <= n <= 40
        assert d["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")
        assert len(d["choices"][0]["text"].split()) == n


def test_completion_stream_sse_format(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": [5] * 64, "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    events = sse_events(client, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 12  # one event per token, as vLLM streams them
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens[:-1])
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 64, "total_tokens": 76,
                                                         "completion_tokens": 12}
    text = "".join(c["choices"][0]["text"] for c in tokens)
    assert len(text.split()) == 12
    # Without include_usage: no usage event.
    events = sse_events(client, "/v1/completions", {**body, "stream_options": None})
    assert events[-1] == "[DONE]" and all("usage" not in json.loads(e) for e in events[:-1])


def test_chat_stream_and_non_stream(client: httpx.Client) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say three words"}]
    events = sse_events(client, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 6,
                                                         "ignore_eos": True, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert len(content) == 6 and all(content)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    d = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_completion_tokens": 4,
                                                  "ignore_eos": True}).json()
    assert d["object"] == "chat.completion"
    msg = d["choices"][0]["message"]
    assert msg["role"] == "assistant" and len(msg["content"].split()) == 4
    # 2 + 3 words + 5 template tokens per message + 5 fixed (documented approximation)
    assert d["usage"]["prompt_tokens"] == 5 + 2 * 5 + 5


# -- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", json.dumps({"model": "acme/none", "prompt": "hi"}).encode(), 404, "model"),
    ("/v1/completions", json.dumps({"model": MODEL}).encode(), 400, "prompt"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": ""}).encode(), 400, "prompt"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode(), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "n": 2}).encode(), 400, "n"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 200000}).encode(), 400,
     "max_tokens"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode(), 400, "messages"),
])
def test_errors_are_openai_shaped(client: httpx.Client, path: str, body: bytes, status: int,
                                  param: str | None) -> None:
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param and err["message"]
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    if status == 404:
        assert err["message"] == "The model `acme/none` does not exist."


def test_unknown_route_and_method(client: httpx.Client) -> None:
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "POST" in r.json()["error"]["message"]
    # The connection survives errors (keep-alive) and serves the next request.
    assert client.get("/health").status_code == 200


# -- metrics -----------------------------------------------------------------------------------------------

VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram", "vllm:iteration_tokens_total": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


def _le(fam: object, name: str) -> list[float]:
    return [float(s.labels["le"]) for s in fam.samples if s.name == f"{name}_bucket" and s.labels["le"] != "+Inf"]  # type: ignore[attr-defined]


def test_vllm_metric_names_types_labels_and_buckets(client: httpx.Client) -> None:
    client.post("/v1/completions", json={"model": MODEL, "prompt": "warm up", "max_tokens": 2, "ignore_eos": True})
    text = client.get("/metrics").text
    fams = families(text)
    for name, kind in VLLM_FAMILIES.items():
        assert name in fams, name
        assert fams[name].type == kind, (name, fams[name].type)  # type: ignore[attr-defined]
        for s in fams[name].samples:  # type: ignore[attr-defined]
            if s.name.endswith("_created"):
                continue
            assert s.labels["model_name"] == MODEL and s.labels["engine"] == "0", s
    # Exposed sample names: counters with _total (registered without it), histograms with _bucket.
    for needle in ("vllm:prompt_tokens_total{", "vllm:generation_tokens_total{", "vllm:prefix_cache_hits_total{",
                   'vllm:request_success_total{engine="0",finished_reason="length"',
                   "vllm:iteration_tokens_total_bucket{", "vllm:time_to_first_token_seconds_bucket{"):
        assert needle in text, needle
    assert _le(fams["vllm:time_to_first_token_seconds"], "vllm:time_to_first_token_seconds") == list(VLLM_TTFT_BUCKETS)
    assert _le(fams["vllm:inter_token_latency_seconds"], "vllm:inter_token_latency_seconds") == list(VLLM_ITL_BUCKETS)
    assert _le(fams["vllm:e2e_request_latency_seconds"], "vllm:e2e_request_latency_seconds") == \
        list(VLLM_REQUEST_LATENCY_BUCKETS)
    assert _le(fams["vllm:iteration_tokens_total"], "vllm:iteration_tokens_total")[:4] == [1.0, 8.0, 16.0, 32.0]
    assert request_token_buckets(32768)[-3:] == (5000.0, 10000.0, 20000.0)  # the notes' example


def test_counters_increase_by_exactly_the_tokens_served(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    prompts, outs = [7, 130, 512], [3, 9, 20]
    for p, o in zip(prompts, outs, strict=True):
        body = {"model": MODEL, "prompt": [11] * p, "max_tokens": o, "ignore_eos": True, "stream": True}
        sse_events(client, "/v1/completions", body)
    after = client.get("/metrics").text

    def delta(name: str, **labels: str) -> float:
        return sample_sum(after, name, **labels) - sample_sum(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == sum(prompts)
    assert delta("vllm:generation_tokens_total") == sum(outs)
    assert delta("vllm:prefix_cache_queries_total") == sum(prompts)
    assert delta("vllm:prefix_cache_hits_total") == 0
    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:request_prompt_tokens_sum") == sum(prompts)
    assert delta("vllm:request_generation_tokens_sum") == sum(outs)
    assert delta("vllm:inter_token_latency_seconds_count") == sum(o - 1 for o in outs)
    # Every generated token passes through one engine step's token count; so do the prompts.
    assert delta("vllm:iteration_tokens_total_sum") == sum(outs) + sum(prompts)
    assert sample_sum(after, "vllm:num_requests_running") == 0


def test_histograms_record_emulated_step_times(emu: EmulatorHandle, client: httpx.Client) -> None:
    """One request alone: every inter-token gap is one decode step of batch 1, TTFT is t_ttft plus
    one prefill step, all in emulated seconds (the virtual clock), whatever the host's latency."""
    before = client.get("/metrics").text
    isl, osl = 256, 40
    client.post("/v1/completions", json={"model": MODEL, "prompt": [3] * isl, "max_tokens": osl, "ignore_eos": True})
    after = client.get("/metrics").text

    def mean(name: str) -> float:
        s = sample_sum(after, f"{name}_sum") - sample_sum(before, f"{name}_sum")
        n = sample_sum(after, f"{name}_count") - sample_sum(before, f"{name}_count")
        return s / n

    cost = emu.resolved.cost
    steps = [float(step_time(PARAMS, cost, 1, isl + k)) for k in range(1, osl)]
    assert mean("vllm:inter_token_latency_seconds") == pytest.approx(np.mean(steps), rel=1e-6)
    prefill = float(step_time(PARAMS, cost, 0, 0.0, isl, isl / 2.0))
    assert mean("vllm:time_to_first_token_seconds") == pytest.approx(PARAMS.t_ttft + prefill, rel=1e-6)
    assert mean("vllm:e2e_request_latency_seconds") == pytest.approx(PARAMS.t_ttft + prefill + sum(steps), rel=1e-6)


def test_speedup_divides_real_time(client: httpx.Client) -> None:
    t0 = time.perf_counter()
    client.post("/v1/completions", json={"model": MODEL, "prompt": [3] * 64, "max_tokens": 200, "ignore_eos": True})
    real = time.perf_counter() - t0
    emulated = 0.03 + 200 * 0.0064  # t_ttft + ~200 steps of ~6.4 ms at batch 1 on tp2
    assert real < emulated / SPEEDUP * 3 + 0.05
    assert real > emulated / SPEEDUP * 0.8


def test_concurrent_requests_batch_together(emu: EmulatorHandle, client: httpx.Client) -> None:
    """Eight streams at once share decode steps: the mean inter-token gap is the batch-8 step."""
    import concurrent.futures as cf

    before = client.get("/metrics").text

    def one(_: int) -> int:
        with httpx.Client(base_url=emu.url, timeout=30.0) as c:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": [9] * 128, "max_tokens": 64,
                                                "ignore_eos": True})
            return int(r.json()["usage"]["completion_tokens"])

    with cf.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(one, range(8))) == 8 * 64
    after = client.get("/metrics").text
    itl = (sample_sum(after, "vllm:inter_token_latency_seconds_sum") -
           sample_sum(before, "vllm:inter_token_latency_seconds_sum")) / \
        (sample_sum(after, "vllm:inter_token_latency_seconds_count") -
         sample_sum(before, "vllm:inter_token_latency_seconds_count"))
    one_alone = float(step_time(PARAMS, emu.resolved.cost, 1, 160))
    eight = float(step_time(PARAMS, emu.resolved.cost, 8, 160))
    # Arrivals over the host's thread start-up spread the batch a little: between the two.
    assert one_alone < itl <= eight * 1.25


def test_client_disconnect_aborts(emu: EmulatorHandle, client: httpx.Client) -> None:
    before = client.get("/metrics").text
    body = {"model": MODEL, "prompt": [1] * 32, "max_tokens": 100000 // 100, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=emu.url, timeout=30.0) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for _ in r.iter_bytes():
            break  # first chunk, then hang up
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        after = client.get("/metrics").text
        if sample_sum(after, "vllm:request_success_total", finished_reason="abort") > \
                sample_sum(before, "vllm:request_success_total", finished_reason="abort"):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the abandoned stream was never aborted")
    assert sample_sum(after, "vllm:num_requests_running") == 0
    assert emu.stats()["open_requests"] == 0


def test_params_hook_changes_timing(emu: EmulatorHandle, client: httpx.Client) -> None:
    got = client.get("/_inferasim/params").json()["params"]
    assert got["t_fixed"] == pytest.approx(PARAMS.t_fixed)
    r = client.post("/_inferasim/params", json={"t_fixed": 0.05})
    assert r.status_code == 200 and r.json()["params"]["t_fixed"] == 0.05
    before = client.get("/metrics").text
    client.post("/v1/completions", json={"model": MODEL, "prompt": [3] * 16, "max_tokens": 6, "ignore_eos": True})
    after = client.get("/metrics").text
    itl = (sample_sum(after, "vllm:inter_token_latency_seconds_sum") -
           sample_sum(before, "vllm:inter_token_latency_seconds_sum")) / 5
    assert itl == pytest.approx(float(step_time(emu.params, emu.resolved.cost, 1, 19)), rel=0.05)
    assert itl > 0.05
    for bad in ({"nope": 1}, {"e_bw": 1.5}, {"t_fixed": "x"}, {"t_fixed": -1}):
        r = client.post("/_inferasim/params", json=bad)
        assert r.status_code == 400, bad
    emu.set_params(PARAMS)  # the Python hook
    deadline = time.monotonic() + 5
    while emu.params != PARAMS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert emu.params == PARAMS


def test_merge_params_keeps_unchanged_fields() -> None:
    p = merge_params(PARAMS, {"e_bw": 0.6})
    assert p.e_bw == 0.6 and p.t_fixed == PARAMS.t_fixed


# -- SGLang flavour, dp ranks, config ----------------------------------------------------------------------

def test_sglang_metric_names_types_and_labels() -> None:
    with start_emulator(EmulatorConfig(model=MODEL, gpu="H100", engine="sglang", tp=1, speedup=SPEEDUP,
                                       params=PARAMS)) as h, httpx.Client(base_url=h.url, timeout=30.0) as c:
        assert c.get("/v1/models").json()["data"][0]["owned_by"] == "sglang"
        before = c.get("/metrics").text
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [2] * 50, "max_tokens": 7, "ignore_eos": True})
        assert r.status_code == 200
        text = c.get("/metrics").text
    fams = families(text)
    expected = {"sglang:num_running_reqs": "gauge", "sglang:num_queue_reqs": "gauge", "sglang:token_usage": "gauge",
                "sglang:prompt_tokens": "counter", "sglang:generation_tokens": "counter",
                "sglang:num_requests": "counter", "sglang:cached_tokens": "counter",
                "sglang:time_to_first_token_seconds": "histogram", "sglang:inter_token_latency_seconds": "histogram",
                "sglang:e2e_request_latency_seconds": "histogram"}
    for name, kind in expected.items():
        assert name in fams and fams[name].type == kind, name  # type: ignore[attr-defined]
    assert "vllm:" not in text
    for needle in ("sglang:prompt_tokens_total{", "sglang:num_requests_total{", "sglang:cached_tokens_total{"):
        assert needle in text
    running = [s for s in fams["sglang:num_running_reqs"].samples]  # type: ignore[attr-defined]
    assert running[0].labels == {"model_name": MODEL, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                                 "moe_ep_rank": "0"}
    assert _le(fams["sglang:time_to_first_token_seconds"], "sglang:time_to_first_token_seconds") == \
        list(SGLANG_TTFT_BUCKETS)
    assert _le(fams["sglang:inter_token_latency_seconds"], "sglang:inter_token_latency_seconds") == \
        list(SGLANG_ITL_BUCKETS)
    assert _le(fams["sglang:e2e_request_latency_seconds"], "sglang:e2e_request_latency_seconds") == \
        list(SGLANG_E2E_BUCKETS)
    # SGLang adds prompt and generation tokens at finish.
    for name, served in (("prompt_tokens", 50), ("generation_tokens", 7), ("num_requests", 1)):
        assert sample_sum(text, f"sglang:{name}_total") - sample_sum(before, f"sglang:{name}_total") == served


def test_dp_ranks_are_engine_label_values() -> None:
    with start_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=1, dp=2, speedup=SPEEDUP, params=PARAMS)) as h, \
            httpx.Client(base_url=h.url, timeout=30.0) as c:
        for _ in range(4):
            c.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 2, "ignore_eos": True})
        text = c.get("/metrics").text
    assert {s.labels["engine"] for s in families(text)["vllm:num_requests_running"].samples} == {"0", "1"}  # type: ignore[attr-defined]
    assert sample_sum(text, "vllm:generation_tokens_total") == 8
    assert sample_sum(text, "vllm:generation_tokens_total", engine="1") > 0  # both ranks served


def test_bulk_histogram_exposes_like_prometheus_client() -> None:
    values = [0.0005, 0.01, 0.0100001, 0.3, 2.5, 99.0, 5000.0]
    reg = CollectorRegistry()
    ref = Histogram("x_seconds", "doc", ["a"], buckets=VLLM_TTFT_BUCKETS, registry=reg)
    for v in values:
        ref.labels("1").observe(v)
    mine_reg = CollectorRegistry()
    mine = BulkHistogram("x_seconds", "doc", VLLM_TTFT_BUCKETS, ["a"], [["1"]])
    mine_reg.register(mine)
    mine.observe(0, values[:3])
    mine.observe(0, values[3:5], weights=1.0)
    for v in values[5:]:
        mine.observe_one(0, v)

    def lines(r: CollectorRegistry) -> list[str]:
        return [ln for ln in generate_latest(r).decode().splitlines() if not ln.startswith(("#", "x_seconds_created"))]

    assert lines(mine_reg) == lines(reg)


def test_config_errors_are_value_errors(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="unknown"):
        resolve(EmulatorConfig(model="acme/Nope-1B", gpu="H100"))
    with pytest.raises(ValueError):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", engine="trtllm"))
    with pytest.raises(ValueError, match="speedup"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", speedup=0))
    with pytest.raises(ValueError, match="moe_ep"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", tp=2, ep=3))
    with pytest.raises(ValueError, match="--max-model-len 10000000 exceeds .* context of 131072"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", max_model_len=10_000_000))


def test_layouts_the_engine_refuses_are_refused() -> None:
    # vLLM and SGLang assert that tp divides a GQA model's attention heads (32 for Llama-3.1-8B)
    # and fits its 8 KV heads; SGLang's MLA attention too (per attention-tp group: DP attention
    # is how it runs DeepSeek's 128 heads over 6 or 72 GPUs).
    refused = r"tp=3 does not divide the 32 attention heads.*; choose --tp among \[1, 2, 4, 8, 16, 32\]"
    for engine in ("vllm", "sglang"):
        with pytest.raises(ValueError, match=refused):
            resolve(EmulatorConfig(model=MODEL, gpu="H100", engine=engine, tp=3))
    with pytest.raises(ValueError, match=r"tp=6 does not divide the 128 attention heads \(SGLang runs such widths "
                                         r"with DP attention.*choose --tp among \[1, 2, 4, 8, 16, 32, 64\]"):
        resolve(EmulatorConfig(model="deepseek-ai/DeepSeek-R1", gpu="B300", engine="sglang", tp=6))
    with pytest.raises(ValueError, match="pp=33 exceeds the model's 32 layers"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", pp=33))


@pytest.mark.parametrize(("params", "field"), [
    ('{"t_fixed": -0.001}', "t_fixed"), ('{"e_bw": 1.5}', "e_bw"), ('{"e_kv": 0}', "e_kv"),
    ('{"t_ttft": "fast"}', "t_ttft"), ('{"kv_scale": 0}', "kv_scale"), ('{"t_seq": NaN}', "t_seq"),
])
def test_params_json_out_of_range_is_refused(params: str, field: str) -> None:
    from inferasim.cli.emulate import config_from_args

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["emulate", "--model", MODEL, "--gpu", "H100", "--params-json", params])
    with pytest.raises(ValueError, match=f"--params-json: {field}"):
        config_from_args(args)
    with pytest.raises(ValueError, match=f"step-time parameters: {field}"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", params=replace(PARAMS, **{field: -1.0})))


def test_add_cli_registers_emulate() -> None:
    from inferasim.cli.emulate import cmd_emulate, config_from_args

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["emulate", "--model", MODEL, "--gpu", "H100", "--engine", "sglang", "--tp", "2",
                              "--speedup", "20", "--params-json", '{"t_fixed": 0.004}', "--port", "0"])
    assert args.func is cmd_emulate
    cfg = config_from_args(args)
    assert cfg.engine == "sglang" and cfg.tp == 2 and cfg.speedup == 20 and cfg.params is not None
    assert cfg.params.t_fixed == 0.004
    args = parser.parse_args(["emulate", "--model", MODEL, "--gpu", "H100"])
    assert config_from_args(args).port == 8000  # vLLM's default port
    args = parser.parse_args(["emulate", "--model", MODEL, "--gpu", "H100", "--params-json", '{"bogus": 1}'])
    with pytest.raises(ValueError, match="bogus"):
        config_from_args(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["emulate", "--model", MODEL, "--gpu", "H100", "--speedup", "-1"])


def test_engine_crash_fails_requests_and_health() -> None:
    """An emulator bug must surface: open requests end with an error, /health answers 503."""
    with start_emulator(EmulatorConfig(model=MODEL, gpu="H100", speedup=SPEEDUP, params=PARAMS)) as h, \
            httpx.Client(base_url=h.url, timeout=30.0) as c:
        engine = h.emulator.engine

        def broken(*_: object) -> None:
            raise RuntimeError("injected")

        engine._commit_step = broken  # type: ignore[method-assign]
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x y", "max_tokens": 3, "ignore_eos": True})
        assert r.status_code in (500, 503) and "crashed" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 503
        assert "injected" in c.get("/health").json()["error"]["message"]
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 503
