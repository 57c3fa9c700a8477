"""Canary calibration: one operating point -> a step scale and the TTFT overhead on a parent anchor."""

from __future__ import annotations

import math
from dataclasses import replace

import httpx
import pytest

from inferasim.calibrate import CalibrationError, CanaryWindow, calibrate, measure_window, scale_params, window_point
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, BenchPoint, KernelSet, LayoutModel, Provenance
from inferasim.model.fit import FitPoint, predict_points
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import default_params
from inferasim.observed import ObservedWorkload

MODEL, GPU = "meta-llama/Meta-Llama-3-8B", "MI300X"
TP1 = Layout(tp=1)
KS = KernelSet(engine="vllm", model=MODEL, gpu=GPU, precision="bf16", kv_dtype="auto")


def parent_anchor(layout: Layout = TP1) -> Anchor:
    params = replace(default_params(get_gpu(GPU), "vllm"), t_fixed=5e-3, e_bw=0.6, t_ttft=0.05)
    return Anchor(kernel_set=KS, layout=LayoutModel.from_layout(layout), params=params.as_dict(),
                  points=[BenchPoint(isl=512, osl=128, concurrency=4, tpot_ms=10.0)],
                  provenance=Provenance(method="harvest", source="test"))


def synthetic_point(parent: Anchor, layout: Layout, scale: float, t_ttft: float, conc: int = 6, isl: int = 400,
                    osl: int = 64) -> BenchPoint:
    """The point a deployment `scale` times slower than the parent would show (by the step model)."""
    from inferasim.model.steptime import StepParams

    truth = replace(scale_params(replace(StepParams.from_dict(parent.params), burst=0.0), scale), t_ttft=t_ttft)
    model, gpu = get_model(MODEL), get_gpu(GPU)
    cost = layout_cost(model, gpu, layout, "bf16", "auto")
    sched = engine_sched("vllm", model, gpu, layout, "bf16", "", "auto")
    pred = predict_points(truth, cost, sched, [FitPoint(isl=isl, osl=osl, concurrency=conc)])
    return BenchPoint(isl=isl, osl=osl, concurrency=conc, tpot_ms=float(pred["tpot"][0]) * 1e3,
                      ttft_ms=float(pred["ttft"][0]) * 1e3, row_id="synthetic")


@pytest.mark.parametrize("scale", [1.37, 0.8])
def test_recovers_a_known_scale_exactly(scale: float) -> None:
    parent = parent_anchor(Layout(tp=1))
    layout = Layout(tp=2)  # the canary runs another layout: the parent is transferred to it
    point = synthetic_point(parent, layout, scale, t_ttft=0.08)
    cal = calibrate(KS, layout, [point], parent, source="test")
    assert cal.scale == pytest.approx(scale, rel=1e-6)
    assert cal.t_ttft_s == pytest.approx(0.08, rel=1e-5)
    assert cal.parent_id == parent.id
    a = cal.anchor
    assert a.provenance.method == "canary" and parent.id in a.provenance.notes
    assert a.layout.to_layout() == layout and a.points == [point]
    assert a.fit is not None and a.fit.converged and a.fit.rms_log_error < 1e-6
    assert a.params["t_fixed"] == pytest.approx(5e-3 * scale, rel=1e-6)
    # the parent's own error at this point is recorded: log(scale) too fast on ITL
    assert cal.before["tpot"] == pytest.approx(-math.log(scale), abs=1e-3)


def test_stored_anchor_predicts_the_measurement_through_the_store(tmp_path) -> None:
    parent = parent_anchor()
    point = synthetic_point(parent, Layout(tp=1), 1.2, t_ttft=0.06)
    cal = calibrate(KS, Layout(tp=1), [point], parent, source="test")
    store = AnchorStore(tmp_path)
    store.save(cal.anchor)
    found = AnchorStore(tmp_path).find(KS, Layout(tp=1))
    pred = fitted_from_anchor(found).predict_layout(Layout(tp=1), point.isl, point.osl, point.concurrency)
    assert pred["tpot"] * 1e3 == pytest.approx(point.tpot_ms, rel=1e-4)
    assert pred["ttft"] * 1e3 == pytest.approx(point.ttft_ms, rel=1e-4)


def test_without_parent_the_defaults_are_calibrated_and_it_says_so() -> None:
    parent = parent_anchor()
    point = synthetic_point(parent, Layout(tp=1), 1.0, t_ttft=0.05)
    cal = calibrate(KS, Layout(tp=1), [point], None, source="test")
    assert cal.parent_id is None and "no parent anchor" in cal.anchor.provenance.notes
    assert cal.anchor.fit is not None and cal.anchor.fit.rms_log_error < 1e-5


