"""Round trips: harvest an emulator with known step-time parameters, predict another layout from
the harvested anchor, and compare with a second emulator measured the same way; plus real
clients (httpx, the openai package when installed, a Prometheus server when on PATH) and the
256-stream load. Everything binds 127.0.0.1; every loop is bounded in count and time.

What is compared. The harvest fits the engine's own timing (`--timing server`: the TTFT and
end-to-end histograms at /metrics, which the emulator records in emulated seconds from its virtual
clock), and the second emulator is read the same way, so the comparison is exact whatever the
host's load. The client's view (what `vllm bench serve` reports, the harvest's default) also
carries the host's per-request latency (process wake-ups and socket calls: milliseconds on a small
shared VM, times the speedup in emulated time, and more when other work loads the host); it is
only sanity-checked (TPOT within 50%).

Tolerances and why:
- TPOT within 15% at every point: decode steps are what the step-time model transfers.
- TTFT within 30% at concurrency <= 4 and at the long-prompt point, within 60% at concurrency 16,
  where prompts arrive in waves: the analytic model's wave term describes their queueing only to
  about 35% of the simulator (tests/unit/test_des.py), and the host's jitter spreads the waves of
  a real-time run further (vLLM measured +38..+48% there, the prediction above the engine).
- Parameters: the batch-1 and batch-16 decode steps (what one layout's measurements identify)
  within 10%; t_fixed within a factor 1.5 and e_bw within +-0.2 of the truth (at one tp they trade
  against each other and the priors settle the split); t_ttft within +-50% (the TTFT the engine
  sees at concurrency 1 is t_ttft plus one prefill step, but the wave terms share the TTFT).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from inferasim_e2e_support import running_prometheus  # noqa: E402

from inferasim.catalog.gpus import get_gpu  # noqa: E402
from inferasim.core.layout import Layout
from inferasim.emulator import EmulatorConfig, EmulatorProcess, spawn_emulator, start_emulator
from inferasim.emulator.config import resolve
from inferasim.emulator.engine import MAX_LAG_REAL
from inferasim.harvest import HarvestConfig, PointResult, harvest, parse_plan
from inferasim.harvest.client import run_point, warm_up
from inferasim.harvest.plan import PlanPoint
from inferasim.harvest.rawhttp import RawConnection
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steptime import StepParams, default_params, step_time

pytestmark = pytest.mark.integration
MODEL = "meta-llama/Llama-3.1-8B"
SPEEDUP = 5.0
HARVEST_PLAN = "512x128@1,4,16;4096x64@4"
CHECK_POINTS = [PlanPoint(512, 128, 1, 12), PlanPoint(512, 128, 4, 12), PlanPoint(512, 128, 16, 48),
                PlanPoint(4096, 64, 4, 12)]


def true_params(engine: str) -> StepParams:
    # Away from the GPU-family defaults (the fit's priors) so that recovery is not free.
    return StepParams(t_fixed=6e-3, t_seq=3e-5, e_bw=0.65, e_kv=0.45, e_flops=0.45, e_attn=0.3,
                      t_ttft=0.03 if engine == "vllm" else 0.08)


def _sum(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def server_means(before: str, after: str, engine: str, osl: int) -> tuple[float, float]:
    """Mean TTFT and TPOT of the requests between two scrapes, from the emulator's histograms:
    TPOT = (mean e2e - mean TTFT) / (osl - 1) for fixed-length outputs."""
    prefix = "sglang:" if engine == "sglang" else "vllm:"

    def mean(name: str) -> float:
        full = f"{prefix}{name}"
        n = _sum(after, f"{full}_count") - _sum(before, f"{full}_count")
        return (_sum(after, f"{full}_sum") - _sum(before, f"{full}_sum")) / n

    ttft = mean("time_to_first_token_seconds")
    return ttft, (mean("e2e_request_latency_seconds") - ttft) / (osl - 1)


def measure(emu: EmulatorProcess, engine: str,
            points: list[PlanPoint]) -> list[tuple[PointResult, tuple[float, float]]]:
    async def go() -> list[tuple[PointResult, tuple[float, float]]]:
        async with httpx.AsyncClient(timeout=60.0) as client:
            await warm_up(client, emu.url, MODEL, np.random.default_rng(2))
            out = []
            for p in points:
                before = (await client.get(f"{emu.url}/metrics")).text
                r = await run_point(client, emu.url, MODEL, p, SPEEDUP, time.perf_counter() + 60.0,
                                    np.random.default_rng(1))
                assert r.ok, r.failures
                after = (await client.get(f"{emu.url}/metrics")).text
                out.append((r, server_means(before, after, engine, p.osl)))
            return out

    return asyncio.run(go())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_harvested_anchor_predicts_another_layout(engine: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    truth = true_params(engine)
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", engine=engine, tp=2, speedup=SPEEDUP,
                                       params=truth)) as emu:
        report = harvest(HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine=engine, tp=2,
                                       speedup=SPEEDUP, plan=parse_plan(HARVEST_PLAN), budget_s=40.0,
                                       timing="server"))
    assert report.exit_code == 0, report.message
    assert report.anchor is not None and report.fit is not None
    assert report.fit.rms_log_error < 0.25
    assert "client vs engine" in report.anchor.provenance.notes
    fitted = fitted_from_anchor(report.anchor)
    p = fitted.params

    # Parameters, loosely (see the module docstring).
    cost2 = layout_cost(fitted.model, fitted.gpu, Layout(tp=2), fitted.precision, fitted.kv_dtype)
    for batch in (1, 16):
        ratio = float(step_time(p, cost2, batch, 600.0) / step_time(truth, cost2, batch, 600.0))
        assert ratio == pytest.approx(1.0, abs=0.10), (batch, ratio)
    assert truth.t_fixed / 1.5 <= p.t_fixed <= truth.t_fixed * 1.5, p
    assert abs(p.e_bw - truth.e_bw) <= 0.2, p
    assert p.t_ttft == pytest.approx(truth.t_ttft, rel=0.5), p

    # Another layout: tp 4, measured on a second emulator with the same protocol.
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", engine=engine, tp=4, speedup=SPEEDUP,
                                       params=truth)) as emu4:
        measured = measure(emu4, engine, CHECK_POINTS)
    rows = []
    for res, (ttft_srv, tpot_srv) in measured:
        pt = res.point
        pred = fitted.predict_layout(Layout(tp=4), pt.isl, pt.osl, pt.concurrency)
        rows.append((pt.label(), pred["ttft"], ttft_srv, res.ttft_s(), pred["tpot"], tpot_srv, res.tpot_s()))
    report_lines = "\n".join(
        f"{r[0]}: TTFT predicted {1e3 * r[1]:.1f} ms, engine {1e3 * r[2]:.1f}, client {1e3 * r[3]:.1f}; "
        f"TPOT predicted {1e3 * r[4]:.2f} ms, engine {1e3 * r[5]:.2f}, client {1e3 * r[6]:.2f}" for r in rows)
    (tmp_path / "roundtrip.txt").write_text(report_lines)
    print(f"\n{engine} tp2 -> tp4 (fit rms log error {report.fit.rms_log_error:.3f}, params {p}):\n{report_lines}")
    for label, ttft_p, ttft_srv, _ttft_cli, tpot_p, tpot_srv, tpot_cli in rows:
        assert tpot_p == pytest.approx(tpot_srv, rel=0.15), report_lines
        assert tpot_p == pytest.approx(tpot_cli, rel=0.5), report_lines
        assert ttft_p == pytest.approx(ttft_srv, rel=0.6 if label.endswith("@c16") else 0.3), report_lines
    assert time.monotonic() - t0 < 60.0


# -- real clients -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emu_proc() -> Iterator[EmulatorProcess]:
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=1, speedup=20.0)) as h:
        yield h


def test_httpx_async_streaming_client(emu_proc: EmulatorProcess) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int]:
        body = {"model": MODEL, "prompt": f"request {i} " * 20, "max_tokens": 24, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        tokens, usage = 0, None
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line:
                    continue
                assert line.startswith("data: ")
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if obj["choices"]:
                    tokens += 1
                else:
                    usage = obj["usage"]
        assert usage is not None
        return tokens, usage["completion_tokens"]

    async def main() -> list[tuple[int, int]]:
        async with httpx.AsyncClient(base_url=emu_proc.url, timeout=30.0) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(16))), 60.0)

    assert asyncio.run(main()) == [(24, 24)] * 16


def test_openai_package_client(emu_proc: EmulatorProcess) -> None:
    import openai
    client = openai.OpenAI(base_url=emu_proc.url + "/v1", api_key="unused", timeout=30.0, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    out = client.completions.create(model=MODEL, prompt="hello there", max_tokens=5, extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == 2 and out.usage.completion_tokens == 5
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=7, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    content = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(content) == 7
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="acme/none", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)


def test_256_streams_at_speedup_20() -> None:
    """The load the issue asks the emulator to sustain: 256 concurrent streams at speedup 20.

    Sustaining means: every stream gets every token, the counters are exact, the engine's own
    inter-token latency is that of a batch of (up to) 256 decodes, and the emulated clock never
    slips (the loop never fell MAX_LAG_REAL behind its schedule). The clock checks apply when the
    host is not already loaded beyond its CPU count by other work: a stall of the whole process
    is then the host's. The client's timing is not asserted: with 256 streams from one Python
    process on a small host it measures the host (all streams get their first token in one step
    and their last in another, so 256 socket writes and reads land at both ends of every
    interval)."""
    conc, isl, osl, speedup = 256, 512, 256, 20.0
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=2, speedup=speedup)) as emu:
        payload = {"model": MODEL, "prompt": [7] * isl, "max_tokens": osl, "ignore_eos": True, "stream": True}
        tokens: list[int] = []

        async def stream(conn: RawConnection) -> None:
            n = 0
            async for chunk in conn.post_stream("/v1/completions", payload):
                n += chunk.count(b'"text":')
            conn.close()
            tokens.append(n)

        async def main() -> float:
            # Connections first, as a benchmark client warms its pool; then 256 requests at once.
            conns = [RawConnection(emu.url, 60.0) for _ in range(conc)]
            await asyncio.wait_for(asyncio.gather(*(c.connect() for c in conns)), 60.0)
            t = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(stream(c) for c in conns)), 60.0)
            return time.perf_counter() - t

        load_before = os.getloadavg()[0]

        wall = asyncio.run(main())
        stats = emu.stats()
        text = emu.metrics_text()
    assert tokens == [osl] * conc
    assert stats["open_requests"] == 0
    assert wall < 30.0
    # Real-time guarantees need the cores: on a host already loaded beyond its CPU count by other
    # work, a stall of the whole process is the host's, not the emulator's.
    if max(load_before, os.getloadavg()[0]) <= (os.cpu_count() or 1):
        assert stats["clock_slips"] == 0
        assert stats["max_lag_real_s"] < MAX_LAG_REAL
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    itl = {s.name: s.value for s in fams["vllm:inter_token_latency_seconds"].samples if not s.name.endswith("_bucket")}
    server_itl = itl["vllm:inter_token_latency_seconds_sum"] / itl["vllm:inter_token_latency_seconds_count"]
    assert sum(s.value for s in fams["vllm:generation_tokens"].samples if s.name.endswith("_total")) == conc * osl
    assert itl["vllm:inter_token_latency_seconds_count"] == conc * (osl - 1)
    cost = resolve(EmulatorConfig(model=MODEL, gpu="H100", tp=2)).cost
    params = default_params(get_gpu("H100"), "vllm")
    full = float(step_time(params, cost, conc, isl + osl / 2))
    alone = float(step_time(params, cost, 1, isl + osl / 2))
    # Arrivals spread over the host's connection set-up: between a lone decode and a full batch
    # (plus the prefill chunks riding in the first steps).
    assert alone < server_itl < full * 1.3


def test_prometheus_scrapes_the_emulator() -> None:
    """A real Prometheus (make test-deps installs it; the test skips without it, and fails under
    INFERASIM_REQUIRE_E2E=1) scrapes the emulator: the gauges carry the vLLM labels, the counter
    counts the tokens served, and PromQL's histogram_quantile reads the TTFT histogram."""
    with start_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=1, speedup=20.0)) as emu, \
            running_prometheus("inferasim-prom-emu-") as prom:
        r = httpx.post(emu.url + "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 9,
                                                          "ignore_eos": True}, timeout=30.0)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        prom.set_targets([{"targets": [f"127.0.0.1:{emu.port}"], "labels": {"job": "emulator"}}])
        found = prom.wait_for_series('vllm:num_requests_running{job="emulator"}')
        metric = found[0]["metric"]
        assert metric["model_name"] == MODEL and metric["engine"] == "0"
        tokens = prom.wait_for_series("sum(vllm:generation_tokens_total)")
        assert float(tokens[0]["value"][1]) == 9.0
        ttft = prom.wait_for_series("histogram_quantile(0.5, sum by (le) (vllm:time_to_first_token_seconds_bucket))")
        assert 0.0 < float(ttft[0]["value"][1]) < 1.0


def test_a_harvest_refuses_an_endpoint_of_another_engine() -> None:
    """A vLLM server measured as --engine sglang would file vLLM's kernels under SGLang's kernel set."""
    from inferasim.harvest.client import HarvestError, served_engine

    with start_emulator(EmulatorConfig(model=MODEL, gpu="H100", engine="vllm", speedup=SPEEDUP)) as emu:
        async def which() -> str | None:
            async with httpx.AsyncClient() as client:
                return await served_engine(client, emu.url)

        assert asyncio.run(which()) == "vllm"
        with pytest.raises(HarvestError, match="is a vllm server.*not --engine sglang: pass --engine vllm"):
            harvest(HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="sglang", speedup=SPEEDUP,
                                  plan=parse_plan("512x16@1"), budget_s=10.0))
