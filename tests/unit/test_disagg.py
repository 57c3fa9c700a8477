"""Disaggregated prefill/decode pools priced piece by piece (inferasim.model.disagg)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.disagg import decode_batch, disagg_point, kv_transfer_time
from inferasim.model.layoutcost import A2A_LATENCY, layout_cost
from inferasim.model.predictor import FittedAnchor, unanchored
from inferasim.model.steptime import step_time


def _deepseek(gpu: str = "gb200") -> FittedAnchor:
    return unanchored("sglang", get_model("deepseek-ai/DeepSeek-R1"), get_gpu(gpu), "fp8", Layout(), "0.5.8", "fp8")


def test_kv_transfer_grows_with_the_prompt_and_shrinks_with_the_link() -> None:
    model, gpu = get_model("deepseek-ai/DeepSeek-R1"), get_gpu("b200_sxm")
    short, long = kv_transfer_time(model, gpu, 1024), kv_transfer_time(model, gpu, 8192)
    assert long > short > gpu.scale_out.latency
    # Bytes over the link: eight times the prompt, about eight times the time beyond the latency.
    assert (long - gpu.scale_out.latency) == pytest.approx(8 * (short - gpu.scale_out.latency), rel=0.02)
    fast = dataclasses.replace(gpu, scale_out=dataclasses.replace(gpu.scale_out, bandwidth=4 * gpu.scale_out.bandwidth))
    assert kv_transfer_time(model, fast, 8192) < long
    # An FP8 cache sends one byte per element: half the bytes of a BF16 one.
    half = kv_transfer_time(model, gpu, 8192, 1.0)
    assert (half - gpu.scale_out.latency) == pytest.approx((long - gpu.scale_out.latency) / 2, rel=1e-6)
    # Inside one NVLink domain the KV moves over the scale-up link, far faster than the NIC.
    assert kv_transfer_time(model, gpu, 8192, same_domain=True) < long / 4


def test_decode_batch_is_littles_law_of_the_rate() -> None:
    grid = np.geomspace(1.0, 512.0, 48)
    t_grid = 0.01 + 1e-4 * grid  # a decode step of 10 ms plus 0.1 ms per sequence
    rate, osl = 2.0, 1024
    b, t = decode_batch(rate, osl, grid, t_grid, 512.0)
    assert b == pytest.approx(rate * (osl - 1) * t, rel=1e-3)
    assert t == pytest.approx(0.01 + 1e-4 * b, rel=1e-3)
    # Past what the worker holds, the batch stops at its limit (the pool saturated).
    assert decode_batch(1000.0, osl, grid, t_grid, 300.0)[0] == pytest.approx(300.0)


def test_the_decode_pool_never_prefills() -> None:
    f = _deepseek()
    dec = Layout(tp=4, moe_tp=4)
    d = disagg_point(f, Layout(tp=4, moe_tp=4), 1, dec, 1, 8192, 1024, 1)
    # One client: the decode batch is that request alone, and its step carries no prefill work,
    # however long the prompt.
    cost = layout_cost(f.model, f.gpu, dec, f.precision, f.kv_dtype, f.engine, f.engine_version)
    assert d["tpot"] == pytest.approx(float(step_time(f.params, cost, 1.0, 8192 + 512.0)), rel=1e-3)
    assert d["ttft"] > float(step_time(f.params, cost, 0.0, 0.0, 8192.0, 4096.0))


def test_clients_waiting_for_prefill_are_not_in_the_decode_batch() -> None:
    """A prefill-bound pool: most clients queue ahead of the one prefill worker, so the decode
    batch is what Little's law gives for the prefill pool's rate, well below the clients; more
    prefill workers feed a larger decode batch (slower steps) and a shorter prefill queue."""
    f = _deepseek()
    pre, dec = Layout(tp=4, moe_tp=4), Layout(tp=4, moe_tp=4)
    one = disagg_point(f, pre, 1, dec, 1, 8192, 1024, 512)
    many = disagg_point(f, pre, 8, dec, 1, 8192, 1024, 512)
    cost = layout_cost(f.model, f.gpu, dec, f.precision, f.kv_dtype, f.engine, f.engine_version)
    all_clients = float(step_time(f.params, cost, 512.0, 8192 + 512.0))
    assert one["tpot"] < 0.6 * all_clients
    assert one["tpot"] < many["tpot"] <= all_clients * 1.001
    assert many["ttft"] < one["ttft"]
    # The closed loop holds: the clients are either waiting for their first token or decoding.
    x = 512 / (one["ttft"] + 1023 * one["tpot"])
    assert x * 1023 * one["tpot"] < 512 / 4


def test_expert_exchange_under_attention_dp_does_not_grow_with_ring_hops() -> None:
    """DeepEP-style dispatch: a fixed latency plus the bytes each rank sends, whatever the ranks;
    experts split by moe_tp (moe_ep = 1): SGLang's dp_gather / dp_scatter over all ranks' tokens."""
    model, gpu = get_model("deepseek-ai/DeepSeek-R1"), get_gpu("gb200")
    ep8 = layout_cost(model, gpu, Layout(tp=1, dp=8, moe_ep=8), "fp8", "fp8", "sglang")
    ep32 = layout_cost(model, gpu, Layout(tp=1, dp=32, moe_ep=32), "fp8", "fp8", "sglang")
    small = float(ep32.moe_exchange(4.0))
    assert A2A_LATENCY < small < 1.2 * A2A_LATENCY
    assert float(ep8.moe_exchange(4.0)) == pytest.approx(small, rel=0.05)
    assert float(ep32.moe_exchange(256.0)) > small  # bytes: more tokens, more to send
    mtp = layout_cost(model, gpu, Layout(tp=1, dp=4, moe_tp=4), "fp8", "fp8", "sglang")
    # Gathering every rank's tokens: four ranks' worth of bytes, as an all-reduce of them.
    assert float(mtp.moe_exchange(64.0)) > float(mtp.moe_exchange(16.0)) > 0.0
    assert float(mtp.moe_exchange(1.0)) < A2A_LATENCY