def test_itl_only_keeps_the_parent_ttft_overhead() -> None:
    parent = parent_anchor()
    point = synthetic_point(parent, Layout(tp=1), 1.5, t_ttft=0.05).model_copy(update={"ttft_ms": None})
    cal = calibrate(KS, Layout(tp=1), [point], parent, source="test")
    assert cal.scale == pytest.approx(1.5, rel=1e-6) and cal.t_ttft_s == pytest.approx(0.05)


def test_several_points_share_one_scale() -> None:
    parent = parent_anchor()
    pts = [synthetic_point(parent, Layout(tp=1), 1.25, 0.07, conc=c) for c in (2, 8)]
    cal = calibrate(KS, Layout(tp=1), pts, parent, source="test")
    assert cal.scale == pytest.approx(1.25, rel=1e-5) and len(cal.anchor.points) == 2


@pytest.mark.parametrize("itl,ttft,words", [
    (None, 0.1, "inter-token latency was not measured"),
    (0.0, 0.1, "inter-token latency must be a positive"),
    (-0.01, 0.1, "inter-token latency must be a positive"),
    (float("nan"), 0.1, "inter-token latency must be a positive"),
    (0.01, 0.0, "time to first token must be a positive"),
    (0.01, -1.0, "time to first token must be a positive"),
])
def test_garbage_latencies_are_refused(itl: float | None, ttft: float | None, words: str) -> None:
    w = CanaryWindow(in_flight=4, prompt_tokens=400, output_tokens=64, itl_s=itl, ttft_s=ttft)
    with pytest.raises(CalibrationError, match=words):
        window_point(w)


def test_garbage_load_is_refused() -> None:
    for bad in (-1.0, float("nan"), None):
        with pytest.raises(CalibrationError, match="requests in flight"):
            window_point(CanaryWindow(in_flight=bad, prompt_tokens=400, output_tokens=64, itl_s=0.01,  # type: ignore[arg-type]
                                      ttft_s=0.1))
    # an engine that looked idle at every scrape but produced tokens: one request at a time
    idle = window_point(CanaryWindow(in_flight=0.0, prompt_tokens=400, output_tokens=64, itl_s=0.01, ttft_s=0.1))
    assert idle.concurrency == 1
    with pytest.raises(CalibrationError, match="output length"):
        window_point(CanaryWindow(in_flight=2, prompt_tokens=400, output_tokens=1, itl_s=0.01, ttft_s=0.1))


def test_calibrate_refuses_bad_points_and_other_kernels() -> None:
    with pytest.raises(CalibrationError, match="no canary point"):
        calibrate(KS, Layout(tp=1), [], None, source="t")
    offline = BenchPoint(isl=10, osl=10, concurrency=1, scenario="offline", batch_latency_s=1.0)
    with pytest.raises(CalibrationError, match="closed-loop"):
        calibrate(KS, Layout(tp=1), [offline], None, source="t")
    other = parent_anchor().model_copy(update={"kernel_set": KS.model_copy(update={"precision": "fp8"})})
    ok = BenchPoint(isl=400, osl=64, concurrency=4, tpot_ms=10.0)
    with pytest.raises(CalibrationError, match="other kernels"):
        calibrate(KS, Layout(tp=1), [ok], other, source="t")
    # 1000x slower than any step model of these kernels: not a scale to store
    absurd = BenchPoint(isl=400, osl=64, concurrency=4, tpot_ms=1e5)
    with pytest.raises(CalibrationError, match="step scale outside"):
        calibrate(KS, Layout(tp=1), [absurd], parent_anchor(), source="t")


def test_measure_window_reads_means_from_prometheus() -> None:
    answers = {"inter_token_latency_seconds_sum": 0.012, "time_to_first_token_seconds_sum": 0.2,
               "num_requests_running": 3.5, "num_requests_waiting": 0.5}
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        q = request.url.params["query"]
        seen.append(q)
        value = next((v for k, v in answers.items() if k in q), None)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    obs = ObservedWorkload(engine="vllm", window="30s", selector={"deployment": "c"}, observed_at=100.0,
                           request_rate=1.0, prompt_tokens_mean=400, output_tokens_mean=64, prefix_hit_rate=None,
                           running=3, waiting=0)
    w = measure_window(obs, "http://prom:9090", transport=httpx.MockTransport(handler))
    assert (w.itl_s, w.ttft_s, w.in_flight) == (0.012, 0.2, 4.0)
    assert all('deployment="c"' in q for q in seen) and len(w.queries) == 4
    atom = obs.model_copy(update={"engine": "atom"})
    with pytest.raises(CalibrationError, match="no latency histograms"):
        measure_window(atom, "http://prom:9090", transport=httpx.MockTransport(handler))
    answers.pop("inter_token_latency_seconds_sum")
    with pytest.raises(CalibrationError, match="mean itl: no data"):
        measure_window(obs, "http://prom:9090", transport=httpx.MockTransport(handler))
