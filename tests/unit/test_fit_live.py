"""live.fit_live: manifest + scripted Prometheus range API (httpx.MockTransport) -> passive anchor.

The range answers are the closed-loop model of known parameters, per replica x 2 replicas, so the
fit must divide the in-flight requests by the replicas to recover them."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.deployment import read_deployment
from inferasim.live import fit_live
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.model.steptime import StepParams
from inferasim.observe import range_queries
from inferasim.passive import NotIdentifiable
from inferasim.render import render_deployment

MODEL = "meta-llama/Meta-Llama-3.1-8B"
TRUTH = StepParams(t_fixed=6e-3, t_seq=4e-5, e_bw=0.7, e_kv=0.45, e_flops=0.5, e_attn=0.35, burst=0.0, t_ttft=0.06)
URL = "http://prometheus.test:9090"
SEL = {"namespace": "llm", "app": "chat"}
END, STEP = 1_700_003_600.0, 60.0
CFG = ServingConfig(engine="vllm", model=MODEL, gpu="H100", layout=Layout(tp=2), replicas=2, precision="bf16",
                    engine_version="0.10.1")


def scripted(loads: list[float], requests: float = 200.0) -> httpx.MockTransport:
    """Per step i: `loads[i]` requests in flight per replica, the truth's TTFT and TPOT."""
    model, gpu = get_model(MODEL), get_gpu("H100")
    cost = layout_cost(model, gpu, CFG.layout, "bf16")
    sched = engine_sched("vllm", model, gpu, CFG.layout, "bf16")
    q = range_queries("vllm", SEL, STEP)
    n = len(loads)
    stamps = [END - STEP * (n - 1 - i) for i in range(n)]
    r = closed_loop(TRUTH, cost, sched, np.full(n, 1000.0), np.full(n, 200.0), np.array(loads))
    per_step = {
        q["requests"][0]: [requests] * n, q["prompt_tokens"][0]: [1000.0] * n, q["output_tokens"][0]: [200.0] * n,
        q["running"][0]: [2 * x for x in loads], q["waiting"][0]: [0.0] * n,
        q["ttft"][0]: list(r.ttft), q["itl"][0]: list(r.tpot),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        values = per_step.get(request.url.params["query"])
        result = [] if values is None else [{"metric": {}, "values": [[t, str(v)] for t, v in zip(stamps, values,
                                                                                                   strict=True)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})

    return httpx.MockTransport(handler)


def test_fit_live_recovers_the_model_per_replica() -> None:
    dep = render_deployment(CFG, "chat", "llm")
    loads = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    anchor = fit_live(dep, URL, SEL, window_s=STEP * len(loads), step_s=STEP, end=END, transport=scripted(loads))
    assert anchor.provenance.method == "passive"
    assert anchor.kernel_set == read_deployment(dep).kernel_set()
    assert [p.concurrency for p in anchor.points] == [1, 2, 4, 8, 16, 32]  # per replica
    assert URL in anchor.provenance.source and 'namespace="llm"' in anchor.provenance.source
    assert "sum(increase(vllm:request_success_total" in anchor.provenance.notes
    assert anchor.provenance.measured_at.endswith("Z") and "/" in anchor.provenance.measured_at
    assert anchor.provenance.engine_image == "vllm/vllm-openai:v0.10.1"
    fitted = fitted_from_anchor(anchor)
    pred = fitted.predict_layout(Layout(tp=2), 1000, 200, 24)
    model, gpu = get_model(MODEL), get_gpu("H100")
    truth = closed_loop(TRUTH, layout_cost(model, gpu, Layout(tp=2), "bf16"),
                        engine_sched("vllm", model, gpu, Layout(tp=2), "bf16"),
                        np.array([1000.0]), np.array([200.0]), np.array([24.0]))
    assert pred["tpot"] == pytest.approx(float(truth.tpot[0]), rel=0.05)


def test_fit_live_refuses_flat_load_and_quiet_windows() -> None:
    dep = render_deployment(CFG, "chat", "llm")
    with pytest.raises(NotIdentifiable, match="not enough spread in batch"):
        fit_live(dep, URL, SEL, window_s=STEP * 4, step_s=STEP, end=END, transport=scripted([8.0, 8.5, 9.0, 8.0]))
    with pytest.raises(NotIdentifiable, match="0 usable windows.*4 with fewer than 20 finished requests"):
        fit_live(dep, URL, SEL, window_s=STEP * 4, step_s=STEP, end=END,
                 transport=scripted([1.0, 4.0, 16.0, 32.0], requests=5.0))
