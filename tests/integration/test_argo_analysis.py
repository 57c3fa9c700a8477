"""The Argo Rollouts AnalysisTemplate the operator writes, evaluated the way Argo would: its PromQL
run on a REAL Prometheus scraping a REAL `inferasim emulate` process, its successCondition applied
to the result.

With the emulator at the predicted timing the analysis passes; with the emulator's fixed step cost
raised 4x (inter-token latency about doubled) it fails. The prediction is the emulator's own step
model, so "at the predicted timing" is exact up to Prometheus' bucket interpolation, which is what
the template's bucket-bound limits are for: vLLM's ITL buckets are 10, 25, 50 ms, so a true 13 ms
p90 reads back as up to 23.5 ms, and a naive limit of 13 ms x 1.25 would fail a correct prediction.
(Argo itself cannot run here; its successCondition language evaluates `result[0] <= X` as below.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from inferasim_e2e_support import PhasedLoad, Prometheus, running_prometheus  # noqa: E402

from inferasim.catalog.gpus import get_gpu  # noqa: E402
from inferasim.catalog.models import get_model  # noqa: E402
from inferasim.core.layout import Layout  # noqa: E402
from inferasim.core.spec import parse_spec  # noqa: E402
from inferasim.emulator import EmulatorConfig, EmulatorProcess, spawn_emulator  # noqa: E402
from inferasim.model.layoutcost import layout_cost  # noqa: E402
from inferasim.model.steptime import StepParams, step_time  # noqa: E402
from inferasim.observe import PrometheusClient  # noqa: E402

pytestmark = pytest.mark.integration

MODEL, GPU = "meta-llama/Llama-3.1-8B", "H100"
TRUTH = StepParams(t_fixed=6e-3, t_seq=3e-5, e_bw=0.65, e_kv=0.45, e_flops=0.45, e_attn=0.3, t_ttft=0.03)
SELECTOR = {"namespace": "it", "deployment": "argo"}
CLIENTS, ISL, OSL = 4, 512, 64
WINDOW = "6s"  # the template's rate() window: only the last few seconds of traffic


@pytest.fixture(scope="module")
def prom() -> Iterator[Prometheus]:
    with running_prometheus("inferasim-prom-argo-") as p:
        yield p


@pytest.fixture(scope="module")
def emu(prom: Prometheus) -> Iterator[EmulatorProcess]:
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", tp=1, speedup=5.0, params=TRUTH,
                                       precision="bf16")) as e:
        prom.set_targets([{"targets": [e.url.removeprefix("http://")], "labels": SELECTOR}])
        prom.wait_for_series('vllm:num_requests_running{deployment="argo"}', timeout=30)
        yield e


def predicted_itl_s() -> float:
    cost = layout_cost(get_model(MODEL), get_gpu(GPU), Layout(tp=1), "bf16", "auto")
    return float(step_time(TRUTH, cost, CLIENTS, ISL + OSL / 2))


def template(prom_url: str) -> dict[str, Any]:
    from inferasim_operator.passes import confirm

    spec = parse_spec({
        "model": MODEL, "precision": ["bf16"], "engines": ["vllm"],
        "hardware": {"gpu": GPU, "maxGPUs": 1},
        "target": {"name": "argo"},
        "workload": {"prometheus": {"url": prom_url, "selector": SELECTOR, "window": "1m"}},
        "confirmation": {"mode": "argo-rollouts", "window": WINDOW},
    })
    # The prediction: one decode step of CLIENTS sequences at the mean context, by the emulator's
    # own model (the decode steps are what the ITL histogram records).
    payload = {"recommendation": {"engine": "vllm", "predicted": {"itl_p90_ms": 1e3 * predicted_itl_s(),
                                                                  "ttft_p90_ms": None}}}
    body = {"apiVersion": "inferasim.io/v1alpha1", "kind": "ServingTuning",
            "metadata": {"name": "chat", "namespace": "it", "uid": "u-argo"}}
    return confirm.analysis_template(body, spec, payload)


def run_analysis(prom_url: str, tmpl: dict[str, Any]) -> list[tuple[str, float, float, bool]]:
    """Each metric: (name, result[0], limit, passed), as Argo's Prometheus provider would see it."""
    out = []
    with PrometheusClient(prom_url) as client:
        for m in tmpl["spec"]["metrics"]:
            assert m["provider"]["prometheus"]["address"] == prom_url
            result = client.query(m["provider"]["prometheus"]["query"])
            assert len(result) == 1, (m["name"], result)  # Argo reads result[0]
            value = float(result[0]["value"][1])
            cond = m["successCondition"]
            assert cond.startswith("result[0] <= "), cond
            limit = float(cond.removeprefix("result[0] <= "))
            out.append((m["name"], value, limit, value <= limit))
    return out


def load_for(emu: EmulatorProcess, seconds: float) -> None:
    load = PhasedLoad(emu.url, MODEL, [(CLIENTS, 1e9, ISL)], output_tokens=OSL).start()
    try:
        time.sleep(seconds)
    finally:
        load.stop()
    assert load.sent > 10 and load.errors == 0
    time.sleep(1.5)  # the last scrape


def test_analysis_passes_at_the_predicted_timing_and_fails_when_slower(prom: Prometheus,
                                                                       emu: EmulatorProcess) -> None:
    tmpl = template(prom.url)
    assert [m["name"] for m in tmpl["spec"]["metrics"]] == ["itl-p90"]
    load_for(emu, 8.0)
    ((name, value, limit, passed),) = run_analysis(prom.url, tmpl)
    pred_s = predicted_itl_s()
    print(f"\n  {name}: read back {value * 1e3:.2f} ms, predicted {pred_s * 1e3:.2f} ms, limit {limit * 1e3:.1f} ms")
    assert passed, (value, limit)
    # What the bucket-bound limit is for: the read-back p90 is above the naive limit.
    naive = pred_s * 1.25
    print(f"  naive limit (prediction x 1.25) {naive * 1e3:.2f} ms: {'fails' if value > naive else 'passes'}")
    assert value > naive  # every ~13 ms gap lands in the (10, 25] ms bucket: read back near 23.5 ms

    emu.set_params(replace(TRUTH, t_fixed=4 * TRUTH.t_fixed))
    try:
        load_for(emu, 8.0)
        ((_, slow, limit2, passed2),) = run_analysis(prom.url, tmpl)
    finally:
        emu.set_params(TRUTH)
    print(f"  after t_fixed x4: read back {slow * 1e3:.2f} ms, limit {limit2 * 1e3:.1f} ms")
    assert limit2 == limit and slow > value and not passed2
