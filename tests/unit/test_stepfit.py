"""Step-time fit to isolated steps (model.stepfit), on synthetic steps and on the measured H200 steps."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchors import StepPoint
from inferasim.model.layoutcost import layout_cost
from inferasim.model.stepfit import (
    GPU_TERMS,
    engine_params_from_steps,
    fit_steps,
    identifiable,
    predict_steps,
)
from inferasim.model.steptime import default_params, roofline_floor

MEASURED = Path(__file__).parents[2] / "benchmarks" / "measured" / "h200-torchstep-tp1.json"
GRID = [(b, c, 0) for b in (1, 8, 32, 128) for c in (512, 4096)] + [(0, 0, t) for t in (512, 2048, 8192)] + \
       [(16, 1024, 1024)]


def _cost(model: str = "meta-llama/Meta-Llama-3-8B", tp: int = 1):
    return layout_cost(get_model(model), get_gpu("h200"), Layout(tp=tp), "bf16", "auto", "vllm", "")


def _synthetic(params, cost) -> list[StepPoint]:
    blank = [StepPoint(n_decode=b, decode_context=c, n_prefill_tokens=t, step_ms=1.0) for b, c, t in GRID]
    ms = predict_steps(params, cost, blank) * 1e3
    return [s.model_copy(update={"step_ms": float(v)}) for s, v in zip(blank, ms, strict=True)]


def test_fit_recovers_the_parameters_that_made_the_steps() -> None:
    cost = _cost()
    prior = default_params(get_gpu("h200"), "vllm", "")
    truth = replace(prior, e_bw=0.9, e_kv=0.8, e_flops=0.7, t_fixed=2e-3)
    fit = fit_steps(cost, _synthetic(truth, cost), prior)
    assert fit.converged and fit.median_abs_error < 0.01
    # The priors pull a little; the terms the grid exercises come back within a few percent.
    assert fit.params.e_bw == pytest.approx(0.9, rel=0.05)
    assert fit.params.e_kv == pytest.approx(0.8, rel=0.05)
    assert fit.params.e_flops == pytest.approx(0.7, rel=0.05)


def test_steps_never_faster_than_the_roofline() -> None:
    cost = _cost()
    steps = _synthetic(default_params(get_gpu("h200"), "vllm", ""), cost)
    for s in steps:
        floor = float(roofline_floor(cost, s.n_decode, s.decode_context, s.n_prefill_tokens,
                                     s.prefill_context + s.n_prefill_tokens / 2))
        assert s.step_ms / 1e3 >= floor


def test_identifiable_leaves_unexercised_terms_at_the_prior() -> None:
    cost = _cost()
    decode_only = [StepPoint(n_decode=b, decode_context=1024, n_prefill_tokens=0, step_ms=5.0) for b in (1, 4)]
    names = identifiable(cost, decode_only)
    assert "e_attn" not in names and "m_tile" not in names and "e_bw" in names
    prefill_only = [StepPoint(n_decode=0, decode_context=0, n_prefill_tokens=t, step_ms=20.0) for t in (512, 1024)]
    assert "e_kv" not in identifiable(cost, prefill_only)
    with pytest.raises(ValueError, match="at least one"):
        fit_steps(cost, [], default_params(get_gpu("h200"), "vllm", ""))


def test_engine_params_take_gpu_terms_from_steps_and_host_terms_from_the_prior() -> None:
    cost = _cost()
    prior = default_params(get_gpu("h200"), "sglang", "")
    truth = replace(prior, e_bw=0.95, t_fixed=5e-3)
    params, fit = engine_params_from_steps(cost, _synthetic(truth, cost), prior)
    for name in GPU_TERMS:
        assert getattr(params, name) == getattr(fit.params, name)
    assert params.t_fixed == prior.t_fixed and params.t_seq == prior.t_seq and params.t_ttft == prior.t_ttft


@pytest.mark.skipif(not MEASURED.exists(), reason="measured H200 steps not in this checkout")
def test_measured_h200_steps_hold_out_of_sample() -> None:
    """Fit half of each model's measured steps, predict the other half: the step model's shape
    holds on a GPU no fit saw (H200 rows are absent from the dev data)."""
    data = json.loads(MEASURED.read_text())
    prior = default_params(get_gpu("h200"), "vllm", "")
    for entry in data["models"]:
        cost = _cost(entry["model"])
        steps = [StepPoint(**{k: s[k] for k in ("n_decode", "decode_context", "n_prefill_tokens", "prefill_context",
                                                "step_ms", "repeats", "std_ms")}) for s in entry["steps"]]
        errs = []
        rng = random.Random(1)
        for _ in range(4):
            idx = list(range(len(steps)))
            rng.shuffle(idx)
            fit = fit_steps(cost, [steps[i] for i in idx[::2]], prior)
            held = [steps[i] for i in idx[1::2]]
            pred = predict_steps(fit.params, cost, held)
            errs.append(np.median(np.abs(pred / (np.array([s.step_ms for s in held]) / 1e3) - 1)))
        assert float(np.median(errs)) < 0.15, entry["model"]
        # Efficiencies stay physical: the weight read below the measured copy bandwidth's share.
        full = fit_steps(cost, steps, prior)
        assert 0.5 < full.params.e_bw <= data["ceilings"]["copy_bytes_per_s"] / get_gpu("h200").hbm_bandwidth + 0.02
