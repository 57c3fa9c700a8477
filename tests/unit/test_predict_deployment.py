"""model.deployment.predict_deployment: one deployment's prediction with 90% intervals, the one place
`inferasim predict` and the demo turn a fitted kernel set into numbers."""

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.errors import UserError
from inferasim.model.deployment import RequestTooLong, predict_deployment
from inferasim.model.predictor import unanchored


def _fitted():
    return unanchored("vllm", get_model("meta-llama/Llama-3.1-8B"), get_gpu("H100"), "bf16", Layout(tp=1))


def test_a_closed_loop_is_the_anchor_model_and_the_intervals_hold_it() -> None:
    fitted = _fitted()
    p = predict_deployment(fitted, Layout(tp=1), 1024, 256, concurrency=16, anchored=False)
    ref = fitted.predict_layout(Layout(tp=1), 1024, 256, 16)
    assert p.ttft_ms == pytest.approx(ref["ttft"] * 1e3) and p.tpot_ms == pytest.approx(ref["tpot"] * 1e3)
    assert p.throughput == pytest.approx(ref["throughput"])
    bands = ((p.ttft_ms, p.ttft_interval), (p.tpot_ms, p.tpot_interval), (p.throughput, p.throughput_interval))
    for value, band in bands:
        assert band is not None and band[0] < value < band[1]
    assert p.extrapolated and p.stable and p.gpus == 1
    # Two replicas share the clients: each runs half, the output rate per GPU is that of 8 clients.
    two = predict_deployment(fitted, Layout(tp=1), 1024, 256, concurrency=16, replicas=2, anchored=False)
    eight = predict_deployment(fitted, Layout(tp=1), 1024, 256, concurrency=8, anchored=False)
    assert two.throughput_per_gpu == pytest.approx(eight.throughput_per_gpu)


def test_a_rate_beyond_capacity_has_no_steady_ttft() -> None:
    fitted = _fitted()
    p = predict_deployment(fitted, Layout(tp=1), 1024, 256, request_rate=1e4, anchored=False)
    assert not p.stable and p.ttft_ms is None and p.ttft_interval is None
    assert p.capacity_request_rate is not None and 0 < p.capacity_request_rate < 1e4
    low = predict_deployment(fitted, Layout(tp=1), 1024, 256, request_rate=0.1, anchored=False)
    assert low.stable and low.capacity_request_rate is None


def test_bad_questions_are_refused() -> None:
    fitted = _fitted()
    with pytest.raises(RequestTooLong, match="tokens of KV cache"):
        predict_deployment(fitted, Layout(tp=1), 10_000_000, 256, concurrency=1)
    with pytest.raises(UserError, match="one of concurrency"):
        predict_deployment(fitted, Layout(tp=1), 1024, 256)
    with pytest.raises(UserError, match="one of concurrency"):
        predict_deployment(fitted, Layout(tp=1), 1024, 256, concurrency=1, request_rate=1.0)
