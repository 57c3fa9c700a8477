"""Passive anchors from live windows: recovery of a known model, refusal without load spread."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchors import KernelSet
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.model.steptime import StepParams
from inferasim.passive import NotIdentifiable, Window, fit_passive

MODEL, GPU_NAME = "meta-llama/Meta-Llama-3.1-8B", "H100"
TRUTH = StepParams(t_fixed=6e-3, t_seq=4e-5, e_bw=0.7, e_kv=0.45, e_flops=0.5, e_attn=0.35, burst=0.0, t_ttft=0.06)


def windows(loads: list[float], layout: Layout, seed: int = 0) -> list[Window]:
    model, gpu = get_model(MODEL), get_gpu(GPU_NAME)
    cost = layout_cost(model, gpu, layout, "bf16")
    sched = engine_sched("vllm", model, gpu, layout, "bf16")
    rng = np.random.default_rng(seed)
    out = []
    for i, load in enumerate(loads):
        isl, osl = float(rng.integers(800, 1600)), float(rng.integers(200, 400))
        r = closed_loop(TRUTH, cost, sched, np.array([isl]), np.array([osl]), np.array([load]))
        noise = rng.normal(0, 0.02, 2)
        out.append(Window(start=60.0 * i, end=60.0 * (i + 1), in_flight=load, prompt_tokens=isl,
                          output_tokens=osl, itl_s=float(r.tpot[0]) * np.exp(noise[0]),
                          ttft_s=float(r.ttft[0]) * np.exp(noise[1]), requests=100))
    return out


def ks() -> KernelSet:
    return KernelSet(engine="vllm", engine_version="0.19.0", model=MODEL, gpu=GPU_NAME, precision="bf16")


def test_passive_fit_recovers_the_model_and_transfers() -> None:
    layout = Layout(tp=2)
    anchor = fit_passive(ks(), get_model(MODEL), get_gpu(GPU_NAME), layout, windows([2, 6, 16, 40, 90], layout),
                         source="prometheus://test", queries=["sum(vllm:num_requests_running)"])
    assert anchor.provenance.method == "passive" and anchor.fit.rms_log_error < 0.05
    fitted = fitted_from_anchor(anchor)
    # Predict tp4 and compare with the truth there.
    model, gpu = get_model(MODEL), get_gpu(GPU_NAME)
    tp4 = Layout(tp=4)
    truth = closed_loop(TRUTH, layout_cost(model, gpu, tp4, "bf16"), engine_sched("vllm", model, gpu, tp4, "bf16"),
                        np.array([1024.0]), np.array([256.0]), np.array([32.0]))
    pred = fitted.predict_layout(tp4, 1024, 256, 32)
    assert pred["tpot"] == pytest.approx(float(truth.tpot[0]), rel=0.12)
    assert pred["ttft"] == pytest.approx(float(truth.ttft[0]), rel=0.3)


def test_no_load_spread_is_refused_with_what_is_missing() -> None:
    layout = Layout(tp=2)
    with pytest.raises(NotIdentifiable, match="spread in batch"):
        fit_passive(ks(), get_model(MODEL), get_gpu(GPU_NAME), layout, windows([10, 11, 12, 12.5], layout), "x")
    with pytest.raises(NotIdentifiable, match="usable windows"):
        few = [replace(w, requests=3) for w in windows([2, 20, 80], layout)]
        fit_passive(ks(), get_model(MODEL), get_gpu(GPU_NAME), layout, few, "x")


def test_one_prompt_length_keeps_the_prefill_defaults_and_says_so() -> None:
    """At one prompt length, prefill time and the per-request TTFT overhead are one number: the
    prefill efficiencies stay at the GPU family's defaults and the anchor names what is missing;
    with prompt lengths that vary, they are fitted."""
    from inferasim.model.steptime import default_params

    layout = Layout(tp=2)
    same = [replace(w, prompt_tokens=1000.0) for w in windows([2, 6, 16, 40, 90], layout)]
    prior = default_params(get_gpu(GPU_NAME), "vllm")
    a = fit_passive(ks(), get_model(MODEL), get_gpu(GPU_NAME), layout, same, "x")
    assert a.params["e_flops"] == pytest.approx(prior.e_flops) and a.params["e_attn"] == pytest.approx(prior.e_attn)
    assert "prefill efficiency (e_flops, e_attn) not identified" in a.provenance.notes
    assert "not identified" in a.fit.message
    varied = fit_passive(ks(), get_model(MODEL), get_gpu(GPU_NAME), layout, windows([2, 6, 16, 40, 90], layout), "x")
    assert "not identified" not in varied.provenance.notes
    assert varied.params["e_flops"] != pytest.approx(prior.e_flops)
