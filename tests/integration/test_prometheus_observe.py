"""inferasim.observe against a REAL Prometheus (Debian's `prometheus`), started here on a free
loopback port with a temp dir, scraping real HTTP endpoints: the emulator (vLLM and SGLang metric
names) and a plain prometheus_client server exposing vLLM-named series."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from inferasim_e2e_support import Load, Prometheus, running_prometheus  # noqa: E402

from inferasim.observe import ObservationError, observe  # noqa: E402

pytestmark = pytest.mark.integration
MODEL, GPU = "meta-llama/Meta-Llama-3-8B", "MI300X"


@pytest.fixture(scope="module")
def prom() -> Iterator[Prometheus]:
    with running_prometheus("inferasim-prom-it-") as p:
        yield p


def text_format_server(reg: object) -> ThreadingHTTPServer:
    """/metrics in the text format 0.0.4 whatever the Accept header: prometheus_client's own server
    answers Prometheus' OpenMetrics preference with `vllm_request_success_total` (colons escaped),
    while the engines (and the emulator) serve the text format with the colon names."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(reg)  # type: ignore[arg-type]
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def targets(prom: Prometheus) -> Iterator[dict[str, object]]:
    """Two emulators (vLLM, SGLang) under load and one prometheus_client exporter, all scraped."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from inferasim.emulator import EmulatorConfig, start_emulator

    vllm = start_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", speedup=20, precision="bf16"))
    sgl = start_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="sglang", speedup=20, precision="bf16"))
    loads = [Load(vllm.url, vllm.served_model_name, rate=8, prompt_tokens=300, max_tokens=50).start(),
             Load(sgl.url, sgl.served_model_name, rate=8, prompt_tokens=700, max_tokens=30).start()]
    # A hand-made exporter with vLLM's names and fixed, known values.
    reg = CollectorRegistry()
    success = Counter("vllm:request_success", "", ["model_name"], registry=reg)
    ptoks = Histogram("vllm:request_prompt_tokens", "", ["model_name"], buckets=(100, 1000, 10000), registry=reg)
    gtoks = Histogram("vllm:request_generation_tokens", "", ["model_name"], buckets=(10, 100, 1000), registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "", ["model_name"], registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "", ["model_name"], registry=reg)
    running = Gauge("vllm:num_requests_running", "", ["model_name"], registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "", ["model_name"], registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "", ["model_name"], buckets=(0.1, 1, 10), registry=reg)
    itl = Histogram("vllm:inter_token_latency_seconds", "", ["model_name"], buckets=(0.01, 0.1, 1), registry=reg)
    server = text_format_server(reg)
    port = server.server_address[1]
    running.labels("m").set(3)
    waiting.labels("m").set(0)
    stop = False

    def feed() -> None:
        while not stop:
            success.labels("m").inc(10)
            ptoks.labels("m").observe(500)
            gtoks.labels("m").observe(50)
            hits.labels("m").inc(25)
            queries.labels("m").inc(100)
            ttft.labels("m").observe(0.5)
            itl.labels("m").observe(0.05)
            time.sleep(0.1)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    prom.set_targets([
        {"targets": [vllm.url.removeprefix("http://")], "labels": {"namespace": "it", "deployment": "vllm-emu"}},
        {"targets": [sgl.url.removeprefix("http://")], "labels": {"namespace": "it", "deployment": "sglang-emu"}},
        {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "it", "deployment": "exporter"}},
    ])
    for d in ("vllm-emu", "exporter"):
        prom.wait_for_series(f'rate(vllm:request_success_total{{deployment="{d}"}}[20s]) > 0', timeout=60)
    prom.wait_for_series('rate(sglang:num_requests_total{deployment="sglang-emu"}[20s]) > 0', timeout=60)
    try:
        yield {"vllm": vllm, "sglang": sgl}
    finally:
        stop = True
        for load in loads:
            load.stop()
        vllm.stop()
        sgl.stop()
        server.shutdown()


def test_exporter_values_through_real_prometheus(prom: Prometheus, targets: dict[str, object]) -> None:
    w = observe({"url": prom.url, "selector": {"namespace": "it", "deployment": "exporter"}, "window": "20s"})
    assert w.engine == "vllm"
    assert w.request_rate > 1  # 10 per feed; how many feeds a loaded machine manages varies
    assert w.prompt_tokens_mean == pytest.approx(500) and w.output_tokens_mean == pytest.approx(50)
    assert w.prefix_hit_rate == pytest.approx(0.25)
    assert (w.running, w.waiting) == (3, 0)
    # every observation falls in one bucket: quantiles interpolate inside it
    assert w.prompt_tokens is not None and 100 <= (w.prompt_tokens.p50 or 0) <= 1000
    assert w.ttft is not None and 100 <= (w.ttft.p90_ms or 0) <= 1000
    assert w.itl is not None and 10 <= (w.itl.p99_ms or 0) <= 100
    assert any(u.startswith("kv_cache_usage") for u in w.unavailable)  # this exporter has no KV gauge


def test_emulated_vllm(prom: Prometheus, targets: dict[str, object]) -> None:
    w = observe({"url": prom.url, "selector": {"namespace": "it", "deployment": "vllm-emu"}, "window": "20s"})
    assert w.engine == "vllm" and w.request_rate > 0.2
    assert w.prompt_tokens_mean == pytest.approx(300, rel=0.02) and w.output_tokens_mean == pytest.approx(50, rel=0.02)
    assert w.kv_cache_usage is not None and w.ttft is not None and w.itl is not None
    s = w.to_static()
    assert s.request_rate == w.request_rate and s.input_tokens == 300


def test_emulated_sglang(prom: Prometheus, targets: dict[str, object]) -> None:
    w = observe({"url": prom.url, "selector": {"namespace": "it", "deployment": "sglang-emu"}, "window": "20s"})
    assert w.engine == "sglang" and w.request_rate > 0.2
    assert w.prompt_tokens_mean == pytest.approx(700, rel=0.02) and w.output_tokens_mean == pytest.approx(30, rel=0.02)
    assert w.ttft is not None and w.itl is not None


def test_missing_series_names_the_query(prom: Prometheus, targets: dict[str, object]) -> None:
    with pytest.raises(ObservationError) as err:
        observe({"url": prom.url, "selector": {"namespace": "it", "deployment": "nobody"}, "window": "20s"})
    assert err.value.reason == "MissingSeries" and 'deployment="nobody"' in err.value.query
    # the engine is known but the series are not there: the first quantity's query is named
    with pytest.raises(ObservationError) as err:
        observe({"url": prom.url, "selector": {"namespace": "it", "deployment": "sglang-emu"}, "window": "20s"},
                engine="vllm")
    assert err.value.reason == "MissingSeries" and err.value.query.startswith("sum(rate(vllm:request_success_total")


def test_bad_query_is_refused_by_prometheus(prom: Prometheus) -> None:
    from inferasim.observe import PrometheusClient

    with PrometheusClient(prom.url) as c, pytest.raises(ObservationError) as err:
        c.query("sum(rate(")
    assert err.value.reason == "QueryError" and "bad_data" in str(err.value)
