"""Memory feasibility with the engines' own KV rules."""

from __future__ import annotations

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout, LayoutError
from inferasim.model.layoutcost import layout_cost
from inferasim.model.memory import kv_bytes_per_token_per_gpu, plan_memory, weight_bytes_per_gpu


def test_llama70b_bf16_does_not_fit_one_h100_and_says_why() -> None:
    plan = plan_memory(get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("h100_sxm"), Layout(tp=1),
                       precision="bf16")
    assert not plan.feasible
    assert "141" in plan.reasons[0] and "H100" in plan.reasons[0] and "tp1" in plan.reasons[0]
    # The capacity is stated once in bytes and once as the datasheet's figure (GiB), never as a
    # third number ("86 GB") that matches neither.
    assert "has 85.9 GB (80 GiB)" in plan.reasons[0] and "vllm gives 77.3 GB" in plan.reasons[0]


def test_kv_capacity_follows_vllm_rule() -> None:
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H200")
    plan = plan_memory(model, gpu, Layout(tp=4), engine="vllm", precision="fp8")
    assert plan.feasible
    expected = 0.9 * gpu.hbm_bytes - plan.weights["total"] - plan.activation_bytes - plan.non_torch_bytes
    assert plan.kv_bytes == pytest.approx(expected)
    # 8 KV heads over tp4: 2 heads per GPU, so a quarter of the model's KV per token.
    assert plan.kv_bytes_per_token == pytest.approx(model.kv_bytes_per_token(2.0) / 4)
    assert plan.kv_tokens == int(plan.kv_bytes // plan.kv_bytes_per_token)


def test_sglang_fraction_holds_weights_and_kv() -> None:
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("MI300X")
    plan = plan_memory(model, gpu, Layout(tp=8), engine="sglang", precision="fp8")
    assert plan.kv_bytes == pytest.approx(plan.memory_fraction * gpu.hbm_bytes - plan.weights["total"])
    assert 0.8 < plan.memory_fraction < 0.95


def test_kv_heads_replicate_beyond_tp_and_mla_replicates() -> None:
    llama = get_model("meta-llama/Meta-Llama-3.1-8B")  # 8 KV heads
    assert kv_bytes_per_token_per_gpu(llama, Layout(tp=8)) == pytest.approx(llama.kv_bytes_per_token() / 8)
    # tp16 cannot split 8 heads further: each GPU keeps one head.
    assert kv_bytes_per_token_per_gpu(llama, Layout(tp=16)) == pytest.approx(llama.kv_bytes_per_token() / 8)
    ds = get_model("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token_per_gpu(ds, Layout(tp=8)) == pytest.approx(ds.kv_bytes_per_token())


def test_weights_split_over_tp_and_experts_over_ep() -> None:
    ds = get_model("deepseek-ai/DeepSeek-V3")
    w8 = weight_bytes_per_gpu(ds, Layout(tp=8, moe_ep=8), "fp8")
    w4 = weight_bytes_per_gpu(ds, Layout(tp=4, moe_ep=4), "fp8")
    assert w4["routed_experts"] == pytest.approx(2 * w8["routed_experts"])
    assert w4["attention"] == pytest.approx(2 * w8["attention"])
    # Whole-model weights are conserved across the GPUs of one replica (pp=1, no replication).
    total = ds.weight_bytes("fp8")
    kinds = ("attention", "dense_mlp", "routed_experts", "shared_experts")
    assert 8 * sum(w8[k] for k in kinds) == pytest.approx(sum(total[k] for k in kinds))


def test_more_gpus_more_kv_room() -> None:
    model, gpu = get_model("Qwen/Qwen3-32B"), get_gpu("h100")
    caps = [plan_memory(model, gpu, Layout(tp=tp), precision="bf16").kv_tokens_per_replica
            for tp in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[0] > 0


def test_bad_layout_names_the_field() -> None:
    with pytest.raises(LayoutError, match="tp"):
        Layout(tp=0)
    with pytest.raises(LayoutError, match="moe_ep"):
        Layout(tp=4, moe_ep=3)


def test_wide_dp_attention_that_sglangs_default_fraction_cannot_hold_says_what_to_set() -> None:
    """SGLang reserves cuda_graph_max_bs x dp x 4.5 MiB for graphs under DP attention: at dp 72 its
    default --mem-fraction-static is negative, and the server would not start without the flag."""
    ds, gb200 = get_model("deepseek-ai/DeepSeek-R1"), get_gpu("GB200")
    with pytest.raises(ValueError, match=r"default memory fraction comes out at -0\.\d+ .*--mem-fraction-static"):
        plan_memory(ds, gb200, Layout(tp=1, dp=72, moe_tp=72), engine="sglang", precision="fp8")
    plan = plan_memory(ds, gb200, Layout(tp=1, dp=72, moe_tp=72), engine="sglang", precision="fp8",
                       memory_fraction=0.8)
    assert plan.feasible and plan.kv_tokens > 0


def test_sglang_refuses_mla_heads_its_attention_tp_does_not_divide() -> None:
    """DeepseekV2AttentionMLA asserts num_heads % attn_tp_size == 0 (SGLang pads heads on CPU only)."""
    from inferasim.model.memory import layout_problems

    ds = get_model("deepseek-ai/DeepSeek-R1")
    assert any("does not divide the 128 attention heads" in p for p in layout_problems(ds, Layout(tp=72), "sglang"))
    assert layout_problems(ds, Layout(tp=1, dp=72, moe_tp=72), "sglang") == []
    assert layout_problems(ds, Layout(tp=8, dp=9, moe_tp=72), "sglang") == []


def test_a_dsa_cache_is_priced_in_its_own_format_and_sglang_sizes_its_pool_by_its_own_count() -> None:
    """DeepSeek-V3.2 / GLM-5 (DSA): the 8-bit cache is FlashMLA's fp8_ds_mla (512 FP8 latent values,
    four FP32 scales, 64 BF16 rope values: 656 B) and every dtype adds a 132-byte FP8 index key
    (128 values + one FP32 scale). SGLang sizes its pool counting the latent at 576 x the dtype."""
    for name in ("deepseek-ai/DeepSeek-V3.2", "zai-org/GLM-5"):
        model = get_model(name)
        dsa = [la.attention for la in model.layers if la.attention.index_topk]
        assert dsa and dsa[0].latent_bytes(1.0) == 656.0 and dsa[0].index_key_bytes() == 132.0
        n = len(dsa)
        lay = Layout(tp=8)
        assert kv_bytes_per_token_per_gpu(model, lay, "fp8", "vllm") == pytest.approx(788.0 * n)
        assert kv_bytes_per_token_per_gpu(model, lay, "auto", "vllm") == pytest.approx(1284.0 * n)
        assert kv_bytes_per_token_per_gpu(model, lay, "fp8", "sglang") == pytest.approx(708.0 * n)
        assert model.kv_bytes_per_token(1.0) == pytest.approx(788.0 * n)
        # Decode reads the top-k latents and every index key.
        cost = layout_cost(model, get_gpu("B200"), Layout(), "fp8", "fp8")
        assert float(cost.kv_read_bytes(8192.0)) == pytest.approx(n * (656.0 * 2048 + 132.0 * 8192))
    # Plain MLA keeps all 576 values in the cache dtype.
    r1 = get_model("deepseek-ai/DeepSeek-R1")
    mla = [la.attention for la in r1.layers if la.attention.kind == "mla"]
    assert mla[0].kv_bytes(1.0) == 576.0 and mla[0].kv_bytes(2.0) == 1152.0
    assert kv_bytes_per_token_per_gpu(r1, Layout(tp=8), "fp8", "sglang") == pytest.approx(576.0 * len(mla))
