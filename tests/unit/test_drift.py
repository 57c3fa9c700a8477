"""drift.prediction_error with known answers: observed = predicted -> 0; observed twice as slow -> +100%."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.deployment import kernel_set_of
from inferasim.drift import PredictionError, prediction_error
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import BenchPoint, KernelSet, LayoutModel
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steptime import StepParams
from inferasim.observed import LatencyQuantiles, ObservedWorkload
from inferasim.passive import Window

CFG = ServingConfig(engine="vllm", model="meta-llama/Meta-Llama-3.1-8B", gpu="H100", layout=Layout(tp=2),
                    replicas=2, precision="bf16", engine_version="0.10.1")
PARAMS = StepParams(t_fixed=6e-3, t_seq=4e-5, e_bw=0.7, e_kv=0.45, e_flops=0.5, e_attn=0.35, burst=0.0, t_ttft=0.06)


def store(tmp_path: Path, method: str = "harvest") -> AnchorStore:
    from inferasim.model.anchors import Anchor, Provenance

    s = AnchorStore(tmp_path)
    s.save(Anchor(kernel_set=kernel_set_of(CFG), layout=LayoutModel.from_layout(Layout(tp=1)),
                  points=[BenchPoint(isl=1000, osl=200, concurrency=4, tpot_ms=8.0)], params=PARAMS.as_dict(),
                  provenance=Provenance(method=method, source="test")))  # type: ignore[arg-type]
    return s


def window(in_flight: float, ttft_s: float, itl_s: float, rate: float) -> Window:
    return Window(start=0.0, end=60.0, in_flight=in_flight, prompt_tokens=1000, output_tokens=200, itl_s=itl_s,
                  ttft_s=ttft_s, requests=rate * 60.0)


def test_observed_equal_to_predicted_is_zero_and_twice_as_slow_is_100_percent(tmp_path: Path) -> None:
    s = store(tmp_path)
    probe = prediction_error(CFG, window(16, 0.1, 0.01, 1.0), s)
    p = probe.predicted
    assert probe.concurrency == 8  # 16 in flight over 2 replicas
    e2e = (p["ttft"] + 199 * p["itl"]) / 1e3
    rate = 16 / e2e  # Little's law: the rate these latencies give at 16 in flight
    same = prediction_error(CFG, window(16, p["ttft"] / 1e3, p["itl"] / 1e3, rate), s)
    assert same.relative == pytest.approx({"ttft": 0.0, "itl": 0.0, "throughput": 0.0}, abs=1e-9)
    assert not same.exceeds(0.01) and same.worst() == pytest.approx(0.0, abs=1e-9)
    slow = prediction_error(CFG, window(16, 2 * p["ttft"] / 1e3, 2 * p["itl"] / 1e3, rate / 2), s)
    assert slow.relative == pytest.approx({"ttft": 1.0, "itl": 1.0, "throughput": -0.5})
    assert slow.exceeds(0.5) and not slow.exceeds(1.5)
    assert slow.as_dict()["worst"] == pytest.approx(1.0)


def test_a_fitted_anchor_and_an_instant_observation_work_too(tmp_path: Path) -> None:
    fitted = fitted_from_anchor(store(tmp_path).all()[0])
    probe = prediction_error(CFG, window(4, 0.1, 0.01, 1.0), fitted)
    obs = ObservedWorkload(engine="vllm", window="5m", observed_at=0.0, request_rate=1.0, prompt_tokens_mean=1000,
                           output_tokens_mean=200, prefix_hit_rate=None, running=3, waiting=1,
                           ttft=LatencyQuantiles(p50_ms=probe.predicted["ttft"] * 3),
                           itl=LatencyQuantiles(p50_ms=probe.predicted["itl"]))
    e = prediction_error(CFG, obs, fitted)
    assert isinstance(e, PredictionError) and e.concurrency == 2
    assert e.relative["ttft"] == pytest.approx(2.0) and e.relative["itl"] == pytest.approx(0.0, abs=1e-9)


def test_nothing_to_compare_and_bad_threshold(tmp_path: Path) -> None:
    s = store(tmp_path)
    with pytest.raises(ValueError, match="nothing to compare"):
        prediction_error(CFG, window(0, 0.1, 0.01, 1.0), s)
    with pytest.raises(ValueError, match="threshold"):
        prediction_error(CFG, window(4, 0.1, 0.01, 1.0), s).exceeds(0)


def test_store_lookup_is_by_the_configuration_kernel_set(tmp_path: Path) -> None:
    from inferasim.model.anchor_store import NoCompatibleAnchor

    other = ServingConfig(engine="vllm", model="meta-llama/Meta-Llama-3.1-8B", gpu="H100", layout=Layout(tp=2),
                          precision="bf16", engine_version="0.11.0")
    assert kernel_set_of(other) != kernel_set_of(CFG) and isinstance(kernel_set_of(CFG), KernelSet)
    with pytest.raises(NoCompatibleAnchor):
        prediction_error(other, window(4, 0.1, 0.01, 1.0), store(tmp_path))
